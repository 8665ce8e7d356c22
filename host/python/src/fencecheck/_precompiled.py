"""The component and its core module precompiled for this host, so that a new
process deserializes machine code (about a millisecond) instead of having
Cranelift compile both (about half a second; BENCHMARKS.md, Python cold start).

Made when the package is built: ``scripts/build-component`` runs
``python3 -m fencecheck precompile`` with the wasmtime-py the package will
run on, which writes next to ``fencecheck.wasm``:

- ``fencecheck.cwasm``: ``Component.serialize()`` of the component;
- ``fencecheck-core.cwasm``: ``Module.serialize()`` of its core module (the
  ``check-packed`` transport, ``_core``), if the component has that shape;
- ``precompiled.txt``: the key (this format, wasmtime-py's version, the engine
  settings, the target the machine code is for and which CPU features it
  assumes, the SHA-256 of the component compiled) and each artifact's SHA-256.

``precompile --target TRIPLE`` (``scripts/dist``, for the platform wheels)
compiles for that target instead, with the target's baseline CPU features
(``Config.target``: wasmtime infers no features from the building machine),
so the machine code runs on any CPU of that family: what a wheel tagged
``manylinux..._x86_64`` needs (``scripts/python-wheels``). wasmtime-py 50 is
built with Cranelift for its own CPU family only, and refuses another
operating system: only this machine's family and OS can be a target, so an
aarch64 wheel has to be built on an aarch64 machine.

Why at build time rather than a cache filled on first use: nothing is written
at run time (no cache directory to find, trust, share between users or keep
from growing; read-only installs work), the artifacts are exactly as trusted
as the ``.py`` files beside them, and the first process is as fast as every
other. The cost: an install whose wasmtime-py or CPU differs from the build's
compiles (below) until ``scripts/build-component`` runs again.

Deserializing runs the artifact's bytes as machine code, so they reach
wasmtime only if every check passes: neither the directory nor any of the
files is writable by other users; the manifest has this format; its
wasmtime-py version and engine settings are the running ones; its component
hash is the SHA-256 of the component being loaded; its target's CPU family
and operating system are the running ones (machine code for another CPU is
never handed to wasmtime); each artifact's bytes hash to the manifest's
SHA-256 (the bytes hashed are the bytes deserialized).
wasmtime then checks again (its own version, the engine configuration, the
target and CPU features) and raises if they differ. Any failure: compile the
``.wasm``, as before. When artifacts made for this very component are
refused, a ``RuntimeWarning`` says why (a silent fallback would cost every
process half a second unnoticed); no artifacts, artifacts of another
component, or ``FENCECHECK_PRECOMPILED=0`` compile silently.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import warnings
from dataclasses import dataclass
from os import PathLike
from typing import Optional, Union

import wasmtime
from wasmtime import component as wc

from . import _core
from ._types import ComponentLoadError

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

MANIFEST = "precompiled.txt"
COMPONENT_ARTIFACT = "fencecheck.cwasm"
CORE_ARTIFACT = "fencecheck-core.cwasm"
FORMAT = "2"  # 2: the target and cpu-features lines

ENV = "FENCECHECK_PRECOMPILED"
"""``FENCECHECK_PRECOMPILED=0`` makes ``Runtime()`` compile even when packaged
artifacts are there (benchmarks, or to rule them out)."""

def engine_settings(metered: bool) -> tuple[tuple[str, object], ...]:
    """Every ``wasmtime.Config`` setting the runtime makes: fuel metering on
    for a metered runtime (any component but the packaged one; see
    ``Runtime``), off for the packaged component. The engine that precompiles
    and the one that loads are both built from this tuple, and it is part of
    the key, so machine code made without fuel checks never runs a metered
    component. (Memory is bounded per store, ``Store.set_limits``, not by the
    engine, so no memory setting belongs here.)"""
    return (("consume_fuel", metered),)


def engine_key(metered: bool) -> str:
    """``engine_settings`` as the manifest's ``engine`` line records them."""
    return ",".join(f"{name}={value!r}" for name, value in engine_settings(metered))

_MANIFEST_KEYS = (
    "fencecheck-precompiled", "wasmtime", "engine", "target", "cpu-features",
    "component", "component-artifact", "core-artifact",
)
_NO_CORE = "none"

HOST_FEATURES = "host"
"""``cpu-features host``: compiled for the machine that ran ``precompile``,
with the CPU features wasmtime found there (``build-component``'s artifacts);
on a CPU of the same family without them wasmtime refuses the artifacts."""
BASELINE_FEATURES = "baseline"
"""``cpu-features baseline``: compiled for ``--target TRIPLE`` with that
target's default features only, for any CPU of the family (the wheels')."""

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
_OS_NAMES = {"linux": "linux", "darwin": "darwin", "win32": "windows"}
_VENDORS = {"linux": "unknown", "darwin": "apple", "windows": "pc"}


def _arch(name: str) -> str:
    name = name.lower()
    return _ARCH_ALIASES.get(name, name)


def host_platform() -> tuple[str, str]:
    """This process's CPU family and operating system as a target triple
    names them (``("x86_64", "linux")``, ``("aarch64", "darwin")``)."""
    try:
        machine = os.uname().machine
    except AttributeError:  # Windows
        import platform

        machine = platform.machine()
    return _arch(machine), _OS_NAMES.get(sys.platform, sys.platform)


def host_target() -> str:
    """A triple for this host (``x86_64-unknown-linux``), recorded by
    ``precompile`` without ``--target``. Only its CPU family and operating
    system are ever compared."""
    arch, system = host_platform()
    return f"{arch}-{_VENDORS.get(system, 'unknown')}-{system}"


def target_platform(triple: str) -> Optional[tuple[str, str]]:
    """A triple's CPU family and operating system (``x86_64-unknown-linux-gnu``:
    ``("x86_64", "linux")``); ``None`` if it is not ``arch-vendor-os[-env]``."""
    parts = triple.split("-")
    if len(parts) < 3 or not all(parts):
        return None
    return _arch(parts[0]), parts[2].lower()


def engine_config(target: Optional[str] = None, *, metered: bool) -> wasmtime.Config:
    """The runtime's engine configuration (``engine_settings``); with
    ``target``, one that compiles for that triple (and cannot run the code)."""
    config = wasmtime.Config()
    for name, value in engine_settings(metered):
        setattr(config, name, value)
    if target is not None:
        config.target = target
    return config


def wasmtime_version() -> Optional[str]:
    """The running wasmtime-py's version, from the one ``wasmtime-*.dist-info``
    directory beside the package (``importlib.metadata`` costs a new process
    tens of milliseconds). ``None`` if there is not exactly one."""
    site = os.path.dirname(os.path.dirname(os.path.abspath(wasmtime.__file__)))
    try:
        names = os.listdir(site)
    except OSError:
        return None
    found = [n[len("wasmtime-") : -len(".dist-info")] for n in names if n.startswith("wasmtime-") and n.endswith(".dist-info")]
    return found[0] if len(found) == 1 else None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Loaded:
    """The deserialized component, and its core module if it has one of the
    ``_core`` shape (``None``: the component API carries ``check-packed``)."""

    component: wc.Component
    core: Optional[wasmtime.Module]


class _Refused(Exception):
    """Why artifacts present in the directory are not used (warned about)."""


def load(
    engine: wasmtime.Engine, component: bytes, where: Union[bool, str, PathLike[str]], *, metered: bool
) -> Union[Loaded, str]:
    """The precompiled component from ``where`` (``True``: the package
    directory, unless ``FENCECHECK_PRECOMPILED=0``; ``False``: none; a path:
    that directory), or the reason it is not used (the caller compiles).
    ``metered``: whether ``engine`` consumes fuel; only artifacts made for
    the same setting are used. A metered runtime never looks in the package
    directory: its artifacts are the packaged component's, made without fuel
    checks. A missing, mismatched, damaged or unsafe artifact never raises
    here: each has that fallback."""
    if where is False:
        return "precompiled=False"
    if where is True:
        if os.environ.get(ENV) == "0":
            return f"{ENV}=0"
        if metered:
            return "metered: the package's artifacts are the packaged component's, made without fuel"
        where = PACKAGE_DIR
    directory = os.fspath(where)
    try:
        manifest = _read_manifest(directory)
        if manifest is None:
            return f"no {MANIFEST} in {directory}"
        if manifest["component"] != sha256(component):
            return f"the artifacts in {directory} are for another component"
        running = wasmtime_version()
        if manifest["wasmtime"] != running:
            raise _Refused(f"made by wasmtime-py {manifest['wasmtime']}, running {running}")
        running_key = engine_key(metered)
        if manifest["engine"] != running_key:
            raise _Refused(f"made for engine settings {manifest['engine']!r}, running {running_key!r}")
        made_for, running_on = target_platform(manifest["target"]), host_platform()
        if made_for != running_on:
            raise _Refused(f"machine code for {manifest['target']}, running on {'-'.join(running_on)}")
        if manifest["cpu-features"] not in (HOST_FEATURES, BASELINE_FEATURES):
            raise _Refused(f"cpu-features {manifest['cpu-features']!r} is neither {HOST_FEATURES} nor {BASELINE_FEATURES}")
        return _deserialize(engine, directory, manifest)
    except _Refused as e:
        reason = f"precompiled artifacts in {directory} not used: {e}"
        warnings.warn(f"fencecheck: {reason}; compiling the component instead", RuntimeWarning, stacklevel=3)
        return reason


def _read_manifest(directory: str) -> Optional[dict[str, str]]:
    """The manifest's fields (``None``: there is no manifest); raises
    ``_Refused`` if it cannot be read or is not in this format."""
    try:
        text = _read(directory, MANIFEST).decode("ascii")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _Refused(f"reading {MANIFEST}: {e}") from None
    except UnicodeDecodeError:
        raise _Refused(f"{MANIFEST} is not ASCII") from None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key not in _MANIFEST_KEYS or key in fields or not value:
            raise _Refused(f"{MANIFEST} has an unexpected line {line[:80]!r}")
        fields[key] = value
    if len(fields) != len(_MANIFEST_KEYS):
        raise _Refused(f"{MANIFEST} lacks {sorted(set(_MANIFEST_KEYS) - set(fields))}")
    if fields["fencecheck-precompiled"] != FORMAT:
        raise _Refused(f"manifest format {fields['fencecheck-precompiled']!r}, not {FORMAT}")
    return fields


def _deserialize(engine: wasmtime.Engine, directory: str, manifest: dict[str, str]) -> Loaded:
    """Both artifacts, each deserialized only after its bytes hash to the
    manifest's SHA-256; raises ``_Refused`` otherwise."""
    blobs: dict[str, bytes] = {}
    for key, name in (("component-artifact", COMPONENT_ARTIFACT), ("core-artifact", CORE_ARTIFACT)):
        if key == "core-artifact" and manifest[key] == _NO_CORE:
            continue
        try:
            data = _read(directory, name)
        except OSError as e:
            raise _Refused(f"reading {name}: {e}") from None
        if sha256(data) != manifest[key]:
            raise _Refused(f"{name} does not match its SHA-256 in {MANIFEST}")
        blobs[name] = data
    try:
        component = wc.Component.deserialize(engine, blobs[COMPONENT_ARTIFACT])
        core = wasmtime.Module.deserialize(engine, blobs[CORE_ARTIFACT]) if CORE_ARTIFACT in blobs else None
    except wasmtime.WasmtimeError as e:
        raise _Refused(f"wasmtime refused them: {e}") from None
    if core is not None and _core.checked(core) is None:
        raise _Refused(f"{CORE_ARTIFACT} does not have the core exports check-packed needs")
    return Loaded(component, core)


def _read(directory: str, name: str) -> bytes:
    """A file's bytes, refused (``_Refused``) if it or its directory is
    writable by other users: whoever can write there chooses the machine code
    this process runs. ``FileNotFoundError`` propagates."""
    if os.stat(directory).st_mode & stat.S_IWOTH:
        raise _Refused(f"{directory} is writable by other users")
    with open(os.path.join(directory, name), "rb") as f:
        if os.fstat(f.fileno()).st_mode & stat.S_IWOTH:
            raise _Refused(f"{name} is writable by other users")
        return f.read()


def write(
    component: bytes, directory: str, target: Optional[str] = None, *, metered: bool = False
) -> list[tuple[str, int]]:
    """Precompile ``component`` for this host's wasmtime-py into ``directory``
    (``python -m fencecheck precompile``); returns the files and their sizes.
    ``metered``: for a metered runtime (``Runtime(path)``: with fuel checks);
    ``False``, the default: for the packaged component, which runs without.
    ``target``: a triple (``x86_64-unknown-linux-gnu``) to compile for
    instead of this machine, with that target's baseline CPU features
    (``precompile --target``; the artifacts are for that wasmtime-py version
    on any CPU of the triple's family; wasmtime-py 50 can compile only for
    its own family and OS, and anything else raises ``ComponentLoadError``).
    ``None``: this machine, with the CPU features wasmtime finds on it.

    The manifest is removed first and written last, each file to a temporary
    name and then renamed: an interrupted run leaves no manifest (so nothing is
    used), never a manifest naming half-written artifacts."""
    version = wasmtime_version()
    if version is None:
        raise ComponentLoadError("cannot tell the installed wasmtime-py's version (no single wasmtime-*.dist-info)")
    if os.stat(directory).st_mode & stat.S_IWOTH:
        raise ComponentLoadError(f"{directory} is writable by other users; the runtime would refuse artifacts there")
    if target is not None:
        if target_platform(target) is None:
            raise ComponentLoadError(f"target {target!r} is not a triple arch-vendor-os[-env]")
        _can_compile_for(target)
    try:
        engine = wasmtime.Engine(engine_config(target, metered=metered))
    except wasmtime.WasmtimeError as e:
        raise ComponentLoadError(f"wasmtime-py cannot compile for target {target!r}: {e}") from None
    try:
        compiled = wc.Component(engine, component).serialize()
    except wasmtime.WasmtimeError as e:
        raise ComponentLoadError(f"compiling the fencecheck component: {e}") from None
    core = _core.core_module(engine, component)
    core_bytes = bytes(core.serialize()) if core is not None else None

    try:
        os.remove(os.path.join(directory, MANIFEST))
    except FileNotFoundError:
        pass
    written = [(COMPONENT_ARTIFACT, _write_atomic(directory, COMPONENT_ARTIFACT, bytes(compiled)))]
    if core_bytes is not None:
        written.append((CORE_ARTIFACT, _write_atomic(directory, CORE_ARTIFACT, core_bytes)))
    else:
        try:
            os.remove(os.path.join(directory, CORE_ARTIFACT))
        except FileNotFoundError:
            pass
    manifest = "".join(
        f"{key} {value}\n"
        for key, value in (
            ("fencecheck-precompiled", FORMAT),
            ("wasmtime", version),
            ("engine", engine_key(metered)),
            ("target", host_target() if target is None else target),
            ("cpu-features", HOST_FEATURES if target is None else BASELINE_FEATURES),
            ("component", sha256(component)),
            ("component-artifact", sha256(compiled)),
            ("core-artifact", sha256(core_bytes) if core_bytes is not None else _NO_CORE),
        )
    )
    written.append((MANIFEST, _write_atomic(directory, MANIFEST, manifest.encode("ascii"))))
    return written


def _can_compile_for(target: str) -> None:
    """Raise ``ComponentLoadError`` unless this wasmtime-py can make an engine
    for ``target``. Asked in a child process: wasmtime-py 50's build has
    Cranelift for its own CPU family only, and for any other it accepts the
    triple but then aborts the whole process in ``Engine()`` ("Support for
    this target is disabled")."""
    import subprocess

    probe = "import sys, wasmtime; c = wasmtime.Config(); c.target = sys.argv[1]; wasmtime.Engine(c)"
    done = subprocess.run([sys.executable, "-c", probe, target], capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "Err" in line or "Error" in line]
        why = lines[-1].strip() if lines else f"exit status {done.returncode}"
        raise ComponentLoadError(f"wasmtime-py {wasmtime_version()} cannot compile for {target}: {why}")


def _write_atomic(directory: str, name: str, data: bytes) -> int:
    """Write ``name`` through a temporary file in the same directory and a
    rename, readable by all (it is package data), writable by the owner only."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        os.unlink(tmp)
        raise
    return len(data)
