//! The operations kit against the real thing: a real Prometheus server
//! (Debian's `prometheus`, .ci/install.d/85-prometheus.sh) scrapes a real
//! gateway on loopback and evaluates `ops/prometheus/fencecheck.rules.yml`;
//! the stale-rejection alert stays quiet under honest writes and fires once
//! a paused writer comes back with an old token.

use crate::common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::{Gateway, request_to};
use serde_json::Value;

/// A Prometheus server on a free loopback port; killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Scrape `target` every second and evaluate the repository's rules
    /// every second.
    fn start(dir: &Path, target: &str) -> anyhow::Result<Self> {
        let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../ops/prometheus/fencecheck.rules.yml")
            .canonicalize()
            .context("ops/prometheus/fencecheck.rules.yml")?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {}\n\
                 scrape_configs:\n  - job_name: gateway\n    static_configs:\n      - targets: ['{target}']\n",
                rules.display()
            ),
        )?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let child =
            Command::new(std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".into()))
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("tsdb").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdout(Stdio::null())
                .stderr(Stdio::from(std::fs::File::create(
                    dir.join("prometheus.log"),
                )?))
                .spawn()
                .context(
                    "starting prometheus (Debian: apt-get install prometheus; or set PROMETHEUS)",
                )?;
        let prometheus = Self { child, addr };
        prometheus.until("ready", |p| {
            Ok(request_to(&p.addr, "GET", "/-/ready", &[], b"").is_ok_and(|r| r.status == 200))
        })?;
        Ok(prometheus)
    }

    /// `data` of an API call.
    fn api(&self, path: &str) -> anyhow::Result<Value> {
        let r = request_to(&self.addr, "GET", path, &[], b"")?;
        ensure!(
            r.status == 200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let body = r.json()?;
        ensure!(body["status"] == "success", "{path}: {body}");
        Ok(body["data"].clone())
    }

    /// The alerts named `name`, with their state (`pending`, `firing`).
    fn alerts(&self, name: &str) -> anyhow::Result<Vec<Value>> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .context("alerts")?
            .iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .cloned()
            .collect())
    }

    /// Wait (bounded: 60 s, polling) until `ready` holds.
    fn until(
        &self,
        what: &str,
        mut ready: impl FnMut(&Self) -> anyhow::Result<bool>,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ready(self)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("prometheus: not {what} within 60 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn put(gw: &Gateway, key: &str, token: &str) -> anyhow::Result<u16> {
    let r = gw.request(
        "PUT",
        &format!("/objects/{key}"),
        &[("Fence-Token", token)],
        b"report",
    )?;
    Ok(r.status)
}

/// A real Prometheus, scraping a gateway under honest writes, raises no
/// stale-rejection alert; one writer presenting an old token makes
/// `FencecheckStaleRejection` fire for that gateway and operation.
#[test]
fn the_stale_rejection_alert_fires_in_a_real_prometheus() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start(&dir.path().join("gw"), &[])?;
    let prometheus = Prometheus::start(dir.path(), &gw.addr)?;

    // Honest writers: each key's tokens only go up.
    for counter in 1..=10u64 {
        for key in ["reports/july", "reports/august"] {
            // 201 for a key's first version, 200 after.
            ensure!(matches!(put(&gw, key, &format!("1.{counter}"))?, 200 | 201));
        }
    }
    // Scraped, and the rules evaluated over it: the recording rule over
    // the applied decisions has a value.
    prometheus.until("evaluating the rules over the gateway", |p| {
        let data = p.api("/api/v1/query?query=fencecheck:applied_ratio:rate5m")?;
        Ok(data["result"].as_array().is_some_and(|r| !r.is_empty()))
    })?;
    let quiet = prometheus.alerts("FencecheckStaleRejection")?;
    ensure!(
        quiet.is_empty(),
        "an alert without a stale write: {quiet:?}"
    );

    // The paused writer of token 1.3 comes back.
    ensure!(put(&gw, "reports/july", "1.3")? == 409);
    prometheus.until("firing FencecheckStaleRejection", |p| {
        Ok(p.alerts("FencecheckStaleRejection")?
            .iter()
            .any(|a| a["state"] == "firing"))
    })?;
    let alerts = prometheus.alerts("FencecheckStaleRejection")?;
    let alert = alerts.first().context("the alert")?;
    ensure!(alert["labels"]["job"] == "gateway", "{alert}");
    ensure!(alert["labels"]["operation"] == "put", "{alert}");
    ensure!(alert["labels"]["instance"] == gw.addr.as_str(), "{alert}");
    ensure!(alerts.len() == 1, "{alerts:?}");
    Ok(())
}
