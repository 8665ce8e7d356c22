//! `fencecheck-sqlite-worker`: a real, separate process for the adapter's
//! crash and concurrency tests (it can be killed with SIGKILL at a known
//! point, and many can publish to one WAL file at once).
//!
//! ```text
//! fencecheck-sqlite-worker DB NOW_MS stage-then-wait SCOPE NAME
//!     stage an object, print `staged ID`, then read one stdin line:
//!     `publish TOKEN` publishes it and prints the outcome; end of input exits.
//! fencecheck-sqlite-worker DB NOW_MS hold-in-transaction SCOPE TOKEN
//!     a fenced write whose mutation inserts into `worker_audit`, prints
//!     `in-transaction` and waits for a stdin line before the commit.
//! fencecheck-sqlite-worker DB NOW_MS race PROCESS PROCESSES ROUNDS SCOPE...
//!     wait for `go`, then per round and scope publish a fresh token
//!     (counter 1 + round*PROCESSES + PROCESS) and replay the previous one;
//!     print one tab-separated `attempt` record per publish.
//! fencecheck-sqlite-worker DB NOW_MS install
//!     install the layout; print `installed`, or `unsupported-layout` and
//!     exit 1 (the message on stderr).
//! fencecheck-sqlite-worker DB NOW_MS write SCOPE TOKEN [strict|allow-equal]
//!     a fenced write whose mutation inserts into `worker_audit`; print the
//!     outcome name (`applied`, `stale-fence`, `unauthenticated`…). TOKEN may
//!     be signed text (`…~KEY-ID~LEASE~TAG`): a scope with keys requires it.
//! ```
//!
//! Tokens use the canonical text form (`EPOCH.COUNTER`). Except for
//! `install`, the database must already have the adapter's tables (and
//! `worker_audit (scope, token, version)` for `hold-in-transaction` and
//! `write`). `install` and `write` are the Rust side of the cross-host test
//! (tests/cross_host/), whose Python and Node drivers take the same commands.

use std::error::Error;
use std::io::{BufRead, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencecheck::{Instance, Policy, Request, Runtime, SignedTokenText, Token, TokenText};
use fencecheck_sqlite::{Fenced, ObjectId, fenced_write, install, publish, stage, visible};
use rusqlite::Connection;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencecheck-sqlite-worker: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn open(path: &str) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Generous: contention is the point of the race; a busy error would be
    // reported as an infrastructure failure, never as an outcome.
    conn.busy_timeout(Duration::from_secs(60))?;
    Ok(conn)
}

fn token(text: &str) -> Result<Token> {
    Ok(text.parse::<TokenText>()?.0)
}

fn say(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

fn read_line() -> Result<Option<String>> {
    let mut line = String::new();
    let n = std::io::stdin().lock().read_line(&mut line)?;
    Ok((n > 0).then(|| line.trim_end().to_string()))
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [db, now_ms, command, rest @ ..] = args.as_slice() else {
        return Err("usage: fencecheck-sqlite-worker DB NOW_MS COMMAND ARGS…".into());
    };
    let now = UNIX_EPOCH + Duration::from_millis(now_ms.parse()?);
    let mut conn = open(db)?;
    if command == "install" {
        return match rest {
            [] => install_layout(&conn),
            _ => Err(format!("install takes no arguments, got {rest:?}").into()),
        };
    }
    let mut guest = Runtime::new()?.instance()?;
    match (command.as_str(), rest) {
        ("stage-then-wait", [scope, name]) => {
            stage_then_wait(&mut conn, &mut guest, now, scope, name)
        }
        ("hold-in-transaction", [scope, text]) => hold(&mut conn, &mut guest, scope, token(text)?),
        ("write", [scope, text]) => write(&mut conn, &mut guest, scope, text.parse()?, "strict"),
        ("write", [scope, text, policy]) => {
            write(&mut conn, &mut guest, scope, text.parse()?, policy)
        }
        ("race", [process, processes, rounds, scopes @ ..]) if !scopes.is_empty() => race(
            &mut conn,
            &mut guest,
            now,
            process.parse()?,
            processes.parse()?,
            rounds.parse()?,
            scopes,
        ),
        _ => Err(format!("unknown command or arguments: {command} {rest:?}").into()),
    }
}

fn stage_then_wait(
    conn: &mut Connection,
    guest: &mut Instance,
    now: SystemTime,
    scope: &str,
    name: &str,
) -> Result<()> {
    let object = stage(conn, scope, name, format!("body of {name}").as_bytes(), now)?;
    say(&format!("staged {}", object.get()))?;
    // The test kills us here (SIGKILL), or tells us to go on.
    let Some(line) = read_line()? else {
        return Ok(());
    };
    let Some(text) = line.strip_prefix("publish ") else {
        return Err(format!("expected `publish TOKEN`, got {line:?}").into());
    };
    let request = Request::new(scope, token(text)?, Policy::Strict);
    let outcome = publish(conn, guest, &request, object, now)?;
    say(outcome.name())
}

fn hold(conn: &mut Connection, guest: &mut Instance, scope: &str, token: Token) -> Result<()> {
    let request = Request::new(scope, token, Policy::Strict);
    let outcome = fenced_write(conn, guest, &request, |tx, accepted| -> Result<()> {
        tx.execute(
            "INSERT INTO worker_audit (scope, token, version) VALUES (?1, ?2, ?3)",
            rusqlite::params![
                scope,
                TokenText(accepted.highest).to_string(),
                i64::try_from(accepted.version)?
            ],
        )?;
        say("in-transaction")?;
        // The test kills us here, inside the open write transaction.
        read_line()?;
        Ok(())
    })?;
    say(outcome.name())
}

fn install_layout(conn: &Connection) -> Result<()> {
    match install(conn) {
        Ok(()) => say("installed"),
        Err(e @ fencecheck_sqlite::Error::UnsupportedLayout { .. }) => {
            say("unsupported-layout")?;
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

/// `presented`: the token as a client presents it, signed or not (a scope
/// with signing keys in the database requires the signature).
fn write(
    conn: &mut Connection,
    guest: &mut Instance,
    scope: &str,
    presented: SignedTokenText,
    policy: &str,
) -> Result<()> {
    let token = presented.token;
    let policy = match policy {
        "strict" => Policy::Strict,
        "allow-equal" => Policy::AllowEqual,
        _ => return Err(format!("unknown policy {policy:?}").into()),
    };
    let mut request = Request::new(scope, token, policy);
    request.signature = presented.signature;
    let outcome = fenced_write(conn, guest, &request, |tx, accepted| -> Result<()> {
        tx.execute(
            "INSERT INTO worker_audit (scope, token, version) VALUES (?1, ?2, ?3)",
            rusqlite::params![
                scope,
                TokenText(token).to_string(),
                i64::try_from(accepted.version)?
            ],
        )?;
        Ok(())
    })?;
    say(outcome.name())
}

/// What this process saw of a scope's catalog: (version, object), or zeros.
fn look(conn: &Connection, scope: &str) -> Result<(u64, i64)> {
    Ok(visible(conn, scope)?.map_or((0, 0), |v| (v.version, v.object.get())))
}

#[allow(clippy::too_many_arguments)]
fn attempt(
    conn: &mut Connection,
    guest: &mut Instance,
    now: SystemTime,
    process: u64,
    seq: &mut u64,
    scope: &str,
    token: Token,
) -> Result<()> {
    let before = look(conn, scope)?;
    let object: ObjectId = stage(conn, scope, &format!("p{process}-{seq}"), b"x", now)?;
    let request = Request::new(scope, token, Policy::Strict);
    let outcome = publish(conn, guest, &request, object, now)?;
    let version = match &outcome {
        Fenced::Applied { version, .. } => version.to_string(),
        Fenced::Rejected(_) => "-".into(),
    };
    let after = look(conn, scope)?;
    say(&format!(
        "attempt\t{process}\t{seq}\t{scope}\t{}\t{}\t{}\t{}\t{}\t{version}\t{}\t{}",
        TokenText(token),
        object.get(),
        before.0,
        before.1,
        outcome.name(),
        after.0,
        after.1
    ))?;
    *seq += 1;
    Ok(())
}

fn race(
    conn: &mut Connection,
    guest: &mut Instance,
    now: SystemTime,
    process: u64,
    processes: u64,
    rounds: u64,
    scopes: &[String],
) -> Result<()> {
    say("ready")?;
    // Start barrier: every process is loaded before any publishes.
    if read_line()?.as_deref() != Some("go") {
        return Err("expected `go` on stdin".into());
    }
    let mut seq = 0;
    for round in 0..rounds {
        for scope in scopes {
            let fresh = Token::new(0, 0, 1 + round * processes + process);
            attempt(conn, guest, now, process, &mut seq, scope, fresh)?;
            // A replay of the same grant: stale whether or not it applied.
            attempt(conn, guest, now, process, &mut seq, scope, fresh)?;
            if round > 0 {
                // An older grant of ours, delivered late.
                let old = Token::new(0, 0, 1 + (round - 1) * processes + process);
                attempt(conn, guest, now, process, &mut seq, scope, old)?;
            }
        }
    }
    say("done")
}
