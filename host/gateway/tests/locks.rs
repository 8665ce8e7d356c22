//! Lease endpoints over HTTP, and their tokens fencing writes end to end.

use crate::common;

use std::time::Duration;

use anyhow::{Context, ensure};
use common::{Gateway, Response};
use serde_json::json;

fn post(gw: &Gateway, path: &str, body: serde_json::Value) -> anyhow::Result<Response> {
    gw.request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

/// A acquires, lets its lease expire, B acquires a higher token; A's renew
/// is `lost` (409), A's write with its old token is 409 after B's write,
/// A's release is `not-owner`; B renews and releases. Bad bodies are 400.
#[test]
fn leases_hand_out_fencing_tokens() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &[])?;
    let lock = "/v1/locks/reports/july";

    let a = post(
        &gw,
        &format!("{lock}/acquire"),
        json!({"lease_id": "a", "ttl_ms": 300}),
    )?;
    ensure!(a.status == 200, "{a:?}");
    let a_token = a.json()?["token"].as_str().context("no token")?.to_owned();
    let busy = post(
        &gw,
        &format!("{lock}/acquire"),
        json!({"lease_id": "b", "ttl_ms": 300}),
    )?;
    ensure!(
        busy.status == 409 && busy.json()?["title"] == "busy",
        "{busy:?}"
    );
    ensure!(
        busy.json()?.get("holder").is_none(),
        "the holder's lease id leaked"
    );

    std::thread::sleep(Duration::from_millis(400));
    let b = post(
        &gw,
        &format!("{lock}/acquire"),
        json!({"lease_id": "b", "ttl_ms": 10_000}),
    )?;
    ensure!(b.status == 200, "{b:?}");
    let b_token = b.json()?["token"].as_str().context("no token")?.to_owned();
    ensure!(a_token != b_token);

    let renew = post(
        &gw,
        &format!("{lock}/renew"),
        json!({"lease_id": "a", "token": a_token, "ttl_ms": 300}),
    )?;
    ensure!(
        renew.status == 409 && renew.json()?["title"] == "lost",
        "{renew:?}"
    );

    // The tokens fence writes to the object of the same name.
    let put = |token: &str, body: &[u8]| {
        gw.request(
            "PUT",
            "/objects/reports/july",
            &[("Fence-Token", token)],
            body,
        )
    };
    ensure!(put(&b_token, b"B")?.status == 201);
    let stale = put(&a_token, b"A")?;
    ensure!(
        stale.status == 409 && stale.json()?["highest"] == b_token.as_str(),
        "{stale:?}"
    );

    let release = post(
        &gw,
        &format!("{lock}/release"),
        json!({"lease_id": "a", "token": a_token}),
    )?;
    ensure!(
        release.status == 409 && release.json()?["title"] == "not-owner",
        "{release:?}"
    );
    let renew = post(
        &gw,
        &format!("{lock}/renew"),
        json!({"lease_id": "b", "token": b_token, "ttl_ms": 10_000}),
    )?;
    ensure!(
        renew.status == 200 && renew.json()?["expires_at"].is_u64(),
        "{renew:?}"
    );
    let release = post(
        &gw,
        &format!("{lock}/release"),
        json!({"lease_id": "b", "token": b_token}),
    )?;
    ensure!(release.status == 200, "{release:?}");

    for (path, body) in [
        (format!("{lock}/acquire"), b"not json".to_vec()),
        (format!("{lock}/acquire"), br#"{"lease_id":"c"}"#.to_vec()),
        (
            format!("{lock}/renew"),
            br#"{"lease_id":"c","token":"x","ttl_ms":1}"#.to_vec(),
        ),
        (
            "/v1/locks/a/../b/acquire".to_owned(),
            br#"{"lease_id":"c","ttl_ms":1}"#.to_vec(),
        ),
        (format!("{lock}/acquire"), vec![b' '; 5000]),
    ] {
        let r = gw.request("POST", &path, &[], &body)?;
        ensure!(matches!(r.status, 400 | 413), "{path}: {r:?}");
    }
    let r = post(&gw, &format!("{lock}/steal"), json!({}))?;
    ensure!(r.status == 404, "{r:?}");
    Ok(())
}

/// The lock endpoints and fenced writes export the cross-host table's
/// rows (docs/design.md §12) with its labels and values only: acquisition
/// latency by result, renewals by result, holder loss, the grant's epoch
/// and headroom, and decisions; `/metrics` holds no other `fencecheck_*`
/// family than the table's and the gateway's own.
#[test]
fn lock_endpoints_export_the_tables_lease_rows() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &[])?;
    let lock = "/v1/locks/reports/august";
    let a = post(
        &gw,
        &format!("{lock}/acquire"),
        json!({"lease_id": "a", "ttl_ms": 60_000}),
    )?;
    ensure!(a.status == 200, "{a:?}");
    let token = a.json()?["token"].as_str().context("no token")?.to_owned();
    let busy = post(
        &gw,
        &format!("{lock}/acquire"),
        json!({"lease_id": "b", "ttl_ms": 60_000}),
    )?;
    ensure!(busy.status == 409, "{busy:?}");
    let renewed = post(
        &gw,
        &format!("{lock}/renew"),
        json!({"lease_id": "a", "token": token, "ttl_ms": 60_000}),
    )?;
    ensure!(renewed.status == 200, "{renewed:?}");
    // Another lease id with A's token: not the current lease.
    let lost = post(
        &gw,
        &format!("{lock}/renew"),
        json!({"lease_id": "x", "token": token, "ttl_ms": 60_000}),
    )?;
    ensure!(lost.status == 409, "{lost:?}");
    let put = gw.request(
        "PUT",
        "/objects/reports/august",
        &[("Fence-Token", token.as_str())],
        b"A",
    )?;
    ensure!(put.status == 201, "{put:?}");

    let text = String::from_utf8(gw.request("GET", "/metrics", &[], b"")?.body)?;
    let seen = fencecheck_tests::signals::check_exposition(&text, "fencecheck_gateway_")?;
    fencecheck_tests::signals::expect_seen(
        &seen,
        &[
            (
                "fencecheck_lease_acquire_duration_seconds",
                &[("result", "acquired"), ("result", "busy")],
            ),
            (
                "fencecheck_lease_renewals_total",
                &[("result", "renewed"), ("result", "lost")],
            ),
            ("fencecheck_lease_holder_lost_total", &[]),
            ("fencecheck_lease_epoch", &[]),
            ("fencecheck_token_headroom", &[]),
            (
                "fencecheck_decisions_total",
                &[("operation", "put"), ("outcome", "applied")],
            ),
        ],
    )?;
    ensure!(gw.metric("fencecheck_lease_holder_lost_total")? == Some(1.0));
    ensure!(gw.metric("fencecheck_lease_renewals_total{result=\"lost\"}")? == Some(1.0));
    ensure!(
        gw.metric("fencecheck_token_headroom")?
            .is_some_and(|h| h > 1e18)
    );
    Ok(())
}
