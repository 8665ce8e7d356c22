//! Test support: the gateway as a child process on a free loopback port, and
//! a raw HTTP/1.1 client (raw so that paths reach the gateway exactly as
//! written: no client normalizes `..` away, and bodies can pause mid-way).

#![allow(dead_code)] // each test file uses a different part

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub mod nginx;
pub mod pki;
pub mod relay;

/// The secret of the principal [`Gateway::start_authed`] configures.
pub const ROOT_SECRET: &str = "s3cret-root-7f1d9a";

/// Hex SHA-256 of `text` (what an auth file stores for a secret).
pub fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One principal of a test auth file.
pub struct Principal<'a> {
    pub name: &'a str,
    pub secret: &'a str,
    pub read: &'a [&'a str],
    pub write: &'a [&'a str],
    pub lock: &'a [&'a str],
}

/// Write an auth file with `principals`.
pub fn write_auth(path: &Path, principals: &[Principal<'_>]) -> anyhow::Result<()> {
    let list = |items: &[&str]| {
        let quoted: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
        format!("[{}]", quoted.join(", "))
    };
    let mut text = String::new();
    for p in principals {
        text.push_str(&format!(
            "[[principal]]\nname = {:?}\nsecret_sha256 = \"{}\"\nread = {}\nwrite = {}\nlock = {}\n\n",
            p.name,
            sha256_hex(p.secret),
            list(p.read),
            list(p.write),
            list(p.lock)
        ));
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// `DATA/auth.toml` with one principal, `root`, holding every right on
/// every key (secret [`ROOT_SECRET`]).
pub fn root_auth(data: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(data)?;
    let file = data.join("auth.toml");
    write_auth(
        &file,
        &[Principal {
            name: "root",
            secret: ROOT_SECRET,
            read: &[""],
            write: &[""],
            lock: &[""],
        }],
    )?;
    Ok(file)
}

/// A running gateway; killed on drop.
pub struct Gateway {
    pub child: Child,
    pub addr: String,
    pub data: PathBuf,
    /// Sent as `Authorization: Bearer …` by [`Gateway::request`] and
    /// [`Gateway::open`] unless the call sets its own.
    pub bearer: Option<String>,
}

impl Gateway {
    /// Start with `--auth` and one principal holding every right on every
    /// key (secret [`ROOT_SECRET`]), which every request then presents.
    pub fn start_authed(data: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let file = root_auth(data)?.display().to_string();
        let mut args = vec!["--auth", file.as_str()];
        args.extend_from_slice(extra);
        let mut gw = Self::spawn(data, &args, Some(ROOT_SECRET.to_owned()))?;
        gw.wait_healthy()?;
        Ok(gw)
    }

    /// Start `fencecheck-gateway --data DIR` with `extra` flags; waits until
    /// /healthz answers.
    pub fn start(data: &Path, extra: &[&str]) -> anyhow::Result<Self> {
        let mut gw = Self::spawn(data, extra, None)?;
        gw.wait_healthy()?;
        Ok(gw)
    }

    /// Start the process, not waiting for it.
    pub fn spawn(data: &Path, extra: &[&str], bearer: Option<String>) -> anyhow::Result<Self> {
        Self::spawn_logged(data, extra, bearer, None, &[])
    }

    /// Start the process with its stderr in `log` (file, `RUST_LOG` level).
    pub fn spawn_logged(
        data: &Path,
        extra: &[&str],
        bearer: Option<String>,
        log: Option<(&Path, &str)>,
        env: &[(&str, &Path)],
    ) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
            .args(["--listen", &addr, "--data"])
            .arg(data)
            .args(extra)
            .env("RUST_LOG", log.map_or("warn,s3s=off", |l| l.1))
            .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
            .stdout(Stdio::null())
            .stderr(match log {
                Some((path, _)) => Stdio::from(std::fs::File::create(path)?),
                None => Stdio::inherit(),
            })
            .spawn()
            .context("spawning the gateway")?;
        Ok(Self {
            child,
            addr,
            data: data.to_owned(),
            bearer,
        })
    }

    /// Wait (bounded) until /healthz answers 200.
    pub fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self.request("GET", "/healthz", &[], b"")
                && r.status == 200
            {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the gateway exited during startup: {status}");
            }
            if Instant::now() > deadline {
                bail!("the gateway did not become healthy");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `Authorization` header this gateway's requests carry, if any.
    pub fn auth_header(&self) -> Option<String> {
        self.bearer.as_ref().map(|b| format!("Bearer {b}"))
    }

    /// One request on a fresh connection.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<Response> {
        let mut open = self.open(method, path, headers, Some(body.len()))?;
        open.send(body)?;
        open.finish()
    }

    /// Start a request, body not sent yet. `length: None` sends it chunked.
    pub fn open(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        length: Option<usize>,
    ) -> anyhow::Result<Open> {
        let auth = self.auth_header();
        let mut all: Vec<(&str, &str)> = headers.to_vec();
        if let Some(auth) = &auth
            && !headers
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        {
            all.push(("Authorization", auth.as_str()));
        }
        open_to(&self.addr, method, path, &all, length)
    }

    /// A series of `/metrics` (exact name with labels), if present.
    pub fn metric(&self, series: &str) -> anyhow::Result<Option<f64>> {
        let text = String::from_utf8(self.request("GET", "/metrics", &[], b"")?.body)?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()))
    }

    /// Files in the blob directory.
    pub fn blob_count(&self) -> anyhow::Result<usize> {
        Ok(std::fs::read_dir(self.data.join("blobs"))?.count())
    }
}

/// One request to `addr` on a fresh connection.
pub fn request_to(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let mut open = open_to(addr, method, path, headers, Some(body.len()))?;
    open.send(body)?;
    open.finish()
}

/// Start a request to `addr`, body not sent yet.
pub fn open_to(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    length: Option<usize>,
) -> anyhow::Result<Open> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    match length {
        Some(n) => head.push_str(&format!("Content-Length: {n}\r\n")),
        None => head.push_str("Transfer-Encoding: chunked\r\n"),
    }
    head.push_str("\r\n");
    let mut open = Open {
        stream,
        chunked: length.is_none(),
    };
    open.stream.write_all(head.as_bytes())?;
    Ok(open)
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request whose body is still being written.
pub struct Open {
    stream: TcpStream,
    chunked: bool,
}

impl Open {
    /// Send part of the body.
    pub fn send(&mut self, part: &[u8]) -> anyhow::Result<()> {
        if part.is_empty() {
            return Ok(());
        }
        if self.chunked {
            self.stream
                .write_all(format!("{:x}\r\n", part.len()).as_bytes())?;
            self.stream.write_all(part)?;
            self.stream.write_all(b"\r\n")?;
        } else {
            self.stream.write_all(part)?;
        }
        Ok(())
    }

    /// End the body (if chunked) and read the whole response.
    pub fn finish(mut self) -> anyhow::Result<Response> {
        if self.chunked {
            // The server may already have answered and closed (413).
            let _ = self.stream.write_all(b"0\r\n\r\n");
        }
        self.response()
    }

    /// Stop sending (half-close): the server sees the body end here, short
    /// of its `Content-Length`. Then read the response.
    pub fn cut(self) -> anyhow::Result<Response> {
        self.stream.shutdown(std::net::Shutdown::Write)?;
        self.response()
    }

    /// Read the response without ending the body (the server answered early).
    pub fn response(mut self) -> anyhow::Result<Response> {
        let mut raw = Vec::new();
        match self.stream.read_to_end(&mut raw) {
            Ok(_) => {}
            // A reset after the full response arrived (unread body left).
            Err(e) if !raw.is_empty() => eprintln!("read ended with {e}"),
            Err(e) => return Err(e.into()),
        }
        Response::parse(&raw)
    }
}

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// Parse a whole raw response.
    pub fn parse(raw: &[u8]) -> anyhow::Result<Self> {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .context("no end of headers in the response")?;
        let head = std::str::from_utf8(&raw[..split])?;
        let mut lines = head.split("\r\n");
        let status_line = lines.next().context("empty response")?;
        let status = status_line
            .split(' ')
            .nth(1)
            .context("no status")?
            .parse()?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let mut body = raw[split + 4..].to_vec();
        let chunked = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
        if chunked {
            body = dechunk(&body)?;
        }
        Ok(Self {
            status,
            headers,
            body,
        })
    }

    /// A header's value (names compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (problem documents).
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).context("the body is not JSON")
    }
}

fn dechunk(mut data: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("bad chunk")?;
        let size = usize::from_str_radix(std::str::from_utf8(&data[..line_end])?.trim(), 16)?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(data.get(..size).context("short chunk")?);
        data = data.get(size + 2..).context("short chunk")?;
    }
}
