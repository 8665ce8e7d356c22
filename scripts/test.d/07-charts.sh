#!/usr/bin/env bash
# The benchmark chart script (scripts/charts) on a fixture of real criterion
# output (tests/fixtures/criterion) and a printed SQLite interleaved pass:
# the right pairs get bars, from the right source, with the right ratios;
# the rest are drawn as not measured. No benches run. Needs only python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/charts --check
