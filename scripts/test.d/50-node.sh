#!/usr/bin/env bash
# Node.js host: build the component, transpile it with jco (npm run build),
# type-check the .d.ts, run node --test, then every vector file.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/build-component
cd host/node
npm run --silent build
npm run --silent typecheck
npm test
node bin/vectors.mjs ../../tests/vectors/*.json
