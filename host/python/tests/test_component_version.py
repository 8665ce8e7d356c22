"""The component's version is its WIT package version: the runtime reports
the one it loaded (``fencecheck.component_version()``,
``Runtime.component_version``) and refuses, at load, a component of a version
this package does not run. The other versions are the real component with the
version in every ``fencecheck:fence…@WIT_VERSION`` name rewritten (same
length); wasmtime compiles (validates) them, so they differ only in that
version. The released 0.1.0 (tests/fixtures/fencecheck-0.1.0.wasm, no
``auth`` interface) is run too: an older patch of the line, without signed
tokens."""

import re

import pytest

import fencecheck as fc
from fencecheck import _wit
from conftest import REPO

FIXTURE_010 = REPO / "tests" / "fixtures" / "fencecheck-0.1.0.wasm"


def _packaged() -> bytes:
    from fencecheck import _guest

    return _guest._default_component()


def _rewrite(component: bytes, to: str) -> bytes:
    """Every ``fencecheck:fence[/iface]@WIT_VERSION`` rewritten to ``@to``."""
    assert len(to) == len(fc.WIT_VERSION)
    pattern = re.compile(rb"(fencecheck:fence[a-z0-9/_-]*@)" + re.escape(fc.WIT_VERSION.encode()))
    out, n = pattern.subn(lambda m: m.group(1) + to.encode(), component)
    assert n > 0 and len(out) == len(component)
    return out


def test_wit_version_is_the_wit_files() -> None:
    """The version this package was written against is wit/fence.wit's: the
    interface's version, on the release's line (Cargo.toml's workspace
    version) and never ahead of it (scripts/version --check)."""
    wit = (REPO / "wit" / "fence.wit").read_text()
    m = re.search(r"^package fencecheck:fence@([^;\s]+);", wit, re.M)
    assert m is not None
    assert fc.WIT_VERSION == m.group(1)
    cargo = (REPO / "Cargo.toml").read_text()
    ws = re.search(r'^\[workspace\.package\]\s*\nversion\s*=\s*"([^"]+)"', cargo, re.M)
    assert ws is not None
    release = [int(p) for p in ws.group(1).split(".")]
    interface = [int(p) for p in fc.WIT_VERSION.split(".")]
    assert interface[:2] == release[:2] and interface[2] <= release[2]


def test_the_packaged_component_reports_its_version(runtime: fc.Runtime) -> None:
    """``component_version()`` and the runtime attribute read the loaded component."""
    assert fc.component_version() == fc.WIT_VERSION
    assert runtime.component_version == fc.WIT_VERSION
    assert fc.Runtime(precompiled=False).component_version == fc.WIT_VERSION


@pytest.mark.parametrize("version", ["0.2.0", "1.0.0", "0.0.9"])
def test_other_versions_are_refused_at_load(version: str, tmp_path) -> None:
    """A 0.2.0, 1.0.0 or 0.0.9 component is refused by ``Runtime`` (bytes or path)
    with what it exports and what this package runs."""
    future = _rewrite(_packaged(), version)
    path = tmp_path / "future.wasm"
    path.write_bytes(future)
    for load in (lambda: fc.Runtime(component=future), lambda: fc.Runtime(path)):
        with pytest.raises(fc.UnsupportedComponent) as e:
            load()
        assert str(e.value) == (
            f"component exports fencecheck:fence/check@{version}; this host supports fencecheck:fence@0.1.x"
        )
        assert e.value.found == f"fencecheck:fence/check@{version}"
        assert isinstance(e.value, fc.ComponentLoadError) and not e.value.retryable


def test_a_component_without_the_interface_is_refused() -> None:
    """A valid component without fencecheck:fence/check is refused, naming its exports."""
    with pytest.raises(fc.UnsupportedComponent) as e:
        fc.Runtime(component=b"\0asm\x0d\0\x01\0")
    assert e.value.found == "no fencecheck:fence/check interface (its exports: nothing)"
    renamed = _packaged().replace(b"fencecheck:fence/check@", b"fencecheck:fence/chock@")
    with pytest.raises(fc.UnsupportedComponent) as e:
        fc.Runtime(component=renamed)
    assert f"fencecheck:fence/chock@{fc.WIT_VERSION}" in e.value.found


@pytest.mark.parametrize("version", ["0.1.9", "0.1.0"])
def test_a_patch_of_the_line_is_run(version: str) -> None:
    """A newer (0.1.9) or older (0.1.0) patch is run, reports its version and
    decides as the packaged one, on both transports (the core module's
    exports are named after its own version), signed tokens included."""
    rt = fc.Runtime(component=_rewrite(_packaged(), version), precompiled=False)
    assert rt.component_version == version and rt.supports_signing
    assert rt._core is not None, "the core transport binds the exports of its version"
    guest = rt.instance()
    d = guest.check(None, fc.Request("s", fc.Token(0, 0, 3)))
    assert d.name == "applied"
    assert guest.check(d.state, fc.Request("s", fc.Token(0, 0, 2))).name == "stale-fence"
    assert [r.name for r in guest.check_batch([(d.state, fc.Request("s", fc.Token(0, 0, 4)))])] == ["applied"]
    assert isinstance(guest.acquire(None, "lock", "lease-a", 0, 1000), fc.Acquired)  # the lease interface binds too
    key = fc.GrantKey(1, b"k" * 32)
    signed = fc.Request("s", fc.Token(0, 0, 4), signature=guest.sign("s", fc.Token(0, 0, 4), "lease-a", key))
    assert guest.check_signed(d.state, signed, [key]).name == "applied"
    assert guest._check_signed_typed(d.state, signed, [key]).name == "applied"


def test_the_released_0_1_0_runs_without_signed_tokens() -> None:
    """The released 0.1.0 (no auth interface) loads, on both transports, and
    checks, batches and leases as before; check_signed, sign and
    grant_message raise UnsupportedFeature naming the feature and the
    version it needs, before anything is sent; the other calls still work."""
    rt = fc.Runtime(FIXTURE_010, precompiled=False)
    assert rt.component_version == "0.1.0" and not rt.supports_signing
    assert rt._core is not None
    guest = rt.instance()
    d = guest.check(None, fc.Request("s", fc.Token(0, 0, 3)))
    assert isinstance(d, fc.Applied)
    assert [o.name for o in guest.check_batch([(d.state, fc.Request("s", fc.Token(0, 0, 2)))])] == ["stale-fence"]
    key = fc.GrantKey(1, b"k" * 32)
    calls = [
        lambda: guest.check_signed(d.state, fc.Request("s", fc.Token(0, 0, 4)), [key]),
        lambda: guest._check_signed_typed(d.state, fc.Request("s", fc.Token(0, 0, 4)), [key]),
        lambda: guest.sign("s", fc.Token(0, 0, 4), "lease-a", key),
        lambda: guest.grant_message("s", fc.Token(0, 0, 4), 1, "lease-a"),
    ]
    for call in calls:
        with pytest.raises(fc.UnsupportedFeature) as e:
            call()
        assert str(e.value) == (
            "the loaded component (fencecheck:fence@0.1.0) has no signed tokens: that needs 0.1.1 or later"
        )
        assert (e.value.feature, e.value.version, e.value.since) == ("signed tokens", "0.1.0", "0.1.1")
        assert isinstance(e.value, fc.HostError) and not e.value.retryable
    assert guest.check(d.state, fc.Request("s", fc.Token(0, 0, 4))).version == 2  # the instance still works
    assert isinstance(guest.acquire(None, "lock", "lease-a", 0, 1000), fc.Acquired)


@pytest.mark.parametrize(
    "names, found",
    [
        (["fencecheck:fence/check@0.1"], "fencecheck:fence/check@0.1"),
        (["fencecheck:fence/check@0.2.0", "fencecheck:fence/auth@0.2.0"], "fencecheck:fence/check@0.2.0"),
        (["fencecheck:fence/check@0.1.0-rc1"], "fencecheck:fence/check@0.1.0-rc1"),
        (["fencecheck:fence/check@0.01.0"], "fencecheck:fence/check@0.01.0"),
        (["fencecheck:fence/check"], "fencecheck:fence/check without a version"),
        (
            ["fencecheck:fence/check@0.1.0", "fencecheck:fence/lease@0.2.0"],
            "fencecheck:fence/check@0.1.0 and fencecheck:fence/lease@0.2.0 (two versions)",
        ),
    ],
)
def test_malformed_and_mixed_versions_are_refused(names: list[str], found: str) -> None:
    """Malformed, tagged, missing and mixed versions are refused (as in the Rust host)."""
    with pytest.raises(fc.UnsupportedComponent) as e:
        _wit.vet(names)
    assert e.value.found == found


@pytest.mark.parametrize(
    "names, version, auth",
    [
        (["fencecheck:fence/check@0.1.0", "fencecheck:fence/lease@0.1.0"], "0.1.0", None),
        (["fencecheck:fence/check@0.1.1", "fencecheck:fence/auth@0.1.1"], "0.1.1", "fencecheck:fence/auth@0.1.1"),
        (["fencecheck:fence/check@0.1.42", "wasi:cli/run@0.2.0"], "0.1.42", None),
    ],
)
def test_every_patch_of_the_line_is_vetted(names: list[str], version: str, auth) -> None:
    """Older and newer patches of 0.1 pass; the auth interface is found only
    where it is exported (0.1.0 has none)."""
    vetted = _wit.vet(names)
    assert vetted.version == version and vetted.auth_interface == auth
    assert _wit.supported() == "fencecheck:fence@0.1.x"
