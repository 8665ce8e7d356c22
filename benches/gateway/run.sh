#!/usr/bin/env bash
# Gateway vs nginx proxy_pass, on loopback, to the same nginx WebDAV upstream:
# GET and PUT, 64 connections, 4 KiB and 1 MiB bodies (wrk). The gateway runs
# as it should be deployed: --auth, every request with a bearer secret.
#   cargo build --release -p fencecheck-gateway
#   bash benches/gateway/run.sh [target/release/fencecheck-gateway] [seconds]
set -euo pipefail
[ -n "${TRACE:-}" ] && set -x
here="$(cd "$(dirname "$0")" && pwd)"
gw_bin="${1:-${CARGO_TARGET_DIR:-$here/../../target}/release/fencecheck-gateway}"
secs="${2:-10}"
work="$(mktemp -d)"
pids=()
# TERM: the proxy nginx's master then stops its workers too.
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; sleep 0.5
            for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

UP=18181 PX=18182 GW=18180 GW1=18183
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
for port in $GW $GW1; do
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
  echo "== PUT $size via nginx proxy_pass"
  wrk -t2 -c64 -d"${secs}s" --latency -s "$here/put.lua" "http://127.0.0.1:$PX" -- "$size" /blobs/p | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  echo "== PUT $size via fencecheck-gateway (fenced)"
  wrk -t2 -c64 -d"${secs}s" --latency -s "$here/put.lua" "http://127.0.0.1:$GW" -- "$size" /objects/k fenced "$secret" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  echo "== PUT $size via fencecheck-gateway (fenced, --per-publish-sync)"
  wrk -t2 -c64 -d"${secs}s" --latency -s "$here/put.lua" "http://127.0.0.1:$GW1" -- "$size" /objects/k fenced "$secret" | grep -E "Requests/sec|99%|Non-2xx|Transfer"
  find "$work/dav/root/blobs" -name "p*" -delete
done
