#!/usr/bin/env python3
"""One SQLite database file, written by the Rust adapter, the Python host and
the Node host in turn, must keep ONE fence per scope.

Each host runs as its own process with the same commands (`install`,
`write SCOPE TOKEN`): the Rust worker (host/sqlite/src/bin/worker.rs, path in
$FENCECHECK_SQLITE_WORKER), driver.py (the `fencecheck` package on
sys.path: installed, or PYTHONPATH=host/python/src) and driver.mjs
(host/node, built with `npm run build`). Run by scripts/test.d/55-cross-host.sh;
ends with `cross-host: N passed, N failed`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import sqlite3
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOSTS = ("rust", "python", "node")
SCOPE = "report/july"


def command(host: str, db: Path, *args: str) -> list[str]:
    if host == "rust":
        worker = os.environ.get("FENCECHECK_SQLITE_WORKER")
        if not worker:
            raise RuntimeError("set FENCECHECK_SQLITE_WORKER to the fencecheck-sqlite-worker binary")
        return [worker, str(db), "0", *args]  # 0: the worker's clock, unused here
    if host == "python":
        return [sys.executable, str(HERE / "driver.py"), str(db), *args]
    return ["node", str(HERE / "driver.mjs"), str(db), *args]


def run(host: str, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(host, db, *args), capture_output=True, text=True, timeout=120)


def query(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def schema(db: Path) -> list[tuple]:
    return query(db, "SELECT type, name, sql FROM sqlite_master ORDER BY name")


class CrossHost(unittest.TestCase):
    def setUp(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="fencecheck-cross-host-")
        self.dir = Path(self._dir.name)

    def tearDown(self) -> None:
        self._dir.cleanup()

    def ok(self, host: str, db: Path, *args: str) -> str:
        """Run a host command that must succeed; its one output line."""
        p = run(host, db, *args)
        self.assertEqual(p.returncode, 0, f"{host} {' '.join(args)} failed:\n{p.stderr}")
        return p.stdout.strip()

    def test_every_host_installs_the_same_layout(self) -> None:
        """install from Rust, Python and Node gives byte-identical sqlite_master on fresh files."""
        schemas = {}
        for host in HOSTS:
            db = self.dir / f"{host}.sqlite"
            self.assertEqual(self.ok(host, db, "install"), "installed")
            schemas[host] = schema(db)
            self.assertEqual(query(db, "SELECT key, value FROM fencecheck_meta"), [("layout", 2)], host)
        names = {name for _, name, _ in schemas["rust"]}
        self.assertLessEqual({"fencecheck_meta", "fencecheck_scopes", "fencecheck_objects", "fencecheck_keys"}, names)
        self.assertEqual(schemas["python"], schemas["rust"])
        self.assertEqual(schemas["node"], schemas["rust"])

    def test_one_fence_across_hosts(self) -> None:
        """A token applied by any host is stale for the other two: one high-water mark per scope."""
        db = self.dir / "shared.sqlite"
        for host in HOSTS:  # every host's install accepts the others' database
            self.assertEqual(self.ok(host, db, "install"), "installed")
        installed = schema(db)
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE worker_audit (scope TEXT, token TEXT, version INTEGER)")
        conn.commit()
        conn.close()

        others = {h: [o for o in HOSTS if o != h] for h in HOSTS}
        for writer, text in (("rust", "0.1"), ("python", "0.2"), ("node", "0.3")):
            self.assertEqual(self.ok(writer, db, "write", SCOPE, text), "applied", f"{writer} {text}")
            for host in others[writer]:
                self.assertEqual(self.ok(host, db, "write", SCOPE, text), "stale-fence", f"{host} after {writer}, {text}")
        for host in HOSTS:
            self.assertEqual(self.ok(host, db, "write", SCOPE, "0.2"), "stale-fence", f"{host}, lower token 0.2")

        self.assertEqual(query(db, "SELECT scope, version FROM fencecheck_scopes"), [(SCOPE, 3)])
        self.assertEqual(
            query(db, "SELECT scope, token, version FROM worker_audit ORDER BY rowid"),
            [(SCOPE, "0.1", 1), (SCOPE, "0.2", 2), (SCOPE, "0.3", 3)],
        )
        # No host kept a mark anywhere else (e.g. a table of its own).
        self.assertEqual([r for r in schema(db) if r[1] != "worker_audit"], installed)

    def test_another_layout_is_refused_by_every_host(self) -> None:
        """install on a file whose fencecheck_meta says layout 3 fails in every host and changes nothing."""
        for host in HOSTS:
            db = self.dir / f"layout3-{host}.sqlite"
            conn = sqlite3.connect(db)
            conn.execute("PRAGMA journal_mode=WAL")  # as every host sets it, so only the install could differ
            conn.execute(
                "CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID"
            )
            conn.execute("INSERT INTO fencecheck_meta VALUES ('layout', 3)")
            conn.commit()
            conn.close()
            before = (schema(db), query(db, "SELECT key, value FROM fencecheck_meta"))
            p = run(host, db, "install")
            self.assertNotEqual(p.returncode, 0, host)
            self.assertEqual(p.stdout.strip(), "unsupported-layout", f"{host}:\n{p.stderr}")
            self.assertIn("layout 3", p.stderr, host)
            self.assertIn("layout 2", p.stderr, host)
            self.assertEqual((schema(db), query(db, "SELECT key, value FROM fencecheck_meta")), before, host)

    def test_layout_1_is_upgraded_alike_by_every_host(self) -> None:
        """A layout-1 file (0.1.0, no fencecheck_keys) with a fence state is upgraded by each host's install
        to the same schema as a fresh layout-2 file, keeping the state, and every host then fences it."""
        reference = self.dir / "fresh.sqlite"
        self.assertEqual(self.ok("rust", reference, "install"), "installed")
        for host in HOSTS:
            db = self.dir / f"layout1-{host}.sqlite"
            self.assertEqual(self.ok("rust", db, "install"), "installed")
            conn = sqlite3.connect(db)
            conn.execute("CREATE TABLE worker_audit (scope TEXT, token TEXT, version INTEGER)")
            conn.commit()
            conn.close()
            self.assertEqual(self.ok("rust", db, "write", SCOPE, "0.5"), "applied")
            conn = sqlite3.connect(db)
            conn.execute("DROP TABLE fencecheck_keys")
            conn.execute("UPDATE fencecheck_meta SET value = 1 WHERE key = 'layout'")
            conn.commit()
            conn.close()
            self.assertEqual(self.ok(host, db, "install"), "installed", host)
            self.assertEqual(query(db, "SELECT value FROM fencecheck_meta"), [(2,)], host)
            self.assertEqual([r for r in schema(db) if r[1] != "worker_audit"], schema(reference), host)
            self.assertEqual(self.ok(host, db, "write", SCOPE, "0.4"), "stale-fence", host)
            self.assertEqual(self.ok(host, db, "write", SCOPE, "0.6"), "applied", host)

    def test_signed_scopes_across_hosts(self) -> None:
        """Keys stored once in fencecheck_keys bind every host: the forged u64::MAX token (unsigned, or with an
        honest signature pasted on) and a tampered one are unauthenticated in all three; signed grants
        written in turn by each host are applied once and stale for the others; an unkeyed scope still takes
        unsigned tokens. The signed texts are made here with Python's hmac from the documented message."""
        db = self.dir / "signed.sqlite"
        for host in HOSTS:
            self.assertEqual(self.ok(host, db, "install"), "installed")
        secret = bytes(range(32))
        conn = sqlite3.connect(db)
        conn.execute("CREATE TABLE worker_audit (scope TEXT, token TEXT, version INTEGER)")
        conn.execute("INSERT INTO fencecheck_keys VALUES ('report/', 3, ?)", (secret,))
        conn.commit()
        conn.close()

        def signed(epoch: int, counter: int, lease: str = "lease-1") -> str:
            s, l = SCOPE.encode(), lease.encode()
            message = (b"fencecheck-grant-v1\0" + struct.pack("<I", len(s)) + s + struct.pack("<QQQ", 0, epoch, counter)
                       + struct.pack("<II", 3, len(l)) + l)
            tag = hmac.new(secret, message, hashlib.sha256).digest()
            b64 = lambda b: base64.urlsafe_b64encode(b).decode().rstrip("=")
            return f"{epoch}.{counter}~3~{b64(l)}~{b64(tag)}"

        maximum = f"{2**64 - 1}.{2**64 - 1}"
        honest = signed(1, 1)
        for host in HOSTS:
            for text in (maximum, maximum + honest[honest.index("~"):], honest.replace("1.1~", "1.2~", 1)):
                self.assertEqual(self.ok(host, db, "write", SCOPE, text), "unauthenticated", f"{host} {text}")
        self.assertEqual(query(db, "SELECT count(*) FROM fencecheck_scopes"), [(0,)])
        others = {h: [o for o in HOSTS if o != h] for h in HOSTS}
        for counter, writer in enumerate(HOSTS, start=1):
            text = signed(1, counter)
            self.assertEqual(self.ok(writer, db, "write", SCOPE, text), "applied", f"{writer} {counter}")
            for host in others[writer]:
                self.assertEqual(self.ok(host, db, "write", SCOPE, text), "stale-fence", f"{host} after {writer}")
        self.assertEqual(query(db, "SELECT scope, version FROM worker_audit ORDER BY rowid"),
                         [(SCOPE, 1), (SCOPE, 2), (SCOPE, 3)])
        for host in HOSTS:
            self.assertEqual(self.ok(host, db, "write", f"notes/{host}", "0.1"), "applied", host)


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(CrossHost)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"cross-host: {result.testsRun - failed} passed, {failed} failed")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
