//! Helpers shared by the adapter's integration tests: temporary databases,
//! the process-wide runtime, requests, and worker processes.
#![allow(dead_code)] // each test file uses a different subset

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use fencecheck::{Policy, Request, Runtime, Token};
use rusqlite::Connection;

/// The process-wide runtime: the component is compiled once per test binary.
pub fn runtime() -> Result<Runtime> {
    Runtime::shared().context("loading the embedded component")
}

/// A database file in its own temporary directory, removed on drop.
pub struct Db {
    _dir: tempfile::TempDir,
    /// The database file.
    pub path: PathBuf,
}

impl Db {
    /// A fresh file with the adapter's tables installed (WAL mode).
    pub fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("fence.sqlite");
        let db = Self { _dir: dir, path };
        fencecheck_sqlite::install(&db.open()?)?;
        Ok(db)
    }

    /// A new connection: WAL, `synchronous=NORMAL`, 10 s busy timeout.
    pub fn open(&self) -> Result<Connection> {
        open(&self.path, Duration::from_secs(10))
    }
}

/// A connection to `path` with the given busy timeout.
pub fn open(path: &Path, busy: Duration) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(busy)?;
    Ok(conn)
}

/// A point in time, `ms` after the epoch: tests pass time in explicitly.
pub fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// A strict request for `scope` with token `0.counter`.
pub fn strict(scope: &str, counter: u64) -> Request {
    Request::new(scope, Token::new(0, 0, counter), Policy::Strict)
}

/// Rows of a one-column query, as strings (for "nothing changed" checks).
pub fn rows(conn: &Connection, sql: &str) -> Result<Vec<String>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt
        .query_map([], |r| {
            let v: rusqlite::types::Value = r.get(0)?;
            Ok(format!("{v:?}"))
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// A running `fencecheck-sqlite-worker`, talked to over pipes.
pub struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    /// Start the worker on `db` with its clock at `now_ms`.
    pub fn spawn(db: &Path, now_ms: u64, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencecheck-sqlite-worker"))
            .arg(db)
            .arg(now_ms.to_string())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting fencecheck-sqlite-worker")?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// The next line the worker prints; an error if it exited instead.
    pub fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("worker exited: {:?}", self.child.wait()?);
        }
        Ok(line.trim_end().to_string())
    }

    /// Send one line to the worker.
    pub fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("worker stdin closed")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// SIGKILL the worker and reap it; errors unless it died of SIGKILL.
    pub fn kill(mut self) -> Result<()> {
        use std::os::unix::process::ExitStatusExt;
        self.child.kill()?; // std sends SIGKILL on Unix
        let status = self.child.wait()?;
        if status.signal() != Some(9) {
            bail!("worker was not killed by SIGKILL: {status:?}");
        }
        Ok(())
    }

    /// Every remaining line, then the exit status.
    pub fn finish(mut self) -> Result<(Vec<String>, ExitStatus)> {
        drop(self.stdin.take());
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            if self.stdout.read_line(&mut line)? == 0 {
                break;
            }
            lines.push(line.trim_end().to_string());
        }
        Ok((lines, self.child.wait()?))
    }
}
