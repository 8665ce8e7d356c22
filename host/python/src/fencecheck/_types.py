"""Plain Python values for the WIT contract (wit/fence.wit).

Decisions are values: ``Applied``, ``Duplicate``, ``StaleFence`` and
``VersionConflict``. When the check cannot decide (bad request, damaged state,
an unauthenticated token on a scope that requires signed tokens) it raises a
``FenceError`` subclass; when the component itself cannot run it raises a
``HostError`` subclass. Nothing here is retryable except a ``HostError``: a
``StaleFence`` is final for its grant.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Union

U64_MAX = 2**64 - 1
U32_MAX = 2**32 - 1

# Bounds of the auth interface (guest/src/auth.rs), for host-side checks of a
# key set before it is stored; the component applies the same ones itself.
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 64
MAX_KEYS = 16
TAG_BYTES = 32
MAX_SCOPE_BYTES = 1024

# The WIT enums of the auth interface, in declaration order (the packed
# format carries their case index).
AUTH_FAILURES = ("unsigned", "unknown-key", "malformed-signature", "bad-signature")
KEY_PROBLEMS = ("no-keys", "too-many-keys", "short-secret", "long-secret", "duplicate-key-id")


def _u64(name: str, value: object) -> int:
    # Checked here because the ABI would silently wrap an out-of-range int.
    if type(value) is not int or not 0 <= value <= U64_MAX:
        raise ValueError(f"{name} must be an int in 0..=2**64-1, got {value!r}")
    return value


def _u32(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value <= U32_MAX:
        raise ValueError(f"{name} must be an int in 0..=2**32-1, got {value!r}")
    return value


def _bytes(name: str, value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _utf8(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates cannot cross the ABI
        raise ValueError(f"{name} is not valid Unicode: {e}") from None
    return value


@dataclass(frozen=True, slots=True)
class Token:
    """A fencing token. ``(epoch, counter)`` compare lexicographically;
    ``epoch == counter == 0`` means "no token" and is always refused."""

    authority: int
    epoch: int
    counter: int

    def __post_init__(self) -> None:
        _u64("authority", self.authority)
        _u64("epoch", self.epoch)
        _u64("counter", self.counter)


class Policy(str, enum.Enum):
    """How a token equal to the highest accepted one is treated."""

    STRICT = "strict"
    """One mutation per grant: an equal token is stale."""
    ALLOW_EQUAL = "allow-equal"
    """Several mutations per grant, each guarded by an op-id or expected version."""


@dataclass(frozen=True, slots=True)
class GrantKey:
    """A key a resource trusts for a scope (or an authority signs with).
    The secret is never part of ``repr``. Its length (16 to 64 bytes) is
    the component's to judge (``InvalidKeys``); ``key_problem`` tells in
    advance."""

    key_id: int
    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _u32("key_id", self.key_id)
        object.__setattr__(self, "secret", _bytes("secret", self.secret))


@dataclass(frozen=True, slots=True)
class GrantSignature:
    """The proof that a grant came from its authority: the key that made it,
    the lease the grant was made to, and the HMAC-SHA256 tag (32 bytes).
    Lengths are the component's to judge (``malformed-signature``)."""

    key_id: int
    lease_id: str
    tag: bytes

    def __post_init__(self) -> None:
        _u32("key_id", self.key_id)
        _utf8("lease_id", self.lease_id)
        object.__setattr__(self, "tag", _bytes("tag", self.tag))


def _keys(keys: Iterable[GrantKey]) -> list[GrantKey]:
    """``keys`` as a list, each a ``GrantKey`` (else ``TypeError``)."""
    if isinstance(keys, (str, bytes, GrantKey)):
        raise TypeError("keys must be an iterable of fencecheck.GrantKey")
    out = list(keys)
    for k in out:
        if not isinstance(k, GrantKey):
            raise TypeError(f"a key must be a fencecheck.GrantKey, got {type(k).__name__}")
    return out


def key_problem(keys: Iterable[GrantKey]) -> str | None:
    """What makes ``keys`` unusable for a scope that requires signed tokens,
    as the component judges it (a ``KEY_PROBLEMS`` name), or ``None``."""
    keys = _keys(keys)
    if not keys:
        return "no-keys"
    if len(keys) > MAX_KEYS:
        return "too-many-keys"
    for i, k in enumerate(keys):
        if len(k.secret) < MIN_SECRET_BYTES:
            return "short-secret"
        if len(k.secret) > MAX_SECRET_BYTES:
            return "long-secret"
        if any(other.key_id == k.key_id for other in keys[i + 1 :]):
            return "duplicate-key-id"
    return None


@dataclass(frozen=True, slots=True)
class Request:
    """One protected mutation, as presented to the resource.

    ``signature``: the grant's signature, if the authority signed it. Only
    ``Instance.check_signed`` (a scope that requires signed tokens) reads
    it; ``check`` ignores it."""

    scope: str
    token: Token
    policy: Policy = Policy.STRICT
    op_id: str | None = None
    expected_version: int | None = None
    signature: GrantSignature | None = None

    def __post_init__(self) -> None:
        _utf8("scope", self.scope)
        if not isinstance(self.token, Token):
            raise TypeError("token must be a Token")
        object.__setattr__(self, "policy", Policy(self.policy))
        if self.op_id is not None:
            _utf8("op_id", self.op_id)
        if self.expected_version is not None:
            _u64("expected_version", self.expected_version)
        if self.signature is not None and not isinstance(self.signature, GrantSignature):
            raise TypeError("signature must be a GrantSignature or None")

    def with_signature(self, signature: GrantSignature | None) -> "Request":
        """This request carrying ``signature``."""
        return dataclasses.replace(self, signature=signature)


@dataclass(frozen=True, slots=True)
class Applied:
    """Apply the mutation and store ``state`` in the same transaction."""

    name: ClassVar[str] = "applied"
    version: int
    highest: Token
    state: bytes


@dataclass(frozen=True, slots=True)
class Duplicate:
    """This op-id was already applied under the highest token (at ``version``).
    Change nothing."""

    name: ClassVar[str] = "duplicate"
    version: int


@dataclass(frozen=True, slots=True)
class StaleFence:
    """A newer grant has written. Definitive: change nothing, stop working under
    this grant, never retry it."""

    name: ClassVar[str] = "stale-fence"
    presented: Token
    highest: Token


@dataclass(frozen=True, slots=True)
class VersionConflict:
    """``expected_version`` does not match the scope's version. Change nothing."""

    name: ClassVar[str] = "version-conflict"
    expected: int
    actual: int


Decision = Union[Applied, Duplicate, StaleFence, VersionConflict]
"""What the resource must do. Only ``Applied`` changes anything."""


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """An op-id applied under the highest token, and the version it produced."""

    op_id: str
    version: int


@dataclass(frozen=True, slots=True)
class StateInfo:
    """A decoded state (``Instance.inspect``), for tools and metrics."""

    format_version: int
    scope: str
    authority: int
    highest: Token
    version: int
    window: tuple[WindowEntry, ...]


class FencecheckError(Exception):
    """Base of every exception this package raises on purpose."""


class FenceError(FencecheckError):
    """The check could not decide; nothing may change. Deterministic: the same
    state and request raise the same error in every runtime, so retrying the
    same call is pointless.

    ``name`` is the WIT case (``invalid-request``, ``corrupt-state``, ...);
    ``reason`` is its sub-case where it has one (``missing-token``,
    ``checksum-mismatch``, ...), else ``None``.
    """

    name: ClassVar[str] = ""
    retryable: ClassVar[bool] = False

    def __init__(self, reason: str | None = None, detail: str = "") -> None:
        self.reason = reason
        text = self.name + (f" ({reason})" if reason else "") + (f": {detail}" if detail else "")
        super().__init__(text)


class InvalidRequest(FenceError):
    """The request is malformed; ``reason`` is the WIT ``invalid-reason``."""

    name = "invalid-request"


class CorruptState(FenceError):
    """The stored state is damaged; ``reason`` is the WIT ``corruption``."""

    name = "corrupt-state"


class UnsupportedStateVersion(FenceError):
    """The state was written by a newer format; upgrade the component."""

    name = "unsupported-state-version"

    def __init__(self, format_version: int) -> None:
        self.format_version = format_version
        super().__init__(None, f"format {format_version}")


class ScopeMismatch(FenceError):
    """The stored state belongs to another scope (``stored_scope``)."""

    name = "scope-mismatch"

    def __init__(self, stored_scope: str) -> None:
        self.stored_scope = stored_scope
        super().__init__(None, repr(stored_scope))


class ForeignAuthority(FenceError):
    """The token comes from another grant authority than the scope's."""

    name = "foreign-authority"

    def __init__(self, stored: int, presented: int) -> None:
        self.stored, self.presented = stored, presented
        super().__init__(None, f"stored {stored}, presented {presented}")


class Exhausted(FenceError):
    """The scope's version counter would overflow."""

    name = "exhausted"


class Unauthenticated(FenceError):
    """The scope requires signed tokens and this token is not proven to come
    from its authority; ``reason`` is the WIT ``auth-failure``: ``unsigned``,
    ``unknown-key``, ``malformed-signature`` or ``bad-signature`` (forged,
    tampered, or replayed from another scope: a MAC cannot tell which).
    Decided before the state is read. Definitive: the same token never
    passes; nothing may change."""

    name = "unauthenticated"


class InvalidKeys(FenceError):
    """The scope requires signed tokens but its key set is unusable;
    ``reason`` is the WIT ``key-problem`` (``no-keys``, ``too-many-keys``,
    ``short-secret``, ``long-secret``, ``duplicate-key-id``). The resource's
    configuration is at fault, not the caller: nothing is accepted until it
    is fixed."""

    name = "invalid-keys"


class SignError(FencecheckError):
    """``Instance.sign`` could not sign the grant. ``name`` is the WIT
    ``sign-error`` case (``empty-scope``, ``scope-too-long``,
    ``missing-token``, ``empty-lease-id``, ``lease-id-too-long``,
    ``invalid-key``); ``reason`` the key problem for ``invalid-key``, else
    ``None``. Deterministic, never retryable."""

    retryable: ClassVar[bool] = False

    def __init__(self, name: str, reason: str | None = None) -> None:
        self.name, self.reason = name, reason
        super().__init__(name + (f" ({reason})" if reason else ""))


class HostError(FencecheckError):
    """Infrastructure failure: no decision was obtained. Unlike a ``FenceError``
    or a ``StaleFence`` this may be retried (the instance is replaced)."""

    retryable: ClassVar[bool] = True


class ComponentLoadError(HostError):
    """The component file is missing or wasmtime refused it."""

    retryable = False


class UnsupportedComponent(ComponentLoadError):
    """The component's WIT package version is not one this package runs (for
    0.x: the same major and minor as the WIT it was written for), or it does
    not export ``fencecheck:fence/check`` at all. Raised at load.

    ``found``: what the component exports (``fencecheck:fence/check@0.2.0``);
    ``supported``: what this package runs (``fencecheck:fence@0.1.x``)."""

    def __init__(self, found: str, supported: str) -> None:
        super().__init__(f"component exports {found}; this host supports {supported}")
        self.found = found
        self.supported = supported


class UnsupportedFeature(HostError):
    """The loaded component is of a supported version but older than a
    feature this call needs (signed tokens need 0.1.1). Nothing was sent to
    the guest and every other call still works; load a newer component.
    ``feature``, ``version`` (the loaded one), ``since``. Not retryable."""

    retryable = False

    def __init__(self, feature: str, version: str, since: str) -> None:
        self.feature, self.version, self.since = feature, version, since
        super().__init__(
            f"the loaded component (fencecheck:fence@{version}) has no {feature}: that needs {since} or later"
        )


class GuestTrapped(HostError):
    """The guest trapped (out of fuel, out of memory, or a bug). The call had no
    effect; the instance was replaced by a fresh one."""

    def __init__(self, call: str, message: str) -> None:
        self.call, self.message = call, message
        super().__init__(f"the fencecheck guest trapped in `{call}`: {message}")


class PackedFormatError(HostError):
    """A ``check-packed`` batch did not follow its byte format: the guest
    refused this package's encoding (``side == "input"``, its ``batch-error
    malformed``) or returned bytes this package cannot read (``"output"``).
    Either is a bug in a host or the guest, never an outcome: no decision of
    the batch is returned, and retrying the same batch will fail the same way."""

    retryable = False

    def __init__(self, side: str, message: str) -> None:
        self.side, self.message = side, message
        what = "refused the batch as malformed" if side == "input" else "returned a malformed batch"
        super().__init__(f"check-packed {what}: {message}")


class TooLarge(HostError):
    """The call's inputs exceed ``Limits.call_bytes``; it was not sent."""

    retryable = False

    def __init__(self, call: str, size: int, limit: int) -> None:
        self.call, self.size, self.limit = call, size, limit
        super().__init__(f"call to `{call}` carries {size} bytes, above the {limit}-byte bound")


# -- the lease authority (grant side; WIT interface `lease`) -----------------


@dataclass(frozen=True, slots=True)
class Acquired:
    """A grant: store ``state`` (the lock's new lease state) and hand out ``token``."""

    name: ClassVar[str] = "acquired"
    token: Token
    expires_at: int
    state: bytes


@dataclass(frozen=True, slots=True)
class Busy:
    """Another unexpired lease holds the lock. Nothing changed."""

    name: ClassVar[str] = "busy"
    holder: str
    expires_at: int


@dataclass(frozen=True, slots=True)
class Renewed:
    """The exact current lease was extended; store ``state``."""

    name: ClassVar[str] = "renewed"
    expires_at: int
    state: bytes


@dataclass(frozen=True, slots=True)
class Lost:
    """Not the current lease, or expired: the holder must stop. Nothing changed."""

    name: ClassVar[str] = "lost"


@dataclass(frozen=True, slots=True)
class Released:
    """The exact current lease was released; store ``state``."""

    name: ClassVar[str] = "released"
    state: bytes


@dataclass(frozen=True, slots=True)
class NotOwner:
    """Not the current lease (e.g. an older owner's delayed release). Nothing changed."""

    name: ClassVar[str] = "not-owner"


@dataclass(frozen=True, slots=True)
class Restored:
    """The next epoch started (after restoring a coordinator); store ``state``."""

    name: ClassVar[str] = "restored"
    epoch: int
    state: bytes


LeaseOutcome = Union[Acquired, Busy, Renewed, Lost, Released, NotOwner, Restored]
"""What a lease call decided; only outcomes carrying ``state`` change the lock."""


class LeaseError(FencecheckError):
    """A lease call could not decide; nothing may change. Deterministic, never
    retryable. ``name`` is the WIT ``lease-error`` case (``invalid-request``,
    ``corrupt-state``, ``unsupported-state-version``, ``lock-mismatch``,
    ``foreign-authority``, ``exhausted``); ``reason`` its sub-case, if any."""

    retryable: ClassVar[bool] = False

    def __init__(self, name: str, reason: str | None = None, detail: str = "") -> None:
        self.name, self.reason = name, reason
        super().__init__(name + (f" ({reason})" if reason else "") + (f": {detail}" if detail else ""))
