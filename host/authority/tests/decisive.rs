//! The seed's decisive tests, end to end: the SQLite coordinator (on a fake
//! clock), the component, and a SQLite resource. Interleavings are forced
//! with channels and explicit clock moves, never with sleeps.

use crate::common;

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use anyhow::{Result, bail, ensure};
use common::{Catalog, TempDir, World};
use fencecheck::{Policy, Token};
use fencecheck_authority::{
    AcquireOutcome, AcquireResult, AuthorityError, Client, Coordinator, DriftBound, Grant, Lease,
    ManualClock, ReleaseOutcome, RenewOutcome, WriteError, WriteOutcome,
};

const LOCK: &str = "report/july";
const TTL: u64 = 30_000;

fn acquired(result: AcquireResult) -> Result<Lease> {
    match result {
        AcquireResult::Acquired(lease) => Ok(lease),
        AcquireResult::Busy { holder, .. } => bail!("busy: held by {holder}"),
        AcquireResult::Unavailable(e) => bail!("unavailable: {e}"),
    }
}

/// Owner A pauses past its lease's expiry, B acquires and publishes, A
/// resumes and publishes: B stays visible and A gets `stale-fence`, which
/// also marks A's lease lost (its renewal is refused too).
#[test]
fn paused_owner_is_fenced() -> Result<()> {
    let dir = TempDir::new("paused")?;
    let db = dir.join("fence.db");
    let world = World::on_file(&db)?;
    let a_clock = Arc::new(ManualClock::new(0));
    let a_client = world.client(a_clock.clone());

    let (resume_a, a_paused) = mpsc::channel::<()>();
    let (a_staged, staged) = mpsc::channel::<Token>();
    let a_db = db.clone();
    let writer_a = thread::spawn(move || -> Result<(WriteOutcome, bool)> {
        let mut lease = acquired(a_client.acquire(LOCK, "a7", TTL))?;
        let mut catalog = Catalog::open(&a_db)?;
        catalog.stage("reports/july/a7", "A's report")?;
        a_staged.send(lease.token())?;
        a_paused.recv()?; // the pause: GC, VM suspension, …
        // A's own check of its lease would say "valid" (its clock stood
        // still): only the fence can stop it.
        let request = lease.request(Policy::Strict);
        let outcome = lease.write(request, |r| catalog.publish(r, "reports/july/a7"));
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => bail!("A's write failed instead of being fenced: {e}"),
        };
        Ok((outcome, lease.renew()?))
    });

    let token_a = staged.recv()?;
    world.coordinator_clock.advance(TTL); // A's lease expires at the coordinator
    let b_client = world.client(Arc::new(ManualClock::new(0)));
    let mut lease_b = acquired(b_client.acquire(LOCK, "b9", TTL))?;
    ensure!(
        lease_b.token().grant_order(&token_a).is_gt(),
        "B's token must be newer"
    );
    let mut catalog = Catalog::open(&db)?;
    catalog.stage("reports/july/b9", "B's report")?;
    let request = lease_b.request(Policy::Strict);
    let b_outcome = lease_b.write(request, |r| catalog.publish(r, "reports/july/b9"));
    ensure!(
        matches!(b_outcome, Ok(WriteOutcome::Applied { version: 1 })),
        "{b_outcome:?}"
    );

    resume_a.send(())?;
    let (a_outcome, a_still_held) = writer_a
        .join()
        .map_err(|_| anyhow::anyhow!("writer A panicked"))??;
    ensure!(
        a_outcome
            == WriteOutcome::StaleFence {
                highest: lease_b.token()
            },
        "{a_outcome:?}"
    );
    ensure!(!a_still_held, "a fenced lease must stay lost");
    ensure!(catalog.visible(LOCK)? == Some(("reports/july/b9".into(), 1)));
    ensure!(catalog.collect_unreferenced()? == ["reports/july/a7"]);
    Ok(())
}

/// A's token-41 request, delayed in the network, is delivered after B's
/// token-42 write: refused as stale; B's write is intact.
#[test]
fn delayed_request_is_fenced() -> Result<()> {
    let dir = TempDir::new("delayed")?;
    let db = dir.join("fence.db");
    let world = World::on_file(&db)?;
    let mut catalog = Catalog::open(&db)?;
    let client = world.client(Arc::new(ManualClock::new(0)));

    let lease_a = acquired(client.acquire(LOCK, "a7", TTL))?;
    // The request leaves A and sits in a network queue.
    let (network, delivery) = mpsc::channel();
    network.send(lease_a.request(Policy::Strict))?;
    drop(lease_a);

    world.coordinator_clock.advance(TTL);
    let mut lease_b = acquired(client.acquire(LOCK, "b9", TTL))?;
    let request = lease_b.request(Policy::Strict);
    ensure!(matches!(
        lease_b.write(request, |r| catalog.publish(r, "reports/july/b9")),
        Ok(WriteOutcome::Applied { .. })
    ));

    let late = delivery.recv()?;
    let outcome = catalog.publish(&late, "reports/july/a7")?;
    ensure!(
        matches!(outcome, Ok(fencecheck::Decision::StaleFence { highest, .. }) if highest == lease_b.token()),
        "{outcome:?}"
    );
    ensure!(catalog.visible(LOCK)? == Some(("reports/july/b9".into(), 1)));
    Ok(())
}

/// A duplicated current-token request (same op-id) is applied once and
/// reported as `duplicate` the second time; the resource changes once.
#[test]
fn duplicated_request_is_idempotent() -> Result<()> {
    let dir = TempDir::new("dup")?;
    let db = dir.join("fence.db");
    let world = World::on_file(&db)?;
    let mut catalog = Catalog::open(&db)?;
    let mut lease = acquired(
        world
            .client(Arc::new(ManualClock::new(0)))
            .acquire(LOCK, "a7", TTL),
    )?;

    let request = lease.request(Policy::AllowEqual).with_op_id("publish-1");
    let first = lease.write(request.clone(), |r| catalog.publish(r, "reports/july/a7"));
    let again = lease.write(request, |r| catalog.publish(r, "reports/july/a7"));
    ensure!(
        matches!(first, Ok(WriteOutcome::Applied { version: 1 })),
        "{first:?}"
    );
    ensure!(
        matches!(again, Ok(WriteOutcome::Duplicate { version: 1 })),
        "{again:?}"
    );
    ensure!(catalog.visible(LOCK)? == Some(("reports/july/a7".into(), 1)));
    Ok(())
}

/// Two same-token writes reordered in flight: the expected version makes the
/// later one fail with `version-conflict` instead of moving state backwards;
/// after the earlier one lands, the later one applies on retry.
#[test]
fn reordered_same_token_requests_use_expected_version() -> Result<()> {
    let dir = TempDir::new("reorder")?;
    let db = dir.join("fence.db");
    let world = World::on_file(&db)?;
    let mut catalog = Catalog::open(&db)?;
    let mut lease = acquired(
        world
            .client(Arc::new(ManualClock::new(0)))
            .acquire(LOCK, "a7", TTL),
    )?;

    let step1 = lease.request(Policy::AllowEqual).with_expected_version(0);
    let step2 = lease.request(Policy::AllowEqual).with_expected_version(1);
    // Delivered in the wrong order.
    let early = lease.write(step2.clone(), |r| catalog.publish(r, "reports/july/step2"));
    ensure!(
        matches!(
            early,
            Ok(WriteOutcome::VersionConflict {
                expected: 1,
                actual: 0
            })
        ),
        "{early:?}"
    );
    ensure!(
        catalog.visible(LOCK)?.is_none(),
        "a conflict must change nothing"
    );
    let first = lease.write(step1, |r| catalog.publish(r, "reports/july/step1"));
    ensure!(
        matches!(first, Ok(WriteOutcome::Applied { version: 1 })),
        "{first:?}"
    );
    let retried = lease.write(step2, |r| catalog.publish(r, "reports/july/step2"));
    ensure!(
        matches!(retried, Ok(WriteOutcome::Applied { version: 2 })),
        "{retried:?}"
    );
    ensure!(catalog.visible(LOCK)? == Some(("reports/july/step2".into(), 2)));
    Ok(())
}

/// A writer that dies between staging and the fenced publication never
/// exposes its object: the next owner publishes, and collection removes the
/// orphan while keeping the visible object.
#[test]
fn crash_between_staging_and_publication() -> Result<()> {
    let dir = TempDir::new("crash")?;
    let db = dir.join("fence.db");
    let world = World::on_file(&db)?;
    let client = world.client(Arc::new(ManualClock::new(0)));
    let a_db = db.clone();
    let a_client = client.clone();
    let crashed = thread::spawn(move || -> Result<()> {
        let _lease = acquired(a_client.acquire(LOCK, "a7", TTL))?;
        Catalog::open(&a_db)?.stage("reports/july/a7", "A's report")?;
        // The process dies here: nothing after staging runs.
        Ok(())
    });
    crashed
        .join()
        .map_err(|_| anyhow::anyhow!("writer A panicked"))??;
    let mut catalog = Catalog::open(&db)?;
    ensure!(
        catalog.visible(LOCK)?.is_none(),
        "a staged object is never visible"
    );

    // No release came: the lock frees by expiry alone.
    let busy = client.acquire(LOCK, "b9", TTL);
    ensure!(
        matches!(busy, AcquireResult::Busy { ref holder, .. } if holder == "a7"),
        "{busy:?}"
    );
    world.coordinator_clock.advance(TTL);
    let mut lease_b = acquired(client.acquire(LOCK, "b9", TTL))?;
    catalog.stage("reports/july/b9", "B's report")?;
    let request = lease_b.request(Policy::Strict);
    ensure!(matches!(
        lease_b.write(request, |r| catalog.publish(r, "reports/july/b9")),
        Ok(WriteOutcome::Applied { .. })
    ));
    ensure!(catalog.collect_unreferenced()? == ["reports/july/a7"]);
    ensure!(catalog.visible(LOCK)? == Some(("reports/july/b9".into(), 1)));
    Ok(())
}

/// A coordinator seen through a network that tampers with renewal replies
/// (after the renewal has been decided and committed).
struct RenewReplies<F> {
    inner: Arc<dyn Coordinator>,
    tamper: F,
}

type RenewReply = Result<RenewOutcome, AuthorityError>;

impl<F: Fn(RenewReply) -> RenewReply + Send + Sync> Coordinator for RenewReplies<F> {
    fn authority(&self) -> u64 {
        self.inner.authority()
    }
    fn acquire(&self, lock: &str, id: &str, ttl: u64) -> Result<AcquireOutcome, AuthorityError> {
        self.inner.acquire(lock, id, ttl)
    }
    fn renew(&self, lock: &str, id: &str, token: Token, ttl: u64) -> RenewReply {
        (self.tamper)(self.inner.renew(lock, id, token, ttl))
    }
    fn release(
        &self,
        lock: &str,
        id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, AuthorityError> {
        self.inner.release(lock, id, token)
    }
    fn restore(&self, at_least: u64) -> Result<u64, AuthorityError> {
        self.inner.restore(at_least)
    }
}

/// A renewal whose reply is lost: the client keeps its old deadline and,
/// past it, considers the lease lost and refuses to write; the coordinator,
/// which did extend the lease, keeps others out until the extended expiry.
#[test]
fn renewal_reply_lost() -> Result<()> {
    let dir = TempDir::new("renew-lost")?;
    let world = World::on_file(&dir.join("fence.db"))?;
    let a_clock = Arc::new(ManualClock::new(0));
    let lossy: Arc<dyn Coordinator> = Arc::new(RenewReplies {
        inner: world.coordinator.clone(),
        tamper: |committed: RenewReply| -> RenewReply {
            Err(AuthorityError::Etcd(format!(
                "reply lost in the network (it was {committed:?})"
            )))
        },
    });
    let a_client = Client::new(
        lossy,
        a_clock.clone(),
        DriftBound {
            ppm: 0,
            margin_ms: 0,
        },
    );
    let mut lease = acquired(a_client.acquire(LOCK, "a7", TTL))?;

    world.coordinator_clock.advance(20_000);
    a_clock.advance(20_000);
    ensure!(
        lease.renew().is_err(),
        "a lost reply is an error, not an outcome"
    );
    ensure!(
        !lease.is_lost() && lease.valid_until() == TTL,
        "the old deadline stands"
    );

    a_clock.advance(10_000); // past the local deadline
    // Were the closure to run, its error would come back as Transient.
    let request = lease.request(Policy::Strict);
    let write = lease.write(request, |_| -> Result<fencecheck::Outcome, ()> { Err(()) });
    ensure!(matches!(write, Err(WriteError::LeaseLost)), "{write:?}");

    // The renewal did commit: the lock stays held until 20 s + 30 s.
    let b = world.client(Arc::new(ManualClock::new(0)));
    world.coordinator_clock.set(49_999);
    ensure!(matches!(
        b.acquire(LOCK, "b9", TTL),
        AcquireResult::Busy {
            expires_at: 50_000,
            ..
        }
    ));
    world.coordinator_clock.set(50_000);
    let lease_b = acquired(b.acquire(LOCK, "b9", TTL))?;
    ensure!(lease_b.token().grant_order(&lease.token()).is_gt());
    Ok(())
}

/// Renewal races: a renewal sent after the coordinator's expiry is `lost`;
/// a renewal the coordinator grants but whose reply arrives after the local
/// deadline does not resurrect the lease; a lost lease stays lost.
#[test]
fn renewal_after_expiry_stays_lost() -> Result<()> {
    let dir = TempDir::new("renew-late")?;
    let world = World::on_file(&dir.join("fence.db"))?;

    // 1. The coordinator's clock ran past expiry; the client's did not.
    let a_clock = Arc::new(ManualClock::new(0));
    let mut lease = acquired(world.client(a_clock.clone()).acquire(LOCK, "a7", TTL))?;
    world.coordinator_clock.advance(TTL);
    ensure!(!lease.renew()?, "a renewal at expires_at is lost");
    ensure!(lease.is_lost() && lease.remaining_ms() == 0);
    ensure!(!lease.renew()?, "lost stays lost");

    // 2. Granted at the coordinator, but the reply lands after the local deadline.
    let c_clock = Arc::new(ManualClock::new(0));
    // The reply takes 15 s to arrive.
    let in_flight = c_clock.clone();
    let slow: Arc<dyn Coordinator> = Arc::new(RenewReplies {
        inner: world.coordinator.clone(),
        tamper: move |reply: RenewReply| -> RenewReply {
            in_flight.advance(15_000);
            reply
        },
    });
    let c_client = Client::new(
        slow,
        c_clock.clone(),
        DriftBound {
            ppm: 0,
            margin_ms: 0,
        },
    );
    let mut lease_c = acquired(c_client.acquire(LOCK, "c1", TTL))?;
    world.coordinator_clock.advance(20_000);
    c_clock.advance(20_000);
    ensure!(
        !lease_c.renew()?,
        "a reply after the local deadline must not resurrect"
    );
    ensure!(lease_c.is_lost());
    Ok(())
}

/// Acquisitions with a grant each, verified end to end: the coordinator's
/// clock alone decides expiry, and tokens of successive grants increase.
#[test]
fn retried_acquire_returns_the_same_grant() -> Result<()> {
    let dir = TempDir::new("retry")?;
    let world = World::on_file(&dir.join("fence.db"))?;
    let first = world.coordinator.acquire(LOCK, "a7", TTL)?;
    world.coordinator_clock.advance(TTL - 1);
    let retry = world.coordinator.acquire(LOCK, "a7", TTL)?;
    let (AcquireOutcome::Acquired(first), AcquireOutcome::Acquired(retry)) = (first, retry) else {
        bail!("expected two grants")
    };
    // The same grant; only the time of the decision differs.
    ensure!(
        Grant {
            decided_at: first.decided_at,
            ..retry.clone()
        } == first,
        "{first:?} vs {retry:?}"
    );
    ensure!(retry.decided_at == TTL - 1 && retry.remaining_ms() == 1);
    ensure!(first.token.authority == world.coordinator.authority());
    Ok(())
}

/// A retried acquire (same lease id, after the first reply was lost) gets the
/// original grant back; the client's deadline counts only the lease time the
/// coordinator had left, not a fresh ttl from the retry's send time.
#[test]
fn retried_acquire_keeps_the_original_deadline() -> Result<()> {
    let dir = TempDir::new("retry-deadline")?;
    let world = World::on_file(&dir.join("fence.db"))?;
    let local = Arc::new(ManualClock::new(0));
    let client = world.client(local.clone());

    // The first attempt is decided and committed, but its reply never arrives.
    let AcquireOutcome::Acquired(lost_reply) = world.coordinator.acquire(LOCK, "a7", TTL)? else {
        bail!("a fresh lock is free")
    };
    // The client times out after 20 s and retries with the same lease id.
    world.coordinator_clock.advance(20_000);
    local.advance(20_000);
    let lease = acquired(client.acquire(LOCK, "a7", TTL))?;
    ensure!(lease.token() == lost_reply.token, "the original grant");
    ensure!(
        lease.valid_until() == TTL,
        "deadline {} must not exceed the coordinator's expiry {TTL}",
        lease.valid_until()
    );
    ensure!(lease.remaining_ms() == 10_000);

    // With a drift allowance the deadline is shorter still, never longer.
    let drifting = Client::new(
        world.coordinator.clone(),
        local.clone(),
        DriftBound::default(),
    );
    let lease = acquired(drifting.acquire(LOCK, "a7", TTL))?;
    ensure!(lease.valid_until() < TTL, "{}", lease.valid_until());
    Ok(())
}
