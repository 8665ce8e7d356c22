#!/usr/bin/env bash
# The operations kit (ops/prometheus): promtool checks and unit-tests the
# alerting and recording rules (scripts/test.d/ops.sh). Debian's package
# also brings the server; nothing here starts it.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends prometheus
# The package's service is not needed (and may not start without systemd).
service prometheus stop 2>/dev/null || true
promtool --version | sed -n 1p
