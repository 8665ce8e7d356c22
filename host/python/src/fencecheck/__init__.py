"""fencecheck for Python: the fencing-token rule, run from the one WebAssembly
component (wit/fence.wit) with wasmtime-py.

Call ``Instance.check`` *inside* your own transaction: read the scope's state,
check, and only on ``Applied`` perform the mutation and store ``Applied.state``,
then commit. ``fencecheck.sqlite.fenced_write`` does exactly that for the
standard library's ``sqlite3``, ``fencecheck.postgres.fenced_write`` for
PostgreSQL through psycopg 3 (``SELECT ... FOR UPDATE`` the state row, check,
write, commit; imported on its own, so psycopg is needed only there).

Signed tokens (opt-in per scope): a lease authority signs each grant
(``Instance.sign``), and a resource that requires signatures for a scope
decides with ``Instance.check_signed`` and the keys it trusts for it
(``fencecheck.sqlite.set_keys`` keeps them in the shared layout, and its
``fenced_write`` then does this by itself). ``SignedToken`` is the text form
``TOKEN~KEY-ID~LEASE~TAG``.

Metrics: ``fencecheck.signals.install(...)`` makes the adapters count every
fenced write as ``fencecheck_decisions_total{operation, outcome, epoch}``
(docs/design.md §12) through ``prometheus_client`` or OpenTelemetry
(``PrometheusSignals``, ``OpenTelemetrySignals``; neither is a dependency).

>>> import fencecheck as fc
>>> guest = fc.Runtime().instance()
>>> d = guest.check(None, fc.Request("report/july", fc.Token(0, 0, 41)))
>>> d.version, d.highest
(1, Token(authority=0, epoch=0, counter=41))
>>> guest.check(d.state, fc.Request("report/july", fc.Token(0, 0, 40))).name
'stale-fence'
"""

from ._version import __version__  # the package version (Cargo.toml's; scripts/build-component)
from ._guest import AUTH_INTERFACE, CHECK_INTERFACE, LEASE_INTERFACE, Instance, Limits, Runtime, component_version
from ._wit import WIT_VERSION
from ._types import (
    Acquired,
    Busy,
    LeaseError,
    LeaseOutcome,
    Lost,
    NotOwner,
    PackedFormatError,
    Released,
    Renewed,
    Restored,
    Applied,
    ComponentLoadError,
    UnsupportedComponent,
    CorruptState,
    Decision,
    Duplicate,
    Exhausted,
    FencecheckError,
    FenceError,
    ForeignAuthority,
    GrantKey,
    GrantSignature,
    GuestTrapped,
    HostError,
    InvalidKeys,
    InvalidRequest,
    Policy,
    Request,
    ScopeMismatch,
    SignError,
    StaleFence,
    StateInfo,
    Token,
    TooLarge,
    Unauthenticated,
    UnsupportedFeature,
    UnsupportedStateVersion,
    VersionConflict,
    WindowEntry,
    AUTH_FAILURES,
    KEY_PROBLEMS,
    MAX_KEYS,
    MAX_SECRET_BYTES,
    MIN_SECRET_BYTES,
    TAG_BYTES,
    key_problem,
)
from ._text import (
    KeySetError,
    SignedToken,
    TokenTextError,
    format_keys,
    format_token,
    parse_keys,
    parse_token,
    signing_key,
)

__all__ = [
    "__version__",
    "CHECK_INTERFACE", "Instance", "Limits", "Runtime", "component_version", "WIT_VERSION",
    "Applied", "Duplicate", "StaleFence", "VersionConflict", "Decision",
    "Policy", "Request", "Token", "StateInfo", "WindowEntry",
    "FencecheckError", "FenceError", "InvalidRequest", "CorruptState",
    "UnsupportedStateVersion", "ScopeMismatch", "ForeignAuthority", "Exhausted",
    "HostError", "ComponentLoadError", "UnsupportedComponent", "GuestTrapped", "PackedFormatError", "TooLarge",
    "AUTH_INTERFACE", "GrantKey", "GrantSignature", "Unauthenticated", "InvalidKeys", "SignError",
    "UnsupportedFeature", "AUTH_FAILURES", "KEY_PROBLEMS", "MAX_KEYS", "MIN_SECRET_BYTES", "MAX_SECRET_BYTES",
    "TAG_BYTES", "key_problem",
    "SignedToken", "TokenTextError", "KeySetError", "parse_token", "format_token", "parse_keys", "format_keys",
    "signing_key",
    "LEASE_INTERFACE", "Acquired", "Busy", "Renewed", "Lost", "Released", "NotOwner",
    "Restored", "LeaseOutcome", "LeaseError",
]
