//! `--upstream`: blobs on a real nginx (Debian's, WebDAV PUT/DELETE on
//! loopback, started here), pointers and fences in the gateway's SQLite.

use crate::common;

use std::time::{Duration, Instant};

use anyhow::ensure;
use common::Gateway;
use common::nginx::Nginx;

fn gateway_on(nginx: &Nginx, data: &std::path::Path, extra: &[&str]) -> anyhow::Result<Gateway> {
    let upstream = format!("{}/blobs/", nginx.url);
    let mut args = vec!["--upstream", upstream.as_str(), "--upstream-timeout", "2"];
    args.extend_from_slice(extra);
    Gateway::start_authed(data, &args)
}

/// The paused writer with nginx holding the blobs: A (0.41) pauses
/// mid-upload, B (0.42) publishes, A gets 409; GET streams B's bytes back
/// from nginx; A's upload is deleted from nginx at once.
#[test]
fn paused_writer_through_nginx() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let nginx = Nginx::start(&dir.path().join("nginx"))?;
    let gw = gateway_on(&nginx, &dir.path().join("gw"), &[])?;

    let a_body = b"stale report from A";
    let mut a = gw.open(
        "PUT",
        "/objects/reports/july",
        &[("Fence-Token", "0.41")],
        None,
    )?;
    a.send(&a_body[..5])?;
    std::thread::sleep(Duration::from_millis(300));
    let b = gw.request(
        "PUT",
        "/objects/reports/july",
        &[("Fence-Token", "0.42")],
        b"corrected by B",
    )?;
    ensure!(b.status == 201, "B: {b:?}");
    a.send(&a_body[5..])?;
    let a = a.finish()?;
    ensure!(a.status == 409, "A: {a:?}");
    ensure!(a.json()?["highest"] == "0.42");

    let r = gw.request("GET", "/objects/reports/july", &[], b"")?;
    ensure!(r.status == 200 && r.body == b"corrected by B", "{r:?}");
    ensure!(r.header("etag") == Some("\"1\"") && r.header("fence-token") == Some("0.42"));
    ensure!(nginx.blob_count()? == 1, "A's upload is still on nginx");
    Ok(())
}

/// A 1 MiB body streams through to nginx and back byte for byte, chunked
/// and with a declared length; DELETE makes the key 404.
#[test]
fn large_bodies_and_delete_through_nginx() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let nginx = Nginx::start(&dir.path().join("nginx"))?;
    let gw = gateway_on(&nginx, &dir.path().join("gw"), &[])?;
    let body: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();

    let r = gw.request("PUT", "/objects/big", &[("Fence-Token", "3.1")], &body)?;
    ensure!(r.status == 201, "{r:?}");
    let mut open = gw.open("PUT", "/objects/big2", &[("Fence-Token", "3.1")], None)?;
    for part in body.chunks(100_000) {
        open.send(part)?;
    }
    let r = open.finish()?;
    ensure!(r.status == 201, "{r:?}");
    for key in ["big", "big2"] {
        let r = gw.request("GET", &format!("/objects/{key}"), &[], b"")?;
        ensure!(
            r.status == 200 && r.body == body,
            "{key}: {} {} bytes",
            r.status,
            r.body.len()
        );
    }
    let r = gw.request("DELETE", "/objects/big", &[("Fence-Token", "3.2")], b"")?;
    ensure!(r.status == 204, "{r:?}");
    ensure!(gw.request("GET", "/objects/big", &[], b"")?.status == 404);
    Ok(())
}

/// Replaced and deleted objects' blobs are collected from nginx after the
/// retention window; the visible one stays.
#[test]
fn collector_deletes_on_nginx() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let nginx = Nginx::start(&dir.path().join("nginx"))?;
    let gw = gateway_on(
        &nginx,
        &dir.path().join("gw"),
        &["--retention", "1", "--gc-interval", "1"],
    )?;
    for (i, token) in ["0.1", "0.2", "0.3"].iter().enumerate() {
        let r = gw.request(
            "PUT",
            "/objects/c",
            &[("Fence-Token", token)],
            format!("v{i}").as_bytes(),
        )?;
        ensure!(r.status == 201 || r.status == 200, "{r:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while nginx.blob_count()? > 1 {
        ensure!(Instant::now() < deadline, "replaced blobs not collected");
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = gw.request("GET", "/objects/c", &[], b"")?;
    ensure!(r.status == 200 && r.body == b"v2", "{r:?}");
    Ok(())
}

/// With nginx down, writes and reads get 503 with Retry-After, never 409.
#[test]
fn upstream_down_is_503() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let nginx = Nginx::start(&dir.path().join("nginx"))?;
    let gw = gateway_on(&nginx, &dir.path().join("gw"), &[])?;
    ensure!(
        gw.request("PUT", "/objects/d", &[("Fence-Token", "0.1")], b"one")?
            .status
            == 201
    );
    drop(nginx);

    let r = gw.request("PUT", "/objects/d", &[("Fence-Token", "0.2")], b"two")?;
    ensure!(
        r.status == 503 && r.header("retry-after").is_some(),
        "{r:?}"
    );
    let r = gw.request("GET", "/objects/d", &[], b"")?;
    ensure!(
        r.status == 503 && r.header("retry-after").is_some(),
        "{r:?}"
    );
    let r = gw.request("HEAD", "/objects/d", &[], b"")?;
    ensure!(r.status == 503, "{r:?}");
    Ok(())
}

fn store_id(data: &std::path::Path) -> anyhow::Result<String> {
    let db = rusqlite::Connection::open(data.join("fencecheck.db"))?;
    Ok(db.query_row(
        "SELECT value FROM fencecheck_gateway_meta WHERE key = 'store'",
        [],
        |r| r.get(0),
    )?)
}

/// HEAD in upstream mode asks nginx for HEAD, never GET: no body crosses
/// (nginx's access log shows a HEAD with 0 body bytes and no GET).
#[test]
fn head_transfers_no_body() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let nginx = Nginx::start(&dir.path().join("nginx"))?;
    let gw = gateway_on(&nginx, &dir.path().join("gw"), &[])?;
    let body = vec![7u8; 1 << 20];
    ensure!(
        gw.request("PUT", "/objects/big", &[("Fence-Token", "0.1")], &body)?
            .status
            == 201
    );
    // nginx writes a log line once its response is out, which may be a
    // moment after the gateway has what it needed: wait for the line.
    let lines_after = |before: usize| -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = nginx.access_log()?;
            let lines: Vec<String> = log.lines().skip(before).map(str::to_owned).collect();
            if !lines.is_empty() {
                return Ok(lines);
            }
            ensure!(Instant::now() < deadline, "nginx logged nothing");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let before = nginx.access_log()?.lines().count();
    let r = gw.request("HEAD", "/objects/big", &[], b"")?;
    ensure!(
        r.status == 200 && r.body.is_empty() && r.header("content-length") == Some("1048576"),
        "{r:?}"
    );
    let after = lines_after(before)?;
    ensure!(
        after.len() == 1 && after[0].starts_with("HEAD /blobs/") && after[0].ends_with(" 200 0"),
        "{after:?}"
    );
    // A range is asked of nginx as a range (its line too may come a
    // moment after the answer: wait for it as above).
    let before = nginx.access_log()?.lines().count();
    let r = gw.request("GET", "/objects/big", &[("Range", "bytes=10-19")], b"")?;
    ensure!(r.status == 206 && r.body == body[10..20], "{r:?}");
    let after = lines_after(before)?;
    ensure!(
        after.len() == 1 && after[0].starts_with("GET /blobs/") && after[0].ends_with(" 206 10"),
        "{after:?}"
    );
    Ok(())
}

/// Two gateways, each with its own SQLite store (so both hand out object id
/// 1 first), sharing one nginx: their blobs carry their stores' prefixes
/// and never overwrite each other.
#[test]
fn two_stores_share_one_upstream() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let nginx = Nginx::start(&dir.path().join("nginx"))?;
    let one = gateway_on(&nginx, &dir.path().join("one"), &[])?;
    let two = gateway_on(&nginx, &dir.path().join("two"), &[])?;
    ensure!(
        one.request("PUT", "/objects/k", &[("Fence-Token", "0.1")], b"from one")?
            .status
            == 201
    );
    ensure!(
        two.request("PUT", "/objects/k", &[("Fence-Token", "0.1")], b"from two")?
            .status
            == 201
    );
    ensure!(one.request("GET", "/objects/k", &[], b"")?.body == b"from one");
    ensure!(two.request("GET", "/objects/k", &[], b"")?.body == b"from two");
    let (a, b) = (store_id(&one.data)?, store_id(&two.data)?);
    ensure!(a.len() == 32 && b.len() == 32 && a != b, "{a} {b}");
    ensure!(nginx.root.join("blobs").join(format!("{a}-1")).exists());
    ensure!(nginx.root.join("blobs").join(format!("{b}-1")).exists());
    Ok(())
}

/// The collector lists nginx's JSON index and deletes this store's old
/// blobs that no row names (a crash between a row's and its blob's
/// deletion), keeping other stores' blobs and the visible one.
#[test]
fn collector_deletes_unreferenced_upstream_blobs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let nginx = Nginx::start(&dir.path().join("nginx"))?;
    let data = dir.path().join("gw");
    let gw = gateway_on(&nginx, &data, &["--retention", "1", "--gc-interval", "1"])?;
    ensure!(
        gw.request("PUT", "/objects/kept", &[("Fence-Token", "0.1")], b"kept")?
            .status
            == 201
    );
    let id = store_id(&data)?;
    let old = std::time::SystemTime::now() - Duration::from_secs(3600);
    let blobs = nginx.root.join("blobs");
    let orphan = blobs.join(format!("{id}-999999"));
    let foreign = blobs.join("0123456789abcdef0123456789abcdef-999999");
    for path in [&orphan, &foreign] {
        std::fs::write(path, b"left over")?;
        std::fs::File::options()
            .write(true)
            .open(path)?
            .set_modified(old)?;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while orphan.exists() {
        ensure!(Instant::now() < deadline, "the orphan was not collected");
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(foreign.exists(), "another store's blob was deleted");
    let r = gw.request("GET", "/objects/kept", &[], b"")?;
    ensure!(r.status == 200 && r.body == b"kept", "{r:?}");
    Ok(())
}
