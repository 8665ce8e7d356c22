//! Authentication and authorization over real HTTP: every route against
//! every right, leases bound to the principal that acquired them,
//! `--max-ttl`, the loopback-only open mode, SIGHUP reload of the auth
//! file, and secrets that never reach the log.

use crate::common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::{Gateway, Principal, Response, request_to, sha256_hex, write_auth};
use serde_json::json;

const READER: &str = "reader-secret-1";
const WRITER: &str = "writer-secret-2";
const LOCKER: &str = "locker-secret-3";
const ROOT: &str = "root-secret-4";

fn principals() -> Vec<Principal<'static>> {
    vec![
        Principal {
            name: "reader",
            secret: READER,
            read: &["r/"],
            write: &[],
            lock: &[],
        },
        Principal {
            name: "writer",
            secret: WRITER,
            read: &[],
            write: &["w/"],
            lock: &[],
        },
        Principal {
            name: "locker",
            secret: LOCKER,
            read: &[],
            write: &[],
            lock: &["l/"],
        },
        Principal {
            name: "root",
            secret: ROOT,
            read: &[""],
            write: &[""],
            lock: &[""],
        },
    ]
}

fn start(dir: &std::path::Path, extra: &[&str]) -> anyhow::Result<Gateway> {
    let file = dir.join("auth.toml");
    write_auth(&file, &principals())?;
    let file = file.display().to_string();
    let mut args = vec!["--auth", file.as_str()];
    args.extend_from_slice(extra);
    let mut gw = Gateway::spawn(&dir.join("data"), &args, None)?;
    gw.wait_healthy()?;
    Ok(gw)
}

fn call(
    gw: &Gateway,
    secret: Option<&str>,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let auth = secret.map(|s| format!("Bearer {s}"));
    let mut headers: Vec<(&str, &str)> = extra.to_vec();
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth));
    }
    request_to(&gw.addr, method, path, &headers, body)
}

fn is_problem(r: &Response, status: u16) -> bool {
    r.status == status && r.header("content-type") == Some("application/problem+json")
}

/// Every route and every right: without `Authorization` 401 with
/// `WWW-Authenticate` (also for a malformed header, an unknown secret, the
/// stored hash presented as the secret, two headers); with a principal
/// lacking the right, or holding it on another prefix, 403; with the
/// right, the route's own answer. Both as problem+json; /healthz stays open.
#[test]
fn every_route_and_right() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path(), &[])?;
    let acquire = json!({"lease_id": "x", "ttl_ms": 1000}).to_string();
    let renew = json!({"lease_id": "x", "token": "0.1", "ttl_ms": 1000}).to_string();
    let release = json!({"lease_id": "x", "token": "0.1"}).to_string();
    // (method, path, headers, body, the principal with the right, another
    // principal without it)
    type Case<'a> = (&'a str, &'a str, Vec<(&'a str, &'a str)>, &'a [u8], &'a str);
    let token = [("Fence-Token", "0.5")];
    let cases: Vec<Case> = vec![
        ("PUT", "/objects/w/a", token.to_vec(), b"body", WRITER),
        ("DELETE", "/objects/w/a", token.to_vec(), b"", WRITER),
        ("GET", "/objects/r/a", vec![], b"", READER),
        ("HEAD", "/objects/r/a", vec![], b"", READER),
        ("GET", "/objects/?prefix=r/", vec![], b"", READER),
        (
            "POST",
            "/v1/locks/l/a/acquire",
            vec![],
            acquire.as_bytes(),
            LOCKER,
        ),
        (
            "POST",
            "/v1/locks/l/a/renew",
            vec![],
            renew.as_bytes(),
            LOCKER,
        ),
        (
            "POST",
            "/v1/locks/l/a/release",
            vec![],
            release.as_bytes(),
            LOCKER,
        ),
    ];
    let hash_as_secret = sha256_hex(ROOT);
    let two = format!("Bearer {ROOT}");
    for (method, path, headers, body, holder) in &cases {
        let what = format!("{method} {path}");
        // Nobody: 401.
        let r = call(&gw, None, method, path, headers, body)?;
        ensure!(r.status == 401, "{what} anonymous: {r:?}");
        ensure!(
            r.header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer realm=\"fencecheck\"")),
            "{what}: {r:?}"
        );
        if *method != "HEAD" {
            ensure!(is_problem(&r, 401), "{what}: {r:?}");
        }
        for bad in [
            "Basic cm9vdDpyb290".to_string(),
            "Bearer".to_string(),
            "Bearer wrong-secret".to_string(),
            format!("Bearer {hash_as_secret}"),
        ] {
            let mut h = headers.clone();
            h.push(("Authorization", bad.as_str()));
            let r = request_to(&gw.addr, method, path, &h, body)?;
            ensure!(r.status == 401, "{what} with {bad:?}: {r:?}");
        }
        let mut h = headers.clone();
        h.push(("Authorization", two.as_str()));
        h.push(("Authorization", two.as_str()));
        let r = request_to(&gw.addr, method, path, &h, body)?;
        ensure!(r.status == 401, "{what} with two headers: {r:?}");
        // Every principal but the holder and root lacks the right here.
        for other in [READER, WRITER, LOCKER] {
            if other == *holder {
                continue;
            }
            let r = call(&gw, Some(other), method, path, headers, body)?;
            ensure!(r.status == 403, "{what} as {other}: {r:?}");
            if *method != "HEAD" {
                ensure!(is_problem(&r, 403), "{what}: {r:?}");
            }
        }
        // The holder has it, on its prefix only.
        let r = call(&gw, Some(holder), method, path, headers, body)?;
        ensure!(
            r.status != 401 && r.status != 403,
            "{what} as its holder: {r:?}"
        );
        let elsewhere = path
            .replacen("/w/", "/x/", 1)
            .replacen("/r/", "/x/", 1)
            .replacen("/l/", "/x/", 1)
            .replacen("prefix=r/", "prefix=x/", 1);
        let r = call(&gw, Some(holder), method, &elsewhere, headers, body)?;
        ensure!(r.status == 403, "{method} {elsewhere} as its holder: {r:?}");
    }
    // A listing with a prefix wider than the reader's right is refused.
    let r = call(&gw, Some(READER), "GET", "/objects/?prefix=", &[], b"")?;
    ensure!(r.status == 403, "{r:?}");
    let r = call(&gw, Some(READER), "GET", "/objects/?prefix=r", &[], b"")?;
    ensure!(r.status == 403, "{r:?}");
    // Metrics: any principal, nobody anonymous; health: open.
    ensure!(call(&gw, None, "GET", "/metrics", &[], b"")?.status == 401);
    ensure!(call(&gw, Some(READER), "GET", "/metrics", &[], b"")?.status == 200);
    ensure!(call(&gw, None, "GET", "/healthz", &[], b"")?.status == 200);
    // Root writes, the reader reads what root wrote under r/.
    let r = call(&gw, Some(ROOT), "PUT", "/objects/r/a", &token, b"shared")?;
    ensure!(r.status == 201, "{r:?}");
    let r = call(&gw, Some(READER), "GET", "/objects/r/a", &[], b"")?;
    ensure!(r.status == 200 && r.body == b"shared", "{r:?}");
    // The refused writes changed nothing.
    let r = call(&gw, Some(ROOT), "GET", "/objects/w/a", &[], b"")?;
    ensure!(r.status == 200 || r.status == 404, "{r:?}");
    Ok(())
}

fn post(
    gw: &Gateway,
    secret: &str,
    path: &str,
    body: serde_json::Value,
) -> anyhow::Result<Response> {
    call(
        gw,
        Some(secret),
        "POST",
        path,
        &[],
        body.to_string().as_bytes(),
    )
}

/// A lease belongs to the principal that acquired it: another principal
/// with the lock right, presenting the same lease id and token, cannot
/// renew (`lost`) or release (`not-owner`) it, and its acquire with that
/// lease id is `busy`; the owner still renews and releases. `--max-ttl`
/// bounds acquire and renew (400 `ttl-too-long`); within it, granted.
#[test]
fn leases_belong_to_their_principal() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path(), &["--max-ttl", "5"])?;
    let lock = "/v1/locks/l/job";
    let a = post(
        &gw,
        LOCKER,
        &format!("{lock}/acquire"),
        json!({"lease_id": "a7", "ttl_ms": 5000}),
    )?;
    ensure!(a.status == 200, "{a:?}");
    let a = a.json()?;
    ensure!(a["lease_id"] == "a7", "{a}");
    let token = a["token"].as_str().context("token")?.to_owned();

    // The stranger: root has the lock right on every key.
    let r = post(
        &gw,
        ROOT,
        &format!("{lock}/renew"),
        json!({"lease_id": "a7", "token": token, "ttl_ms": 5000}),
    )?;
    ensure!(r.status == 409 && r.json()?["title"] == "lost", "{r:?}");
    let r = post(
        &gw,
        ROOT,
        &format!("{lock}/release"),
        json!({"lease_id": "a7", "token": token}),
    )?;
    ensure!(
        r.status == 409 && r.json()?["title"] == "not-owner",
        "{r:?}"
    );
    let r = post(
        &gw,
        ROOT,
        &format!("{lock}/acquire"),
        json!({"lease_id": "a7", "ttl_ms": 5000}),
    )?;
    ensure!(r.status == 409 && r.json()?["title"] == "busy", "{r:?}");

    // The owner's retry of its acquire gets its own grant back.
    let again = post(
        &gw,
        LOCKER,
        &format!("{lock}/acquire"),
        json!({"lease_id": "a7", "ttl_ms": 5000}),
    )?;
    ensure!(
        again.status == 200 && again.json()?["token"] == token.as_str(),
        "{again:?}"
    );

    // --max-ttl 5 s.
    for (action, body) in [
        ("acquire", json!({"lease_id": "a7", "ttl_ms": 5001})),
        (
            "renew",
            json!({"lease_id": "a7", "token": token, "ttl_ms": 5001}),
        ),
        (
            "acquire",
            json!({"lease_id": "a7", "ttl_ms": 9_000_000_000_000_000u64}),
        ),
    ] {
        let r = post(&gw, LOCKER, &format!("{lock}/{action}"), body)?;
        ensure!(
            r.status == 400 && r.json()?["title"] == "ttl-too-long",
            "{action}: {r:?}"
        );
        ensure!(r.json()?["max_ttl_ms"] == 5000, "{r:?}");
    }
    let r = post(
        &gw,
        LOCKER,
        &format!("{lock}/renew"),
        json!({"lease_id": "a7", "token": token, "ttl_ms": 5000}),
    )?;
    ensure!(r.status == 200, "{r:?}");
    let r = post(
        &gw,
        LOCKER,
        &format!("{lock}/release"),
        json!({"lease_id": "a7", "token": token}),
    )?;
    ensure!(r.status == 200, "{r:?}");
    Ok(())
}

/// Without `--auth`, a non-loopback `--listen` is refused at startup with a
/// message naming `--auth`; on loopback the gateway serves open and says so.
#[test]
fn open_mode_is_loopback_only() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
        .args(["--listen", "0.0.0.0:0", "--data"])
        .arg(dir.path())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "started open on 0.0.0.0: {err}");
    ensure!(
        err.contains("--auth") && err.contains("--insecure-open"),
        "{err}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data"])
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let served = loop {
        if let Ok(r) = request_to(&addr, "PUT", "/objects/k", &[("Fence-Token", "0.1")], b"x") {
            break r;
        }
        ensure!(Instant::now() < deadline, "never served");
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let out = child.wait_with_output()?;
    ensure!(served.status == 201, "{served:?}");
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(log.contains("open mode"), "{log}");
    Ok(())
}

/// SIGHUP reloads the auth file: a removed principal's secret is 401 from
/// then on, a new one's is accepted; a broken file is refused and the
/// principals before it stay. Secrets never reach the log, nor do hashes.
#[test]
fn sighup_reloads_principals_and_secrets_stay_out_of_the_log() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("auth.toml");
    write_auth(&file, &principals())?;
    let log = dir.path().join("gateway.log");
    let auth = file.display().to_string();
    let mut gw = Gateway::spawn_logged(
        &dir.path().join("data"),
        &["--auth", &auth],
        Some(ROOT.to_owned()),
        Some((&log, "debug")),
        &[],
    )?;
    let result = (|| -> anyhow::Result<()> {
        gw.wait_healthy()?;
        ensure!(
            call(
                &gw,
                Some(WRITER),
                "PUT",
                "/objects/w/k",
                &[("Fence-Token", "0.1")],
                b"x"
            )?
            .status
                == 201
        );
        ensure!(call(&gw, Some("wrong-secret-9"), "GET", "/objects/w/k", &[], b"")?.status == 401);

        // The writer is removed, a new principal added.
        write_auth(
            &file,
            &[
                Principal {
                    name: "root",
                    secret: ROOT,
                    read: &[""],
                    write: &[""],
                    lock: &[""],
                },
                Principal {
                    name: "newcomer",
                    secret: "newcomer-secret-5",
                    read: &["w/"],
                    write: &[],
                    lock: &[],
                },
            ],
        )?;
        let hup = |n: f64, result: &str| -> anyhow::Result<()> {
            ensure!(
                Command::new("kill")
                    .args(["-HUP", &gw.child.id().to_string()])
                    .status()?
                    .success()
            );
            let series = format!("fencecheck_gateway_auth_reloads_total{{result=\"{result}\"}}");
            let deadline = Instant::now() + Duration::from_secs(30);
            while gw.metric(&series)?.unwrap_or(0.0) < n {
                ensure!(Instant::now() < deadline, "no {result} reload");
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        };
        hup(1.0, "ok")?;
        ensure!(
            call(
                &gw,
                Some(WRITER),
                "PUT",
                "/objects/w/k",
                &[("Fence-Token", "0.2")],
                b"x"
            )?
            .status
                == 401
        );
        let r = call(
            &gw,
            Some("newcomer-secret-5"),
            "GET",
            "/objects/w/k",
            &[],
            b"",
        )?;
        ensure!(r.status == 200 && r.body == b"x", "{r:?}");

        // A broken file: refused, the principals stay.
        std::fs::write(&file, "[[principal]]\nname = \"x\"\n")?;
        hup(1.0, "refused")?;
        ensure!(
            call(
                &gw,
                Some("newcomer-secret-5"),
                "GET",
                "/objects/w/k",
                &[],
                b""
            )?
            .status
                == 200
        );
        Ok(())
    })();
    drop(gw);
    result?;
    let text = std::fs::read_to_string(&log)?;
    ensure!(text.contains("auth reload refused"), "{text}");
    for secret in [
        READER,
        WRITER,
        LOCKER,
        ROOT,
        "newcomer-secret-5",
        "wrong-secret-9",
    ] {
        ensure!(!text.contains(secret), "a secret reached the log");
        ensure!(
            !text.contains(&sha256_hex(secret)),
            "a secret's hash reached the log"
        );
    }
    Ok(())
}
