//! Load with a recorded history, and SIGKILL mid-load: concurrent current
//! and stale writers on a few keys, every answer recorded, then checked
//! against what the fence promises.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::Gateway;

const KEYS: [&str; 4] = ["load/a", "load/b", "load/c", "load/d"];

/// One answered (or unanswered) PUT.
#[derive(Clone, Debug)]
struct Event {
    key: &'static str,
    token: u64,
    /// HTTP status; `None`: no answer (connection failed, gateway killed).
    status: Option<u16>,
    version: Option<u64>,
    highest: Option<u64>,
}

fn counter(text: &str) -> Option<u64> {
    text.strip_prefix("0.")?.parse().ok()
}

/// `clients` threads, each taking the next token of a random key from a
/// shared counter (a lock service's grants) and PUTting `key:token` to one
/// of the gateways (client `c` to gateway `c % n`; none left: no answer);
/// every third write waits a little first, so it is often stale by the time
/// it arrives. Runs until `stop` or `per_client` writes each.
fn run_load(
    addr_of: Arc<Mutex<Vec<Gateway>>>,
    clients: usize,
    per_client: usize,
    stop: Arc<AtomicBool>,
) -> Vec<Event> {
    let grants: Arc<Vec<AtomicU64>> = Arc::new(KEYS.iter().map(|_| AtomicU64::new(0)).collect());
    let history = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (grants, history, stop, gw) = (
                grants.clone(),
                history.clone(),
                stop.clone(),
                addr_of.clone(),
            );
            std::thread::spawn(move || {
                for i in 0..per_client {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let k = (c * 7 + i * 3) % KEYS.len();
                    let key = KEYS[k];
                    let token = grants[k].fetch_add(1, Ordering::SeqCst) + 1;
                    if (c + i) % 3 == 0 {
                        std::thread::sleep(Duration::from_millis(((c * 13 + i) % 7) as u64));
                    }
                    let answer = {
                        let guard = gw.lock().ok();
                        let target = guard.as_ref().and_then(|g| {
                            g.get(c % g.len().max(1))
                                .map(|g| (g.addr.clone(), g.auth_header().unwrap_or_default()))
                        });
                        drop(guard);
                        target.and_then(|(addr, auth)| {
                            common::request_to(
                                &addr,
                                "PUT",
                                &format!("/objects/{key}"),
                                &[
                                    ("Fence-Token", &format!("0.{token}")),
                                    ("Authorization", &auth),
                                ],
                                format!("{key}:{token}").as_bytes(),
                            )
                            .ok()
                        })
                    };
                    let event = Event {
                        key,
                        token,
                        status: answer.as_ref().map(|r| r.status),
                        version: answer
                            .as_ref()
                            .and_then(|r| r.header("etag")?.trim_matches('"').parse().ok()),
                        highest: answer
                            .as_ref()
                            .and_then(|r| r.json().ok()?["highest"].as_str().and_then(counter)),
                    };
                    if let Ok(mut h) = history.lock() {
                        h.push(event);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    history.lock().map(|h| h.clone()).unwrap_or_default()
}

/// What every history must satisfy, per key: applied writes' versions are
/// distinct and their tokens increase with the version (no stale write was
/// ever applied after a newer one); every 409 names a higher token that was
/// really presented; no request got anything but 200/201/409 (or no answer
/// when `killed`). Returns the highest acknowledged token per key.
fn check_history(
    history: &[Event],
    killed: bool,
) -> anyhow::Result<HashMap<&'static str, (u64, u64)>> {
    let mut best = HashMap::new();
    for key in KEYS {
        let events: Vec<&Event> = history.iter().filter(|e| e.key == key).collect();
        let mut applied: Vec<(u64, u64)> = events
            .iter()
            .filter(|e| matches!(e.status, Some(200 | 201)))
            .map(|e| Ok((e.version.context("applied without ETag")?, e.token)))
            .collect::<anyhow::Result<_>>()?;
        applied.sort();
        for pair in applied.windows(2) {
            ensure!(
                pair[0].0 < pair[1].0,
                "{key}: version {} acknowledged twice",
                pair[0].0
            );
            ensure!(
                pair[0].1 < pair[1].1,
                "{key}: token {} applied after {}",
                pair[1].1,
                pair[0].1
            );
        }
        let presented: Vec<u64> = events.iter().map(|e| e.token).collect();
        for e in &events {
            match e.status {
                Some(200 | 201) => {}
                Some(409) => {
                    let highest = e.highest.context("409 without highest")?;
                    ensure!(
                        highest > e.token,
                        "{key}: 409 for {} with highest {highest}",
                        e.token
                    );
                    ensure!(
                        presented.contains(&highest),
                        "{key}: highest {highest} was never presented"
                    );
                }
                None if killed => {}
                other => anyhow::bail!("{key}: token {} got {other:?}", e.token),
            }
        }
        if let Some(&(version, token)) = applied.last() {
            best.insert(key, (version, token));
        }
    }
    Ok(best)
}

/// 64 clients, current and stale writers on 4 keys, authenticated: the
/// recorded history satisfies the fence, and each key shows the highest
/// applied token's bytes.
#[test]
fn load_history_is_fenced() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(dir.path(), &["--max-in-flight", "1024"])?;
    let gw = Arc::new(Mutex::new(vec![gw]));
    let started = Instant::now();
    let history = run_load(gw.clone(), 64, 20, Arc::new(AtomicBool::new(false)));
    eprintln!("{} writes in {:?}", history.len(), started.elapsed());
    ensure!(history.len() == 64 * 20);
    let best = check_history(&history, false)?;
    let stale = history.iter().filter(|e| e.status == Some(409)).count();
    ensure!(
        stale > 0 && best.len() == KEYS.len(),
        "no contention: {stale} stale"
    );
    let guard = gw.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let gw = guard.first().context("gone")?;
    for (key, (version, token)) in best {
        let r = gw.request("GET", &format!("/objects/{key}"), &[], b"")?;
        ensure!(
            r.body == format!("{key}:{token}").as_bytes(),
            "{key}: {:?}",
            String::from_utf8_lossy(&r.body)
        );
        ensure!(r.header("etag") == Some(format!("\"{version}\"").as_str()));
    }
    Ok(())
}

/// SIGKILL the authenticated gateway mid-load and restart it on the same data: no
/// acknowledged publish is lost (each key shows a token at least as high as
/// every acknowledged one, with its own bytes), nothing stale is visible, and
/// the blobs of unpublished uploads are collected.
#[test]
fn sigkill_mid_load_loses_nothing_acknowledged() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let first = Gateway::start_authed(dir.path(), &["--max-in-flight", "1024"])?;
    let gw = Arc::new(Mutex::new(vec![first]));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (gw, stop) = (gw.clone(), stop.clone());
        std::thread::spawn(move || run_load(gw, 32, 10_000, stop))
    };
    std::thread::sleep(Duration::from_millis(1500));
    // SIGKILL (Child::kill), mid-load; later writes find no gateway.
    if let Ok(mut g) = gw.lock() {
        g.clear();
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let history = load
        .join()
        .map_err(|_| anyhow::anyhow!("load thread panicked"))?;
    let acked = history
        .iter()
        .filter(|e| matches!(e.status, Some(200 | 201)))
        .count();
    eprintln!(
        "{} writes, {acked} acknowledged before the kill",
        history.len()
    );
    ensure!(acked > 0);
    let best = check_history(&history, true)?;

    let restarted = Gateway::start_authed(dir.path(), &["--retention", "0", "--gc-interval", "1"])?;
    for (key, (version, token)) in &best {
        let r = restarted.request("GET", &format!("/objects/{key}"), &[], b"")?;
        ensure!(r.status == 200, "{key}: {}", r.status);
        let visible = r
            .header("fence-token")
            .and_then(counter)
            .context("no fence")?;
        let v: u64 = r
            .header("etag")
            .context("no etag")?
            .trim_matches('"')
            .parse()?;
        ensure!(
            visible >= *token && v >= *version,
            "{key}: visible 0.{visible} v{v}, acknowledged 0.{token} v{version}"
        );
        ensure!(
            r.body == format!("{key}:{visible}").as_bytes(),
            "{key}: wrong bytes"
        );
    }
    // Only the visible blobs remain once the collector has run.
    let deadline = Instant::now() + Duration::from_secs(15);
    while restarted.blob_count()? > best.len() {
        ensure!(
            Instant::now() < deadline,
            "{} blobs left for {} keys",
            restarted.blob_count()?,
            best.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// `--postgres`: two gateway processes on one PostgreSQL database (and one
/// blob directory) enforce one high-water mark per key. The seed's paused
/// writer across them (B through one, A's late write through the other gets
/// 409), then 32 clients split over both, current and stale writers: the
/// recorded history satisfies the fence as with one gateway, and both
/// gateways show each key's highest applied token's bytes.
#[test]
fn two_gateways_on_one_postgres_database_share_one_fence() -> anyhow::Result<()> {
    let server = fencecheck_tests::pgserver::PgServer::start()?;
    let url = server.url();
    let dir = tempfile::tempdir()?;
    let flags = ["--postgres", url.as_str(), "--max-in-flight", "1024"];
    let one = Gateway::start_authed(dir.path(), &flags)?;
    let two = Gateway::start_authed(dir.path(), &flags)?;

    let put = |gw: &Gateway, token: &str, body: &str| {
        gw.request(
            "PUT",
            "/objects/report/july",
            &[("Fence-Token", token)],
            body.as_bytes(),
        )
    };
    ensure!(
        put(&one, "0.42", "b9")?.status == 201,
        "B through gateway one"
    );
    let late = put(&two, "0.41", "a7")?;
    ensure!(
        late.status == 409,
        "A's late write through gateway two: {}",
        late.status
    );
    for gw in [&one, &two] {
        let r = gw.request("GET", "/objects/report/july", &[], b"")?;
        ensure!(
            r.status == 200 && r.body == b"b9",
            "{}: {:?}",
            r.status,
            r.body
        );
    }

    let gws = Arc::new(Mutex::new(vec![one, two]));
    let history = run_load(gws.clone(), 32, 20, Arc::new(AtomicBool::new(false)));
    ensure!(history.len() == 32 * 20);
    let best = check_history(&history, false)?;
    let stale = history.iter().filter(|e| e.status == Some(409)).count();
    ensure!(
        stale > 0 && best.len() == KEYS.len(),
        "no contention: {stale} stale"
    );
    let guard = gws.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    for gw in guard.iter() {
        for (key, (version, token)) in &best {
            let r = gw.request("GET", &format!("/objects/{key}"), &[], b"")?;
            ensure!(
                r.body == format!("{key}:{token}").as_bytes(),
                "{key} through {}: {:?}",
                gw.addr,
                String::from_utf8_lossy(&r.body)
            );
            ensure!(r.header("etag") == Some(format!("\"{version}\"").as_str()));
        }
    }
    Ok(())
}
