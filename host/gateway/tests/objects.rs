//! The HTTP object-store clients expect, over real HTTP (authenticated):
//! create-only and conditional writes, conditional reads, ranges, the
//! writer's Content-Type, Last-Modified, listings in pages, UTF-8 keys,
//! honest idempotency, and a missing blob that is never served as 200.

use crate::common;

use anyhow::{Context, ensure};
use common::{Gateway, Response};

fn put(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    gw.request("PUT", path, headers, body)
}

fn get(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> anyhow::Result<Response> {
    gw.request("GET", path, headers, b"")
}

/// `If-None-Match: *` creates only: 201 on an absent (or deleted) key, 412
/// once it exists, even with a newer token (which stays unused: the next
/// plain write with it applies). Two create-only writers racing on one key:
/// exactly one wins. `If-Match: *` needs the key; `If-Match` with a list
/// applies when the current ETag is in it (weak tags never match).
#[test]
fn conditional_writes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &[])?;
    let create = |token: &str, body: &[u8]| {
        put(
            &gw,
            "/objects/c",
            &[("Fence-Token", token), ("If-None-Match", "*")],
            body,
        )
    };
    let r = create("0.1", b"first")?;
    ensure!(
        r.status == 201 && r.header("etag") == Some("\"1\""),
        "{r:?}"
    );
    let r = create("0.2", b"second")?;
    ensure!(r.status == 412, "{r:?}");
    ensure!(
        r.json()?["expected"] == "absent" && r.json()?["actual"] == 1,
        "{r:?}"
    );
    let r = get(&gw, "/objects/c", &[])?;
    ensure!(r.body == b"first", "{r:?}");
    // The refused token is still good.
    ensure!(put(&gw, "/objects/c", &[("Fence-Token", "0.2")], b"two")?.status == 200);
    // Deleted keys can be created again.
    ensure!(
        gw.request("DELETE", "/objects/c", &[("Fence-Token", "0.3")], b"")?
            .status
            == 204
    );
    let r = create("0.4", b"again")?;
    ensure!(
        r.status == 201 && r.header("etag") == Some("\"4\""),
        "{r:?}"
    );

    // If-Match: * needs an existing object.
    let r = put(
        &gw,
        "/objects/m",
        &[("Fence-Token", "0.1"), ("If-Match", "*")],
        b"x",
    )?;
    ensure!(r.status == 412, "{r:?}");
    ensure!(put(&gw, "/objects/m", &[("Fence-Token", "0.1")], b"v1")?.status == 201);
    let r = put(
        &gw,
        "/objects/m",
        &[("Fence-Token", "0.1"), ("If-Match", "*")],
        b"v2",
    )?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"2\""),
        "{r:?}"
    );
    let r = put(
        &gw,
        "/objects/m",
        &[("Fence-Token", "0.1"), ("If-Match", "\"7\", \"2\"")],
        b"v3",
    )?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"3\""),
        "{r:?}"
    );
    let r = put(
        &gw,
        "/objects/m",
        &[("Fence-Token", "0.1"), ("If-Match", "W/\"3\"")],
        b"v4",
    )?;
    ensure!(r.status == 412, "weak tags never match If-Match: {r:?}");
    let r = put(
        &gw,
        "/objects/m",
        &[("Fence-Token", "0.1"), ("If-None-Match", "\"3\"")],
        b"v4",
    )?;
    ensure!(r.status == 412, "{r:?}");
    ensure!(get(&gw, "/objects/m", &[])?.body == b"v3");

    // Racing creators, each its own token: one 201, the others 412 or 409.
    let addr = gw.addr.clone();
    let auth = gw.auth_header().context("auth")?;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let (addr, auth, barrier) = (addr.clone(), auth.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                common::request_to(
                    &addr,
                    "PUT",
                    "/objects/race",
                    &[
                        ("Fence-Token", &format!("0.{}", i + 1)),
                        ("If-None-Match", "*"),
                        ("Authorization", &auth),
                    ],
                    format!("racer {i}").as_bytes(),
                )
            })
        })
        .collect();
    let mut created = 0;
    for racer in racers {
        let r = racer
            .join()
            .map_err(|_| anyhow::anyhow!("racer panicked"))??;
        match r.status {
            201 => created += 1,
            409 | 412 => {}
            s => anyhow::bail!("racer got {s}: {r:?}"),
        }
    }
    ensure!(created == 1, "{created} racers created the key");
    let r = get(&gw, "/objects/race", &[])?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"1\""),
        "{r:?}"
    );
    Ok(())
}

/// Conditional reads: `If-None-Match` with the current ETag (strong, weak
/// or `*`) is 304 without a body; another ETag is 200. `If-Modified-Since`
/// at or after `Last-Modified` is 304. `If-Match` with another ETag is 412.
/// The writer's Content-Type comes back; without one, octet-stream.
#[test]
fn conditional_reads_and_metadata() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &[])?;
    let r = put(
        &gw,
        "/objects/doc",
        &[
            ("Fence-Token", "0.1"),
            ("Content-Type", "text/csv; charset=utf-8"),
        ],
        b"a,b\n1,2\n",
    )?;
    ensure!(r.status == 201, "{r:?}");
    let r = get(&gw, "/objects/doc", &[])?;
    ensure!(
        r.header("content-type") == Some("text/csv; charset=utf-8"),
        "{r:?}"
    );
    ensure!(r.header("accept-ranges") == Some("bytes"), "{r:?}");
    let modified = r
        .header("last-modified")
        .context("no Last-Modified")?
        .to_owned();
    ensure!(httpdate::parse_http_date(&modified).is_ok(), "{modified}");
    for tag in ["\"1\"", "W/\"1\"", "*", "\"9\", \"1\""] {
        let r = get(&gw, "/objects/doc", &[("If-None-Match", tag)])?;
        ensure!(r.status == 304 && r.body.is_empty(), "{tag}: {r:?}");
        ensure!(r.header("etag") == Some("\"1\""), "{r:?}");
    }
    let r = get(&gw, "/objects/doc", &[("If-None-Match", "\"2\"")])?;
    ensure!(r.status == 200 && r.body == b"a,b\n1,2\n", "{r:?}");
    let r = get(&gw, "/objects/doc", &[("If-Modified-Since", &modified)])?;
    ensure!(r.status == 304, "{r:?}");
    let r = get(
        &gw,
        "/objects/doc",
        &[("If-Modified-Since", "Thu, 01 Jan 1970 00:00:00 GMT")],
    )?;
    ensure!(r.status == 200, "{r:?}");
    let r = get(&gw, "/objects/doc", &[("If-Match", "\"2\"")])?;
    ensure!(r.status == 412, "{r:?}");
    ensure!(put(&gw, "/objects/plain", &[("Fence-Token", "0.1")], b"x")?.status == 201);
    let r = get(&gw, "/objects/plain", &[])?;
    ensure!(
        r.header("content-type") == Some("application/octet-stream"),
        "{r:?}"
    );
    // HEAD: the headers of GET, no body.
    let r = gw.request("HEAD", "/objects/doc", &[], b"")?;
    ensure!(
        r.status == 200 && r.body.is_empty() && r.header("content-length") == Some("8"),
        "{r:?}"
    );
    ensure!(
        r.header("content-type") == Some("text/csv; charset=utf-8"),
        "{r:?}"
    );
    Ok(())
}

/// Ranges: first bytes, an open end, a suffix, a range past the end (cut
/// to it) are 206 with Content-Range and exactly those bytes; a start past
/// the end is 416 with `Content-Range: bytes */LEN`; several ranges, or
/// `If-Range` with an old ETag, get the whole object (200).
#[test]
fn ranges() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &[])?;
    let body: Vec<u8> = (0..100u8).collect();
    ensure!(put(&gw, "/objects/r", &[("Fence-Token", "0.1")], &body)?.status == 201);
    for (range, start, end) in [
        ("bytes=0-9", 0, 9),
        ("bytes=90-", 90, 99),
        ("bytes=-5", 95, 99),
        ("bytes=50-1000", 50, 99),
    ] {
        let r = get(&gw, "/objects/r", &[("Range", range)])?;
        ensure!(r.status == 206, "{range}: {r:?}");
        ensure!(r.body == body[start..=end], "{range}: {:?}", r.body);
        let want = format!("bytes {start}-{end}/100");
        ensure!(
            r.header("content-range") == Some(want.as_str()),
            "{range}: {r:?}"
        );
        ensure!(r.header("content-length") == Some((end - start + 1).to_string().as_str()));
    }
    let r = get(&gw, "/objects/r", &[("Range", "bytes=100-")])?;
    ensure!(
        r.status == 416 && r.header("content-range") == Some("bytes */100"),
        "{r:?}"
    );
    let r = get(&gw, "/objects/r", &[("Range", "bytes=0-1,5-6")])?;
    ensure!(r.status == 200 && r.body == body, "{r:?}");
    let r = get(
        &gw,
        "/objects/r",
        &[("Range", "bytes=0-1"), ("If-Range", "\"7\"")],
    )?;
    ensure!(r.status == 200 && r.body == body, "{r:?}");
    let r = get(
        &gw,
        "/objects/r",
        &[("Range", "bytes=0-1"), ("If-Range", "\"1\"")],
    )?;
    ensure!(r.status == 206 && r.body == body[..2], "{r:?}");
    Ok(())
}

/// Keys are percent-encoded UTF-8: spaces, `=`, `:`, `~`, non-ASCII round
/// trip; one key has one identity whatever its spelling (`%3D` or `=`);
/// `.`/`..` segments are refused in every spelling, as is `%2F`.
#[test]
fn utf8_keys() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &[])?;
    let r = put(
        &gw,
        "/objects/r%C3%A9sum%C3%A9s/a%20b=c:d~e",
        &[("Fence-Token", "0.1")],
        b"cv",
    )?;
    ensure!(r.status == 201, "{r:?}");
    let r = get(&gw, "/objects/r%c3%a9sum%c3%a9s/a%20b%3Dc%3Ad%7Ee", &[])?;
    ensure!(r.status == 200 && r.body == b"cv", "{r:?}");
    let list = get(&gw, "/objects/?prefix=r%C3%A9", &[])?.json()?;
    ensure!(list["objects"][0]["key"] == "résumés/a b=c:d~e", "{list}");
    ensure!(
        list["objects"][0]["path"] == "/objects/r%C3%A9sum%C3%A9s/a%20b%3Dc%3Ad~e",
        "{list}"
    );
    for bad in [
        "/objects/a/%2e%2e/b",
        "/objects/%2E",
        "/objects/a/.%2E",
        "/objects/a%2Fb",
        "/objects/a%00b",
        "/objects/%FF",
        "/objects/a%2",
    ] {
        let r = put(&gw, bad, &[("Fence-Token", "0.1")], b"x")?;
        ensure!(r.status == 400, "{bad}: {r:?}");
    }
    Ok(())
}

/// Listing: JSON pages ordered by key (byte order), `limit` per page,
/// `next` to continue with `after`; only visible objects (not deleted
/// ones), only under the prefix (a sibling `ab` is not under `a/`).
#[test]
fn listing_in_pages() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &[])?;
    let mut keys: Vec<String> = (0..7).map(|i| format!("a/{i:02}")).collect();
    keys.push("a/é".into());
    for (i, key) in keys
        .iter()
        .chain(["ab".to_string(), "a".to_string()].iter())
        .enumerate()
    {
        let path = format!("/objects/{}", fencecheck_gateway::encode_key(key));
        let r = put(
            &gw,
            &path,
            &[("Fence-Token", "0.1"), ("Content-Type", "text/plain")],
            format!("v{i}").as_bytes(),
        )?;
        ensure!(r.status == 201, "{key}: {r:?}");
    }
    ensure!(
        gw.request("DELETE", "/objects/a/03", &[("Fence-Token", "0.2")], b"")?
            .status
            == 204
    );
    keys.retain(|k| k != "a/03");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for page in 0.. {
        ensure!(page < 10, "no end");
        let path = match &after {
            None => "/objects/?prefix=a/&limit=3".to_string(),
            Some(k) => format!(
                "/objects/?prefix=a/&limit=3&after={}",
                fencecheck_gateway::encode_key(k)
            ),
        };
        let r = get(&gw, &path, &[])?;
        ensure!(
            r.status == 200 && r.header("content-type") == Some("application/json"),
            "{r:?}"
        );
        let list = r.json()?;
        let objects = list["objects"].as_array().context("objects")?;
        ensure!(objects.len() <= 3, "{list}");
        for o in objects {
            ensure!(o["content_type"] == "text/plain" && o["size"] == 2, "{o}");
            ensure!(o["etag"] == "\"1\"" && o["fence_token"] == "0.1", "{o}");
            seen.push(o["key"].as_str().context("key")?.to_owned());
        }
        match list["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    ensure!(seen == keys, "{seen:?} != {keys:?}");
    let all = get(&gw, "/objects/?limit=1000", &[])?.json()?;
    ensure!(
        all["objects"].as_array().map(Vec::len) == Some(keys.len() + 2),
        "{all}"
    );
    for bad in [
        "/objects/?limit=0",
        "/objects/?limit=1001",
        "/objects/?limit=x",
        "/objects/?size=1",
        "/objects/?prefix=a&prefix=b",
    ] {
        ensure!(get(&gw, bad, &[])?.status == 400, "{bad}");
    }
    Ok(())
}

/// An Idempotency-Key replayed with the same body is the original answer
/// (200, its ETag); with another body (or as a DELETE) it is 422 and
/// changes nothing. 204 carries no Content-Length.
#[test]
fn idempotency_keys_are_honest() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &[])?;
    let h = [("Fence-Token", "0.5"), ("Idempotency-Key", "op-1")];
    let r = put(&gw, "/objects/k", &h, b"original")?;
    ensure!(
        r.status == 201 && r.header("etag") == Some("\"1\""),
        "{r:?}"
    );
    let r = put(
        &gw,
        "/objects/k",
        &[("Fence-Token", "0.5"), ("Idempotency-Key", "op-2")],
        b"second",
    )?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"2\""),
        "{r:?}"
    );
    let r = put(&gw, "/objects/k", &h, b"original")?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"1\""),
        "replay: {r:?}"
    );
    let r = put(&gw, "/objects/k", &h, b"something else")?;
    ensure!(
        r.status == 422 && r.json()?["title"] == "idempotency-key-reused",
        "{r:?}"
    );
    let r = gw.request("DELETE", "/objects/k", &h, b"")?;
    ensure!(r.status == 422, "{r:?}");
    let r = get(&gw, "/objects/k", &[])?;
    ensure!(
        r.body == b"second" && r.header("etag") == Some("\"2\""),
        "{r:?}"
    );
    let d = [("Fence-Token", "0.5"), ("Idempotency-Key", "del-1")];
    let r = gw.request("DELETE", "/objects/k", &d, b"")?;
    ensure!(
        r.status == 204 && r.header("content-length").is_none(),
        "{r:?}"
    );
    let r = gw.request("DELETE", "/objects/k", &d, b"")?;
    ensure!(
        r.status == 204 && r.header("content-length").is_none(),
        "replayed delete: {r:?}"
    );
    ensure!(gw.blob_count()? == 2, "{} blobs", gw.blob_count()?);
    Ok(())
}

/// A pointer whose blob is gone (a crash lost it, someone removed it) is a
/// 500 problem naming the key and the object id, for GET, HEAD and a
/// range; never 200.
#[test]
fn missing_blob_is_a_clear_500() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &[])?;
    ensure!(put(&gw, "/objects/lost", &[("Fence-Token", "0.1")], b"bytes")?.status == 201);
    let blobs: Vec<_> = std::fs::read_dir(dir.path().join("blobs"))?.collect::<Result<_, _>>()?;
    ensure!(blobs.len() == 1);
    let name = blobs[0]
        .file_name()
        .into_string()
        .map_err(|_| anyhow::anyhow!("name"))?;
    std::fs::remove_file(blobs[0].path())?;
    for (method, headers) in [
        ("GET", vec![]),
        ("HEAD", vec![]),
        ("GET", vec![("Range", "bytes=0-1")]),
    ] {
        let r = gw.request(method, "/objects/lost", &headers, b"")?;
        ensure!(r.status == 500, "{method}: {r:?}");
        if method == "GET" {
            let p = r.json()?;
            ensure!(p["title"] == "blob-missing" && p["key"] == "lost", "{p}");
            let object = p["object"].as_i64().context("object id")?;
            ensure!(
                name.ends_with(&format!("-{object}")) && p["blob"] == name.as_str(),
                "{p} {name}"
            );
        }
    }
    Ok(())
}
