#!/usr/bin/env bash
# The operations kit (ops/prometheus): the rules parse, and every alert fires
# on what it is for and stays quiet beside it (`promtool test rules`, with
# synthetic series over the metric table of docs/design.md §12). Needs
# promtool (.ci/install.d/85-prometheus.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v promtool >/dev/null || {
    echo "ops: promtool not found (Debian: apt-get install prometheus)" >&2
    exit 1
}
promtool check rules ops/prometheus/fencecheck.rules.yml
# promtool resolves rule_files relative to the test file.
promtool test rules ops/prometheus/fencecheck.rules.test.yml
# The rules and the Grafana dashboard use only the table's names and labels,
# and every dashboard query parses.
python3 ops/check.py
