//! `fenced_execute`: the fenced write in one statement when the writer's
//! cached state is current, the locking path otherwise, and never a
//! decision the locking path would not make.

use anyhow::{Result, bail, ensure};
use fencecheck::{AuthFailure, GrantKey, Instance, Policy, Request, Token};
use fencecheck_postgres::{
    CacheStats, Error, Fenced, Rejection, StateCache, fenced_execute, fenced_write, install,
    set_keys, stored_state,
};
use fencecheck_tests::pgserver::PgServer;

const JULY: &str = "report/july";

// The catalog row and an audit row keyed by the accepted version, in one
// statement (the audit insert fails on a duplicate payload).
const PUBLISH: &str = "WITH catalog AS (
        INSERT INTO report_catalog VALUES ($1, $2) ON CONFLICT (report_id)
        DO UPDATE SET visible_object = EXCLUDED.visible_object)
    INSERT INTO audit VALUES ($1, (SELECT version FROM fencecheck_accepted), $2)";

fn guest() -> Result<Instance> {
    Ok(fencecheck_tests::runtime()?.instance()?)
}

fn request(counter: u64) -> Request {
    Request::new(JULY, Token::new(0, 1, counter), Policy::Strict)
}

fn setup(settings: &[&str]) -> Result<(PgServer, postgres::Client)> {
    let server = PgServer::start_with_settings(settings)?;
    let mut db = server.client()?;
    install(&mut db)?;
    db.batch_execute(
        "CREATE TABLE report_catalog (report_id text PRIMARY KEY, visible_object text NOT NULL);
         CREATE TABLE audit (scope text NOT NULL, version bigint NOT NULL,
                             payload text NOT NULL UNIQUE, PRIMARY KEY (scope, version));",
    )?;
    Ok((server, db))
}

fn publish(
    db: &mut postgres::Client,
    guest: &mut Instance,
    cache: &mut StateCache,
    counter: u64,
    payload: &str,
) -> Result<Fenced<u64>, Error> {
    fenced_execute(
        db,
        guest,
        cache,
        &request(counter),
        PUBLISH,
        &[&JULY, &payload],
    )
}

fn audit(db: &mut postgres::Client) -> Result<Vec<(i64, String)>> {
    Ok(db
        .query("SELECT version, payload FROM audit ORDER BY version", &[])?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// `outcome` applied and produced `version`.
fn applied(outcome: Fenced<u64>, version: u64) -> Result<()> {
    ensure!(
        matches!(outcome, Fenced::Applied { version: v, .. } if v == version),
        "expected version {version} applied, got {outcome:?}"
    );
    Ok(())
}

fn stats(one_round_trip: u64, stale: u64, uncached: u64) -> CacheStats {
    CacheStats {
        one_round_trip,
        stale,
        uncached,
    }
}

/// What the server logged between two markers: the statements a write sent.
fn sent_between(server: &PgServer, from: &str, to: &str) -> Result<Vec<String>> {
    let log = server.log();
    let (Some(a), Some(b)) = (log.find(from), log.rfind(to)) else {
        bail!("markers {from} / {to} not in the server log");
    };
    // Up to the line that holds the second marker.
    let b = log[..b].rfind('\n').unwrap_or(a);
    Ok(log[a..b]
        .lines()
        .skip(1)
        .filter(|l| l.contains("LOG:  execute") || l.contains("LOG:  statement:"))
        .map(str::to_owned)
        .collect())
}

/// The first write takes the locking path; the next goes to the server as
/// one statement (read off the server's statement log), stores what the
/// locking path would (version, audit row keyed by the accepted version),
/// and a stale token is refused with the stored highest, its statement
/// never run.
#[test]
fn a_current_cache_writes_in_one_statement() -> Result<()> {
    let (server, mut db) = setup(&["log_statement=all"])?;
    let mut guest = guest()?;
    let mut cache = StateCache::new();
    let first = publish(&mut db, &mut guest, &mut cache, 10, "a")?;
    ensure!(
        matches!(
            first,
            Fenced::Applied {
                version: 1,
                value: 1,
                ..
            }
        ),
        "{first:?}"
    );
    ensure!(cache.stats() == stats(0, 0, 1), "{:?}", cache.stats());
    db.batch_execute("SELECT 'marker-1'")?;
    let second = publish(&mut db, &mut guest, &mut cache, 11, "b")?;
    db.batch_execute("SELECT 'marker-2'")?;
    ensure!(
        matches!(
            second,
            Fenced::Applied {
                version: 2,
                value: 1,
                ..
            }
        ),
        "{second:?}"
    );
    ensure!(cache.stats() == stats(1, 0, 1), "{:?}", cache.stats());
    let sent = sent_between(&server, "marker-1", "marker-2")?;
    ensure!(
        sent.len() == 1 && sent[0].contains("fencecheck_cas"),
        "expected one statement, the server saw {sent:#?}"
    );
    ensure!(audit(&mut db)? == [(1, "a".into()), (2, "b".into())]);

    let stale = publish(&mut db, &mut guest, &mut cache, 9, "old")?;
    ensure!(
        stale
            == Fenced::Rejected(Rejection::StaleFence {
                presented: Token::new(0, 1, 9),
                highest: Token::new(0, 1, 11),
            }),
        "{stale:?}"
    );
    ensure!(audit(&mut db)?.len() == 2, "the stale statement ran");
    // The rejection went the locking way (a cached state never rejects on
    // its own), and the cache still serves the next write.
    applied(publish(&mut db, &mut guest, &mut cache, 12, "c")?, 3)?;
    ensure!(cache.stats() == stats(2, 0, 2), "{:?}", cache.stats());
    Ok(())
}

/// Another writer (the locking path, as another process would) moves the
/// state after this writer cached it: the cached decision is not kept, the
/// write goes the locking way, a token the other writer overtook is refused
/// with the stored highest and its statement never commits; newer ones
/// apply on top of the other writer's version, in one statement again.
#[test]
fn a_stale_cache_costs_a_round_trip_never_a_wrong_decision() -> Result<()> {
    let (server, mut db) = setup(&[])?;
    let mut guest = guest()?;
    let mut cache = StateCache::new();
    applied(publish(&mut db, &mut guest, &mut cache, 10, "mine-1")?, 1)?;
    let mut other = server.client()?;
    let theirs = fenced_write(&mut other, &mut guest, &request(20), |tx, accepted| {
        tx.execute(
            "INSERT INTO audit VALUES ($1, $2, 'theirs')",
            &[&JULY, &(accepted.version as i64)],
        )
    })?;
    ensure!(matches!(theirs, Fenced::Applied { version: 2, .. }));

    // The cache says 10 is the highest, so 15 would apply on it.
    let overtaken = publish(&mut db, &mut guest, &mut cache, 15, "mine-2")?;
    ensure!(
        overtaken
            == Fenced::Rejected(Rejection::StaleFence {
                presented: Token::new(0, 1, 15),
                highest: Token::new(0, 1, 20),
            }),
        "{overtaken:?}"
    );
    ensure!(cache.stats() == stats(0, 1, 1), "{:?}", cache.stats());
    ensure!(audit(&mut db)? == [(1, "mine-1".into()), (2, "theirs".into())]);

    // The locking path's read refreshed the cache: the next writes go in
    // one statement again, on top of the other writer's version.
    applied(publish(&mut db, &mut guest, &mut cache, 21, "mine-3")?, 3)?;
    applied(publish(&mut db, &mut guest, &mut cache, 22, "mine-4")?, 4)?;
    ensure!(cache.stats() == stats(2, 1, 1), "{:?}", cache.stats());
    Ok(())
}

/// Signing keys set after the scope was cached: the one statement sees
/// them (its compare requires no key prefix), so the unsigned write is
/// refused `unauthenticated` by the locking path and nothing is written.
#[test]
fn keys_set_after_caching_are_honoured() -> Result<()> {
    let (_server, mut db) = setup(&[])?;
    let mut guest = guest()?;
    let mut cache = StateCache::new();
    applied(publish(&mut db, &mut guest, &mut cache, 10, "a")?, 1)?;
    set_keys(
        &mut db,
        "report/",
        &[GrantKey {
            key_id: 1,
            secret: vec![7; 32],
        }],
    )?;
    let unsigned = publish(&mut db, &mut guest, &mut cache, 11, "b")?;
    ensure!(
        matches!(
            unsigned,
            Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::Unsigned))
        ),
        "{unsigned:?}"
    );
    ensure!(cache.stats().stale == 1, "{:?}", cache.stats());
    ensure!(audit(&mut db)?.len() == 1);
    Ok(())
}

/// The statement's own failure (a duplicate audit payload) rolls the fence's
/// write back with it: state and version unchanged, and the failure is the
/// mutation's, confirmed by the locking path (not a stale answer).
#[test]
fn the_statements_failure_stores_nothing() -> Result<()> {
    let (_server, mut db) = setup(&[])?;
    let mut guest = guest()?;
    let mut cache = StateCache::new();
    applied(publish(&mut db, &mut guest, &mut cache, 10, "a")?, 1)?;
    let before = stored_state(&mut db, JULY)?;
    match publish(&mut db, &mut guest, &mut cache, 11, "a") {
        Err(Error::Mutation(e))
            if e.downcast_ref::<postgres::Error>()
                .and_then(postgres::Error::code)
                == Some(&postgres::error::SqlState::UNIQUE_VIOLATION) => {}
        other => bail!("expected the unique violation, got {other:?}"),
    }
    ensure!(stored_state(&mut db, JULY)? == before, "the state moved");
    ensure!(cache.stats() == stats(0, 1, 1), "{:?}", cache.stats());
    applied(publish(&mut db, &mut guest, &mut cache, 11, "b")?, 2)?;
    applied(publish(&mut db, &mut guest, &mut cache, 12, "c")?, 3)?;
    ensure!(cache.stats() == stats(1, 1, 2), "{:?}", cache.stats());
    Ok(())
}

/// A statement that uses more parameters than given (its `$3` would be one
/// of the fence's) or fewer is refused before any decision: nothing stored.
#[test]
fn parameters_must_match_the_statement() -> Result<()> {
    let (_server, mut db) = setup(&[])?;
    let mut guest = guest()?;
    let mut cache = StateCache::new();
    for (sql, given) in [
        ("INSERT INTO audit VALUES ($1, $3, $2)", 2usize),
        ("INSERT INTO audit VALUES ($1, 1, 'x')", 2),
    ] {
        let params: Vec<&(dyn postgres::types::ToSql + Sync)> =
            [&JULY as &(dyn postgres::types::ToSql + Sync), &"p"][..given].to_vec();
        match fenced_execute(&mut db, &mut guest, &mut cache, &request(10), sql, &params) {
            Err(Error::Invalid { .. } | Error::Postgres { .. }) => {}
            other => bail!("{sql}: expected a refusal, got {other:?}"),
        }
    }
    ensure!(stored_state(&mut db, JULY)?.is_none());
    ensure!(audit(&mut db)?.is_empty());
    Ok(())
}

/// The backend dies while the one statement's commit is in flight (a
/// deferred trigger holds it at `pg_sleep`; the test kills the backend):
/// `CommitUnknown` (the statement is its own commit), not a stale or
/// retryable result.
#[test]
fn a_connection_lost_during_the_commit_is_commit_unknown() -> Result<()> {
    let (server, mut db) = setup(&[])?;
    let mut guest = guest()?;
    let mut cache = StateCache::new();
    // The first write caches the state; the second goes in one statement.
    applied(publish(&mut db, &mut guest, &mut cache, 10, "a")?, 1)?;
    server.client()?.batch_execute(
        "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON audit
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
    )?;
    let pid: i32 = db.query_one("SELECT pg_backend_pid()", &[])?.get(0);
    let writer = std::thread::spawn(move || {
        let outcome = publish(&mut db, &mut guest, &mut cache, 11, "b");
        (outcome, cache.stats())
    });
    let mut watch = server.client()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while watch
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'PgSleep'",
            &[&pid],
        )?
        .get::<_, i64>(0)
        == 0
    {
        ensure!(
            std::time::Instant::now() < deadline,
            "the commit never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()?;
    ensure!(killed.success(), "kill -9 {pid} failed");
    let (outcome, stats) = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer panicked"))?;
    match outcome {
        Err(e @ Error::CommitUnknown(_)) => ensure!(!e.is_retryable()),
        other => bail!("expected CommitUnknown, got {other:?}"),
    }
    ensure!(stats.uncached == 1 && stats.stale == 0, "{stats:?}");
    Ok(())
}
