//! `fencecheck exporter` as a process, a raw HTTP GET, the exposition as
//! samples, `promtool check metrics`, and a real Prometheus server: the
//! exporter tests' harness (tests/exporter.rs).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

/// An HTTP answer.
pub struct Http {
    pub status: u16,
    /// Header names lowercased.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

/// `METHOD path` on `addr`, one request per connection (the exporter
/// closes after each answer).
pub fn request(addr: &str, method: &str, path: &str) -> Result<Http> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let raw = String::from_utf8(raw).context("the answer is not UTF-8")?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no end of head")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .context("status line")?
        .parse()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Ok(Http {
        status,
        headers,
        body: body.to_owned(),
    })
}

/// A running `fencecheck exporter`, its stderr kept in a file; killed on
/// drop.
pub struct Exporter {
    child: Child,
    _stdout: BufReader<ChildStdout>,
    pub addr: String,
    log: PathBuf,
}

impl Exporter {
    /// Start it on a free loopback port with these options (targets,
    /// `--timeout-ms`), its log in `dir`.
    pub fn start(dir: &Path, args: &[String]) -> Result<Exporter> {
        let log = dir.join("exporter.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencecheck"))
            .args(["exporter", "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("REDISCLI_AUTH")
            .env_remove("PGPASSWORD")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting fencecheck exporter")?;
        let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        // Its first line, or EOF if it exits.
        stdout.read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the exporter did not start: {line:?}; {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Ok(Exporter {
            addr: addr.to_owned(),
            child,
            _stdout: stdout,
            log,
        })
    }

    /// `GET /metrics`: checked 200 with the text format's content type.
    pub fn scrape(&self) -> Result<String> {
        let r = request(&self.addr, "GET", "/metrics")?;
        ensure!(r.status == 200, "{}: {}", r.status, r.body);
        let content_type = r.headers.get("content-type").context("no content type")?;
        ensure!(
            content_type == "text/plain; version=0.0.4; charset=utf-8",
            "{content_type}"
        );
        Ok(r.body)
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Peak resident memory (VmHWM), KiB.
    pub fn peak_rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .context("VmHWM")?;
        Ok(line
            .split_whitespace()
            .nth(1)
            .context("VmHWM value")?
            .parse()?)
    }

    /// SIGTERM, then its exit status (bounded wait: 60 s).
    pub fn terminate(mut self) -> Result<ExitStatus> {
        let pid = rustix::process::Pid::from_raw(i32::try_from(self.child.id())?)
            .context("the exporter's pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ensure!(
                Instant::now() < deadline,
                "still running 60 s after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One sample's name and labels (sorted).
pub type Series = (String, BTreeMap<String, String>);

/// The samples of an exposition (label values without `"`, `,` or `\`,
/// as every value in these tests).
pub fn samples(text: &str) -> Result<BTreeMap<Series, f64>> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').context("a sample line")?;
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.strip_suffix('}').context("labels")?),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').context("label=value")?;
            map.insert(k.to_owned(), v.trim_matches('"').to_owned());
        }
        let previous = out.insert((name.to_owned(), map), value.parse()?);
        ensure!(previous.is_none(), "a series twice: {line}");
    }
    Ok(out)
}

/// The samples the exporter took from one target, its `target` and `kind`
/// labels removed: what the target itself answered.
pub fn of_target(all: &BTreeMap<Series, f64>, target: &str, kind: &str) -> BTreeMap<Series, f64> {
    all.iter()
        .filter(|((name, labels), _)| {
            name != "fencecheck_exporter_up"
                && labels.get("target").map(String::as_str) == Some(target)
                && labels.get("kind").map(String::as_str) == Some(kind)
        })
        .map(|((name, labels), v)| {
            let mut labels = labels.clone();
            labels.remove("target");
            labels.remove("kind");
            ((name.clone(), labels), *v)
        })
        .collect()
}

/// `fencecheck_exporter_up` of one target (`None`: no such line).
pub fn up(all: &BTreeMap<Series, f64>, target: &str, kind: &str) -> Option<f64> {
    let labels = BTreeMap::from([
        ("target".to_owned(), target.to_owned()),
        ("kind".to_owned(), kind.to_owned()),
    ]);
    all.get(&("fencecheck_exporter_up".to_owned(), labels))
        .copied()
}

/// `promtool check metrics` on `text` (stdin): its output, failing on any
/// problem it reports.
pub fn promtool_check(text: &str) -> Result<String> {
    let mut child = Command::new(std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into()))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running promtool (Debian: apt-get install prometheus; or set PROMTOOL)")?;
    child
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "promtool check metrics: {said}\n{text}"
    );
    Ok(said)
}

/// A free loopback port, nothing listening on it.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A Prometheus server on a free loopback port scraping one exporter
/// every second; killed on drop.
pub struct Prometheus {
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
    /// Start it (bounded wait for ready: 60 s), config and data in `dir`.
    pub fn start(dir: &Path, target: &str) -> Result<Prometheus> {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: fencecheck-exporter\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )?;
        let addr = format!("127.0.0.1:{}", free_port()?);
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
        let prometheus = Prometheus { child, addr };
        prometheus.until("ready", |p| {
            Ok(request(&p.addr, "GET", "/-/ready").is_ok_and(|r| r.status == 200))
        })?;
        Ok(prometheus)
    }

    /// An instant query's result vector.
    pub fn query(&self, query: &str) -> Result<Vec<Value>> {
        let encoded: String = query
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let r = request(&self.addr, "GET", &format!("/api/v1/query?query={encoded}"))?;
        ensure!(r.status == 200, "{query}: {} {}", r.status, r.body);
        let body: Value = serde_json::from_str(&r.body)?;
        ensure!(body["status"] == "success", "{query}: {body}");
        Ok(body["data"]["result"]
            .as_array()
            .context("a result vector")?
            .clone())
    }

    /// Wait (bounded: 60 s, polling) until `ready` holds.
    pub fn until(&self, what: &str, mut ready: impl FnMut(&Self) -> Result<bool>) -> Result<()> {
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

/// A TCP peer that answers every connection with `reply(request bytes)`
/// after the first bytes arrive, then keeps it open until the client
/// closes: a target that speaks nonsense, or too much.
pub fn fake_peer(reply: impl Fn(&mut TcpStream) + Send + Sync + 'static) -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let reply = std::sync::Arc::new(reply);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let reply = std::sync::Arc::clone(&reply);
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut first = [0u8; 4096];
                if stream.read(&mut first).is_ok_and(|n| n > 0) {
                    reply(&mut stream);
                }
                // Hold it open until the client hangs up.
                let mut sink = [0u8; 4096];
                while stream.read(&mut sink).is_ok_and(|n| n > 0) {}
            });
        }
    });
    Ok(port)
}
