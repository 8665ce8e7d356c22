//! `fencecheck-upgrade-worker`: one process of a rolling upgrade, writing
//! through fencecheck-sqlite's fenced write with a given component, for
//! `tests/upgrade.rs` (two processes, 0.1.0 and this tree, on one database).
//!
//! ```text
//! fencecheck-upgrade-worker DB CLIENT ATTEMPTS [--component PATH] [--component-api] SCOPE...
//! ```
//!
//! Loads PATH (default: the component built into this binary), prints
//! `ready`, waits for `go` on stdin, then makes ATTEMPTS fenced writes
//! round-robin over the scopes. Tokens come from the database's shared
//! sequence (`upgrade_seq`, one autocommit `UPDATE … RETURNING` per draw),
//! so the processes' tokens interleave; every fifth attempt draws a token
//! and holds it for three attempts (a paused writer), every seventh
//! replays the previous token. An applied write inserts its payload into
//! `upgrade_audit` and sets `upgrade_value`, in the fenced transaction.
//! Per attempt one line:
//! `attempt TAB client TAB scope TAB token TAB payload TAB state-before-hex-or-- TAB outcome-debug`.
//! The database must have the adapter's tables and the test's three.

use std::error::Error;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

use fencecheck::{
    Acquire, AcquireRequest, CheckError, Checker, GrantKey, GrantSignature, Instance, LeaseError,
    LeaseInfo, Limits, Outcome, Policy, Release, ReleaseRequest, Renew, RenewRequest, Request,
    Runtime, SignError, SignedOutcome, StateInfo, Token, TokenText,
};
use fencecheck_sqlite::fenced_write;
use rusqlite::Connection;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencecheck-upgrade-worker: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Records the state the fenced write read and what the component decided
/// on it, so the test can re-decide exactly that with the other version.
struct Recorder<'a> {
    inner: &'a mut Instance,
    seen: Option<(Option<Vec<u8>>, Outcome)>,
}

impl Checker for Recorder<'_> {
    fn check(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
    ) -> std::result::Result<Outcome, fencecheck::Error> {
        let outcome = self.inner.check(state, request)?;
        self.seen = Some((state.map(<[u8]>::to_vec), outcome.clone()));
        Ok(outcome)
    }

    fn check_batch(
        &mut self,
        items: &[(Option<&[u8]>, &Request)],
    ) -> std::result::Result<Vec<Outcome>, fencecheck::Error> {
        self.inner.check_batch(items)
    }

    fn inspect(
        &mut self,
        state: &[u8],
    ) -> std::result::Result<std::result::Result<StateInfo, CheckError>, fencecheck::Error> {
        self.inner.inspect(state)
    }

    // The workers' scopes require no signatures (the 0.1.0 component has
    // none): their writes all go through `check`, recorded above.
    fn check_signed(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: &[GrantKey],
    ) -> std::result::Result<SignedOutcome, fencecheck::Error> {
        self.inner.check_signed(state, request, keys)
    }

    fn sign(
        &mut self,
        scope: &str,
        token: Token,
        lease_id: &str,
        key: &GrantKey,
    ) -> std::result::Result<std::result::Result<GrantSignature, SignError>, fencecheck::Error>
    {
        self.inner.sign(scope, token, lease_id, key)
    }

    fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> std::result::Result<std::result::Result<Acquire, LeaseError>, fencecheck::Error> {
        self.inner.acquire(state, request)
    }

    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> std::result::Result<std::result::Result<Renew, LeaseError>, fencecheck::Error> {
        self.inner.renew(state, request)
    }

    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> std::result::Result<std::result::Result<Release, LeaseError>, fencecheck::Error> {
        self.inner.release(state, request)
    }

    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> std::result::Result<std::result::Result<(u64, Vec<u8>), LeaseError>, fencecheck::Error>
    {
        self.inner.restore(state)
    }

    fn inspect_lease(
        &mut self,
        state: &[u8],
    ) -> std::result::Result<std::result::Result<LeaseInfo, LeaseError>, fencecheck::Error> {
        self.inner.inspect_lease(state)
    }

    fn runtime_name(&self) -> &'static str {
        "wasm"
    }
}

fn say(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [db, client, attempts, rest @ ..] = args.as_slice() else {
        return Err("usage: fencecheck-upgrade-worker DB CLIENT ATTEMPTS [--component PATH] [--component-api] SCOPE...".into());
    };
    let client: u64 = client.parse()?;
    let attempts: u64 = attempts.parse()?;
    let mut component: Option<PathBuf> = None;
    let mut component_api = false;
    let mut scopes = Vec::new();
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--component" => {
                component = Some(rest.next().ok_or("--component needs a path")?.into());
            }
            "--component-api" => component_api = true,
            scope => scopes.push(scope.to_string()),
        }
    }
    if scopes.is_empty() {
        return Err("no scopes".into());
    }
    let runtime = match &component {
        Some(path) => Runtime::from_file(path, Limits::default())?,
        None => Runtime::new()?,
    };
    let runtime = if component_api {
        runtime.with_component_transport()
    } else {
        runtime
    };
    let mut guest = runtime.instance()?;
    let mut conn = Connection::open(db)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Contention is the point; a busy error would end the run as a failure,
    // never be taken for an outcome.
    conn.busy_timeout(Duration::from_secs(60))?;

    say("ready")?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    if line.trim_end() != "go" {
        return Err(format!("expected `go` on stdin, got {line:?}").into());
    }

    let mut previous: Option<Token> = None;
    let mut held: Option<Token> = None;
    for i in 0..attempts {
        let scope = &scopes[(i % scopes.len() as u64) as usize];
        let token = match i % 7 {
            6 if previous.is_some() => previous.unwrap_or_default(),
            _ if i % 5 == 3 && held.is_some() => held.take().unwrap_or_default(),
            _ => {
                let drawn = draw(&conn)?;
                if i % 5 == 0 {
                    // Hold this grant and deliver it three attempts later.
                    held = Some(drawn);
                    draw(&conn)?
                } else {
                    drawn
                }
            }
        };
        previous = Some(token);
        let payload = format!("c{client}-{i}");
        let request = Request::new(scope.as_str(), token, Policy::Strict);
        let mut recorder = Recorder {
            inner: &mut guest,
            seen: None,
        };
        let _outcome = fenced_write(&mut conn, &mut recorder, &request, |tx, accepted| {
            let version = i64::try_from(accepted.version).unwrap_or(i64::MAX);
            tx.execute(
                "INSERT INTO upgrade_audit (scope, version, token, payload) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![scope, version, TokenText(token).to_string(), payload],
            )?;
            tx.execute(
                "INSERT OR REPLACE INTO upgrade_value (scope, version, payload) VALUES (?1, ?2, ?3)",
                rusqlite::params![scope, version, payload],
            )
        })?;
        let (state, outcome) = recorder.seen.ok_or("the fenced write did not check")?;
        say(&format!(
            "attempt\t{client}\t{scope}\t{}\t{payload}\t{}\t{outcome:?}",
            TokenText(token),
            state.as_deref().map_or_else(|| "-".to_string(), hex),
        ))?;
    }
    say("done")
}

/// The next token of the shared sequence (its own autocommit statement).
fn draw(conn: &Connection) -> Result<Token> {
    let counter: i64 = conn.query_row(
        "UPDATE upgrade_seq SET next = next + 1 RETURNING next",
        [],
        |r| r.get(0),
    )?;
    Ok(Token::new(0, 0, u64::try_from(counter)?))
}
