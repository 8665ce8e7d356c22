//! The gateway's S3 front against the S3 server behind it (issue 26 item
//! 4): PUT and GET of 4 KiB and 16 MiB objects with one client library
//! (`object_store`), once through the gateway (`--bucket`, blobs on
//! `--s3-upstream`, pointers in SQLite, SigV4 checked, every PUT fenced
//! with a rising `x-amz-meta-fence-token`) and once to the upstream
//! directly (the same metadata, so the same bytes on the wire). The
//! upstream is s3s-fs in this process; the gateway is the release binary
//! (`cargo build --release -p fencecheck-gateway` first, or set
//! FENCECHECK_GATEWAY). Besides criterion's estimates it prints each
//! case's median and p99 over every timed request, then the ratios
//! measured side by side: rounds in which the targets take turns request
//! by request (so a change in the machine's load falls on both), each
//! round's gateway / upstream ratio of medians, and the median of the
//! rounds. FENCECHECK_GATEWAY_BEFORE (another build of the gateway) adds
//! it as a third target in those rounds: before and after in one run.
//!
//! `cargo bench -p fencecheck-benches --bench s3`

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use criterion::{Criterion, Throughput};
use fencecheck_tests::s3server::{self, S3Server};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    Attribute, AttributeValue, Attributes, ClientOptions, ObjectStore, PutOptions, PutPayload,
};

const KEY: &str = "AKIABENCHGATEWAY01";
const SECRET: &str = "benchSecretAccessKey/0123456789abcdefABCD";

/// Every timed request's duration, by case.
static TIMES: Mutex<BTreeMap<String, Vec<Duration>>> = Mutex::new(BTreeMap::new());
/// The fencing token's counter: every PUT presents a larger one.
static COUNTER: AtomicU64 = AtomicU64::new(1);

struct GatewayProcess(Child);

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gateway_binary() -> PathBuf {
    std::env::var_os("FENCECHECK_GATEWAY").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/fencecheck-gateway"),
        PathBuf::from,
    )
}

fn start_gateway(
    binary: PathBuf,
    dir: &Path,
    upstream: &str,
) -> anyhow::Result<(GatewayProcess, String)> {
    std::fs::create_dir_all(dir)?;
    if !binary.exists() {
        bail!(
            "{} is missing: cargo build --release -p fencecheck-gateway",
            binary.display()
        );
    }
    let auth = dir.join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"bench\"\naccess_key_id = \"{KEY}\"\nsecret_access_key = \"{SECRET}\"\nread = [\"\"]\nwrite = [\"\"]\n"
        ),
    )?;
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(binary)
        .args(["--listen", &addr, "--data"])
        .arg(dir.join("data"))
        .arg("--auth")
        .arg(&auth)
        .args([
            "--bucket",
            "reports",
            "--s3-bucket",
            "blobs",
            "--s3-upstream",
        ])
        .arg(format!("http://{upstream}"))
        .env("AWS_ACCESS_KEY_ID", s3server::KEY)
        .env("AWS_SECRET_ACCESS_KEY", s3server::SECRET)
        .env("RUST_LOG", "warn,s3s=off")
        .stdout(Stdio::null())
        .spawn()
        .context("starting the gateway")?;
    let process = GatewayProcess(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while ureq::get(&format!("http://{addr}/healthz")).call().is_err() {
        if Instant::now() > deadline {
            bail!("the gateway did not become healthy");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((process, addr))
}

fn client(addr: &str, bucket: &str, key: &str, secret: &str) -> anyhow::Result<impl ObjectStore> {
    Ok(AmazonS3Builder::new()
        .with_endpoint(format!("http://{addr}"))
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id(key)
        .with_secret_access_key(secret)
        .with_virtual_hosted_style_request(false)
        .with_client_options(ClientOptions::new().with_allow_http(true))
        .build()?)
}

fn fenced() -> PutOptions {
    let mut attributes = Attributes::new();
    let token = format!("1.{}", COUNTER.fetch_add(1, Ordering::Relaxed));
    attributes.insert(
        Attribute::Metadata("fence-token".into()),
        AttributeValue::from(token),
    );
    PutOptions {
        attributes,
        ..PutOptions::default()
    }
}

fn record(case: &str, took: Duration) {
    if let Ok(mut times) = TIMES.lock() {
        times.entry(case.to_owned()).or_default().push(took);
    }
}

/// Rounds of the side-by-side comparison.
const ROUNDS: usize = 5;

/// One request of `case` to `store`, timed.
fn once(
    runtime: &tokio::runtime::Runtime,
    store: &dyn ObjectStore,
    put: bool,
    path: &ObjectPath,
    body: &PutPayload,
    size: usize,
) -> Duration {
    let started = Instant::now();
    if put {
        let options = fenced();
        if let Err(e) = runtime.block_on(store.put_opts(path, body.clone(), options)) {
            panic!("put {path}: {e}");
        }
    } else {
        match runtime.block_on(async { store.get(path).await?.bytes().await }) {
            Ok(bytes) if bytes.len() == size => {}
            Ok(bytes) => panic!("get {path}: {} bytes", bytes.len()),
            Err(e) => panic!("get {path}: {e}"),
        }
    }
    started.elapsed()
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

/// The side-by-side rounds: each round, every target serves the same
/// requests in turn (upstream, gateway, upstream, …); per round the
/// median of each target and gateway / upstream; the median of those.
fn side_by_side(
    runtime: &tokio::runtime::Runtime,
    targets: &[(&str, Box<dyn ObjectStore>)],
) -> anyhow::Result<()> {
    println!(
        "\nside by side, {ROUNDS} rounds (load average {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    for (label, size, pairs) in [("4KiB", 4usize << 10, 300), ("16MiB", 16 << 20, 12)] {
        let body = PutPayload::from(vec![7u8; size]);
        let path = ObjectPath::from(format!("side/{label}"));
        for put in [true, false] {
            let op = if put { "put" } else { "get" };
            if !put {
                for (_, store) in targets {
                    once(runtime, store.as_ref(), true, &path, &body, size);
                }
            }
            let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
            for round in 1..=ROUNDS {
                let mut times: Vec<Vec<Duration>> = vec![Vec::new(); targets.len()];
                for _ in 0..pairs {
                    for (i, (_, store)) in targets.iter().enumerate() {
                        times[i].push(once(runtime, store.as_ref(), put, &path, &body, size));
                    }
                }
                let medians: Vec<Duration> = times.iter_mut().map(|t| median(t)).collect();
                let mut line = format!("{op} {label:<6} round {round}:");
                for (i, (target, _)) in targets.iter().enumerate() {
                    let ratio = medians[i].as_secs_f64() / medians[0].as_secs_f64();
                    ratios[i].push(ratio);
                    line.push_str(&format!(" {target} {:.3?} ({ratio:.2}x)", medians[i]));
                }
                println!("{line}");
            }
            let mut line = format!("{op} {label:<6} median of rounds:");
            for (i, (target, _)) in targets.iter().enumerate().skip(1) {
                ratios[i].sort_by(f64::total_cmp);
                line.push_str(&format!(" {target} {:.2}x", ratios[i][ratios[i].len() / 2]));
            }
            println!("{line}");
        }
    }
    Ok(())
}

fn bench(c: &mut Criterion) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let upstream = S3Server::start(&dir.path().join("upstream"), &["blobs", "direct"])?;
    let (_gateway, addr) = start_gateway(gateway_binary(), &dir.path().join("gw"), &upstream.addr)?;
    let before = match std::env::var_os("FENCECHECK_GATEWAY_BEFORE") {
        Some(binary) => Some(start_gateway(
            PathBuf::from(binary),
            &dir.path().join("gw-before"),
            &upstream.addr,
        )?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut targets: Vec<(&str, Box<dyn ObjectStore>)> = vec![
        (
            "upstream",
            Box::new(client(
                &upstream.addr,
                "direct",
                s3server::KEY,
                s3server::SECRET,
            )?),
        ),
        ("gateway", Box::new(client(&addr, "reports", KEY, SECRET)?)),
    ];
    if let Some((_, addr)) = &before {
        targets.push(("before", Box::new(client(addr, "reports", KEY, SECRET)?)));
    }
    for (label, size) in [("4KiB", 4usize << 10), ("16MiB", 16 << 20)] {
        let body = PutPayload::from(vec![7u8; size]);
        let path = ObjectPath::from(format!("bench/{label}"));
        let mut group = c.benchmark_group(format!("s3/{label}"));
        group.throughput(Throughput::Bytes(size as u64));
        if size > 1 << 20 {
            group.sample_size(10);
        }
        for (target, store) in &targets {
            let case = format!("put {label} {target}");
            group.bench_function(format!("put/{target}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let options = fenced();
                        let started = Instant::now();
                        let result = runtime.block_on(store.put_opts(&path, body.clone(), options));
                        let took = started.elapsed();
                        if let Err(e) = result {
                            panic!("{case}: {e}");
                        }
                        record(&case, took);
                        total += took;
                    }
                    total
                })
            });
            let case = format!("get {label} {target}");
            group.bench_function(format!("get/{target}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let started = Instant::now();
                        let result =
                            runtime.block_on(async { store.get(&path).await?.bytes().await });
                        let took = started.elapsed();
                        match result {
                            Ok(bytes) if bytes.len() == size => {}
                            Ok(bytes) => panic!("{case}: {} bytes", bytes.len()),
                            Err(e) => panic!("{case}: {e}"),
                        }
                        record(&case, took);
                        total += took;
                    }
                    total
                })
            });
        }
        group.finish();
    }
    side_by_side(&runtime, &targets)?;
    drop(before);
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn main() -> anyhow::Result<()> {
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c)?;
    c.final_summary();
    let times = TIMES.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    println!("\ncase                        requests   median       p99");
    for (case, list) in times.iter() {
        let mut sorted = list.clone();
        sorted.sort();
        println!(
            "{case:<27} {:>8} {:>9.3?} {:>9.3?}",
            sorted.len(),
            percentile(&sorted, 0.5),
            percentile(&sorted, 0.99)
        );
    }
    Ok(())
}
