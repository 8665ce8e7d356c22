#!/usr/bin/env bash
# The benchmark chart (scripts/charts --check): BENCHMARKS.md's "Current
# figures at a glance" table parses, each figure is in its host's current
# figures, docs/img/bench-ratios.svg is what the table draws; and the --run
# chart on a fixture of real criterion output (tests/fixtures/criterion).
# No benches run. Needs only python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/charts --check
