"""The Python vector runner: every shared vector passes, and the runner really
fails on a wrong expectation or a malformed file (same contract as Rust's)."""

import json
import subprocess
import sys

import pytest

from fencecheck import vectors

from conftest import VECTORS

FILES = sorted(VECTORS.glob("*.json"))


def test_there_are_vectors():
    """The shared vector directory is found and not empty."""
    assert len(FILES) >= 40


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_vector_passes(path, guest):
    """Each file in tests/vectors passes under the Python host."""
    assert vectors.run(vectors.load(path), guest) == []


def test_a_wrong_expectation_fails(guest):
    """Changing one expected field makes the runner report that step."""
    data = json.loads((VECTORS / "paused-writer-is-fenced.json").read_text())
    for step in data["steps"]:
        if step.get("expect", {}).get("outcome") == "stale-fence":
            step["expect"]["highest"] = [0, 99]
    failures = vectors.run(vectors.parse(json.dumps(data)), guest)
    assert failures and "highest: expected [0, 99]" in failures[0]


def test_unknown_fields_and_bad_numbers_are_unreadable():
    """Unknown fields, floats, negatives and duplicate keys are refused."""
    good = '{"name":"n","steps":[{"check":{"scope":"s","token":[0,1]},"expect":{"outcome":"applied"}}]}'
    vectors.parse(good)
    for bad in (
        good.replace('"scope"', '"scop"'),
        good.replace("[0,1]", "[0,1.0]"),
        good.replace("[0,1]", "[0,-1]"),
        good.replace("[0,1]", "[0,18446744073709551616]"),
        good.replace('"name":"n"', '"name":"n","name":"m"'),
    ):
        with pytest.raises(vectors.VectorFormatError):
            vectors.parse(bad)


def test_cli_contract(tmp_path):
    """`python -m fencecheck vectors` counts files and exits non-zero on failure."""
    ok = subprocess.run(
        [sys.executable, "-m", "fencecheck", "vectors", *map(str, FILES[:3])], capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.strip().endswith("3 passed, 0 failed")
    missing = tmp_path / "absent.json"
    bad = subprocess.run(
        [sys.executable, "-m", "fencecheck", "vectors", str(FILES[0]), str(missing)], capture_output=True, text=True
    )
    assert bad.returncode != 0
    assert f"FAIL {missing}: cannot read" in bad.stdout and bad.stdout.strip().endswith("1 passed, 1 failed")
