//! Fenced tables: every path that could mutate a protected row, each
//! either fenced or refused (docs/postgres.md, "Fenced tables").

use crate::common::{message, protected_catalog, row, server, sqlstate};
use anyhow::{Result, ensure};
use postgres::Client;

const JULY: &str = "report/july";

fn insert(db: &mut Client, token: &str, object: &str) -> Result<u64, postgres::Error> {
    db.execute(
        "INSERT INTO report_catalog (report_id, visible_object, fence_token) VALUES ($1, $2, $3)",
        &[&JULY, &object, &token],
    )
}

fn update(db: &mut Client, token: &str, object: &str) -> Result<u64, postgres::Error> {
    db.execute(
        "UPDATE report_catalog SET visible_object = $1, fence_token = $2 WHERE report_id = $3",
        &[&object, &token, &JULY],
    )
}

/// The transaction-local settings a DELETE (or a guarded write) presents.
fn delete(db: &mut Client, token: &str) -> Result<u64, postgres::Error> {
    let mut tx = db.transaction()?;
    tx.execute("SELECT set_config('fencecheck.token', $1, true)", &[&token])?;
    let n = tx.execute("DELETE FROM report_catalog WHERE report_id = $1", &[&JULY])?;
    tx.commit()?;
    Ok(n)
}

/// The example: UPDATE presenting 0.42 applies and advances the
/// state; the same with 0.41 afterwards raises stale-fence, changing nothing.
#[test]
fn update_with_newer_token_applies_and_older_is_stale() -> Result<()> {
    let (_server, mut db) = server()?;
    protected_catalog(&mut db, "strict")?;
    ensure!(insert(&mut db, "0.40", "reports/july/first")? == 1);
    ensure!(update(&mut db, "0.42", "reports/july/b9")? == 1);
    ensure!(row(&mut db, JULY)? == Some((Some("reports/july/b9".into()), Some("0.42".into()), 2)));
    let stale = update(&mut db, "0.41", "reports/july/a7");
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    ensure!(row(&mut db, JULY)? == Some((Some("reports/july/b9".into()), Some("0.42".into()), 2)));
    Ok(())
}

/// An UPDATE that does not present a token (SET visible_object alone) is
/// refused with fence-required; re-presenting the stored token is stale.
#[test]
fn update_without_a_token_is_refused() -> Result<()> {
    let (_server, mut db) = server()?;
    protected_catalog(&mut db, "strict")?;
    insert(&mut db, "0.42", "reports/july/b9")?;
    let bare = db.execute("UPDATE report_catalog SET visible_object = 'x'", &[]);
    ensure!(sqlstate(&bare).as_deref() == Some("5F011"), "{bare:?}");
    ensure!(
        message(&bare).contains("must SET fence_token"),
        "{}",
        message(&bare)
    );
    let same = db.execute(
        "UPDATE report_catalog SET visible_object = 'x', fence_token = fence_token",
        &[],
    );
    ensure!(sqlstate(&same).as_deref() == Some("5F001"), "{same:?}");
    let null = db.execute(
        "UPDATE report_catalog SET visible_object = 'x', fence_token = NULL",
        &[],
    );
    ensure!(sqlstate(&null).as_deref() == Some("5F011"), "{null:?}");
    ensure!(row(&mut db, JULY)? == Some((Some("reports/july/b9".into()), Some("0.42".into()), 1)));
    Ok(())
}

/// Writing the state column directly, moving a row to another scope, or
/// inserting a state is refused; so is TRUNCATE.
#[test]
fn state_scope_and_truncate_paths_are_refused() -> Result<()> {
    let (_server, mut db) = server()?;
    protected_catalog(&mut db, "strict")?;
    insert(&mut db, "0.42", "reports/july/b9")?;
    let forged: Vec<u8> = db
        .query_one("SELECT fence_next(NULL, 'report/july', '9.9')", &[])?
        .get(0);
    let cases: Vec<(&str, Result<u64, postgres::Error>)> = vec![
        (
            "state written",
            db.execute(
                "UPDATE report_catalog SET fence_state = $1, fence_token = '0.50'",
                &[&forged],
            ),
        ),
        (
            "state cleared",
            db.execute(
                "UPDATE report_catalog SET fence_state = NULL, fence_token = '0.50'",
                &[],
            ),
        ),
        (
            "scope moved",
            db.execute(
                "UPDATE report_catalog SET report_id = 'report/august', fence_token = '0.50'",
                &[],
            ),
        ),
        (
            "state inserted",
            db.execute(
                "INSERT INTO report_catalog VALUES ('report/may', 'x', '0.50', $1)",
                &[&forged],
            ),
        ),
        (
            "insert without token",
            db.execute(
                "INSERT INTO report_catalog (report_id, visible_object) VALUES ('report/may', 'x')",
                &[],
            ),
        ),
        ("truncate", db.execute("TRUNCATE report_catalog", &[])),
    ];
    for (what, result) in &cases {
        ensure!(
            sqlstate(result).as_deref() == Some("5F011"),
            "{what}: {result:?}"
        );
    }
    // Bad input through the trigger: named errors, nothing changed.
    let long = "x".repeat(2048);
    let bad: Vec<(&str, Result<u64, postgres::Error>)> = vec![
        ("5F004", update(&mut db, "garbage", "x")),
        ("5F004", update(&mut db, "", "x")),
        (
            "5F005",
            db.execute(
                "INSERT INTO report_catalog (report_id, visible_object, fence_token) VALUES ($1, 'x', '0.50')",
                &[&long],
            ),
        ),
    ];
    for (code, result) in &bad {
        ensure!(sqlstate(result).as_deref() == Some(*code), "{result:?}");
    }
    ensure!(row(&mut db, JULY)? == Some((Some("reports/july/b9".into()), Some("0.42".into()), 1)));
    ensure!(
        db.query_one("SELECT count(*) FROM report_catalog", &[])?
            .get::<_, i64>(0)
            == 1
    );
    Ok(())
}

/// DELETE presents its token in `fencecheck.token`: without one it is
/// refused; a stale one is stale; a current one deletes and leaves a
/// tombstone, so re-inserting the scope below the mark is stale while a
/// newer token re-creates it, continuing the same version count.
#[test]
fn delete_keeps_the_mark_in_a_tombstone() -> Result<()> {
    let (_server, mut db) = server()?;
    protected_catalog(&mut db, "strict")?;
    insert(&mut db, "0.42", "reports/july/b9")?;
    let bare = db.execute("DELETE FROM report_catalog", &[]);
    ensure!(sqlstate(&bare).as_deref() == Some("5F011"), "{bare:?}");
    let stale = delete(&mut db, "0.41");
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    ensure!(row(&mut db, JULY)?.is_some());
    ensure!(delete(&mut db, "0.43")? == 1);
    ensure!(row(&mut db, JULY)?.is_none());
    let resurrect = insert(&mut db, "0.42", "reports/july/a7");
    ensure!(
        sqlstate(&resurrect).as_deref() == Some("5F001"),
        "{resurrect:?}"
    );
    ensure!(row(&mut db, JULY)?.is_none());
    // The operator cannot erase the mark from an ordinary role either.
    db.batch_execute("CREATE ROLE writer; GRANT ALL ON report_catalog TO writer")?;
    let mut tx = db.transaction()?;
    tx.batch_execute("SET LOCAL ROLE writer")?;
    let erase = tx.execute("DELETE FROM fencecheck.tombstones", &[]);
    ensure!(sqlstate(&erase).as_deref() == Some("42501"), "{erase:?}");
    tx.rollback()?;
    ensure!(insert(&mut db, "0.44", "reports/july/c3")? == 1);
    ensure!(row(&mut db, JULY)? == Some((Some("reports/july/c3".into()), Some("0.44".into()), 3)));
    let left = db.query_one("SELECT count(*) FROM fencecheck.tombstones", &[])?;
    ensure!(left.get::<_, i64>(0) == 0, "the row holds the state again");
    Ok(())
}

/// Under allow-equal, a holder writes several times with one token, each
/// write guarded by an op-id (a repeat is duplicate, 5F003) or an expected
/// version (a reordered write is version-conflict, 5F002); an unguarded
/// equal write is refused.
#[test]
fn allow_equal_needs_a_guard() -> Result<()> {
    let (_server, mut db) = server()?;
    protected_catalog(&mut db, "allow-equal")?;
    insert(&mut db, "0.42", "v1")?;
    let unguarded = update(&mut db, "0.42", "v2");
    ensure!(
        sqlstate(&unguarded).as_deref() == Some("5F005"),
        "{unguarded:?}"
    );
    let guarded = |db: &mut Client, op: &str, version: &str, object: &str| {
        let mut tx = db.transaction()?;
        tx.execute("SELECT set_config('fencecheck.op_id', $1, true)", &[&op])?;
        tx.execute(
            "SELECT set_config('fencecheck.expected_version', $1, true)",
            &[&version],
        )?;
        let n = tx.execute(
            "UPDATE report_catalog SET visible_object = $1, fence_token = '0.42' WHERE report_id = $2",
            &[&object, &JULY],
        )?;
        tx.commit()?;
        Ok::<u64, postgres::Error>(n)
    };
    ensure!(guarded(&mut db, "op-2", "", "v2")? == 1);
    let repeat = guarded(&mut db, "op-2", "", "v2-again");
    ensure!(sqlstate(&repeat).as_deref() == Some("5F003"), "{repeat:?}");
    ensure!(guarded(&mut db, "", "2", "v3")? == 1);
    let reordered = guarded(&mut db, "", "2", "v3-late");
    ensure!(
        sqlstate(&reordered).as_deref() == Some("5F002"),
        "{reordered:?}"
    );
    let older = update(&mut db, "0.41", "old");
    ensure!(sqlstate(&older).as_deref() == Some("5F001"), "{older:?}");
    ensure!(row(&mut db, JULY)? == Some((Some("v3".into()), Some("0.42".into()), 3)));
    Ok(())
}

/// fence_protect refuses what it cannot fence soundly (no unique scope
/// column, wrong types, unknown policy); fence_unprotect removes the
/// triggers, after which plain writes go through.
#[test]
fn protect_validates_and_unprotect_removes() -> Result<()> {
    let (_server, mut db) = server()?;
    db.batch_execute(
        "CREATE TABLE loose (scope text, token text, state bytea);
         CREATE TABLE typed (scope text PRIMARY KEY, token int, state bytea);",
    )?;
    let cases = [
        (
            "SELECT fence_protect('loose', 'scope', 'token', 'state')",
            "needs a primary key or unique index",
        ),
        (
            "SELECT fence_protect('typed', 'scope', 'token', 'state')",
            "must be text or varchar",
        ),
        (
            "SELECT fence_protect('typed', 'scope', 'nope', 'state')",
            "has no column",
        ),
        (
            "SELECT fence_protect('typed', 'scope', 'scope', 'state')",
            "three different columns",
        ),
    ];
    for (sql, words) in cases {
        let result = db.execute(sql, &[]);
        ensure!(
            sqlstate(&result).as_deref() == Some("5F012"),
            "{sql}: {result:?}"
        );
        ensure!(
            message(&result).contains(words),
            "{sql}: {}",
            message(&result)
        );
    }
    protected_catalog(&mut db, "strict")?;
    let policy = db.execute(
        "SELECT fence_protect('report_catalog', 'report_id', 'fence_token', 'fence_state', 'lenient')",
        &[],
    );
    ensure!(sqlstate(&policy).as_deref() == Some("5F012"), "{policy:?}");
    insert(&mut db, "0.42", "b9")?;
    ensure!(
        sqlstate(&db.execute("UPDATE report_catalog SET visible_object = 'x'", &[])).as_deref()
            == Some("5F011")
    );
    db.execute("SELECT fence_unprotect('report_catalog')", &[])?;
    ensure!(db.execute("UPDATE report_catalog SET visible_object = 'x'", &[])? == 1);
    ensure!(db.execute("TRUNCATE report_catalog", &[]).is_ok());
    Ok(())
}

/// A concurrent DELETE and re-INSERT of one scope: the INSERT waits for the
/// DELETE's tombstone and is decided against it (READ COMMITTED), or fails
/// with a serialization error (REPEATABLE READ); never applied below it.
#[test]
fn insert_racing_a_delete_sees_the_tombstone() -> Result<()> {
    let (server, mut db) = server()?;
    protected_catalog(&mut db, "strict")?;
    insert(&mut db, "0.42", "b9")?;
    let rounds = [
        ("READ COMMITTED", "0.43", "0.42", "0.44", "5F001"),
        ("REPEATABLE READ", "0.45", "0.44", "0.46", "40001"),
    ];
    for (isolation, delete_token, stale_token, next_token, want) in rounds {
        let mut deleter = server.client()?;
        let mut inserter = server.client()?;
        let mut tx = deleter.transaction()?;
        tx.execute(
            "SELECT set_config('fencecheck.token', $1, true)",
            &[&delete_token],
        )?;
        ensure!(tx.execute("DELETE FROM report_catalog", &[])? == 1);
        // The inserter starts (its snapshot, under REPEATABLE READ, is taken
        // now) and blocks on the tombstone slot the deleter holds.
        let handle = std::thread::spawn(move || {
            let mut t = inserter
                .build_transaction()
                .isolation_level(match isolation {
                    "READ COMMITTED" => postgres::IsolationLevel::ReadCommitted,
                    _ => postgres::IsolationLevel::RepeatableRead,
                })
                .start()?;
            t.query_one("SELECT 1", &[])?;
            let r = t.execute(
                "INSERT INTO report_catalog (report_id, visible_object, fence_token) VALUES ('report/july', 'a7', $1)",
                &[&stale_token],
            );
            let state = sqlstate(&r);
            drop(t);
            Ok::<_, postgres::Error>(state)
        });
        // Wait until the inserter is blocked on a lock, then commit.
        loop {
            let waiting: i64 = db
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO report_catalog%'",
                    &[],
                )?
                .get(0);
            if waiting > 0 {
                break;
            }
            std::thread::yield_now();
        }
        tx.commit()?;
        let state = handle
            .join()
            .map_err(|_| anyhow::anyhow!("inserter panicked"))??;
        ensure!(state.as_deref() == Some(want), "{isolation}: {state:?}");
        ensure!(row(&mut db, JULY)?.is_none());
        // Re-create for the next round with a newer token.
        insert(&mut db, next_token, "next")?;
    }
    Ok(())
}
