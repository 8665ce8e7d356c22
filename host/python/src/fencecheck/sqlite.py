"""A fenced write on the standard library's ``sqlite3``.

``fenced_write`` runs the whole pattern in one ``BEGIN IMMEDIATE``
transaction: read the scope's stored state, check, and only on ``Applied``
run your mutation and store the new state, then commit. Every other outcome,
every exception (including one raised by your mutation) rolls back: nothing
changes.

The state lives in its own table (``fence_state`` by default: ``scope`` TEXT
primary key, ``state`` BLOB), so any existing schema can be fenced without
changing its tables.

PostgreSQL (psycopg) is not provided yet: the project has no PostgreSQL
adapter so far. The same shape applies there: ``SELECT state ... FOR UPDATE``,
check, mutate and upsert the state, commit.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable

from ._guest import Instance
from ._types import Applied, Decision, Request

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _table(name: str) -> str:
    # Interpolated into SQL, so only a plain identifier is accepted.
    if not _IDENT.match(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


def create_table(conn: sqlite3.Connection, table: str = "fence_state") -> None:
    """Create the state table if it does not exist."""
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {_table(table)} (scope TEXT PRIMARY KEY, state BLOB NOT NULL)"
    )
    conn.commit()


def load_state(conn: sqlite3.Connection, scope: str, table: str = "fence_state") -> bytes | None:
    """The stored state of ``scope`` (``None`` if it never accepted a token)."""
    row = conn.execute(f"SELECT state FROM {_table(table)} WHERE scope = ?", (scope,)).fetchone()
    return None if row is None else bytes(row[0])


def fenced_write(
    conn: sqlite3.Connection,
    guest: Instance,
    request: Request,
    mutate: Callable[[sqlite3.Connection, Applied], object],
    *,
    table: str = "fence_state",
) -> Decision:
    """Check ``request`` and, only if it is applied, run ``mutate(conn, applied)``
    and store the new state, all in one transaction.

    Returns the decision (``StaleFence`` and the others are values: nothing
    was changed). Raises ``FenceError`` (bad request, damaged state) or
    ``HostError`` (the guest could not run) after rolling back, and re-raises
    whatever ``mutate`` or SQLite raises, also after rolling back.

    The connection must not be inside a transaction already: the fence check
    and the mutation need one of their own to be atomic together.
    """
    name = _table(table)
    if conn.in_transaction:
        raise sqlite3.ProgrammingError("fenced_write needs its own transaction; commit first")
    conn.execute("BEGIN IMMEDIATE")  # take the write lock before reading the state
    try:
        decision = guest.check(load_state(conn, request.scope, name), request)
        if isinstance(decision, Applied):
            mutate(conn, decision)
            conn.execute(
                f"INSERT INTO {name} (scope, state) VALUES (?, ?) "
                "ON CONFLICT (scope) DO UPDATE SET state = excluded.state",
                (request.scope, decision.state),
            )
            conn.commit()
        else:
            conn.rollback()
        return decision
    except BaseException:
        conn.rollback()
        raise
