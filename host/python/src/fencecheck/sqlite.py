"""Fenced writes on the standard library's ``sqlite3``, in the SQLite layout
every fencecheck host shares.

``install`` creates fencecheck's tables from ``host/sqlite/schema.sql``, the
text the Rust (``fencecheck_sqlite::install``) and Node hosts run too,
packaged with this module. So a Python, a Rust and a Node writer of one scope
on one database read and advance the same fence state in
``fencecheck_scopes``: one high-water mark, whatever the language.

``fenced_write`` runs the whole pattern in one ``BEGIN IMMEDIATE``
transaction: read the scope's stored state and its signing keys, check, and
only on ``Applied`` run your mutation and store the new state, then commit.
Every other outcome, every exception (including one raised by your mutation)
rolls back: nothing changes.

Signed tokens: ``set_keys(conn, prefix, keys)`` makes every scope that starts
with ``prefix`` require tokens signed by one of ``keys`` (the longest
configured prefix decides; ``fencecheck_keys``, read with the shared
``keys.sql``), so every host writing the database enforces the same keys.
``fenced_write`` reads them inside its write transaction and then decides
with ``check_signed`` (the request's ``signature``): a forged or unsigned
token raises ``fc.Unauthenticated`` and changes nothing.

Errors of this module are ``HostError`` subclasses (``fc.HostError``), not
retryable: ``UnsupportedLayout`` (the database is laid out for another
version), ``TransactionEnded`` (the mutation ended the transaction) and
``UnreadableKeys`` (a ``fencecheck_keys`` row that is no key).

PostgreSQL through psycopg 3: ``fencecheck.postgres``, the same shape in the
PostgreSQL layout the Rust ``fencecheck-postgres`` shares.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import sqlite3
from collections.abc import Callable, Iterable, Iterator

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
row), the same number as the Rust and Node hosts."""

UPGRADES_FROM = 1
"""The layout ``install`` upgrades in place (layout 2 only adds
``fencecheck_keys``)."""

_I64_MAX = 2**63 - 1

_META_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fencecheck_meta'"
# `quote` renders any stored value as SQL text (`2`, `'two'`), as in every host.
_READ_LAYOUT = (
    "SELECT typeof(value) = 'integer' AND value IN (?, ?), quote(value) FROM fencecheck_meta WHERE key = 'layout'"
)
_READ_STATE = "SELECT fence_state FROM fencecheck_scopes WHERE scope = ?"
# The state and whether any key prefix starts the scope, in one statement
# (always one row), as the Rust host's READ_STATE_KEYED: an unkeyed scope,
# the common case, costs no second statement.
_READ_STATE_KEYED = (
    "SELECT (SELECT fence_state FROM fencecheck_scopes WHERE scope = ?1), "
    "EXISTS (SELECT 1 FROM fencecheck_keys WHERE substr(?1, 1, length(scope_prefix)) = scope_prefix)"
)
# Only the fence columns: a scope's catalog pointer (visible_object,
# published_at_ms), written by the Rust host's publish, is left as it is.
_STORE_STATE = (
    "INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES (?, ?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET fence_state = excluded.fence_state, version = excluded.version"
)
_DELETE_KEYS = "DELETE FROM fencecheck_keys WHERE scope_prefix = ?"
_INSERT_KEY = "INSERT INTO fencecheck_keys (scope_prefix, key_id, secret) VALUES (?, ?, ?)"
_LIST_KEYS = "SELECT scope_prefix, key_id FROM fencecheck_keys ORDER BY scope_prefix, key_id"


class UnsupportedLayout(HostError):
    """``install`` found a database laid out for another version:
    ``fencecheck_meta``'s ``layout`` row is not ``LAYOUT_VERSION`` (``found``:
    the stored value as SQL text, e.g. ``"2"`` or ``"'1'"``) or is missing
    (``found is None``). Nothing was created or changed. Not retryable: use a
    fencecheck version that supports that layout."""

    retryable = False

    def __init__(self, found: str | None) -> None:
        self.found = found
        self.supported = LAYOUT_VERSION
        has = "no layout row in fencecheck_meta" if found is None else f"layout {found}"
        super().__init__(
            f"unsupported fencecheck layout: the database has {has}, "
            f"this version supports only layout {LAYOUT_VERSION} (and upgrades layout {UPGRADES_FROM}); "
            "nothing was installed"
        )


class UnreadableKeys(HostError):
    """A ``fencecheck_keys`` row that decides for ``scope`` is not a key (a
    ``key_id`` outside u32, a ``secret`` that is not a BLOB): the table was
    written around the layout's constraints. Nothing was decided or changed;
    not retryable. (The secret is never shown.)"""

    retryable = False

    def __init__(self, scope: str, detail: str) -> None:
        self.scope = scope
        super().__init__(f"fencecheck_keys holds a row that is not a key for scope {scope!r}: {detail}")


class TransactionEnded(HostError):
    """The mutation ended ``fenced_write``'s transaction itself (ran ``COMMIT``
    or ``ROLLBACK``, called ``conn.commit()``...), so the new fence state could
    no longer be stored with it, and was not stored. Whatever the mutation
    committed stays committed, unfenced: a bug in the mutation, never an
    outcome, and not retryable."""

    retryable = False

    def __init__(self) -> None:
        super().__init__("the fenced mutation ended the transaction itself; the fence state was not stored")


def _resource(name: str) -> str:
    try:
        return importlib.resources.files(__package__).joinpath(name).read_text("utf-8")
    except OSError as e:
        raise ComponentLoadError(
            f"the packaged {name} is missing ({e}); run scripts/build-component "
            "before `pip install ./host/python`"
        ) from None


@functools.cache
def _keys_sql() -> str:
    """The packaged keys.sql (host/sqlite/keys.sql): the one query for a
    scope's keys every host runs, one parameter, the scope."""
    return _resource("keys.sql")


@functools.cache
def _schema() -> tuple[str, ...]:
    """The statements of the packaged schema.sql, one by one (``executescript``
    would first commit the install transaction)."""
    text = _resource("schema.sql")
    statements, pending = [], ""
    for line in text.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending)
            pending = ""
    if any(line.strip() and not line.lstrip().startswith("--") for line in pending.splitlines()):
        raise ComponentLoadError("the packaged schema.sql ends in an incomplete statement")
    return tuple(statements)


def _check_layout(conn: sqlite3.Connection, also: int = LAYOUT_VERSION) -> None:
    """``LAYOUT_VERSION`` (or ``also``) in ``fencecheck_meta``, else ``UnsupportedLayout``."""
    row = conn.execute(_READ_LAYOUT, (LAYOUT_VERSION, also)).fetchone()
    if row is None:
        raise UnsupportedLayout(None)
    if not row[0]:
        raise UnsupportedLayout(row[1])


def install(conn: sqlite3.Connection) -> None:
    """Create fencecheck's tables (``fencecheck_meta``, ``fencecheck_scopes``,
    ``fencecheck_objects``, ``fencecheck_keys``) if they do not exist.
    Idempotent; run it once per process before the first write. A layout-1
    database (fencecheck 0.1.0) is upgraded in place to layout 2: its states
    stay, ``fencecheck_keys`` is added, and 0.1.0 writers then refuse it.

    Runs in one ``BEGIN IMMEDIATE`` transaction, so ``conn`` must not be inside
    a transaction. A database whose ``fencecheck_meta`` names another layout
    (or has no ``layout`` row) raises ``UnsupportedLayout`` and nothing is
    created: a writer of another layout would keep a separate fence.
    """
    statements = _schema()
    _keys_sql()  # fenced_write needs it: a package without it fails here, not at the first write
    if conn.in_transaction:
        raise sqlite3.ProgrammingError("install needs its own transaction; commit first")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute(_META_EXISTS).fetchone() is not None:
            _check_layout(conn, UPGRADES_FROM)
        for statement in statements:
            conn.execute(statement)
        _check_layout(conn)  # again: the packaged schema must be this version's layout
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def load_state(conn: sqlite3.Connection, scope: str) -> bytes | None:
    """The stored state of ``scope`` (``None`` if it never accepted a token)."""
    row = conn.execute(_READ_STATE, (scope,)).fetchone()
    return None if row is None else bytes(row[0])


def scope_keys(conn: sqlite3.Connection, scope: str) -> list[GrantKey] | None:
    """The keys ``scope`` requires its tokens to be signed with: those of the
    longest configured prefix that starts it (keys.sql); ``None`` if no
    prefix does (the scope takes unsigned tokens). Runs in the connection's
    current transaction, if any; ``fenced_write`` reads it inside its own."""
    keys = []
    for key_id, secret in conn.execute(_keys_sql(), (_utf8("scope", scope),)):
        if type(key_id) is not int or not 0 <= key_id <= U32_MAX:
            raise UnreadableKeys(scope, f"key_id {key_id!r} is not a u32")
        if not isinstance(secret, bytes):
            raise UnreadableKeys(scope, f"the secret of key {key_id} is a {type(secret).__name__}")
        keys.append(GrantKey(key_id, secret))
    return keys or None


def _check_prefix(prefix: str) -> str:
    _utf8("scope_prefix", prefix)
    size = len(prefix.encode("utf-8"))
    if size > MAX_SCOPE_BYTES:
        raise ValueError(f"scope prefix of {size} bytes; a scope has at most {MAX_SCOPE_BYTES}")
    return prefix


def set_keys(conn: sqlite3.Connection, scope_prefix: str, keys: Iterable[GrantKey]) -> None:
    """Require signed tokens on every scope that starts with ``scope_prefix``
    (``""``: every scope), verified with ``keys``, replacing the prefix's keys
    if it had any. The longest prefix that starts a scope decides, so a longer
    prefix can give a part of a namespace keys of its own.

    ``keys`` must be a usable set (``fc.key_problem``), else ``KeySetError``
    naming the problem (``no-keys``, ``short-secret``...); a prefix longer
    than a scope can be raises ``ValueError``; either way nothing changes.
    One ``BEGIN IMMEDIATE`` transaction (``conn`` must not be inside one):
    writes that begin after it commits require the new keys. To rotate: set
    ``{old, new}``, move the authority to ``new``, and once no token signed
    by ``old`` can still be held (the longest lease), set ``{new}``."""
    _check_prefix(scope_prefix)
    keys = _keys(keys)
    problem = key_problem(keys)
    if problem is not None:
        raise KeySetError(problem)
    with _immediate(conn, "set_keys"):
        conn.execute(_DELETE_KEYS, (scope_prefix,))
        conn.executemany(_INSERT_KEY, [(scope_prefix, k.key_id, k.secret) for k in keys])


def remove_keys(conn: sqlite3.Connection, scope_prefix: str) -> bool:
    """Stop requiring signed tokens under ``scope_prefix`` (the scopes it
    decided for fall to the next shorter prefix, or take unsigned tokens).
    Returns whether the prefix had keys. Its own ``BEGIN IMMEDIATE``
    transaction, as ``set_keys``."""
    _utf8("scope_prefix", scope_prefix)
    with _immediate(conn, "remove_keys"):
        return conn.execute(_DELETE_KEYS, (scope_prefix,)).rowcount > 0


def key_prefixes(conn: sqlite3.Connection) -> list[tuple[str, list[int]]]:
    """Every configured prefix with its key ids (never the secrets), by prefix."""
    out: list[tuple[str, list[int]]] = []
    for prefix, key_id in conn.execute(_LIST_KEYS):
        if out and out[-1][0] == prefix:
            out[-1][1].append(key_id)
        else:
            out.append((prefix, [key_id]))
    return out


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection, what: str) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction of our own: committed at the end
    of the block, rolled back on any exception."""
    if conn.in_transaction:
        raise sqlite3.ProgrammingError(f"{what} needs its own transaction; commit first")
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.commit()
    except BaseException:
        conn.rollback()
        raise


def fenced_write(
    conn: sqlite3.Connection,
    guest: Instance,
    request: Request,
    mutate: Callable[[sqlite3.Connection, Applied], object],
) -> Decision:
    """Check ``request`` and, only if it is applied, run ``mutate(conn, applied)``
    and store the new state, all in one transaction. ``install`` must have
    run on the database.

    If the scope requires signed tokens (``set_keys``; read inside the
    transaction, under the write lock, so a key change is ordered before or
    after this write, never in between) the decision is ``check_signed``'s,
    with ``request.signature``; else ``check``'s (a signature is ignored).

    Returns the decision (``StaleFence`` and the others are values: nothing
    was changed). Raises ``FenceError`` (bad request, damaged state, and on a
    keyed scope ``Unauthenticated`` or ``InvalidKeys``: definitive, never
    retryable) or ``HostError`` (the guest could not run) after rolling back,
    and re-raises whatever ``mutate`` or SQLite raises, also after rolling
    back. If ``mutate`` ends the transaction itself, raises
    ``TransactionEnded`` without storing the state.

    The connection must not be inside a transaction already: the fence check
    and the mutation need one of their own to be atomic together.

    Each call is reported once to the installed ``fencecheck.signals``
    (operation ``write``), after the transaction ended.
    """
    try:
        decision = _fenced_write(conn, guest, request, mutate)
    except BaseException as e:
        _signals.record("write", getattr(request, "token", None), e)
        raise
    _signals.record("write", request.token, decision)
    return decision


def _fenced_write(
    conn: sqlite3.Connection,
    guest: Instance,
    request: Request,
    mutate: Callable[[sqlite3.Connection, Applied], object],
) -> Decision:
    if conn.in_transaction:
        raise sqlite3.ProgrammingError("fenced_write needs its own transaction; commit first")
    conn.execute("BEGIN IMMEDIATE")  # take the write lock before reading the state
    try:
        # Both under the write lock: no key change or other write in between.
        state, keyed = conn.execute(_READ_STATE_KEYED, (request.scope,)).fetchone()
        stored = None if state is None else bytes(state)
        keys = scope_keys(conn, request.scope) if keyed else None
        decision = guest.check(stored, request) if keys is None else guest.check_signed(stored, request, keys)
        if not isinstance(decision, Applied):
            conn.rollback()
            return decision
        # Refused before the mutation runs, as in the Rust host.
        if decision.version > _I64_MAX:
            raise OverflowError(f"version {decision.version} does not fit a SQLite INTEGER; nothing was stored")
        # A savepoint marks our transaction: COMMIT or ROLLBACK inside the
        # mutation removes it, and RELEASE then fails, even when sqlite3 has
        # silently opened a new transaction for a later statement of the
        # mutation (checking ``in_transaction`` alone misses that case, and
        # the state would commit apart from the mutation's first writes).
        conn.execute("SAVEPOINT fencecheck_mutation")
        mutate(conn, decision)
        if not conn.in_transaction:
            raise TransactionEnded()
        try:
            conn.execute("RELEASE fencecheck_mutation")
        except sqlite3.OperationalError as e:
            raise TransactionEnded() from e
        conn.execute(_STORE_STATE, (request.scope, decision.state, decision.version))
        conn.commit()
        return decision
    except BaseException:
        conn.rollback()
        raise
