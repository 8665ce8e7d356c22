//! `fencecheck demo`: the seed's paused report writer, end to end.
//!
//! Two real threads, each with its own SQLite connection and its own component
//! instance, publish to one `report_catalog` row. Channels (not sleeps) pause
//! writer A after staging, so the interleaving is the same on every run:
//!
//! 1. A acquires report/july (lease a7, token 41) and stages its object;
//! 2. A pauses; its lease expires on the lock service's clock;
//! 3. B acquires (lease b9, token 42), stages and publishes;
//! 4. A resumes and tries to publish with token 41: `stale-fence`;
//! 5. A discards its staged object; B's object stays visible.
//!
//! The lock service here is a stand-in with a manual clock, enough to hand out
//! ordered tokens; the fence check at the catalog is the real thing, through
//! the SQLite adapter (`fencecheck-sqlite`): immutable staged objects and a
//! fenced catalog pointer.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use fencecheck::{Decision, Instance, Outcome, Policy, Request, Runtime, Token, TokenText};
use fencecheck_sqlite::{Fenced, ObjectId, Rejection};
use rusqlite::Connection;

const REPORT: &str = "report/july";

/// The fenced publish: `fencecheck_sqlite::publish` reads the fence state,
/// checks, and only on `applied` moves the catalog pointer to `object` and
/// stores the new state, all in one `BEGIN IMMEDIATE` transaction. Anything
/// else rolls back and changes nothing.
pub fn publish(
    conn: &mut Connection,
    guest: &mut Instance,
    report_id: &str,
    object: ObjectId,
    token: Token,
    now_s: u64,
) -> Result<Fenced<()>> {
    let request = Request::new(report_id, token, Policy::Strict);
    fencecheck_sqlite::publish(conn, guest, &request, object, at(now_s))
        .context("the fenced publish could not run")
}

/// A time on the demo's clock.
fn at(now_s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(now_s)
}

fn stage(conn: &Connection, key: &str, body: &str, now_s: u64) -> Result<ObjectId> {
    Ok(fencecheck_sqlite::stage(
        conn,
        REPORT,
        key,
        body.as_bytes(),
        at(now_s),
    )?)
}

/// A stand-in lock service: one lock, a manual clock, ordered tokens.
struct LockService {
    now_s: u64,
    next_counter: u64,
    holder: Option<(String, u64)>, // (lease id, expires at)
}

impl LockService {
    fn acquire(&mut self, lease_id: &str, ttl_s: u64) -> Result<Token> {
        if let Some((holder, expires)) = &self.holder
            && *expires > self.now_s
        {
            bail!("lock busy: held by {holder} until t={expires}s");
        }
        let token = Token::new(0, 0, self.next_counter);
        self.next_counter += 1;
        self.holder = Some((lease_id.into(), self.now_s + ttl_s));
        Ok(token)
    }
}

enum Say {
    Line(&'static str, String),
}

fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

/// Run the demo; the exit code says whether the fence held.
pub fn run(runtime: &Runtime, db: Option<&Path>) -> Result<ExitCode> {
    let temp = db.is_none().then(|| {
        std::env::temp_dir().join(format!("fencecheck-demo-{}.sqlite", std::process::id()))
    });
    let path: PathBuf = match (db, &temp) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(t)) => t.clone(),
        (None, None) => bail!("no database path"),
    };
    let result = run_at(runtime, &path);
    if let Some(t) = temp {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", t.display()));
        }
    }
    result
}

fn run_at(runtime: &Runtime, path: &Path) -> Result<ExitCode> {
    let say = |who: &str, what: &str| println!("  {who:<13} {what}");
    println!("fencecheck demo: a paused report writer meets a fenced catalog");
    println!("database: {} (SQLite, WAL)\n", path.display());
    fencecheck_sqlite::install(&open(path)?)?;

    let mut locks = LockService {
        now_s: 0,
        next_counter: 41,
        holder: None,
    };
    let t = |s: &LockService| format!("t={:>2}s", s.now_s);

    // Writer A runs on its own thread with its own connection and instance.
    // Messages to A: its token and the lock service's time.
    let (to_a, a_inbox) = mpsc::channel::<(Token, u64)>();
    let (a_says, from_a) = mpsc::channel::<Say>();
    let a_runtime = runtime.clone();
    let a_path = path.to_path_buf();
    let writer_a = thread::spawn(move || -> Result<Fenced<()>> {
        let mut conn = open(&a_path)?;
        let mut guest = a_runtime.instance()?;
        let (token, now_s) = a_inbox.recv()?;
        let object = stage(
            &conn,
            "reports/july/a7.tmp",
            "July report rendered by A",
            now_s,
        )?;
        a_says.send(Say::Line(
            "writer A",
            "staged reports/july/a7.tmp; now pausing (GC, VM suspend…)".into(),
        ))?;
        // Paused until the main thread lets it go: the deterministic stand-in
        // for a stop-the-world pause longer than the lease.
        let (_, now_s) = a_inbox.recv()?;
        let outcome = publish(&mut conn, &mut guest, REPORT, object, token, now_s)?;
        if !outcome.is_applied() {
            // Unique key, never published: safe for its owner to discard
            // (`discard` refuses if anything references it).
            fencecheck_sqlite::discard(&conn, object)?;
        }
        Ok(outcome)
    });

    let token_a = locks.acquire("a7", 30)?;
    say(
        &t(&locks),
        &format!(
            "lock service: A acquires {REPORT} (lease a7, token {}, ttl 30s)",
            TokenText(token_a)
        ),
    );
    to_a.send((token_a, locks.now_s))?;
    let Say::Line(who, what) = from_a.recv()?;
    say(&t(&locks), &format!("{who}: {what}"));

    locks.now_s = 31;
    say(
        &t(&locks),
        "lock service: A sent no renewal; its lease expired at t=30s",
    );
    let token_b = locks.acquire("b9", 30)?;
    say(
        &t(&locks),
        &format!(
            "lock service: B acquires {REPORT} (lease b9, token {})",
            TokenText(token_b)
        ),
    );

    let mut conn = open(path)?;
    let mut guest = runtime.instance()?;
    let object_b = stage(
        &conn,
        "reports/july/b9.tmp",
        "Corrected July report rendered by B",
        locks.now_s,
    )?;
    say(&t(&locks), "writer B: staged reports/july/b9.tmp");
    let b_outcome = publish(
        &mut conn,
        &mut guest,
        REPORT,
        object_b,
        token_b,
        locks.now_s,
    )?;
    say(
        &t(&locks),
        &format!(
            "catalog: B publishes with token {} -> {}",
            TokenText(token_b),
            outcome_text(&b_outcome)
        ),
    );

    locks.now_s = 45;
    say(
        &t(&locks),
        "writer A: resumes, still believing it holds the lock",
    );
    to_a.send((token_a, locks.now_s))?;
    let a_outcome = writer_a
        .join()
        .map_err(|_| anyhow::anyhow!("writer A panicked"))??;
    say(
        &t(&locks),
        &format!(
            "catalog: A publishes with token {} -> {}",
            TokenText(token_a),
            outcome_text(&a_outcome)
        ),
    );
    if matches!(a_outcome, Fenced::Rejected(Rejection::StaleFence { .. })) {
        say(
            &t(&locks),
            "writer A: stale-fence is definitive; discarded reports/july/a7.tmp, no retry",
        );
    }

    let visible = fencecheck_sqlite::visible(&conn, REPORT)?
        .map(|v| v.name)
        .unwrap_or_default();
    let state = fencecheck_sqlite::stored_state(&conn, REPORT)?.unwrap_or_default();
    let staged: Vec<String> = conn
        .prepare("SELECT name FROM fencecheck_objects ORDER BY name")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let info = guest.inspect(&state)?;
    println!("\nafter the race:");
    println!("  visible object : {visible}");
    println!("  stored objects : {}", staged.join(", "));
    match &info {
        Ok(i) => println!(
            "  fence state    : scope {}, highest {}, version {} ({} bytes)",
            i.scope,
            TokenText(i.highest),
            i.version,
            state.len()
        ),
        Err(e) => println!("  fence state    : unreadable ({})", e.name()),
    }

    let held = b_outcome.is_applied()
        && matches!(a_outcome, Fenced::Rejected(Rejection::StaleFence { .. }))
        && visible == "reports/july/b9.tmp"
        && staged == ["reports/july/b9.tmp"];
    if held {
        println!("\nThe fence held: B's report stays visible; A's late write was rejected.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nTHE FENCE DID NOT HOLD: the stale writer changed the catalog.");
        Ok(ExitCode::FAILURE)
    }
}

fn outcome_text(outcome: &Fenced<()>) -> String {
    let outcome: Outcome = match outcome {
        Fenced::Applied { version, .. } => return format!("applied (catalog version {version})"),
        Fenced::Rejected(Rejection::StaleFence { presented, highest }) => {
            return format!(
                "stale-fence ({} < highest accepted {})",
                TokenText(*presented),
                TokenText(*highest)
            );
        }
        Fenced::Rejected(Rejection::Duplicate { version }) => {
            Ok(Decision::Duplicate { version: *version })
        }
        Fenced::Rejected(Rejection::VersionConflict { expected, actual }) => {
            Ok(Decision::VersionConflict {
                expected: *expected,
                actual: *actual,
            })
        }
        Fenced::Rejected(Rejection::Refused(e)) => Err(e.clone()),
        Fenced::Rejected(Rejection::Unauthenticated(failure)) => {
            return format!("unauthenticated ({failure})");
        }
        Fenced::Rejected(Rejection::InvalidKeys(problem)) => {
            return format!("invalid-keys ({problem})");
        }
    };
    fencecheck::vectors::describe(&outcome)
}
