#!/usr/bin/env bash
# Python host (host/python): its runtime and test dependencies from PyPI,
# pinned (psycopg: fencecheck.postgres and its tests, the binary wheel bundles
# libpq; build and pyproject_hooks: scripts/dist's `python3 -m build`;
# prometheus_client, the OpenTelemetry API, SDK and Prometheus exporter with
# what they need: tests/test_signals.py, fencecheck.signals' adapters, which
# the package itself does not depend on). The package itself is installed by
# scripts/test.d/40-python.sh, after scripts/build-component has put the
# component into it.
set -euo pipefail
python3 -m pip install --disable-pip-version-check --root-user-action=ignore -q \
    "wasmtime==50.0.1" "pytest==9.2.0" "setuptools==84.2.1" \
    "psycopg[binary]==3.3.9" "build==1.3.0" "pyproject_hooks==1.3.3" \
    "prometheus_client==0.26.0" "opentelemetry-api==1.45.2" "opentelemetry-sdk==1.45.2" \
    "opentelemetry-semantic-conventions==0.66b2" "opentelemetry-exporter-prometheus==0.66b2" \
    "typing_extensions==4.15.0"
