//! `--postgres` over a real PostgreSQL server: a commit whose outcome is
//! unknown (the connection dies while COMMIT is in flight, cut by a relay
//! at the moment a deferred trigger holds the commit) is answered as such,
//! and a retry with the same Idempotency-Key tells which way it went; the
//! listing and the Idempotency-Key records work on PostgreSQL too.

use crate::common;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::Gateway;
use common::relay::Relay;
use fencecheck_tests::pgserver::{PgServer, wait_for_lock_waiter};

/// Holds the commit of any write to a scope under `unknown/` until the
/// test releases advisory lock 4242 (a deferred trigger runs at COMMIT).
const HOLD: &str = "
CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.scope LIKE 'unknown/%' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER test_hold AFTER INSERT OR UPDATE ON fencecheck_scopes
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_hold();";

fn url(port: u16) -> String {
    format!("host=127.0.0.1 port={port} user=postgres dbname=postgres connect_timeout=10")
}

fn version(client: &mut postgres::Client, scope: &str) -> anyhow::Result<Option<i64>> {
    Ok(client
        .query_opt(
            "SELECT version FROM fencecheck_scopes WHERE scope = $1",
            &[&scope],
        )?
        .map(|r| r.get(0)))
}

/// Cut the gateway's database connections while its publish of `key`
/// waits in COMMIT; then `settle` decides the commit's fate (release the
/// lock: it commits; terminate the backend: it rolls back). Returns the
/// gateway's answer to the PUT.
fn put_while_commit_is_cut(
    gw: &Gateway,
    relay: &Relay,
    admin: &mut postgres::Client,
    key: &str,
    settle: impl FnOnce(&mut postgres::Client) -> anyhow::Result<()>,
) -> anyhow::Result<common::Response> {
    admin.execute("SELECT pg_advisory_lock(4242)", &[])?;
    let (addr, auth, path) = (
        gw.addr.clone(),
        gw.auth_header().context("auth")?,
        format!("/objects/{key}"),
    );
    let put = std::thread::spawn(move || {
        common::request_to(
            &addr,
            "PUT",
            &path,
            &[
                ("Fence-Token", "0.1"),
                ("Idempotency-Key", "op-1"),
                ("Authorization", &auth),
            ],
            b"the body",
        )
    });
    wait_for_lock_waiter(admin)?;
    relay.cut();
    let answer = put
        .join()
        .map_err(|_| anyhow::anyhow!("the PUT panicked"))??;
    settle(admin)?;
    Ok(answer)
}

/// CommitUnknown both ways. Committed: the gateway answers 503
/// `commit-unknown` (never "nothing was published"); the commit lands; a
/// retry with the same token and Idempotency-Key is the duplicate of the
/// original (its ETag), and the object is visible. Rolled back: the same
/// answer; the retry is applied (201).
#[test]
fn commit_unknown_is_its_own_answer() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let relay = Relay::start(server.port())?;
    let dir = tempfile::tempdir()?;
    let db = url(relay.port);
    let gw = Gateway::start_authed(dir.path(), &["--postgres", &db, "--pg-pool", "2"])?;
    let mut admin = server.client()?;
    admin.batch_execute(HOLD)?;

    let r = put_while_commit_is_cut(&gw, &relay, &mut admin, "unknown/committed", |admin| {
        admin.execute("SELECT pg_advisory_unlock(4242)", &[])?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while version(admin, "unknown/committed")? != Some(1) {
            ensure!(Instant::now() < deadline, "the held commit never landed");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    })?;
    // The same PUT again: same token, Idempotency-Key and body; again
    // after a 503 `unavailable`, as that answer says (a pooled connection
    // the cut killed can fail one statement before the pool notices).
    let retry = |key: &str, status: u16| -> anyhow::Result<()> {
        for _ in 0..3 {
            let r = gw.request(
                "PUT",
                &format!("/objects/{key}"),
                &[("Fence-Token", "0.1"), ("Idempotency-Key", "op-1")],
                b"the body",
            )?;
            if r.status == 503 && r.json()?["title"] == "unavailable" {
                continue;
            }
            ensure!(
                r.status == status && r.header("etag") == Some("\"1\""),
                "{r:?}"
            );
            return Ok(());
        }
        anyhow::bail!("{key}: still unavailable after three tries")
    };
    let unknown = |r: &common::Response, key: &str| -> anyhow::Result<()> {
        let p = r.json()?;
        ensure!(
            r.status == 503 && p["title"] == "commit-unknown" && p["key"] == key,
            "{r:?}"
        );
        Ok(())
    };
    unknown(&r, "unknown/committed")?;
    retry("unknown/committed", 200)?;
    let got = gw.request("GET", "/objects/unknown/committed", &[], b"")?;
    ensure!(got.status == 200 && got.body == b"the body", "{got:?}");

    // Health probes run a query on pooled connections: any the first cut
    // killed (and the pool has not noticed) is dropped by a failed probe.
    for _ in 0..3 {
        gw.request("GET", "/healthz", &[], b"")?;
    }
    let r = put_while_commit_is_cut(&gw, &relay, &mut admin, "unknown/rolled-back", |admin| {
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
            &[],
        )?;
        admin.execute("SELECT pg_advisory_unlock(4242)", &[])?;
        Ok(())
    })?;
    unknown(&r, "unknown/rolled-back")?;
    ensure!(version(&mut admin, "unknown/rolled-back")?.is_none());
    retry("unknown/rolled-back", 201)
}

/// On PostgreSQL: listing pages in byte order (whatever the database's
/// collation), an Idempotency-Key replayed with another body is 422, and a
/// create-only PUT on an existing key is 412.
#[test]
fn listing_and_idempotency_on_postgres() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &["--postgres", &server.url()])?;
    for key in ["p/B", "p/a", "p/%C3%A9", "p/_", "q"] {
        let r = gw.request(
            "PUT",
            &format!("/objects/{key}"),
            &[("Fence-Token", "0.1")],
            b"x",
        )?;
        ensure!(r.status == 201, "{key}: {r:?}");
    }
    let page = gw
        .request("GET", "/objects/?prefix=p/&limit=2", &[], b"")?
        .json()?;
    let keys: Vec<&str> = page["objects"]
        .as_array()
        .context("objects")?
        .iter()
        .filter_map(|o| o["key"].as_str())
        .collect();
    ensure!(keys == ["p/B", "p/_"] && page["next"] == "p/_", "{page}");
    let page = gw
        .request("GET", "/objects/?prefix=p/&limit=2&after=p/_", &[], b"")?
        .json()?;
    let keys: Vec<&str> = page["objects"]
        .as_array()
        .context("objects")?
        .iter()
        .filter_map(|o| o["key"].as_str())
        .collect();
    ensure!(keys == ["p/a", "p/é"] && page["next"].is_null(), "{page}");

    let h = [("Fence-Token", "0.2"), ("Idempotency-Key", "k1")];
    ensure!(gw.request("PUT", "/objects/q", &h, b"one")?.status == 200);
    let r = gw.request("PUT", "/objects/q", &h, b"one")?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"2\""),
        "{r:?}"
    );
    let r = gw.request("PUT", "/objects/q", &h, b"two")?;
    ensure!(r.status == 422, "{r:?}");
    let r = gw.request(
        "PUT",
        "/objects/q",
        &[("Fence-Token", "0.3"), ("If-None-Match", "*")],
        b"x",
    )?;
    ensure!(r.status == 412, "{r:?}");
    Ok(())
}
