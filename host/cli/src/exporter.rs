//! `fencecheck exporter`: serves `GET /metrics` (Prometheus text format
//! 0.0.4) for Redis/Valkey servers loading the fencecheck module
//! (`FENCE.METRICS`) and PostgreSQL databases with the extension
//! (`fencecheck.metrics()`), which count decisions in the server but have
//! no HTTP listener of their own.
//!
//! Every scrape asks every target afresh (one short connection each, all
//! at once, each bounded by `--timeout-ms`) and adds `target` and `kind`
//! labels to what it answered; `fencecheck_exporter_up{target,kind}` says
//! whether that worked. A target's reply is read under a byte cap and
//! checked line by line before any of it is served: a target that is down,
//! slow or answers anything unexpected is `up 0` and contributes nothing,
//! and the others still report.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use clap::Args;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_postgres::config::{Host, SslMode};

/// The largest reply read from a target, handshake included (the hosts'
/// full tables are a few tens of KiB).
const MAX_REPLY: usize = 1 << 20;
/// The most samples taken from one target.
const MAX_SAMPLES: usize = 10_000;
/// The most labels on one sample.
const MAX_LABELS: usize = 16;
/// The largest HTTP request head read.
const MAX_REQUEST_HEAD: usize = 8 << 10;
/// Scrapes served at once; more connections are answered 503.
const MAX_CONNECTIONS: usize = 8;
/// How long a client may take to send its request head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The password environment variables of redis-cli and libpq, for targets
/// whose URL or connection string holds none (a command line is visible
/// to every user of the machine).
const REDIS_PASSWORD_ENV: &str = "REDISCLI_AUTH";
const PG_PASSWORD_ENV: &str = "PGPASSWORD";

/// `fencecheck exporter`'s options.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("targets").required(true).multiple(true)))]
pub struct Exporter {
    /// Address to serve `/metrics` on (`127.0.0.1:9187`; port 0 picks a
    /// free one, printed at start).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// A Redis or Valkey server loading the fencecheck module,
    /// `redis://[[user]:password@]host:port` (the password may come from
    /// REDISCLI_AUTH instead); repeat for more.
    #[arg(long, value_name = "URL", group = "targets")]
    redis: Vec<String>,
    /// A PostgreSQL database with the fencecheck extension, as a libpq
    /// connection string (`host=… port=… user=… dbname=…` or
    /// `postgresql://…`; the password may come from PGPASSWORD instead);
    /// repeat for more. The library must be in shared_preload_libraries:
    /// otherwise its counters are per session.
    #[arg(long, value_name = "CONNINFO", group = "targets")]
    postgres: Vec<String>,
    /// Longest wait for one target's answer in one scrape, milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5_000)]
    timeout_ms: u64,
}

/// What a target is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    Redis,
    Postgres,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Redis => "redis",
            Kind::Postgres => "postgres",
        }
    }
}

/// A Redis/Valkey server: where, and as whom.
struct RedisTarget {
    address: String,
    user: String,
    password: Option<String>,
}

/// A PostgreSQL database: where (one host), and the rest of its
/// connection string.
struct PgTarget {
    config: tokio_postgres::Config,
    host: Host,
    port: u16,
}

enum Source {
    Redis(RedisTarget),
    Postgres(Box<PgTarget>),
}

/// One target: its `target` label (never a password), and the last
/// failure logged, so a down target is logged when it goes down or its
/// reason changes, not at every scrape.
struct Target {
    label: String,
    kind: Kind,
    source: Source,
    last_error: Mutex<Option<String>>,
}

impl Target {
    fn redis(url: &str, env_password: Option<&str>) -> Result<Target> {
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| {
                anyhow!("--redis: not redis://HOST:PORT (TLS, rediss://, is not supported)")
            })?
            .trim_end_matches('/');
        let (auth, address) = match rest.rsplit_once('@') {
            Some((auth, address)) => (Some(auth), address),
            None => (None, rest),
        };
        ensure!(
            !address.is_empty() && !address.contains('/') && !address.contains('?'),
            "--redis: not redis://HOST:PORT (no database number or options), for {address:?}"
        );
        let address = if address
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            address.to_owned()
        } else {
            format!("{address}:6379")
        };
        let (user, password) = match auth.map(|a| a.split_once(':').unwrap_or(("", a))) {
            None => ("default".to_owned(), env_password.map(str::to_owned)),
            Some((user, "")) => (
                if user.is_empty() { "default" } else { user }.to_owned(),
                env_password.map(str::to_owned),
            ),
            Some((user, password)) => (
                if user.is_empty() { "default" } else { user }.to_owned(),
                Some(password.to_owned()),
            ),
        };
        Ok(Target {
            label: address.clone(),
            kind: Kind::Redis,
            source: Source::Redis(RedisTarget {
                address,
                user,
                password,
            }),
            last_error: Mutex::new(None),
        })
    }

    fn postgres(conninfo: &str, env_password: Option<&str>) -> Result<Target> {
        // tokio-postgres's error names the bad key, never the value.
        let mut config: tokio_postgres::Config = conninfo
            .parse()
            .map_err(|e| anyhow!("--postgres: not a libpq connection string: {e}"))?;
        ensure!(
            config.get_ssl_mode() != SslMode::Require,
            "--postgres: sslmode=require: the exporter does not speak TLS to PostgreSQL \
             (as `fencecheck authority --postgres`); use sslmode=disable or prefer"
        );
        let host = match (config.get_hostaddrs(), config.get_hosts()) {
            ([addr], _) => Host::Tcp(addr.to_string()),
            ([], [host]) => host.clone(),
            ([], []) => bail!("--postgres: name the server (host=…)"),
            _ => bail!("--postgres: name one server (one host=…, one hostaddr=…)"),
        };
        let port = match config.get_ports() {
            [] => 5432,
            [port] => *port,
            _ => bail!("--postgres: name one port"),
        };
        let user = config
            .get_user()
            .context("--postgres: name the user (user=…)")?
            .to_owned();
        if config.get_password().is_none()
            && let Some(password) = env_password
        {
            config.password(password);
        }
        let where_ = match &host {
            Host::Tcp(name) if name.contains(':') => format!("[{name}]:{port}"),
            Host::Tcp(name) => format!("{name}:{port}"),
            Host::Unix(dir) => format!("{}:{port}", dir.display()),
        };
        let dbname = config.get_dbname().unwrap_or(&user).to_owned();
        Ok(Target {
            label: format!("{where_}/{dbname}"),
            kind: Kind::Postgres,
            source: Source::Postgres(Box::new(PgTarget { config, host, port })),
            last_error: Mutex::new(None),
        })
    }

    /// The target's exposition text, read under [`MAX_REPLY`].
    async fn fetch(&self) -> Result<String> {
        match &self.source {
            Source::Redis(redis) => redis_metrics(redis).await,
            Source::Postgres(pg) => pg_metrics(pg).await,
        }
    }

    /// Log a change of state: down with a (new) reason, or up again.
    fn note(&self, error: Option<String>) {
        let mut last = self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *last == error {
            return;
        }
        match &error {
            Some(e) => eprintln!(
                "fencecheck exporter: {} target {} is down: {e}",
                self.kind.label(),
                self.label
            ),
            None => eprintln!(
                "fencecheck exporter: {} target {} is up",
                self.kind.label(),
                self.label
            ),
        }
        *last = error;
    }
}

/// A reader that fails once more than its budget has been read: what a
/// target sends is never buffered beyond [`MAX_REPLY`] (tokio-postgres
/// buffers a whole message, whatever length its header claims).
struct Capped<S> {
    inner: S,
    left: usize,
}

impl<S: AsyncRead + Unpin> AsyncRead for Capped<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.left == 0 {
            return Poll::Ready(Err(std::io::Error::other(format!(
                "the target sent more than {MAX_REPLY} bytes"
            ))));
        }
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.left = self.left.saturating_sub(read);
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Capped<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One RESP2 reply of the kinds `AUTH` and `FENCE.METRICS` answer.
enum Reply {
    Status,
    Error(String),
    Bulk(Vec<u8>),
}

async fn resp_call<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<Capped<S>>,
    args: &[&str],
) -> Result<Reply> {
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        request.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        request.extend_from_slice(a.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    conn.get_mut().write_all(&request).await?;
    let mut line = Vec::new();
    // A line is short; the cap stops a target that never ends one.
    (&mut *conn).take(1024).read_until(b'\n', &mut line).await?;
    let line = line
        .strip_suffix(b"\r\n")
        .context("the connection closed, or a reply line without CRLF")?;
    let (kind, rest) = line.split_first().context("an empty reply line")?;
    let rest = String::from_utf8_lossy(rest);
    match kind {
        b'+' => Ok(Reply::Status),
        b'-' => Ok(Reply::Error(rest.chars().take(200).collect())),
        b'$' => {
            let n: i64 = rest.parse().context("a bulk length that is not a number")?;
            let n = usize::try_from(n).context("a nil reply")?;
            ensure!(
                n <= MAX_REPLY,
                "a reply of {n} bytes (the cap is {MAX_REPLY})"
            );
            let mut data = vec![0; n + 2];
            conn.read_exact(&mut data).await?;
            ensure!(data.ends_with(b"\r\n"), "a bulk reply without CRLF");
            data.truncate(n);
            Ok(Reply::Bulk(data))
        }
        other => bail!("an unexpected reply of type {:?}", char::from(*other)),
    }
}

async fn redis_metrics(target: &RedisTarget) -> Result<String> {
    let stream = TcpStream::connect(&target.address)
        .await
        .context("connecting")?;
    stream.set_nodelay(true)?;
    let mut conn = BufReader::new(Capped {
        inner: stream,
        left: MAX_REPLY + 4096,
    });
    if let Some(password) = &target.password {
        match resp_call(&mut conn, &["AUTH", &target.user, password]).await? {
            Reply::Status => {}
            Reply::Error(e) => bail!("AUTH refused: {e}"),
            Reply::Bulk(_) => bail!("AUTH answered a bulk string"),
        }
    }
    match resp_call(&mut conn, &["FENCE.METRICS"]).await? {
        Reply::Bulk(text) => {
            String::from_utf8(text).map_err(|_| anyhow!("FENCE.METRICS answered non-UTF-8 text"))
        }
        Reply::Error(e) if e.to_ascii_lowercase().contains("unknown command") => {
            bail!("the server does not load the fencecheck module (FENCE.METRICS: {e})")
        }
        Reply::Error(e) => bail!("FENCE.METRICS: {e}"),
        Reply::Status => bail!("FENCE.METRICS answered a status, not text"),
    }
}

async fn pg_metrics(target: &PgTarget) -> Result<String> {
    match &target.host {
        Host::Tcp(name) => {
            let stream = TcpStream::connect((name.as_str(), target.port))
                .await
                .context("connecting")?;
            stream.set_nodelay(true)?;
            pg_query(&target.config, stream).await
        }
        Host::Unix(dir) => {
            let path: PathBuf = dir.join(format!(".s.PGSQL.{}", target.port));
            let stream = tokio::net::UnixStream::connect(&path)
                .await
                .with_context(|| format!("connecting to {}", path.display()))?;
            pg_query(&target.config, stream).await
        }
    }
}

/// The query every scrape runs: both functions came with 0.1.2.
const PG_QUERY: &str = "SELECT fencecheck.decision_coverage(), fencecheck.metrics()";

async fn pg_query<S>(config: &tokio_postgres::Config, stream: S) -> Result<String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let stream = Capped {
        inner: stream,
        left: MAX_REPLY + 64 * 1024,
    };
    let (client, connection) = config
        .connect_raw(stream, tokio_postgres::NoTls)
        .await
        .context("connecting")?;
    let mut connection = Box::pin(connection);
    let answer = {
        let query = client.simple_query(PG_QUERY);
        tokio::select! {
            answer = query => answer.context("SELECT fencecheck.metrics()"),
            ended = &mut connection => match ended {
                Err(e) => Err(anyhow!(e).context("the connection failed")),
                Ok(()) => Err(anyhow!("the server closed the connection")),
            },
        }
    };
    // Dropping the client sends Terminate; the connection ends when the
    // server closes (so its log has no "unexpected EOF").
    drop(client);
    let _ = connection.await;
    let row = answer?
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .context("SELECT fencecheck.metrics() returned no row")?;
    let coverage = row.get(0).unwrap_or_default();
    ensure!(
        coverage == "cluster",
        "fencecheck.decision_coverage() is {coverage:?}: without the library in \
         shared_preload_libraries each session counts only its own decisions, so the \
         server's cannot be read"
    );
    Ok(row
        .get(1)
        .context("fencecheck.metrics() is NULL")?
        .to_owned())
}

/// One metric family of a target's exposition.
#[derive(Debug, Clone, PartialEq)]
struct Family {
    help: Option<String>,
    kind: String,
    /// Each sample's line with the series' labels rendered, before the
    /// `target` and `kind` labels: (name, labels as `k="v"` pairs, value).
    samples: Vec<(String, Vec<String>, String)>,
}

fn valid_name(name: &str, colons: bool) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (colons && c == ':'))
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || (colons && c == ':'))
}

/// A family's sample names: itself, and a histogram's or summary's parts.
fn belongs(family: &str, kind: &str, sample: &str) -> bool {
    let suffixes: &[&str] = match kind {
        "histogram" => &["_bucket", "_sum", "_count"],
        "summary" => &["_sum", "_count"],
        _ => &[],
    };
    sample == family
        || suffixes
            .iter()
            .any(|s| sample.strip_suffix(s) == Some(family))
}

/// `{k="v",…}`'s pairs, unescaped values re-escaped the one canonical way.
fn parse_labels(text: &str) -> Result<(Vec<String>, &str)> {
    let mut pairs = Vec::new();
    let mut names = HashSet::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((pairs, after));
        }
        let (name, after) = rest.split_once('=').context("a label without =")?;
        let name = name.trim();
        ensure!(valid_name(name, false), "a bad label name {name:?}");
        ensure!(
            name != "target" && name != "kind",
            "a {name} label (the exporter adds its own)"
        );
        ensure!(names.insert(name.to_owned()), "label {name} twice");
        let mut chars = after
            .strip_prefix('"')
            .context("a label value without quotes")?
            .char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next().context("an unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().context("a dangling escape")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    other => bail!("an unknown escape \\{other}"),
                },
                (_, c) => value.push(c),
            }
        };
        pairs.push(format!("{name}=\"{}\"", escape(&value)));
        ensure!(pairs.len() <= MAX_LABELS, "more than {MAX_LABELS} labels");
        rest = &after[1 + end + 1..];
        rest = rest.trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

/// A target's exposition, checked: only `fencecheck_*` families (not the
/// exporter's own `fencecheck_exporter_*`), well-formed names, labels and
/// values, no `target`/`kind` label, no series twice, at most
/// [`MAX_SAMPLES`]. Anything else refuses the whole reply.
fn parse(text: &str) -> Result<BTreeMap<String, Family>> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut series = HashSet::new();
    for (n, line) in text.split('\n').enumerate() {
        let at = || format!("line {}", n + 1);
        ensure!(
            !line.chars().any(|c| c.is_control() && c != '\t'),
            "{}: a control character",
            at()
        );
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            let keyword = words.next().unwrap_or_default();
            if keyword != "HELP" && keyword != "TYPE" {
                continue;
            }
            let name = words.next().unwrap_or_default();
            ensure!(
                valid_name(name, true)
                    && name.starts_with("fencecheck_")
                    && !name.starts_with("fencecheck_exporter_"),
                "{}: family {name:?} is not a fencecheck_* name",
                at()
            );
            let text = words.next().unwrap_or_default();
            let family = families.entry(name.to_owned()).or_insert_with(|| Family {
                help: None,
                kind: "untyped".to_owned(),
                samples: Vec::new(),
            });
            if keyword == "HELP" {
                family.help = Some(text.chars().take(1024).collect());
            } else {
                ensure!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&text),
                    "{}: type {text:?}",
                    at()
                );
                ensure!(
                    family.samples.is_empty(),
                    "{}: # TYPE {name} after its samples",
                    at()
                );
                family.kind = text.to_owned();
            }
            current = Some(name.to_owned());
            continue;
        }
        let split = line
            .find(['{', ' ', '\t'])
            .with_context(|| format!("{}: a sample without a value", at()))?;
        let name = &line[..split];
        ensure!(
            valid_name(name, true)
                && name.starts_with("fencecheck_")
                && !name.starts_with("fencecheck_exporter_"),
            "{}: sample {name:?} is not a fencecheck_* name",
            at()
        );
        let (labels, rest) = match line[split..].strip_prefix('{') {
            Some(inner) => parse_labels(inner).with_context(at)?,
            None => (Vec::new(), &line[split..]),
        };
        let mut fields = rest.split_whitespace();
        let value = fields
            .next()
            .with_context(|| format!("{}: a sample without a value", at()))?;
        ensure!(
            value.parse::<f64>().is_ok(),
            "{}: value {value:?} is not a number",
            at()
        );
        if let Some(timestamp) = fields.next() {
            ensure!(
                timestamp.parse::<i64>().is_ok(),
                "{}: timestamp {timestamp:?}",
                at()
            );
        }
        ensure!(fields.next().is_none(), "{}: text after the value", at());
        let family = match current.as_ref().filter(|f| {
            families
                .get(*f)
                .is_some_and(|f2| belongs(f, &f2.kind, name))
        }) {
            Some(family) => family.clone(),
            None => {
                // A sample without # TYPE is untyped: its own family.
                ensure!(
                    !families.contains_key(name),
                    "{}: {name}'s samples are not together",
                    at()
                );
                current = Some(name.to_owned());
                name.to_owned()
            }
        };
        let entry = families.entry(family).or_insert_with(|| Family {
            help: None,
            kind: "untyped".to_owned(),
            samples: Vec::new(),
        });
        let mut key = labels.clone();
        key.sort();
        ensure!(
            series.insert((name.to_owned(), key)),
            "{}: {name} with the same labels twice",
            at()
        );
        ensure!(
            series.len() <= MAX_SAMPLES,
            "more than {MAX_SAMPLES} samples"
        );
        entry
            .samples
            .push((name.to_owned(), labels, value.to_owned()));
    }
    Ok(families)
}

/// What one scrape learned from one target.
struct Collected {
    families: Result<BTreeMap<String, Family>>,
}

/// The exporter's state: its targets and how long each may take.
struct Scraper {
    targets: Vec<Arc<Target>>,
    timeout: Duration,
}

impl Scraper {
    /// Ask every target at once; each answer is bounded by the timeout.
    async fn collect(&self) -> Vec<Collected> {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, target) in self.targets.iter().enumerate() {
            let target = Arc::clone(target);
            let timeout = self.timeout;
            tasks.spawn(async move {
                let families = match tokio::time::timeout(timeout, target.fetch()).await {
                    Ok(Ok(text)) => parse(&text).context("its answer is refused"),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(anyhow!("no answer within {} ms", timeout.as_millis())),
                };
                (i, families)
            });
        }
        let mut out: Vec<Collected> = self
            .targets
            .iter()
            .map(|_| Collected {
                families: Err(anyhow!("not collected")),
            })
            .collect();
        while let Some(joined) = tasks.join_next().await {
            // A task cannot panic here short of a bug; its target stays down.
            if let Ok((i, families)) = joined
                && let Some(slot) = out.get_mut(i)
            {
                slot.families = families;
            }
        }
        out
    }

    /// One scrape's exposition: `fencecheck_exporter_up` per target, then
    /// every family of the targets that answered, each family once, its
    /// samples labelled with their target.
    async fn render(&self) -> String {
        let mut collected = self.collect().await;
        let mut merged: BTreeMap<String, (Option<String>, String, Vec<String>)> = BTreeMap::new();
        for (target, result) in self.targets.iter().zip(collected.iter_mut()) {
            // Same family, another type at another target: this one yields.
            if let Ok(families) = &result.families
                && let Some((name, family)) = families.iter().find(|(name, family)| {
                    merged
                        .get(*name)
                        .is_some_and(|(_, kind, _)| *kind != family.kind)
                })
            {
                result.families = Err(anyhow!(
                    "{name} is a {} here and a {} at another target",
                    family.kind,
                    merged.get(name).map_or("", |(_, kind, _)| kind.as_str())
                ));
            }
            let Ok(families) = &result.families else {
                continue;
            };
            let extra = format!(
                "target=\"{}\",kind=\"{}\"",
                escape(&target.label),
                target.kind.label()
            );
            for (name, family) in families {
                let entry = merged
                    .entry(name.clone())
                    .or_insert_with(|| (None, family.kind.clone(), Vec::new()));
                if entry.0.is_none() {
                    entry.0.clone_from(&family.help);
                }
                for (sample, labels, value) in &family.samples {
                    let mut pairs = labels.join(",");
                    if !pairs.is_empty() {
                        pairs.push(',');
                    }
                    entry.2.push(format!("{sample}{{{pairs}{extra}}} {value}"));
                }
            }
        }
        let mut out = String::from(
            "# HELP fencecheck_exporter_up Whether the last scrape read the target's fencecheck counters (1) or not (0)\n\
             # TYPE fencecheck_exporter_up gauge\n",
        );
        for (target, result) in self.targets.iter().zip(&collected) {
            let _ = writeln!(
                out,
                "fencecheck_exporter_up{{target=\"{}\",kind=\"{}\"}} {}",
                escape(&target.label),
                target.kind.label(),
                u8::from(result.families.is_ok())
            );
            target.note(result.families.as_ref().err().map(|e| format!("{e:#}")));
        }
        for (name, (help, kind, lines)) in merged {
            if let Some(help) = help {
                let _ = writeln!(out, "# HELP {name} {help}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for line in lines {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }
}

/// The request line's method and path, from a head read under the caps.
async fn read_request(stream: &mut TcpStream) -> Result<(String, String)> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        ensure!(head.len() <= MAX_REQUEST_HEAD, "request head too large");
        let n = stream.read(&mut chunk).await?;
        ensure!(n > 0, "the client closed the connection");
        head.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.lines().next().unwrap_or_default().split(' ');
    let method = words.next().unwrap_or_default().to_owned();
    let target = words.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_owned();
    Ok((method, path))
}

fn response(status: &str, content_type: &str, extra: &str, body: &str, head_only: bool) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
}

async fn serve_connection(mut stream: TcpStream, scraper: Arc<Scraper>) {
    let Ok(Ok((method, path))) =
        tokio::time::timeout(REQUEST_TIMEOUT, read_request(&mut stream)).await
    else {
        return;
    };
    const TEXT: &str = "text/plain; charset=utf-8";
    let reply = match (method.as_str(), path.as_str()) {
        ("GET" | "HEAD", "/metrics") => response(
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            "",
            &scraper.render().await,
            method == "HEAD",
        ),
        (_, "/metrics") => response(
            "405 Method Not Allowed",
            TEXT,
            "Allow: GET, HEAD\r\n",
            "only GET /metrics\n",
            false,
        ),
        _ => response(
            "404 Not Found",
            TEXT,
            "",
            "not found: the metrics are at /metrics\n",
            method == "HEAD",
        ),
    };
    // A client gone by now has nothing left to be told.
    let _ = tokio::time::timeout(REQUEST_TIMEOUT, async {
        stream.write_all(&reply).await?;
        stream.shutdown().await
    })
    .await;
}

/// SIGTERM and SIGINT, handled from before the address is printed (a
/// supervisor may signal as soon as it reads it).
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn new() -> Result<Stop> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Stop {
            term: signal(SignalKind::terminate()).context("handling SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("handling SIGINT")?,
        })
    }

    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

async fn serve(listener: TcpListener, scraper: Arc<Scraper>, mut stop: Stop) -> Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    let signal = loop {
        tokio::select! {
            signal = stop.recv() => break signal,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of descriptors and the like: the listener stays.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                match Arc::clone(&permits).try_acquire_owned() {
                    Ok(permit) => {
                        let scraper = Arc::clone(&scraper);
                        connections.spawn(async move {
                            serve_connection(stream, scraper).await;
                            drop(permit);
                        });
                    }
                    Err(_) => {
                        // Best effort, never waiting: the client retries.
                        let _ = stream.try_write(&response(
                            "503 Service Unavailable",
                            "text/plain; charset=utf-8",
                            "",
                            "too many scrapes at once\n",
                            false,
                        ));
                    }
                }
                while connections.try_join_next().is_some() {}
            }
        }
    };
    // Stop accepting; scrapes in flight finish, each bounded by its
    // request timeout and the targets' timeout.
    drop(listener);
    eprintln!("fencecheck exporter: {signal}: stopping");
    let drain = REQUEST_TIMEOUT * 2 + scraper.timeout;
    let _ = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// The targets the options name, checked; none twice.
fn targets(options: &Exporter) -> Result<Vec<Arc<Target>>> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let redis_password = env(REDIS_PASSWORD_ENV);
    let pg_password = env(PG_PASSWORD_ENV);
    let mut targets = Vec::new();
    for url in &options.redis {
        targets.push(Target::redis(url, redis_password.as_deref())?);
    }
    for conninfo in &options.postgres {
        targets.push(Target::postgres(conninfo, pg_password.as_deref())?);
    }
    let mut seen = HashSet::new();
    for t in &targets {
        ensure!(
            seen.insert((t.kind, t.label.clone())),
            "the {} target {} is named twice",
            t.kind.label(),
            t.label
        );
    }
    Ok(targets.into_iter().map(Arc::new).collect())
}

/// Run the exporter until SIGTERM or SIGINT.
pub fn run(options: Exporter) -> Result<ExitCode> {
    ensure!(options.timeout_ms > 0, "--timeout-ms must be positive");
    let scraper = Arc::new(Scraper {
        targets: targets(&options)?,
        timeout: Duration::from_millis(options.timeout_ms),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the exporter's runtime")?;
    runtime.block_on(async {
        let stop = Stop::new()?;
        let listener = TcpListener::bind(options.listen)
            .await
            .with_context(|| format!("listening on {}", options.listen))?;
        let address = listener.local_addr()?;
        // The first line of stdout: where it listens (port 0 picks one).
        println!("listening on {address}");
        eprintln!(
            "fencecheck exporter: serving http://{address}/metrics for {} target(s)",
            scraper.targets.len()
        );
        serve(listener, scraper, stop).await
    })?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODULE: &str = "# HELP fencecheck_decisions_total Fence decisions\n\
        # TYPE fencecheck_decisions_total counter\n\
        fencecheck_decisions_total{operation=\"put\",outcome=\"applied\",epoch=\"1\"} 2\n\
        fencecheck_decisions_total{operation=\"put\",outcome=\"stale-fence\",epoch=\"1\"} 1\n";

    /// The hosts' own text parses into one family with its samples.
    #[test]
    fn parses_the_hosts_text() -> Result<()> {
        let families = parse(MODULE)?;
        let family = families
            .get("fencecheck_decisions_total")
            .context("family")?;
        assert_eq!(family.kind, "counter");
        assert_eq!(family.samples.len(), 2);
        assert_eq!(
            family.samples[1].1,
            [
                "operation=\"put\"",
                "outcome=\"stale-fence\"",
                "epoch=\"1\""
            ]
        );
        assert!(
            parse(
                "# HELP fencecheck_decisions_total x\n# TYPE fencecheck_decisions_total counter\n"
            )?
            .get("fencecheck_decisions_total")
            .is_some_and(|f| f.samples.is_empty())
        );
        Ok(())
    }

    /// Every malformed or hostile reply is refused whole, never passed on.
    #[test]
    fn refuses_what_is_not_a_fencecheck_exposition() {
        for bad in [
            "other_metric 1\n",
            "fencecheck_exporter_up 1\n",
            "fencecheck_x{target=\"a\"} 1\n",
            "fencecheck_x{kind=\"a\"} 1\n",
            "fencecheck_x{a=\"1\",a=\"2\"} 1\n",
            "fencecheck_x{a=\"1} 1\n",
            "fencecheck_x{a=\"\\q\"} 1\n",
            "fencecheck_x{a=1} 1\n",
            "fencecheck_x{1a=\"1\"} 1\n",
            "fencecheck_x 1 2 3\n",
            "fencecheck_x one\n",
            "fencecheck_x\n",
            "fencecheck_x 1\rfencecheck_y 2\n",
            "fencecheck_x 1\nfencecheck_x 2\n",
            "fencecheck_x 1\nfencecheck_y 1\nfencecheck_x{a=\"b\"} 1\n",
            "# TYPE fencecheck_x weird\n",
            "# TYPE bad-name counter\n",
            "fencecheck_x 1\n# TYPE fencecheck_x counter\n",
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
        let mut many = String::new();
        for i in 0..=MAX_SAMPLES {
            many.push_str(&format!("fencecheck_x{{i=\"{i}\"}} 1\n"));
        }
        assert!(parse(&many).is_err());
    }

    /// Label values keep their meaning, re-escaped canonically.
    #[test]
    fn label_values_round_trip() -> Result<()> {
        let families = parse("fencecheck_x{a=\"q\\\"\\\\\\n\",b=\"}{,\"} 1.5\n")?;
        let family = families.get("fencecheck_x").context("family")?;
        assert_eq!(family.samples[0].1, ["a=\"q\\\"\\\\\\n\"", "b=\"}{,\""]);
        assert_eq!(family.samples[0].2, "1.5");
        Ok(())
    }

    /// Target labels hold no password; bad URLs and TLS are refused.
    #[test]
    fn targets_are_labelled_without_secrets() -> Result<()> {
        let t = Target::redis("redis://app:s3cret@127.0.0.1:6380", None)?;
        assert_eq!(t.label, "127.0.0.1:6380");
        let t = Target::redis("redis://:s3cret@localhost", None)?;
        assert_eq!(t.label, "localhost:6379");
        assert!(Target::redis("rediss://h:1", None).is_err());
        assert!(Target::redis("redis://h:1/2", None).is_err());
        let t = Target::postgres("host=db port=5433 user=u password=s3cret dbname=app", None)?;
        assert_eq!(t.label, "db:5433/app");
        let t = Target::postgres("postgresql://u:s3cret@db/app", None)?;
        assert_eq!(t.label, "db:5432/app");
        assert!(Target::postgres("host=db user=u sslmode=require", None).is_err());
        assert!(Target::postgres("host=a,b user=u", None).is_err());
        assert!(Target::postgres("user=u", None).is_err());
        Ok(())
    }
}
