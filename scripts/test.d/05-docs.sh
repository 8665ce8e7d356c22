#!/usr/bin/env bash
# The documentation (scripts/check-links): every relative link and anchor in
# the README, the guides in docs/ and the other READMEs resolves, the README
# stays a front page under 250 lines, and every guide in docs/ is one click
# from it. Needs only python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/check-links
