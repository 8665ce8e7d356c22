#!/usr/bin/env bash
# Cross-runtime agreement (tests/agreement/README.md): one deterministic random
# sequence through Rust (wasm over both transports, and native), Python and Node.js; every trace line
# (decision, fields, state hex) must be identical byte for byte. Batch lines
# cross as check-packed in Rust-wasm, Python and Node (each host's own codec),
# and also through the typed check-batch export in Python and Node.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/common.sh
scripts/build-component
npm run --silent --prefix host/node build
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

seq="$work/sequence.jsonl"
python3 tests/agreement/generate.py --seed 5 --lines 6000 > "$seq"
cli trace --runtime wasm "$seq" > "$work/rust-wasm.txt"
cli trace --runtime native "$seq" > "$work/rust-native.txt"
cli trace --runtime wasm-component "$seq" > "$work/rust-wasm-component.txt"
PYTHONPATH=host/python/src python3 -m fencecheck trace "$seq" > "$work/python.txt"
node host/node/bin/trace.mjs "$seq" > "$work/node.txt"
PYTHONPATH=host/python/src python3 -m fencecheck trace --batch typed "$seq" > "$work/python-typed.txt"
node host/node/bin/trace.mjs --batch typed "$seq" > "$work/node-typed.txt"

lines=$(wc -l < "$work/rust-native.txt")
if [ "$lines" -lt 6000 ]; then
    echo "agreement: the reference trace has only $lines lines" >&2
    exit 1
fi
status=0
for runtime in rust-wasm rust-wasm-component python node python-typed node-typed; do
    if ! cmp -s "$work/rust-native.txt" "$work/$runtime.txt"; then
        echo "agreement: $runtime differs from rust-native; first differences:" >&2
        diff "$work/rust-native.txt" "$work/$runtime.txt" | head -n 8 >&2 || true
        status=1
    fi
done
[ "$status" -eq 0 ] && echo "agreement: $lines trace lines identical in rust-wasm (core and component transports), rust-native, python, node (batches packed and typed)"
exit "$status"
