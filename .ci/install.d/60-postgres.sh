#!/usr/bin/env bash
# The PostgreSQL extension (host/postgres-ext): Debian's PostgreSQL 15 server
# and headers, and libclang for pgrx's bindings (generated from those headers
# by an ordinary cargo build: .cargo/config.toml names this pg_config; no
# cargo-pgrx, scripts/pg-package packages it). The tests start their own
# servers on free loopback ports as the `postgres` user; the packaged
# cluster, if the package starts one, is not used.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends \
    postgresql-15 postgresql-client-15 postgresql-server-dev-15 libclang-dev clang
/usr/lib/postgresql/15/bin/postgres --version

