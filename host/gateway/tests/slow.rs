//! Slow clients on purpose (loopback only, bounded in count and time): 256
//! of them (trickled headers, stalled and trickled bodies, downloads never
//! read) hold connections while a fast client writes, reads and locks as
//! if they were not there; then every one of them is cut off by its
//! deadline. And the connection bound answers 503 at once.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use common::Gateway;

/// Read until the server closes; the bytes read (a reset ends it too).
fn drain(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 << 10];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// A connection whose receive buffer is 4 KiB from the start (set before
/// connecting, so the window it announces stays small and honest), so a
/// download it does not read stalls the gateway's writes at once.
fn small_window(addr: &str) -> anyhow::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketType, connect, socket, sockopt};
    let addr: std::net::SocketAddr = addr.parse()?;
    let fd = socket(AddressFamily::INET, SocketType::STREAM, None)?;
    sockopt::set_socket_recv_buffer_size(&fd, 4096)?;
    connect(&fd, &addr)?;
    Ok(TcpStream::from(fd))
}

fn status_of(response: &[u8]) -> Option<u16> {
    std::str::from_utf8(response.get(..12)?)
        .ok()?
        .get(9..12)?
        .parse()
        .ok()
}

/// What a slow client did and what it got.
#[derive(Debug)]
enum Slow {
    /// The header never finished: closed (maybe with an answer).
    Header(Option<u16>),
    /// The body stalled (`trickled: None`) or trickled (`Some(chunks sent
    /// before the connection was cut)`): its answer.
    Body(Option<u16>, Option<usize>),
    /// The download was never read: bytes that arrived once it was.
    Download(usize),
}

/// 256 slow clients (96 trickling headers, 48 stalling bodies, 48
/// trickling bodies under `--min-rate`, 64 downloads of an 8 MiB object
/// that they do not read) against `--max-in-flight 8`: while all are
/// connected (the connections gauge says so), a fast client's PUT, GET and
/// lock acquire all succeed. Then every slow client is cut off: headers
/// closed, stalled bodies 408, trickled bodies cut while still trickling
/// (the chunk timeout alone never would: a chunk comes every 500 ms),
/// downloads cut short; nothing they sent was published.
///
/// The deadlines (10-12 s) only need to outlast the fast client's three
/// requests, which the barriers start as soon as every slow client is in.
#[test]
fn slow_clients_do_not_starve_a_fast_one() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(
        dir.path(),
        &[
            "--max-in-flight",
            "8",
            "--header-timeout",
            "12",
            "--body-timeout",
            "10",
            "--min-rate",
            "2048",
            "--response-deadline",
            "12",
            "--max-connections",
            "1024",
        ],
    )?;
    let big = vec![b'd'; 8 << 20];
    ensure!(
        gw.request("PUT", "/objects/big", &[("Fence-Token", "0.1")], &big)?
            .status
            == 201
    );
    let auth = gw.auth_header().context("auth")?;
    let addr = gw.addr.clone();
    const CLIENTS: usize = 256;
    // Everyone connected and started before the fast client goes; the
    // fast client done before anyone may be cut off.
    let started = Arc::new(Barrier::new(CLIENTS + 1));
    let fast_done = Arc::new(Barrier::new(CLIENTS + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (addr, auth, started, fast_done) =
                (addr.clone(), auth.clone(), started.clone(), fast_done.clone());
            std::thread::spawn(move || -> anyhow::Result<Slow> {
                let mut s = if i >= 192 {
                    small_window(&addr)?
                } else {
                    TcpStream::connect(&addr)?
                };
                s.set_read_timeout(Some(Duration::from_secs(60)))?;
                match i {
                    0..96 => {
                        s.write_all(b"GET /objects/big HTTP/1.1\r\nHost: x\r\n")?;
                        started.wait();
                        fast_done.wait();
                        // One more header byte now and then: never enough.
                        for _ in 0..3 {
                            if s.write_all(b"X").is_err() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(900));
                        }
                        Ok(Slow::Header(status_of(&drain(&mut s))))
                    }
                    96..192 => {
                        let head = format!(
                            "PUT /objects/slow/{i} HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nFence-Token: 0.1\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n"
                        );
                        s.write_all(head.as_bytes())?;
                        s.write_all(&[b'b'; 100])?;
                        started.wait();
                        fast_done.wait();
                        let mut trickled = None;
                        if i >= 144 {
                            // 200 bytes a second, for up to 30 s: under
                            // --min-rate once the grace (--body-timeout) is over.
                            let mut sent = 0;
                            while sent < 60 && s.write_all(&[b'b'; 100]).is_ok() {
                                sent += 1;
                                std::thread::sleep(Duration::from_millis(500));
                            }
                            trickled = Some(sent);
                        }
                        Ok(Slow::Body(status_of(&drain(&mut s)), trickled))
                    }
                    _ => {
                        let head = format!(
                            "GET /objects/big HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n"
                        );
                        s.write_all(head.as_bytes())?;
                        started.wait();
                        fast_done.wait();
                        // Not reading past --response-deadline: the
                        // gateway's writes stall, and it gives up.
                        std::thread::sleep(Duration::from_secs(14));
                        Ok(Slow::Download(drain(&mut s).len()))
                    }
                }
            })
        })
        .collect();
    started.wait();
    let fast = (|| -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while gw.metric("fencecheck_gateway_connections")?.unwrap_or(0.0) < CLIENTS as f64 {
            ensure!(
                Instant::now() < deadline,
                "the slow clients never all connected"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let r = gw.request("PUT", "/objects/fast", &[("Fence-Token", "0.1")], b"fast")?;
        ensure!(r.status == 201, "fast PUT: {r:?}");
        let r = gw.request("GET", "/objects/fast", &[], b"")?;
        ensure!(r.status == 200 && r.body == b"fast", "fast GET: {r:?}");
        let r = gw.request(
            "POST",
            "/v1/locks/fast/acquire",
            &[],
            br#"{"lease_id":"f","ttl_ms":1000}"#,
        )?;
        ensure!(r.status == 200, "fast acquire: {r:?}");
        let busy = gw.metric("fencecheck_gateway_connections")?.unwrap_or(0.0);
        ensure!(
            busy >= CLIENTS as f64,
            "only {busy} connections while the fast client ran"
        );
        Ok(())
    })();
    fast_done.wait();
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.push(
            c.join()
                .map_err(|_| anyhow::anyhow!("a slow client panicked"))??,
        );
    }
    fast?;
    for (i, o) in outcomes.iter().enumerate() {
        match o {
            Slow::Header(status) => ensure!(
                status.is_none() || *status == Some(408) || *status == Some(400),
                "header client {i}: {o:?}"
            ),
            Slow::Body(status, None) => ensure!(*status == Some(408), "body client {i}: {o:?}"),
            // Cut while trickling; the 408 may be lost to the reset that
            // closing on unread bytes sends.
            Slow::Body(status, Some(sent)) => ensure!(
                *sent < 60 && (status.is_none() || *status == Some(408)),
                "trickling client {i}: {o:?}"
            ),
            Slow::Download(n) => ensure!(*n < big.len(), "download client {i} got it all: {n}"),
        }
    }
    for i in 96..192 {
        let r = gw.request("GET", &format!("/objects/slow/{i}"), &[], b"")?;
        ensure!(r.status == 404, "slow/{i} was published: {r:?}");
    }
    ensure!(gw.request("GET", "/objects/big", &[], b"")?.body == big);
    Ok(())
}

/// Over `--max-connections`, a new connection is answered 503 (problem,
/// Retry-After) and closed at once; when idle ones are cut by the header
/// deadline, there is room again. With two idle connections known to be
/// in (the gauge counts them and the probe), a third idle one and a
/// request race for the last slot: exactly one of them gets the 503.
#[test]
fn connection_bound_is_503() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = Gateway::start_authed(
        dir.path(),
        &["--max-connections", "3", "--header-timeout", "6"],
    )?;
    let mut idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(&gw.addr))
        .collect::<Result<_, _>>()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.metric("fencecheck_gateway_connections")? != Some(3.0) {
        ensure!(
            Instant::now() < deadline,
            "the idle connections were not counted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut third = TcpStream::connect(&gw.addr)?;
    third.set_read_timeout(Some(Duration::from_secs(30)))?;
    let r = common::request_to(&gw.addr, "GET", "/healthz", &[], b"")?;
    let refused = if r.status == 503 {
        idle.push(third);
        r
    } else {
        ensure!(r.status == 200, "{r:?}");
        let raw = drain(&mut third);
        ensure!(
            status_of(&raw) == Some(503),
            "neither was refused: {:?}",
            String::from_utf8_lossy(&raw)
        );
        common::Response::parse(&raw)?
    };
    ensure!(refused.header("retry-after") == Some("1"), "{refused:?}");
    ensure!(refused.json()?["title"] == "overloaded", "{refused:?}");
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        drain(&mut s);
    }
    let r = gw.request("GET", "/objects/none", &[], b"")?;
    ensure!(r.status == 404, "{r:?}");
    // At least the refusal above (a probe of the gauge may have raced one
    // of the idle connections' closing and been refused too).
    ensure!(
        gw.metric("fencecheck_gateway_connections_refused_total")?
            .is_some_and(|n| n >= 1.0)
    );
    Ok(())
}
