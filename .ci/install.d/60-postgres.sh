#!/usr/bin/env bash
# The PostgreSQL extension (host/postgres-ext): Debian's PostgreSQL 15 server
# and headers, libclang for pgrx's bindings, and cargo-pgrx at the exact
# version of the pgrx crate (0.18.0: 0.19 wants Rust 1.96). The tests start
# their own servers on free loopback ports as the `postgres` user; the
# packaged cluster, if the package starts one, is not used.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends \
    postgresql-15 postgresql-client-15 postgresql-server-dev-15 libclang-dev clang
/usr/lib/postgresql/15/bin/postgres --version

want=0.18.0
if [ "$(cargo pgrx --version 2>/dev/null | awk '{print $2}')" != "$want" ]; then
    cargo install cargo-pgrx --version "$want" --locked
fi
# pgrx's bindings come from this server's headers; nothing is downloaded.
cargo pgrx init --pg15 /usr/lib/postgresql/15/bin/pg_config
