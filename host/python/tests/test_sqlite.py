"""install and fenced_write on real SQLite files: the shared layout, the paused
writer is fenced, and every non-applied outcome or failure leaves the database
unchanged."""

import sqlite3
import threading

import pytest

import fencecheck as fc
from fencecheck.sqlite import (
    LAYOUT_VERSION,
    TransactionEnded,
    UnsupportedLayout,
    fenced_write,
    install,
    load_state,
)

SCHEMA = "CREATE TABLE report_catalog (report_id TEXT PRIMARY KEY, visible_object TEXT NOT NULL)"


def open_db(path):
    conn = sqlite3.connect(path, timeout=5)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "catalog.sqlite"
    conn = open_db(path)
    conn.execute(SCHEMA)
    install(conn)
    conn.close()
    return path


def publish(object_key):
    def mutate(conn, applied):
        conn.execute(
            "INSERT INTO report_catalog VALUES ('report/july', ?) "
            "ON CONFLICT (report_id) DO UPDATE SET visible_object = excluded.visible_object",
            (object_key,),
        )

    return mutate


def visible(path):
    conn = open_db(path)
    try:
        row = conn.execute("SELECT visible_object FROM report_catalog").fetchone()
        return row and row[0]
    finally:
        conn.close()


def test_paused_writer_is_fenced(db, runtime):
    """A (token 41) pauses; B (token 42) publishes; A resumes and gets StaleFence."""
    a_staged, b_done = threading.Event(), threading.Event()
    results = {}

    def writer_a():
        conn, guest = open_db(db), runtime.instance()
        a_staged.set()
        assert b_done.wait(10), "writer B never finished"
        results["a"] = fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 41)), publish("A"))

    def writer_b():
        assert a_staged.wait(10), "writer A never staged"
        conn, guest = open_db(db), runtime.instance()
        results["b"] = fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 42)), publish("B"))
        b_done.set()

    threads = [threading.Thread(target=writer_a), threading.Thread(target=writer_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert isinstance(results["b"], fc.Applied)
    assert results["a"] == fc.StaleFence(fc.Token(0, 0, 41), fc.Token(0, 0, 42))
    assert visible(db) == "B"


def test_applied_stores_state_with_the_mutation(db, guest):
    """On Applied the mutation and the new state commit together."""
    conn = open_db(db)
    d = fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 1)), publish("v1"))
    assert isinstance(d, fc.Applied)
    assert load_state(conn, "report/july") == d.state
    assert visible(db) == "v1"


def test_failing_mutation_rolls_back_everything(db, guest):
    """An exception in the mutation leaves neither the mutation nor the state."""
    conn = open_db(db)

    def broken(c, applied):
        publish("half")(c, applied)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 1)), broken)
    assert load_state(conn, "report/july") is None and visible(db) is None
    assert not conn.in_transaction


def test_corrupt_state_raises_and_changes_nothing(db, guest):
    """A damaged stored state raises CorruptState; the row keeps its bytes."""
    conn = open_db(db)
    fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 1)), publish("v1"))
    damaged = bytearray(load_state(conn, "report/july"))
    damaged[-1] ^= 0x80
    conn.execute("UPDATE fencecheck_scopes SET fence_state = ?", (bytes(damaged),))
    conn.commit()
    with pytest.raises(fc.CorruptState):
        fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 2)), publish("v2"))
    assert load_state(conn, "report/july") == bytes(damaged) and visible(db) == "v1"


def test_refuses_to_join_an_open_transaction(db, guest):
    """fenced_write will not run inside a transaction it does not own."""
    conn = open_db(db)
    conn.execute("INSERT INTO report_catalog VALUES ('other', 'x')")
    assert conn.in_transaction
    with pytest.raises(sqlite3.ProgrammingError):
        fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 1)), publish("v"))


def schema(path):
    conn = open_db(path)
    try:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    finally:
        conn.close()


def test_install_is_idempotent_and_records_the_layout(db):
    """A second install changes nothing; the file says LAYOUT_VERSION."""
    before = schema(db)
    conn = open_db(db)
    install(conn)
    assert schema(db) == before
    assert conn.execute("SELECT value FROM fencecheck_meta WHERE key = 'layout'").fetchone() == (LAYOUT_VERSION,)
    tables = {"fencecheck_meta", "fencecheck_scopes", "fencecheck_objects", "fencecheck_keys"}
    assert tables <= {name for _, name, _ in before}
    assert not conn.in_transaction


@pytest.mark.parametrize(
    "value, found", [("3", "3"), ("0", "0"), ("'1'", "'1'"), ("'2'", "'2'"), ("1.5", "1.5"), (None, None)]
)
def test_other_layouts_are_refused_and_nothing_is_created(tmp_path, value, found):
    """Another layout number (3, a future one; 0), a non-integer or no layout
    row: UnsupportedLayout, nothing created (1 is upgraded, 2 is this one)."""
    path = tmp_path / "other.sqlite"
    conn = open_db(path)
    # No column affinity, so the text and real values stay what they are.
    conn.execute("CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value) WITHOUT ROWID")
    if value is not None:
        conn.execute(f"INSERT INTO fencecheck_meta VALUES ('layout', {value})")
    conn.commit()
    before = schema(path)
    with pytest.raises(UnsupportedLayout) as e:
        install(conn)
    assert e.value.found == found and e.value.supported == LAYOUT_VERSION
    assert isinstance(e.value, fc.HostError) and not e.value.retryable
    assert ("no layout row" if found is None else f"layout {found}") in str(e.value)
    assert f"layout {LAYOUT_VERSION}" in str(e.value)
    assert schema(path) == before and not conn.in_transaction


def test_layout_1_is_upgraded_in_place(tmp_path, guest):
    """A layout-1 database (fencecheck 0.1.0's schema.sql: no fencecheck_keys)
    is upgraded to 2 in place: its states and versions stay, the keys table
    is added (empty), and the stored fence goes on deciding."""
    path = tmp_path / "layout1.sqlite"
    conn = open_db(path)
    conn.executescript(
        "CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;"
        "INSERT INTO fencecheck_meta VALUES ('layout', 1);"
        "CREATE TABLE fencecheck_scopes (scope TEXT NOT NULL PRIMARY KEY, fence_state BLOB NOT NULL,"
        " version INTEGER NOT NULL, visible_object INTEGER, published_at_ms INTEGER) WITHOUT ROWID;"
    )
    state = guest.check(None, fc.Request("report/july", fc.Token(0, 0, 42))).state
    conn.execute("INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES ('report/july', ?, 1)", (state,))
    conn.commit()
    install(conn)
    assert conn.execute("SELECT value FROM fencecheck_meta").fetchall() == [(2,)]
    assert conn.execute("SELECT fence_state, version FROM fencecheck_scopes").fetchall() == [(state, 1)]
    assert conn.execute("SELECT count(*) FROM fencecheck_keys").fetchone() == (0,)
    stale = fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 41)), lambda c, a: None)
    assert stale == fc.StaleFence(fc.Token(0, 0, 41), fc.Token(0, 0, 42))
    install(conn)  # and again: layout 2 now, nothing changes
    assert conn.execute("SELECT value FROM fencecheck_meta").fetchall() == [(2,)]


def test_version_is_stored_and_the_catalog_pointer_kept(db, guest):
    """The row's version is the applied version; a publish's pointer columns are left alone."""
    conn = open_db(db)
    fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 1)), publish("v1"))
    conn.execute("UPDATE fencecheck_scopes SET visible_object = 7, published_at_ms = 1000")
    conn.commit()
    d = fenced_write(conn, guest, fc.Request("report/july", fc.Token(0, 0, 2)), publish("v2"))
    row = conn.execute("SELECT version, visible_object, published_at_ms FROM fencecheck_scopes").fetchall()
    assert d.version == 2 and row == [(2, 7, 1000)]


def test_mutation_ending_the_transaction_stores_no_state(db, guest):
    """A mutation that runs COMMIT raises TransactionEnded and the fence state is not stored."""
    conn = open_db(db)

    def commits(c, applied):
        publish("early")(c, applied)
        c.execute("COMMIT")

    request = fc.Request("report/july", fc.Token(0, 0, 1))
    with pytest.raises(TransactionEnded):
        fenced_write(conn, guest, request, commits)
    assert load_state(conn, "report/july") is None and not conn.in_transaction
    # The mark did not move: the same token is still applied, not stale.
    assert isinstance(fenced_write(conn, guest, request, publish("v1")), fc.Applied)


def test_a_mutation_that_commits_and_writes_again_is_caught(db, guest):
    """COMMIT then another write (sqlite3 silently opens a new transaction for
    it) is still TransactionEnded, and the fence state is not stored."""
    conn = open_db(db)

    def commits_then_writes(c, applied):
        publish("early")(c, applied)
        c.execute("COMMIT")
        c.execute("UPDATE report_catalog SET visible_object = 'late'")

    request = fc.Request("report/july", fc.Token(0, 0, 1))
    with pytest.raises(TransactionEnded):
        fenced_write(conn, guest, request, commits_then_writes)
    assert load_state(conn, "report/july") is None and not conn.in_transaction
    assert isinstance(fenced_write(conn, guest, request, publish("v1")), fc.Applied)


class _FarGuest:
    """A checker whose next version no longer fits a SQLite INTEGER."""

    def check(self, state, request):
        return fc.Applied(2**63, request.token, b"state")


def test_a_version_beyond_sqlite_integer_fails_before_the_mutation(db):
    """Version 2**63 is refused before the mutation runs; nothing is stored."""
    conn = open_db(db)
    ran = []
    with pytest.raises(OverflowError, match="SQLite INTEGER"):
        fenced_write(conn, _FarGuest(), fc.Request("report/july", fc.Token(0, 0, 1)), lambda c, a: ran.append(a))
    assert ran == [] and load_state(conn, "report/july") is None and not conn.in_transaction
