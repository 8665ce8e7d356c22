#!/usr/bin/env bash
# Node.js host (host/node): exact versions from package-lock.json (jco,
# lossless-json, better-sqlite3 12, typescript; for test/signals.test.mjs
# prom-client, @opentelemetry/api, sdk-metrics and exporter-prometheus, which
# fencecheck/signals itself does not import). better-sqlite3 compiles from
# source against the machine's Node headers (no prebuilt download here).
# ci: background (no apt-get, no pip: .ci/run runs it beside the others)
set -euo pipefail
cd "$(dirname "$0")/../../host/node"
if [ -d /usr/include/node ]; then
    export npm_config_nodedir=/usr
fi
npm ci --no-audit --no-fund
