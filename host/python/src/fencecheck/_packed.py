"""The byte format of ``check-packed`` (its ``///`` docs in wit/fence.wit).

A batch crosses the component boundary as one ``list<u8>`` each way instead of
a tree of records, so the per-value conversion of wasmtime's C API is paid
per byte of one list, not per field of every item. This module only encodes
requests and decodes decisions; ``_guest`` makes the call.

Decoding is strict: anything that does not follow the format exactly
(unknown tag or sub-case, truncation, trailing bytes, a count other than the
number of items sent, a scope that is not UTF-8) raises ``PackedFormatError``
and no decision of the batch is returned. Guessing an outcome from bytes
that do not parse would be worse than no outcome.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Optional, Union

from ._types import (
    AUTH_FAILURES,
    KEY_PROBLEMS,
    MAX_KEYS,
    Applied,
    CorruptState,
    GrantKey,
    InvalidKeys,
    Unauthenticated,
    Decision,
    Duplicate,
    Exhausted,
    FenceError,
    ForeignAuthority,
    InvalidRequest,
    PackedFormatError,
    Policy,
    Request,
    ScopeMismatch,
    StaleFence,
    Token,
    UnsupportedStateVersion,
    VersionConflict,
)

# Input flags (bits 6-7 must be zero). KEYS: the scope requires signed
# tokens (the item is decided as auth.check-signed); SIGNATURE only with it.
STATE, OP_ID, EXPECTED, ALLOW_EQUAL, KEYS, SIGNATURE = 1, 2, 4, 8, 16, 32

# Output tags.
APPLIED, DUPLICATE, STALE_FENCE, VERSION_CONFLICT = 0, 1, 2, 3
INVALID_REQUEST, CORRUPT_STATE, UNSUPPORTED, SCOPE_MISMATCH, FOREIGN_AUTHORITY, EXHAUSTED = range(128, 134)
UNAUTHENTICATED, INVALID_KEYS = 134, 135  # only for items sent with KEYS

# Case indexes of the WIT enums, in declaration order.
INVALID_REASONS = (
    "missing-token", "empty-scope", "scope-too-long", "empty-op-id", "op-id-too-long", "equal-token-unguarded",
)
CORRUPTIONS = ("truncated", "length-mismatch", "checksum-mismatch", "malformed")

_U32 = struct.Struct("<I")
# Item head up to and including scope-len, without / with expected-version.
_HEAD = struct.Struct("<BQQQI")
_HEAD_EXPECTED = struct.Struct("<BQQQQI")
_APPLIED = struct.Struct("<QQQQI")  # version, highest, state-len
_U64 = struct.Struct("<Q")
_U64X2 = struct.Struct("<QQ")
_U64X6 = struct.Struct("<QQQQQQ")
_ONE_APPLIED_HEAD = bytes([1, 0, 0, 0, APPLIED])  # count 1, then the applied tag
_ONE_APPLIED = len(_ONE_APPLIED_HEAD) + _APPLIED.size  # where its state starts

Outcome = Union[Decision, FenceError]


def encode(
    items: Iterable[tuple[Optional[bytes], Request]], keys: Optional[Sequence[GrantKey]] = None
) -> tuple[bytes, int, int]:
    """Encode ``(state, request)`` pairs; returns ``(batch, count, input_bytes)``
    where ``input_bytes`` counts states, scopes and op-ids (what
    ``Limits.call_bytes`` bounds, as for ``check``).

    ``keys``: ``None`` for unsigned items (a request's signature is then not
    sent: ``check`` ignores it); else every item is decided as
    ``check-signed`` with these keys and its request's signature, which
    ``input_bytes`` then also counts.

    Raises ``TypeError`` for a state that is not bytes-like or an item that is
    not a ``Request``, before anything is sent."""
    parts: list[bytes] = [b""]  # the count goes first, once known
    append = parts.append
    head, head_expected, u32 = _HEAD.pack, _HEAD_EXPECTED.pack, _U32.pack
    size = count = 0
    if keys is not None:
        auth_keys, key_bytes = _keys(keys)
    for state, r in items:
        if type(r) is not Request:
            if not isinstance(r, Request):
                raise TypeError(f"request must be a fencecheck.Request, got {type(r).__name__}")
        t = r.token
        scope = r.scope.encode()
        op = r.op_id
        ev = r.expected_version
        flags = ALLOW_EQUAL if r.policy is Policy.ALLOW_EQUAL else 0
        if state is not None:
            if not isinstance(state, (bytes, bytearray, memoryview)):
                raise TypeError(f"state must be bytes or None, got {type(state).__name__}")
            flags |= STATE
        if op is not None:
            flags |= OP_ID
            op = op.encode()
        if keys is not None:
            flags |= KEYS | (SIGNATURE if r.signature is not None else 0)
        if ev is None:
            append(head(flags, t.authority, t.epoch, t.counter, len(scope)))
        else:
            append(head_expected(flags | EXPECTED, t.authority, t.epoch, t.counter, ev, len(scope)))
        append(scope)
        size += len(scope)
        if op is not None:
            append(u32(len(op)))
            append(op)
            size += len(op)
        if state is not None:
            state = bytes(state)
            append(u32(len(state)))
            append(state)
            size += len(state)
        if keys is not None:
            append(auth_keys)
            size += key_bytes
            sig = r.signature
            if sig is not None:
                lease = sig.lease_id.encode()
                append(u32(sig.key_id) + u32(len(lease)) + lease + _short(sig.tag))
                size += len(lease) + len(sig.tag)
        count += 1
    parts[0] = u32(count)
    return b"".join(parts), count, size


def _keys(keys: Sequence[GrantKey]) -> tuple[bytes, int]:
    """``key-count u8 | key-count x (key-id u32 | secret-len u8 | secret)``
    and the bytes it counts for ``Limits.call_bytes`` (as the Rust host:
    secret + 5 per key). What the u8 counts cannot carry is cut to what the
    guest judges the same way, so the guest still makes every decision:
    more than 255 keys become the first ``MAX_KEYS + 1`` (``too-many-keys``,
    checked before any key); a secret or tag longer than 255 bytes its first
    255 (``long-secret``; a tag not 32 bytes is ``malformed-signature``)."""
    keys = list(keys)
    for k in keys:
        if not isinstance(k, GrantKey):
            raise TypeError(f"a key must be a fencecheck.GrantKey, got {type(k).__name__}")
    size = sum(len(k.secret) + 5 for k in keys)
    if len(keys) > 255:
        keys = keys[: MAX_KEYS + 1]
    return bytes([len(keys)]) + b"".join(_U32.pack(k.key_id) + _short(k.secret) for k in keys), size


def _short(data: bytes) -> bytes:
    data = data[:255]
    return bytes([len(data)]) + data


def decode(out: bytes, expected: int, signed: bool = False) -> list[Outcome]:
    """Decode the guest's output for a batch of ``expected`` items;
    ``signed``: the batch was sent with keys (``encode(..., keys)``), so
    ``unauthenticated`` and ``invalid-keys`` may be among the outcomes (in
    an unsigned batch they are off the format).

    Raises ``PackedFormatError`` (never a guessed outcome) if ``out`` does not
    follow the format exactly."""
    # The common single check, Applied, read at once; anything else (other
    # outcomes, a malformed answer) takes the general loop below.
    if expected == 1 and len(out) >= _ONE_APPLIED and out[:5] == _ONE_APPLIED_HEAD:
        version, a, e, c, length = _APPLIED.unpack_from(out, 5)
        if _ONE_APPLIED + length == len(out):
            return [Applied(version, Token(a, e, c), out[_ONE_APPLIED:])]
    try:
        (n,) = _U32.unpack_from(out, 0)
        if n != expected:
            raise PackedFormatError("output", f"{n} results for {expected} items")
        results: list[Outcome] = []
        append = results.append
        tokens: dict[tuple[int, int, int], Token] = {}  # batches repeat tokens; Token() validates
        o, end = 4, len(out)
        for _ in range(n):
            tag = out[o]
            o += 1
            if tag == APPLIED:
                version, a, e, c, length = _APPLIED.unpack_from(out, o)
                o += 36
                if o + length > end:
                    raise PackedFormatError("output", "a state runs past the end")
                key = (a, e, c)
                highest = tokens.get(key) or tokens.setdefault(key, Token(a, e, c))
                append(Applied(version, highest, out[o : o + length]))
                o += length
            elif tag == DUPLICATE:
                append(Duplicate(_U64.unpack_from(out, o)[0]))
                o += 8
            elif tag == STALE_FENCE:
                v = _U64X6.unpack_from(out, o)
                o += 48
                append(StaleFence(Token(v[0], v[1], v[2]), Token(v[3], v[4], v[5])))
            elif tag == VERSION_CONFLICT:
                append(VersionConflict(*_U64X2.unpack_from(out, o)))
                o += 16
            elif tag == INVALID_REQUEST:
                append(InvalidRequest(_case(INVALID_REASONS, out[o], "invalid-reason")))
                o += 1
            elif tag == CORRUPT_STATE:
                append(CorruptState(_case(CORRUPTIONS, out[o], "corruption")))
                o += 1
            elif tag == UNSUPPORTED:
                append(UnsupportedStateVersion(out[o]))
                o += 1
            elif tag == SCOPE_MISMATCH:
                (length,) = _U32.unpack_from(out, o)
                o += 4
                if o + length > end:
                    raise PackedFormatError("output", "a scope runs past the end")
                append(ScopeMismatch(out[o : o + length].decode("utf-8")))
                o += length
            elif tag == FOREIGN_AUTHORITY:
                append(ForeignAuthority(*_U64X2.unpack_from(out, o)))
                o += 16
            elif tag == EXHAUSTED:
                append(Exhausted())
            elif tag == UNAUTHENTICATED and signed:
                append(Unauthenticated(_case(AUTH_FAILURES, out[o], "auth-failure")))
                o += 1
            elif tag == INVALID_KEYS and signed:
                append(InvalidKeys(_case(KEY_PROBLEMS, out[o], "key-problem")))
                o += 1
            else:
                raise PackedFormatError("output", f"unknown tag {tag} at byte {o - 1}")
        if o != end:
            raise PackedFormatError("output", f"{end - o} trailing bytes")
        return results
    except (struct.error, IndexError):  # a fixed-size field runs past the end
        raise PackedFormatError("output", "truncated") from None
    except UnicodeDecodeError:
        raise PackedFormatError("output", "a scope is not UTF-8") from None


def _case(names: tuple[str, ...], index: int, what: str) -> str:
    if index >= len(names):
        raise PackedFormatError("output", f"unknown {what} case {index}")
    return names[index]
