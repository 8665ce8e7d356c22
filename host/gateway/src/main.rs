//! `fencecheck-gateway`: serve fenced objects over HTTP (see the crate docs).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use fencecheck_authority::{
    Coordinator, PostgresCoordinator, SigningCoordinator, SqliteCoordinator, SystemClock,
};
use fencecheck_gateway::{
    Auth, Blobs, Collector, Config, Gateway, Guarded, Limits, Metrics, Pace, PgConnect, Reloader,
    Store, Upstream, s3_store,
};
use pingora::server::configuration::ServerConf;
use pingora::server::{ExecutionPhase, RunArgs, Server};
use tokio::sync::broadcast;

/// A fencing HTTP gateway: PUT/GET/DELETE /objects/{key} with Fence-Token.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to listen on. Without --auth only a loopback address is
    /// accepted (or any, with --insecure-open).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Principals and their rights (TOML; SIGHUP reloads it). Every request
    /// but /healthz must then carry `Authorization: Bearer SECRET`.
    #[arg(long, value_name = "FILE")]
    auth: Option<PathBuf>,
    /// Serve without --auth on a non-loopback address: anyone who reaches
    /// it may read, write, delete and lock everything.
    #[arg(long)]
    insecure_open: bool,
    /// Serve HTTPS with this certificate chain (PEM; with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Longest lease, in seconds: a larger ttl_ms is refused (400).
    #[arg(long, default_value_t = 60)]
    max_ttl: u64,
    /// Directory for the SQLite databases (pointers and fences in
    /// fencecheck.db, leases in locks.db; not with --postgres), and for blobs
    /// (in DIR/blobs) unless --upstream is given.
    #[arg(long)]
    data: PathBuf,
    /// Keep pointers, fence states and leases in this PostgreSQL database
    /// (libpq connection string, no password in it: use PGPASSFILE or
    /// PGPASSWORD) instead of SQLite: every gateway given the same database
    /// (and the same blobs: one --upstream, or one --data directory on one
    /// machine) enforces one high-water mark per key.
    #[arg(long)]
    postgres: Option<String>,
    /// PostgreSQL connections at most (the store's pool).
    #[arg(long, default_value_t = 16)]
    pg_pool: usize,
    /// Keep blobs on this HTTP file server (WebDAV PUT/GET/DELETE), e.g.
    /// http://127.0.0.1:8081/blobs/
    #[arg(long)]
    upstream: Option<String>,
    /// Keep blobs in an S3 bucket at this endpoint (with --s3-bucket;
    /// credentials and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_SESSION_TOKEN, AWS_REGION), under fencecheck-blobs/. Pointers and
    /// fence states stay in SQLite or PostgreSQL.
    #[arg(
        long,
        value_name = "URL",
        requires = "s3_bucket",
        conflicts_with = "upstream"
    )]
    s3_upstream: Option<String>,
    /// The bucket of --s3-upstream (it must exist).
    #[arg(long, value_name = "NAME", requires = "s3_upstream")]
    s3_bucket: Option<String>,
    /// Seconds for connecting to the upstream and for each read or write.
    #[arg(long, default_value_t = 10)]
    upstream_timeout: u64,
    /// A fencecheck component to load instead of the embedded one (it must
    /// pass the conformance vectors; SIGHUP reloads it from this path).
    #[arg(long)]
    component: Option<PathBuf>,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_body: u64,
    /// Largest S3 multipart upload (all its parts), in bytes.
    #[arg(long, default_value_t = 16 << 30)]
    max_upload: u64,
    /// S3 CompleteMultipartUploads of at least this many bytes answer 200
    /// at once and send whitespace until the result, as S3 does (a long
    /// copy must not outlast the client's read timeout).
    #[arg(long, default_value_t = 256 << 20)]
    complete_keepalive_from: u64,
    /// Seconds to wait for the next chunk of a request body (also the
    /// grace before --min-rate applies, and the bound on each response write).
    #[arg(long, default_value_t = 10)]
    body_timeout: u64,
    /// Seconds for a whole request body.
    #[arg(long, default_value_t = 300)]
    body_deadline: u64,
    /// Least average rate of request bodies and of response writes, in
    /// bytes per second (0: none).
    #[arg(long, default_value_t = 1024)]
    min_rate: u64,
    /// Seconds for a whole response body.
    #[arg(long, default_value_t = 300)]
    response_deadline: u64,
    /// Seconds for a whole request header (and keep-alive idle time).
    #[arg(long, default_value_t = 10)]
    header_timeout: u64,
    /// Client connections at once; more are answered 503 and closed.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Storage operations at once (a database call, a lease decision);
    /// clients being waited for (slow bodies, slow downloads) never hold one.
    #[arg(long, default_value_t = 256)]
    max_in_flight: usize,
    /// Milliseconds a request waits for a free storage slot (see
    /// --max-in-flight) before it gets 503 with Retry-After.
    #[arg(long, default_value_t = 1000)]
    queue_timeout_ms: u64,
    /// Seconds an unpublished blob is kept before the collector deletes it
    /// (must exceed the longest upload).
    #[arg(long, default_value_t = 600)]
    retention: u64,
    /// Seconds an S3 multipart upload and its parts are kept from their
    /// start: it must complete within it (a large upload takes far longer
    /// than one PUT); ListMultipartUploads shows the uploads within it.
    #[arg(long, default_value_t = 86_400)]
    upload_retention: u64,
    /// Seconds between collector passes.
    #[arg(long, default_value_t = 30)]
    gc_interval: u64,
    /// Sign every grant of the lock endpoints with the one key in this file
    /// (`ID:HEX`, from `fencecheck keygen`): acquire then returns the signed
    /// token text, which keys that require signed tokens (the store's
    /// `fencecheck_keys`, set with `fencecheck keys set`) accept.
    #[arg(long, value_name = "FILE")]
    signing_key: Option<PathBuf>,
    /// SQLite: fsync each publish on its own instead of sharing one fsync
    /// among the publishes that arrive together (group commit, the
    /// default); both answer only once the publish is on disk. For
    /// measuring the difference.
    #[arg(long)]
    per_publish_sync: bool,
    /// Serve this bucket on the S3 front too (repeatable): path-style
    /// `/{bucket}/{key}`, signed with AWS Signature V4 by the principals of
    /// --auth that carry access_key_id and secret_access_key. Key K of
    /// bucket B is the fenced key B/K of /objects.
    #[arg(long, value_name = "NAME", requires = "auth")]
    bucket: Vec<String>,
    /// Worker threads for the HTTP service.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Seconds SIGTERM waits for requests in flight: the listeners close at
    /// once, each request in flight finishes (its connection then closes),
    /// and the process exits as soon as none is left, or after this
    /// anyway. SIGINT exits at once.
    #[arg(long, default_value_t = 30)]
    drain_timeout: u64,
}

/// The plain-TCP listener's per-connection write buffer: a 4 KiB object
/// and its header (64 MiB at 4,096 connections).
const WRITE_BUFFER: usize = 16 << 10;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // s3s logs every refused S3 request (a bad signature, a
                // stale token) at ERROR; the gateway's own request line
                // already records each with its status and outcome.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,s3s=off")),
        )
        .init();
    let args = Args::parse();
    let loopback = is_loopback(&args.listen)?;
    let auth = Arc::new(match &args.auth {
        Some(path) => {
            let auth = Auth::from_file(path).context("loading --auth")?;
            tracing::info!(principals = auth.principals(), "authentication on");
            auth
        }
        None if loopback => {
            tracing::warn!(listen = %args.listen, "no --auth: open mode on loopback, every local process may read, write and lock every key");
            Auth::open()
        }
        None if args.insecure_open => {
            tracing::warn!(listen = %args.listen, "no --auth and --insecure-open: anyone who reaches this address may read, write and lock every key");
            Auth::open()
        }
        None => anyhow::bail!(
            "refusing to listen on {} (not loopback) without --auth FILE; --insecure-open serves it open anyway",
            args.listen
        ),
    });
    // The component must pass the conformance vectors before it serves.
    let runtime = fencecheck_gateway::vetted(args.component.as_deref())
        .map_err(|e| anyhow::anyhow!("refusing the component: {e}"))?;
    let component_version = runtime.component_version().to_string();
    let runtime_for_signing = runtime.clone();
    tracing::info!(version = %component_version, "component loaded");
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("creating {}", args.data.display()))?;
    let (coordinator, store): (Arc<dyn Coordinator>, Store) = match &args.postgres {
        None => (
            Arc::new(
                SqliteCoordinator::open(
                    &args.data.join("locks.db"),
                    runtime.clone(),
                    Arc::new(SystemClock),
                )
                .context("opening the lease coordinator")?,
            ),
            {
                let store = Store::open(&args.data, runtime)
                    .with_context(|| format!("opening the store in {}", args.data.display()))?;
                if args.per_publish_sync {
                    store.per_publish_sync()
                } else {
                    store
                }
            },
        ),
        Some(url) => {
            let pg = PgConnect::resolve(url)?;
            tracing::info!(tls = pg.is_tls(), pool = args.pg_pool, "PostgreSQL");
            let for_leases = pg.clone();
            (
                Arc::new(
                    PostgresCoordinator::open_with(
                        Arc::new(move || for_leases.connect()),
                        runtime.clone(),
                        Arc::new(SystemClock),
                    )
                    .context("opening the PostgreSQL lease coordinator")?,
                ),
                Store::open_postgres(pg, runtime, args.pg_pool.max(1))
                    .context("opening the PostgreSQL store")?,
            )
        }
    };
    let coordinator: Arc<dyn Coordinator> = match &args.signing_key {
        None => coordinator,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the signing key {}", path.display()))?;
            let key = text
                .parse::<fencecheck::KeysText>()
                .and_then(fencecheck::KeysText::signing_key)
                .with_context(|| format!("the signing key {}", path.display()))?;
            let signer = SigningCoordinator::new(coordinator, &runtime_for_signing, key)
                .context("signing grants")?;
            tracing::info!(key_id = signer.key_id(), "lock grants are signed");
            Arc::new(signer)
        }
    };
    let store = Arc::new(store);
    // Held here until the runtimes are gone, so that the store's and the
    // coordinator's database connections are dropped on this thread: a
    // synchronous PostgreSQL client dropped on a runtime thread panics.
    let held = (store.clone(), coordinator.clone());

    let blobs = Arc::new(match (&args.upstream, &args.s3_upstream, &args.s3_bucket) {
        (Some(url), _, _) => Blobs::upstream(
            Upstream::new(url, Duration::from_secs(args.upstream_timeout))?,
            store.id(),
        ),
        (None, Some(url), Some(bucket)) => Blobs::s3(
            s3_store(url, bucket, Duration::from_secs(args.upstream_timeout))?,
            store.id(),
        ),
        _ => {
            let dir = args.data.join("blobs");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            Blobs::dir(dir, store.id())
        }
    });
    let retention = Duration::from_secs(args.retention);
    let upload_retention = Duration::from_secs(args.upload_retention);
    let config = Config {
        max_body: args.max_body,
        max_upload: args.max_upload,
        complete_keepalive: args.complete_keepalive_from,
        pace: Pace {
            chunk: Duration::from_secs(args.body_timeout.max(1)),
            total: Duration::from_secs(args.body_deadline.max(1)),
            min_rate: args.min_rate,
        },
        response_deadline: Duration::from_secs(args.response_deadline.max(1)),
        min_send_rate: args.min_rate,
        max_in_flight: args.max_in_flight.max(1),
        queue_wait: Duration::from_millis(args.queue_timeout_ms),
        max_ttl: Duration::from_secs(args.max_ttl),
        upload_retention,
    };
    let limits = Limits {
        max_connections: args.max_connections.max(1),
        header_timeout: Duration::from_secs(args.header_timeout.max(1)),
    };
    let metrics = Arc::new(Metrics::new().context("registering metrics")?);
    metrics.component(&component_version);
    let reloader = Reloader::new(
        store.clone(),
        args.component.clone(),
        auth.clone(),
        metrics.clone(),
    );
    let conf = ServerConf {
        threads: args.threads,
        // Pingora sleeps this whole period after SIGTERM (its default is
        // 300 s), idle or not; `drain_then_exit` ends it once the last
        // connection is done.
        grace_period_seconds: Some(args.drain_timeout),
        // After it, tasks still running get this long before they are dropped.
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut gateway = Gateway::new(
        store.clone(),
        blobs.clone(),
        coordinator,
        auth,
        config,
        metrics.clone(),
    );
    if !args.bucket.is_empty() {
        gateway = gateway.with_s3(&args.bucket)?;
    }
    let proxy = pingora::proxy::http_proxy(&server.configuration, gateway);
    let guarded = Guarded::new(proxy, limits, metrics);
    let drain = guarded.drain();
    let mut service =
        pingora::services::listening::Service::new("fencecheck-gateway".to_owned(), guarded);
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let (cert, key) = tls_files(cert, key)?;
            service
                .add_tls(&args.listen, &cert, &key)
                .context("adding the TLS listener")?;
        }
        // A write buffer that holds a small answer's header and body, so
        // they leave in one send (Pingora's default, 1460 bytes, sends a
        // 4 KiB GET in three); allocated per connection.
        _ => service.add_listener(
            pingora::listeners::ListenerConfig::tcp(args.listen.as_str()).l4_buffer(
                pingora::listeners::L4BufferSettings {
                    read: None,
                    write: Some(WRITE_BUFFER),
                },
            ),
        ),
    }
    server.add_service(service);
    // Unpublished blobs (lost races, crashed uploads) go after the window.
    let collector = Collector::new(
        store,
        blobs,
        retention,
        Duration::from_secs(args.gc_interval.max(1)),
    )
    .with_upload_retention(upload_retention);
    server.add_service(pingora::services::background::background_service(
        "collector",
        collector,
    ));
    server.add_service(pingora::services::background::background_service(
        "reloader", reloader,
    ));
    let phases = server.watch_execution_phase();
    let mut seen = server.watch_execution_phase();
    let drain_timeout = Duration::from_secs(args.drain_timeout);
    let for_drain = held.0.clone();
    std::thread::Builder::new()
        .name("fencecheck-drain".into())
        .spawn({
            let drain = drain.clone();
            move || drain_then_exit(phases, &drain, &for_drain, drain_timeout)
        })
        .context("starting the shutdown watcher")?;
    tracing::info!(listen = %args.listen, data = %args.data.display(), "serving");
    server.run(RunArgs::default());
    // Reported here, not by the drain thread: Pingora's grace period and
    // the drain's deadline are two timers of the same length, and
    // whichever fires first the cut is known only once the runtimes have
    // dropped the connections' tasks.
    let sigterm = std::iter::from_fn(|| match seen.try_recv() {
        Ok(phase) => Some(Some(phase)),
        Err(broadcast::error::TryRecvError::Lagged(_)) => Some(None),
        Err(_) => None,
    })
    .any(|phase| matches!(phase, Some(ExecutionPhase::ShutdownGracePeriod)));
    match drain.unfinished() {
        0 => {}
        open if sigterm => tracing::warn!(
            open,
            "--drain-timeout passed with connections still open; they were closed"
        ),
        open => tracing::info!(open, "SIGINT: the open connections were closed"),
    }
    // SIGINT, or a drain that outlasted --drain-timeout: the runtimes are
    // gone (their tasks dropped), and with them every other reference.
    held.0.close_idle();
    drop(held);
    tracing::info!("stopped");
    Ok(())
}

/// After SIGTERM, wait for the last connection to finish (Pingora has
/// closed the listeners and ends keep-alive), then exit at once rather
/// than sleep out the rest of the grace period. At the deadline Pingora
/// goes on by itself: the runtimes stop and `main` returns.
fn drain_then_exit(
    mut phases: broadcast::Receiver<ExecutionPhase>,
    drain: &fencecheck_gateway::Drain,
    store: &Store,
    timeout: Duration,
) {
    loop {
        match phases.blocking_recv() {
            Ok(ExecutionPhase::ShutdownGracePeriod) => break,
            // SIGINT: no grace period; `main` finishes the shutdown.
            Ok(ExecutionPhase::ShutdownRuntimes) | Err(broadcast::error::RecvError::Closed) => {
                return;
            }
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
        }
    }
    let started = std::time::Instant::now();
    tracing::info!(timeout_s = timeout.as_secs(), "SIGTERM: draining");
    // On a cut `main` reports it, after the runtimes have stopped.
    if drain.wait(started + timeout).is_ok() {
        tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            "drained: every request finished; exiting"
        );
        store.close_idle();
        std::process::exit(0);
    }
}

/// Whether every address `listen` resolves to is a loopback one.
fn is_loopback(listen: &str) -> anyhow::Result<bool> {
    let addrs: Vec<_> = std::net::ToSocketAddrs::to_socket_addrs(listen)
        .with_context(|| format!("--listen {listen:?}"))?
        .collect();
    Ok(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()))
}

/// The --tls-cert and --tls-key paths, checked: Pingora panics on files it
/// cannot use, so they are loaded (and the key matched to the certificate)
/// here first, for a clear error.
fn tls_files(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<(String, String)> {
    let text = |p: &std::path::Path| {
        p.to_str()
            .map(str::to_owned)
            .with_context(|| format!("{} is not UTF-8", p.display()))
    };
    let (cert, key) = (text(cert)?, text(key)?);
    let (chain, private) = pingora::tls::load_certs_and_key_files(&cert, &key)
        .map_err(|e| anyhow::anyhow!("reading --tls-cert/--tls-key: {e}"))?
        .with_context(|| format!("no certificate in {cert} or no private key in {key}"))?;
    pingora::tls::install_default_crypto_provider();
    pingora::tls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| anyhow::anyhow!("--tls-cert and --tls-key do not work together: {e}"))?;
    Ok((cert, key))
}
