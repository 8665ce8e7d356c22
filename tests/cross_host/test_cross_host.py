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

import os
import sqlite3
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
            self.assertEqual(query(db, "SELECT key, value FROM fencecheck_meta"), [("layout", 1)], host)
        names = {name for _, name, _ in schemas["rust"]}
        self.assertLessEqual({"fencecheck_meta", "fencecheck_scopes", "fencecheck_objects"}, names)
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
        """install on a file whose fencecheck_meta says layout 2 fails in every host and changes nothing."""
        for host in HOSTS:
            db = self.dir / f"layout2-{host}.sqlite"
            conn = sqlite3.connect(db)
            conn.execute("PRAGMA journal_mode=WAL")  # as every host sets it, so only the install could differ
            conn.execute(
                "CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID"
            )
            conn.execute("INSERT INTO fencecheck_meta VALUES ('layout', 2)")
            conn.commit()
            conn.close()
            before = (schema(db), query(db, "SELECT key, value FROM fencecheck_meta"))
            p = run(host, db, "install")
            self.assertNotEqual(p.returncode, 0, host)
            self.assertEqual(p.stdout.strip(), "unsupported-layout", f"{host}:\n{p.stderr}")
            self.assertIn("layout 2", p.stderr, host)
            self.assertIn("supports only layout 1", p.stderr, host)
            self.assertEqual((schema(db), query(db, "SELECT key, value FROM fencecheck_meta")), before, host)


def main() -> int:
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(CrossHost)
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    print(f"cross-host: {result.testsRun - failed} passed, {failed} failed")
    return 0 if failed == 0 and result.testsRun > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
