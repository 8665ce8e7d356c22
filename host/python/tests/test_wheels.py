"""The wheels scripts/dist ships (scripts/python-wheels), installed as a user
would: pip, given both, picks the platform wheel on its CPU family, and a new
process's first runtime then deserializes its precompiled artifacts with no
precompile step; the py3-none-any wheel compiles. No timings here: those are
host/python/bench/cold_start.py's (BENCHMARKS.md, issue 24 item 4)."""

import os
import platform
import subprocess
import sys

import pytest

from conftest import REPO

import fencecheck as fc

pytest.importorskip("build", reason="scripts/python-wheels needs python -m build (.ci/install.d/40-python.sh)")

PLATFORM_TAGS = {"x86_64": "manylinux1_x86_64", "aarch64": "manylinux2014_aarch64"}
ARCH = platform.machine()
PROBE = (
    "import fencecheck, sys; r = fencecheck.Runtime(); g = r.instance(); "
    "d = g.check(None, fencecheck.Request('report/july', fencecheck.Token(0, 0, 41))); "
    "print(r.loaded_from, type(d).__name__, fencecheck.__file__, r.why_compiled, sep='\\n')"
)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([str(REPO / "scripts" / "python-wheels"), str(out)], check=True, capture_output=True)
    return out


def venv_with(tmp_path, *pip_args):
    """A fresh venv that sees this interpreter's site-packages (wasmtime-py,
    pip) and gets fencecheck installed by ``pip install ARGS`` into itself."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "install", "--disable-pip-version-check", "--root-user-action=ignore", "-q",
         "--no-deps", "--no-index", "--ignore-installed", *pip_args],
        check=True,
    )
    return venv, python


def first_check(python, venv, cwd):
    """A new process (no PYTHONPATH, no FENCECHECK_PRECOMPILED, started away
    from the checkout): import, Runtime(), instance(), one check."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FENCECHECK_PRECOMPILED")}
    done = subprocess.run([python, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded_from, decision, module, why = done.stdout.splitlines()
    assert decision == "Applied"
    assert module.startswith(str(venv)), module  # the installed wheel, not the checkout or this interpreter's copy
    assert "RuntimeWarning" not in done.stderr, done.stderr
    return loaded_from, why


@pytest.mark.skipif(sys.platform != "linux" or ARCH not in PLATFORM_TAGS, reason="no platform wheel for this machine")
def test_pip_picks_the_platform_wheel_and_it_loads_precompiled(wheels, tmp_path):
    """Both wheels offered (--find-links), pip takes this CPU family's; its
    first runtime uses the shipped machine code, nobody having precompiled."""
    venv, python = venv_with(tmp_path, "--find-links", str(wheels), f"fencecheck=={fc.__version__}")
    dist_info = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / f"fencecheck-{fc.__version__}.dist-info"
    assert f"Tag: py3-none-{PLATFORM_TAGS[ARCH]}" in (dist_info / "WHEEL").read_text()
    package = dist_info.parent / "fencecheck"
    manifest = dict(line.split(" ", 1) for line in (package / "precompiled.txt").read_text().splitlines())
    assert manifest["target"].startswith(ARCH + "-") and manifest["cpu-features"] == "baseline"
    assert first_check(python, venv, tmp_path) == ("precompiled", "None")


def test_the_pure_wheel_compiles(wheels, tmp_path):
    """py3-none-any: no machine code in it, so the first runtime compiles (and
    says why), still deciding correctly."""
    venv, python = venv_with(tmp_path, str(wheels / f"fencecheck-{fc.__version__}-py3-none-any.whl"))
    loaded_from, why = first_check(python, venv, tmp_path)
    assert loaded_from == "compiled"
    assert why.startswith("no precompiled.txt in "), why
