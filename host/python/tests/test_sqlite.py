"""fenced_write on real SQLite files: the paused writer is fenced, and every
non-applied outcome or failure leaves the database unchanged."""

import sqlite3
import threading

import pytest

import fencecheck as fc
from fencecheck.sqlite import create_table, fenced_write, load_state

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
    create_table(conn)
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
    conn.execute("UPDATE fence_state SET state = ?", (bytes(damaged),))
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


def test_table_name_must_be_an_identifier(db, guest):
    """A table name that is not a plain identifier is refused (no SQL injection)."""
    with pytest.raises(ValueError):
        fenced_write(open_db(db), guest, fc.Request("s", fc.Token(0, 0, 1)), publish("v"), table="x; DROP")
