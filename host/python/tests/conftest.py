"""Shared fixtures: one runtime per test session, a fresh instance per test."""

from pathlib import Path

import pytest

import fencecheck as fc

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "tests" / "vectors"
# The packaged component as a file: Runtime(PACKAGED) loads the same bytes
# from a path, which is always metered (Runtime() is not).
PACKAGED = Path(fc.__file__).resolve().parent / "fencecheck.wasm"


@pytest.fixture(scope="session")
def runtime() -> fc.Runtime:
    return fc.Runtime()


@pytest.fixture()
def guest(runtime: fc.Runtime) -> fc.Instance:
    return runtime.instance()
