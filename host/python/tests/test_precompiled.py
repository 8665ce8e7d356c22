"""Precompiled artifacts: used when they match, never deserialized when they
do not (corrupted, made for another wasmtime-py, engine or component, or
writable by others), and a runtime that compiled instead decides the same.
The packaged component's artifacts are made without fuel (it runs
unmetered); a metered runtime uses only artifacts made with fuel."""

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import warnings

import pytest
import wasmtime
from wasmtime import component as wc

import fencecheck as fc
from fencecheck import _precompiled as pre
from fencecheck._guest import _default_component

from conftest import PACKAGED


OTHER_ARCH = "aarch64" if pre.host_platform()[0] == "x86_64" else "x86_64"


def req(counter, scope="report/july"):
    return fc.Request(scope, fc.Token(0, 0, counter))


def decides(runtime):
    """Every transport gives the expected decisions: typed check, check_batch
    (the core module when there is one), inspect."""
    guest = runtime.instance()
    first = guest.check(None, req(41))
    assert (first.version, first.highest) == (1, fc.Token(0, 0, 41))
    assert guest.check(first.state, req(40)) == fc.StaleFence(fc.Token(0, 0, 40), fc.Token(0, 0, 41))
    batch = guest.check_batch([(first.state, req(42)), (first.state, req(41)), (None, fc.Request("", fc.Token(0, 0, 1)))])
    assert isinstance(batch[0], fc.Applied) and batch[0].version == 2
    assert isinstance(batch[1], fc.StaleFence)
    assert isinstance(batch[2], fc.InvalidRequest)
    assert guest.inspect(batch[0].state).highest == fc.Token(0, 0, 42)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Artifacts for the packaged component, written once by ``write``."""
    directory = tmp_path_factory.mktemp("precompiled")
    pre.write(_default_component(), str(directory))
    return directory


@pytest.fixture()
def artifacts(made, tmp_path):
    """A private copy of ``made`` for one test to damage."""
    directory = tmp_path / "artifacts"
    shutil.copytree(made, directory)
    return directory


@pytest.fixture()
def no_deserialize(monkeypatch):
    """Fail the test if any artifact reaches wasmtime's deserializer."""
    calls = []

    def refuse(engine, data):
        calls.append(len(data))
        raise AssertionError("an artifact that should have been refused was deserialized")

    monkeypatch.setattr(wc.Component, "deserialize", refuse)
    monkeypatch.setattr(wasmtime.Module, "deserialize", refuse)
    return calls


def set_line(directory, key, value):
    path = directory / pre.MANIFEST
    lines = [f"{key} {value}" if line.split(" ")[0] == key else line for line in path.read_text().splitlines()]
    path.write_text("\n".join(lines) + "\n")


def compiled_with_warning(match, **kwargs):
    with pytest.warns(RuntimeWarning, match=match):
        runtime = fc.Runtime(**kwargs)
    assert runtime.loaded_from == "compiled"
    assert runtime.why_compiled is not None
    return runtime


def compiled_silently(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        runtime = fc.Runtime(**kwargs)
    assert runtime.loaded_from == "compiled"
    return runtime


def test_the_package_carries_artifacts_and_uses_them(monkeypatch):
    """scripts/build-component precompiles into the package; Runtime() uses it
    for both the component and the core module (check-packed's transport)."""
    monkeypatch.delenv(pre.ENV, raising=False)
    runtime = fc.Runtime()
    assert (runtime.loaded_from, runtime.why_compiled) == ("precompiled", None), runtime.why_compiled
    assert runtime._core is not None
    decides(runtime)


def test_written_artifacts_are_used(made):
    """``write`` leaves exactly the three files (no temporaries), and a runtime
    pointed at them deserializes both artifacts and decides."""
    assert sorted(os.listdir(made)) == sorted([pre.MANIFEST, pre.COMPONENT_ARTIFACT, pre.CORE_ARTIFACT])
    runtime = fc.Runtime(precompiled=made)
    assert runtime.loaded_from == "precompiled" and runtime._core is not None
    decides(runtime)


@pytest.mark.parametrize("name", [pre.COMPONENT_ARTIFACT, pre.CORE_ARTIFACT])
def test_one_flipped_byte_is_never_deserialized(artifacts, no_deserialize, name):
    """A corrupted artifact fails its SHA-256 before wasmtime sees it; the
    component is compiled and decides correctly."""
    path = artifacts / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    runtime = compiled_with_warning(f"{name} does not match its SHA-256", precompiled=artifacts)
    assert no_deserialize == []
    decides(runtime)


def test_a_truncated_artifact_is_never_deserialized(artifacts, no_deserialize):
    path = artifacts / pre.COMPONENT_ARTIFACT
    path.write_bytes(path.read_bytes()[:1000])
    decides(compiled_with_warning("does not match its SHA-256", precompiled=artifacts))
    assert no_deserialize == []


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("wasmtime", "49.0.0", "made by wasmtime-py 49.0.0"),
        ("engine", "consume_fuel=True", "engine settings"),
        ("fencecheck-precompiled", "1", "manifest format"),
        ("component-artifact", "0" * 64, "does not match its SHA-256"),
        ("target", f"{OTHER_ARCH}-unknown-linux-gnu", f"machine code for {OTHER_ARCH}-unknown-linux-gnu, running on"),
        ("target", f"{pre.host_platform()[0]}-apple-darwin" if sys.platform != "darwin" else "x86_64-pc-windows-msvc", "machine code for"),
        ("target", "x86_64", "machine code for x86_64, running on"),
        ("cpu-features", "avx512", "cpu-features 'avx512'"),
    ],
)
def test_a_mismatched_key_is_never_deserialized(artifacts, no_deserialize, key, value, match):
    """Another wasmtime-py, other engine settings, another manifest format,
    another recorded hash, machine code for another CPU family or operating
    system (or a target that is not a triple): compiled, with a warning
    saying which, the artifacts never handed to wasmtime."""
    set_line(artifacts, key, value)
    decides(compiled_with_warning(match, precompiled=artifacts))
    assert no_deserialize == []


@pytest.mark.parametrize("text", ["", "fencecheck-precompiled 1\n", "bogus line\n", "wasmtime \u00e9\n"])
def test_a_malformed_manifest_is_refused(artifacts, no_deserialize, text):
    (artifacts / pre.MANIFEST).write_text(text, encoding="utf-8")
    decides(compiled_with_warning("not used", precompiled=artifacts))
    assert no_deserialize == []


def test_artifacts_of_another_component_are_ignored_silently(made, no_deserialize):
    """The packaged component with a custom section appended is a different
    component (another SHA-256): the artifacts are not for it."""
    name = b"fencecheck-test"
    payload = bytes([len(name)]) + name + b"x"
    other = _default_component() + bytes([0, len(payload)]) + payload
    runtime = compiled_silently(component=other, precompiled=made)
    assert "another component" in runtime.why_compiled
    assert no_deserialize == []
    decides(runtime)


def test_wasmtime_refuses_what_the_hashes_cannot_catch(artifacts):
    """An artifact that hashes as recorded but was made for another engine
    (with fuel, for the unmetered packaged component) or is the wrong kind
    (the core module where the component belongs): wasmtime's own checks
    refuse it, and the component compiles."""
    config = wasmtime.Config()
    config.consume_fuel = True
    fueled = bytes(wc.Component(wasmtime.Engine(config), _default_component()).serialize())
    (artifacts / pre.COMPONENT_ARTIFACT).write_bytes(fueled)
    set_line(artifacts, "component-artifact", hashlib.sha256(fueled).hexdigest())
    decides(compiled_with_warning("wasmtime refused them", precompiled=artifacts))

    core = (artifacts / pre.CORE_ARTIFACT).read_bytes()
    (artifacts / pre.COMPONENT_ARTIFACT).write_bytes(core)
    set_line(artifacts, "component-artifact", hashlib.sha256(core).hexdigest())
    decides(compiled_with_warning("wasmtime refused them", precompiled=artifacts))


@pytest.mark.parametrize("target", ["directory", pre.MANIFEST, pre.COMPONENT_ARTIFACT, pre.CORE_ARTIFACT])
def test_artifacts_writable_by_others_are_refused(artifacts, no_deserialize, target):
    """Whoever can write the artifacts chooses the machine code that runs."""
    path = artifacts if target == "directory" else artifacts / target
    path.chmod(path.stat().st_mode | stat.S_IWOTH)
    decides(compiled_with_warning("writable by other users", precompiled=artifacts))
    assert no_deserialize == []


def test_disabled_by_argument_or_environment(made, monkeypatch):
    assert compiled_silently(precompiled=False).why_compiled == "precompiled=False"
    monkeypatch.setenv(pre.ENV, "0")
    assert compiled_silently().why_compiled == f"{pre.ENV}=0"
    # The variable only turns off the default: an explicit directory is still used.
    assert fc.Runtime(precompiled=made).loaded_from == "precompiled"


def test_a_directory_without_artifacts_compiles_silently(tmp_path):
    runtime = compiled_silently(precompiled=tmp_path)
    assert pre.MANIFEST in runtime.why_compiled
    decides(runtime)


def test_when_compiling_fails_too_the_load_error_is_raised(artifacts, no_deserialize):
    """Corrupted artifacts for a component that does not compile either: the
    refusal is warned about and the usual ComponentLoadError raised."""
    broken = b"\0asm\x0d\x00\x01\x00garbage"
    set_line(artifacts, "component", hashlib.sha256(broken).hexdigest())
    set_line(artifacts, "engine", pre.engine_key(metered=True))  # other bytes are metered
    set_line(artifacts, "core-artifact", "0" * 64)
    with pytest.warns(RuntimeWarning, match="does not match its SHA-256"):
        with pytest.raises(fc.ComponentLoadError, match="loading the fencecheck component"):
            fc.Runtime(component=broken, precompiled=artifacts)
    assert no_deserialize == []


def test_the_engine_is_configured_from_the_keyed_settings(made):
    """The key names every Config setting the runtime makes: fuel off for
    the packaged component (what build-component's artifacts are made for),
    on for a metered runtime."""
    assert pre.engine_settings(False) == (("consume_fuel", False),)
    assert pre.engine_settings(True) == (("consume_fuel", True),)
    assert (pre.engine_key(False), pre.engine_key(True)) == ("consume_fuel=False", "consume_fuel=True")
    assert pre._read_manifest(str(made))["engine"] == "consume_fuel=False"


def test_a_metered_runtime_uses_only_artifacts_made_with_fuel(made, tmp_path, monkeypatch):
    """A component loaded from a path is metered: it never looks at the
    package's (unmetered) artifacts, and the packaged component's artifacts
    in another directory are refused for it (and it is compiled with fuel);
    `precompile --metered` writes artifacts made with fuel, which it then
    uses, and which the unmetered packaged runtime refuses in turn; without
    --metered, a copy of the packaged component gets unmetered ones
    (scripts/python-wheels precompiles a staged copy)."""
    monkeypatch.delenv(pre.ENV, raising=False)
    silent = compiled_silently(path=PACKAGED)
    assert silent.metered and "metered" in silent.why_compiled
    assert compiled_with_warning("engine settings", path=PACKAGED, precompiled=made).metered
    done = subprocess.run(
        [sys.executable, "-m", "fencecheck", "--component", str(PACKAGED), "precompile", "--metered", "--out", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert pre._read_manifest(str(tmp_path))["engine"] == "consume_fuel=True"
    metered = fc.Runtime(PACKAGED, precompiled=tmp_path)
    assert (metered.loaded_from, metered.metered) == ("precompiled", True), metered.why_compiled
    decides(metered)
    starving = fc.Runtime(PACKAGED, precompiled=tmp_path, limits=fc.Limits(fuel_per_check=50, fuel_per_input_byte=0))
    with pytest.raises(fc.GuestTrapped):  # the deserialized machine code meters
        starving.instance().check(None, req(1))
    assert not compiled_with_warning("engine settings", precompiled=tmp_path).metered
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "fencecheck.wasm").write_bytes(PACKAGED.read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "fencecheck", "--component", str(copy / "fencecheck.wasm"), "precompile", "--out", str(copy)],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    assert pre._read_manifest(str(copy))["engine"] == "consume_fuel=False"
    assert fc.Runtime(precompiled=copy).loaded_from == "precompiled"


def test_the_component_is_found_without_reading_beside_the_module(monkeypatch, tmp_path):
    """When the package directory cannot be read directly (a zip), the
    component comes through importlib.resources, as before."""
    expected = _default_component()
    monkeypatch.setattr(pre, "PACKAGE_DIR", str(tmp_path / "absent"))
    assert _default_component() == expected


def test_cli_precompile(tmp_path):
    """`python -m fencecheck precompile --out DIR` (what build-component runs)
    writes artifacts a runtime uses; an unwritable target exits non-zero."""
    done = subprocess.run(
        [sys.executable, "-m", "fencecheck", "precompile", "--out", str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("wrote ") == 3
    assert fc.Runtime(precompiled=tmp_path).loaded_from == "precompiled"
    refused = subprocess.run(
        [sys.executable, "-m", "fencecheck", "precompile", "--out", str(tmp_path / "absent")], capture_output=True, text=True
    )
    assert refused.returncode == 1 and "writing the precompiled artifacts" in refused.stderr


def test_the_manifest_names_target_and_cpu_features(made):
    """build-component's artifacts (no --target): this host's CPU family and
    operating system, with the CPU features wasmtime found here."""
    manifest = pre._read_manifest(str(made))
    assert pre.target_platform(manifest["target"]) == pre.host_platform()
    assert manifest["cpu-features"] == pre.HOST_FEATURES


def test_precompiled_for_this_cpu_family_baseline(tmp_path):
    """`precompile --target TRIPLE` for this machine's own family (what the
    platform wheels carry): the triple and baseline features recorded, and a
    runtime on this machine uses them."""
    triple = f"{pre.host_platform()[0]}-unknown-linux-gnu"
    if pre.host_platform()[1] != "linux":
        pytest.skip("the platform wheels are Linux's")
    pre.write(_default_component(), str(tmp_path), target=triple)
    manifest = pre._read_manifest(str(tmp_path))
    assert (manifest["target"], manifest["cpu-features"]) == (triple, pre.BASELINE_FEATURES)
    runtime = fc.Runtime(precompiled=tmp_path)
    assert runtime.loaded_from == "precompiled", runtime.why_compiled
    decides(runtime)


def test_precompile_for_a_target_wasmtime_py_cannot_compile_for(tmp_path):
    """wasmtime-py 50 compiles for its own CPU family only (an engine for
    another aborts the process): `precompile --target` says so and exits 1,
    writing nothing; a string that is not a triple is refused the same way."""
    for target, says in ((f"{OTHER_ARCH}-unknown-linux-gnu", "cannot compile for"), ("bogus", "not a triple")):
        done = subprocess.run(
            [sys.executable, "-m", "fencecheck", "precompile", "--target", target, "--out", str(tmp_path)],
            capture_output=True, text=True,
        )
        assert done.returncode == 1 and says in done.stderr, done.stderr
        assert os.listdir(tmp_path) == []
