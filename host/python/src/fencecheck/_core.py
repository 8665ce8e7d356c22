"""``check-packed`` through the component's core module: the canonical ABI of
``func(list<u8>) -> result<list<u8>, batch-error>`` done here, as jco's
generated glue does it for Node.

Why: wasmtime's C API for component values (all wasmtime-py's component API
has) carries a ``list<u8>`` as one 32-byte value per byte, each converted,
type-checked and lowered on its own: ~13 µs per check of a packed batch, most
of the batch's cost. The core export takes a (pointer, length) into guest
memory, so here a batch is one ``memmove`` in and one ``string_at`` out.

A single check takes one call instead of three when the module also has the
guest's single-check exports (guest/src/one.rs, as host/runtime/src/core.rs
uses them): ``fencecheck-one-input() -> i64`` gives, once per instance, the
address (high 32 bits) and capacity (low 32 bits) of a static input buffer;
per check the one-item batch is copied there and ``fencecheck-one(len: i32)
-> i64`` answers the address and length of exactly the bytes check-packed
would answer (``-1``: ``malformed``; ``-2``: it does not fit the buffers, so
the batch goes through check-packed). No ``cabi_realloc``, no post-return. A
module without those exports (an older component) takes the three-call path
for every check.

Every core call is made through wasmtime's C API directly (``_Raw``:
``wasmtime_func_call_unchecked`` on values allocated once, each function's
type checked once when the instance is made, as the Rust host's
``TypedFunc``): wasmtime-py's generic ``Func.__call__`` reads the function's
type and converts every value through Python objects on each call: a
one-item check-packed took ~100 µs for its three calls that way, ~20 µs
this way, under the same load.

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
from typing import Any, Optional, Union

import wasmtime
from wasmtime import _ffi as ffi

from ._types import PackedFormatError

INTERFACE = "fencecheck:fence/check@0.1.1"  # the version this package was written for (_wit.WIT_VERSION)
EXPORT = INTERFACE + "#check-packed"
POST_RETURN = "cabi_post_" + EXPORT
_ANY_EXPORT = re.compile(r"fencecheck:fence/check@[^#]+#check-packed")

_PREAMBLE = b"\0asm\x0d\x00\x01\x00"  # component binary, layer 1
_CORE_MODULE, _COMPONENT = 1, 4  # section ids
_RET = struct.Struct("<BxxxII")  # ret area: discriminant, then (ptr, len) or the error enum
BATCH_ERRORS = ("malformed",)

ONE_INPUT = "fencecheck-one-input"  # the single-check exports (guest/src/one.rs)
ONE = "fencecheck-one"
_MALFORMED, _DOES_NOT_FIT = -1, -2  # fencecheck-one's answers other than a region


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

    ok = (
        isinstance(exports.get("memory"), wasmtime.MemoryType)
        and _func(exports, "cabi_realloc", ["i32"] * 4, ["i32"])
        and _func(exports, export, ["i32", "i32"], ["i32"])
        and _func(exports, "cabi_post_" + export, ["i32"], [])
    )
    return module if ok else None


def has_one(module: wasmtime.Module) -> bool:
    """Whether a module ``checked`` accepted also has the single-check
    exports, with their exact core types."""
    exports = {e.name: e.type for e in module.exports}
    return _func(exports, ONE_INPUT, [], ["i64"]) and _func(exports, ONE, ["i32"], ["i64"])


def _func(exports: dict, name: str, params: list[str], results: list[str]) -> bool:
    ty = exports.get(name)
    return (
        isinstance(ty, wasmtime.FuncType)
        and [str(p) for p in ty.params] == params
        and [str(r) for r in ty.results] == results
    )


class Packed:
    """One core instance in a store: ``call(batch)`` returns the output bytes
    or the ``batch-error`` case name; ``call_one(batch)`` the same for a
    one-item batch through the single-check export when there is one. Traps
    propagate as wasmtime errors.

    ``one``: use the single-check exports (``has_one`` said the module has
    them); an input buffer the guest places outside its memory disables them
    (a broken guest: every check then takes check-packed).

    Every export is called through wasmtime's C API (``_Raw``), not
    wasmtime-py's generic ``Func.__call__`` (see the top of this module)."""

    def __init__(
        self, store: wasmtime.Store, module: wasmtime.Module, interface: str = INTERFACE, one: bool = False
    ) -> None:
        exports = wasmtime.Instance(store, module, []).exports(store)
        self._store = store  # keeps the context alive
        memory = self._memory = exports["memory"]  # kept alive: its struct's address is below
        self._ctx = ctypes.cast(store._context(), ctypes.c_void_p).value
        self._mem = ctypes.addressof(memory._memory)
        raw = lambda name, params, result: _Raw(store, self._ctx, exports[name], params, result)  # noqa: E731
        self._realloc = raw("cabi_realloc", 4, "i32")
        self._check = raw(interface + "#check-packed", 2, "i32")
        self._post = raw("cabi_post_" + interface + "#check-packed", 1, None)
        self._one: Optional[_Raw] = None
        self._one_at = self._one_capacity = 0
        if one:
            at, capacity = _split(exports[ONE_INPUT](store))
            if at + capacity <= self._size():
                self._one = raw(ONE, 1, "i64")
                self._one_at, self._one_capacity = at, capacity

    @property
    def has_one(self) -> bool:
        """Whether ``call_one`` crosses through the single-check export."""
        return self._one is not None

    def _size(self) -> int:
        return _memory_size(self._ctx, self._mem)

    def _base(self) -> int:
        base = _memory_data(self._ctx, self._mem)
        if not base:
            raise PackedFormatError("output", "guest memory has no data")
        return base

    def call_one(self, batch: bytes) -> Union[bytes, str]:
        """A one-item batch: through ``fencecheck-one`` when the instance has
        it and the batch fits its input buffer, else ``call``. The same bytes
        come back either way."""
        one, at, n = self._one, self._one_at, len(batch)
        if one is None or n > self._one_capacity:
            return self.call(batch)
        ctx, mem = self._ctx, self._mem
        size = _memory_size(ctx, mem)
        if at + n > size:  # memory never shrinks; checked all the same
            raise PackedFormatError("output", "the single-check input buffer is outside guest memory")
        base = self._base()
        ctypes.memmove(base + at, batch, n)
        ret = one.call1(n)
        if ret == _MALFORMED:
            return BATCH_ERRORS[0]
        if ret == _DOES_NOT_FIT:  # the guest's buffers cannot hold it: check-packed decides it
            return self.call(batch)
        out, length = _split(ret)
        # The guest may have grown its memory, which may move it.
        grown = _memory_size(ctx, mem)
        if grown != size:
            size, base = grown, self._base()
        if ret < 0 or out + length > size:
            raise PackedFormatError(
                "output", f"the single-check answer [{out}, +{length}) is outside guest memory ({size} bytes)"
            )
        return ctypes.string_at(base + out, length)

    def call(self, batch: bytes) -> Union[bytes, str]:
        n = len(batch)
        at = self._realloc(0, 0, 1, n)
        self._in_bounds(at, n, "argument")
        # The base address is read after realloc: growing memory may move it.
        ctypes.memmove(self._base() + at, batch, n)
        ret = self._check(at, n)
        try:
            if ret % 4:
                raise PackedFormatError("output", f"result area at {ret} is not 4-aligned")
            self._in_bounds(ret, _RET.size, "result area")
            base = self._base()
            tag, ptr, length = _RET.unpack(ctypes.string_at(base + ret, _RET.size))
            if tag == 0:
                self._in_bounds(ptr, length, "output")
                return ctypes.string_at(base + ptr, length)
            case = ptr & 0xFF  # an enum payload is one byte; the rest is not written
            if tag == 1 and case < len(BATCH_ERRORS):
                return BATCH_ERRORS[case]
            raise PackedFormatError("output", f"result discriminant {tag}, payload {case}")
        finally:
            self._post(ret)

    def _in_bounds(self, at: int, size: int, what: str) -> None:
        if at < 0 or at + size > self._size():
            raise PackedFormatError("output", f"{what} [{at}, {at + size}) is outside guest memory")


def _split(word: int) -> tuple[int, int]:
    """An ``(address << 32) | length`` answer of the single-check exports
    (wasmtime gives the i64 signed)."""
    word &= 0xFFFF_FFFF_FFFF_FFFF
    return word >> 32, word & 0xFFFF_FFFF


def _prototype(name: str, restype: Any, argtypes: list[Any]) -> Any:
    """A C function of wasmtime's library with our own ctypes prototype
    (pointers as plain addresses), separate from wasmtime-py's (``dll[name]``
    makes a new function object; ``dll.name`` would be the shared one)."""
    fn = ffi.dll[name]
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_P = ctypes.c_void_p
_memory_data = _prototype("wasmtime_memory_data", _P, [_P, _P])
_memory_size = _prototype("wasmtime_memory_data_size", ctypes.c_size_t, [_P, _P])
_func_call_unchecked = _prototype("wasmtime_func_call_unchecked", _P, [_P, _P, _P, ctypes.c_size_t, _P])


class _Raw:
    """A core function called through wasmtime's C API, as the Rust host's
    ``TypedFunc`` calls it: its type checked once, here (i32 parameters, one
    i32 or i64 result or none), then every call through
    ``wasmtime_func_call_unchecked`` on one preallocated value array (the
    checked call converts and type-checks every value again, and allocates:
    about twice the cost of a call this short)."""

    __slots__ = ("_ctx", "_keep", "_func", "_values", "_values_at", "_size", "_i64", "_trap", "_trap_at")

    def __init__(
        self, store: wasmtime.Store, ctx: int, func: wasmtime.Func, nparams: int, result: Optional[str]
    ) -> None:
        ty = func.type(store)
        results = [] if result is None else [result]
        if [str(p) for p in ty.params] != ["i32"] * nparams or [str(r) for r in ty.results] != results:
            raise PackedFormatError("output", "a core export does not have the type the transport calls")
        self._ctx = ctx
        self._keep = func  # the struct whose address is below
        self._func = ctypes.addressof(func._func)
        # Parameters in, results out, in one array as long as the longer.
        self._size = max(nparams, len(results), 1)
        self._values = (ffi.wasmtime_val_raw_t * self._size)()
        self._values_at = ctypes.addressof(self._values)
        self._i64 = result == "i64"
        self._new_trap()

    def _new_trap(self) -> None:
        """A null trap pointer for the next call to fill (a Trap raised owns the previous one)."""
        self._trap = ctypes.POINTER(ffi.wasm_trap_t)()
        self._trap_at = ctypes.addressof(self._trap)

    def __call__(self, *args: int) -> int:
        values = self._values
        for i, value in enumerate(args):
            values[i].i32 = value
        return self._call()

    def call1(self, arg: int) -> int:
        """``self(arg)`` without the argument loop (the single check's call)."""
        self._values[0].i32 = arg
        return self._call()

    def _call(self) -> int:
        values = self._values
        error = _func_call_unchecked(self._ctx, self._func, self._values_at, self._size, self._trap_at)
        if error:
            raise wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, ctypes.POINTER(ffi.wasmtime_error_t)))
        trap = self._trap
        if trap:
            self._new_trap()
            raise wasmtime.Trap._from_ptr(trap)
        return values[0].i64 if self._i64 else values[0].i32
