#!/usr/bin/env bash
# Python host: build the component, install the package with it as package
# data, run pytest against the installed package, then every vector file.
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/build-component
python3 -m pip install --disable-pip-version-check --root-user-action=ignore -q \
    --no-deps --no-build-isolation --force-reinstall ./host/python
# From another directory, so that `import fencecheck` is the installed copy.
(cd host/python/tests && python3 -m pytest -q -p no:cacheprovider --rootdir=. .)
python3 -m fencecheck vectors tests/vectors/*.json
