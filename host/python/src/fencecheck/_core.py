"""``check-packed`` through the component's core module: the canonical ABI of
``func(list<u8>) -> result<list<u8>, batch-error>`` done here, as jco's
generated glue does it for Node.

Why: wasmtime's C API for component values (all wasmtime-py's component API
has) carries a ``list<u8>`` as one 32-byte value per byte, each converted,
type-checked and lowered on its own: ~13 µs per check of a packed batch, most
of the batch's cost. The core export takes a (pointer, length) into guest
memory, so here a batch is one ``memmove`` in and one ``string_at`` out.

Used only when the component has the shape wit-component gives an
import-free guest: exactly one core module anywhere in the binary (so every
instruction the component runs is in it), importing nothing, and exporting
``memory``, ``cabi_realloc``, the check-packed function ``(i32, i32) -> i32``
and its post-return ``(i32) -> ()``, named after the check interface at the
component's version (``fencecheck:fence/check@0.1.1#check-packed``; an older
patch of the line has its own version there). Otherwise ``core_module`` returns
``None`` and the caller keeps the component API. Every pointer and length the
guest returns is bounds-checked; anything off raises ``PackedFormatError``.
"""

from __future__ import annotations

import ctypes
import re
import struct
from typing import Optional, Union

import wasmtime

from ._types import PackedFormatError

INTERFACE = "fencecheck:fence/check@0.1.1"  # the version this package was written for (_wit.WIT_VERSION)
EXPORT = INTERFACE + "#check-packed"
POST_RETURN = "cabi_post_" + EXPORT
_ANY_EXPORT = re.compile(r"fencecheck:fence/check@[^#]+#check-packed")

_PREAMBLE = b"\0asm\x0d\x00\x01\x00"  # component binary, layer 1
_CORE_MODULE, _COMPONENT = 1, 4  # section ids
_RET = struct.Struct("<BxxxII")  # ret area: discriminant, then (ptr, len) or the error enum
BATCH_ERRORS = ("malformed",)


def _leb(data: bytes, o: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[o]
        o += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, o


def _modules(component: bytes) -> Optional[list[bytes]]:
    """Every core module in a component binary, nested components included;
    ``None`` if it does not parse as one."""
    if component[:8] != _PREAMBLE:
        return None
    found: list[bytes] = []
    o = 8
    try:
        while o < len(component):
            section = component[o]
            size, o = _leb(component, o + 1)
            body = component[o : o + size]
            if len(body) != size:
                return None
            if section == _CORE_MODULE:
                found.append(body)
            elif section == _COMPONENT:
                nested = _modules(body)
                if nested is None:
                    return None
                found += nested
            o += size
    except IndexError:
        return None
    return found


def core_wasm(component: bytes) -> Optional[bytes]:
    """The component's only core module (its bytes), if it has exactly one."""
    modules = _modules(component)
    if not modules or len(modules) != 1:
        return None
    return modules[0]


def core_module(engine: wasmtime.Engine, component: bytes) -> Optional[wasmtime.Module]:
    """The component's only core module, compiled, if it has the shape
    described above."""
    wasm = core_wasm(component)
    if wasm is None:
        return None
    try:
        module = wasmtime.Module(engine, wasm)
    except wasmtime.WasmtimeError:
        return None
    return checked(module)


def checked(module: wasmtime.Module, interface: Optional[str] = None) -> Optional[wasmtime.Module]:
    """``module`` if it imports nothing and has the four exports with their
    exact core types, else ``None``. Also applied to a precompiled module
    (``_precompiled``), so both ways of getting it are held to one shape.
    ``interface``: the check interface the exports must be named after (the
    vetted component's); ``None``: whichever one check-packed export has."""
    if list(module.imports):
        return None
    exports = {e.name: e.type for e in module.exports}
    if interface is None:
        named = [n for n in exports if _ANY_EXPORT.fullmatch(n)]
        if len(named) != 1:
            return None
        export = named[0]
    else:
        export = interface + "#check-packed"

    def func(name: str, params: list[str], results: list[str]) -> bool:
        ty = exports.get(name)
        return (
            isinstance(ty, wasmtime.FuncType)
            and [str(p) for p in ty.params] == params
            and [str(r) for r in ty.results] == results
        )

    ok = (
        isinstance(exports.get("memory"), wasmtime.MemoryType)
        and func("cabi_realloc", ["i32"] * 4, ["i32"])
        and func(export, ["i32", "i32"], ["i32"])
        and func("cabi_post_" + export, ["i32"], [])
    )
    return module if ok else None


class Packed:
    """One core instance in a store: ``call(batch)`` returns the output bytes
    or the ``batch-error`` case name. Traps propagate as wasmtime errors."""

    def __init__(self, store: wasmtime.Store, module: wasmtime.Module, interface: str = INTERFACE) -> None:
        exports = wasmtime.Instance(store, module, []).exports(store)
        self._store = store
        self._memory = exports["memory"]
        self._realloc = exports["cabi_realloc"]
        self._check = exports[interface + "#check-packed"]
        self._post = exports["cabi_post_" + interface + "#check-packed"]

    def call(self, batch: bytes) -> Union[bytes, str]:
        store, memory = self._store, self._memory
        n = len(batch)
        at = self._realloc(store, 0, 0, 1, n)
        self._in_bounds(at, n, "argument")
        # The base address is read after realloc: growing memory may move it.
        ctypes.memmove(ctypes.addressof(memory.data_ptr(store).contents) + at, batch, n)
        ret = self._check(store, at, n)
        try:
            if ret % 4:
                raise PackedFormatError("output", f"result area at {ret} is not 4-aligned")
            self._in_bounds(ret, _RET.size, "result area")
            base = ctypes.addressof(memory.data_ptr(store).contents)
            tag, ptr, length = _RET.unpack(ctypes.string_at(base + ret, _RET.size))
            if tag == 0:
                self._in_bounds(ptr, length, "output")
                return ctypes.string_at(base + ptr, length)
            case = ptr & 0xFF  # an enum payload is one byte; the rest is not written
            if tag == 1 and case < len(BATCH_ERRORS):
                return BATCH_ERRORS[case]
            raise PackedFormatError("output", f"result discriminant {tag}, payload {case}")
        finally:
            self._post(store, ret)

    def _in_bounds(self, at: int, size: int, what: str) -> None:
        if at < 0 or at + size > self._memory.data_len(self._store):
            raise PackedFormatError("output", f"{what} [{at}, {at + size}) is outside guest memory")
