//! The gateway over real HTTP: the paused writer, every status code, and bad
//! inputs that must change nothing.

use crate::common;

use std::time::Duration;

use anyhow::ensure;
use common::{Gateway, Response};

fn put(gw: &Gateway, key: &str, token: &str, body: &[u8]) -> anyhow::Result<Response> {
    gw.request(
        "PUT",
        &format!("/objects/{key}"),
        &[("Fence-Token", token)],
        body,
    )
}

fn get(gw: &Gateway, key: &str) -> anyhow::Result<Response> {
    gw.request("GET", &format!("/objects/{key}"), &[], b"")
}

/// The visible state of `key` is exactly `body` at `version`.
fn assert_visible(gw: &Gateway, key: &str, body: &[u8], version: u64) -> anyhow::Result<()> {
    let r = get(gw, key)?;
    ensure!(
        r.status == 200,
        "GET {key}: {} {:?}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    ensure!(
        r.body == body,
        "GET {key}: body {:?}",
        String::from_utf8_lossy(&r.body)
    );
    let etag = format!("\"{version}\"");
    ensure!(
        r.header("etag") == Some(etag.as_str()),
        "GET {key}: etag {:?}",
        r.header("etag")
    );
    Ok(())
}

/// The seed's scenario through the gateway: A (0.41) starts uploading and
/// pauses; B (0.42) publishes; A resumes and gets 409 with both tokens; B's
/// object stays visible, and A's upload leaves no blob behind.
#[test]
fn paused_writer_is_fenced_out() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &[])?;
    let a_body = b"stale report from A";
    let mut a = gw.open(
        "PUT",
        "/objects/reports/july",
        &[("Fence-Token", "0.41")],
        Some(a_body.len()),
    )?;
    a.send(&a_body[..5])?;
    // A is past the early check (no state yet) and mid-upload: it pauses.
    std::thread::sleep(Duration::from_millis(300));

    let b = put(&gw, "reports/july", "0.42", b"corrected by B")?;
    ensure!(b.status == 201, "B: {}", b.status);
    ensure!(b.header("etag") == Some("\"1\""));
    ensure!(b.header("fence-token") == Some("0.42"));

    a.send(&a_body[5..])?;
    let a = a.finish()?;
    ensure!(a.status == 409, "A: {}", a.status);
    ensure!(a.header("content-type") == Some("application/problem+json"));
    let problem = a.json()?;
    ensure!(
        problem["presented"] == "0.41" && problem["highest"] == "0.42",
        "{problem}"
    );

    assert_visible(&gw, "reports/july", b"corrected by B", 1)?;
    let r = get(&gw, "reports/july")?;
    ensure!(r.header("fence-token") == Some("0.42"));
    ensure!(gw.blob_count()? == 1, "A's blob was left behind");

    // A retrying from scratch is stopped by the early check, before upload.
    let again = put(&gw, "reports/july", "0.41", a_body)?;
    ensure!(again.status == 409);
    assert_visible(&gw, "reports/july", b"corrected by B", 1)
}

/// Every status code of the object API: 201, 200, duplicate 200 with the
/// original version, 412, 409, 428, 400, 404, 204, 405, 413, HEAD.
#[test]
fn status_codes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &["--max-body", "1024"])?;

    let r = put(&gw, "k", "1.1", b"one")?;
    ensure!(
        r.status == 201 && r.header("etag") == Some("\"1\""),
        "{r:?}"
    );
    let r = put(&gw, "k", "1.2", b"two")?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"2\""),
        "{r:?}"
    );

    // Same token, guarded by an op-id: applied once, then a duplicate that
    // reports the original version and changes nothing; the op-id with
    // another body is 422.
    let headers = [("Fence-Token", "1.3"), ("Idempotency-Key", "op-7")];
    let r = gw.request("PUT", "/objects/k", &headers, b"three")?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"3\""),
        "{r:?}"
    );
    let r = gw.request("PUT", "/objects/k", &headers, b"three")?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"3\""),
        "duplicate: {r:?}"
    );
    let r = gw.request("PUT", "/objects/k", &headers, b"three, retried")?;
    ensure!(r.status == 422, "reused: {r:?}");
    assert_visible(&gw, "k", b"three", 3)?;

    // If-Match on the wrong version: 412 with expected and actual.
    let r = gw.request(
        "PUT",
        "/objects/k",
        &[("Fence-Token", "1.4"), ("If-Match", "\"2\"")],
        b"x",
    )?;
    ensure!(r.status == 412, "{r:?}");
    let p = r.json()?;
    ensure!(p["expected"] == 2 && p["actual"] == 3, "{p}");
    // And on the right one: applied.
    let r = gw.request(
        "PUT",
        "/objects/k",
        &[("Fence-Token", "1.4"), ("If-Match", "\"3\"")],
        b"four",
    )?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"4\""),
        "{r:?}"
    );

    // Strict: the same token again without a guard is stale.
    let r = put(&gw, "k", "1.4", b"again")?;
    ensure!(r.status == 409, "{r:?}");
    let r = put(&gw, "k", "1.1", b"old")?;
    ensure!(r.status == 409 && r.json()?["highest"] == "1.4", "{r:?}");

    let r = gw.request("PUT", "/objects/k", &[], b"x")?;
    ensure!(r.status == 428, "{r:?}");
    let r = put(&gw, "k", "banana", b"x")?;
    ensure!(r.status == 400, "{r:?}");

    let r = gw.request("HEAD", "/objects/k", &[], b"")?;
    ensure!(
        r.status == 200 && r.header("content-length") == Some("4") && r.body.is_empty(),
        "{r:?}"
    );
    ensure!(get(&gw, "missing")?.status == 404);
    let r = gw.request("POST", "/objects/k", &[], b"")?;
    ensure!(r.status == 405, "{r:?}");
    let r = put(&gw, "big", "1.5", &[b'x'; 2048])?;
    ensure!(r.status == 413, "{r:?}");

    // DELETE is fenced like PUT: stale refused, current applied (tombstone).
    let r = gw.request("DELETE", "/objects/k", &[("Fence-Token", "1.3")], b"")?;
    ensure!(r.status == 409, "{r:?}");
    let r = gw.request("DELETE", "/objects/k", &[("Fence-Token", "1.5")], b"")?;
    ensure!(
        r.status == 204 && r.header("etag") == Some("\"5\""),
        "{r:?}"
    );
    ensure!(get(&gw, "k")?.status == 404);
    // After a delete the key can be created again: 201.
    let r = put(&gw, "k", "1.6", b"six")?;
    ensure!(
        r.status == 201 && r.header("etag") == Some("\"6\""),
        "{r:?}"
    );
    Ok(())
}

/// Bad inputs get clear 4xx answers and change nothing: no token, garbage
/// token, a 4 KiB token header, a 4 KiB key, bodies over the bound (declared
/// and chunked), traversal tricks, a stale token. The visible object and the
/// blob directory are as before.
#[test]
fn bad_inputs_change_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &["--max-body", "1024"])?;
    ensure!(put(&gw, "a/b", "2.1", b"good")?.status == 201);

    let long_token = "9".repeat(4096);
    let long_key = format!("/objects/{}", "k".repeat(4096));
    // (method, path, headers, expected status)
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, u16);
    let cases: Vec<Case> = vec![
        ("PUT", "/objects/a/b".into(), vec![], 428),
        (
            "PUT",
            "/objects/a/b".into(),
            vec![("Fence-Token", "1.x")],
            400,
        ),
        ("PUT", "/objects/a/b".into(), vec![("Fence-Token", "")], 400),
        (
            "PUT",
            "/objects/a/b".into(),
            vec![("Fence-Token", &long_token)],
            400,
        ),
        (
            "PUT",
            "/objects/a/b".into(),
            vec![("Fence-Token", "2.2"), ("Fence-Token", "2.3")],
            400,
        ),
        (
            "PUT",
            "/objects/a/b".into(),
            vec![("Fence-Token", "2.2"), ("If-Match", "2")],
            400,
        ),
        (
            "PUT",
            "/objects/a/b".into(),
            vec![("Fence-Token", "2.2"), ("If-None-Match", "*")],
            412,
        ),
        (
            "PUT",
            "/objects/a/b".into(),
            vec![("Fence-Token", "0.0")],
            400,
        ),
        ("PUT", long_key.clone(), vec![("Fence-Token", "2.2")], 400),
        (
            "PUT",
            "/objects/a/../a/b".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        (
            "PUT",
            "/objects/a/%2e%2e/a/b".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        (
            "PUT",
            "/objects/%2E%2E/etc/passwd".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        (
            "PUT",
            "/objects/a//b".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        (
            "PUT",
            "/objects/a/./b".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        (
            "PUT",
            "/objects/a/b/".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        // The collection: only GET (the listing).
        ("PUT", "/objects/".into(), vec![("Fence-Token", "2.2")], 405),
        (
            "PUT",
            "/objects/a%2fb".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        (
            "PUT",
            "/objects/a/b?x=1".into(),
            vec![("Fence-Token", "2.2")],
            400,
        ),
        ("GET", "/objects/a/../a/b".into(), vec![], 400),
        ("DELETE", "/objects/a/b".into(), vec![], 428),
        (
            "DELETE",
            "/objects/a/b".into(),
            vec![("Fence-Token", "2.0")],
            409,
        ),
        (
            "PUT",
            "/objects/a/b".into(),
            vec![("Fence-Token", "2.0")],
            409,
        ),
    ];
    for (method, path, headers, want) in &cases {
        let r = gw.request(method, path, headers, b"evil")?;
        ensure!(
            r.status == *want,
            "{method} {path} {headers:?}: {} (want {want})",
            r.status
        );
        if r.status != 404 {
            ensure!(
                r.header("content-type") == Some("application/problem+json"),
                "{method} {path}: {r:?}"
            );
        }
    }
    // Over the bound: declared, and chunked (only known while streaming).
    let r = put(&gw, "a/b", "2.2", &[b'x'; 1025])?;
    ensure!(r.status == 413, "declared: {r:?}");
    let mut open = gw.open("PUT", "/objects/a/b", &[("Fence-Token", "2.2")], None)?;
    for _ in 0..4 {
        open.send(&[b'x'; 512])?;
    }
    let r = open.finish()?;
    ensure!(r.status == 413, "chunked: {r:?}");

    assert_visible(&gw, "a/b", b"good", 1)?;
    ensure!(gw.blob_count()? == 1, "a refused request left a blob");
    // The token was not used up by any of it.
    ensure!(put(&gw, "a/b", "2.2", b"next")?.status == 200);
    Ok(())
}

/// A body that stalls (slow loris) is cut off with 408 and publishes nothing.
#[test]
fn stalled_body_times_out() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &["--body-timeout", "1"])?;
    let mut open = gw.open("PUT", "/objects/slow", &[("Fence-Token", "0.1")], Some(100))?;
    open.send(b"a few bytes")?;
    let r = open.response()?;
    ensure!(r.status == 408, "{r:?}");
    ensure!(get(&gw, "slow")?.status == 404);
    ensure!(gw.blob_count()? == 0);
    // The token is still good.
    ensure!(put(&gw, "slow", "0.1", b"now")?.status == 201);
    Ok(())
}

/// /healthz answers, and /metrics counts decisions by outcome in Prometheus
/// text format, without per-key labels.
#[test]
fn health_and_metrics() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &[])?;
    ensure!(gw.request("GET", "/healthz", &[], b"")?.status == 200);
    ensure!(put(&gw, "m/secret-key", "0.5", b"x")?.status == 201);
    ensure!(put(&gw, "m/secret-key", "0.4", b"x")?.status == 409);
    let r = gw.request("GET", "/metrics", &[], b"")?;
    ensure!(r.status == 200);
    let text = String::from_utf8(r.body)?;
    ensure!(
        text.contains(
            r#"fencecheck_gateway_requests_total{epoch="0",op="put",outcome="applied"} 1"#
        ),
        "{text}"
    );
    ensure!(text.contains(r#"outcome="stale-fence"} 1"#), "{text}");
    // The cross-host table's name (docs/design.md §12), with its labels.
    for line in [
        r#"fencecheck_decisions_total{epoch="0",operation="put",outcome="applied"} 1"#,
        r#"fencecheck_decisions_total{epoch="0",operation="put",outcome="stale-fence"} 1"#,
    ] {
        ensure!(text.contains(line), "{line} missing from:\n{text}");
    }
    ensure!(
        !text.contains(r#"fencecheck_decisions_total{epoch="none",operation="get""#),
        "a read is no decision"
    );
    ensure!(text.contains("fencecheck_gateway_request_duration_seconds_bucket"));
    ensure!(!text.contains("secret-key"), "a key leaked into labels");
    Ok(())
}

/// The collector deletes this store's blobs no row references (a crash
/// between deleting a row and its blob), keeps the visible one, and leaves
/// files that are not this store's alone.
#[test]
fn collector_removes_orphans() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &["--retention", "0", "--gc-interval", "1"])?;
    ensure!(put(&gw, "c", "0.1", b"kept")?.status == 201);
    let db = rusqlite::Connection::open(dir.path().join("fencecheck.db"))?;
    let store: String = db.query_row(
        "SELECT value FROM fencecheck_gateway_meta WHERE key = 'store'",
        [],
        |r| r.get(0),
    )?;
    let orphan = dir.path().join("blobs").join(format!("{store}-999999"));
    std::fs::write(&orphan, b"orphan")?;
    std::fs::write(dir.path().join("blobs").join("999999"), b"not ours")?;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while orphan.exists() {
        ensure!(std::time::Instant::now() < deadline, "orphan not collected");
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(gw.blob_count()? == 2, "{} files", gw.blob_count()?);
    assert_visible(&gw, "c", b"kept", 1)
}

/// Over `--max-in-flight`, a request that needs storage work gets 503 with
/// Retry-After (never a verdict on the token), and is served again once
/// the operation holding the only permit finishes; a GET is still served. The permit is held
/// by a PUT whose staging waits for SQLite's write lock, which the test
/// holds from outside.
#[test]
fn in_flight_bound_is_503() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(dir.path(), &["--max-in-flight", "1"])?;
    ensure!(put(&gw, "warm", "0.1", b"x")?.status == 201);
    let db = rusqlite::Connection::open(dir.path().join("fencecheck.db"))?;
    db.execute_batch("BEGIN IMMEDIATE")?;
    let addr = gw.addr.clone();
    let blocked = std::thread::spawn(move || {
        common::request_to(
            &addr,
            "PUT",
            "/objects/busy",
            &[("Fence-Token", "0.1")],
            b"abcd",
        )
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(4);
    while gw.metric("fencecheck_gateway_in_flight")? != Some(1.0) {
        ensure!(
            std::time::Instant::now() < deadline,
            "the PUT never held the permit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = put(&gw, "other", "0.1", b"x")?;
    ensure!(
        r.status == 503 && r.header("retry-after") == Some("1"),
        "{r:?}"
    );
    // Reads do not queue behind writes: a GET's pointer read runs on the
    // request's own thread (SQLite, WAL), not in a storage slot.
    let r = get(&gw, "warm")?;
    ensure!(r.status == 200 && r.body == b"x", "{r:?}");
    db.execute_batch("ROLLBACK")?;
    let r = blocked
        .join()
        .map_err(|_| anyhow::anyhow!("the blocked PUT panicked"))??;
    ensure!(r.status == 201, "{r:?}");
    ensure!(put(&gw, "other", "0.1", b"x")?.status == 201);
    Ok(())
}
