#!/usr/bin/env bash
# The HTTP gateway (host/gateway): Pingora's build needs cmake; its tests
# start Debian's nginx (WebDAV upstream, proxy_pass baseline) themselves.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends cmake nginx
# The tests run their own nginx on a free port; the packaged service is not needed.
service nginx stop 2>/dev/null || true
cmake --version | sed -n 1p
nginx -v
