#!/usr/bin/env python3
"""Calls per second and cost per check through wasmtime-py, single and batched
(256 per call: the public ``check_batch`` over check-packed, and the typed
check-batch export it replaced), on the workload of benches/check.rs: scope report/july
has accepted 0.41, the request presents 0.42 under strict, so each check
verifies the stored state and encodes a new one. Prints medians over RUNS timed
runs (after a warm-up).

``check`` crosses through the core module's single-check export, without
fuel (the packaged component); for comparison, the same calls on a metered
runtime (``Runtime(metered=True)``: the packaged component with fuel, as a
component loaded from a path runs) and the single check through the typed
``check`` export (wasmtime's component API, the path ``check`` took before).

    python3 host/python/bench/bench.py [RUNS]
"""

import importlib.metadata
import statistics
import sys
import time

import fencecheck as fc
from fencecheck import _packed

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 15
BATCH = 256


def timed(fn, calls: int, per_call: int) -> float:
    """One timed run: ``calls`` iterations of ``fn``; ns per check."""
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / (calls * per_call)


def via_component_api(guest: fc.Instance, items: list) -> list:
    batch, n, _ = _packed.encode(items)
    return _packed.decode(guest._check_packed(batch, n, component_api=True), n)


def main() -> None:
    guest = fc.Runtime().instance()
    assert not guest._runtime.metered and guest._runtime._one, "the packaged component: unmetered, single-check export"
    metered = fc.Runtime(metered=True).instance()
    first = guest.check(None, fc.Request("report/july", fc.Token(0, 0, 41)))
    request = fc.Request("report/july", fc.Token(0, 0, 42))
    assert isinstance(guest.check(first.state, request), fc.Applied), "the workload must be applied"
    items = [(first.state, request)] * BATCH
    cases = [
        ("single check", lambda: guest.check(first.state, request), 2000, 1),
        ("single check, metered", lambda: metered.check(first.state, request), 2000, 1),
        ("single check via the typed check (component API), metered",
         lambda: metered._check_typed(first.state, request), 2000, 1),
        (f"check_batch of {BATCH} (check-packed), per check", lambda: guest.check_batch(items), 8, BATCH),
        (f"check_batch of {BATCH} (check-packed), metered, per check", lambda: metered.check_batch(items), 8, BATCH),
        # For comparison: check-packed through wasmtime's component API (one
        # C-API value per byte) instead of the core module, and the typed
        # export (one C-API value per field).
        (f"check-packed of {BATCH} via the component API, per check", lambda: via_component_api(guest, items), 8, BATCH),
        (f"typed check-batch of {BATCH}, per check", lambda: guest._check_batch_typed(items), 8, BATCH),
    ]
    version = sys.version.split()[0]
    print(f"fencecheck Python {version}, wasmtime-py {importlib.metadata.version('wasmtime')}, median of {RUNS} runs")
    print("| benchmark | ns per check | checks per second |")
    print("| --- | ---: | ---: |")
    for name, fn, calls, per in cases:
        timed(fn, calls, per)  # warm-up
        ns = statistics.median(timed(fn, calls, per) for _ in range(RUNS))
        print(f"| {name} | {ns:,.0f} | {1e9 / ns:,.0f} |")


if __name__ == "__main__":
    main()
