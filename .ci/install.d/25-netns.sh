#!/usr/bin/env bash
# iproute2 for the fault-injection tests (host/authority/tests/nemesis.rs,
# tests/support/netns.rs): `ip netns`, veth pairs, a bridge and blackhole
# routes, all inside namespaces the tests make and delete. Needs root, which
# CI has; the tests fail loudly (never skip) where namespaces are forbidden.
set -euo pipefail
if ! command -v ip >/dev/null; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y iproute2
fi
ip -V
