//! The etcd coordinator against etcd as operators run it: members serving
//! clients over TLS and requiring a client certificate (certificates made
//! by the test), with etcd authentication on and the coordinator's user
//! limited to its key prefix. Every wrong certificate, wrong password and
//! missing permission is its own clear error, and changes nothing.

use crate::common;
use crate::etcd;
use crate::pki;
use crate::secure_etcd;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use common::{Catalog, TempDir};
use etcd::Cluster;
use fencecheck::{Decision, Policy};
use fencecheck_authority::{
    AcquireOutcome, AcquireResult, AuthorityError, Client, Coordinator, DriftBound,
    EtcdCoordinator, EtcdCredentials, EtcdOptions, EtcdTls, ManualClock, ReleaseOutcome,
    RenewOutcome, WriteOutcome,
};
use pki::{Pair, Pki};
use secure_etcd::{Admin, PASSWORD, secure_cluster};
use serde_json::json;

const LOCK: &str = "report/july";
const TTL: u64 = 30_000;

fn tls(ca: &Path, client: Option<&Pair>) -> Result<EtcdTls> {
    Ok(EtcdTls::from_files(
        ca,
        client.map(|p| p.cert.as_path()),
        client.map(|p| p.key.as_path()),
    )?)
}

fn options(
    cluster: &Cluster,
    tls: EtcdTls,
    user: Option<(&str, &str)>,
    prefix: &str,
) -> EtcdOptions {
    EtcdOptions {
        prefix: prefix.to_owned(),
        tls: Some(tls),
        credentials: user.map(|(user, password)| EtcdCredentials {
            user: user.to_owned(),
            password: password.to_owned(),
        }),
        ..EtcdOptions::new(cluster.endpoints())
    }
}

fn connect(
    options: EtcdOptions,
    clock: &Arc<ManualClock>,
) -> Result<EtcdCoordinator, AuthorityError> {
    EtcdCoordinator::with_options(options, fencecheck::Runtime::shared()?, clock.clone())
}

fn granted(outcome: AcquireOutcome) -> Result<fencecheck_authority::Grant> {
    match outcome {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        AcquireOutcome::Busy { holder, .. } => bail!("busy: held by {holder}"),
    }
}

/// Over TLS with a client certificate, as an etcd user whose role covers
/// only the coordinator's prefix: acquire, busy for another lease, renew,
/// a write through the fence, release, and the released lease's stale token
/// refused by the resource after the next grant.
#[test]
fn tls_and_auth_grant_renew_release_and_fence() -> Result<()> {
    let pki = Pki::new()?;
    let cluster = secure_cluster(&pki, &[])?;
    let mut admin = Admin::new(&pki, &cluster)?;
    admin.enable_auth()?;
    let clock = Arc::new(ManualClock::new(0));
    let client_tls = tls(&pki.ca, Some(&pki.client))?;
    let fencer = Some(("fencer", PASSWORD));
    let coordinator: Arc<dyn Coordinator> = Arc::new(connect(
        options(&cluster, client_tls.clone(), fencer, "fencecheck/"),
        &clock,
    )?);
    let client = Client::new(coordinator.clone(), clock.clone(), DriftBound::default());
    let mut lease = match client.acquire(LOCK, "a7", TTL) {
        AcquireResult::Acquired(lease) => lease,
        other => bail!("expected a grant, got {other:?}"),
    };
    // A second coordinator process's view: the lock is busy.
    let other = connect(options(&cluster, client_tls, fencer, "fencecheck/"), &clock)?;
    ensure!(
        matches!(other.acquire(LOCK, "b9", TTL)?, AcquireOutcome::Busy { ref holder, .. } if holder == "a7"),
        "a held lock must be busy for another lease"
    );
    clock.advance(10_000);
    ensure!(lease.renew()?, "the current lease renews");

    let dir = TempDir::new("etcd-secure")?;
    let mut catalog = Catalog::open(&dir.join("resource.db"))?;
    catalog.stage("reports/july/a7", "A's report")?;
    let request = lease.request(Policy::Strict);
    let written = lease.write(request, |r| catalog.publish(r, "reports/july/a7"));
    ensure!(
        matches!(written, Ok(WriteOutcome::Applied { .. })),
        "the fenced write applies: {written:?}"
    );
    let old_token = lease.token();
    ensure!(lease.release()? == ReleaseOutcome::Released);

    let next = granted(other.acquire(LOCK, "b9", TTL)?)?;
    ensure!(next.token.grant_order(&old_token).is_gt());
    catalog.stage("reports/july/b9", "B's report")?;
    let b = fencecheck::Request::new(LOCK.to_owned(), next.token, Policy::Strict);
    ensure!(matches!(
        catalog.publish(&b, "reports/july/b9")?,
        Ok(Decision::Applied { .. })
    ));
    let stale = fencecheck::Request::new(LOCK.to_owned(), old_token, Policy::Strict);
    ensure!(
        matches!(
            catalog.publish(&stale, "reports/july/a7")?,
            Ok(Decision::StaleFence { .. })
        ),
        "the released lease's token is fenced off"
    );
    ensure!(
        admin
            .keys("fencecheck/")?
            .contains(&format!("fencecheck/lock/{LOCK}")),
        "the lock state is in etcd under the prefix"
    );
    Ok(())
}

/// etcd's simple tokens lapse after `--auth-token-ttl` unused: a request
/// with the lapsed token is refused before etcd executes it, and the
/// coordinator authenticates again and sends that one request again.
#[test]
fn an_expired_token_is_replaced() -> Result<()> {
    let pki = Pki::new()?;
    let cluster = secure_cluster(&pki, &["--auth-token-ttl", "2"])?;
    let mut admin = Admin::new(&pki, &cluster)?;
    admin.enable_auth()?;
    let clock = Arc::new(ManualClock::new(0));
    let client_tls = tls(&pki.ca, Some(&pki.client))?;
    let c = connect(
        options(
            &cluster,
            client_tls,
            Some(("fencer", PASSWORD)),
            "fencecheck/",
        ),
        &clock,
    )?;
    let grant = granted(c.acquire(LOCK, "a7", TTL)?)?;
    // A token taken now, beside the coordinator's: proof that tokens lapse.
    let witness = admin.authenticate("fencer", PASSWORD)?;
    let range = json!({"key": B64.encode("fencecheck/lineage")});
    let (status, _) = admin.send("/v3/kv/range", &range, Some(&witness))?;
    ensure!(status == 200, "a fresh token works: HTTP {status}");
    // Past the TTL plus etcd's one-second sweep.
    std::thread::sleep(Duration::from_secs(5));
    let (status, body) = admin.send("/v3/kv/range", &range, Some(&witness))?;
    ensure!(
        status == 401 && body["message"] == "etcdserver: invalid auth token",
        "the lapsed token is refused: HTTP {status}: {body}"
    );
    clock.advance(1_000);
    ensure!(
        c.renew(LOCK, "a7", grant.token, TTL)? == RenewOutcome::Renewed { expires_at: 31_000 },
        "the renewal goes through on a new token"
    );
    ensure!(c.release(LOCK, "a7", grant.token)? == ReleaseOutcome::Released);
    Ok(())
}

/// Every wrong certificate is a TLS error, never an etcd outcome: a client
/// certificate from another CA, no client certificate, a CA that did not
/// sign the member, a key that is not the certificate's, files that are not
/// PEM, TLS settings with an http:// endpoint; and credentials given to a
/// cluster without authentication are refused, not ignored.
#[test]
fn wrong_certificates_are_tls_errors() -> Result<()> {
    let pki = Pki::new()?;
    let cluster = secure_cluster(&pki, &[])?;
    let clock = Arc::new(ManualClock::new(0));
    let expect_tls =
        |what: &str, result: Result<EtcdCoordinator, AuthorityError>, says: &str| match result {
            Err(AuthorityError::Tls(message)) if message.contains(says) => Ok(()),
            other => bail!("{what}: expected a TLS error saying {says:?}, got {other:?}"),
        };
    // The refusals race the member closing the connection: repeat them.
    for _ in 0..10 {
        expect_tls(
            "a client certificate from another CA",
            connect(
                options(
                    &cluster,
                    tls(&pki.ca, Some(&pki.foreign_client))?,
                    None,
                    "fencecheck/",
                ),
                &clock,
            ),
            "refused the client certificate",
        )?;
        expect_tls(
            "no client certificate",
            connect(
                options(&cluster, tls(&pki.ca, None)?, None, "fencecheck/"),
                &clock,
            ),
            "refused the client certificate",
        )?;
    }
    expect_tls(
        "a CA that did not sign the member",
        connect(
            options(
                &cluster,
                tls(&pki.other_ca, Some(&pki.client))?,
                None,
                "fencecheck/",
            ),
            &clock,
        ),
        "not signed by the CA given",
    )?;
    let mismatched = EtcdTls {
        key_pem: Some(std::fs::read(&pki.foreign_client.key)?),
        ..tls(&pki.ca, Some(&pki.client))?
    };
    expect_tls(
        "another certificate's key",
        connect(options(&cluster, mismatched, None, "fencecheck/"), &clock),
        "do not work together",
    )?;
    let not_pem = EtcdTls {
        ca_pem: b"not a certificate".to_vec(),
        ..tls(&pki.ca, Some(&pki.client))?
    };
    expect_tls(
        "a CA file without a certificate",
        connect(options(&cluster, not_pem, None, "fencecheck/"), &clock),
        "holds no PEM certificate",
    )?;
    let missing = EtcdTls::from_files(&pki.dir().join("absent.pem"), None, None);
    ensure!(
        matches!(missing, Err(AuthorityError::Tls(_))),
        "{missing:?}"
    );
    let plain = EtcdOptions {
        endpoints: vec![cluster.endpoint(0).replacen("https://", "http://", 1)],
        ..options(
            &cluster,
            tls(&pki.ca, Some(&pki.client))?,
            None,
            "fencecheck/",
        )
    };
    expect_tls(
        "TLS settings with an http:// endpoint",
        connect(plain, &clock),
        "plain http://",
    )?;

    // The right certificates work; credentials for a cluster without
    // authentication are refused.
    let good = tls(&pki.ca, Some(&pki.client))?;
    let c = connect(options(&cluster, good.clone(), None, "fencecheck/"), &clock)?;
    granted(c.acquire(LOCK, "a7", TTL)?)?;
    let by_name = EtcdOptions {
        endpoints: vec![cluster.endpoint(0).replacen("127.0.0.1", "localhost", 1)],
        ..options(&cluster, good.clone(), None, "fencecheck/")
    };
    connect(by_name, &clock).context("the member's certificate names localhost too")?;
    match connect(
        options(&cluster, good, Some(("fencer", PASSWORD)), "fencecheck/"),
        &clock,
    ) {
        Err(AuthorityError::AuthenticationFailed(m)) if m.contains("authentication disabled") => {}
        other => bail!("credentials on a cluster without auth: {other:?}"),
    }
    Ok(())
}

/// With authentication on: a wrong password, an unknown user and no
/// credentials are authentication errors; a client certificate with a
/// CommonName (which etcd's gateway refuses then) is a TLS error; a user
/// whose role covers another prefix, only some of the keys, or only reads
/// gets a permission error, and nothing was written (checked as root). A
/// user's own prefix works.
#[test]
fn auth_errors_are_clear_and_change_nothing() -> Result<()> {
    let pki = Pki::new()?;
    let cluster = secure_cluster(&pki, &[])?;
    let mut admin = Admin::new(&pki, &cluster)?;
    admin.enable_auth()?;
    let clock = Arc::new(ManualClock::new(0));
    let good = tls(&pki.ca, Some(&pki.client))?;
    let as_user = |user: Option<(&str, &str)>, prefix: &str| {
        connect(options(&cluster, good.clone(), user, prefix), &clock)
    };
    let failed = |what: &str, r: Result<EtcdCoordinator, AuthorityError>, says: &str| match r {
        Err(AuthorityError::AuthenticationFailed(m)) if m.contains(says) => Ok(()),
        other => bail!("{what}: expected an authentication error saying {says:?}, got {other:?}"),
    };
    failed(
        "a wrong password",
        as_user(Some(("fencer", "wrong")), "fencecheck/"),
        "wrong user name or password",
    )?;
    failed(
        "an unknown user",
        as_user(Some(("nobody", PASSWORD)), "fencecheck/"),
        "wrong user name or password",
    )?;
    failed(
        "no credentials",
        as_user(None, "fencecheck/"),
        "give an etcd user and password",
    )?;
    let named = connect(
        options(
            &cluster,
            tls(&pki.ca, Some(&pki.named_client))?,
            Some(("fencer", PASSWORD)),
            "fencecheck/",
        ),
        &clock,
    );
    ensure!(
        matches!(&named, Err(AuthorityError::Tls(m)) if m.contains("without a CN")),
        "a client certificate with a CommonName: {named:?}"
    );
    ensure!(admin.keys("fencecheck/")?.is_empty(), "nothing was written");

    // Another prefix only: refused at the first read, nothing written.
    let denied = |r: Result<_, AuthorityError>, operation: &str, user: &str| match r {
        Err(AuthorityError::PermissionDenied {
            user: u,
            operation: o,
            prefix,
        }) if u == user && o == operation && prefix == "fencecheck/" => Ok(()),
        other => bail!("{user}: expected {operation} permission denied, got {other:?}"),
    };
    denied(
        as_user(Some(("stranger", PASSWORD)), "fencecheck/").map(|_| ()),
        "read",
        "stranger",
    )?;
    ensure!(admin.keys("fencecheck/")?.is_empty(), "nothing was written");
    // Read-only: reading is allowed, making the lineage is not.
    denied(
        as_user(Some(("reader", PASSWORD)), "fencecheck/").map(|_| ()),
        "write",
        "reader",
    )?;
    ensure!(admin.keys("fencecheck/")?.is_empty(), "nothing was written");

    // The coordinator's user makes the lineage; then the others connect.
    let fencer = as_user(Some(("fencer", PASSWORD)), "fencecheck/")?;
    let lineage = vec!["fencecheck/lineage".to_owned()];
    ensure!(admin.keys("fencecheck/")? == lineage);
    let partial = as_user(Some(("partial", PASSWORD)), "fencecheck/")?;
    denied(
        partial.acquire(LOCK, "p1", TTL).map(|_| ()),
        "read",
        "partial",
    )?;
    let reader = as_user(Some(("reader", PASSWORD)), "fencecheck/")?;
    // The compare-and-swap itself is refused: an error, not busy or lost.
    denied(
        reader.acquire(LOCK, "r1", TTL).map(|_| ()),
        "write",
        "reader",
    )?;
    ensure!(
        admin.keys("fencecheck/")? == lineage,
        "no lock state was written: {:?}",
        admin.keys("fencecheck/")?
    );
    let grant = granted(fencer.acquire(LOCK, "a7", TTL)?)?;
    denied(
        reader.release(LOCK, "a7", grant.token).map(|_| ()),
        "write",
        "reader",
    )?;
    ensure!(
        fencer.renew(LOCK, "a7", grant.token, TTL)? == RenewOutcome::Renewed { expires_at: TTL },
        "the denied release changed nothing"
    );
    // A user's own prefix works for it.
    let stranger = as_user(Some(("stranger", PASSWORD)), "other/")?;
    let theirs = granted(stranger.acquire(LOCK, "s1", TTL)?)?;
    ensure!(stranger.release(LOCK, "s1", theirs.token)? == ReleaseOutcome::Released);
    Ok(())
}
