//! Signed tokens over HTTP: a gateway started with `--signing-key` hands out
//! signed tokens from its lock endpoints; keys whose prefix requires signed
//! tokens (the store's `fencecheck_keys`) accept them and refuse every
//! token the authority did not sign with 403 `unauthenticated`, before the
//! upload, changing nothing.

use crate::common;

use anyhow::{Context, ensure};
use common::{Gateway, Response};
use fencecheck::{GrantKey, SignedTokenText};
use serde_json::json;

const SECRET: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

fn put(gw: &Gateway, path: &str, token: &str, body: &[u8]) -> anyhow::Result<Response> {
    gw.request("PUT", path, &[("Fence-Token", token)], body)
}

/// The lock-out attack against the gateway: with `reports/` opted in, a
/// forged u64::MAX token is 403 (unsigned; with an honest signature pasted
/// on, bad-signature) and the honest signed grant is then applied; on a key
/// outside the prefix the same forged token still locks honest writers out,
/// which is why scopes opt in.
#[test]
fn signed_tokens_over_http() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("signing.key");
    std::fs::write(&key_file, format!("7:{SECRET}\n"))?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let gw = Gateway::start(&data, &["--signing-key", &key_file.display().to_string()])?;
    let conn = rusqlite::Connection::open(data.join("fencecheck.db"))?;
    let secret = (0u8..32).collect();
    fencecheck_sqlite::set_keys(&conn, "reports/", &[GrantKey { key_id: 7, secret }])?;

    let acquired = gw.request(
        "POST",
        "/v1/locks/reports/july/acquire",
        &[("Content-Type", "application/json")],
        json!({"lease_id": "b9", "ttl_ms": 60_000})
            .to_string()
            .as_bytes(),
    )?;
    ensure!(acquired.status == 200, "{acquired:?}");
    let token = acquired.json()?["token"]
        .as_str()
        .context("no token")?
        .to_owned();
    let signed: SignedTokenText = token.parse()?;
    ensure!(
        signed.signature.as_ref().map(|s| s.key_id) == Some(7),
        "{token}"
    );

    // The forger copies the authority, so only the signature can stop it.
    let max = format!(
        "{}:18446744073709551615.18446744073709551615",
        signed.token.authority
    );
    let max = max.as_str();
    let r = put(&gw, "/objects/reports/july", max, b"forged")?;
    ensure!(r.status == 403, "{r:?}");
    ensure!(
        r.json()?["title"] == "unauthenticated" && r.json()?["reason"] == "unsigned",
        "{r:?}"
    );
    let pasted = format!("{max}~{}", token.split_once('~').context("unsigned")?.1);
    let r = put(&gw, "/objects/reports/july", &pasted, b"forged")?;
    ensure!(
        r.status == 403 && r.json()?["reason"] == "bad-signature",
        "{r:?}"
    );
    let r = put(&gw, "/objects/reports/july", &token, b"honest")?;
    ensure!(r.status == 201, "{r:?}");
    let got = gw.request("GET", "/objects/reports/july", &[], b"")?;
    ensure!(got.status == 200 && got.body == b"honest", "{got:?}");
    // The refused uploads left no blob behind: only the honest one.
    ensure!(gw.blob_count()? == 1, "{} blobs", gw.blob_count()?);

    // Not opted in: the forger takes the key for good.
    ensure!(put(&gw, "/objects/notes/a", max, b"forged")?.status == 201);
    let r = put(&gw, "/objects/notes/a", &token, b"honest")?;
    ensure!(r.status == 409, "{r:?}");
    // A malformed signature part is a 400, like any malformed token.
    let r = put(&gw, "/objects/reports/july", "0.5~7~x=~AA", b"x")?;
    ensure!(r.status == 400, "{r:?}");
    Ok(())
}

/// A signing key file that is not exactly one usable key stops the gateway
/// at startup, naming the problem and never the secret.
#[test]
fn bad_signing_keys_stop_the_gateway() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    for (body, needle) in [
        ("7:0011".to_string(), "short-secret"),
        (format!("1:{SECRET}\n2:{SECRET}"), "2 keys"),
    ] {
        let key_file = dir.path().join("k");
        std::fs::write(&key_file, &body)?;
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path())
            .arg("--signing-key")
            .arg(&key_file)
            .output()?;
        let err = String::from_utf8(out.stderr)?;
        ensure!(
            !out.status.success() && err.contains(needle),
            "{body}: {err}"
        );
        ensure!(!err.contains(SECRET), "the secret was printed");
    }
    Ok(())
}
