//! TLS: the gateway's listener (`--tls-cert/--tls-key`, Pingora's rustls)
//! with a real HTTPS client, and `--postgres` over TLS to a real PostgreSQL
//! that requires it, with the password from `PGPASSFILE` and a bounded pool.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::pki::{Pki, client};
use common::{Gateway, ROOT_SECRET, request_to};
use fencecheck_tests::pgserver::PgServer;

fn start_tls(dir: &Path, pki: &Pki, extra: &[&str]) -> anyhow::Result<(Gateway, String)> {
    let (cert, key) = (
        pki.cert.display().to_string(),
        pki.key.display().to_string(),
    );
    let mut args = vec!["--tls-cert", cert.as_str(), "--tls-key", key.as_str()];
    args.extend_from_slice(extra);
    // start_authed's health probe speaks plain HTTP: probe over HTTPS here.
    let data = dir.join("data");
    let file = common::root_auth(&data)?.display().to_string();
    args.extend_from_slice(&["--auth", file.as_str()]);
    let mut gw = Gateway::spawn(&data, &args, Some(ROOT_SECRET.to_owned()))?;
    let base = format!("https://{}", gw.addr);
    let agent = client(&pki.ca)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = agent.get(format!("{base}/healthz")).call()
            && r.status() == 200
        {
            return Ok((gw, base));
        }
        if let Some(status) = gw.child.try_wait()? {
            anyhow::bail!("the gateway exited: {status}");
        }
        ensure!(Instant::now() < deadline, "never healthy over HTTPS");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// HTTPS end to end with a client that trusts only the test CA: PUT, GET,
/// a stale PUT's 409. A plain-HTTP request to the TLS port gets no HTTP
/// answer; a client trusting another CA fails the handshake and changes
/// nothing.
#[test]
fn https_listener_with_a_real_client() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let pki = Pki::new()?;
    let (gw, base) = start_tls(dir.path(), &pki, &[])?;
    let agent = client(&pki.ca)?;
    let auth = format!("Bearer {ROOT_SECRET}");
    let mut r = agent
        .put(format!("{base}/objects/tls/k"))
        .header("Authorization", &auth)
        .header("Fence-Token", "0.2")
        .send(&b"over tls"[..])?;
    ensure!(
        r.status() == 201,
        "{}: {}",
        r.status(),
        r.body_mut().read_to_string()?
    );
    let mut r = agent
        .get(format!("{base}/objects/tls/k"))
        .header("Authorization", &auth)
        .call()?;
    ensure!(r.status() == 200 && r.body_mut().read_to_vec()? == b"over tls");
    let r = agent
        .put(format!("{base}/objects/tls/k"))
        .header("Authorization", &auth)
        .header("Fence-Token", "0.1")
        .send(&b"stale"[..])?;
    ensure!(r.status() == 409, "{}", r.status());
    let r = agent.get(format!("{base}/objects/tls/k")).call()?;
    ensure!(r.status() == 401, "{}", r.status());

    ensure!(
        request_to(&gw.addr, "GET", "/healthz", &[], b"").is_err(),
        "plain HTTP was answered on the TLS port"
    );
    let stranger = client(&pki.other_ca)?;
    let refused = stranger
        .put(format!("{base}/objects/tls/k"))
        .header("Authorization", &auth)
        .header("Fence-Token", "0.3")
        .send(&b"mitm"[..]);
    ensure!(refused.is_err(), "a client of another CA got through");
    let mut r = agent
        .get(format!("{base}/objects/tls/k"))
        .header("Authorization", &auth)
        .call()?;
    ensure!(r.body_mut().read_to_vec()? == b"over tls");
    Ok(())
}

/// Unusable TLS files stop the gateway at startup with a message, not a
/// panic: a key that is not the certificate's, a file that is no PEM.
#[test]
fn bad_tls_files_stop_the_gateway() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (a, b) = (Pki::new()?, Pki::new()?);
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate")?;
    for (cert, key, needle) in [
        (&a.cert, &b.key, "do not work together"),
        (&junk, &a.key, "no certificate"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(dir.path())
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && err.contains(needle), "{err}");
        ensure!(!err.contains("panicked"), "{err}");
    }
    Ok(())
}

/// Turn TLS on in a running test server and make role `gw` (password
/// `pw-gw-123`) able to log in only over TLS with that password.
fn require_tls(server: &PgServer, pki: &Pki) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
    let mut admin = server.client()?;
    let data: String = admin.query_one("SHOW data_directory", &[])?.get(0);
    let hba: String = admin.query_one("SHOW hba_file", &[])?.get(0);
    let owner = std::fs::metadata(&data)?;
    for (from, name) in [
        (&pki.cert, "gw-server.pem"),
        (&pki.key, "gw-server-key.pem"),
    ] {
        let to = Path::new(&data).join(name);
        std::fs::copy(from, &to)?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))?;
        chown(&to, Some(owner.uid()), Some(owner.gid()))?;
    }
    let rules = std::fs::read_to_string(&hba)?;
    std::fs::write(
        &hba,
        format!(
            "hostssl all gw 127.0.0.1/32 scram-sha-256\nhost all gw 127.0.0.1/32 reject\n{rules}"
        ),
    )?;
    // One statement each: ALTER SYSTEM refuses a transaction block.
    for sql in [
        "ALTER SYSTEM SET ssl = on",
        "ALTER SYSTEM SET ssl_cert_file = 'gw-server.pem'",
        "ALTER SYSTEM SET ssl_key_file = 'gw-server-key.pem'",
        "SET password_encryption = 'scram-sha-256'",
        "CREATE ROLE gw LOGIN PASSWORD 'pw-gw-123'",
        "GRANT ALL ON SCHEMA public TO gw",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(sql)?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let on: String = server.client()?.query_one("SHOW ssl", &[])?.get(0);
        if on == "on" {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "ssl never turned on");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--postgres ... sslmode=require` to a server that accepts role `gw` only
/// over TLS with a password: with the password in a 0600 `PGPASSFILE` and
/// the CA in `PGSSLROOTCERT` the gateway serves, every connection it holds
/// is TLS (`pg_stat_ssl`), and 24 concurrent writers never make it open
/// more than `--pg-pool 2` store connections (plus the lease
/// coordinator's one). Without the password file, with the password in the
/// connection string, or trusting another CA, it refuses to start.
#[test]
fn postgres_over_tls_with_pgpassfile_and_a_bounded_pool() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let pki = Pki::new()?;
    require_tls(&server, &pki)?;
    let dir = tempfile::tempdir()?;
    let pgpass = dir.path().join("pgpass");
    std::fs::write(
        &pgpass,
        format!("127.0.0.1:{}:*:gw:pw-gw-123\n", server.port()),
    )?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600))?;
    }
    let url = format!(
        "host=127.0.0.1 port={} user=gw dbname=postgres sslmode=require application_name=gwtls connect_timeout=10",
        server.port()
    );
    let data = dir.path().join("data");
    let auth = common::root_auth(&data)?.display().to_string();
    let args = [
        "--postgres",
        url.as_str(),
        "--pg-pool",
        "2",
        "--auth",
        auth.as_str(),
    ];
    let env_ok = [
        ("PGPASSFILE", pgpass.as_path()),
        ("PGSSLROOTCERT", pki.ca.as_path()),
    ];
    let mut gw = Gateway::spawn_logged(&data, &args, Some(ROOT_SECRET.into()), None, &env_ok)?;
    gw.wait_healthy()?;

    let addr = gw.addr.clone();
    let writers: Vec<_> = (0..24)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                common::request_to(
                    &addr,
                    "PUT",
                    &format!("/objects/pool/{i}"),
                    &[
                        ("Fence-Token", "0.1"),
                        ("Authorization", &format!("Bearer {ROOT_SECRET}")),
                    ],
                    b"x",
                )
            })
        })
        .collect();
    for w in writers {
        let r = w
            .join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
        ensure!(r.status == 201, "{r:?}");
    }
    let mut admin = server.client()?;
    let (total, tls): (i64, i64) = {
        let row = admin.query_one(
            "SELECT count(*), count(*) FILTER (WHERE s.ssl)
               FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
              WHERE a.application_name = 'gwtls'",
            &[],
        )?;
        (row.get(0), row.get(1))
    };
    ensure!(
        (2..=3).contains(&total),
        "{total} connections for --pg-pool 2 (+1 for leases)"
    );
    ensure!(tls == total, "only {tls} of {total} connections use TLS");
    drop(gw);

    // Refusals at startup, each with its reason.
    let bad_url = format!("{url} password=pw-gw-123");
    let elsewhere = dir.path().join("nothing");
    for (args, env, needle) in [
        (
            vec!["--postgres", url.as_str()],
            vec![
                ("PGPASSFILE", elsewhere.as_path()),
                ("PGSSLROOTCERT", pki.ca.as_path()),
            ],
            "password",
        ),
        (
            vec!["--postgres", bad_url.as_str()],
            env_ok.to_vec(),
            "PGPASSFILE",
        ),
        (
            vec!["--postgres", url.as_str()],
            vec![
                ("PGPASSFILE", pgpass.as_path()),
                ("PGSSLROOTCERT", pki.other_ca.as_path()),
            ],
            "certificate",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
            .args(["--listen", "127.0.0.1:0", "--data"])
            .arg(&data)
            .args(&args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .env("HOME", &elsewhere)
            .output()
            .context("running the gateway")?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains(needle),
            "{args:?}: {err}"
        );
        ensure!(
            !err.contains("pw-gw-123"),
            "the password was printed: {err}"
        );
    }
    Ok(())
}
