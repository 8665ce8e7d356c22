"""The Python vector runner: every shared vector passes through both
transports (the component API and the core module's check-packed), the
signed-token files included, and the runner really fails on a wrong
expectation or a malformed file (same contract as Rust's)."""

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


@pytest.mark.parametrize("transport", vectors.TRANSPORTS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_vector_passes(path, guest, transport):
    """Each file in tests/vectors passes under the Python host, through each transport."""
    assert guest._runtime._core is not None, "the core transport must be the one under test"
    assert vectors.run(vectors.load(path), guest, transport) == []


def test_the_signed_vectors_are_there():
    """The signed-token files (gen/signed.py) are among them, with sign steps,
    keyed checks and a signature without keys."""
    signed = [p for p in FILES if p.stem.startswith("signed-")]
    assert len(signed) >= 10
    steps = [s for p in signed for s in vectors.load(p)["steps"]]
    assert any("sign" in s for s in steps)
    assert any("keys" in s.get("check", {}) for s in steps)
    assert any("signature" in s.get("check", {}) and "keys" not in s["check"] for s in steps)


@pytest.mark.parametrize("transport", vectors.TRANSPORTS)
def test_a_wrong_signed_expectation_fails(guest, transport):
    """A wrong tag, a wrong unauthenticated reason and a wrong sign error are
    each reported, through each transport."""
    data = json.loads((VECTORS / "signed-grant-is-applied.json").read_text())
    data["steps"][0]["expect"]["tag"] = "00" * 32
    failures = vectors.run(vectors.parse(json.dumps(data)), guest, transport)
    assert failures and failures[0].startswith("step 1: tag: expected")
    data = json.loads((VECTORS / "signed-unsigned-and-unknown-key.json").read_text())
    for step in data["steps"]:
        if step.get("expect", {}).get("reason") == "unsigned":
            step["expect"]["reason"] = "bad-signature"
    failures = vectors.run(vectors.parse(json.dumps(data)), guest, transport)
    assert failures and "reason: expected 'bad-signature', got 'unsigned'" in failures[0]
    data = json.loads((VECTORS / "signed-sign-errors.json").read_text())
    step = next(s for s in data["steps"] if s.get("expect", {}).get("error") == "invalid-key")
    step["expect"]["reason"] = "no-keys"
    assert vectors.run(vectors.parse(json.dumps(data)), guest, transport)


def test_signed_fields_are_checked_when_read():
    """Unknown fields in keys, signatures and sign steps, out-of-range key ids
    and bad hex make a file unreadable."""
    key = '{"id":3,"secret":"00112233445566778899aabbccddeeff"}'
    good = (
        '{"name":"n","steps":[{"check":{"scope":"s","token":[0,1],"keys":[KEY],'
        '"signature":{"key_id":3,"lease_id":"l","tag":"00"}},"expect":{"outcome":"error"}},'
        '{"sign":{"scope":"s","token":[0,1],"lease_id":"l","key":KEY},"expect":{"outcome":"signed","tag":"00"}}]}'
    ).replace("KEY", key)
    vectors.parse(good)
    for bad in (
        good.replace('"id":3', '"id":4294967296', 1),
        good.replace('"key_id":3', '"key_id":-1'),
        good.replace('"tag":"00"}}', '"tag":"0"}}'),
        good.replace('"secret":"00', '"secret":"zz', 1),
        good.replace('"lease_id":"l","key"', '"lease":"l","key"'),
        good.replace('"keys":[', '"keys":{"a":[').replace('}],"signature"', '}]},"signature"'),
        good.replace('"outcome":"signed"', '"outcome":"signed","tags":"00"'),
    ):
        with pytest.raises(vectors.VectorFormatError):
            vectors.parse(bad)


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
    for transport in vectors.TRANSPORTS:
        one = subprocess.run(
            [sys.executable, "-m", "fencecheck", "vectors", "--transport", transport, str(FILES[0])],
            capture_output=True, text=True,
        )
        assert one.returncode == 0 and one.stdout.strip().endswith("1 passed, 0 failed")
    missing = tmp_path / "absent.json"
    bad = subprocess.run(
        [sys.executable, "-m", "fencecheck", "vectors", str(FILES[0]), str(missing)], capture_output=True, text=True
    )
    assert bad.returncode != 0
    assert f"FAIL {missing}: cannot read" in bad.stdout and bad.stdout.strip().endswith("1 passed, 1 failed")


def test_cli_names_the_transport_and_the_missing_feature():
    """Run on the released 0.1.0 (no signed tokens), the signed files fail
    through each transport with the unsupported-feature message; the others pass."""
    fixture = VECTORS.parent / "fixtures" / "fencecheck-0.1.0.wasm"
    signed = [p for p in FILES if p.stem.startswith("signed-")]
    out = subprocess.run(
        [sys.executable, "-m", "fencecheck", "--component", str(fixture), "vectors", str(FILES[0]), str(signed[0])],
        capture_output=True, text=True,
    )
    assert out.returncode != 0 and out.stdout.strip().endswith("1 passed, 1 failed")
    for transport in vectors.TRANSPORTS:
        assert f"[{transport}] step 1: the loaded component (fencecheck:fence@0.1.0) has no signed tokens" in out.stdout
