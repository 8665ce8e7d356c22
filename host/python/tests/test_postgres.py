"""install and fenced_write on a real PostgreSQL server (initdb + pg_ctl in a
temporary directory, as the Rust harness tests/support/pgserver.rs): the
shared layout, races between writers, retryable conflicts, a commit whose
outcome is unknown, and a Rust writer and a Python writer sharing one fence.

The server's binaries come from ``$PG_BINDIR``, else ``pg_config --bindir``
(``$PG_CONFIG``, default Debian's PostgreSQL 15). The cross-host test runs
the Rust ``fencecheck-postgres-worker`` named by ``$FENCECHECK_PG_WORKER``
(scripts/test.d/40-python.sh builds it and sets it)."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import prometheus_client
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import fencecheck as fc
from fencecheck import signals
from fencecheck.postgres import (
    LAYOUT_VERSION,
    CommitUnknown,
    SerializationConflict,
    StateCache,
    TransactionEnded,
    UnsupportedLayout,
    fenced_execute,
    fenced_write,
    install,
    key_prefixes,
    load_state,
    remove_keys,
    scope_keys,
    set_keys,
)
from metric_table import Series, check, decisions, table

SCOPE = "report/july"
CATALOG = "CREATE TABLE report_catalog (report_id text PRIMARY KEY, visible_object text NOT NULL)"


def tok(counter: int) -> fc.Token:
    return fc.Token(0, 0, counter)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindir() -> Path:
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    pg_config = os.environ.get("PG_CONFIG", "/usr/lib/postgresql/15/bin/pg_config")
    out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


class PgServer:
    """One throwaway cluster on a free loopback port, its socket in its own
    directory. initdb refuses root: then the server runs as ``postgres``
    (else ``nobody``) through ``runuser``."""

    def __init__(self) -> None:
        self.bin = _bindir()
        self.run_as = None
        if os.geteuid() == 0:
            known = subprocess.run(["id", "postgres"], capture_output=True).returncode == 0
            self.run_as = "postgres" if known else "nobody"
        self.root = Path(tempfile.mkdtemp(prefix="fencecheck-pg-"))
        self.port = _free_port()
        try:
            if self.run_as:
                shutil.chown(self.root, self.run_as)
            self._run("initdb", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "-D", str(self.data))
            self.start()
        except BaseException:
            self.close()
            raise

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if self.run_as:
            command = ["runuser", "-u", self.run_as, "--", *command]
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"{command} failed: {out.stdout}{out.stderr}\n--- server log ---\n{log}")

    def start(self) -> None:
        # fsync off: the tests kill backends, never the machine's power.
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=100"
        )
        self._run("pg_ctl", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", options, "start")

    def close(self) -> None:
        try:
            self._run("pg_ctl", "-w", "-D", str(self.data), "-m", "immediate", "stop")
        except (RuntimeError, OSError):
            pass  # never started, or already gone
        shutil.rmtree(self.root, ignore_errors=True)

    def conninfo(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname} connect_timeout=10"


@pytest.fixture(scope="module")
def server():
    s = PgServer()
    yield s
    s.close()


_names = itertools.count()


class Db:
    """A fresh database on the shared server, with ``install`` run and a
    ``report_catalog`` table; closes every connection it opened."""

    def __init__(self, server: PgServer) -> None:
        self.server = server
        self.name = f"t{os.getpid()}_{next(_names)}"
        with psycopg.connect(server.conninfo(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {self.name}")
        self.conns: list[psycopg.Connection] = []

    @property
    def conninfo(self) -> str:
        return self.server.conninfo(self.name)

    def connect(self, **kwargs) -> psycopg.Connection:
        conn = psycopg.connect(self.conninfo, **kwargs)
        self.conns.append(conn)
        return conn

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            return conn.execute(sql, params).fetchall()

    def execute(self, sql: str) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(sql)

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


@pytest.fixture()
def bare(server):
    """A fresh database where nothing is installed."""
    db = Db(server)
    yield db
    db.close()


@pytest.fixture()
def db(bare):
    """A fresh database with fencecheck's layout and a report_catalog."""
    with bare.connect() as conn:
        install(conn)
        conn.execute(CATALOG)
        conn.commit()
    return bare


def publish(object_key: str, ran: list | None = None):
    def mutate(conn: psycopg.Connection, applied: fc.Applied) -> None:
        if ran is not None:
            ran.append(applied)
        conn.execute(
            "INSERT INTO report_catalog VALUES (%s, %s) "
            "ON CONFLICT (report_id) DO UPDATE SET visible_object = excluded.visible_object",
            (SCOPE, object_key),
        )

    return mutate


def visible(db: Db) -> str | None:
    rows = db.query("SELECT visible_object FROM report_catalog")
    return rows[0][0] if rows else None


def scope_row(db: Db) -> list[tuple]:
    return db.query("SELECT scope, version FROM fencecheck_scopes ORDER BY scope")


def wait_for_lock_waiter(db: Db, statement: str) -> None:
    """Until a backend running ``statement...`` waits on a lock (a second
    writer queued behind the first)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        waiting = db.query(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            (statement + "%",),
        )[0][0]
        if waiting:
            return
        time.sleep(0.01)
    raise AssertionError(f"no backend ever waited on a lock in {statement!r}: the race was not set up")


def test_newer_token_applies_and_older_is_stale(db, guest):
    """0.42 applies (state and mutation commit together); 0.41 is StaleFence,
    its mutation never runs and nothing changes."""
    conn = db.connect()
    applied = fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), publish("b9"))
    assert isinstance(applied, fc.Applied) and applied.version == 1
    ran: list = []
    stale = fenced_write(conn, guest, fc.Request(SCOPE, tok(41)), publish("a7", ran))
    assert stale == fc.StaleFence(tok(41), tok(42))
    assert ran == [] and visible(db) == "b9"
    assert scope_row(db) == [(SCOPE, 1)]
    assert load_state(conn, SCOPE) == applied.state
    conn.rollback()
    newer = fenced_write(conn, guest, fc.Request(SCOPE, tok(43)), publish("c1"))
    assert isinstance(newer, fc.Applied) and newer.version == 2 and visible(db) == "c1"


def test_failing_mutation_stores_nothing(db, guest):
    """An exception in the mutation rolls back the mutation and the state."""
    conn = db.connect()

    def broken(c, applied):
        publish("half")(c, applied)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), broken)
    assert scope_row(db) == [] and visible(db) is None
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # The mark did not move: the same token is applied, not stale.
    assert isinstance(fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), publish("b9")), fc.Applied)


def test_works_on_an_autocommit_connection(db, guest):
    """autocommit=True: fenced_write still runs one transaction of its own."""
    conn = db.connect(autocommit=True)

    def broken(c, applied):
        publish("half")(c, applied)
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), broken)
    assert scope_row(db) == [] and visible(db) is None
    assert isinstance(fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), publish("b9")), fc.Applied)
    assert scope_row(db) == [(SCOPE, 1)] and visible(db) == "b9"


def test_refuses_to_join_an_open_transaction(db, guest):
    conn = db.connect()
    conn.execute("SELECT 1")  # psycopg opened a transaction
    with pytest.raises(psycopg.ProgrammingError, match="own transaction"):
        fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), publish("b9"))
    with pytest.raises(psycopg.ProgrammingError, match="own transaction"):
        install(conn)


def test_mutation_ending_the_transaction_is_caught(db, guest):
    """A mutation that runs COMMIT raises TransactionEnded; psycopg itself
    refuses conn.commit() inside the transaction (nothing stored then)."""
    conn = db.connect()

    def commits(c, applied):
        publish("early")(c, applied)
        c.execute("COMMIT")

    with pytest.raises(TransactionEnded):
        fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), commits)
    # The state was stored before the mutation, so it committed with it.
    assert scope_row(db) == [(SCOPE, 1)] and visible(db) == "early"

    def commits_by_api(c, applied):
        c.commit()

    with pytest.raises(psycopg.ProgrammingError):
        fenced_write(conn, guest, fc.Request(SCOPE, tok(43)), commits_by_api)
    assert scope_row(db) == [(SCOPE, 1)]


def test_version_and_catalog_pointer(db, guest):
    """The row's version is the applied version; the publish pointer columns
    are left alone."""
    conn = db.connect()
    fenced_write(conn, guest, fc.Request(SCOPE, tok(1)), publish("v1"))
    db.execute("UPDATE fencecheck_scopes SET visible_object = 7, published_at_ms = 1000")
    d = fenced_write(conn, guest, fc.Request(SCOPE, tok(2)), publish("v2"))
    assert d.version == 2
    assert db.query("SELECT version, visible_object, published_at_ms FROM fencecheck_scopes") == [(2, 7, 1000)]


class _FarGuest:
    """A checker whose next version no longer fits a bigint."""

    def check(self, state, request):
        return fc.Applied(2**63, request.token, b"state")


def test_a_version_beyond_bigint_fails_before_the_mutation(db):
    conn = db.connect()
    ran: list = []
    with pytest.raises(OverflowError, match="bigint"):
        fenced_write(conn, _FarGuest(), fc.Request(SCOPE, tok(1)), publish("v", ran))
    assert ran == [] and scope_row(db) == []


def _tables(db: Db) -> list[tuple]:
    return db.query(
        "SELECT relname, relkind FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY relname"
    )


def test_install_is_idempotent_and_records_the_layout(db):
    """A second install changes nothing; the database says LAYOUT_VERSION."""
    before = _tables(db)
    conn = db.connect()
    install(conn)
    install(conn)
    assert _tables(db) == before
    tables = {"fencecheck_meta", "fencecheck_scopes", "fencecheck_objects", "fencecheck_keys"}
    assert tables <= {name for name, _ in before}
    assert db.query("SELECT value FROM fencecheck_meta WHERE key = 'layout'") == [(LAYOUT_VERSION,)]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_another_layout_is_refused_and_nothing_is_created(bare):
    """fencecheck_meta saying layout 7: UnsupportedLayout, nothing created."""
    bare.execute(
        "CREATE TABLE fencecheck_meta (key text PRIMARY KEY, value bigint NOT NULL); "
        "INSERT INTO fencecheck_meta VALUES ('layout', 7)"
    )
    before = _tables(bare)
    conn = bare.connect()
    with pytest.raises(UnsupportedLayout) as e:
        install(conn)
    assert e.value.found == 7 and e.value.supported == LAYOUT_VERSION
    assert isinstance(e.value, fc.HostError) and not e.value.retryable
    assert "layout 7" in str(e.value) and f"layout {LAYOUT_VERSION}" in str(e.value)
    assert _tables(bare) == before
    assert bare.query("SELECT to_regclass('fencecheck_scopes')") == [(None,)]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_an_installed_layout_changed_later_is_refused(db):
    """A database that says layout 3 (a later version's) is refused; 0 too."""
    for value in (3, 0):
        db.execute(f"UPDATE fencecheck_meta SET value = {value} WHERE key = 'layout'")
        with pytest.raises(UnsupportedLayout) as e:
            install(db.connect())
        assert e.value.found == value
        assert db.query("SELECT value FROM fencecheck_meta WHERE key = 'layout'") == [(value,)]


def test_layout_1_is_upgraded_in_place(bare, guest):
    """A layout-1 database (fencecheck 0.1.0: no fencecheck_keys) is upgraded
    to 2: its states and versions stay, the keys table is added, and the
    stored fence goes on deciding."""
    bare.execute(
        "CREATE TABLE fencecheck_meta (key text NOT NULL PRIMARY KEY, value bigint NOT NULL);"
        "INSERT INTO fencecheck_meta VALUES ('layout', 1);"
        "CREATE TABLE fencecheck_scopes (scope text NOT NULL PRIMARY KEY, fence_state bytea NOT NULL,"
        " version bigint NOT NULL, visible_object bigint, published_at_ms bigint)"
    )
    state = guest.check(None, fc.Request(SCOPE, tok(42))).state
    with bare.connect(autocommit=True) as c:
        c.execute("INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES (%s, %s, 1)", (SCOPE, state))
    conn = bare.connect()
    install(conn)
    assert bare.query("SELECT value FROM fencecheck_meta") == [(2,)]
    assert bare.query("SELECT fence_state, version FROM fencecheck_scopes") == [(state, 1)]
    assert bare.query("SELECT count(*) FROM fencecheck_keys") == [(0,)]
    assert fenced_write(conn, guest, fc.Request(SCOPE, tok(41)), lambda c, a: None) == fc.StaleFence(tok(41), tok(42))


def _in_thread(results: dict, key: str, fn) -> threading.Thread:
    def run():
        try:
            results[key] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            results[key] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("second, expected", [(42, "stale"), (41, "stale"), (43, "applied")])
def test_two_writers_creating_one_scope(db, runtime, second, expected):
    """READ COMMITTED, new scope: the first writer holds inside its mutation
    (its row inserted, not committed); the second sees no row, and its insert
    waits on the first (pg_stat_activity: a Lock wait); after the first
    commits, the second inserts nothing and is decided against the first's
    state, never as a second "first write"."""
    inside, release = threading.Event(), threading.Event()
    results: dict = {}

    def hold(c, applied):
        inside.set()
        assert release.wait(20), "never released"

    def first():
        return fenced_write(db.connect(), runtime.instance(), fc.Request(SCOPE, tok(42)), hold)

    ran: list = []

    def second_writer():
        return fenced_write(db.connect(), runtime.instance(), fc.Request(SCOPE, tok(second)), publish("b", ran))

    a = _in_thread(results, "first", first)
    assert inside.wait(20), "the first writer never reached its mutation"
    b = _in_thread(results, "second", second_writer)
    try:
        wait_for_lock_waiter(db, "INSERT INTO fencecheck_scopes")
    finally:
        release.set()
        a.join(20)
        b.join(20)
    first_d, second_d = results["first"], results["second"]
    assert isinstance(first_d, fc.Applied) and first_d.version == 1, first_d
    if expected == "stale":
        assert second_d == fc.StaleFence(tok(second), tok(42)), second_d
        assert ran == [] and scope_row(db) == [(SCOPE, 1)]
    else:
        assert isinstance(second_d, fc.Applied) and second_d.version == 2, second_d
        assert [a.version for a in ran] == [2] and scope_row(db) == [(SCOPE, 2)]


def test_serializable_conflict_is_retryable_not_stale(db, runtime):
    """Two SERIALIZABLE writers of one existing scope; the second's snapshot
    predates the first's commit: SerializationConflict (retryable, 40001),
    never a fencing outcome; the retry is decided against the first's state."""
    assert isinstance(
        fenced_write(db.connect(), runtime.instance(), fc.Request(SCOPE, tok(40)), publish("a")), fc.Applied
    )
    inside, release = threading.Event(), threading.Event()
    results: dict = {}

    def hold(c, applied):
        inside.set()
        assert release.wait(20), "never released"

    def serializable():
        conn = db.connect()
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        return conn

    second_conn = serializable()
    second_guest = runtime.instance()
    a = _in_thread(results, "first", lambda: fenced_write(serializable(), runtime.instance(),
                                                          fc.Request(SCOPE, tok(41)), hold))
    assert inside.wait(20)
    b = _in_thread(results, "second", lambda: fenced_write(second_conn, second_guest,
                                                           fc.Request(SCOPE, tok(42)), publish("b")))
    try:
        wait_for_lock_waiter(db, "SELECT fence_state FROM fencecheck_scopes")
    finally:
        release.set()
        a.join(20)
        b.join(20)
    assert isinstance(results["first"], fc.Applied) and results["first"].version == 2
    error = results["second"]
    assert isinstance(error, SerializationConflict), error
    assert error.retryable and error.sqlstate == "40001" and isinstance(error, fc.HostError)
    assert isinstance(error.__cause__, psycopg.errors.SerializationFailure)
    assert second_conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    retried = fenced_write(second_conn, second_guest, fc.Request(SCOPE, tok(42)), publish("b"))
    assert isinstance(retried, fc.Applied) and retried.version == 3 and visible(db) == "b"
    # And a stale token under SERIALIZABLE is a value, not an error.
    assert fenced_write(second_conn, second_guest, fc.Request(SCOPE, tok(41)), publish("x")) == fc.StaleFence(
        tok(41), tok(42)
    )


def test_connection_lost_during_commit_is_commit_unknown(guest):
    """The backend dies while COMMIT is in flight (a deferred trigger holds the
    commit; the test kills the backend process): CommitUnknown, not a
    retryable error. Its own server: a killed backend restarts the cluster."""
    server = PgServer()
    try:
        with psycopg.connect(server.conninfo(), autocommit=True) as setup:
            install(setup)
            setup.execute(CATALOG)
            setup.execute(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$"
            )
            setup.execute(
                "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON report_catalog "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
            )
        conn = psycopg.connect(server.conninfo())
        pid = conn.info.backend_pid
        results: dict = {}
        t = _in_thread(results, "write", lambda: fenced_write(conn, guest, fc.Request(SCOPE, tok(42)), publish("b9")))
        with psycopg.connect(server.conninfo(), autocommit=True) as watch:
            deadline = time.monotonic() + 20
            while not watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND query = 'COMMIT' AND state = 'active'",
                (pid,),
            ).fetchone()[0]:
                assert time.monotonic() < deadline, "the commit never started"
                time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)  # no goodbye from the server: the client cannot know
        t.join(20)
        conn.close()
        error = results["write"]
        assert isinstance(error, CommitUnknown), error
        assert not error.retryable and not isinstance(error, SerializationConflict)
    finally:
        server.close()


def _worker(db: Db, token: str) -> str:
    worker = os.environ.get("FENCECHECK_PG_WORKER")
    if not worker:
        pytest.skip("FENCECHECK_PG_WORKER is not set (scripts/test.d/40-python.sh builds the Rust worker)")
    url = f"host=127.0.0.1 port={db.server.port} user=postgres dbname={db.name}"
    out = subprocess.run([worker, url, "write", SCOPE, token, "strict"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_rust_and_python_writers_share_one_fence(db, guest):
    """The Rust fencecheck-postgres-worker and this module on one database:
    one row in fencecheck_scopes, one high-water mark. Rust applies 0.42 →
    Python 0.41 is stale; Python applies 0.43 → Rust 0.43 is stale."""
    conn = db.connect(autocommit=True)
    assert _worker(db, "0.42") == "applied 1"
    rust_state = load_state(conn, SCOPE)
    assert rust_state is not None and scope_row(db) == [(SCOPE, 1)]
    stale = fenced_write(conn, guest, fc.Request(SCOPE, tok(41)), publish("python-41"))
    assert stale == fc.StaleFence(tok(41), tok(42))
    assert guest.inspect(rust_state).highest == tok(42)
    applied = fenced_write(conn, guest, fc.Request(SCOPE, tok(43)), publish("python-43"))
    assert isinstance(applied, fc.Applied) and applied.version == 2
    assert _worker(db, "0.43") == "stale-fence"
    assert _worker(db, "0.44") == "applied 3"
    # Both wrote the same row: one scope, its version counting every write.
    assert scope_row(db) == [(SCOPE, 3)]
    final = load_state(conn, SCOPE)
    assert guest.inspect(final).highest == tok(44) and guest.inspect(final).version == 3
    assert fenced_write(conn, guest, fc.Request(SCOPE, tok(43)), publish("x")) == fc.StaleFence(tok(43), tok(44))
    assert visible(db) == "python-43"


# -- one round trip -----------------------------------------------------------

# The catalog row and an audit row keyed by the accepted version, in one
# statement (the audit insert fails on a duplicate payload).
AUDIT = (
    "CREATE TABLE audit (scope text NOT NULL, version bigint NOT NULL, "
    "payload text NOT NULL UNIQUE, PRIMARY KEY (scope, version))"
)
PUBLISH = (
    "WITH catalog AS (INSERT INTO report_catalog VALUES (%s, %s) ON CONFLICT (report_id) "
    "DO UPDATE SET visible_object = excluded.visible_object) "
    "INSERT INTO audit VALUES (%s, (SELECT version FROM fencecheck_accepted), %s)"
)


def _execute(conn, guest, cache, counter: int, payload: str):
    return fenced_execute(conn, guest, cache, fc.Request(SCOPE, tok(counter)), PUBLISH, (SCOPE, payload, SCOPE, payload))


def _round_trips(conn, write) -> int:
    """How many times ``write`` waited for the server: in libpq's trace of
    the messages, each turn from what the client sent (F) to what the server
    answered (B)."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        try:
            write()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        sides = [f[1] for f in (line.split("\t") for line in trace.read().splitlines()) if len(f) > 1]
    return sum(1 for a, b in zip(sides, sides[1:]) if (a, b) == ("F", "B"))


@pytest.mark.parametrize("autocommit", [True, False])
def test_fenced_execute_writes_in_one_round_trip(db, guest, autocommit):
    """The first write locks; the next, decided on the cached state, waits
    for the server once (also on a connection not in autocommit mode) and
    stores what the locking path would; a stale token is refused with the
    stored highest and its statement never commits."""
    db.execute(AUDIT)
    conn = db.connect(autocommit=autocommit)
    cache = StateCache()
    first = _execute(conn, guest, cache, 10, "a")
    assert isinstance(first, fc.Applied) and first.version == 1
    assert (cache.one_round_trip, cache.stale, cache.uncached) == (0, 0, 1)
    results = []
    assert _round_trips(conn, lambda: results.append(_execute(conn, guest, cache, 11, "b"))) == 1
    assert isinstance(results[0], fc.Applied) and results[0].version == 2
    assert (cache.one_round_trip, cache.stale, cache.uncached) == (1, 0, 1)
    assert db.query("SELECT version, payload FROM audit ORDER BY version") == [(1, "a"), (2, "b")]
    assert load_state(conn, SCOPE) == results[0].state
    conn.rollback()
    assert _execute(conn, guest, cache, 9, "old") == fc.StaleFence(tok(9), tok(11))
    assert db.query("SELECT count(*) FROM audit") == [(2,)]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_fenced_execute_with_a_stale_cache_asks_the_database(db, guest):
    """A Rust writer (fencecheck-postgres-worker) moves the state after the
    Python writer cached it: the cached decision is not kept, the locking
    path refuses the overtaken token with the stored highest, its statement
    never commits; newer tokens apply on top of the Rust write."""
    db.execute(AUDIT)
    conn = db.connect(autocommit=True)
    cache = StateCache()
    assert isinstance(_execute(conn, guest, cache, 40, "py-40"), fc.Applied)
    assert _worker(db, "0.50") == "applied 2"
    assert _execute(conn, guest, cache, 45, "py-45") == fc.StaleFence(tok(45), tok(50))
    assert cache.stale == 1
    assert db.query("SELECT payload FROM audit ORDER BY version") == [("py-40",)]
    newer = _execute(conn, guest, cache, 51, "py-51")
    assert isinstance(newer, fc.Applied) and newer.version == 3
    assert isinstance(_execute(conn, guest, cache, 52, "py-52"), fc.Applied)
    # The locking path's read refreshed the cache: both went in one statement.
    assert (cache.one_round_trip, cache.stale, cache.uncached) == (2, 1, 1)


def test_fenced_execute_statement_failure_stores_nothing(db, guest):
    """The statement's own failure (a duplicate audit payload) rolls the
    fence's write back with it, and is raised as the mutation's, confirmed
    by the locking path (not a stale answer)."""
    db.execute(AUDIT)
    conn = db.connect()
    cache = StateCache()
    _execute(conn, guest, cache, 10, "a")
    before = db.query("SELECT fence_state, version FROM fencecheck_scopes")
    with pytest.raises(psycopg.errors.UniqueViolation):
        _execute(conn, guest, cache, 11, "a")
    assert db.query("SELECT fence_state, version FROM fencecheck_scopes") == before
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    applied = _execute(conn, guest, cache, 11, "b")
    assert isinstance(applied, fc.Applied) and applied.version == 2
    assert isinstance(_execute(conn, guest, cache, 12, "c"), fc.Applied)
    assert (cache.one_round_trip, cache.stale, cache.uncached) == (1, 1, 2)


def test_signals_count_each_call_once_on_every_path(db, guest):
    """fencecheck.signals through prometheus_client: fenced_write counts as
    ``write``, fenced_execute as ``execute`` once per call whichever path
    decided (the one statement, the locking path, a failed one statement
    confirmed by the locking path); labels and counts held to the table."""
    registry = prometheus_client.CollectorRegistry()
    before = signals.install(signals.PrometheusSignals(registry))
    try:
        db.execute(AUDIT)
        conn = db.connect()
        assert isinstance(fenced_write(conn, guest, fc.Request("other", tok(5)), publish("w")), fc.Applied)
        assert isinstance(fenced_write(conn, guest, fc.Request("other", tok(4)), publish("x")), fc.StaleFence)
        cache = StateCache()
        assert isinstance(_execute(conn, guest, cache, 10, "a"), fc.Applied)  # locking path
        with pytest.raises(psycopg.errors.UniqueViolation):
            _execute(conn, guest, cache, 11, "a")  # one statement failed, then the locking path
        assert isinstance(_execute(conn, guest, cache, 11, "b"), fc.Applied)  # locking path
        assert isinstance(_execute(conn, guest, cache, 12, "c"), fc.Applied)  # one statement
        assert _execute(conn, guest, cache, 9, "old") == fc.StaleFence(tok(9), tok(12))
        assert (cache.one_round_trip, cache.stale, cache.uncached) == (1, 1, 3)
    finally:
        signals.install(before)
    text = prometheus_client.generate_latest(registry).decode()
    series = [
        Series(s.name, f.type, tuple(sorted(s.labels.items())), s.value)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("fencecheck_")
    ]
    assert decisions(check(series, table(), created_companions=True)) == {
        ("write", "applied", "0"): 1,
        ("write", "stale-fence", "0"): 1,
        ("execute", "applied", "0"): 3,
        ("execute", "error", "0"): 1,
        ("execute", "stale-fence", "0"): 1,
    }


def test_fenced_execute_connection_lost_during_commit_is_commit_unknown(guest):
    """The backend dies while the one statement's commit is in flight (a
    deferred trigger holds it; the test kills the backend): CommitUnknown,
    not a retryable error nor a stale one. Its own server."""
    server = PgServer()
    try:
        with psycopg.connect(server.conninfo(), autocommit=True) as setup:
            install(setup)
            setup.execute(CATALOG)
            setup.execute(AUDIT)
            setup.execute(
                "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$"
            )
        conn = psycopg.connect(server.conninfo(), autocommit=True)
        cache = StateCache()
        # The first write caches the state; the second goes in one statement.
        assert isinstance(_execute(conn, guest, cache, 10, "a"), fc.Applied)
        with psycopg.connect(server.conninfo(), autocommit=True) as setup:
            setup.execute(
                "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON audit "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()"
            )
        pid = conn.info.backend_pid
        results: dict = {}
        t = _in_thread(results, "write", lambda: _execute(conn, guest, cache, 11, "b"))
        with psycopg.connect(server.conninfo(), autocommit=True) as watch:
            deadline = time.monotonic() + 20
            while not watch.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event = 'PgSleep'",
                (pid,),
            ).fetchone()[0]:
                assert time.monotonic() < deadline, "the commit never started"
                time.sleep(0.01)
        os.kill(pid, signal.SIGKILL)
        t.join(20)
        conn.close()
        error = results["write"]
        assert isinstance(error, CommitUnknown), error
        assert not error.retryable
    finally:
        server.close()


# -- signed tokens ------------------------------------------------------------


def _key(key_id: int, fill: int) -> fc.GrantKey:
    return fc.GrantKey(key_id, bytes([fill]) * 32)


def _signed(guest, counter: int, k: fc.GrantKey, scope: str = SCOPE) -> fc.Request:
    token = fc.Token(0, 1, counter)
    return fc.Request(scope, token, signature=guest.sign(scope, token, "lease-1", k))


def _try_write(conn, guest, request, mutate=None):
    """fenced_write's answer: the decision, or the FenceError it raised."""
    try:
        return fenced_write(conn, guest, request, mutate or publish(f"v{request.token.counter}"))
    except fc.FenceError as e:
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        return e


def test_a_forged_maximum_token_locks_out_unsigned_scopes_only(db, guest):
    """The lock-out attack on PostgreSQL: unkeyed, a forged u64::MAX token
    applies and the honest signed grant is stale for good; keyed (set_keys),
    the forger is refused (unsigned; bad-signature with a copied signature),
    nothing changes, and the honest signed grant applies."""
    u64 = 2**64 - 1
    conn = db.connect()
    k = _key(3, 0x33)
    assert fenced_write(conn, guest, fc.Request("other/july", fc.Token(0, u64, u64)), publish("forged")).name == "applied"
    assert _try_write(conn, guest, _signed(guest, 42, k, "other/july")).name == "stale-fence"

    set_keys(conn, "report/", [k])
    forged = fc.Request(SCOPE, fc.Token(0, u64, u64))
    before = db.query("SELECT scope, fence_state, version FROM fencecheck_scopes ORDER BY scope"), visible(db)
    refused = _try_write(conn, guest, forged)
    assert isinstance(refused, fc.Unauthenticated) and refused.reason == "unsigned"
    copied = forged.with_signature(_signed(guest, 42, k).signature)
    assert _try_write(conn, guest, copied).reason == "bad-signature"
    by_other_key = _signed(guest, 42, _key(9, 0x99))
    assert _try_write(conn, guest, by_other_key).reason == "unknown-key"
    assert (db.query("SELECT scope, fence_state, version FROM fencecheck_scopes ORDER BY scope"), visible(db)) == before
    applied = _try_write(conn, guest, _signed(guest, 42, k))
    assert isinstance(applied, fc.Applied) and applied.version == 1 and visible(db) == "v42"


def test_keys_admin_api(db, guest):
    """set_keys validates first and replaces a prefix's keys; the longest
    prefix decides; remove_keys says whether there were keys; key_prefixes
    lists ids only; an unusable stored set is the invalid-keys refusal."""
    conn = db.connect()
    k1, k2, k3 = _key(1, 1), _key(2, 2), _key(3, 3)
    for keys, why in [([], "no-keys"), ([fc.GrantKey(1, b"x" * 15)], "short-secret"), ([k1, k1], "duplicate-key-id")]:
        with pytest.raises(fc.KeySetError) as e:
            set_keys(conn, "report/", keys)
        assert e.value.reason == why
    with pytest.raises(ValueError):
        set_keys(conn, "x" * 1025, [k1])
    assert key_prefixes(conn) == []
    conn.rollback()
    set_keys(conn, "", [k1])
    set_keys(conn, "report/", [k2])
    set_keys(conn, "report/", [k2, k3])
    assert key_prefixes(conn) == [("", [1]), ("report/", [2, 3])]
    assert scope_keys(conn, SCOPE) == [k2, k3] and scope_keys(conn, "repor") == [k1]
    conn.rollback()
    assert _try_write(conn, guest, _signed(guest, 1, k1)).reason == "unknown-key"
    assert remove_keys(conn, "report/") and not remove_keys(conn, "report/")
    assert _try_write(conn, guest, _signed(guest, 1, k1)).name == "applied"
    assert remove_keys(conn, "")
    assert scope_keys(conn, SCOPE) is None
    conn.rollback()
    assert _try_write(conn, guest, fc.Request(SCOPE, fc.Token(0, 1, 2))).name == "applied"
    db.execute("INSERT INTO fencecheck_keys VALUES ('report/', 1, '\\x00')")
    refused = _try_write(conn, guest, _signed(guest, 3, k1))
    assert isinstance(refused, fc.InvalidKeys) and refused.reason == "short-secret"
    conn.execute("SELECT 1")
    with pytest.raises(psycopg.ProgrammingError, match="own transaction"):
        set_keys(conn, "report/", [k1])


def test_key_changes_wait_for_writes_in_flight(db, runtime):
    """A key change waits for a fenced write in flight (it holds the scope's
    row lock; set_keys takes fencecheck_scopes in EXCLUSIVE mode first): the
    write decides with the keys it read and commits before the change; the
    next write decides with the new keys."""
    first = runtime.instance()
    assert fenced_write(db.connect(), first, fc.Request(SCOPE, fc.Token(0, 1, 1)), publish("v1")).name == "applied"
    inside, release = threading.Event(), threading.Event()
    results: dict = {}

    def hold(c, applied):
        inside.set()
        assert release.wait(20), "never released"
        publish("v2")(c, applied)

    writer = _in_thread(results, "write", lambda: fenced_write(
        db.connect(), runtime.instance(), fc.Request(SCOPE, fc.Token(0, 1, 2)), hold))
    assert inside.wait(20), "the writer never reached its mutation"
    changer = _in_thread(results, "change", lambda: set_keys(db.connect(), "report/", [_key(3, 3)]))
    try:
        wait_for_lock_waiter(db, "LOCK TABLE fencecheck_scopes")
        assert "change" not in results, "the key change did not wait for the write in flight"
    finally:
        release.set()
        writer.join(20)
        changer.join(20)
    assert isinstance(results["write"], fc.Applied) and results["write"].version == 2
    assert results["change"] is None and visible(db) == "v2"
    refused = _try_write(db.connect(), first, fc.Request(SCOPE, fc.Token(0, 1, 3)))
    assert isinstance(refused, fc.Unauthenticated) and refused.reason == "unsigned"
    assert scope_row(db) == [(SCOPE, 2)]


def test_writes_wait_for_a_key_change_in_flight(db, runtime):
    """The other order: a write that starts while a key change holds its
    lock waits on its row lock, then reads the committed keys (after the
    lock), never the ones before the change."""
    admin = db.connect()
    admin.execute("LOCK TABLE fencecheck_scopes IN EXCLUSIVE MODE")  # a set_keys in flight
    admin.execute("INSERT INTO fencecheck_keys VALUES ('', 1, %s)", (b"\1" * 32,))
    results: dict = {}
    writer = _in_thread(results, "write", lambda: _try_write(
        db.connect(), runtime.instance(), fc.Request(SCOPE, fc.Token(0, 1, 1))))
    try:
        wait_for_lock_waiter(db, "SELECT fence_state FROM fencecheck_scopes")
    finally:
        admin.commit()
        writer.join(20)
    refused = results["write"]
    assert isinstance(refused, fc.Unauthenticated) and refused.reason == "unsigned", refused
    assert scope_row(db) == []


def test_rust_writers_enforce_keys_python_set(db, guest):
    """Keys set by Python (fencecheck_keys) bind the Rust fencecheck-postgres
    writer too: its unsigned token is refused unauthenticated; removed, it
    applies. One table of keys, whatever the language."""
    conn = db.connect()
    set_keys(conn, "report/", [_key(3, 3)])
    assert _worker(db, "0.42") == "unauthenticated"
    assert scope_row(db) == []
    applied = _try_write(conn, guest, _signed(guest, 42, _key(3, 3)))
    assert isinstance(applied, fc.Applied)
    remove_keys(conn, "report/")
    assert _worker(db, "1.43") == "applied 2"
