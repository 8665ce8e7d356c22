//! The etcd coordinator against a real 3-member etcd cluster on loopback:
//! grant rules, the authority, restore, and failing closed. Expiry is driven
//! by a manual coordinator clock, never by sleeping.

use crate::etcd;
use crate::lease_history;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use etcd::Cluster;
use fencecheck::{LeaseError, Runtime, Token};
use fencecheck_authority::{
    AcquireOutcome, AuthorityError, Coordinator, EtcdCoordinator, EtcdOptions, Grant, ManualClock,
    ReleaseOutcome, RenewOutcome,
};
use fencecheck_tests::history::check_issued;

const LOCK: &str = "report/july";
const TTL: u64 = 30_000;

/// The process-wide runtime (the component is compiled once).
fn runtime() -> Result<Runtime> {
    Runtime::shared().context("loading the embedded component")
}

fn coordinator(endpoints: Vec<String>, clock: &Arc<ManualClock>) -> Result<EtcdCoordinator> {
    Ok(EtcdCoordinator::connect(
        endpoints,
        runtime()?,
        clock.clone(),
    )?)
}

fn granted(outcome: AcquireOutcome) -> Result<Grant> {
    match outcome {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        AcquireOutcome::Busy { holder, .. } => bail!("busy: held by {holder}"),
    }
}

/// Raw access to one key, beside the coordinator (to inspect and damage).
struct Raw {
    http: ureq::Agent,
    endpoint: String,
}

impl Raw {
    fn new(endpoint: String) -> Self {
        let http = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .build()
            .into();
        Self { http, endpoint }
    }

    fn call(&self, path: &str, body: serde_json::Value) -> Result<serde_json::Value> {
        let mut response = self
            .http
            .post(format!("{}{path}", self.endpoint))
            .send(body.to_string())?;
        Ok(serde_json::from_slice(&response.body_mut().read_to_vec()?)?)
    }

    /// The key's value and mod_revision, if present.
    fn get(&self, key: &str) -> Result<Option<(Vec<u8>, String)>> {
        let r = self.call("/v3/kv/range", serde_json::json!({"key": B64.encode(key)}))?;
        let Some(kv) = r.pointer("/kvs/0") else {
            return Ok(None);
        };
        let value = B64.decode(kv["value"].as_str().unwrap_or_default())?;
        Ok(Some((value, kv["mod_revision"].to_string())))
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call(
            "/v3/kv/put",
            serde_json::json!({"key": B64.encode(key), "value": B64.encode(value)}),
        )?;
        Ok(())
    }
}

/// Acquire, busy, retry, renew, expiry, release and not-owner on the real
/// cluster; the authority is the cluster id, the same through every member,
/// and two coordinators on different members see one state: the grants etcd
/// committed pass the shared checker's `check_issued` and are exactly the
/// acknowledged ones.
#[test]
fn grant_rules_on_a_real_cluster() -> Result<()> {
    let cluster = Cluster::start(3)?;
    let cluster_id = cluster.status(0)?.cluster_id;
    ensure!(cluster_id != 0);
    let clock = Arc::new(ManualClock::new(1_000));
    let mut per_member = Vec::new();
    for i in 0..cluster.size() {
        ensure!(cluster.status(i)?.cluster_id == cluster_id);
        let c = coordinator(vec![cluster.endpoint(i)], &clock)?;
        ensure!(c.authority() == cluster_id, "member {i}: {}", c.authority());
        per_member.push(c);
    }
    let (a, b) = (&per_member[0], &per_member[2]);

    let first = granted(a.acquire(LOCK, "a1", TTL)?)?;
    ensure!(first.token == Token::new(cluster_id, 0, 1), "{first:?}");
    ensure!(first.expires_at == 1_000 + TTL);
    // Through another member: busy, with the holder.
    let busy = b.acquire(LOCK, "b1", TTL)?;
    ensure!(
        busy == AcquireOutcome::Busy {
            holder: "a1".into(),
            expires_at: 1_000 + TTL
        },
        "{busy:?}"
    );
    // A retry with the same lease id: the same grant, not a new token.
    ensure!(granted(b.acquire(LOCK, "a1", TTL)?)? == first);

    clock.advance(10_000);
    ensure!(
        a.renew(LOCK, "a1", first.token, TTL)?
            == RenewOutcome::Renewed {
                expires_at: 11_000 + TTL
            }
    );
    let wrong = Token::new(cluster_id, 0, 9);
    ensure!(a.renew(LOCK, "a1", wrong, TTL)? == RenewOutcome::Lost);
    ensure!(b.release(LOCK, "a1", wrong)? == ReleaseOutcome::NotOwner);
    ensure!(b.release(LOCK, "b1", first.token)? == ReleaseOutcome::NotOwner);

    // Expiry on the coordinator's clock: exactly at expires_at the lease is over.
    clock.set(11_000 + TTL);
    ensure!(a.renew(LOCK, "a1", first.token, TTL)? == RenewOutcome::Lost);
    let second = granted(b.acquire(LOCK, "b2", TTL)?)?;
    ensure!(second.token == Token::new(cluster_id, 0, 2), "{second:?}");
    // The old owner's delayed release changes nothing.
    ensure!(a.release(LOCK, "a1", first.token)? == ReleaseOutcome::NotOwner);
    ensure!(matches!(
        b.acquire(LOCK, "c1", TTL)?,
        AcquireOutcome::Busy { .. }
    ));
    ensure!(a.release(LOCK, "b2", second.token)? == ReleaseOutcome::Released);
    // Released: free at once, and the counter keeps growing.
    let third = granted(a.acquire(LOCK, "c1", TTL)?)?;
    ensure!(third.token == Token::new(cluster_id, 0, 3), "{third:?}");

    // Each lock has its own sequence.
    let other = granted(b.acquire("report/august", "d1", TTL)?)?;
    ensure!(other.token == Token::new(cluster_id, 0, 1));

    let acked =
        [&first, &second, &third, &other].map(|g| (g.lock.clone(), g.lease_id.clone(), g.token));
    committed_grants_are(&cluster, &acked)
}

/// The grants etcd committed for the locks in `acked`, per lock in revision
/// order, pass `check_issued` and are exactly `acked`.
fn committed_grants_are(cluster: &Cluster, acked: &[(String, String, Token)]) -> Result<()> {
    let mut locks: Vec<&str> = acked.iter().map(|(lock, _, _)| lock.as_str()).collect();
    locks.sort_unstable();
    locks.dedup();
    let mut stored = Vec::new();
    for lock in locks {
        stored.extend(lease_history::grants(&lease_history::etcd_states(
            &cluster.endpoint(1),
            lock,
        )?)?);
    }
    check_issued(&lease_history::issued(&stored))?;
    lease_history::account(acked, &[], &stored)?;
    ensure!(stored.len() == acked.len(), "{stored:?}");
    Ok(())
}

/// An unreachable first endpoint is skipped for the next member; endpoints
/// that are not plain http:// URLs, an empty list and an empty prefix are
/// refused before anything is sent.
#[test]
fn endpoints_fail_over_and_bad_options_are_refused() -> Result<()> {
    let cluster = Cluster::start(3)?;
    let clock = Arc::new(ManualClock::new(0));
    // A port that was free a moment ago: connection refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        format!("http://127.0.0.1:{}", l.local_addr()?.port())
    };
    let c = coordinator(vec![dead.clone(), cluster.endpoint(1)], &clock)?;
    granted(c.acquire(LOCK, "a1", TTL)?)?;
    ensure!(c.release(LOCK, "a1", Token::new(c.authority(), 0, 1))? == ReleaseOutcome::Released);

    let only_dead = EtcdCoordinator::connect([dead], runtime()?, clock.clone());
    ensure!(
        matches!(only_dead, Err(AuthorityError::Etcd(_))),
        "{only_dead:?}"
    );
    // An https:// endpoint without a CA: a TLS error (never the system roots).
    let r = EtcdCoordinator::with_options(
        EtcdOptions::new(["https://127.0.0.1:2379"]),
        runtime()?,
        clock.clone(),
    );
    ensure!(matches!(r, Err(AuthorityError::Tls(_))), "{r:?}");
    for bad in [
        EtcdOptions::new(Vec::<String>::new()),
        EtcdOptions::new(["127.0.0.1:2379"]),
        EtcdOptions {
            prefix: String::new(),
            ..EtcdOptions::new(cluster.endpoints())
        },
    ] {
        let r = EtcdCoordinator::with_options(bad.clone(), runtime()?, clock.clone());
        ensure!(matches!(r, Err(AuthorityError::Etcd(_))), "{bad:?}: {r:?}");
    }
    Ok(())
}

/// Restore raises the floor above every epoch and `at_least`; the next
/// grant of every lock, and of locks the store never saw, starts the new
/// epoch; a second restore goes higher still; the committed grants pass
/// the shared checker's `check_issued`.
#[test]
fn restore_starts_a_new_epoch() -> Result<()> {
    let cluster = Cluster::start(3)?;
    let clock = Arc::new(ManualClock::new(0));
    let c = coordinator(cluster.endpoints(), &clock)?;
    let auth = c.authority();
    let mut acked = Vec::new();
    let mut grant = |lock: &str, lease_id: &str| -> Result<Token> {
        let g = granted(c.acquire(lock, lease_id, TTL)?)?;
        acked.push((g.lock, g.lease_id, g.token));
        Ok(g.token)
    };
    let x = grant("x", "x1")?;
    grant("y", "y1")?;
    ensure!(c.release("x", "x1", x)? == ReleaseOutcome::Released);

    let floor = c.restore(5)?;
    ensure!(floor == 5, "floor {floor}");
    ensure!(grant("x", "x2")? == Token::new(auth, 5, 1));
    ensure!(grant("new", "n1")? == Token::new(auth, 5, 1));
    // y's holder keeps its lease (and may release it) across the restore.
    ensure!(c.release("y", "y1", Token::new(auth, 0, 1))? == ReleaseOutcome::Released);
    ensure!(grant("y", "y2")? == Token::new(auth, 5, 1));

    let again = c.restore(0)?;
    ensure!(again == 6, "second floor {again}");
    clock.advance(TTL);
    ensure!(grant("x", "x3")? == Token::new(auth, 6, 1));
    committed_grants_are(&cluster, &acked)
}

/// A damaged lock state or epoch floor is refused and left as it was; an
/// invalid request writes nothing; a restore over one damaged lock restores
/// none.
#[test]
fn damage_is_refused_and_changes_nothing() -> Result<()> {
    let cluster = Cluster::start(3)?;
    let clock = Arc::new(ManualClock::new(0));
    let c = coordinator(cluster.endpoints(), &clock)?;
    let raw = Raw::new(cluster.endpoint(0));

    let e = c.acquire(LOCK, "a1", 0).err();
    ensure!(
        matches!(
            e,
            Some(AuthorityError::Refused {
                error: LeaseError::InvalidRequest(_)
            })
        ),
        "{e:?}"
    );
    ensure!(raw.get(&format!("fencecheck/lock/{LOCK}"))?.is_none());

    let a = granted(c.acquire(LOCK, "a1", TTL)?)?;
    granted(c.acquire("healthy", "h1", TTL)?)?;
    let key = format!("fencecheck/lock/{LOCK}");
    let Some((mut state, _)) = raw.get(&key)? else {
        bail!("no state stored");
    };
    state[3] ^= 0x10;
    raw.put(&key, &state)?;
    let before = raw.get(&key)?;
    for result in [
        c.acquire(LOCK, "b1", TTL).map(|_| ()),
        c.release(LOCK, "a1", a.token).map(|_| ()),
        c.restore(0).map(|_| ()),
    ] {
        ensure!(
            matches!(result, Err(AuthorityError::Refused { .. })),
            "{result:?}"
        );
        ensure!(raw.get(&key)? == before, "a refused decision wrote");
    }
    let healthy = raw.get("fencecheck/lock/healthy")?;
    ensure!(c.restore(0).is_err());
    ensure!(
        raw.get("fencecheck/lock/healthy")? == healthy,
        "partial restore"
    );
    ensure!(raw.get("fencecheck/epoch-floor")?.is_none(), "floor raised");

    // A state stored under another lock's key.
    raw.put(
        "fencecheck/lock/moved",
        &raw.get("fencecheck/lock/healthy")?.unwrap_or_default().0,
    )?;
    let moved = c.acquire("moved", "m1", TTL).err();
    ensure!(
        matches!(
            moved,
            Some(AuthorityError::Refused {
                error: LeaseError::LockMismatch(_)
            })
        ),
        "{moved:?}"
    );

    raw.put("fencecheck/epoch-floor", b"07")?;
    let floor = c.acquire("healthy2", "h2", TTL);
    ensure!(matches!(floor, Err(AuthorityError::Etcd(_))), "{floor:?}");
    ensure!(raw.get("fencecheck/lock/healthy2")?.is_none());
    Ok(())
}

/// With every member stopped (SIGSTOP) a decision is an error after the
/// request timeout, not an outcome, and nothing changed; after SIGCONT the
/// same coordinator decides again.
#[test]
fn unreachable_cluster_is_an_error_not_an_outcome() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    let clock = Arc::new(ManualClock::new(0));
    let options = EtcdOptions {
        request_timeout: Duration::from_millis(500),
        ..EtcdOptions::new(cluster.endpoints())
    };
    let c = EtcdCoordinator::with_options(options, runtime()?, clock.clone())?;
    let a = granted(c.acquire(LOCK, "a1", TTL)?)?;
    for i in 0..cluster.size() {
        cluster.stop(i)?;
    }
    let during = c.acquire(LOCK, "b1", TTL);
    let release = c.release(LOCK, "a1", a.token);
    for i in 0..cluster.size() {
        cluster.resume(i)?;
    }
    ensure!(matches!(during, Err(AuthorityError::Etcd(_))), "{during:?}");
    ensure!(
        matches!(release, Err(AuthorityError::Etcd(_))),
        "{release:?}"
    );
    cluster.wait_healthy()?;
    // Still a1's lease: the failed release did nothing.
    ensure!(matches!(
        c.acquire(LOCK, "b1", TTL)?,
        AcquireOutcome::Busy { .. }
    ));
    ensure!(c.release(LOCK, "a1", a.token)? == ReleaseOutcome::Released);
    Ok(())
}

/// A restore writes only the epoch floor, so it is not bounded by etcd's
/// per-transaction cap (`--max-txn-ops`, default 128): with 300 locks it
/// succeeds, rewrites no lock state, and the next grant of every lock is
/// `(floor, 1)`; a holder still inside its lease keeps its token.
#[test]
fn restore_beyond_the_transaction_cap_raises_only_the_floor() -> Result<()> {
    let cluster = Cluster::start(3)?;
    let clock = Arc::new(ManualClock::new(0));
    let c = coordinator(cluster.endpoints(), &clock)?;
    let raw = Raw::new(cluster.endpoint(0));
    let mut held = Vec::new();
    for i in 0..300 {
        held.push(granted(c.acquire(&format!("lock-{i:03}"), "a", TTL)?)?);
    }
    let before = raw.get("fencecheck/lock/lock-000")?;
    let floor = c.restore(7)?;
    ensure!(floor == 7, "{floor}");
    ensure!(
        raw.get("fencecheck/lock/lock-000")? == before,
        "restore rewrote a lock"
    );
    ensure!(raw.get("fencecheck/epoch-floor")?.map(|(v, _)| v) == Some(b"7".to_vec()));
    // Still held: the retry returns the old grant.
    ensure!(granted(c.acquire("lock-000", "a", TTL)?)?.token == held[0].token);
    clock.advance(TTL);
    for (i, old) in held.iter().enumerate().step_by(37) {
        let next = granted(c.acquire(&format!("lock-{i:03}"), "b", TTL)?)?;
        ensure!(next.token == Token::new(c.authority(), 7, 1), "{next:?}");
        ensure!(next.token.grant_order(&old.token).is_gt());
    }
    Ok(())
}
