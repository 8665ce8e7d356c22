//! The publish protocol on a real PostgreSQL server: staging, fenced
//! publication, discard and the garbage collector, with time passed in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail, ensure};
use fencecheck::{Instance, Policy, Request, Token};
use fencecheck_postgres::{
    Error, Fenced, ObjectId, Rejection, collect_garbage, discard, fenced_write, install, publish,
    stage, visible,
};
use fencecheck_tests::pgserver::{PgServer, wait_for_lock_waiter};
use postgres::Client;

const JULY: &str = "report/july";
const RETENTION: Duration = Duration::from_secs(600);

fn guest() -> Result<Instance> {
    Ok(fencecheck_tests::runtime()?.instance()?)
}

fn tok(counter: u64) -> Token {
    Token::new(0, 0, counter)
}

fn strict(scope: &str, counter: u64) -> Request {
    Request::new(scope, tok(counter), Policy::Strict)
}

fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn setup() -> Result<(PgServer, Client)> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    install(&mut db)?;
    Ok((server, db))
}

/// Publish `object` to July with token `0.counter` at `ms`; the inner result
/// is the adapter's own.
fn try_publish(
    db: &mut Client,
    counter: u64,
    object: ObjectId,
    ms: u64,
) -> Result<Result<Fenced<()>, Error>> {
    let mut guest = guest()?;
    Ok(publish(
        db,
        &mut guest,
        &strict(JULY, counter),
        object,
        at_ms(ms),
    ))
}

fn publish_at(db: &mut Client, counter: u64, object: ObjectId, ms: u64) -> Result<Fenced<()>> {
    Ok(try_publish(db, counter, object, ms)??)
}

fn object_ids(db: &mut Client) -> Result<Vec<ObjectId>> {
    Ok(db
        .query("SELECT id FROM fencecheck_objects ORDER BY id", &[])?
        .iter()
        .map(|r| ObjectId::from_raw(r.get(0)))
        .collect())
}

/// Every scope row, in full.
fn scopes(db: &mut Client) -> Result<Vec<String>> {
    Ok(db
        .query(
            "SELECT scope, fence_state, version, visible_object, published_at_ms
               FROM fencecheck_scopes ORDER BY scope",
            &[],
        )?
        .iter()
        .map(|r| {
            format!(
                "{:?}",
                (
                    r.get::<_, String>(0),
                    r.get::<_, Vec<u8>>(1),
                    r.get::<_, i64>(2),
                    r.get::<_, Option<i64>>(3),
                    r.get::<_, Option<i64>>(4),
                )
            )
        })
        .collect())
}

/// Catalog pointers whose object does not exist (must always be zero).
fn dangling(db: &mut Client) -> Result<i64> {
    Ok(db
        .query_one(
            "SELECT count(*) FROM fencecheck_scopes s
              WHERE s.visible_object IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM fencecheck_objects o
                                 WHERE o.id = s.visible_object)",
            &[],
        )?
        .get(0))
}

/// The seed's paused writer: B (0.42) publishes, A's late 0.41 is refused as
/// stale-fence, B's object stays visible (A's never becomes visible), and A
/// may discard its own unpublished object.
#[test]
fn paused_writer_is_fenced_at_the_catalog() -> Result<()> {
    let (_server, mut db) = setup()?;
    let a = stage(
        &mut db,
        JULY,
        "reports/july/a7.tmp",
        b"A's render",
        at_ms(1_000),
    )?;
    let b = stage(
        &mut db,
        JULY,
        "reports/july/b9.tmp",
        b"B's render",
        at_ms(31_000),
    )?;
    ensure!(publish_at(&mut db, 42, b, 32_000)?.is_applied());
    let late = publish_at(&mut db, 41, a, 45_000)?;
    ensure!(
        late == Fenced::Rejected(Rejection::StaleFence {
            presented: tok(41),
            highest: tok(42)
        }),
        "{late:?}"
    );
    let shown = visible(&mut db, JULY)?.ok_or_else(|| anyhow!("nothing visible"))?;
    ensure!(
        shown.object == b && shown.name == "reports/july/b9.tmp" && shown.body == b"B's render",
        "{shown:?}"
    );
    ensure!(shown.version == 1 && shown.published_at == at_ms(32_000));
    ensure!(!discard(&mut db, b)?, "discard removed the visible object");
    ensure!(discard(&mut db, a)?, "A's unpublished object was kept");
    ensure!(object_ids(&mut db)? == [b]);
    Ok(())
}

/// The first publish of a scope (no row yet) creates its row with the
/// pointer; an empty body (bytes kept elsewhere) is fine; a later publish
/// replaces the pointer and leaves the old object in place.
#[test]
fn first_publish_creates_the_scope() -> Result<()> {
    let (_server, mut db) = setup()?;
    ensure!(visible(&mut db, JULY)?.is_none());
    let first = stage(&mut db, JULY, "blob/1", b"", at_ms(5))?;
    let outcome = publish_at(&mut db, 7, first, 10)?;
    ensure!(
        matches!(outcome, Fenced::Applied { version: 1, highest, .. } if highest == tok(7)),
        "{outcome:?}"
    );
    let shown = visible(&mut db, JULY)?.ok_or_else(|| anyhow!("nothing visible"))?;
    ensure!(shown.object == first && shown.body.is_empty() && shown.name == "blob/1");
    ensure!(shown.version == 1 && shown.published_at == at_ms(10));
    let second = stage(&mut db, JULY, "blob/2", b"", at_ms(20))?;
    ensure!(matches!(
        publish_at(&mut db, 8, second, 30)?,
        Fenced::Applied { version: 2, .. }
    ));
    ensure!(visible(&mut db, JULY)?.map(|v| v.object) == Some(second));
    ensure!(
        object_ids(&mut db)? == [first, second],
        "the publisher deleted"
    );
    Ok(())
}

/// Publishing an object that was never staged, or staged for another scope,
/// is UnknownObject and changes nothing: not the pointer, not the fence
/// state (the token is not used up), not even a first scope row.
#[test]
fn publish_refuses_unknown_and_foreign_objects() -> Result<()> {
    let (_server, mut db) = setup()?;
    let foreign = stage(&mut db, "report/august", "theirs", b"2", at_ms(0))?;
    // First publish of July with an unknown object: no row is created.
    match try_publish(&mut db, 1, foreign, 0)? {
        Err(Error::UnknownObject { object, scope }) if object == foreign && scope == JULY => {}
        other => bail!("expected UnknownObject, got {other:?}"),
    }
    ensure!(scopes(&mut db)?.is_empty());

    let mine = stage(&mut db, JULY, "mine", b"1", at_ms(0))?;
    ensure!(publish_at(&mut db, 1, mine, 0)?.is_applied());
    let before = scopes(&mut db)?;
    for object in [foreign, ObjectId::from_raw(9_999)] {
        match try_publish(&mut db, 2, object, 1)? {
            Err(Error::UnknownObject { object: o, .. }) if o == object => {}
            other => bail!("{object}: expected UnknownObject, got {other:?}"),
        }
        ensure!(scopes(&mut db)? == before, "{object}: something changed");
    }
    // Token 2 was not consumed by the failed attempts.
    let next = stage(&mut db, JULY, "next", b"3", at_ms(0))?;
    ensure!(matches!(
        publish_at(&mut db, 2, next, 2)?,
        Fenced::Applied { version: 2, .. }
    ));
    Ok(())
}

/// A retried publish with the same operation id is a duplicate: the pointer
/// stays on the first publish's object, whatever object the retry names.
#[test]
fn duplicate_op_id_moves_nothing() -> Result<()> {
    let (_server, mut db) = setup()?;
    let mut guest = guest()?;
    let opening = Request::new(JULY, tok(42), Policy::AllowEqual).with_op_id("op-1");
    let first = stage(&mut db, JULY, "first", b"1", at_ms(0))?;
    let retry = stage(&mut db, JULY, "retry", b"2", at_ms(0))?;
    ensure!(publish(&mut db, &mut guest, &opening, first, at_ms(1))?.is_applied());
    let before = scopes(&mut db)?;
    let duplicate = publish(&mut db, &mut guest, &opening, retry, at_ms(2))?;
    ensure!(
        duplicate == Fenced::Rejected(Rejection::Duplicate { version: 1 }),
        "{duplicate:?}"
    );
    ensure!(scopes(&mut db)? == before);
    ensure!(visible(&mut db, JULY)?.map(|v| v.object) == Some(first));
    Ok(())
}

/// `discard` deletes an unpublished object (once), never a published one,
/// and says `false` for an object that does not exist.
#[test]
fn discard_deletes_only_unpublished_objects() -> Result<()> {
    let (_server, mut db) = setup()?;
    let published = stage(&mut db, JULY, "published", b"1", at_ms(0))?;
    let staged = stage(&mut db, JULY, "staged", b"2", at_ms(0))?;
    ensure!(publish_at(&mut db, 1, published, 0)?.is_applied());
    ensure!(
        !discard(&mut db, published)?,
        "discarded the visible object"
    );
    ensure!(discard(&mut db, staged)?, "kept the unpublished object");
    ensure!(!discard(&mut db, staged)?, "discarded twice");
    ensure!(!discard(&mut db, ObjectId::from_raw(9_999))?);
    ensure!(object_ids(&mut db)? == [published]);
    ensure!(visible(&mut db, JULY)?.map(|v| v.object) == Some(published));
    Ok(())
}

/// The publisher never deletes the object it replaces; the collector does,
/// only once it is unreferenced and at least the retention window old; a
/// scope without a pointer (plain fenced_write) does not stop collection; a
/// backlog larger than a batch is collected completely.
#[test]
fn collector_respects_retention_and_references() -> Result<()> {
    let (_server, mut db) = setup()?;
    let mut guest = guest()?;
    let plain = fenced_write(&mut db, &mut guest, &strict("counter/x", 1), |_, _| {
        Ok::<_, postgres::Error>(())
    })?;
    ensure!(plain.is_applied());
    let old = stage(&mut db, JULY, "old", b"1", at_ms(0))?;
    ensure!(publish_at(&mut db, 1, old, 0)?.is_applied());
    let current = stage(&mut db, JULY, "current", b"2", at_ms(0))?;
    ensure!(publish_at(&mut db, 2, current, 0)?.is_applied());
    ensure!(
        object_ids(&mut db)? == [old, current],
        "the publisher deleted"
    );

    let recent = stage(&mut db, JULY, "recent", b"3", at_ms(100_000))?;
    let retention_ms = u64::try_from(RETENTION.as_millis())?;
    // One millisecond before `recent` leaves the window: only `old` goes.
    let report = collect_garbage(&mut db, at_ms(100_000 + retention_ms - 1), RETENTION)?;
    ensure!(report.deleted == 1, "{report:?}");
    ensure!(object_ids(&mut db)? == [current, recent]);
    // At exactly the retention age `recent` goes; `current` is referenced.
    let report = collect_garbage(&mut db, at_ms(100_000 + retention_ms), RETENTION)?;
    ensure!(report.deleted == 1, "{report:?}");
    ensure!(object_ids(&mut db)? == [current]);
    ensure!(visible(&mut db, JULY)?.map(|v| v.object) == Some(current));

    // A backlog of more than two batches.
    db.execute(
        "INSERT INTO fencecheck_objects (scope, name, body, staged_at_ms)
         SELECT $1, 'junk-' || i, '\\x00', 0 FROM generate_series(1, 1300) AS i",
        &[&JULY],
    )?;
    let report = collect_garbage(&mut db, at_ms(10_000_000), RETENTION)?;
    ensure!(report.deleted == 1_300, "{report:?}");
    ensure!(object_ids(&mut db)? == [current]);
    Ok(())
}

/// A writer slower than the retention window finds its object collected:
/// publish fails with UnknownObject instead of exposing a missing object.
#[test]
fn publishing_a_collected_object_fails_closed() -> Result<()> {
    let (_server, mut db) = setup()?;
    let first = stage(&mut db, JULY, "first", b"1", at_ms(0))?;
    ensure!(publish_at(&mut db, 1, first, 0)?.is_applied());
    let slow = stage(&mut db, JULY, "slow", b"2", at_ms(1_000))?;
    collect_garbage(&mut db, at_ms(1_000_000), RETENTION)?;
    let result = try_publish(&mut db, 2, slow, 1_000_001)?;
    ensure!(
        matches!(result, Err(Error::UnknownObject { .. })),
        "{result:?}"
    );
    ensure!(visible(&mut db, JULY)?.map(|v| v.object) == Some(first));
    Ok(())
}

/// A publish holding its object's KEY SHARE lock (pointer moved, not yet
/// committed, emulated with publish's own statements): the collector skips
/// the object without waiting, and after the commit keeps it as referenced;
/// a discard waits for the publish and then refuses.
#[test]
fn collector_and_discard_respect_an_uncommitted_publish() -> Result<()> {
    let (server, mut db) = setup()?;
    let old = stage(&mut db, JULY, "old", b"1", at_ms(0))?;
    ensure!(publish_at(&mut db, 1, old, 0)?.is_applied());
    let new = stage(&mut db, JULY, "new", b"2", at_ms(0))?;

    let mut publisher = server.client()?;
    let mut tx = publisher.transaction()?;
    tx.query_one(
        "SELECT fence_state FROM fencecheck_scopes WHERE scope = $1 FOR UPDATE",
        &[&JULY],
    )?;
    let locked = tx.query_opt(
        "SELECT 1 FROM fencecheck_objects WHERE id = $1 AND scope = $2 FOR KEY SHARE",
        &[&new.get(), &JULY],
    )?;
    ensure!(locked.is_some());
    tx.execute(
        "UPDATE fencecheck_scopes SET visible_object = $2 WHERE scope = $1",
        &[&JULY, &new.get()],
    )?;
    // `new` looks unreferenced to everyone else, but is locked: skipped.
    let report = collect_garbage(&mut db, at_ms(10_000_000), Duration::ZERO)?;
    ensure!(report.deleted == 0, "{report:?}");
    ensure!(object_ids(&mut db)? == [old, new]);

    let url = server.url();
    let discarding = thread::spawn(move || -> Result<bool> {
        let mut db = Client::connect(&url, postgres::NoTls)?;
        Ok(discard(&mut db, new)?)
    });
    wait_for_lock_waiter(&mut db)?;
    tx.commit()?;
    let discarded = discarding
        .join()
        .map_err(|_| anyhow!("discard panicked"))??;
    ensure!(!discarded, "discard deleted the object just published");

    // Now `old` is unreferenced and goes; `new` is referenced and stays.
    let report = collect_garbage(&mut db, at_ms(10_000_000), Duration::ZERO)?;
    ensure!(report.deleted == 1, "{report:?}");
    ensure!(object_ids(&mut db)? == [new]);
    ensure!(dangling(&mut db)? == 0);
    Ok(())
}

/// What one publish attempt of the concurrency test came to.
#[derive(Debug)]
enum Attempted {
    Applied {
        version: u64,
        token: u64,
        object: ObjectId,
    },
    Rejected,
    Collected,
}

/// Several clients publish to one scope through their own connections while
/// a collector with retention 0 runs (half the objects within its reach): no
/// pointer ever dangles (checked
/// throughout), the visible object exists and is the last applied one, and
/// applied publishes hold versions 1..=n in strictly increasing token order.
#[test]
fn concurrent_publishes_and_collector_never_dangle() -> Result<()> {
    const WRITERS: usize = 4;
    const PER_WRITER: usize = 25;
    let (server, mut db) = setup()?;
    let tokens = Arc::new(AtomicU64::new(1));
    let stop = Arc::new(AtomicBool::new(false));

    let url = server.url();
    let collector_stop = Arc::clone(&stop);
    let collector = thread::spawn(move || -> Result<(u64, u64)> {
        let mut gc = Client::connect(&url, postgres::NoTls)?;
        let mut observer = Client::connect(&url, postgres::NoTls)?;
        let (mut deleted, mut passes) = (0, 0);
        while !collector_stop.load(Ordering::Acquire) {
            deleted += collect_garbage(&mut gc, at_ms(10_000_000), Duration::ZERO)?.deleted;
            passes += 1;
            let n = dangling(&mut observer)?;
            ensure!(n == 0, "{n} dangling pointers after pass {passes}");
        }
        Ok((deleted, passes))
    });

    let writers = (0..WRITERS)
        .map(|w| {
            let url = server.url();
            let tokens = Arc::clone(&tokens);
            thread::spawn(move || -> Result<Vec<Attempted>> {
                let mut db = Client::connect(&url, postgres::NoTls)?;
                let mut guest = guest()?;
                let mut attempts = Vec::with_capacity(PER_WRITER);
                for i in 0..PER_WRITER {
                    // Even rounds race the collector (staged long before its
                    // cutoff); odd ones are staged after it, so they are never
                    // collected meanwhile and some publish always applies
                    // (the highest odd token, or a higher one before it).
                    let staged_at = if i % 2 == 0 { 0 } else { 20_000_000 };
                    let object = stage(&mut db, JULY, &format!("w{w}/{i}"), b"", at_ms(staged_at))?;
                    let token = tokens.fetch_add(1, Ordering::AcqRel);
                    let outcome = publish(
                        &mut db,
                        &mut guest,
                        &strict(JULY, token),
                        object,
                        at_ms(token),
                    );
                    attempts.push(match outcome {
                        Ok(Fenced::Applied { version, .. }) => Attempted::Applied {
                            version,
                            token,
                            object,
                        },
                        Ok(Fenced::Rejected(Rejection::StaleFence { .. })) => Attempted::Rejected,
                        Err(Error::UnknownObject { .. }) => Attempted::Collected,
                        other => bail!("writer {w}, token {token}: {other:?}"),
                    });
                }
                Ok(attempts)
            })
        })
        .collect::<Vec<_>>();

    let mut attempts = Vec::new();
    for writer in writers {
        attempts.extend(writer.join().map_err(|_| anyhow!("a writer panicked"))??);
    }
    stop.store(true, Ordering::Release);
    let (deleted, passes) = collector
        .join()
        .map_err(|_| anyhow!("the collector panicked"))??;

    let mut applied: Vec<(u64, u64, ObjectId)> = attempts
        .iter()
        .filter_map(|a| match *a {
            Attempted::Applied {
                version,
                token,
                object,
            } => Some((version, token, object)),
            _ => None,
        })
        .collect();
    applied.sort_unstable();
    ensure!(!applied.is_empty(), "nothing applied: {attempts:?}");
    for (i, window) in applied.windows(2).enumerate() {
        let ((v0, t0, _), (v1, t1, _)) = (window[0], window[1]);
        ensure!(v1 == v0 + 1, "versions {v0} then {v1} at {i}");
        ensure!(t1 > t0, "token {t1} applied after {t0}");
    }
    let &(last_version, _, last_object) = applied.last().context("at least one publish applied")?;
    ensure!(applied[0].0 == 1 && last_version == applied.len() as u64);
    let shown = visible(&mut db, JULY)?.context("the visible object was collected")?;
    ensure!(shown.object == last_object && shown.version == last_version);
    ensure!(dangling(&mut db)? == 0);
    // Everything else is collectable: exactly the visible object remains.
    collect_garbage(&mut db, at_ms(30_000_000), Duration::ZERO)?;
    ensure!(object_ids(&mut db)? == [last_object]);
    let collected = attempts
        .iter()
        .filter(|a| matches!(a, Attempted::Collected))
        .count();
    eprintln!(
        "{} applied, {collected} collected before publish, {deleted} deleted in {passes} passes",
        applied.len()
    );
    ensure!(deleted > 0, "the collector never deleted anything");
    Ok(())
}

/// Unusable arguments are refused before touching the database.
#[test]
fn invalid_arguments_are_refused() -> Result<()> {
    let (_server, mut db) = setup()?;
    let long = "s".repeat(fencecheck::MAX_SCOPE_BYTES + 1);
    for scope in ["", long.as_str()] {
        let result = stage(&mut db, scope, "x", b"1", at_ms(0));
        ensure!(
            matches!(result, Err(Error::Invalid { what: "scope", .. })),
            "{result:?}"
        );
    }
    let before_epoch = UNIX_EPOCH - Duration::from_secs(1);
    let result = stage(&mut db, JULY, "x", b"1", before_epoch);
    ensure!(matches!(result, Err(Error::Invalid { .. })), "{result:?}");
    let object = stage(&mut db, JULY, "x", b"1", at_ms(0))?;
    let mut guest = guest()?;
    let result = publish(&mut db, &mut guest, &strict(JULY, 1), object, before_epoch);
    ensure!(matches!(result, Err(Error::Invalid { .. })), "{result:?}");
    let result = collect_garbage(&mut db, before_epoch, RETENTION);
    ensure!(matches!(result, Err(Error::Invalid { .. })), "{result:?}");
    ensure!(scopes(&mut db)?.is_empty());
    ensure!(object_ids(&mut db)? == [object]);
    Ok(())
}
