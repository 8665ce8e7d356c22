#!/usr/bin/env bash
# Gateway vs nginx proxy_pass, on loopback, to the same nginx WebDAV upstream:
# GET and PUT, 64 connections, 4 KiB and 1 MiB bodies (wrk). The gateway runs
# as it should be deployed: --auth, every request with a bearer secret.
#   cargo build --release -p fencecheck-gateway
#   bash benches/gateway/run.sh [target/release/fencecheck-gateway] [seconds]
# PG=1 adds a third gateway (rows "gateway (--postgres)", same upstream):
# pointers, fences and leases in a throwaway PostgreSQL 15 of its own
# (benches/pgbench/lib.sh: initdb in a mktemp dir, 127.0.0.1 on a free port,
# as the postgres user when run as root; stopped and removed at exit), at
# PostgreSQL's defaults, fsync=on and synchronous_commit=on: a PUT's 2xx
# follows its commit's WAL fdatasync. PG_POOL (default 16, the gateway's)
# is --pg-pool; PG_SETTINGS="" adds `postgres -c` settings. With PG=1 the
# script also refuses ports already in use, prints WAL fsyncs and commits
# per --postgres PUT run, and each gateway's outcomes from /metrics at the end.
set -euo pipefail
[ -n "${TRACE:-}" ] && set -x
here="$(cd "$(dirname "$0")" && pwd)"
gw_bin="${1:-${CARGO_TARGET_DIR:-$here/../../target}/release/fencecheck-gateway}"
secs="${2:-10}"
work="$(mktemp -d)"
pids=()
# TERM: the proxy nginx's master then stops its workers too.
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; sleep 0.5
            for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"
            # pg_ctl stop: fast, else immediate, each bounded by pg_ctl's 60 s.
            if [ "${PG:-}" = 1 ]; then pg_stop; fi; }
trap cleanup EXIT
if [ "${PG:-}" = 1 ]; then
  # shellcheck source=../pgbench/lib.sh
  source "$here/../pgbench/lib.sh"
  read -r -a pg_settings <<<"${PG_SETTINGS:-}"
  # pg_start installs its own EXIT trap (pg_stop alone): put ours back,
  # whether it started or not. Its stdout only describes the extension,
  # which the gateway does not use.
  pg_ok=1; pg_start "${pg_settings[@]}" >/dev/null || pg_ok=0
  trap cleanup EXIT
  [ "$pg_ok" = 1 ] || { echo "PostgreSQL did not start" >&2; exit 1; }
  pg_url="host=127.0.0.1 port=$PGPORT user=postgres dbname=postgres"
  echo "== PostgreSQL $(q 'SHOW server_version') on 127.0.0.1:$PGPORT: $(q "SELECT string_agg(name || '=' || setting, ' ' ORDER BY name) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', 'commit_delay')"); --pg-pool ${PG_POOL:-16}"
fi

UP=18181 PX=18182 GW=18180 GW1=18183
if [ "${PG:-}" = 1 ]; then
  # A server left over on one of these ports would be measured instead.
  for port in $UP $PX $GW $GW1 18184; do
    if ss -Hltn "sport = :$port" | grep -q .; then echo "port $port is in use" >&2; exit 1; fi
  done
fi
mkdir -p "$work/dav/root/blobs" "$work/dav/tmp" "$work/px/tmp" "$work/gw"
temps() { for t in body proxy fastcgi uwsgi scgi; do echo "${t}_temp_path $1/tmp/$t;" | sed 's/^body_temp/client_body_temp/'; done; }
cat > "$work/dav/nginx.conf" <<CONF
daemon off; master_process off; pid $work/dav/pid; error_log $work/dav/error.log warn;
events { worker_connections 4096; }
http { access_log off; $(temps "$work/dav")
  server { listen 127.0.0.1:$UP; root $work/dav/root; client_max_body_size 0;
    location /blobs/ { dav_methods PUT DELETE; dav_access user:rw; } } }
CONF
cat > "$work/px/nginx.conf" <<CONF
daemon off; worker_processes 2; pid $work/px/pid; error_log $work/px/error.log warn;
events { worker_connections 4096; }
http { access_log off; $(temps "$work/px")
  upstream dav { server 127.0.0.1:$UP; keepalive 64; }
  server { listen 127.0.0.1:$PX; client_max_body_size 0;
    location / { proxy_pass http://dav; proxy_http_version 1.1; proxy_set_header Connection "";
                 proxy_request_buffering off; proxy_buffering off; } } }
CONF
/usr/sbin/nginx -p "$work/dav" -e "$work/dav/error.log" -c "$work/dav/nginx.conf" & pids+=($!)
/usr/sbin/nginx -p "$work/px" -e "$work/px/error.log" -c "$work/px/nginx.conf" & pids+=($!)
secret=bench-secret-0123456789
hash=$(printf %s "$secret" | sha256sum | cut -d' ' -f1)
printf '[[principal]]\nname = "bench"\nsecret_sha256 = "%s"\nread = [""]\nwrite = [""]\nlock = [""]\n' "$hash" > "$work/auth.toml"
RUST_LOG=warn "$gw_bin" --listen 127.0.0.1:$GW --data "$work/gw" --upstream "http://127.0.0.1:$UP/blobs/" \
  --auth "$work/auth.toml" --threads 2 --max-in-flight 1024 --max-connections 4096 --max-body $((2 << 20)) & pids+=($!)
# The same, one fsync per publish instead of group commit (PUT rows only).
mkdir -p "$work/gw1"
RUST_LOG=warn "$gw_bin" --listen 127.0.0.1:$GW1 --data "$work/gw1" --upstream "http://127.0.0.1:$UP/blobs/" \
  --auth "$work/auth.toml" --threads 2 --max-in-flight 1024 --max-connections 4096 --max-body $((2 << 20)) \
  --per-publish-sync & pids+=($!)
GWP=18184
if [ "${PG:-}" = 1 ]; then
  mkdir -p "$work/gwpg"
  # --data: required, unused here (blobs upstream, pointers in PostgreSQL).
  RUST_LOG=warn "$gw_bin" --listen 127.0.0.1:$GWP --data "$work/gwpg" --upstream "http://127.0.0.1:$UP/blobs/" \
    --auth "$work/auth.toml" --threads 2 --max-in-flight 1024 --max-connections 4096 --max-body $((2 << 20)) \
    --postgres "$pg_url" --pg-pool "${PG_POOL:-16}" 2>"$work/gwpg.log" & pids+=($!)
fi
for port in $GW $GW1 $([ "${PG:-}" = 1 ] && echo $GWP); do
  for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
done
auth="Authorization: Bearer $secret"

for size in 4096 1048576; do
  head -c "$size" /dev/zero > "$work/body"
  curl -fs -o /dev/null -X PUT --data-binary @"$work/body" "http://127.0.0.1:$UP/blobs/get$size"
  curl -fs -o /dev/null -X PUT --data-binary @"$work/body" -H 'Fence-Token: 0.1' -H "$auth" "http://127.0.0.1:$GW/objects/get$size"
  echo "== GET $size via nginx proxy_pass"
  wrk -t2 -c64 -d"${secs}s" --latency "http://127.0.0.1:$PX/blobs/get$size" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  echo "== GET $size via fencecheck-gateway"
  wrk -t2 -c64 -d"${secs}s" --latency -H "$auth" "http://127.0.0.1:$GW/objects/get$size" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  if [ "${PG:-}" = 1 ]; then
    curl -fs -o /dev/null -X PUT --data-binary @"$work/body" -H 'Fence-Token: 0.1' -H "$auth" "http://127.0.0.1:$GWP/objects/get$size"
    echo "== GET $size via fencecheck-gateway (--postgres)"
    wrk -t2 -c64 -d"${secs}s" --latency -H "$auth" "http://127.0.0.1:$GWP/objects/get$size" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  fi
  echo "== PUT $size via nginx proxy_pass"
  wrk -t2 -c64 -d"${secs}s" --latency -s "$here/put.lua" "http://127.0.0.1:$PX" -- "$size" /blobs/p | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  echo "== PUT $size via fencecheck-gateway (fenced)"
  wrk -t2 -c64 -d"${secs}s" --latency -s "$here/put.lua" "http://127.0.0.1:$GW" -- "$size" /objects/k fenced "$secret" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  echo "== PUT $size via fencecheck-gateway (fenced, --per-publish-sync)"
  wrk -t2 -c64 -d"${secs}s" --latency -s "$here/put.lua" "http://127.0.0.1:$GW1" -- "$size" /objects/k fenced "$secret" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  if [ "${PG:-}" = 1 ]; then
    # Keys of their own per size: put.lua's Idempotency-Keys restart at 1-1
    # every run, and the PostgreSQL store still holds those of the previous
    # size's run (422 idempotency-key-reused: another body).
    # What was fsynced: WAL syncs (pg_stat_wal) against commits (pg_stat_database).
    wal0=$(q "SELECT wal_sync FROM pg_stat_wal"); xact0=$(q "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'")
    echo "== PUT $size via fencecheck-gateway (fenced, --postgres)"
    wrk -t2 -c64 -d"${secs}s" --latency -s "$here/put.lua" "http://127.0.0.1:$GWP" -- "$size" "/objects/s$size-k" fenced "$secret" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
    sleep 2 # backends flush their statistics within a second of going idle
    echo "   WAL fsyncs: $(( $(q "SELECT wal_sync FROM pg_stat_wal") - wal0 )) for $(( $(q "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'") - xact0 )) commits (all transactions, reads included)"
  fi
  find "$work/dav/root/blobs" -name "p*" -delete
done
if [ "${PG:-}" = 1 ]; then
  # Every answer by operation and outcome (non-2xx included), per gateway.
  for port in $GW $GW1 $GWP; do
    echo "== outcomes on :$port: $(curl -fs -H "$auth" "http://127.0.0.1:$port/metrics" \
      | sed -n 's/^fencecheck_gateway_requests_total{\(.*\)} \([0-9]*\)$/\1=\2/p' | grep -v '=0$' | tr '\n' ' ')"
  done
  # Broken pipes: wrk closing its connections mid-response at the end of a run.
  echo "== gateway (--postgres) log: $(wc -l <"$work/gwpg.log") lines, $(grep -c -v 'Broken pipe\|Connection reset by peer' "$work/gwpg.log" || true) other than broken pipe/reset; PostgreSQL log: $(grep -c -E 'ERROR|FATAL|PANIC' "$PG_ROOT/server.log" || true) ERROR/FATAL/PANIC lines"
  { grep -v 'Broken pipe\|Connection reset by peer' "$work/gwpg.log"; grep -E 'ERROR|FATAL|PANIC' "$PG_ROOT/server.log"; } | head -5 || true
fi
