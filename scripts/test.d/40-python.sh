#!/usr/bin/env bash
# Python host: build the component, install the package with it as package
# data, run pytest against the installed package, then every vector file.
# The PostgreSQL tests (test_postgres.py) start their own servers (what
# .ci/install.d/60-postgres.sh installs; PG_CONFIG picks the PostgreSQL) and
# run the Rust fencecheck-postgres-worker beside the Python writer.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/common.sh
scripts/build-component
python3 -m pip install --disable-pip-version-check --root-user-action=ignore -q \
    --no-deps --no-build-isolation --force-reinstall ./host/python

# `cargo test --workspace` (scripts/test) already built the worker (a binary
# of a package with integration tests); this is then a no-op, and lets the
# script run on its own with the same features, so nothing is rebuilt.
cargo test --workspace --locked --no-run -q "${profile[@]}"
worker="$target_dir/$FENCECHECK_PROFILE/fencecheck-postgres-worker"
[ -x "$worker" ] || { echo "not built: $worker" >&2; exit 1; }

# From another directory, so that `import fencecheck` is the installed copy.
(cd host/python/tests && FENCECHECK_PG_WORKER="$worker" \
    python3 -m pytest -q -p no:cacheprovider --rootdir=. .)
python3 -m fencecheck vectors tests/vectors/*.json
