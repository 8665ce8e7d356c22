//! PostgresCoordinator against a real server: the grant rules, restore,
//! layout refusal, and two coordinators on one database under load and
//! across `pg_ctl stop -m immediate`, history-checked.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use fencecheck::Token;
use fencecheck_authority::{
    AcquireOutcome, AuthorityError, Coordinator, ManualClock, PostgresCoordinator, ReleaseOutcome,
    RenewOutcome,
};
use fencecheck_tests::pgserver::PgServer;

use crate::lease_history;

fn coordinator(server: &PgServer, clock: &Arc<ManualClock>) -> Result<PostgresCoordinator> {
    Ok(PostgresCoordinator::open(
        &server.url(),
        fencecheck_tests::runtime()?,
        clock.clone(),
    )?)
}

fn granted(outcome: AcquireOutcome) -> Result<Token> {
    match outcome {
        AcquireOutcome::Acquired(grant) => Ok(grant.token),
        other => bail!("not granted: {other:?}"),
    }
}

/// Acquire, busy, renew, release, expiry and restore behave as the
/// component's rules say, and both coordinators share one authority id.
#[test]
fn grant_rules_and_restore() -> Result<()> {
    let server = PgServer::start()?;
    let clock = Arc::new(ManualClock::new(0));
    let a = coordinator(&server, &clock)?;
    let b = coordinator(&server, &clock)?;
    ensure!(a.authority() == b.authority() && a.authority() != 0);
    let t1 = granted(a.acquire("report/july", "a7", 30_000)?)?;
    ensure!(matches!(
        b.acquire("report/july", "b9", 30_000)?,
        AcquireOutcome::Busy { .. }
    ));
    ensure!(matches!(
        b.renew("report/july", "a7", t1, 30_000)?,
        RenewOutcome::Renewed { .. }
    ));
    ensure!(matches!(
        a.release("report/july", "b9", t1)?,
        ReleaseOutcome::NotOwner
    ));
    clock.advance(60_001);
    let t2 = granted(b.acquire("report/july", "b9", 30_000)?)?;
    ensure!(t2.grant_order(&t1).is_gt(), "{t2:?} after {t1:?}");
    ensure!(matches!(
        a.renew("report/july", "a7", t1, 30_000)?,
        RenewOutcome::Lost
    ));
    ensure!(matches!(
        b.release("report/july", "b9", t2)?,
        ReleaseOutcome::Released
    ));
    let floor = a.restore(1_000)?;
    ensure!(floor >= 1_000);
    let t3 = granted(b.acquire("report/july", "c1", 30_000)?)?;
    ensure!(t3.epoch == floor && t3.counter == 1, "{t3:?}");
    Ok(())
}

/// Another `authority-layout` number is refused and nothing is created.
#[test]
fn unknown_layout_is_refused() -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    db.batch_execute(
        "CREATE TABLE fencecheck_meta (key text PRIMARY KEY, value bigint NOT NULL);
         INSERT INTO fencecheck_meta VALUES ('authority-layout', 3);",
    )?;
    let clock = Arc::new(ManualClock::new(0));
    match coordinator(&server, &clock) {
        Err(e) => match e.downcast_ref::<AuthorityError>() {
            Some(AuthorityError::UnsupportedLayout(found)) if found == "3" => {}
            _ => bail!("{e}"),
        },
        Ok(_) => bail!("layout 3 accepted"),
    }
    let created: bool = db
        .query_one("SELECT to_regclass('fencecheck_leases') IS NOT NULL", &[])?
        .get(0);
    ensure!(!created);
    Ok(())
}

/// A layout-1 database (before `moved_to`) is upgraded in place on open:
/// lineage and floor kept, layout number 2.
#[test]
fn layout_1_is_upgraded_in_place() -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    db.batch_execute(
        "CREATE TABLE fencecheck_meta (key text PRIMARY KEY, value bigint NOT NULL);
         INSERT INTO fencecheck_meta VALUES ('authority-layout', 1);
         CREATE TABLE fencecheck_authority (
             id integer PRIMARY KEY CHECK (id = 1),
             authority bigint NOT NULL, epoch_floor bigint NOT NULL);
         INSERT INTO fencecheck_authority VALUES (1, 77, 5);
         CREATE TABLE fencecheck_leases (lock text PRIMARY KEY, state bytea NOT NULL);",
    )?;
    let clock = Arc::new(ManualClock::new(0));
    let coordinator = coordinator(&server, &clock)?;
    ensure!(coordinator.authority() == 77);
    match coordinator.acquire("a", "x", 1_000)? {
        AcquireOutcome::Acquired(g) => ensure!(g.token == Token::new(77, 5, 1), "{g:?}"),
        other => bail!("{other:?}"),
    }
    let layout: i64 = db
        .query_one(
            "SELECT value FROM fencecheck_meta WHERE key = 'authority-layout'",
            &[],
        )?
        .get(0);
    ensure!(layout == 2);
    Ok(())
}

/// One grant as a client saw it: when its request was sent and when the
/// answer came back.
#[derive(Clone, Debug)]
struct Grant {
    lock: String,
    lease_id: String,
    token: Token,
    sent: Instant,
    answered: Instant,
}

/// Two coordinators (separate connections, as two processes would have) and
/// eight clients acquire and release 4 locks, while the server is killed
/// and restarted: for any two grants of a lock where one was answered
/// before the other was requested, the later token is greater (a grant
/// holds the lock until released or expired), and no token repeats.
#[test]
fn two_coordinators_never_issue_a_repeated_or_lower_token() -> Result<()> {
    let server = PgServer::start()?;
    let clock = Arc::new(ManualClock::new(0));
    let coordinators = [
        Arc::new(coordinator(&server, &clock)?),
        Arc::new(coordinator(&server, &clock)?),
    ];
    // Every stored lease state, in the order each lock's row lock let its
    // writers commit (the log's sequence is taken under that lock).
    server.client()?.batch_execute(
        "CREATE TABLE lease_log (seq bigserial PRIMARY KEY, lock text NOT NULL, state bytea NOT NULL);
         CREATE FUNCTION log_lease() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO lease_log (lock, state) VALUES (NEW.lock, NEW.state); RETURN NULL; END $$;
         CREATE TRIGGER lease_log AFTER INSERT OR UPDATE ON fencecheck_leases
             FOR EACH ROW EXECUTE FUNCTION log_lease();",
    )?;
    let grants = Arc::new(Mutex::new(Vec::<Grant>::new()));
    let unknown = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..8usize {
        let (coordinator, grants, unknown, stop) = (
            coordinators[c % 2].clone(),
            grants.clone(),
            unknown.clone(),
            stop.clone(),
        );
        clients.push(thread::spawn(move || -> Result<usize> {
            let (mut errors, mut mine) = (0, 0);
            // Until 60 grants each, bounded: the outage eats attempts.
            for i in 0..5_000usize {
                if stop.load(Ordering::SeqCst) || mine == 60 {
                    break;
                }
                let lock = format!("lock-{}", (c + i) % 4);
                let id = format!("c{c}-{i}");
                let sent = Instant::now();
                match coordinator.acquire(&lock, &id, 1_000) {
                    Ok(AcquireOutcome::Acquired(g)) => {
                        let answered = Instant::now();
                        mine += 1;
                        grants
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .push(Grant {
                                lock: lock.clone(),
                                lease_id: id.clone(),
                                token: g.token,
                                sent,
                                answered,
                            });
                        if coordinator.release(&lock, &id, g.token).is_err() {
                            errors += 1;
                        }
                    }
                    Ok(_) => {}
                    // The server is down: the coordinator reconnects on
                    // its next call.
                    Err(e) => {
                        // It may have committed before the answer was lost.
                        unknown
                            .lock()
                            .map_err(|_| anyhow::anyhow!("poisoned"))?
                            .push(id.clone());
                        if errors % 50 == 0 {
                            eprintln!("client {c}: {e}");
                        }
                        errors += 1;
                        thread::sleep(Duration::from_millis(20));
                    }
                }
            }
            Ok(errors)
        }));
    }
    // Mid-run: kill the server, let leases whose release was lost expire,
    // restart.
    while grants
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .len()
        < 200
    {
        thread::sleep(Duration::from_millis(5));
    }
    server.stop_immediate()?;
    clock.advance(2_000);
    server.pg_ctl_start()?;
    for c in clients {
        c.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
    }
    stop.store(true, Ordering::SeqCst);
    let grants = grants
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    ensure!(grants.len() > 400, "only {} grants", grants.len());
    for a in &grants {
        for b in &grants {
            if a.lock == b.lock && a.answered < b.sent {
                ensure!(
                    b.token.grant_order(&a.token).is_gt(),
                    "{b:?} requested after {a:?} was granted, with a token not above it"
                );
            }
        }
    }
    let states: Vec<(String, Vec<u8>)> = server
        .client()?
        .query("SELECT lock, state FROM lease_log ORDER BY seq", &[])?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let stored = lease_history::grants(&states)?;
    fencecheck_tests::history::check_issued(&lease_history::issued(&stored))?;
    let acked: Vec<(String, String, Token)> = grants
        .iter()
        .map(|g| (g.lock.clone(), g.lease_id.clone(), g.token))
        .collect();
    let unknown = unknown
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    lease_history::account(&acked, &unknown, &stored)?;
    Ok(())
}
