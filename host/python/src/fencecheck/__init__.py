"""fencecheck for Python: the fencing-token rule, run from the one WebAssembly
component (wit/fence.wit) with wasmtime-py.

Call ``Instance.check`` *inside* your own transaction: read the scope's state,
check, and only on ``Applied`` perform the mutation and store ``Applied.state``,
then commit. ``fencecheck.sqlite.fenced_write`` does exactly that for the
standard library's ``sqlite3``, ``fencecheck.postgres.fenced_write`` for
PostgreSQL through psycopg 3 (``SELECT ... FOR UPDATE`` the state row, check,
write, commit; imported on its own, so psycopg is needed only there).

>>> import fencecheck as fc
>>> guest = fc.Runtime().instance()
>>> d = guest.check(None, fc.Request("report/july", fc.Token(0, 0, 41)))
>>> d.version, d.highest
(1, Token(authority=0, epoch=0, counter=41))
>>> guest.check(d.state, fc.Request("report/july", fc.Token(0, 0, 40))).name
'stale-fence'
"""

from ._version import __version__  # the package version (Cargo.toml's; scripts/build-component)
from ._guest import CHECK_INTERFACE, LEASE_INTERFACE, Instance, Limits, Runtime, component_version
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
    GuestTrapped,
    HostError,
    InvalidRequest,
    Policy,
    Request,
    ScopeMismatch,
    StaleFence,
    StateInfo,
    Token,
    TooLarge,
    UnsupportedStateVersion,
    VersionConflict,
    WindowEntry,
)

__all__ = [
    "__version__",
    "CHECK_INTERFACE", "Instance", "Limits", "Runtime", "component_version", "WIT_VERSION",
    "Applied", "Duplicate", "StaleFence", "VersionConflict", "Decision",
    "Policy", "Request", "Token", "StateInfo", "WindowEntry",
    "FencecheckError", "FenceError", "InvalidRequest", "CorruptState",
    "UnsupportedStateVersion", "ScopeMismatch", "ForeignAuthority", "Exhausted",
    "HostError", "ComponentLoadError", "UnsupportedComponent", "GuestTrapped", "PackedFormatError", "TooLarge",
    "LEASE_INTERFACE", "Acquired", "Busy", "Renewed", "Lost", "Released", "NotOwner",
    "Restored", "LeaseOutcome", "LeaseError",
]
