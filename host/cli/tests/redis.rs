//! `RedisCoordinator` and `fencecheck authority … --redis URL` against a
//! real Redis 7.0 server loading the module (host/redis): grants minted by
//! FENCE.ACQUIRE on the server's clock feed FENCE.SET; busy, renew,
//! release and restore come back as the trait's outcomes; a server without
//! the module and a wrong password are refused.

use crate::common;

use crate::server;

use anyhow::{Context, Result, bail, ensure};
use common::fencecheck;
use fencecheck::TokenText;
use fencecheck_authority::{
    AcquireOutcome, AuthorityError, Coordinator, RedisCoordinator, ReleaseOutcome, RenewOutcome,
};
use server::{Kind, Options, Server, Value};

fn grant(c: &RedisCoordinator, lock: &str, lease: &str) -> Result<fencecheck_authority::Grant> {
    match c.acquire(lock, lease, 60_000)? {
        AcquireOutcome::Acquired(g) => Ok(g),
        other => bail!("not acquired: {other:?}"),
    }
}

/// The trait's outcomes through the module: a grant whose token carries
/// the server's lineage and is accepted by FENCE.SET, busy for another
/// lease, renew and release of the exact lease only, a greater token for
/// the next grant, and restore starting a new epoch above the old.
#[test]
fn coordinator_grants_through_the_module() -> Result<()> {
    let server = Server::start(Kind::Redis, Options::module())?;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let coordinator = RedisCoordinator::connect(&url)?;
    let mut c = server.conn()?;
    let lineage: u64 = c
        .ok(&["GET", "fencecheck:lineage"])?
        .text()
        .context("lineage")?
        .parse()?;
    ensure!(coordinator.authority() == lineage && lineage != 0);

    let a = grant(&coordinator, "report/july", "a7")?;
    ensure!(
        a.token.authority == lineage && a.expires_at - a.decided_at == 60_000,
        "{a:?}"
    );
    let text = TokenText(a.token).to_string();
    let set = c.ok(&["FENCE.SET", "report/july", &text, "a7.tmp"])?;
    ensure!(
        set.items().first() == Some(&Value::Simple("applied".into())),
        "{set:?}"
    );
    match coordinator.acquire("report/july", "b9", 60_000)? {
        AcquireOutcome::Busy { holder, .. } => ensure!(holder == "a7"),
        other => bail!("expected busy: {other:?}"),
    }
    ensure!(matches!(
        coordinator.renew("report/july", "a7", a.token, 60_000)?,
        RenewOutcome::Renewed { .. }
    ));
    ensure!(matches!(
        coordinator.renew("report/july", "b9", a.token, 60_000)?,
        RenewOutcome::Lost
    ));
    ensure!(matches!(
        coordinator.release("report/july", "b9", a.token)?,
        ReleaseOutcome::NotOwner
    ));
    ensure!(matches!(
        coordinator.release("report/july", "a7", a.token)?,
        ReleaseOutcome::Released
    ));
    let b = grant(&coordinator, "report/july", "b9")?;
    ensure!(b.token.grant_order(&a.token).is_gt(), "{b:?} after {a:?}");
    let b_text = TokenText(b.token).to_string();
    c.ok(&["FENCE.SET", "report/july", &b_text, "b9.tmp"])?;
    let stale = c.cmd(&["FENCE.SET", "report/july", &text, "late"])?;
    ensure!(
        stale.error().is_some_and(|e| e.starts_with("STALEFENCE")),
        "{stale:?}"
    );

    let floor = coordinator.restore(1_000)?;
    ensure!(floor == 1_000, "{floor}");
    coordinator.release("report/july", "b9", b.token)?;
    let after = grant(&coordinator, "report/july", "c1")?;
    ensure!(
        after.token.epoch == 1_000 && after.token.counter == 1,
        "{after:?}"
    );
    // A lease-rule refusal is the component's error, not an infrastructure one.
    match coordinator.acquire("report/july", "d1", 0) {
        Err(AuthorityError::Refused { .. }) => {}
        other => bail!("zero ttl: {other:?}"),
    }
    Ok(())
}

/// A server without the module, and a wrong password, are refused at
/// connect with errors that say so.
#[test]
fn connect_refuses_servers_without_the_module_and_bad_credentials() -> Result<()> {
    let plain = Server::start(Kind::Redis, Options::plain())?;
    match RedisCoordinator::connect(&format!("redis://127.0.0.1:{}", plain.port)) {
        Err(AuthorityError::Redis(e)) => ensure!(e.contains("module"), "{e}"),
        Err(other) => bail!("{other}"),
        Ok(_) => bail!("connected to a server without the module"),
    }
    let server = Server::start(Kind::Redis, Options::module().with("requirepass", "right"))?;
    match RedisCoordinator::connect(&format!("redis://:wrong@127.0.0.1:{}", server.port)) {
        Err(AuthorityError::AuthenticationFailed(_)) => {}
        Err(other) => bail!("{other}"),
        Ok(_) => bail!("a wrong password connected"),
    }
    RedisCoordinator::connect(&format!("redis://:right@127.0.0.1:{}", server.port))?;
    Ok(())
}

/// `fencecheck authority acquire|renew|release|restore --redis URL`.
#[test]
fn cli_authority_on_redis() -> Result<()> {
    let server = Server::start(Kind::Valkey, Options::module())?;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let out = fencecheck(&[
        "authority",
        "acquire",
        "--redis",
        &url,
        "report/july",
        "a7",
        "30000",
    ])?;
    let stdout = String::from_utf8(out.stdout)?;
    ensure!(
        out.status.success() && stdout.starts_with("acquired report/july lease a7 token "),
        "{stdout}"
    );
    let token = stdout.split(' ').nth(5).context("token")?.to_string();
    let busy = fencecheck(&[
        "authority",
        "acquire",
        "--redis",
        &url,
        "report/july",
        "b9",
        "30000",
    ])?;
    ensure!(busy.status.code() == Some(3), "{busy:?}");
    let renew = fencecheck(&[
        "authority",
        "renew",
        "--redis",
        &url,
        "report/july",
        "a7",
        &token,
        "30000",
    ])?;
    ensure!(renew.status.success(), "{renew:?}");
    let release = fencecheck(&[
        "authority",
        "release",
        "--redis",
        &url,
        "report/july",
        "a7",
        &token,
    ])?;
    ensure!(release.status.success(), "{release:?}");
    let restore = fencecheck(&["authority", "restore", "--redis", &url, "--at-least", "77"])?;
    ensure!(String::from_utf8(restore.stdout)?.trim() == "restored epoch-floor 77");
    let next = fencecheck(&[
        "authority",
        "acquire",
        "--redis",
        &url,
        "report/july",
        "c1",
        "30000",
    ])?;
    let next = String::from_utf8(next.stdout)?;
    ensure!(next.contains(":77.1 "), "{next}");
    Ok(())
}
