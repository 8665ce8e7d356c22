#!/usr/bin/env bash
# Cross-host SQLite (tests/cross_host/test_cross_host.py): one database file
# written by the Rust adapter, the Python host and the Node host in turn keeps
# ONE fence per scope; every host's install creates the same schema
# (host/sqlite/schema.sql), upgrades layout 1 alike, refuses another layout
# number, and enforces the signing keys stored in it (fencecheck_keys).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/common.sh
scripts/build-component
npm run --silent --prefix host/node build

# The Rust side is the adapter's worker binary. `cargo test --workspace`
# (scripts/test) already built it; this is then a no-op, and lets the script
# run on its own with the same features (nothing is rebuilt).
cargo test --workspace --locked --no-run -q "${profile[@]}"
worker="$target_dir/$FENCECHECK_PROFILE/fencecheck-sqlite-worker"
[ -x "$worker" ] || { echo "not built: $worker" >&2; exit 1; }

# This checkout's Python package (build-component copied the component and
# schema.sql into it), as 60-agreement.sh does.
FENCECHECK_SQLITE_WORKER="$worker" PYTHONPATH=host/python/src \
    python3 tests/cross_host/test_cross_host.py
