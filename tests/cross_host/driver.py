"""The Python side of the cross-host test (test_cross_host.py), with the
commands of the Rust worker (host/sqlite/src/bin/worker.rs):

    driver.py DB install
        install the layout; print `installed`, or `unsupported-layout` and
        exit 1 (the message on stderr).
    driver.py DB write SCOPE TOKEN [strict|allow-equal]
        a fenced write whose mutation inserts into `worker_audit (scope,
        token, version)`; print the outcome name (`applied`, `stale-fence`...).

TOKEN is canonical text: EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER, signed or
not (`…~KEY-ID~LEASE~TAG`): a scope with keys in `fencecheck_keys` requires
the signature.
"""

import sqlite3
import sys

import fencecheck as fc
from fencecheck.sqlite import UnsupportedLayout, fenced_write, install

def open_db(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60)
    conn.execute("PRAGMA journal_mode=WAL")  # as the Rust worker
    return conn


def write(conn: sqlite3.Connection, scope: str, text: str, policy: str) -> str:
    presented = fc.SignedToken.parse(text)
    request = fc.Request(scope, presented.token, fc.Policy(policy), signature=presented.signature)

    def audit(c: sqlite3.Connection, applied: fc.Applied) -> None:
        c.execute("INSERT INTO worker_audit (scope, token, version) VALUES (?, ?, ?)", (scope, text, applied.version))

    try:
        return fenced_write(conn, fc.Runtime().instance(), request, audit).name
    except fc.FenceError as refused:  # a definitive refusal, printed like the worker's
        return refused.name


def main(argv: list[str]) -> int:
    match argv:
        case [db, "install"]:
            conn = open_db(db)
            try:
                install(conn)
            except UnsupportedLayout as e:
                print("unsupported-layout", flush=True)
                print(f"driver.py: {e}", file=sys.stderr)
                return 1
            finally:
                conn.close()
            print("installed")
        case [db, "write", scope, text, *policy] if len(policy) <= 1:
            conn = open_db(db)
            try:
                print(write(conn, scope, text, *(policy or ["strict"])))
            finally:
                conn.close()
        case _:
            print("usage: driver.py DB install | DB write SCOPE TOKEN [POLICY]", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
