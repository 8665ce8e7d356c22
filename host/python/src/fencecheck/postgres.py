"""Fenced writes on PostgreSQL through psycopg 3, in the one PostgreSQL layout
every fencecheck host shares.

``install`` creates fencecheck's tables from ``host/postgres/schema.sql``,
the text the Rust adapter (``fencecheck_postgres::install``) runs too,
packaged with this module. So a Python and a Rust writer of one scope on one
database read and advance the same fence state in ``fencecheck_scopes``: one
high-water mark, whatever the language.

``fenced_write`` mirrors ``fencecheck_postgres::fenced_write``: in one
transaction (at the connection's isolation level) it locks the scope's row
(``SELECT ... FOR UPDATE``), reads the scope's signing keys, checks, and only
on ``Applied`` stores the new state and runs your mutation, then commits.
Every other outcome, every exception (including one raised by your mutation)
rolls back: nothing changes.

Signed tokens, as in ``fencecheck.sqlite``: ``set_keys(conn, prefix, keys)``
makes every scope starting with ``prefix`` require tokens signed by one of
``keys`` (``fencecheck_keys``; the longest prefix decides, read with the
shared ``keys.sql``); ``fenced_write`` then decides with ``check_signed``. A
key change takes ``fencecheck_scopes`` in EXCLUSIVE mode, so it waits for
fenced writes in flight (which hold row locks on it) and every write that
commits after it decides with the new keys.

- READ COMMITTED (PostgreSQL's default): concurrent writers of one scope queue
  on its row lock, and each decides against the state the previous one
  committed, including two writers creating a new scope at once.
- REPEATABLE READ / SERIALIZABLE: a concurrent write the snapshot cannot see
  fails with ``SerializationConflict`` (retryable) instead; never a stale
  result.

Errors of this module are ``HostError`` subclasses (``fc.HostError``):
``SerializationConflict`` (``retryable = True``: rolled back for certain,
run the same write again); ``CommitUnknown`` (the connection failed during
the commit: the write may have committed), ``UnsupportedLayout``,
``TransactionEnded``, ``ScopeRowRace`` and ``UnreadableKeys`` (not
retryable). Any other psycopg
error is re-raised as it is, after rolling back. A ``StaleFence`` is a
returned value, never an exception.

Needs ``psycopg`` (3.x; the project tests ``psycopg[binary]==3.3.9``).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Callable, Iterable, Sequence

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from . import signals as _signals
from ._guest import Instance
from ._text import KeySetError
from ._types import (
    MAX_SCOPE_BYTES,
    U32_MAX,
    Applied,
    ComponentLoadError,
    Decision,
    GrantKey,
    HostError,
    Request,
    _keys,
    _utf8,
    key_problem,
)

LAYOUT_VERSION = 2
"""The layout this module reads and writes (``fencecheck_meta``'s ``layout``
row), the same number as the Rust host's ``fencecheck_postgres::LAYOUT_VERSION``."""

UPGRADES_FROM = 1
"""The layout ``install`` upgrades in place (layout 2 only adds ``fencecheck_keys``)."""

SCHEMA_RESOURCE = "postgres-schema.sql"
"""The packaged copy of ``host/postgres/schema.sql`` (scripts/build-component
puts it there)."""

KEYS_RESOURCE = "postgres-keys.sql"
"""The packaged copy of ``host/postgres/keys.sql``, the one query for a
scope's keys (its parameter is ``$1``: run with a ``psycopg.RawCursor``)."""

# "fencechk" in ASCII, the Rust host's key: serializes concurrent installs
# from every host (CREATE ... IF NOT EXISTS alone can race on the catalogs).
INSTALL_LOCK = 0x6665_6E63_6563_686B

_I64_MAX = 2**63 - 1

# SQLSTATEs after which the transaction was rolled back for certain and the
# same write may succeed: serialization_failure, deadlock_detected.
_RETRYABLE = frozenset({"40001", "40P01"})

_META_EXISTS = "SELECT to_regclass('fencecheck_meta') IS NOT NULL"
_READ_LAYOUT = "SELECT value FROM fencecheck_meta WHERE key = 'layout'"
_READ_STATE = "SELECT fence_state FROM fencecheck_scopes WHERE scope = %s"
_LOCK_STATE = "SELECT fence_state FROM fencecheck_scopes WHERE scope = %s FOR UPDATE"
# ON CONFLICT DO NOTHING: when two writers create one scope at once, the
# second waits for the first to commit, inserts nothing, and decides again
# against the state the first stored.
_INSERT_STATE = (
    "INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES (%s, %s, %s) "
    "ON CONFLICT (scope) DO NOTHING"
)
# Only the fence columns: the catalog pointer (visible_object,
# published_at_ms) is left as it is.
_UPDATE_STATE = "UPDATE fencecheck_scopes SET fence_state = %s, version = %s WHERE scope = %s"
# Key changes wait for fenced writes in flight and block new ones until they
# commit: EXCLUSIVE conflicts with the ROW SHARE a locking read holds, not
# with plain reads.
_LOCK_WRITERS = "LOCK TABLE fencecheck_scopes IN EXCLUSIVE MODE"
_DELETE_KEYS = "DELETE FROM fencecheck_keys WHERE scope_prefix = %s"
_INSERT_KEY = "INSERT INTO fencecheck_keys (scope_prefix, key_id, secret) VALUES (%s, %s, %s)"
_LIST_KEYS = "SELECT scope_prefix, key_id FROM fencecheck_keys ORDER BY scope_prefix, key_id"


class UnsupportedLayout(HostError):
    """``install`` found a database laid out for another version:
    ``fencecheck_meta``'s ``layout`` row holds ``found``, not
    ``LAYOUT_VERSION``. Nothing was created or changed. Not retryable: use a
    fencecheck version that supports that layout."""

    retryable = False

    def __init__(self, found: object) -> None:
        self.found = found
        self.supported = LAYOUT_VERSION
        super().__init__(
            f"unsupported fencecheck layout: the database has layout {found!r}, "
            f"this version supports only layout {LAYOUT_VERSION} (and upgrades layout {UPGRADES_FROM}); "
            "nothing was installed"
        )


class UnreadableKeys(HostError):
    """A ``fencecheck_keys`` row that decides for ``scope`` is not a key (a
    ``key_id`` outside u32): the table was written around the layout's
    constraints. Rolled back, nothing decided; not retryable. (The secret is
    never shown.)"""

    retryable = False

    def __init__(self, scope: str, detail: str) -> None:
        self.scope = scope
        super().__init__(f"fencecheck_keys holds a row that is not a key for scope {scope!r}: {detail}")


class SerializationConflict(HostError):
    """PostgreSQL aborted the transaction with a serialization failure
    (``40001``, REPEATABLE READ or SERIALIZABLE) or a deadlock (``40P01``),
    at any step, the commit included. Rolled back for certain and says
    nothing about the fence: run the same ``fenced_write`` again.
    ``sqlstate`` is the code; the psycopg error is ``__cause__``."""

    retryable = True

    def __init__(self, doing: str, error: psycopg.Error) -> None:
        self.doing, self.sqlstate = doing, error.sqlstate
        super().__init__(f"PostgreSQL aborted the fenced transaction while {doing} ({error.sqlstate}): {error}")


class CommitUnknown(HostError):
    """The connection failed while the commit was in flight: the write may or
    may not have committed. Read the scope (``load_state``, its ``version``)
    on a new connection before deciding anything; never assume either way.
    Not retryable as it is: a blind retry of an applied write would be
    decided against its own state (``Duplicate`` or ``StaleFence``)."""

    retryable = False

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(f"the commit's outcome is unknown: {error}")


class TransactionEnded(HostError):
    """The mutation ended ``fenced_write``'s transaction itself (ran ``COMMIT``
    or ``ROLLBACK`` through ``execute``). Whatever it committed stays
    committed, the fence state with it (the state is stored before the
    mutation runs); the rest was rolled back. A bug in the mutation, never an
    outcome, and not retryable. (``conn.commit()`` and ``conn.rollback()``
    are refused by psycopg itself inside the transaction.)"""

    retryable = False

    def __init__(self) -> None:
        super().__init__("the fenced mutation ended the transaction itself")


class ScopeRowRace(HostError):
    """The scope's row was created by another writer and then deleted again,
    twice, while this write was deciding (READ COMMITTED only). Rolled back,
    nothing stored. Not retryable: deleting fencecheck_scopes rows resets a
    fence, which nothing in fencecheck does; find out who does."""

    retryable = False

    def __init__(self, scope: str) -> None:
        self.scope = scope
        super().__init__(f"the row of scope {scope!r} was created and removed concurrently twice; nothing was stored")


class _Rejected(Exception):
    """Carries a non-applied decision out of the transaction block, which
    rolls back on any exception (a rejection changes nothing)."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision


@functools.cache
def _resource(name: str) -> str:
    try:
        return importlib.resources.files(__package__).joinpath(name).read_text("utf-8")
    except OSError as e:
        raise ComponentLoadError(
            f"the packaged {name} is missing ({e}); run scripts/build-component "
            "before `pip install ./host/python`"
        ) from None


def _schema() -> str:
    return _resource(SCHEMA_RESOURCE)


def _idle(conn: psycopg.Connection, what: str) -> None:
    # Joining the caller's transaction would commit or roll back its work
    # with ours; psycopg's transaction() would silently make ours a savepoint.
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise psycopg.ProgrammingError(f"{what} needs its own transaction; commit or roll back first")


def _layout(cur: psycopg.Cursor) -> object | None:
    """The stored layout number, or ``None`` when there is no
    ``fencecheck_meta`` table or no ``layout`` row in it (as the Rust host)."""
    row = cur.execute(_META_EXISTS).fetchone()
    if row is None or not row[0]:
        return None
    row = cur.execute(_READ_LAYOUT).fetchone()
    return None if row is None else row[0]


def _check_layout(cur: psycopg.Cursor, also: int = LAYOUT_VERSION) -> None:
    found = _layout(cur)
    if found is not None and found not in (LAYOUT_VERSION, also):
        raise UnsupportedLayout(found)


def install(conn: psycopg.Connection) -> None:
    """Create fencecheck's tables (``fencecheck_meta``, ``fencecheck_scopes``,
    ``fencecheck_objects``, ``fencecheck_keys``) if they do not exist.
    Idempotent; run it once per process before the first write. A layout-1
    database is upgraded in place to layout 2 (its states stay,
    ``fencecheck_keys`` is added; 0.1.0 writers then refuse it).

    One transaction holding ``pg_advisory_xact_lock(INSTALL_LOCK)``, so
    concurrent installs (from any host) queue; ``conn`` must not be inside a
    transaction. A database whose ``fencecheck_meta`` names another layout
    raises ``UnsupportedLayout`` and nothing is created: a writer of another
    layout would keep a separate fence. The layout is checked again after
    the schema ran, before the commit.
    """
    schema = _schema()
    _resource(KEYS_RESOURCE)  # fenced_write needs it: a package without it fails here, not at the first write
    _idle(conn, "install")
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (INSTALL_LOCK,))
        _check_layout(cur, UPGRADES_FROM)
        cur.execute(schema)  # no parameters: sent as one simple query, every statement
        _check_layout(cur)


def load_state(conn: psycopg.Connection, scope: str) -> bytes | None:
    """The stored state of ``scope`` (``None`` if it never accepted a token).
    Runs in the connection's current transaction, if any (psycopg opens one
    unless ``autocommit``)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(_READ_STATE, (scope,)).fetchone()
    return None if row is None else bytes(row[0])


def scope_keys(conn: psycopg.Connection, scope: str) -> list[GrantKey] | None:
    """The keys ``scope`` requires its tokens to be signed with: those of the
    longest configured prefix that starts it (keys.sql); ``None`` if no
    prefix does (the scope takes unsigned tokens). Runs in the connection's
    current transaction, if any; ``fenced_write`` reads it inside its own,
    after locking the scope's state row."""
    keys = []
    with psycopg.RawCursor(conn, row_factory=tuple_row) as cur:  # keys.sql's parameter is $1
        for key_id, secret in cur.execute(_resource(KEYS_RESOURCE), (_utf8("scope", scope),)):
            if type(key_id) is not int or not 0 <= key_id <= U32_MAX:
                raise UnreadableKeys(scope, f"key_id {key_id!r} is not a u32")
            keys.append(GrantKey(key_id, bytes(secret)))
    return keys or None


def _check_prefix(prefix: str) -> str:
    _utf8("scope_prefix", prefix)
    size = len(prefix.encode("utf-8"))
    if size > MAX_SCOPE_BYTES:
        raise ValueError(f"scope prefix of {size} bytes; a scope has at most {MAX_SCOPE_BYTES}")
    return prefix


def set_keys(conn: psycopg.Connection, scope_prefix: str, keys: Iterable[GrantKey]) -> None:
    """Require signed tokens on every scope that starts with ``scope_prefix``
    (``""``: every scope), verified with ``keys``, replacing the prefix's keys
    if it had any; the longest prefix that starts a scope decides.

    ``keys`` must be a usable set (``fc.key_problem``), else ``KeySetError``
    naming the problem; a prefix longer than a scope can be raises
    ``ValueError``; either way nothing changes. One transaction of its own
    (``conn`` must not be inside one) that first takes ``fencecheck_scopes``
    in EXCLUSIVE mode: it waits for fenced writes in flight, and every write
    that commits after it decides with the new keys. To rotate: set ``{old,
    new}``, move the authority to ``new``, then set ``{new}`` once no token
    signed by ``old`` can still be held."""
    _check_prefix(scope_prefix)
    keys = _keys(keys)
    problem = key_problem(keys)
    if problem is not None:
        raise KeySetError(problem)
    _idle(conn, "set_keys")
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_LOCK_WRITERS)
        cur.execute(_DELETE_KEYS, (scope_prefix,))
        cur.executemany(_INSERT_KEY, [(scope_prefix, k.key_id, k.secret) for k in keys])


def remove_keys(conn: psycopg.Connection, scope_prefix: str) -> bool:
    """Stop requiring signed tokens under ``scope_prefix``; returns whether it
    had keys. Ordered against fenced writes as ``set_keys``."""
    _utf8("scope_prefix", scope_prefix)
    _idle(conn, "remove_keys")
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(_LOCK_WRITERS)
        return cur.execute(_DELETE_KEYS, (scope_prefix,)).rowcount > 0


def key_prefixes(conn: psycopg.Connection) -> list[tuple[str, list[int]]]:
    """Every configured prefix with its key ids (never the secrets), by
    prefix. Runs in the connection's current transaction, if any."""
    out: list[tuple[str, list[int]]] = []
    with conn.cursor(row_factory=tuple_row) as cur:
        for prefix, key_id in cur.execute(_LIST_KEYS):
            if out and out[-1][0] == prefix:
                out[-1][1].append(key_id)
            else:
                out.append((prefix, [key_id]))
    return out


def _decide_and_store(cur: psycopg.Cursor, guest: Instance, request: Request) -> tuple[Decision, bytes | None]:
    """The decision, and the scope's state as this write leaves it (the new
    state if applied, the one read if not) when the scope has no signing
    keys: what a ``StateCache`` may keep (a keyed scope's decision depends
    on more than the state)."""
    # Two rounds at most: the second only after another writer created the
    # scope between this one's locking read (no row) and its insert.
    for _ in range(2):
        row = cur.execute(_LOCK_STATE, (request.scope,)).fetchone()
        stored = None if row is None else bytes(row[0])
        # After the row lock: a key change waits for this write (its EXCLUSIVE
        # lock conflicts with the row lock), and the next write reads its keys.
        keys = scope_keys(cur.connection, request.scope)
        decision = guest.check(stored, request) if keys is None else guest.check_signed(stored, request, keys)
        if not isinstance(decision, Applied):
            return decision, (stored if keys is None else None)
        current = decision.state if keys is None else None
        # Refused before anything is stored or the mutation runs, as in Rust.
        if decision.version > _I64_MAX:
            raise OverflowError(f"version {decision.version} does not fit a PostgreSQL bigint; nothing was stored")
        if stored is not None:
            cur.execute(_UPDATE_STATE, (decision.state, decision.version, request.scope))
            return decision, current
        cur.execute(_INSERT_STATE, (request.scope, decision.state, decision.version))
        if cur.rowcount == 1:
            return decision, current
    raise ScopeRowRace(request.scope)


def fenced_write(
    conn: psycopg.Connection,
    guest: Instance,
    request: Request,
    mutate: Callable[[psycopg.Connection, Applied], object],
) -> Decision:
    """Check ``request`` and, only if it is applied, store the new state and
    run ``mutate(conn, applied)``, all in one transaction. ``install`` must
    have run on the database.

    If the scope requires signed tokens (``set_keys``; read after the row
    lock) the decision is ``check_signed``'s with ``request.signature``, else
    ``check``'s (a signature is ignored).

    Returns the decision (``StaleFence`` and the others are values: nothing
    was changed). After rolling back, raises ``FenceError`` (bad request,
    damaged state, and on a keyed scope ``Unauthenticated`` or
    ``InvalidKeys``: definitive, never retryable), ``HostError`` (the guest
    could not run),
    ``SerializationConflict`` (retryable), ``OverflowError`` (a version
    beyond bigint), or re-raises whatever ``mutate`` or psycopg raised. If
    the connection fails during the commit, raises ``CommitUnknown``.

    ``mutate`` must do every write of the protected operation through
    ``conn`` and must not end the transaction (``TransactionEnded``);
    nested ``conn.transaction()`` blocks (savepoints) are fine. The
    connection must not be inside a transaction already: the fence check and
    the mutation need one of their own to be atomic together.

    Each call is reported once to the installed ``fencecheck.signals``
    (operation ``write``), after the transaction ended.
    """
    try:
        decision = _fenced_write(conn, guest, request, mutate)[0]
    except BaseException as e:
        _signals.record("write", getattr(request, "token", None), e)
        raise
    _signals.record("write", request.token, decision)
    return decision


def _fenced_write(
    conn: psycopg.Connection,
    guest: Instance,
    request: Request,
    mutate: Callable[[psycopg.Connection, Applied], object],
) -> tuple[Decision, bytes | None]:
    """``fenced_write``, also returning what ``_decide_and_store`` says a
    cache may keep."""
    _idle(conn, "fenced_write")
    committing = False
    current = None
    try:
        with conn.transaction():
            with conn.cursor(row_factory=tuple_row) as cur:
                decision, current = _decide_and_store(cur, guest, request)
            if not isinstance(decision, Applied):
                raise _Rejected(decision)
            mutate(conn, decision)
            if conn.info.transaction_status != TransactionStatus.INTRANS:
                raise TransactionEnded()
            committing = True  # leaving the block sends COMMIT
    except _Rejected as rejected:
        # Rolled back (a failed rollback only loses a lock): the decision stands.
        return rejected.decision, current
    except psycopg.Error as e:
        if e.sqlstate in _RETRYABLE:
            raise SerializationConflict("committing" if committing else "writing", e) from e
        # The server's answer to COMMIT (an ERROR) means it rolled back; no
        # answer at all, or the session ending, means it may have committed.
        if committing and not _rolled_back(e):
            raise CommitUnknown(e) from e
        raise
    return decision, current


def _rolled_back(e: psycopg.Error) -> bool:
    """Whether a failed commit (COMMIT, or an autocommit statement) surely
    rolled back: an ERROR the server sent. A FATAL may come after the commit
    (the session ended between the commit and the answer); no answer at all
    says nothing. As the Rust host's ``rolled_back``."""
    return e.sqlstate is not None and e.diag.severity_nonlocalized not in ("FATAL", "PANIC")


# -- one round trip -----------------------------------------------------------
#
# The same statement as the Rust host's `fenced_execute` (host/postgres/src/
# cached.rs, which explains it): the caller's statement, with the accepted
# version as `fencecheck_accepted` and, when the writer's cached state is
# current, the state's compare-and-set in front; a mismatch divides by zero
# and rolls the whole statement back. Placeholders in order of appearance:
# _ACCEPTED's version; _CAS's new state, version, scope, cached state, scope.

_ACCEPTED = "fencecheck_accepted AS (SELECT %s::int8 AS version)"
_CAS = (
    "fencecheck_cas AS (UPDATE fencecheck_scopes SET fence_state = %s::bytea, version = %s::int8 "
    "WHERE scope = %s::text AND fence_state = %s::bytea "
    "AND NOT EXISTS (SELECT 1 FROM fencecheck_keys WHERE starts_with(%s::text, scope_prefix)) "
    "RETURNING 1), "
    "fencecheck_guard AS (INSERT INTO fencecheck_scopes (scope, fence_state, version) "
    "SELECT NULL, NULL, NULL WHERE 1 / (SELECT count(*)::int4 FROM fencecheck_cas) = 0)"
)
_LEADING_WITH = re.compile(r"\s*with\s+(recursive\s+)?", re.IGNORECASE)
_MAX_CACHED_SCOPES = 4096


def _with_first(ours: str, sql: str) -> str:
    """``sql`` with the common table expressions ``ours`` in front: a leading
    ``WITH`` of the caller's own is extended rather than nested."""
    m = _LEADING_WITH.match(sql)
    if m is None:
        return f"WITH {ours} {sql.lstrip()}"
    recursive = "RECURSIVE " if m.group(1) else ""
    return f"WITH {recursive}{ours}, {sql[m.end():]}"


class StateCache:
    """What one writer knows: for each scope it wrote, the fence state its
    last write stored there (``fenced_execute``). One per writer; an out of
    date cache costs a round trip, never a wrong decision. The counters say
    how writes went: ``one_round_trip``, ``stale`` (the one statement rolled
    back: the cached state was no longer stored, or the statement failed on
    its own; the locking path decided), ``uncached`` (no cached state, or a
    rejection on it, which the locking path confirms)."""

    def __init__(self) -> None:
        self._states: dict[str, bytes] = {}
        self.one_round_trip = 0
        self.stale = 0
        self.uncached = 0

    def forget(self, scope: str) -> None:
        """Forget ``scope``'s state: its next write takes the locking path."""
        self._states.pop(scope, None)

    def _remember(self, scope: str, state: bytes) -> None:
        if len(self._states) >= _MAX_CACHED_SCOPES and scope not in self._states:
            self._states.pop(next(iter(self._states)))
        self._states[scope] = state


def fenced_execute(
    conn: psycopg.Connection,
    guest: Instance,
    cache: StateCache,
    request: Request,
    sql: str,
    params: Sequence[object] = (),
) -> Decision:
    """Run one statement under the fence: in one round trip when ``cache``
    holds the scope's current state (the normal case, one lease holder per
    scope), else as ``fenced_write`` does. Returns the decision, as
    ``fenced_write``: a rejection is always confirmed against the stored
    state, and nothing changes.

    ``sql`` is one ``INSERT``, ``UPDATE`` or ``DELETE`` with positional
    ``%s`` placeholders for ``params``; it may read the accepted version as
    ``(SELECT version FROM fencecheck_accepted)``, must not touch
    ``fencecheck_scopes``, and sees the database as it was before the
    fence's own write. It is one statement, its own transaction, also on a
    connection that is not in autocommit mode (one that sets
    ``isolation_level``, ``read_only`` or ``deferrable`` gets BEGIN with
    them, the statement and COMMIT). The connection must not be inside a
    transaction.

    Raises as ``fenced_write`` with ``sql`` as its mutation: only a success
    is answered from the one statement; a rejection on the cached state, or
    any failure that rolled the statement back, is decided again by the
    locking path (which raises the statement's own failure if it recurs). A
    lost connection during the one statement (or the session ending) is
    ``CommitUnknown``.

    Each call is reported once to the installed ``fencecheck.signals``
    (operation ``execute``), whichever path decided it.
    """
    try:
        decision = _fenced_execute(conn, guest, cache, request, sql, params)
    except BaseException as e:
        _signals.record("execute", getattr(request, "token", None), e)
        raise
    _signals.record("execute", request.token, decision)
    return decision


def _fenced_execute(
    conn: psycopg.Connection,
    guest: Instance,
    cache: StateCache,
    request: Request,
    sql: str,
    params: Sequence[object],
) -> Decision:
    _idle(conn, "fenced_execute")
    params = tuple(params)
    cached = cache._states.get(request.scope)
    decision = None if cached is None else guest.check(cached, request)
    if isinstance(decision, Applied) and decision.version <= _I64_MAX:
        ours = (decision.version, decision.state, decision.version, request.scope, cached, request.scope)
        try:
            _one_statement(conn, _with_first(f"{_ACCEPTED}, {_CAS}", sql), ours + params)
        except _Fallback:
            # Rolled back for certain. The guard (the stored state is not the
            # cached one) divides by zero, but the caller's statement runs
            # first and may fail first because the cache was stale: only the
            # locking path can tell, and it raises the statement's own
            # failure if that recurs.
            cache.stale += 1
        else:
            cache.one_round_trip += 1
            cache._remember(request.scope, decision.state)
            return decision
    else:
        cache.uncached += 1
    cache.forget(request.scope)
    locking = _with_first(_ACCEPTED, sql)

    def mutate(c: psycopg.Connection, applied: Applied) -> None:
        c.execute(locking, (applied.version, *params))

    decision, current = _fenced_write(conn, guest, request, mutate)
    if current is not None:
        cache._remember(request.scope, current)
    return decision


class _Fallback(Exception):
    """The one statement rolled back: take the locking path."""


def _one_statement(conn: psycopg.Connection, sql: str, params: tuple) -> None:
    # One statement is its own transaction. A connection that opens its own
    # (autocommit off) runs it in autocommit for the call, which only
    # changes what psycopg sends (no BEGIN, no COMMIT: one round trip;
    # psycopg's pipeline mode still waits for BEGIN); unless it asks for a
    # transaction of another kind, whose BEGIN must then be sent.
    plain = conn.isolation_level is None and conn.read_only is None and conn.deferrable is None
    try:
        if conn.autocommit:
            conn.execute(sql, params)
        elif plain:
            conn.autocommit = True
            try:
                conn.execute(sql, params)
            finally:
                conn.autocommit = False
        else:
            with conn.transaction():
                conn.execute(sql, params)
    except psycopg.Error as e:
        if _rolled_back(e):
            raise _Fallback() from e
        # No answer, or the session ended: the statement was its own
        # commit, which may have happened.
        raise CommitUnknown(e) from e
