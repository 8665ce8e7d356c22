"""``python -m fencecheck``: the vector runner, the agreement trace, and the
precompiler the package build runs.

    python -m fencecheck vectors FILE...   # ends with `N passed, N failed`
    python -m fencecheck vectors --transport core FILE...  # one transport (default: all)
    python -m fencecheck trace FILE        # one canonical line per step
    python -m fencecheck trace --batch typed FILE   # batches through typed check-batch
    python -m fencecheck precompile [--out DIR]     # machine code for this host (_precompiled)
    python -m fencecheck precompile --target TRIPLE --out DIR   # for any CPU of TRIPLE's family
    python -m fencecheck --component F precompile --metered --out DIR   # for Runtime(F, precompiled=DIR)
"""

from __future__ import annotations

import argparse
import sys

from ._guest import Runtime
from ._types import FencecheckError


def _vectors(files: list[str], component: str | None, transport: str) -> int:
    from . import vectors

    guest = Runtime(component).instance()
    transports = vectors.TRANSPORTS if transport in ("all", "both") else (transport,)
    passed = failed = 0
    for path in files:
        try:
            file = vectors.load(path)
        except (OSError, UnicodeDecodeError) as e:
            print(f"FAIL {path}: cannot read: {e}")
            failed += 1
            continue
        except vectors.VectorFormatError as e:
            print(f"FAIL {path}: {e}")
            failed += 1
            continue
        # A file passes only if it passes through every transport asked for.
        failures = [f"[{t}] {line}" for t in transports for line in vectors.run(file, guest, t)]
        for line in failures:
            print(f"FAIL {path}: {line}")
        if failures:
            failed += 1
        else:
            passed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


def _precompile(component: str | None, out: str | None, target: str | None, metered: bool) -> int:
    from . import _precompiled
    from ._guest import _default_component, _is_packaged

    try:
        wasm = _default_component() if component is None else open(component, "rb").read()
    except OSError as e:
        print(f"fencecheck: reading the component at {component}: {e}", file=sys.stderr)
        return 1
    directory = out or _precompiled.PACKAGE_DIR
    try:
        # The packaged component's artifacts are made without fuel, as it runs
        # (also from a copy of it: scripts/python-wheels stages one); any
        # other component runs metered, and so do --metered artifacts (for
        # Runtime(path, precompiled=DIR): a path is always metered).
        metered = metered or not _is_packaged(wasm)
        written = _precompiled.write(wasm, directory, target, metered=metered)
    except OSError as e:
        print(f"fencecheck: writing the precompiled artifacts to {directory}: {e}", file=sys.stderr)
        return 1
    for name, size in written:
        print(f"wrote {directory}/{name} ({size} bytes)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fencecheck", description=__doc__.splitlines()[0])
    parser.add_argument("--component", help="load this component file instead of the packaged one")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("vectors", help="run conformance vector files")
    v.add_argument(
        "--transport", choices=("all", "both", "component", "core", "one"), default="all",
        help="how checks cross: the component API (typed check and check-signed), the core module's "
        "check-packed (as check_batch sends them), its single-check export (as check and "
        "check_signed send them), or all three (default; `both` is an old name for it)",
    )
    v.add_argument("files", nargs="+")
    t = sub.add_parser("trace", help="run an agreement sequence (tests/agreement/README.md)")
    t.add_argument("file")
    t.add_argument(
        "--batch", choices=("packed", "typed"), default="packed",
        help="the export batch lines go through: check-packed (as check_batch does) or typed check-batch",
    )
    p = sub.add_parser("precompile", help="write the component precompiled for this host and wasmtime-py")
    p.add_argument("--out", help="the directory to write to (default: the package's, where Runtime() looks)")
    p.add_argument(
        "--target", metavar="TRIPLE",
        help="compile for this target (x86_64-unknown-linux-gnu) with its baseline CPU features, "
        "for any CPU of that family, instead of for this machine's (the platform wheels; "
        "wasmtime-py 50 compiles for its own CPU family and OS only)",
    )
    p.add_argument(
        "--metered", action="store_true",
        help="make them for a metered runtime (with fuel checks), as Runtime(path) and any component but "
        "the packaged one run; default: without fuel for the packaged component, with fuel for any other",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "vectors":
            return _vectors(args.files, args.component, args.transport)
        if args.command == "precompile":
            return _precompile(args.component, args.out, args.target, args.metered)
        from . import trace

        return trace.main(args.file, Runtime(args.component).instance(), typed_batches=args.batch == "typed")
    except FencecheckError as e:
        print(f"fencecheck: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
