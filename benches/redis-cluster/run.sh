#!/usr/bin/env bash
# FENCE.SET vs SET across a Redis 7.0 cluster on loopback (3 masters + 3
# replicas, every node loading the module), driven from one client
# machine by `redis-benchmark --cluster`. Keys carry a `{tag}`, so both
# commands route alike and the load spreads over the three shards.
#
#   cargo build --release -p fencecheck-redis
#   bash benches/redis-cluster/run.sh [ROUNDS]      # BASE=31000: ports BASE..BASE+5, buses BASE+100..
#   N=1000000 bash benches/redis-cluster/run.sh 3  # requests per run (default 200000; redis-benchmark
#                                                  # times a cluster run in 0.25 s steps: give it 10 s)
#
# Prints each round's requests/s per command (interleaved) with the
# server's time per call (commandstats, over the masters), then each
# master's FENCE.METRICS. Two FENCE.SET loads: random tokens (some are
# refused stale, which does less work and flatters FENCE.SET), and one
# token with POLICY allow-equal and a random OPID (an equal token needs
# one), where every write is applied or, when its op id repeats on its
# key, answered duplicate: the fair comparison with SET, each one reading,
# deciding and writing both keys.
#
# MODULE=path/to/libfencecheck_redis.so overrides the module (cargo test
# builds leave it in target/release/deps/).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
base=${BASE:-31000}
module=${MODULE:-$PWD/target/release/libfencecheck_redis.so}
[ -f "$module" ] || { echo "build it first: cargo build --release -p fencecheck-redis" >&2; exit 1; }
for i in 0 1 2 3 4 5; do
    for p in $((base + i)) $((base + 100 + i)); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "port $p is busy: set BASE" >&2
            exit 1
        fi
    done
done
work=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
nodes=()
for i in 0 1 2 3 4 5; do
    p=$((base + i))
    mkdir -p "$work/$p"
    redis-server --port "$p" --bind 127.0.0.1 --dir "$work/$p" --cluster-enabled yes \
        --cluster-config-file nodes.conf --cluster-port $((base + 100 + i)) --save "" \
        --appendonly no --logfile "$work/$p/log" --loadmodule "$module" &
    pids+=($!)
    nodes+=("127.0.0.1:$p")
done
for p in "${nodes[@]}"; do
    until redis-cli -p "${p#*:}" ping >/dev/null 2>&1; do sleep 0.1; done
done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
until redis-cli -p "$base" cluster info | grep -q cluster_state:ok; do sleep 0.2; done
echo "load: $(uptime)"
masters() { for i in 0 1 2 3 4 5; do redis-cli -p $((base + i)) role | head -n 1 | grep -q master && echo $((base + i)); done; }
# The server's own time per call of `$1`, over every master (commandstats
# since the last CONFIG RESETSTAT): the CPU a command costs, without the
# client and the network.
usec() {
    for p in $(masters); do redis-cli -p "$p" info commandstats; done | tr -d '\r' |
        awk -F'[:,=]' -v name="cmdstat_$1" '$1 == name { calls += $3; usec += $5 }
            END { if (calls) printf "%.2f us/call", usec / calls; else printf "no calls" }'
}
bench() {
    for p in $(masters); do redis-cli -p "$p" config resetstat >/dev/null; done
    rate=$(redis-benchmark -p "$base" --cluster -q -n "${N:-200000}" -c 50 -r 100000 "$@" | tr '\r' '\n' | grep -E 'requests per second' | tail -n 1)
    echo "$rate; server $(usec "$(echo "$1" | tr 'A-Z' 'a-z')")"
}
for r in $(seq "$rounds"); do
    echo "round $r SET:       $(bench SET 'key:{tag}:__rand_int__' v)"
    echo "round $r FENCE.SET: $(bench FENCE.SET 'key:{tag}:__rand_int__' '0.__rand_int__' v)"
    echo "round $r FENCE.SET allow-equal: $(bench FENCE.SET 'equal:{tag}:__rand_int__' '0.1' v POLICY allow-equal OPID 'op:__rand_int__')"
done
for p in $(masters); do
    echo "FENCE.METRICS on :$p:"
    redis-cli -p "$p" fence.metrics | grep -v '^#' | grep -E 'put' || true
done
