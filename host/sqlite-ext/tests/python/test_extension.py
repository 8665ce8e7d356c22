"""The fencecheck SQLite extension, loaded by Python's own sqlite3 module.

Run with a Python whose sqlite3 module can load extensions (Debian's
/usr/bin/python3 can), with FENCECHECK_SQLITE_EXT naming the built library:

    FENCECHECK_SQLITE_EXT=target/debug/deps/libfencecheck_sqlite_ext.so \
        /usr/bin/python3 -m unittest -v host/sqlite-ext/tests/python/test_extension.py
"""

import json
import os
import sqlite3
import tempfile
import threading
import unittest

EXT = os.environ.get("FENCECHECK_SQLITE_EXT", "")
SCOPE = "report/july"
PUBLISH = """
UPDATE report_catalog
   SET visible_object = :object_key,
       fence_state = fence_next(fence_state, :report_id, :token, 'strict', NULL, NULL)
 WHERE report_id = :report_id
   AND fence_check(fence_state, :report_id, :token, 'strict', NULL, NULL) = 'applied'
"""

# The documented form: fence_next in SET only, one component call; a
# refusal raises.
ONE_CALL = """
UPDATE report_catalog
   SET visible_object = :object_key,
       fence_state = fence_next(fence_state, :report_id, :token, 'strict', NULL, NULL)
 WHERE report_id = :report_id
"""


def connect(path=":memory:"):
    """A connection with the extension loaded (and loading disabled again)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.enable_load_extension(True)
    conn.load_extension(EXT)
    conn.enable_load_extension(False)
    return conn


def with_catalog(conn):
    """The seed's catalog with one row published under token 0.40."""
    conn.execute(
        "CREATE TABLE report_catalog (report_id TEXT PRIMARY KEY,"
        " visible_object TEXT NOT NULL, fence_state BLOB NOT NULL)"
    )
    conn.execute(
        "INSERT INTO report_catalog VALUES (?, 'reports/july/first',"
        " fence_next(NULL, ?, '0.40', 'strict', NULL, NULL))",
        (SCOPE, SCOPE),
    )
    return conn


def publish(conn, token, object_key):
    """The one-statement fenced publish; returns the number of rows changed."""
    cur = conn.execute(
        PUBLISH, {"object_key": object_key, "report_id": SCOPE, "token": token}
    )
    return cur.rowcount


def row(conn):
    return conn.execute(
        "SELECT visible_object, fence_state FROM report_catalog"
    ).fetchone()


class Extension(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not EXT or not os.path.exists(EXT):
            raise RuntimeError(f"FENCECHECK_SQLITE_EXT does not name a file: {EXT!r}")
        if not hasattr(sqlite3.Connection, "enable_load_extension"):
            raise RuntimeError("this Python's sqlite3 cannot load extensions")

    def assertRaisesSql(self, prefix, sql, params=()):
        """The statement fails with an SQL error starting with `prefix`."""
        with self.assertRaises(sqlite3.OperationalError) as caught:
            self.conn.execute(sql, params).fetchall()
        self.assertTrue(
            str(caught.exception).startswith(prefix),
            f"{str(caught.exception)!r} does not start with {prefix!r}",
        )

    def setUp(self):
        self.conn = with_catalog(connect())

    def tearDown(self):
        self.conn.close()

    def test_one_statement_update_fences_the_paused_writer(self):
        """B's token 42 publishes; A's late 41 changes no row; B stays visible."""
        self.assertEqual(publish(self.conn, "0.42", "reports/july/b9.tmp"), 1)
        self.assertEqual(publish(self.conn, "0.41", "reports/july/a7.tmp"), 0)
        self.assertEqual(publish(self.conn, "0.42", "reports/july/again"), 0)
        self.assertEqual(row(self.conn)[0], "reports/july/b9.tmp")
        (outcome,) = self.conn.execute(
            "SELECT fence_check(fence_state, report_id, '0.41', 'strict', NULL, NULL)"
            " FROM report_catalog"
        ).fetchone()
        self.assertEqual(outcome, "stale-fence")

    def test_one_call_statement_raises_on_refusal(self):
        """One row for applied; stale-fence raised, nothing changed, for the late token."""
        params = {"object_key": "reports/july/b9.tmp", "report_id": SCOPE, "token": "0.42"}
        self.assertEqual(self.conn.execute(ONE_CALL, params).rowcount, 1)
        before = row(self.conn)
        self.assertRaisesSql(
            "stale-fence: token 0.41 is not above the highest accepted 0.42",
            ONE_CALL,
            dict(params, object_key="reports/july/a7.tmp", token="0.41"),
        )
        self.assertEqual(row(self.conn), before)

    def test_fence_next_raises_for_every_refused_outcome(self):
        """An UPDATE without the fence_check guard cannot store a refused state."""
        before = row(self.conn)
        self.assertRaisesSql(
            "stale-fence: token 0.39 is not above the highest accepted 0.40",
            "UPDATE report_catalog SET visible_object = 'x',"
            " fence_state = fence_next(fence_state, report_id, '0.39', 'strict', NULL, NULL)",
        )
        self.assertEqual(row(self.conn), before)

    def test_outcomes_under_allow_equal(self):
        """Op-ids give duplicate, expected versions give version-conflict."""
        check = "SELECT fence_check(?, ?, '0.41', 'allow-equal', ?, ?)"
        nxt = "SELECT fence_next(?, ?, '0.41', 'allow-equal', ?, ?)"
        (state,) = self.conn.execute(nxt, (None, SCOPE, "op-1", None)).fetchone()
        self.assertEqual(self.conn.execute(check, (state, SCOPE, "op-1", None)).fetchone()[0], "duplicate")
        self.assertEqual(self.conn.execute(check, (state, SCOPE, "op-2", None)).fetchone()[0], "applied")
        self.assertEqual(self.conn.execute(check, (state, SCOPE, None, 5)).fetchone()[0], "version-conflict")
        self.assertRaisesSql("duplicate: ", nxt, (state, SCOPE, "op-1", None))
        self.assertRaisesSql("version-conflict: expected version 5, the scope is at 1", nxt, (state, SCOPE, None, 5))

    def test_bad_inputs_raise_named_errors_and_change_nothing(self):
        """Wrong types, bad token text, corrupt or foreign state: named errors, no change."""
        before = row(self.conn)
        state = before[1]
        damaged = bytearray(state)
        damaged[12] ^= 0x01
        sql = "UPDATE report_catalog SET visible_object = 'x', fence_state = fence_next(?, ?, ?, ?, ?, ?)"
        cases = [
            ((state, SCOPE, 42, "strict", None, None), "invalid-argument: token must be TEXT, got INTEGER"),
            ((state, SCOPE, "42", "strict", None, None), 'invalid-token: invalid token "42"'),
            ((state, SCOPE, " 0.42", "strict", None, None), "invalid-token:"),
            ((state, SCOPE, "0.42.1", "strict", None, None), "invalid-token:"),
            ((state, SCOPE, "18446744073709551616.0", "strict", None, None), "invalid-token:"),
            ((state, None, "0.42", "strict", None, None), "invalid-argument: scope must be TEXT, got NULL"),
            ((state, b"report/july", "0.42", "strict", None, None), "invalid-argument: scope must be TEXT, got BLOB"),
            ((state.hex(), SCOPE, "0.42", "strict", None, None), "invalid-argument: state must be a BLOB or NULL, got TEXT"),
            ((state, SCOPE, "0.42", "STRICT", None, None), "invalid-argument: policy must be 'strict' or 'allow-equal'"),
            ((state, SCOPE, "0.42", "allow-equal", None, -1), "invalid-argument: expected_version must not be negative"),
            ((state, SCOPE, "0.42", "allow-equal", None, 1.5), "invalid-argument: expected_version must be an INTEGER or NULL, got REAL"),
            ((state, SCOPE, "0.42", "strict", "", None), "invalid-request: empty-op-id"),
            ((state, SCOPE, "0.42", "strict", "o" * 257, None), "invalid-request: op-id-too-long"),
            ((None, "s" * 1025, "0.42", "strict", None, None), "invalid-request: scope-too-long"),
            ((state, SCOPE, "0.0", "strict", None, None), "invalid-request: missing-token"),
            ((bytes(damaged), SCOPE, "0.42", "strict", None, None), "corrupt-state: checksum-mismatch"),
            ((state[:-1], SCOPE, "0.42", "strict", None, None), "corrupt-state: length-mismatch"),
            ((b"", SCOPE, "0.42", "strict", None, None), "corrupt-state: truncated"),
            ((state, "report/august", "0.42", "strict", None, None), 'scope-mismatch: the state belongs to scope "report/july"'),
            ((state, SCOPE, "3:0.42", "strict", None, None), "foreign-authority: the scope is pinned to authority 0, the token is from 3"),
        ]
        for params, prefix in cases:
            with self.subTest(prefix=prefix):
                self.assertRaisesSql(prefix, sql, params)
                self.assertEqual(row(self.conn), before)
        self.assertRaisesSql("wrong number of arguments", "SELECT fence_check(NULL, 'x', '0.1')")

    def test_tokens_use_the_full_u64_range(self):
        """AUTHORITY:EPOCH.COUNTER at u64::MAX is a valid token."""
        top = "18446744073709551615"
        (state,) = self.conn.execute(
            "SELECT fence_next(NULL, 'wide', ?, 'strict', NULL, NULL)", (f"{top}:{top}.{top}",)
        ).fetchone()
        info = json.loads(self.conn.execute("SELECT fence_inspect(?)", (state,)).fetchone()[0])
        self.assertEqual(info["highest"], {"authority": 2**64 - 1, "epoch": 2**64 - 1, "counter": 2**64 - 1})

    def test_inspect_returns_json(self):
        """fence_inspect decodes a state; NULL stays NULL."""
        info = json.loads(
            self.conn.execute("SELECT fence_inspect(fence_state) FROM report_catalog").fetchone()[0]
        )
        self.assertEqual(info["scope"], SCOPE)
        self.assertEqual(info["version"], 1)
        self.assertEqual(info["highest"]["counter"], 40)
        self.assertIsNone(self.conn.execute("SELECT fence_inspect(NULL)").fetchone()[0])

    def test_functions_are_deterministic(self):
        """SQLite accepts them in an index expression (only deterministic ones are)."""
        self.conn.execute("CREATE INDEX by_state ON report_catalog (fence_inspect(fence_state))")

    def test_two_connections_on_a_wal_file(self):
        """Two writers on one WAL file: the later, higher token wins for good."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "catalog.sqlite")
            a = with_catalog(connect(path))
            a.execute("PRAGMA journal_mode=WAL")
            b = connect(path)
            b.execute("BEGIN IMMEDIATE")
            self.assertEqual(publish(b, "0.42", "b9"), 1)
            b.execute("COMMIT")
            a.execute("BEGIN IMMEDIATE")
            self.assertEqual(publish(a, "0.41", "a7"), 0)
            a.execute("COMMIT")
            self.assertEqual(row(a)[0], "b9")
            a.close()
            b.close()

    def test_threads_each_with_a_connection(self):
        """Threads with their own connections decide concurrently and agree."""
        results, errors = {}, []
        start = threading.Barrier(4)

        def work(i):
            try:
                conn = connect()
                start.wait()
                state = None
                for counter in range(1, 101):
                    (state,) = conn.execute(
                        "SELECT fence_next(?, 'shared', ?, 'strict', NULL, NULL)",
                        (state, f"0.{counter}"),
                    ).fetchone()
                results[i] = state
                conn.close()
            except Exception as e:  # reported below, in the main thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(set(results.values())), 1, "threads disagree")

    def test_loads_again_after_close(self):
        """After the loading connection closes, a new one loads it and works.

        (That the library is never unmapped is checked on the ELF flags by
        the Rust test `library_is_never_unloaded`: glibc may keep it mapped
        anyway, so /proc/self/maps here could not tell.)
        """
        self.conn.close()
        self.conn = with_catalog(connect())
        self.assertEqual(publish(self.conn, "0.41", "again"), 1)

if __name__ == "__main__":
    unittest.main()
