"""The argument and result values of ``check`` / ``check-batch``, built and read
as raw ``wasmtime_component_val_t`` memory (wasmtime's C API, as exposed by
wasmtime-py's ``_ffi``).

Why: wasmtime-py's generic conversion walks the function type through the C
API for every value, byte by byte for a ``list<u8>``, about 350 µs per check.
Here one ``bytearray`` per call holds every value, record entry, list element
and string of the arguments, written with ``struct.pack_into`` and extended
slice assignments; it is *borrowed* by the call (wasmtime copies what it
needs), so nothing has to be freed. Results are read with ``ctypes.string_at``
and then freed with one ``wasmtime_component_val_delete``.

The layout (a value is a kind byte and three payload words at offset 8; a
record entry is a name byte-vector followed by a value) is read from the
ctypes declarations and checked at import; the exported signatures are
checked at load (``_guest._verify``). Both fail closed.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Optional, Sequence, Union

from wasmtime import _ffi as ffi

from ._types import (
    Applied,
    CorruptState,
    Decision,
    Duplicate,
    Exhausted,
    FenceError,
    ForeignAuthority,
    InvalidKeys,
    InvalidRequest,
    Request,
    ScopeMismatch,
    StaleFence,
    Token,
    Unauthenticated,
    UnsupportedStateVersion,
    VersionConflict,
)

_V = ffi.wasmtime_component_val_t
_E = ffi.wasmtime_component_valrecord_entry_t
_U = ffi.wasmtime_component_valunion


def _layout_ok() -> bool:
    """True if the C structs have the shape this codec writes."""
    vec = ffi.wasm_byte_vec_t
    words = (_U.string, _U.list, _U.record, _U.enumeration, _U.variant, _U.result)
    return (
        (ctypes.sizeof(_V), _V.kind.offset, _V.of.offset, ctypes.sizeof(_E), _E.name.offset, _E.val.offset)
        == (32, 0, 8, 48, 0, 16)
        and all(w.offset == 0 for w in words + (_U.option, _U.u64, _U.u32, _U.u8))
        and (vec.size.offset, vec.data.offset) == (0, 8)
        and ffi.wasmtime_component_vallist_t.data.offset == 8
        and ffi.wasmtime_component_valrecord_t.data.offset == 8
        and ffi.wasmtime_component_valvariant_t.val.offset == 16
        and (ffi.wasmtime_component_valresult_t.is_ok.offset, ffi.wasmtime_component_valresult_t.val.offset) == (0, 8)
    )


LAYOUT_OK = _layout_ok()

VAL, ENTRY = 32, 48
_VALUE = struct.Struct("<B7xQQQ")  # kind, then the union as three words
_ENTRY = struct.Struct("<QQB7xQQQ")  # name (size, data), then a value


def _kind(name: str) -> int:
    return int(getattr(ffi, "WASMTIME_COMPONENT_" + name).value)


U8, U32, U64 = _kind("U8"), _kind("U32"), _kind("U64")
STRING, LIST, RECORD = _kind("STRING"), _kind("LIST"), _kind("RECORD")
ENUM, OPTION, RESULT, VARIANT = _kind("ENUM"), _kind("OPTION"), _kind("RESULT"), _kind("VARIANT")


class _Names:
    """Field and case names as C byte vectors: (size, address), built once."""

    def __init__(self, *names: str) -> None:
        self._keep = {n: ctypes.create_string_buffer(n.encode(), len(n)) for n in names}
        self.at = {n: (len(n), ctypes.addressof(b)) for n, b in self._keep.items()}


_NAMES = _Names(  # kept for the life of the process: the buffers must outlive every call
    "state", "request", "scope", "token", "policy", "op-id", "expected-version",
    "authority", "epoch", "counter", "strict", "allow-equal",
)
_N = _NAMES.at

# One batch item, laid out from its offset `o` (all sizes in bytes):
#   o+0    entries: state, request              (the item's record, 2 entries)
#   o+96   entries: scope, token, policy, op-id, expected-version
#   o+336  entries: authority, epoch, counter   (the token's record)
#   o+480  values:  the state's list, the op-id's string, the expected u64
#   o+576  the state's elements (32 bytes per byte), then scope and op-id bytes
_ITEM = struct.Struct("<" + "QQB7xQQQ" * 10 + "B7xQQQ" * 3)
_FIXED = _ITEM.size  # 576
_REQ, _TOK, _SV, _OV, _EV = 96, 336, 480, 512, 544
_U8_KIND = bytes((U8,))


def item_size(state: Optional[bytes], scope: bytes, op_id: Optional[bytes]) -> int:
    """Bytes `pack_item` writes for one pair."""
    return _FIXED + (len(state) * VAL if state else 0) + len(scope) + (len(op_id) if op_id else 0)


def pack_item(
    buf: bytearray, o: int, base: int, state: Optional[bytes], r: Request, scope: bytes, op_id: Optional[bytes]
) -> int:
    """Write one (state, request) pair at ``buf[o:]`` (``base`` is ``buf``'s
    address); returns the address of its two entries (state, request)."""
    a = base + o
    n = len(state) if state is not None else 0
    elems = o + _FIXED
    scope_at = elems + n * VAL
    op_at = scope_at + len(scope)
    t, p = r.token, _N[r.policy.value]
    _ITEM.pack_into(
        buf, o,
        *_N["state"], OPTION, a + _SV if state is not None else 0, 0, 0,
        *_N["request"], RECORD, 5, a + _REQ, 0,
        *_N["scope"], STRING, len(scope), base + scope_at, 0,
        *_N["token"], RECORD, 3, a + _TOK, 0,
        *_N["policy"], ENUM, p[0], p[1], 0,
        *_N["op-id"], OPTION, a + _OV if op_id is not None else 0, 0, 0,
        *_N["expected-version"], OPTION, a + _EV if r.expected_version is not None else 0, 0, 0,
        *_N["authority"], U64, t.authority, 0, 0,
        *_N["epoch"], U64, t.epoch, 0, 0,
        *_N["counter"], U64, t.counter, 0, 0,
        LIST, n, base + elems, 0,
        STRING, len(op_id) if op_id else 0, base + op_at, 0,
        U64, r.expected_version or 0, 0, 0,
    )
    if n:
        # A list<u8> is one 32-byte value per byte: kinds and bytes by stride.
        buf[elems : scope_at : VAL] = _U8_KIND * n
        buf[elems + 8 : scope_at : VAL] = state
    buf[scope_at:op_at] = scope
    if op_id:
        buf[op_at : op_at + len(op_id)] = op_id
    return a


def _encoded(pairs: Sequence[tuple[Optional[bytes], Request]]) -> list[tuple[Optional[bytes], Request, bytes, Optional[bytes]]]:
    out = []
    for state, r in pairs:
        if state is not None:
            if not isinstance(state, (bytes, bytearray, memoryview)):
                raise TypeError(f"state must be bytes or None, got {type(state).__name__}")
            state = bytes(state)
        if not isinstance(r, Request):
            raise TypeError(f"request must be a fencecheck.Request, got {type(r).__name__}")
        out.append((state, r, r.scope.encode(), None if r.op_id is None else r.op_id.encode()))
    return out


def _buffer(size: int) -> tuple[bytearray, Any, int]:
    buf = bytearray(max(size, 1))
    view = (ctypes.c_ubyte * len(buf)).from_buffer(buf)
    return buf, view, ctypes.addressof(view)


def input_bytes(encoded: Sequence[tuple[Optional[bytes], Request, bytes, Optional[bytes]]]) -> int:
    """States, scopes and op-ids in bytes: what ``Limits.call_bytes`` bounds."""
    return sum(len(s or b"") + len(sc) + len(op or b"") for s, _, sc, op in encoded)


def lower_check(state: Optional[bytes], request: Request) -> tuple[Any, Any, int]:
    """The two arguments of ``check``: (keep-alive, pointer to 2 values, input bytes)."""
    [(s, r, scope, op)] = enc = _encoded([(state, request)])
    buf, view, base = _buffer(2 * VAL + item_size(s, scope, op))
    pack_item(buf, 2 * VAL, base, s, r, scope, op)
    # `check` takes two plain values: copy them out of the item's two entries
    # (a value sits 16 bytes into its entry, after the name).
    for i in range(2):
        at = 2 * VAL + i * ENTRY + 16
        buf[i * VAL : (i + 1) * VAL] = buf[at : at + VAL]
    return (buf, view), ctypes.cast(base, ctypes.POINTER(_V)), input_bytes(enc)


def lower_batch(items: Sequence[tuple[Optional[bytes], Request]]) -> tuple[Any, Any, int]:
    """The one argument of ``check-batch``: (keep-alive, pointer to 1 value, input bytes)."""
    enc = _encoded(items)
    n = len(enc)
    head = VAL + n * VAL  # the list value, then one record value per item
    buf, view, base = _buffer(head + sum(item_size(s, sc, op) for s, _, sc, op in enc))
    _VALUE.pack_into(buf, 0, LIST, n, base + VAL, 0)
    o = head
    for i, (s, r, scope, op) in enumerate(enc):
        entries = pack_item(buf, o, base, s, r, scope, op)
        _VALUE.pack_into(buf, VAL + i * VAL, RECORD, 2, entries, 0)
        o += item_size(s, scope, op)
    return (buf, view), ctypes.cast(base, ctypes.POINTER(_V)), input_bytes(enc)


# -- lifting: read the result tree by address ---------------------------------


def _read(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size)


def _token(entries: int) -> Token:
    raw = _read(entries, 3 * ENTRY)
    return Token(*(_ENTRY.unpack_from(raw, i * ENTRY)[3] for i in range(3)))


def _fields(record_value: bytes) -> tuple[bytes, int]:
    """A record value's entries (raw) and count."""
    _, size, data, _ = _VALUE.unpack(record_value)
    return _read(data, size * ENTRY), size


def _u64s(entries: bytes, count: int) -> list[int]:
    return [_ENTRY.unpack_from(entries, i * ENTRY)[3] for i in range(count)]


def lift_outcome(value: bytes) -> Union[Decision, FenceError]:
    """One ``result<decision, check-error>`` value (32 raw bytes)."""
    _, is_ok, case_at, _ = _VALUE.unpack(value)
    tag, p = _case(case_at)
    return _decision(tag, p) if is_ok & 0xFF else _check_error(tag, p)


def lift_signed(result: Any) -> Union[Decision, FenceError]:
    """The result of ``auth.check-signed``: ``result<decision,
    signed-check-error>``, whose error is ``check(check-error)``,
    ``invalid-keys(key-problem)`` or ``unauthenticated(auth-failure)``."""
    _, is_ok, case_at, _ = _VALUE.unpack(bytes(result))
    tag, p = _case(case_at)
    if is_ok & 0xFF:
        return _decision(tag, p)
    if not p:
        raise ValueError(f"signed-check-error case {tag!r} without a payload")
    _, w0, w1, w2 = _VALUE.unpack(p)
    if tag == b"check":  # the payload is the check-error variant: (name, payload pointer)
        return _check_error(_read(w1, w0), _read(w2, VAL) if w2 else b"")
    if tag == b"invalid-keys":
        return InvalidKeys(_read(w1, w0).decode())
    if tag == b"unauthenticated":
        return Unauthenticated(_read(w1, w0).decode())
    raise ValueError(f"unknown signed-check-error case {tag!r}")


def _case(variant_at: int) -> tuple[bytes, bytes]:
    """A variant value at ``variant_at``: its case name and payload value
    (32 raw bytes; empty without a payload)."""
    _, name_size, name_at, payload_at = _VALUE.unpack(_read(variant_at, VAL))
    return _read(name_at, name_size), _read(payload_at, VAL) if payload_at else b""


def _decision(tag: bytes, p: bytes) -> Decision:
    if tag == b"applied":
        raw, _ = _fields(p)
        version = _ENTRY.unpack_from(raw, 0)[3]
        highest = _token(_ENTRY.unpack_from(raw, ENTRY)[4])
        _, n, elems, _ = _ENTRY.unpack_from(raw, 2 * ENTRY)[2:]
        return Applied(version, highest, _read(elems, n * VAL)[8::VAL])
    if tag == b"duplicate":
        return Duplicate(_VALUE.unpack(p)[1])
    if tag == b"stale-fence":
        raw, _ = _fields(p)
        return StaleFence(_token(_ENTRY.unpack_from(raw, 0)[4]), _token(_ENTRY.unpack_from(raw, ENTRY)[4]))
    if tag == b"version-conflict":
        return VersionConflict(*_u64s(*_fields(p)))
    # The signature check at load makes this unreachable; fail closed anyway.
    raise ValueError(f"unknown decision case {tag!r}")


def _check_error(tag: bytes, p: bytes) -> FenceError:
    _, w0, w1, _ = _VALUE.unpack(p) if p else (0, 0, 0, 0)
    if tag == b"invalid-request":
        return InvalidRequest(_read(w1, w0).decode())
    if tag == b"corrupt-state":
        return CorruptState(_read(w1, w0).decode())
    if tag == b"unsupported-state-version":
        return UnsupportedStateVersion(w0 & 0xFF)
    if tag == b"scope-mismatch":
        return ScopeMismatch(_read(w1, w0).decode())
    if tag == b"foreign-authority":
        return ForeignAuthority(*_u64s(*_fields(p)))
    if tag == b"exhausted":
        return Exhausted()
    raise ValueError(f"unknown check-error case {tag!r}")


def lift_check(result: Any) -> Union[Decision, FenceError]:
    """The result of ``check``."""
    return lift_outcome(bytes(result))


def lift_batch(result: Any, expected: int) -> list[Union[Decision, FenceError]]:
    """The result of ``check-batch``; raises ValueError on a count mismatch."""
    _, n, data, _ = _VALUE.unpack(bytes(result))
    if n != expected:
        raise ValueError(f"returned {n} results for {expected} items")
    raw = _read(data, n * VAL) if n else b""
    return [lift_outcome(raw[i * VAL : (i + 1) * VAL]) for i in range(n)]


# -- check-packed: one list<u8> each way ---------------------------------------

# The C API still carries a list<u8> as one 32-byte value per byte; writing
# and reading those by stride is two slice operations, whatever the batch.
_U8_KINDS = _U8_KIND * 4096


def lower_bytes(data: bytes) -> tuple[Any, Any]:
    """One ``list<u8>`` argument: (keep-alive, pointer to 1 value)."""
    n = len(data)
    buf, view, base = _buffer(VAL + n * VAL)
    _VALUE.pack_into(buf, 0, LIST, n, base + VAL, 0)
    if n:
        buf[VAL::VAL] = _U8_KINDS[:n] if n <= len(_U8_KINDS) else _U8_KIND * n
        buf[VAL + 8 :: VAL] = data
    return (buf, view), ctypes.cast(base, ctypes.POINTER(_V))


def lift_packed(result: Any) -> Union[bytes, str]:
    """The result of ``check-packed``: the output bytes, or the
    ``batch-error`` case name (a ``str``)."""
    _, is_ok, val_at, _ = _VALUE.unpack(bytes(result))
    _, w0, w1, _ = _VALUE.unpack(_read(val_at, VAL))
    if is_ok & 0xFF:
        return _read(w1, w0 * VAL)[8::VAL] if w0 else b""
    return _read(w1, w0).decode()
