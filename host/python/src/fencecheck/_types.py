"""Plain Python values for the WIT contract (wit/fence.wit).

Decisions are values: ``Applied``, ``Duplicate``, ``StaleFence`` and
``VersionConflict``. When the check cannot decide (bad request, damaged state)
it raises a ``FenceError`` subclass; when the component itself cannot run it
raises a ``HostError`` subclass. Nothing here is retryable except a
``HostError``: a ``StaleFence`` is final for its grant.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, Union

U64_MAX = 2**64 - 1


def _u64(name: str, value: object) -> int:
    # Checked here because the ABI would silently wrap an out-of-range int.
    if type(value) is not int or not 0 <= value <= U64_MAX:
        raise ValueError(f"{name} must be an int in 0..=2**64-1, got {value!r}")
    return value


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
class Request:
    """One protected mutation, as presented to the resource."""

    scope: str
    token: Token
    policy: Policy = Policy.STRICT
    op_id: str | None = None
    expected_version: int | None = None

    def __post_init__(self) -> None:
        _utf8("scope", self.scope)
        if not isinstance(self.token, Token):
            raise TypeError("token must be a Token")
        object.__setattr__(self, "policy", Policy(self.policy))
        if self.op_id is not None:
            _utf8("op_id", self.op_id)
        if self.expected_version is not None:
            _u64("expected_version", self.expected_version)


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
