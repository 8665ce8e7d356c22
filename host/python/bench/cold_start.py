#!/usr/bin/env python3
"""Cold start: whole-process wall time of a new Python process that imports
fencecheck and makes its first instance, next to the floor it cannot go
below (the interpreter alone, and ``import wasmtime`` alone).

    python3 host/python/bench/cold_start.py [-n RUNS] [--old SRC] [--breakdown]
        [--first-check] [--installed VENV]...

Each round starts one fresh process per case, in a rotating order (so load
from other work on the machine falls on every case alike), and waits for it;
the table gives the median over RUNS rounds of the wall time (spawn to exit,
as ``time`` would report it) and of the CPU time the process used (user +
system, from ``wait4``: less sensitive to other load than wall time).

Cases:

- ``python -c pass``: the interpreter, with this environment's ``site``;
- ``import wasmtime``;
- ``import wasmtime.component``: the floor of any host of a component in
  wasmtime-py (``import fencecheck`` needs the component API);
- ``import fencecheck; fencecheck.Runtime().instance()`` with the packaged
  precompiled artifacts (``Runtime.loaded_from == "precompiled"``, checked);
- the same with ``FENCECHECK_PRECOMPILED=0``: Cranelift compiles the
  component and its core module, as every process did before;
- with ``--old SRC``: the same statement with ``PYTHONPATH=SRC`` (a copy of an
  older ``host/python/src`` with ``fencecheck.wasm`` in it), side by side;
- with ``--installed VENV`` (repeatable): the same statement run by
  ``VENV/bin/python`` without ``PYTHONPATH``, i.e. the fencecheck a wheel
  installed there (``pip install`` into a venv; ``--system-site-packages``
  to share this interpreter's wasmtime-py). The table's last column says
  whether that process deserialized (``precompiled``) or compiled.

``--first-check``: every fencecheck case also makes its first check
(``instance().check(None, Request(...))``): the whole "first check" cost.

``--breakdown`` adds where the precompiled case's time goes: RUNS more
processes under ``python -X importtime``, medians of each import's
cumulative time, of ``Runtime()``, of ``instance()`` and of the first check
(importtime itself adds some overhead: indicative, not additive to the table
above).

``fencecheck`` is whatever this interpreter imports (set ``PYTHONPATH`` to
``host/python/src`` to time a checkout rather than the installed package).
Its modules (and ``--old``'s) are byte-compiled first, as ``pip install``
does: with ``PYTHONDONTWRITEBYTECODE=1`` in the environment a checkout would
otherwise be compiled from source in every process (~30 ms).
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import time

FIRST_INSTANCE = (
    "import fencecheck; r = fencecheck.Runtime(); r.instance(); "
    "print(getattr(r, 'loaded_from', 'compiled'))"
)
FIRST_CHECK = (
    "import fencecheck; r = fencecheck.Runtime(); g = r.instance(); "
    "d = g.check(None, fencecheck.Request('report/july', fencecheck.Token(0, 0, 41))); "
    "assert type(d).__name__ == 'Applied', d; "
    "print(getattr(r, 'loaded_from', 'compiled'))"
)


def run(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """One process: (wall ms, CPU ms, its stdout)."""
    read, write = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, write, 1), (os.POSIX_SPAWN_CLOSE, read)]
    start = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=actions)
    _, status, usage = os.wait4(pid, 0)
    wall = (time.perf_counter_ns() - start) / 1e6
    os.close(write)
    with os.fdopen(read) as out:
        text = out.read().strip()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed with status {status}")
    return wall, (usage.ru_utime + usage.ru_stime) * 1000, text


BREAKDOWN = (
    "import time; t0 = time.perf_counter(); import fencecheck; t1 = time.perf_counter(); "
    "r = fencecheck.Runtime(); t2 = time.perf_counter(); g = r.instance(); t3 = time.perf_counter(); "
    "g.check(None, fencecheck.Request('report/july', fencecheck.Token(0, 0, 41))); t4 = time.perf_counter(); "
    "print(r.loaded_from, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3)"
)
IMPORTS = ("site", "wasmtime", "wasmtime.component", "fencecheck._types", "hashlib", "fencecheck")


def breakdown(exe: str, env: dict[str, str], runs: int) -> None:
    """Medians of import times (-X importtime, cumulative), Runtime(),
    instance(), the first check."""
    rows: dict[str, list[float]] = {name: [] for name in IMPORTS + ("Runtime()", "instance()", "first check")}
    for _ in range(runs):
        done = subprocess.run([exe, "-X", "importtime", "-c", BREAKDOWN], env=env, capture_output=True, text=True, check=True)
        loaded, runtime, instance, check = done.stdout.split()
        if loaded != "precompiled":
            raise SystemExit(f"breakdown: the runtime was loaded from {loaded!r}")
        seen: set[str] = set()
        for line in done.stderr.splitlines():
            parts = line.split("|")
            name = parts[-1].strip() if len(parts) == 3 else ""
            if name in rows and name not in seen:  # the first import is the one that costs
                seen.add(name)
                rows[name].append(int(parts[1]) / 1e3)
        rows["Runtime()"].append(float(runtime))
        rows["instance()"].append(float(instance))
        rows["first check"].append(float(check))
    print("| step (precompiled case) | median |")
    print("| --- | ---: |")
    for name, values in rows.items():
        label = f"import {name} (cumulative)" if name in IMPORTS else name
        print(f"| {label} | {statistics.median(values):.1f} ms |" if values else f"| {label} | not imported |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=15)
    parser.add_argument("--old", help="a copy of an older host/python/src, timed side by side")
    parser.add_argument("--breakdown", action="store_true", help="also where the precompiled case's time goes")
    parser.add_argument("--first-check", action="store_true", help="each fencecheck case also makes its first check")
    parser.add_argument(
        "--installed", action="append", default=[], metavar="VENV",
        help="also time the fencecheck installed in VENV (its bin/python, no PYTHONPATH); repeatable",
    )
    args = parser.parse_args()
    workload = FIRST_CHECK if args.first_check else FIRST_INSTANCE

    exe = sys.executable
    env = dict(os.environ)
    env.pop("FENCECHECK_PRECOMPILED", None)
    compile_env = dict(env, FENCECHECK_PRECOMPILED="0")
    cases: list[tuple[str, list[str], dict[str, str], str | None]] = [
        ("python -c pass", [exe, "-c", "pass"], env, None),
        ("import wasmtime", [exe, "-c", "import wasmtime"], env, None),
        ("import wasmtime.component", [exe, "-c", "import wasmtime.component"], env, None),
        ("fencecheck, precompiled", [exe, "-c", workload], env, "precompiled"),
        ("fencecheck, FENCECHECK_PRECOMPILED=0", [exe, "-c", workload], compile_env, "compiled"),
    ]
    if args.old:
        old_env = dict(env, PYTHONPATH=os.path.abspath(args.old))
        cases.append((f"fencecheck, PYTHONPATH={args.old}", [exe, "-c", workload], old_env, "compiled"))
    venv_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    for venv in args.installed:
        python = os.path.join(os.path.abspath(venv), "bin", "python")
        cases.append((f"fencecheck installed in {venv}", [python, "-c", workload], venv_env, None))

    import fencecheck

    for directory in [os.path.dirname(fencecheck.__file__)] + ([os.path.join(args.old, "fencecheck")] if args.old else []):
        compileall.compile_dir(directory, quiet=1)
    # (pip byte-compiled the installed copies already.)
    for _, argv, case_env, _ in cases:  # warm-up: page cache
        run(argv, case_env)
    walls: list[list[float]] = [[] for _ in cases]
    cpus: list[list[float]] = [[] for _ in cases]
    loaded: list[set[str]] = [set() for _ in cases]
    load_before = os.getloadavg()
    for r in range(args.runs):
        for k in range(len(cases)):
            i = (r + k) % len(cases)
            name, argv, case_env, expect = cases[i]
            wall, cpu, out = run(argv, case_env)
            if expect is not None and out != expect:
                raise SystemExit(f"{name}: the runtime was loaded from {out!r}, not {expect!r}")
            walls[i].append(wall)
            cpus[i].append(cpu)
            loaded[i].add(out)
    load_after = os.getloadavg()

    print(
        f"Python {sys.version.split()[0]}, fencecheck from {os.path.dirname(fencecheck.__file__)}, "
        f"{args.runs} rounds; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"({os.cpu_count()} CPUs); workload: {'first check' if args.first_check else 'first instance'}"
    )
    print("| case | wall, median | wall, min–max | CPU, median | loaded from |")
    print("| --- | ---: | ---: | ---: | --- |")
    for (name, *_), w, c, how in zip(cases, walls, cpus, loaded):
        how_text = ", ".join(sorted(h for h in how if h)) or ""
        print(f"| {name} | {statistics.median(w):.0f} ms | {min(w):.0f}–{max(w):.0f} ms | {statistics.median(c):.0f} ms | {how_text} |")
    if args.breakdown:
        print()
        breakdown(exe, env, args.runs)


if __name__ == "__main__":
    main()
