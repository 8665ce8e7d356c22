"""Fenced writes on the standard library's ``sqlite3``, in the SQLite layout
every fencecheck host shares.

``install`` creates fencecheck's tables from ``host/sqlite/schema.sql``, the
text the Rust (``fencecheck_sqlite::install``) and Node hosts run too,
packaged with this module. So a Python, a Rust and a Node writer of one scope
on one database read and advance the same fence state in
``fencecheck_scopes``: one high-water mark, whatever the language.

``fenced_write`` runs the whole pattern in one ``BEGIN IMMEDIATE``
transaction: read the scope's stored state, check, and only on ``Applied``
run your mutation and store the new state, then commit. Every other outcome,
every exception (including one raised by your mutation) rolls back: nothing
changes.

Errors of this module are ``HostError`` subclasses (``fc.HostError``), not
retryable: ``UnsupportedLayout`` (the database is laid out for another
version) and ``TransactionEnded`` (the mutation ended the transaction).

PostgreSQL through psycopg 3: ``fencecheck.postgres``, the same shape in the
PostgreSQL layout the Rust ``fencecheck-postgres`` shares.
"""

from __future__ import annotations

import functools
import importlib.resources
import sqlite3
from collections.abc import Callable

from ._guest import Instance
from ._types import Applied, ComponentLoadError, Decision, HostError, Request

LAYOUT_VERSION = 1
"""The layout this module reads and writes (``fencecheck_meta``'s ``layout``
row), the same number as the Rust and Node hosts."""

_I64_MAX = 2**63 - 1

_META_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fencecheck_meta'"
# `quote` renders any stored value as SQL text (`2`, `'two'`), as in every host.
_READ_LAYOUT = (
    "SELECT typeof(value) = 'integer' AND value = ?, quote(value) FROM fencecheck_meta WHERE key = 'layout'"
)
_READ_STATE = "SELECT fence_state FROM fencecheck_scopes WHERE scope = ?"
# Only the fence columns: a scope's catalog pointer (visible_object,
# published_at_ms), written by the Rust host's publish, is left as it is.
_STORE_STATE = (
    "INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES (?, ?, ?) "
    "ON CONFLICT (scope) DO UPDATE SET fence_state = excluded.fence_state, version = excluded.version"
)


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
            f"this version supports only layout {LAYOUT_VERSION}; nothing was installed"
        )


class TransactionEnded(HostError):
    """The mutation ended ``fenced_write``'s transaction itself (ran ``COMMIT``
    or ``ROLLBACK``, called ``conn.commit()``...), so the new fence state could
    no longer be stored with it, and was not stored. Whatever the mutation
    committed stays committed, unfenced: a bug in the mutation, never an
    outcome, and not retryable."""

    retryable = False

    def __init__(self) -> None:
        super().__init__("the fenced mutation ended the transaction itself; the fence state was not stored")


@functools.cache
def _schema() -> tuple[str, ...]:
    """The statements of the packaged schema.sql, one by one (``executescript``
    would first commit the install transaction)."""
    try:
        text = importlib.resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
    except OSError as e:
        raise ComponentLoadError(
            f"the packaged schema.sql is missing ({e}); run scripts/build-component "
            "before `pip install ./host/python`"
        ) from None
    statements, pending = [], ""
    for line in text.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending)
            pending = ""
    if any(line.strip() and not line.lstrip().startswith("--") for line in pending.splitlines()):
        raise ComponentLoadError("the packaged schema.sql ends in an incomplete statement")
    return tuple(statements)


def _check_layout(conn: sqlite3.Connection) -> None:
    row = conn.execute(_READ_LAYOUT, (LAYOUT_VERSION,)).fetchone()
    if row is None:
        raise UnsupportedLayout(None)
    if not row[0]:
        raise UnsupportedLayout(row[1])


def install(conn: sqlite3.Connection) -> None:
    """Create fencecheck's tables (``fencecheck_meta``, ``fencecheck_scopes``,
    ``fencecheck_objects``) if they do not exist. Idempotent; run it once per
    process before the first write.

    Runs in one ``BEGIN IMMEDIATE`` transaction, so ``conn`` must not be inside
    a transaction. A database whose ``fencecheck_meta`` names another layout
    (or has no ``layout`` row) raises ``UnsupportedLayout`` and nothing is
    created: a writer of another layout would keep a separate fence.
    """
    statements = _schema()
    if conn.in_transaction:
        raise sqlite3.ProgrammingError("install needs its own transaction; commit first")
    conn.execute("BEGIN IMMEDIATE")
    try:
        if conn.execute(_META_EXISTS).fetchone() is not None:
            _check_layout(conn)
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


def fenced_write(
    conn: sqlite3.Connection,
    guest: Instance,
    request: Request,
    mutate: Callable[[sqlite3.Connection, Applied], object],
) -> Decision:
    """Check ``request`` and, only if it is applied, run ``mutate(conn, applied)``
    and store the new state, all in one transaction. ``install`` must have
    run on the database.

    Returns the decision (``StaleFence`` and the others are values: nothing
    was changed). Raises ``FenceError`` (bad request, damaged state) or
    ``HostError`` (the guest could not run) after rolling back, and re-raises
    whatever ``mutate`` or SQLite raises, also after rolling back. If
    ``mutate`` ends the transaction itself, raises ``TransactionEnded`` without
    storing the state.

    The connection must not be inside a transaction already: the fence check
    and the mutation need one of their own to be atomic together.
    """
    if conn.in_transaction:
        raise sqlite3.ProgrammingError("fenced_write needs its own transaction; commit first")
    conn.execute("BEGIN IMMEDIATE")  # take the write lock before reading the state
    try:
        decision = guest.check(load_state(conn, request.scope), request)
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
