//! The lease coordinator in the server (`fencecheck.acquire/renew/release`):
//! the seed's paused owner on a fake clock, eight clients taking turns with
//! an audited history, a restart, and bad input.

use std::sync::{Arc, Barrier};
use std::thread;

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{Token, TokenText};
use mysql::prelude::Queryable;
use mysql::{Conn, Value};

use crate::common::{Server, error_of};

const DOC: &str = "CREATE TABLE doc (
    id          VARBINARY(200) PRIMARY KEY,
    body        VARCHAR(200) NOT NULL,
    fence_state BLOB NULL) ENGINE=InnoDB";

/// A fenced write of `body` under `token` (the one-call UPDATE).
fn write(conn: &mut Conn, lock: &str, token: &str, body: &str) -> mysql::Result<u64> {
    conn.exec_drop(
        "UPDATE doc SET body = ?,
                fence_state = fence_next(fence_state, id, ?, 'strict', NULL, NULL)
          WHERE id = ?",
        (body, token, lock),
    )?;
    Ok(conn.affected_rows())
}

fn body(conn: &mut Conn, lock: &str) -> Result<String> {
    conn.exec_first("SELECT body FROM doc WHERE id = ?", (lock,))?
        .context("no doc row")
}

#[derive(Debug, PartialEq)]
enum Acquired {
    Granted {
        token: String,
        expires_at: u64,
        decided_at: u64,
    },
    Busy {
        holder: String,
        expires_at: u64,
    },
    /// A row of any other shape (a test failure wherever it appears).
    Unexpected(String),
}

type AcquireRow = (
    Option<String>,
    Option<String>,
    Option<u64>,
    Option<u64>,
    Option<String>,
);

fn acquire(
    conn: &mut Conn,
    lock: impl Into<Value>,
    lease_id: impl Into<Value>,
    ttl: impl Into<Value>,
) -> mysql::Result<Acquired> {
    let row: Option<AcquireRow> = conn.exec_first(
        "CALL fencecheck.acquire(?, ?, ?)",
        (lock.into(), lease_id.into(), ttl.into()),
    )?;
    Ok(match row {
        Some((Some(o), Some(token), Some(expires_at), Some(decided_at), None))
            if o == "acquired" =>
        {
            Acquired::Granted {
                token,
                expires_at,
                decided_at,
            }
        }
        Some((Some(o), None, Some(expires_at), None, Some(holder))) if o == "busy" => {
            Acquired::Busy { holder, expires_at }
        }
        other => Acquired::Unexpected(format!("{other:?}")),
    })
}

fn granted(answer: Acquired) -> Result<(String, u64)> {
    match answer {
        Acquired::Granted {
            token, expires_at, ..
        } => Ok((token, expires_at)),
        other => bail!("expected a grant, got {other:?}"),
    }
}

fn renew(
    conn: &mut Conn,
    lock: impl Into<Value>,
    lease_id: impl Into<Value>,
    token: impl Into<Value>,
    ttl: impl Into<Value>,
) -> mysql::Result<Option<(String, u64)>> {
    conn.exec_first(
        "CALL fencecheck.renew(?, ?, ?, ?)",
        (lock.into(), lease_id.into(), token.into(), ttl.into()),
    )
}

fn release(
    conn: &mut Conn,
    lock: impl Into<Value>,
    lease_id: impl Into<Value>,
    token: impl Into<Value>,
) -> mysql::Result<Option<String>> {
    conn.exec_first(
        "CALL fencecheck.release(?, ?, ?)",
        (lock.into(), lease_id.into(), token.into()),
    )
}

fn set_clock(conn: &mut Conn, now_ms: u64) -> mysql::Result<()> {
    conn.query_drop(format!("SET @fencecheck_now_ms = {now_ms}"))
}

fn token(text: &str) -> Result<Token> {
    Ok(text
        .parse::<TokenText>()
        .with_context(|| format!("token {text}"))?
        .0)
}

/// The seed's paused owner, in SQL, on the test clock: A is granted a
/// lease and pauses past its expiry; B is refused before expiry (busy) and
/// granted at it with a higher token; B's fenced write applies; A, awake,
/// has its renewal refused (lost) and its release refused (not-owner), and
/// its write with the old token is refused as stale; the row is B's. A
/// retried acquire returns the same grant; the next grant after B's
/// release is higher still.
#[test]
fn paused_owner_past_expiry_is_fenced_out() -> Result<()> {
    let server = Server::start_with_test_clock()?;
    let mut a = server.conn()?;
    let mut b = server.conn()?;
    a.query_drop(DOC)?;
    a.query_drop("INSERT INTO doc VALUES ('report/july', 'v0', NULL)")?;

    set_clock(&mut a, 1_000)?;
    let first = acquire(&mut a, "report/july", "lease-a", 5_000)?;
    let Acquired::Granted {
        token: ta,
        expires_at,
        decided_at,
    } = first
    else {
        bail!("A not granted: {first:?}");
    };
    ensure!((expires_at, decided_at) == (6_000, 1_000));
    // A retry (same lease id) gets the same grant, whatever its ttl.
    set_clock(&mut a, 2_000)?;
    let retry = granted(acquire(&mut a, "report/july", "lease-a", 99_000)?)?;
    ensure!(retry == (ta.clone(), 6_000), "{retry:?}");

    // A pauses. Before expiry B is turned away; at expiry B is granted.
    set_clock(&mut b, 5_999)?;
    let busy = acquire(&mut b, "report/july", "lease-b", 5_000)?;
    ensure!(
        busy == Acquired::Busy {
            holder: "lease-a".into(),
            expires_at: 6_000
        },
        "{busy:?}"
    );
    set_clock(&mut b, 6_000)?;
    let (tb, _) = granted(acquire(&mut b, "report/july", "lease-b", 5_000)?)?;
    let (old, new) = (token(&ta)?, token(&tb)?);
    ensure!(old.authority != 0 && old.authority == new.authority);
    ensure!(new.grant_order(&old).is_gt(), "{tb} not above {ta}");
    ensure!(write(&mut b, "report/july", &tb, "by-b")? == 1);

    // A wakes up.
    set_clock(&mut a, 6_001)?;
    let (_, state, msg) = error_of(renew(&mut a, "report/july", "lease-a", ta.as_str(), 5_000))?;
    ensure!(
        state == "5F017" && msg.starts_with("lost: "),
        "{state} {msg}"
    );
    let (_, state, msg) = error_of(release(&mut a, "report/july", "lease-a", ta.as_str()))?;
    ensure!(
        state == "5F018" && msg.starts_with("not-owner: "),
        "{state} {msg}"
    );
    let (_, _, msg) = error_of(write(&mut a, "report/july", &ta, "by-a"))?;
    ensure!(msg.starts_with("stale-fence: "), "{msg}");
    ensure!(body(&mut a, "report/july")? == "by-b");

    // B renews (the token is unchanged, expiry moves) and releases; the
    // next grant, even to A's old lease id, is above B's.
    set_clock(&mut b, 7_000)?;
    let renewed = renew(&mut b, "report/july", "lease-b", tb.as_str(), 5_000)?;
    ensure!(renewed == Some(("renewed".into(), 12_000)), "{renewed:?}");
    ensure!(release(&mut b, "report/july", "lease-b", tb.as_str())? == Some("released".into()));
    set_clock(&mut a, 8_000)?;
    let (tc, _) = granted(acquire(&mut a, "report/july", "lease-a", 5_000)?)?;
    let tc = token(&tc)?;
    ensure!(tc.grant_order(&new).is_gt(), "{tc:?} not above {tb}");

    // The stored state is the component's lease state, as every
    // coordinator stores it.
    let stored: Vec<u8> = a
        .query_first("SELECT state FROM fencecheck.leases WHERE name = 'report/july'")?
        .context("no lease row")?;
    let info = fencecheck_tests::runtime()?
        .instance()?
        .inspect_lease(&stored)?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(info.lock == "report/july" && info.authority == tc.authority);
    ensure!(
        (info.epoch, info.counter) == (tc.epoch, tc.counter),
        "{info:?}"
    );
    let holder = info.holder.context("no holder")?;
    ensure!(
        holder.lease_id == "lease-a" && holder.token == tc && holder.expires_at == 13_000,
        "{holder:?}"
    );
    Ok(())
}

/// Eight clients take turns on one lock (a fresh one, so the first
/// acquires race to create its row): each grant is used for one fenced
/// write with an audit row in the same transaction, then released. In
/// audit (commit) order the tokens strictly increase, their counters are
/// exactly 1..=n (no grant lost or issued twice), and no write was refused.
#[test]
fn eight_clients_grants_strictly_increase() -> Result<()> {
    const CLIENTS: usize = 8;
    const GRANTS: usize = 6;
    let server = Server::start()?;
    let mut conn = server.conn()?;
    conn.query_drop(DOC)?;
    conn.query_drop("INSERT INTO doc VALUES ('stress', 'v0', NULL)")?;
    conn.query_drop(
        "CREATE TABLE audit (id BIGINT AUTO_INCREMENT PRIMARY KEY,
             token VARCHAR(100) NOT NULL, client INT NOT NULL) ENGINE=InnoDB",
    )?;
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let mut handles = Vec::new();
    for client in 0..CLIENTS {
        let mut c = server.conn()?;
        let barrier = Arc::clone(&barrier);
        handles.push(thread::spawn(move || -> Result<u64> {
            barrier.wait();
            let mut busy = 0;
            for n in 0..GRANTS {
                let lease_id = format!("c{client}-{n}");
                // Long ttl: nothing expires, so the lock changes hands
                // only by release; busy answers are retried at once.
                let tok = loop {
                    match acquire(&mut c, "stress", lease_id.as_str(), 600_000)? {
                        Acquired::Granted { token, .. } => break token,
                        Acquired::Busy { .. } => busy += 1,
                        other => bail!("client {client}: {other:?}"),
                    }
                };
                c.query_drop("START TRANSACTION")?;
                let changed = write(&mut c, "stress", &tok, &lease_id)
                    .with_context(|| format!("client {client} writing with {tok}"))?;
                ensure!(changed == 1, "{changed} rows");
                c.exec_drop(
                    "INSERT INTO audit (token, client) VALUES (?, ?)",
                    (&tok, client),
                )?;
                c.query_drop("COMMIT")?;
                let released = release(&mut c, "stress", lease_id.as_str(), tok.as_str())?;
                ensure!(released.as_deref() == Some("released"));
            }
            Ok(busy)
        }));
    }
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
    }
    let audit: Vec<String> = conn.query("SELECT token FROM audit ORDER BY id")?;
    ensure!(audit.len() == CLIENTS * GRANTS, "{} audited", audit.len());
    let issued = audit
        .iter()
        .map(|t| Ok(("stress".to_string(), token(t)?)))
        .collect::<Result<Vec<_>>>()?;
    fencecheck_tests::history::check_issued(&issued)?;
    let counters: Vec<u64> = issued.iter().map(|(_, t)| t.counter).collect();
    let expected: Vec<u64> = (1..=(CLIENTS * GRANTS) as u64).collect();
    ensure!(counters == expected, "{counters:?}");
    let last = audit.last().context("empty audit")?;
    let writer: Option<String> = conn.exec_first(
        "SELECT CONCAT('c', client) FROM audit WHERE token = ?",
        (last,),
    )?;
    let final_body = body(&mut conn, "stress")?;
    ensure!(writer.is_some_and(|w| final_body.starts_with(&format!("{w}-"))));
    Ok(())
}

/// A SIGKILL and restart lose nothing: the authority, the counter (the
/// next grant continues from it) and an unexpired holder (another lease id
/// is busy until the holder releases). `fencecheck.restore` then starts a
/// new epoch above every earlier token.
#[test]
fn restart_keeps_the_counter_and_the_holder() -> Result<()> {
    let mut server = Server::start()?;
    let mut conn = server.conn()?;
    for id in ["a1", "a2"] {
        let (t, _) = granted(acquire(&mut conn, "r", id, 1_000)?)?;
        ensure!(release(&mut conn, "r", id, t.as_str())?.as_deref() == Some("released"));
    }
    let (held, _) = granted(acquire(&mut conn, "r", "a3", 3_600_000)?)?;
    ensure!(token(&held)?.counter == 3, "{held}");
    drop(conn);
    server.kill9()?;
    server.restart()?;
    let mut conn = server.conn()?;
    let busy = acquire(&mut conn, "r", "b", 1_000)?;
    ensure!(
        matches!(&busy, Acquired::Busy { holder, .. } if holder == "a3"),
        "{busy:?}"
    );
    ensure!(release(&mut conn, "r", "a3", held.as_str())?.as_deref() == Some("released"));
    let (next, _) = granted(acquire(&mut conn, "r", "b", 1_000)?)?;
    ensure!(release(&mut conn, "r", "b", next.as_str())?.as_deref() == Some("released"));
    let (held, next) = (token(&held)?, token(&next)?);
    ensure!(
        next.authority == held.authority && (next.epoch, next.counter) == (0, 4),
        "{next:?}"
    );

    // Restore (after a backup or a failover): the floor rises, and the
    // next grant starts the new epoch, above every earlier token.
    let restored: Option<(String, u64)> = conn.query_first("CALL fencecheck.restore(NULL)")?;
    let floor = restored.context("no restore answer")?.1;
    ensure!(floor > 1, "{floor}");
    let (after, _) = granted(acquire(&mut conn, "r", "c", 1_000)?)?;
    let after = token(&after)?;
    ensure!((after.epoch, after.counter) == (floor, 1), "{after:?}");
    ensure!(after.grant_order(&next).is_gt());
    Ok(())
}

/// Every bad argument, a damaged stored state, a call inside an open
/// transaction and the test clock on a production server are refused with
/// a named error and SQLSTATE (a lock wait timeout keeps MariaDB's own);
/// none changes a lease, the caller's transaction survives the
/// in-transaction refusal, the server stays up.
#[test]
fn bad_input_is_refused_and_changes_nothing() -> Result<()> {
    let server = Server::start()?;
    let mut conn = server.conn()?;
    let (held, _) = granted(acquire(&mut conn, "held", "h", 3_600_000)?)?;
    conn.query_drop("INSERT INTO fencecheck.leases VALUES ('damaged', x'4c5301')")?;
    let snapshot = |conn: &mut Conn| -> mysql::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        conn.query("SELECT name, state FROM fencecheck.leases ORDER BY name")
    };
    let before = snapshot(&mut conn)?;

    let long_lock = "x".repeat(1025);
    let long_id = "i".repeat(257);
    let n = Value::NULL;
    let acquires: Vec<([Value; 3], &str, &str)> = vec![
        (
            [n.clone(), "a".into(), 1000.into()],
            "5F012",
            "invalid-argument: lock must be a string, got NULL",
        ),
        (
            ["".into(), "a".into(), 1000.into()],
            "5F005",
            "invalid-request: empty-lock",
        ),
        (
            [long_lock.as_str().into(), "a".into(), 1000.into()],
            "5F005",
            "invalid-request: lock-too-long",
        ),
        (
            ["l".into(), n.clone(), 1000.into()],
            "5F012",
            "invalid-argument: lease_id must be a string, got NULL",
        ),
        (
            ["l".into(), "".into(), 1000.into()],
            "5F005",
            "invalid-request: empty-lease-id",
        ),
        (
            ["l".into(), long_id.as_str().into(), 1000.into()],
            "5F005",
            "invalid-request: lease-id-too-long",
        ),
        (
            ["l".into(), vec![0xffu8].into(), 1000.into()],
            "5F012",
            "invalid-argument: lease_id is not valid UTF-8",
        ),
        (
            ["l".into(), "a".into(), 0.into()],
            "5F005",
            "invalid-request: zero-ttl",
        ),
        (
            ["l".into(), "a".into(), (-1).into()],
            "5F012",
            "invalid-argument: ttl_ms must be a whole number",
        ),
        (
            ["l".into(), "a".into(), "abc".into()],
            "5F012",
            "invalid-argument: ttl_ms must be a whole number",
        ),
        (
            ["l".into(), "a".into(), 1.5.into()],
            "5F012",
            "invalid-argument: ttl_ms must be a whole number",
        ),
        (
            ["l".into(), "a".into(), n.clone()],
            "5F012",
            "invalid-argument: ttl_ms must be a whole number",
        ),
        (
            ["l".into(), "a".into(), "18446744073709551616".into()],
            "5F012",
            "invalid-argument: ttl_ms must be a whole number",
        ),
        (
            ["l".into(), "a".into(), u64::MAX.into()],
            "5F005",
            "invalid-request: expiry-overflow",
        ),
        (
            ["damaged".into(), "a".into(), 1000.into()],
            "5F006",
            "corrupt-state: ",
        ),
    ];
    for ([lock, id, ttl], sqlstate, start) in acquires {
        let shown = format!("{lock:?} {id:?} {ttl:?}");
        let (_, state, msg) = error_of(acquire(&mut conn, lock, id, ttl))
            .with_context(|| format!("acquire {}", &shown[..shown.len().min(80)]))?;
        ensure!(state == sqlstate && msg.starts_with(start), "{state} {msg}");
    }
    let others: Vec<(mysql::Result<Option<String>>, &str, &str)> = vec![
        (
            renew(&mut conn, "held", "h", "garbage", 1000).map(|r| r.map(|v| v.0)),
            "5F004",
            "invalid-token: ",
        ),
        (
            renew(&mut conn, "held", "h", n.clone(), 1000).map(|r| r.map(|v| v.0)),
            "5F012",
            "invalid-argument: token must be a string, got NULL",
        ),
        (
            renew(&mut conn, "held", "h", held.as_str(), 0).map(|r| r.map(|v| v.0)),
            "5F005",
            "invalid-request: zero-ttl",
        ),
        (
            renew(&mut conn, "held", "other", held.as_str(), 1000).map(|r| r.map(|v| v.0)),
            "5F017",
            "lost: ",
        ),
        (
            renew(&mut conn, "never", "h", "0.1", 1000).map(|r| r.map(|v| v.0)),
            "5F017",
            "lost: ",
        ),
        (
            renew(&mut conn, n.clone(), "h", held.as_str(), 1000).map(|r| r.map(|v| v.0)),
            "5F012",
            "invalid-argument: lock must be a string",
        ),
        (
            release(&mut conn, "held", "h", "9.9"),
            "5F018",
            "not-owner: ",
        ),
        (
            release(&mut conn, "held", "", held.as_str()),
            "5F005",
            "invalid-request: empty-lease-id",
        ),
        (
            release(&mut conn, "damaged", "h", "0.1"),
            "5F006",
            "corrupt-state: ",
        ),
    ];
    for (i, (result, sqlstate, start)) in others.into_iter().enumerate() {
        let (_, state, msg) = error_of(result).with_context(|| format!("call {i}"))?;
        ensure!(state == sqlstate && msg.starts_with(start), "{state} {msg}");
    }

    // The UDFs themselves: wrong counts, wrong types, a damaged state.
    for (sql, start) in [
        (
            "SELECT fence_lease_acquire(1, 2)",
            "invalid-argument: expected 7 arguments, got 2",
        ),
        (
            "SELECT fence_lease_acquire(1, 'l', 'a', 1000, 1, 0, NULL)",
            "invalid-argument: state must be bytes or NULL, got INTEGER",
        ),
        (
            "SELECT fence_lease_acquire(x'4c53', 'l', 'a', 1000, 1, 0, NULL)",
            "corrupt-state: ",
        ),
        (
            "SELECT fence_lease_acquire(NULL, 'l', 'a', 1000, -5, 0, NULL)",
            "invalid-argument: authority must be a whole number",
        ),
        (
            "SELECT fence_lease_renew(NULL, 'a', '0.1', 1000, 1.5, NULL)",
            "invalid-argument: authority must be a whole number",
        ),
        (
            "SELECT fence_lease_release(NULL, 'a', '0.1')",
            "invalid-argument: expected 4 arguments, got 3",
        ),
    ] {
        let (_, _, msg) = error_of(conn.query::<mysql::Row, _>(sql)).context(sql)?;
        ensure!(msg.contains(start), "{sql}: {msg}");
    }

    // The test clock is refused on a server without it.
    set_clock(&mut conn, 5)?;
    let (_, state, msg) = error_of(acquire(&mut conn, "l", "a", 1000))?;
    ensure!(
        state == "5F012" && msg.contains("FENCECHECK_MARIADB_TEST_CLOCK"),
        "{state} {msg}"
    );
    conn.query_drop("SET @fencecheck_now_ms = NULL")?;

    // Inside the caller's transaction: refused, the transaction untouched.
    conn.query_drop("CREATE TABLE t (v INT) ENGINE=InnoDB")?;
    conn.query_drop("START TRANSACTION")?;
    conn.query_drop("INSERT INTO t VALUES (1)")?;
    let (_, state, msg) = error_of(acquire(&mut conn, "l", "a", 1000))?;
    ensure!(
        state == "5F020" && msg.starts_with("in-transaction: "),
        "{state} {msg}"
    );
    let open: Option<(i64, i64)> =
        conn.query_first("SELECT @@in_transaction, (SELECT COUNT(*) FROM t)")?;
    ensure!(open == Some((1, 1)), "{open:?}");
    conn.query_drop("ROLLBACK")?;

    // An infrastructure error (a lock wait timeout) keeps its own code.
    let mut other = server.conn()?;
    other.query_drop("START TRANSACTION")?;
    other.query_drop("SELECT state FROM fencecheck.leases WHERE name = 'held' FOR UPDATE")?;
    conn.query_drop("SET SESSION innodb_lock_wait_timeout = 1")?;
    let (code, state, msg) = error_of(acquire(&mut conn, "held", "h", 1000))?;
    ensure!(code == 1205 && state == "HY000", "{code} {state} {msg}");
    other.query_drop("ROLLBACK")?;

    conn.query_drop("START TRANSACTION")?;
    let (_, state, _) = error_of(conn.query_drop("CALL fencecheck.restore(NULL)"))?;
    ensure!(state == "5F020", "{state}");
    conn.query_drop("ROLLBACK")?;

    ensure!(
        snapshot(&mut conn)? == before,
        "a refused call changed a lease"
    );
    ensure!(server.answers(), "the server died: {}", server.log());
    Ok(())
}

/// A client granted EXECUTE on the three lease procedures (and nothing in
/// `fencecheck`) is granted leases, but cannot write the lease table
/// (forging a state) or raise the floor.
#[test]
fn clients_need_only_execute() -> Result<()> {
    let server = Server::start()?;
    let mut root = server.conn()?;
    root.query_drop("CREATE USER client IDENTIFIED BY 'pw'")?;
    root.query_drop("GRANT SELECT ON app.* TO client")?;
    for p in ["acquire", "renew", "release"] {
        root.query_drop(format!(
            "GRANT EXECUTE ON PROCEDURE fencecheck.{p} TO client"
        ))?;
    }
    let mut client = server.conn_as("client")?;
    let (t, _) = granted(acquire(&mut client, "l", "a", 60_000)?)?;
    let renewed = renew(&mut client, "l", "a", t.as_str(), 60_000)?;
    ensure!(renewed.is_some_and(|(o, _)| o == "renewed"));
    for sql in [
        "UPDATE fencecheck.leases SET state = NULL",
        "DELETE FROM fencecheck.leases",
        "UPDATE fencecheck.authority SET epoch_floor = 0",
        "CALL fencecheck.restore(1)",
    ] {
        let (code, _, msg) = error_of(client.query_drop(sql)).context(sql)?;
        ensure!(matches!(code, 1142 | 1370), "{sql}: {code} {msg}");
    }
    ensure!(release(&mut client, "l", "a", t.as_str())?.as_deref() == Some("released"));
    Ok(())
}
