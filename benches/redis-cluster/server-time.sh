#!/usr/bin/env bash
# The server's own time per FENCE.SET call in cluster mode, one module
# against another (an A/B of a change to the module's cluster path): a
# one-node cluster serving all 16384 slots, no replicas, loaded with
# redis-benchmark 16 deep so the client and the network stay out of the
# figure (commandstats' usec_per_call times the call alone). Each round
# starts a fresh server per module, alternating, so drift hits both.
#
#   bash benches/redis-cluster/server-time.sh A.so B.so [ROUNDS]   # default 5 rounds
#
# Load: FENCE.SET with one token, POLICY allow-equal and a random OPID over
# 100,000 scopes (every write applied, as in run.sh's fair load): a first
# pass of 300,000 that creates the scopes (about 95,000 first writes), then
# 1 M on them; then SET on the same server for scale.
# PORT=32500 by default.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 A.so B.so [ROUNDS]" >&2; exit 2; }
a=$1 b=$2 rounds=${3:-5} port=${PORT:-32500}
for m in "$a" "$b"; do [ -f "$m" ] || { echo "no module $m" >&2; exit 1; }; done
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "port $port is busy: set PORT" >&2
    exit 1
fi
pid='' work=''
cleanup() { [ -z "$pid" ] || kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; [ -z "$work" ] || rm -rf "$work"; }
trap cleanup EXIT
per_call() {
    redis-cli -p "$port" info commandstats | tr -d '\r' |
        sed -n "s/^cmdstat_$1:.*usec_per_call=\([0-9.]*\).*/\1/p"
}
load() { redis-benchmark -p "$port" -q -r 100000 -P 16 "$@" >/dev/null; }
fence() { load -n "$1" FENCE.SET 'equal:{tag}:__rand_int__' 0.1 v POLICY allow-equal OPID 'op:__rand_int__'; }
echo "load: $(uptime)"
for r in $(seq "$rounds"); do
    for m in "$a" "$b"; do
        work=$(mktemp -d)
        redis-server --port "$port" --bind 127.0.0.1 --dir "$work" --cluster-enabled yes \
            --cluster-config-file nodes.conf --save "" --appendonly no --logfile "$work/log" \
            --loadmodule "$m" &
        pid=$!
        until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
        redis-cli -p "$port" cluster addslotsrange 0 16383 >/dev/null
        until redis-cli -p "$port" cluster info | grep -q cluster_state:ok; do sleep 0.1; done
        fence 300000
        c=$(per_call fence.set)
        redis-cli -p "$port" config resetstat >/dev/null
        fence 1000000
        f=$(per_call fence.set)
        redis-cli -p "$port" config resetstat >/dev/null
        load -n 1000000 SET 'equal:{tag}:x__rand_int__' v
        s=$(per_call set)
        echo "round $r $(basename "$m"): FENCE.SET $c us/call creating the scopes, then $f; SET $s"
        kill "$pid"
        wait "$pid" 2>/dev/null || true
        pid=''
        rm -rf "$work"
        work=''
    done
done
