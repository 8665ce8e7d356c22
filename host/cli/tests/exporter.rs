//! `fencecheck exporter` against real servers: Redis 7.0 and Valkey 8
//! loading the module (host/redis) and PostgreSQL with the extension
//! preloaded (host/postgres-ext, installed by scripts/install-pg-extension),
//! counters moved by real fenced writes; what it serves checked against
//! `FENCE.METRICS` and `fencecheck.metrics()` read directly, by `promtool
//! check metrics`, and by a real Prometheus server scraping it. Targets
//! that are down, silent, hostile or misconfigured are `up 0` and bounded,
//! and never stop the others.

use crate::common;
use crate::harness;

use crate::server;

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result, ensure};
use common::fencecheck;
use fencecheck_tests::pgserver::PgServer;
use harness::{Exporter, Prometheus, Series, fake_peer, of_target, promtool_check, samples, up};
use server::{Kind, Options, Server, Value};

const PASSWORD: &str = "s3cret-exporter-pw";

/// FENCE.SET `token` on `key`: the reply (applied, or a STALEFENCE error).
fn fence_set(c: &mut server::Conn, key: &str, token: &str) -> Result<Value> {
    c.cmd(&["FENCE.SET", key, token, &format!("v{token}")])
}

/// Two applied writes and one stale one on report/july.
fn redis_writes(c: &mut server::Conn) -> Result<()> {
    for token in ["1.5", "1.7"] {
        let r = fence_set(c, "report/july", token)?;
        ensure!(r.error().is_none(), "{token}: {r:?}");
    }
    let stale = fence_set(c, "report/july", "1.6")?;
    ensure!(
        stale.error().is_some_and(|e| e.starts_with("STALEFENCE")),
        "{stale:?}"
    );
    Ok(())
}

/// FENCE.METRICS read directly, as samples.
fn redis_direct(c: &mut server::Conn) -> Result<BTreeMap<Series, f64>> {
    let text = c
        .ok(&["FENCE.METRICS"])?
        .text()
        .context("FENCE.METRICS text")?;
    samples(&text)
}

/// A preloaded server with the extension and a fenced catalog that saw
/// one insert, one update and one stale update.
fn postgres_with_writes() -> Result<(PgServer, postgres::Client)> {
    let server = PgServer::start_with_settings(&["shared_preload_libraries=fencecheck"])?;
    let mut db = server.client()?;
    db.batch_execute(
        "CREATE EXTENSION fencecheck;
         CREATE TABLE report_catalog (report_id text PRIMARY KEY, visible_object text,
                                      fence_token text, fence_state bytea);
         SELECT fence_protect('report_catalog', 'report_id', 'fence_token', 'fence_state', 'strict');
         INSERT INTO report_catalog (report_id, fence_token) VALUES ('report/july', '0.42');
         UPDATE report_catalog SET visible_object = 'x', fence_token = '0.43';",
    )
    .context("the extension (run scripts/install-pg-extension first)")?;
    let stale = db.execute(
        "UPDATE report_catalog SET visible_object = 'y', fence_token = '0.41'",
        &[],
    );
    let code = stale
        .as_ref()
        .err()
        .and_then(|e| e.code())
        .map(|c| c.code().to_owned());
    ensure!(code.as_deref() == Some("5F001"), "{stale:?}");
    Ok((server, db))
}

fn pg_direct(db: &mut postgres::Client) -> Result<BTreeMap<Series, f64>> {
    let text: String = db.query_one("SELECT fencecheck.metrics()", &[])?.get(0);
    samples(&text)
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    (
        name.to_owned(),
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

/// One scrape reports Redis (with a password), Valkey and PostgreSQL: each
/// target's series are exactly what FENCE.METRICS / fencecheck.metrics()
/// answer directly, labelled with the target (no password anywhere), in
/// the cross-host table's names, valid for promtool; other paths are 404.
/// A target stopped mid-run is `up 0` while the others keep reporting
/// fresh counts, and SIGTERM ends the exporter with status 0.
#[test]
fn scrapes_match_direct_reads_and_a_stopped_target_is_down() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let redis = Server::start(Kind::Redis, Options::module().with("requirepass", PASSWORD))?;
    let mut valkey = Server::start(Kind::Valkey, Options::module())?;
    let mut rc = redis.conn()?;
    rc.ok(&["AUTH", PASSWORD])?;
    redis_writes(&mut rc)?;
    let mut vc = valkey.conn()?;
    redis_writes(&mut vc)?;
    let (pg, mut db) = postgres_with_writes()?;

    let redis_label = format!("127.0.0.1:{}", redis.port);
    let valkey_label = format!("127.0.0.1:{}", valkey.port);
    let pg_label = format!("127.0.0.1:{}/postgres", pg.port());
    let exporter = Exporter::start(
        dir.path(),
        &[
            "--redis".into(),
            format!("redis://:{PASSWORD}@127.0.0.1:{}", redis.port),
            "--redis".into(),
            format!("redis://127.0.0.1:{}", valkey.port),
            "--postgres".into(),
            pg.url(),
        ],
    )?;
    let text = exporter.scrape()?;
    let all = samples(&text)?;
    for (label, kind) in [
        (&redis_label, "redis"),
        (&valkey_label, "redis"),
        (&pg_label, "postgres"),
    ] {
        ensure!(up(&all, label, kind) == Some(1.0), "{label}: {text}");
    }
    let redis_direct_now = redis_direct(&mut rc)?;
    ensure!(
        of_target(&all, &redis_label, "redis") == redis_direct_now,
        "{text}"
    );
    ensure!(
        of_target(&all, &valkey_label, "redis") == redis_direct(&mut vc)?,
        "{text}"
    );
    ensure!(
        of_target(&all, &pg_label, "postgres") == pg_direct(&mut db)?,
        "{text}"
    );
    // The writes themselves, not only agreement: two applied and one stale
    // put at epoch 1 on each module; the extension's update refused as stale.
    let stale_put = series(
        "fencecheck_decisions_total",
        &[
            ("operation", "put"),
            ("outcome", "stale-fence"),
            ("epoch", "1"),
        ],
    );
    let applied_put = series(
        "fencecheck_decisions_total",
        &[("operation", "put"), ("outcome", "applied"), ("epoch", "1")],
    );
    for label in [&redis_label, &valkey_label] {
        let got = of_target(&all, label, "redis");
        ensure!(got.get(&stale_put) == Some(&1.0), "{label}: {got:?}");
        ensure!(got.get(&applied_put) == Some(&2.0), "{label}: {got:?}");
    }
    let pg_stale = series(
        "fencecheck_decisions_total",
        &[
            ("operation", "update"),
            ("outcome", "stale-fence"),
            ("epoch", "0"),
        ],
    );
    ensure!(of_target(&all, &pg_label, "postgres").get(&pg_stale) == Some(&1.0));

    // The cross-host table's names and labels, once the exporter's own are
    // set aside.
    let mut plain = text.clone();
    for (label, kind) in [
        (&redis_label, "redis"),
        (&valkey_label, "redis"),
        (&pg_label, "postgres"),
    ] {
        plain = plain.replace(&format!(",target=\"{label}\",kind=\"{kind}\""), "");
    }
    let seen = fencecheck_tests::signals::check_exposition(&plain, "fencecheck_exporter_")?;
    fencecheck_tests::signals::expect_seen(
        &seen,
        &[(
            "fencecheck_decisions_total",
            &[("operation", "put"), ("operation", "update")],
        )],
    )?;
    promtool_check(&text)?;
    ensure!(!text.contains(PASSWORD), "{text}");

    for (method, path, status) in [
        ("GET", "/", 404),
        ("GET", "/metrics/x", 404),
        ("GET", "/favicon.ico", 404),
        ("POST", "/metrics", 405),
        ("GET", "/metrics?x=1", 200),
    ] {
        let r = harness::request(&exporter.addr, method, path)?;
        ensure!(r.status == status, "{method} {path}: {}", r.status);
    }

    // Valkey stops; Redis moves on.
    valkey.kill();
    let r = fence_set(&mut rc, "report/july", "1.9")?;
    ensure!(r.error().is_none(), "{r:?}");
    let text = exporter.scrape()?;
    let all = samples(&text)?;
    ensure!(up(&all, &valkey_label, "redis") == Some(0.0), "{text}");
    ensure!(of_target(&all, &valkey_label, "redis").is_empty(), "{text}");
    ensure!(up(&all, &redis_label, "redis") == Some(1.0), "{text}");
    ensure!(up(&all, &pg_label, "postgres") == Some(1.0), "{text}");
    let redis_now = of_target(&all, &redis_label, "redis");
    ensure!(redis_now == redis_direct(&mut rc)?, "{text}");
    ensure!(redis_now.get(&applied_put) == Some(&3.0), "{redis_now:?}");
    ensure!(of_target(&all, &pg_label, "postgres") == pg_direct(&mut db)?);
    promtool_check(&text)?;
    let log = exporter.log();
    ensure!(
        log.contains(&format!("redis target {valkey_label} is down")),
        "{log}"
    );
    ensure!(!log.contains(PASSWORD), "{log}");

    let status = exporter.terminate()?;
    ensure!(status.success(), "{status:?}");
    Ok(())
}

/// A real Prometheus server scrapes the exporter: its HTTP API answers
/// `fencecheck_exporter_up` 1 for a live Valkey and 0 for a port where
/// nothing listens, and the Valkey's stale-rejection counter with its
/// target label.
#[test]
fn a_real_prometheus_scrapes_the_exporter() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let valkey = Server::start(Kind::Valkey, Options::module())?;
    redis_writes(&mut valkey.conn()?)?;
    let nothing = harness::free_port()?;
    let exporter = Exporter::start(
        dir.path(),
        &[
            "--redis".into(),
            format!("redis://127.0.0.1:{}", valkey.port),
            "--redis".into(),
            format!("redis://127.0.0.1:{nothing}"),
            "--timeout-ms".into(),
            "500".into(),
        ],
    )?;
    let prometheus = Prometheus::start(dir.path(), &exporter.addr)?;
    let live = format!("127.0.0.1:{}", valkey.port);
    let dead = format!("127.0.0.1:{nothing}");
    prometheus.until("scraping both targets", |p| {
        Ok(p.query("fencecheck_exporter_up")?.len() == 2)
    })?;
    let mut ups: Vec<(String, String)> = prometheus
        .query("fencecheck_exporter_up")?
        .iter()
        .map(|s| {
            (
                s["metric"]["target"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                s["value"][1].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    ups.sort();
    let mut want = vec![(live.clone(), "1".to_owned()), (dead, "0".to_owned())];
    want.sort();
    ensure!(ups == want, "{ups:?}");
    let stale = prometheus.query(
        "fencecheck_decisions_total{operation=\"put\",outcome=\"stale-fence\",kind=\"redis\"}",
    )?;
    let sample = stale
        .first()
        .context("the stale-fence counter in Prometheus")?;
    ensure!(stale.len() == 1, "{stale:?}");
    ensure!(sample["metric"]["target"] == live.as_str(), "{sample}");
    ensure!(sample["metric"]["epoch"] == "1", "{sample}");
    ensure!(sample["metric"]["job"] == "fencecheck-exporter", "{sample}");
    ensure!(sample["value"][1] == "1", "{sample}");
    Ok(())
}

/// Targets that cannot be read are `up 0`, logged with why, and cost
/// bounded memory, while a healthy one still reports: a peer announcing a
/// huge reply, one streaming a line without end, one streaming a huge
/// PostgreSQL message, one that never answers (the timeout), one whose
/// text tries to inject series, Redis without the module, a wrong
/// password, and PostgreSQL without the library preloaded. The exporter
/// keeps running through all of it.
#[test]
fn unreadable_targets_are_down_bounded_and_never_stop_the_others() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let healthy = Server::start(Kind::Redis, Options::module())?;
    redis_writes(&mut healthy.conn()?)?;
    let plain = Server::start(Kind::Redis, Options::plain())?;
    let locked = Server::start(
        Kind::Valkey,
        Options::module().with("requirepass", PASSWORD),
    )?;
    let unloaded = PgServer::start()?;
    unloaded
        .client()?
        .batch_execute("CREATE EXTENSION fencecheck")?;

    const FLOOD: usize = 64 << 20;
    let huge_bulk = fake_peer(|s| {
        let _ = s.write_all(b"$999999999999\r\n");
    })?;
    let endless_line = fake_peer(|s| {
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..FLOOD >> 20 {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    })?;
    let huge_pg_message = fake_peer(|s| {
        // An authentication message claiming 2 GiB, then a flood.
        let _ = s.write_all(&[b'R', 0x7f, 0xff, 0xff, 0xff]);
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..FLOOD >> 20 {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    })?;
    let silent = fake_peer(|_| {})?;
    let injected = fake_peer(|s| {
        let text = "# TYPE fencecheck_decisions_total counter\n\
                    fencecheck_decisions_total{operation=\"put\\\"} 1\\nevil_series 1\"} 1\n\
                    evil_series 1\n";
        let _ = write!(s, "${}\r\n{text}\r\n", text.len());
    })?;

    let label = |port: u16| format!("127.0.0.1:{port}");
    let mut args: Vec<String> = Vec::new();
    for port in [
        healthy.port,
        plain.port,
        huge_bulk,
        endless_line,
        silent,
        injected,
    ] {
        args.extend(["--redis".into(), format!("redis://{}", label(port))]);
    }
    args.extend([
        "--redis".into(),
        format!("redis://:wrong-pw@{}", label(locked.port)),
        "--postgres".into(),
        format!("host=127.0.0.1 port={huge_pg_message} user=postgres dbname=postgres"),
        "--postgres".into(),
        unloaded.url(),
        "--timeout-ms".into(),
        "2000".into(),
    ]);
    let mut exporter = Exporter::start(dir.path(), &args)?;
    // Twice: the second scrape meets every peer again (nothing cached).
    for _ in 0..2 {
        let text = exporter.scrape()?;
        let all = samples(&text)?;
        ensure!(
            up(&all, &label(healthy.port), "redis") == Some(1.0),
            "{text}"
        );
        ensure!(!of_target(&all, &label(healthy.port), "redis").is_empty());
        for port in [
            plain.port,
            huge_bulk,
            endless_line,
            silent,
            injected,
            locked.port,
        ] {
            ensure!(
                up(&all, &label(port), "redis") == Some(0.0),
                "{port}: {text}"
            );
            ensure!(of_target(&all, &label(port), "redis").is_empty(), "{text}");
        }
        for target in [
            format!("127.0.0.1:{huge_pg_message}/postgres"),
            format!("127.0.0.1:{}/postgres", unloaded.port()),
        ] {
            ensure!(
                up(&all, &target, "postgres") == Some(0.0),
                "{target}: {text}"
            );
        }
        ensure!(!text.contains("evil"), "{text}");
        promtool_check(&text)?;
        ensure!(exporter.alive(), "the exporter exited");
    }
    let log = exporter.log();
    for why in [
        "does not load the fencecheck module",
        "AUTH refused",
        "the cap is",
        "the target sent more than",
        "without CRLF",
        "no answer within 2000 ms",
        "its answer is refused",
        "shared_preload_libraries",
    ] {
        ensure!(log.contains(why), "no {why:?} in the log: {log}");
    }
    ensure!(!log.contains("wrong-pw"), "{log}");
    // 64 MiB floods, twice each: read under the 1 MiB caps, never held.
    let peak = exporter.peak_rss_kib()?;
    ensure!(peak < 48 * 1024, "peak RSS {peak} KiB");
    Ok(())
}

/// Options are checked before anything listens: a URL that is not
/// redis://, PostgreSQL with sslmode=require (no TLS), a target named
/// twice (named by its label, never its password), and no target at all.
#[test]
fn bad_options_are_refused_at_start() -> Result<()> {
    for (args, want) in [
        (vec!["--redis", "http://127.0.0.1:1"], "redis://"),
        (vec!["--redis", "rediss://127.0.0.1:1"], "TLS"),
        (
            vec!["--postgres", "host=127.0.0.1 user=u sslmode=require"],
            "sslmode=require",
        ),
        (vec!["--postgres", "host=127.0.0.1 dbname=x"], "user"),
        (
            vec![
                "--redis",
                "redis://:s3cret-a@127.0.0.1:1",
                "--redis",
                "redis://:s3cret-b@127.0.0.1:1",
            ],
            "127.0.0.1:1 is named twice",
        ),
        (vec![], "--redis"),
    ] {
        let mut all = vec!["exporter", "--listen", "127.0.0.1:0"];
        all.extend(&args);
        let out = fencecheck(&all)?;
        let stderr = String::from_utf8(out.stderr)?;
        ensure!(!out.status.success(), "{args:?} started");
        ensure!(stderr.contains(want), "{args:?}: {stderr}");
        ensure!(!stderr.contains("s3cret"), "{stderr}");
    }
    Ok(())
}
