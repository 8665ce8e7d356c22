//! Failing a PostgreSQL coordinator over to an asynchronous streaming
//! replica (issue 15, item 3).
//!
//! The old primary grants tokens; the replica has received only the first
//! of them when the primary dies (`pg_ctl stop -m immediate`), and is
//! promoted. The lost grants are made deterministic, not timed: the replica
//! first replays everything the primary wrote, then stops receiving WAL
//! (`PgServer::stop_streaming`, confirmed on both sides) before the grants
//! that are to be lost. Resources (the SQLite adapter) accepted those
//! grants' tokens all the same.
//!
//! Without `restore`, a coordinator on the promoted database issues tokens
//! that repeat the lost ones or go below them: the resources that saw the
//! lost tokens refuse them. With `restore` on the promoted database first
//! (the runbook in docs/authority.md), every later grant compares above every
//! token the old primary issued, lost or not.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail, ensure};
use fencecheck::{Fenced, Instance, Policy, Rejection, Request, Token};
use fencecheck_authority::{
    AcquireOutcome, Coordinator, ManualClock, PostgresCoordinator, ReleaseOutcome, RenewOutcome,
};
use fencecheck_tests::pgserver::PgServer;

/// Granted, released, replicated; then granted twice more, not replicated
/// (the last holder still holds it when the primary dies).
const REPORT: &str = "report/july";
/// First granted after the replica stopped receiving: the promoted database
/// has never heard of it.
const INVOICE: &str = "invoice/aug";
const TTL: u64 = 30_000;

fn coordinator(server: &PgServer, clock: &Arc<ManualClock>) -> Result<PostgresCoordinator> {
    Ok(PostgresCoordinator::open(
        &server.url(),
        fencecheck_tests::runtime()?,
        clock.clone(),
    )?)
}

fn grant(coordinator: &PostgresCoordinator, lock: &str, lease_id: &str) -> Result<Token> {
    match coordinator.acquire(lock, lease_id, TTL)? {
        AcquireOutcome::Acquired(g) => Ok(g.token),
        AcquireOutcome::Busy { holder, .. } => bail!("{lock} busy: held by {holder}"),
    }
}

fn release(
    coordinator: &PostgresCoordinator,
    lock: &str,
    lease_id: &str,
    token: Token,
) -> Result<()> {
    match coordinator.release(lock, lease_id, token)? {
        ReleaseOutcome::Released => Ok(()),
        other => bail!("release of {lock} by {lease_id}: {other:?}"),
    }
}

/// What the CLI's `authority restore` passes by default: the Unix time in ms.
fn now_ms() -> Result<u64> {
    Ok(u64::try_from(
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis(),
    )?)
}

/// A resource: a SQLite database written through the fence
/// (`fencecheck_sqlite::fenced_write`, strict policy).
struct Resource {
    conn: rusqlite::Connection,
}

impl Resource {
    fn open(path: &Path) -> Result<Self> {
        let conn = rusqlite::Connection::open(path)?;
        fencecheck_sqlite::install(&conn)?;
        Ok(Self { conn })
    }

    /// Write `lock` with `token`: `true` if applied, `false` if refused as
    /// stale; any other answer is an error.
    fn write(&mut self, guest: &mut Instance, lock: &str, token: Token) -> Result<bool> {
        let request = Request::new(lock, token, Policy::Strict);
        match fencecheck_sqlite::fenced_write(&mut self.conn, guest, &request, |_, _| {
            Ok::<_, rusqlite::Error>(())
        })? {
            Fenced::Applied { .. } => Ok(true),
            Fenced::Rejected(Rejection::StaleFence { .. }) => Ok(false),
            Fenced::Rejected(other) => bail!("{lock} {token:?}: {}", other.name()),
        }
    }
}

/// The state after the failover: the old primary is dead, the replica is
/// promoted and nothing has been granted on it yet.
struct Failover {
    promoted: PgServer,
    clock: Arc<ManualClock>,
    /// The old primary's grants the promoted database has.
    replicated: Vec<(&'static str, Token)>,
    /// The old primary's grants it never received, in grant order.
    lost: Vec<(&'static str, Token)>,
    guest: Instance,
    /// Accepted every token the old primary issued.
    saw_all: Resource,
    /// Accepted only the replicated grant's token: the lost holders never
    /// wrote here.
    saw_replicated: Resource,
    // Last: the dead primary's directory outlives nothing that needs it.
    _primary: PgServer,
    _dir: tempfile::TempDir,
}

impl Failover {
    fn issued(&self) -> impl Iterator<Item = &(&'static str, Token)> {
        self.replicated.iter().chain(&self.lost)
    }
}

/// Primary and replica, grants on the primary (the last ones lost to the
/// replica), resources that accepted them, primary killed, replica
/// promoted.
fn fail_over() -> Result<Failover> {
    let dir = tempfile::tempdir()?;
    let mut guest = fencecheck_tests::runtime()?.instance()?;
    let mut saw_all = Resource::open(&dir.path().join("saw-all.db"))?;
    let mut saw_replicated = Resource::open(&dir.path().join("saw-replicated.db"))?;

    let primary = PgServer::start_primary()?;
    let clock = Arc::new(ManualClock::new(0));
    let old = coordinator(&primary, &clock)?;
    let replica = PgServer::replica_of(&primary)?;

    // Replicated: granted, used at both resources, released.
    let t1 = grant(&old, REPORT, "a1")?;
    ensure!(saw_all.write(&mut guest, REPORT, t1)?);
    ensure!(saw_replicated.write(&mut guest, REPORT, t1)?);
    release(&old, REPORT, "a1", t1)?;
    replica.catch_up(&primary)?;

    // From here on the primary commits what the replica never receives, as
    // an asynchronous replica a little behind would at the crash.
    replica.stop_streaming(Some(&primary))?;
    let t2 = grant(&old, REPORT, "a2")?;
    ensure!(saw_all.write(&mut guest, REPORT, t2)?);
    release(&old, REPORT, "a2", t2)?;
    let t3 = grant(&old, REPORT, "a3")?;
    ensure!(saw_all.write(&mut guest, REPORT, t3)?);
    let i1 = grant(&old, INVOICE, "c1")?;
    ensure!(saw_all.write(&mut guest, INVOICE, i1)?);
    drop(old);

    primary.stop_immediate()?;
    replica.promote()?;
    Ok(Failover {
        promoted: replica,
        clock,
        replicated: vec![(REPORT, t1)],
        lost: vec![(REPORT, t2), (REPORT, t3), (INVOICE, i1)],
        guest,
        saw_all,
        saw_replicated,
        _primary: primary,
        _dir: dir,
    })
}

/// Without `restore`, a coordinator on the promoted replica grants tokens
/// that repeat a lost grant (to another holder) or compare below one; the
/// resources that accepted the lost tokens refuse them, a resource that did
/// not accepts them.
#[test]
fn without_restore_the_promoted_replica_repeats_and_lowers_lost_tokens() -> Result<()> {
    let mut f = fail_over()?;
    let [(_, t1)] = f.replicated[..] else {
        bail!("{:?}", f.replicated)
    };
    let [(_, t2), (_, t3), (_, i1)] = f.lost[..] else {
        bail!("{:?}", f.lost)
    };
    let new = coordinator(&f.promoted, &f.clock)?;
    ensure!(
        new.authority() == t1.authority,
        "the lineage was replicated"
    );

    // The promoted database knows only a1's released lease: the lock looks
    // free although a3 holds it, and the counter resumes after t1.
    let b1 = grant(&new, REPORT, "b1")?;
    ensure!(b1 == t2, "repeats the lost grant to a2: {b1:?} vs {t2:?}");
    ensure!(b1.grant_order(&t3).is_lt(), "below the lost {t3:?}: {b1:?}");
    let d1 = grant(&new, INVOICE, "d1")?;
    ensure!(d1 == i1, "repeats the lost grant to c1: {d1:?} vs {i1:?}");

    // Resources that accepted the lost tokens refuse the repeated and the
    // lower ones (strict: an equal token is stale too)…
    ensure!(!f.saw_all.write(&mut f.guest, REPORT, b1)?);
    ensure!(!f.saw_all.write(&mut f.guest, INVOICE, d1)?);
    // …but one the lost holders never reached takes b1's: b1 and a2 now
    // hold the same token, and a3 a higher one, for the same lock.
    ensure!(f.saw_replicated.write(&mut f.guest, REPORT, b1)?);

    // A late restore still fixes every grant after it.
    let floor = new.restore(now_ms()?)?;
    release(&new, REPORT, "b1", b1)?;
    let b2 = grant(&new, REPORT, "b2")?;
    ensure!(b2.epoch == floor && b2.counter == 1, "{b2:?}");
    for (_, earlier) in f.issued().filter(|(l, _)| *l == REPORT) {
        ensure!(b2.grant_order(earlier).is_gt(), "{b2:?} vs {earlier:?}");
    }
    ensure!(f.saw_all.write(&mut f.guest, REPORT, b2)?);
    ensure!(f.saw_replicated.write(&mut f.guest, REPORT, b2)?);
    Ok(())
}

/// The runbook: `restore` on the promoted replica before any grant makes
/// every later grant of every lock (the lost ones' locks, a lock never
/// granted) compare above every token the old primary issued, lost or
/// not; every resource accepts the new tokens and still refuses every old
/// one.
#[test]
fn restore_on_the_promoted_replica_puts_every_grant_above_the_lost_ones() -> Result<()> {
    let mut f = fail_over()?;
    let new = coordinator(&f.promoted, &f.clock)?;
    let at_least = now_ms()?;
    let floor = new.restore(at_least)?;
    ensure!(floor >= at_least);
    let issued: Vec<(&str, Token)> = f.issued().copied().collect();
    ensure!(
        issued.iter().all(|(_, t)| t.epoch < floor),
        "floor {floor} vs {issued:?}"
    );

    for lock in [REPORT, INVOICE, "never/granted"] {
        let mut earlier: Vec<Token> = issued
            .iter()
            .filter(|(l, _)| *l == lock)
            .map(|(_, t)| *t)
            .collect();
        for n in 1..=3u64 {
            let lease = format!("{lock}#{n}");
            let token = grant(&new, lock, &lease)?;
            ensure!(token.authority == new.authority());
            ensure!(token.epoch == floor && token.counter == n, "{token:?}");
            for e in &earlier {
                ensure!(
                    token.grant_order(e).is_gt(),
                    "{lock}: {token:?} not above {e:?}"
                );
            }
            for resource in [&mut f.saw_all, &mut f.saw_replicated] {
                ensure!(
                    resource.write(&mut f.guest, lock, token)?,
                    "{lock}: {token:?} refused"
                );
                for e in &earlier {
                    ensure!(
                        !resource.write(&mut f.guest, lock, *e)?,
                        "{lock}: old {e:?} accepted after {token:?}"
                    );
                }
            }
            release(&new, lock, &lease, token)?;
            earlier.push(token);
        }
    }
    // The lost holder a3 still believes it holds report/july: its token is
    // refused everywhere, its renewal on the promoted database fails.
    let (_, t3) = f.lost[1];
    ensure!(matches!(
        new.renew(REPORT, "a3", t3, TTL)?,
        RenewOutcome::Lost
    ));
    Ok(())
}
