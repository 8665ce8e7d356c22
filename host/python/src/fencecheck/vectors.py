"""The conformance-vector runner, same contract as the Rust reference
(host/runtime/src/vectors.rs; format in tests/vectors/README.md).

Each file threads one stored fence state through its check steps (only
``applied`` replaces it); ``damage`` steps alter the stored bytes. Unknown
fields, wrong types and out-of-range integers make a file unreadable, as in the
Rust runner. A ``HostError`` (trapped guest) ends the file with a failure line:
it is never taken for an outcome. Lease steps (``acquire``, ``renew``,
``release``, ``restore``) thread a second slot, replaced by every outcome that
carries a state; ``damage`` reaches it with ``"state": "lease"``.

Signed tokens (0.1.1): a ``check`` with ``keys`` is decided with
``check_signed`` (the scope requires signed tokens; ``keys`` may be empty, to
test that refusal) and its optional ``signature``; without ``keys`` a
``signature`` is ignored (plain ``check``). A ``sign`` step expects
``signed`` with its exact ``tag`` or an error. ``run`` takes a transport:
``"component"`` (the typed ``check`` and ``auth.check-signed``: wasmtime's
component API), ``"core"`` (one-item ``check-packed`` batches on the core
module, as ``check_batch`` sends them) or ``"one"`` (``check`` and
``check_signed`` as they cross by default: the core module's single-check
export); every file must pass through each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from ._guest import Instance
from ._types import (
    U32_MAX,
    U64_MAX,
    Acquired,
    Applied,
    Busy,
    LeaseError,
    LeaseOutcome,
    Released,
    Renewed,
    Restored,
    Decision,
    Duplicate,
    FenceError,
    GrantKey,
    GrantSignature,
    HostError,
    Policy,
    Request,
    SignError,
    StaleFence,
    Token,
    VersionConflict,
    _utf8,
)

Outcome = Union[Decision, FenceError]


class VectorFormatError(ValueError):
    """The file is not a well-formed vector file."""


_FILE_KEYS = {"name", "description", "steps"}
_STEP_KEYS = {
    "check", "damage", "bit", "len", "hex", "state", "acquire", "renew", "release", "restore", "sign", "expect",
}
_CHECK_KEYS = {"scope", "token", "authority", "policy", "op_id", "expected_version", "keys", "signature"}
_EXPECT_KEYS = {
    "outcome", "version", "highest", "presented", "expected", "actual", "error", "reason",
    "token", "expires_at", "holder", "epoch", "tag",
}
_ACTIONS = ("check", "damage", "acquire", "renew", "release", "restore", "sign")
_SIGN_KEYS = {"scope", "token", "authority", "lease_id", "key"}
TRANSPORTS = ("component", "core", "one")
_LEASE_KEYS = {
    "acquire": {"lock", "lease_id", "now", "ttl", "authority", "epoch_floor"},
    "renew": {"lease_id", "token", "authority", "now", "ttl"},
    "release": {"lease_id", "token", "authority"},
    "restore": set(),
}


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise VectorFormatError(f"duplicate field `{key}`")
        seen[key] = value
    return seen


def _obj(value: Any, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise VectorFormatError(f"{what} must be an object")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise VectorFormatError(f"unknown field `{unknown[0]}` in {what}")
    return value


def u64(value: Any, what: str) -> int:
    """A JSON integer in u64 range (bools and floats refused, as serde does)."""
    if type(value) is not int or not 0 <= value <= U64_MAX:
        raise VectorFormatError(f"{what} must be an integer in 0..=2^64-1, got {value!r}")
    return value


def _opt_u64(obj: dict[str, Any], key: str) -> Optional[int]:
    return None if obj.get(key) is None else u64(obj[key], key)


def _pair(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise VectorFormatError(f"{what} must be [epoch, counter]")
    return u64(value[0], what), u64(value[1], what)


def _opt_str(obj: dict[str, Any], key: str) -> Optional[str]:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise VectorFormatError(f"{key} must be a string")
    return value


def _u32(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= U32_MAX:
        raise VectorFormatError(f"{what} must be an integer in 0..=2^32-1, got {value!r}")
    return value


def _hex(value: Any, what: str) -> bytes:
    # Strict, like Rust's hex::decode: no whitespace, an even length.
    if not isinstance(value, str) or len(value) % 2 or any(c not in "0123456789abcdefABCDEF" for c in value):
        raise VectorFormatError(f"{what}: bad hex {value!r}")
    return bytes.fromhex(value)


def _str(obj: dict[str, Any], key: str, what: str) -> str:
    if not isinstance(obj.get(key), str):
        raise VectorFormatError(f"{what}.{key} must be a string")
    return obj[key]


def _key(value: Any, what: str) -> GrantKey:
    k = _obj(value, {"id", "secret"}, what)
    return GrantKey(_u32(k.get("id"), f"{what}.id"), _hex(k.get("secret"), f"{what}.secret"))


def parse_check(check: Any) -> tuple[Request, Optional[list[GrantKey]]]:
    """A vector ``check`` object: its ``Request`` (with its signature, if it
    has one) and the scope's keys (``None``: not opted in, plain ``check``)."""
    c = _obj(check, _CHECK_KEYS, "check")
    request = parse_request(c)
    keys = c.get("keys")
    if keys is None:
        return request, None
    if not isinstance(keys, list):
        raise VectorFormatError("check.keys must be a list")
    return request, [_key(k, "check.keys[]") for k in keys]


def parse_request(check: Any) -> Request:
    """A vector ``check`` object as a ``Request`` (with its ``signature``;
    ``parse_check`` also gives the ``keys``)."""
    c = _obj(check, _CHECK_KEYS, "check")
    if not isinstance(c.get("scope"), str):
        raise VectorFormatError("check.scope must be a string")
    epoch, counter = _pair(c.get("token"), "check.token")
    authority = u64(c.get("authority", 0), "check.authority")
    policy = c.get("policy", "strict")
    if policy not in ("strict", "allow-equal"):
        raise VectorFormatError(f"unknown policy {policy!r}")
    sig = c.get("signature")
    if sig is not None:
        sig = _obj(sig, {"key_id", "lease_id", "tag"}, "check.signature")
        sig = (_u32(sig.get("key_id"), "signature.key_id"), _str(sig, "lease_id", "signature"), _hex(sig.get("tag"), "signature.tag"))
    try:
        signature = None if sig is None else GrantSignature(*sig)
        return Request(
            c["scope"],
            Token(authority, epoch, counter),
            Policy(policy),
            _opt_str(c, "op_id"),
            _opt_u64(c, "expected_version"),
            signature,
        )
    except (TypeError, ValueError) as e:
        raise VectorFormatError(str(e)) from None


def _sign_args(step: Any) -> tuple[str, Token, str, GrantKey]:
    """A ``sign`` step's scope, token, lease id and key."""
    a = _obj(step, _SIGN_KEYS, "sign")
    epoch, counter = _pair(a.get("token"), "sign.token")
    token = Token(u64(a.get("authority", 0), "sign.authority"), epoch, counter)
    scope, lease_id = _str(a, "scope", "sign"), _str(a, "lease_id", "sign")
    try:
        _utf8("sign.scope", scope), _utf8("sign.lease_id", lease_id)
    except ValueError as e:
        raise VectorFormatError(str(e)) from None
    return scope, token, lease_id, _key(a.get("key"), "sign.key")


def load(path: Union[str, Path]) -> dict[str, Any]:
    """Read and validate a vector file; raises ``VectorFormatError`` or ``OSError``."""
    text = Path(path).read_text(encoding="utf-8")
    return parse(text)


def parse(text: str) -> dict[str, Any]:
    """Validate a vector file's text (the shape only; steps are checked as they run)."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as e:
        raise VectorFormatError(f"cannot parse: {e}") from None
    f = _obj(data, _FILE_KEYS, "the file")
    if not isinstance(f.get("name"), str) or not isinstance(f.get("steps"), list):
        raise VectorFormatError("a vector file needs `name` (string) and `steps` (list)")
    for step in f["steps"]:
        s = _obj(step, _STEP_KEYS, "a step")
        if "expect" in s and s["expect"] is not None:
            _obj(s["expect"], _EXPECT_KEYS, "expect")
        if s.get("check") is not None:
            parse_check(s["check"])
        if s.get("sign") is not None:
            _sign_args(s["sign"])
        for action in _LEASE_KEYS:
            if s.get(action) is not None:
                _lease_args(action, s[action])
    return f


def _lease_args(action: str, step: Any) -> dict[str, Any]:
    """A lease step's fields, validated and with defaults (tests/vectors/README.md)."""
    a = _obj(step, _LEASE_KEYS[action], action)
    out: dict[str, Any] = {}
    for key in ("lock", "lease_id"):
        if key in _LEASE_KEYS[action]:
            if not isinstance(a.get(key), str):
                raise VectorFormatError(f"{action}.{key} must be a string")
            out[key] = a[key]
    for key in ("now", "ttl"):
        if key in _LEASE_KEYS[action]:
            if a.get(key) is None:
                raise VectorFormatError(f"{action} needs `{key}`")
            out[key] = u64(a[key], f"{action}.{key}")
    for key in ("authority", "epoch_floor"):
        if key in _LEASE_KEYS[action]:
            out[key] = u64(a.get(key, 0), f"{action}.{key}")
    if "token" in _LEASE_KEYS[action]:
        epoch, counter = _pair(a.get("token"), f"{action}.token")
        out["token"] = Token(out.pop("authority"), epoch, counter)
    return out


def damage(state: Optional[bytes], step: dict[str, Any]) -> Optional[bytes]:
    """Apply a ``damage`` step to a slot; raises ``VectorFormatError`` on a bad step.
    On an empty slot only ``replace`` creates bytes."""
    kind = step["damage"]

    def hex_arg() -> bytes:
        text = step.get("hex")
        if not isinstance(text, str):
            raise VectorFormatError(f"`{kind}` needs `hex`")
        # Strict, like Rust's hex::decode: no whitespace, an even length.
        if len(text) % 2 or any(c not in "0123456789abcdefABCDEF" for c in text):
            raise VectorFormatError(f"bad hex: {text!r}")
        return bytes.fromhex(text)

    if kind == "flip-bit":
        if step.get("bit") is None:
            raise VectorFormatError("`flip-bit` needs `bit`")
        bit = u64(step["bit"], "bit")
        if state:
            at = bit % (len(state) * 8)
            out = bytearray(state)
            out[at // 8] ^= 1 << (at % 8)
            return bytes(out)
        return state
    if kind == "truncate":
        if step.get("len") is None:
            raise VectorFormatError("`truncate` needs `len`")
        n = u64(step["len"], "len")
        return None if state is None else state[:n]
    if kind == "append":
        extra = hex_arg()
        return None if state is None else state + extra
    if kind == "replace":
        return hex_arg()
    if kind == "clear":
        return None
    raise VectorFormatError(f"unknown damage kind {kind!r}")


def _token_pair(t: Token) -> list[int]:
    return [t.epoch, t.counter]


def describe(o: Outcome) -> str:
    """A one-line description of an outcome, for failure lines."""
    if isinstance(o, Applied):
        return f"applied (version {o.version}, highest {_token_pair(o.highest)})"
    if isinstance(o, Duplicate):
        return f"duplicate (version {o.version})"
    if isinstance(o, StaleFence):
        return f"stale-fence (presented {_token_pair(o.presented)}, highest {_token_pair(o.highest)})"
    if isinstance(o, VersionConflict):
        return f"version-conflict (expected {o.expected}, actual {o.actual})"
    return f"error {o.name}" + (f" ({o.reason})" if o.reason else "")


def _field(name: str, want: Any, got: Any) -> None:
    if want is not None and want != got:
        raise AssertionError(f"{name}: expected {want!r}, got {got!r}")


def compare_signature(expect: dict[str, Any], o: Union[GrantSignature, SignError]) -> None:
    """Compare a ``sign`` step's outcome: ``signed`` with its ``tag`` (hex),
    or ``error`` with the sign error's name and, for ``invalid-key``, the key
    problem as ``reason`` (else ``none``)."""
    if isinstance(o, SignError):
        if expect.get("outcome") != "error":
            raise AssertionError(f"expected {expect.get('outcome')}, got error {o}")
        _field("error", expect.get("error"), o.name)
        _field("reason", expect.get("reason"), o.reason or "none")
        return
    if expect.get("outcome") != "signed":
        raise AssertionError(f"expected {expect.get('outcome')}, got signed")
    want = expect.get("tag")
    _field("tag", None if want is None else _hex(want, "expect.tag").hex(), o.tag.hex())


def compare(expect: dict[str, Any], o: Outcome) -> None:
    """Compare an outcome with the fields ``expect`` names; raises AssertionError."""
    got = "error" if isinstance(o, FenceError) else o.name
    if expect.get("outcome") != got:
        raise AssertionError(f"expected {expect.get('outcome')}, got {describe(o)}")
    pair = lambda key: None if expect.get(key) is None else list(_pair(expect[key], key))  # noqa: E731
    if isinstance(o, Applied):
        _field("version", _opt_u64(expect, "version"), o.version)
        _field("highest", pair("highest"), _token_pair(o.highest))
    elif isinstance(o, Duplicate):
        _field("version", _opt_u64(expect, "version"), o.version)
    elif isinstance(o, StaleFence):
        _field("presented", pair("presented"), _token_pair(o.presented))
        _field("highest", pair("highest"), _token_pair(o.highest))
    elif isinstance(o, VersionConflict):
        _field("expected", _opt_u64(expect, "expected"), o.expected)
        _field("actual", _opt_u64(expect, "actual"), o.actual)
    else:
        _field("error", expect.get("error"), o.name)
        _field("reason", expect.get("reason"), o.reason or "none")


LeaseResult = Union[LeaseOutcome, LeaseError]


def describe_lease(o: LeaseResult) -> str:
    """A one-line description of a lease outcome, starting with its name."""
    if isinstance(o, Acquired):
        return f"acquired (token {_token_pair(o.token)}, expires_at {o.expires_at})"
    if isinstance(o, Busy):
        return f"busy (holder {o.holder!r}, expires_at {o.expires_at})"
    if isinstance(o, Renewed):
        return f"renewed (expires_at {o.expires_at})"
    if isinstance(o, Restored):
        return f"restored (epoch {o.epoch})"
    if isinstance(o, LeaseError):
        return f"error {o.name}" + (f" ({o.reason})" if o.reason else "")
    return o.name


def compare_lease(expect: dict[str, Any], o: LeaseResult) -> None:
    """Compare a lease outcome with the fields ``expect`` names."""
    got = "error" if isinstance(o, LeaseError) else o.name
    if expect.get("outcome") != got:
        raise AssertionError(f"expected {expect.get('outcome')}, got {describe_lease(o)}")
    if isinstance(o, LeaseError):
        _field("error", expect.get("error"), o.name)
        _field("reason", expect.get("reason"), o.reason or "none")
    elif isinstance(o, Acquired):
        _field("token", None if expect.get("token") is None else list(_pair(expect["token"], "token")), _token_pair(o.token))
        _field("expires_at", _opt_u64(expect, "expires_at"), o.expires_at)
    elif isinstance(o, Busy):
        _field("holder", _opt_str(expect, "holder"), o.holder)
        _field("expires_at", _opt_u64(expect, "expires_at"), o.expires_at)
    elif isinstance(o, Renewed):
        _field("expires_at", _opt_u64(expect, "expires_at"), o.expires_at)
    elif isinstance(o, Restored):
        _field("epoch", _opt_u64(expect, "epoch"), o.epoch)


def run_lease(action: str, step: Any, state: Optional[bytes], guest: Instance) -> LeaseResult:
    """Run one lease step against the lease slot's state."""
    a = _lease_args(action, step)
    try:
        if action == "acquire":
            return guest.acquire(state, a["lock"], a["lease_id"], a["now"], a["ttl"],
                                 authority=a["authority"], epoch_floor=a["epoch_floor"])
        if action == "renew":
            return guest.renew(state, a["lease_id"], a["token"], a["now"], a["ttl"])
        if action == "release":
            return guest.release(state, a["lease_id"], a["token"])
        return guest.restore(state)
    except LeaseError as e:
        return e


def run_check(
    check: Any, state: Optional[bytes], guest: Instance, transport: str = "component"
) -> Outcome:
    """Run one ``check`` step against the fence slot's state, through
    ``transport`` (``TRANSPORTS``); a ``FenceError`` is returned, not raised."""
    request, keys = parse_check(check)
    try:
        if transport == "component":
            return guest._check_typed(state, request) if keys is None else guest._check_signed_typed(state, request, keys)
        if transport == "one":
            return guest.check(state, request) if keys is None else guest.check_signed(state, request, keys)
        if transport != "core":
            raise VectorFormatError(f"unknown transport {transport!r}")
        if keys is not None:
            return guest._check_signed(state, request, keys, single=False)
        [outcome] = guest.check_batch([(state, request)])
        return outcome
    except FenceError as e:
        return e


def run(file: dict[str, Any], guest: Instance, transport: str = "component") -> list[str]:
    """Run a parsed file through ``transport`` (``"component"`` or
    ``"core"``); returns one line per failing step (empty: passed)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; one of {TRANSPORTS}")
    failures: list[str] = []
    slots: dict[str, Optional[bytes]] = {"fence": None, "lease": None}
    for n, step in enumerate(file["steps"], start=1):
        try:
            actions = [a for a in _ACTIONS if step.get(a) is not None]
            if len(actions) != 1:
                raise AssertionError("a step needs exactly one action")
            if actions[0] == "damage":
                slot = step.get("state") or "fence"
                if slot not in slots:
                    raise AssertionError(f"unknown state slot {slot!r}")
                slots[slot] = damage(slots[slot], step)
                continue
            if step.get("expect") is None:
                raise AssertionError("step without `expect`")
            if actions[0] == "sign":
                scope, token, lease_id, key = _sign_args(step["sign"])
                try:
                    signed: Union[GrantSignature, SignError] = guest.sign(scope, token, lease_id, key)
                except SignError as e:
                    signed = e
                compare_signature(step["expect"], signed)
                continue
            if actions[0] != "check":
                lease = run_lease(actions[0], step[actions[0]], slots["lease"], guest)
                if isinstance(lease, (Acquired, Renewed, Released, Restored)):
                    slots["lease"] = lease.state
                compare_lease(step["expect"], lease)
                continue
            outcome = run_check(step["check"], slots["fence"], guest, transport)
            if isinstance(outcome, Applied):
                slots["fence"] = outcome.state
            compare(step["expect"], outcome)
        except (AssertionError, VectorFormatError) as e:
            failures.append(f"step {n}: {e}")
        except HostError as e:
            failures.append(f"step {n}: {e}")
            break
    return failures
