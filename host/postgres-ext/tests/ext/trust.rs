//! Fenced tables against their own writers: what a role with table
//! privileges (and one with TRIGGER) tries in order to crash the server,
//! walk around the fence or roll a mark back, each refused
//! (docs/postgres.md, "Fenced tables": "What a writer cannot do").
//!
//! Every test starts from the same setup: `docs` fenced under `strict`, a
//! login role `w` with SELECT, INSERT, UPDATE and DELETE on it and nothing
//! else, and the row `report/july` at token 0.42.

use crate::common::{PgServer, message, server, signed, sqlstate};
use anyhow::{Context, Result, ensure};
use postgres::Client;

const JULY: &str = "report/july";

/// The setup on a fresh server; returns the server, a superuser
/// connection and one as `w`.
fn docs() -> Result<(PgServer, Client, Client)> {
    let (server, mut db) = server()?;
    db.batch_execute(
        "CREATE TABLE docs (scope text PRIMARY KEY, body text, token text, fence_state bytea);
         SELECT fence_protect('docs', 'scope', 'token', 'fence_state');
         CREATE ROLE w LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON docs TO w;
         INSERT INTO docs (scope, body, token) VALUES ('report/july', 'b9', '0.42');",
    )?;
    let w = server.client_as("w")?;
    Ok((server, db, w))
}

/// `report/july`'s (body, token, version).
fn july(db: &mut Client) -> Result<Option<(String, String, i64)>> {
    let row = db.query_opt(
        "SELECT body, token, (fence_inspect(fence_state)->>'version')::bigint \
           FROM docs WHERE scope = $1",
        &[&JULY],
    )?;
    Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
}

/// The row as the setup left it.
fn untouched() -> Option<(String, String, i64)> {
    Some(("b9".into(), "0.42".into(), 1))
}

/// A stale write by `w` is still refused, and the row is as it was.
fn still_fenced(db: &mut Client, w: &mut Client) -> Result<()> {
    let stale = w.execute(
        "UPDATE docs SET body = 'a7', token = '0.41' WHERE scope = $1",
        &[&JULY],
    );
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    ensure!(july(db)? == untouched(), "{:?}", july(db)?);
    Ok(())
}

/// No backend crashed: a connection made before the attack still answers
/// (a crash makes the postmaster end every session), and the log says
/// nothing of a server process terminated by a signal.
fn no_crash(server: &PgServer, survivor: &mut Client) -> Result<()> {
    survivor
        .query_one("SELECT 1", &[])
        .context("a session made before the attack is gone: a backend crashed")?;
    let log = server.log();
    ensure!(
        !log.contains("terminated by signal"),
        "a backend crashed:\n{log}"
    );
    Ok(())
}

/// Run `sql` with the extension's event trigger disabled (a superuser's
/// way around it), to show that a fenced table's writes still fail closed
/// when its protection was changed behind the extension's back.
fn behind_the_guard(db: &mut Client, sql: &str) -> Result<()> {
    db.batch_execute("ALTER EVENT TRIGGER fencecheck_guard DISABLE")?;
    let result = db.batch_execute(sql);
    db.batch_execute("ALTER EVENT TRIGGER fencecheck_guard ENABLE")?;
    Ok(result?)
}

/// Item 1: no role but a superuser can point the trigger function at a
/// table of its own (EXECUTE is not PUBLIC's); a trigger a superuser makes
/// on an unregistered table with an integer "scope" refuses every row
/// (5F016) instead of reading the integer as a pointer; nothing crashes.
#[test]
fn the_trigger_runs_only_on_tables_fence_protect_registered() -> Result<()> {
    let (server, mut db, mut w) = docs()?;
    let mut survivor = server.client()?;
    w.batch_execute("CREATE TEMP TABLE t (scope int8, token text, st bytea)")?;
    let own = w.batch_execute(
        "CREATE TRIGGER x BEFORE INSERT ON t FOR EACH ROW \
         EXECUTE FUNCTION fencecheck.row_trigger('scope', 'token', 'st', 'strict')",
    );
    ensure!(sqlstate(&own).as_deref() == Some("42501"), "{own:?}");

    // A superuser can create such a trigger only behind the guard; it
    // still refuses to read a row of a table fence_protect never checked.
    db.batch_execute("CREATE TABLE t (scope int8, token text, st bytea)")?;
    let guarded = db.batch_execute(
        "CREATE TRIGGER x BEFORE INSERT ON t FOR EACH ROW \
         EXECUTE FUNCTION fencecheck.row_trigger('scope', 'token', 'st', 'strict')",
    );
    ensure!(
        sqlstate(&guarded).as_deref() == Some("5F016"),
        "{guarded:?}"
    );
    behind_the_guard(
        &mut db,
        "CREATE TRIGGER x BEFORE INSERT ON t FOR EACH ROW \
         EXECUTE FUNCTION fencecheck.row_trigger('scope', 'token', 'st', 'strict')",
    )?;
    let insert = db.execute("INSERT INTO t VALUES (4096, '0.1', NULL)", &[]);
    ensure!(sqlstate(&insert).as_deref() == Some("5F016"), "{insert:?}");
    ensure!(
        message(&insert).contains("fence_protect"),
        "{}",
        message(&insert)
    );
    // The same arguments on a registered table, but on another table's
    // trigger: the registry binds the trigger to its own relation.
    db.batch_execute(
        "CREATE TABLE copycat (scope text PRIMARY KEY, body text, token text, fence_state bytea)",
    )?;
    behind_the_guard(
        &mut db,
        "CREATE TRIGGER zz_fencecheck_row BEFORE INSERT OR UPDATE OR DELETE ON copycat \
         FOR EACH ROW EXECUTE FUNCTION fencecheck.row_trigger('scope', 'token', 'fence_state', 'strict')",
    )?;
    let copy = db.execute(
        "INSERT INTO copycat (scope, token) VALUES ('a', '0.1')",
        &[],
    );
    ensure!(sqlstate(&copy).as_deref() == Some("5F016"), "{copy:?}");
    no_crash(&server, &mut survivor)?;
    still_fenced(&mut db, &mut w)
}

/// Item 1, the owner's way in: changing a fenced column's type is refused
/// (5F016); done behind the guard, every write then fails closed (5F016)
/// rather than reading an int8 datum as text.
#[test]
fn a_fenced_column_never_changes_type_under_the_trigger() -> Result<()> {
    let (server, mut db, _w) = docs()?;
    let mut survivor = server.client()?;
    db.batch_execute(
        "CREATE TABLE n (scope text PRIMARY KEY, token text, st bytea);
         SELECT fence_protect('n', 'scope', 'token', 'st');
         INSERT INTO n (scope, token) VALUES ('4096', '0.1');",
    )?;
    let alter = db.batch_execute("ALTER TABLE n ALTER COLUMN scope TYPE int8 USING scope::int8");
    ensure!(sqlstate(&alter).as_deref() == Some("5F016"), "{alter:?}");
    let token = db.batch_execute("ALTER TABLE n ALTER COLUMN token TYPE bytea USING token::bytea");
    ensure!(sqlstate(&token).as_deref() == Some("5F016"), "{token:?}");
    behind_the_guard(
        &mut db,
        "ALTER TABLE n ALTER COLUMN scope TYPE int8 USING scope::int8",
    )?;
    for sql in [
        "UPDATE n SET token = '0.2'",
        "INSERT INTO n (scope, token) VALUES (8192, '0.1')",
    ] {
        let write = db.execute(sql, &[]);
        ensure!(
            sqlstate(&write).as_deref() == Some("5F016"),
            "{sql}: {write:?}"
        );
        ensure!(
            message(&write).contains("scope"),
            "{sql}: {}",
            message(&write)
        );
    }
    let mut tx = db.transaction()?;
    tx.execute("SET LOCAL fencecheck.token = '0.9'", &[])?;
    let delete = tx.execute("DELETE FROM n", &[]);
    ensure!(sqlstate(&delete).as_deref() == Some("5F016"), "{delete:?}");
    drop(tx);
    no_crash(&server, &mut survivor)
}

/// Item 2: a role with the TRIGGER privilege (GRANT ALL gives it) can
/// neither replace the fence's trigger (WHEN (false), another function),
/// nor add a trigger that rewrites NEW, nor re-protect or unprotect the
/// table with another policy: each is 42501, and the fence still holds.
#[test]
fn a_role_with_trigger_privilege_cannot_change_the_fence() -> Result<()> {
    let (server, mut db, mut w) = docs()?;
    db.batch_execute("GRANT ALL ON docs TO w")?;
    w.batch_execute(
        "CREATE FUNCTION pg_temp.bump() RETURNS trigger LANGUAGE plpgsql AS \
         $$BEGIN NEW.token := '9.9'; RETURN NEW; END$$",
    )?;
    let attempts = [
        "CREATE OR REPLACE TRIGGER zz_fencecheck_row BEFORE INSERT OR UPDATE OR DELETE ON docs \
         FOR EACH ROW WHEN (false) \
         EXECUTE FUNCTION fencecheck.row_trigger('scope', 'token', 'fence_state', 'strict')",
        "CREATE OR REPLACE TRIGGER zz_fencecheck_row BEFORE INSERT OR UPDATE OR DELETE ON docs \
         FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "CREATE TRIGGER aaa BEFORE UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION pg_temp.bump()",
        "CREATE TRIGGER zzz BEFORE UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION pg_temp.bump()",
        "SELECT fence_protect('docs', 'scope', 'token', 'fence_state', 'allow-equal')",
        "SELECT fence_unprotect('docs')",
    ];
    for sql in attempts {
        let result = w.batch_execute(sql);
        ensure!(
            sqlstate(&result).as_deref() == Some("42501"),
            "{sql}: {result:?}"
        );
    }
    still_fenced(&mut db, &mut w)?;
    let _ = server;
    Ok(())
}

/// Item 2, the owner's side: a BEFORE trigger that would fire after the
/// fence (its name sorts after the fence's) and so could rewrite NEW after
/// the check is refused (5F016), even for the owner; one that fires before
/// it is allowed and its changes are fenced like the writer's own.
#[test]
fn the_fence_is_the_last_before_trigger_to_see_new() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute(
        "CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS \
         $$BEGIN NEW.body := NEW.body || '!'; RETURN NEW; END$$",
    )?;
    for name in ["zzz_after", "\"~late\"", "\"zz_fencecheck_rox\""] {
        let sql = format!(
            "CREATE TRIGGER {name} BEFORE INSERT OR UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION stamp()"
        );
        let late = db.batch_execute(&sql);
        ensure!(
            sqlstate(&late).as_deref() == Some("5F016"),
            "{name}: {late:?}"
        );
        ensure!(
            message(&late).contains("zz_fencecheck_row"),
            "{}",
            message(&late)
        );
    }
    db.batch_execute(
        "CREATE TRIGGER set_body BEFORE INSERT OR UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION stamp()",
    )?;
    // AFTER triggers cannot change the row: allowed under any name.
    db.batch_execute(
        "CREATE TRIGGER zzz_audit AFTER UPDATE ON docs FOR EACH ROW EXECUTE FUNCTION stamp()",
    )?;
    ensure!(
        w.execute(
            "UPDATE docs SET body = 'c3', token = '0.43' WHERE scope = $1",
            &[&JULY]
        )? == 1
    );
    ensure!(july(&mut db)? == Some(("c3!".into(), "0.43".into(), 2)));
    let stale = w.execute(
        "UPDATE docs SET body = 'a7', token = '0.41' WHERE scope = $1",
        &[&JULY],
    );
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    Ok(())
}

/// Item 3: an INSERT the fence approved but PostgreSQL then skipped (ON
/// CONFLICT DO NOTHING losing on another unique constraint) keeps the
/// deleted scope's tombstone: re-creating the scope below the mark is still
/// stale.
#[test]
fn a_skipped_insert_keeps_the_tombstone() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute(
        "ALTER TABLE docs ADD CONSTRAINT docs_body_key UNIQUE (body);
         INSERT INTO docs (scope, body, token) VALUES ('report/august', 'X', '0.1');",
    )?;
    let mut tx = w.transaction()?;
    tx.execute("SET LOCAL fencecheck.token = '0.43'", &[])?;
    ensure!(tx.execute("DELETE FROM docs WHERE scope = $1", &[&JULY])? == 1);
    tx.commit()?;
    let skipped = w.execute(
        "INSERT INTO docs (scope, body, token) VALUES ($1, 'X', '0.44') ON CONFLICT DO NOTHING",
        &[&JULY],
    )?;
    ensure!(skipped == 0, "the insert was meant to be skipped");
    let stale = w.execute(
        "INSERT INTO docs (scope, body, token) VALUES ($1, 'a7', '0.41')",
        &[&JULY],
    );
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    ensure!(july(&mut db)?.is_none());
    // The mark still counts the deleted row's writes: the scope comes back
    // at the next version above it.
    ensure!(
        w.execute(
            "INSERT INTO docs (scope, body, token) VALUES ($1, 'd4', '0.44')",
            &[&JULY]
        )? == 1
    );
    ensure!(july(&mut db)? == Some(("d4".into(), "0.44".into(), 3)));
    let left: i64 = db
        .query_one(
            "SELECT count(*) FROM fencecheck.tombstones WHERE scope = $1",
            &[&JULY],
        )?
        .get(0);
    ensure!(
        left == 0,
        "the row that replaced it took the tombstone away"
    );
    Ok(())
}

/// Item 4: inheritance and partitioning. fence_protect refuses a table with
/// a parent, children or partitions (5F012); a child or partition attached
/// to a fenced table later is refused (5F016), and one attached behind the
/// guard makes the parent's writes fail closed.
#[test]
fn hierarchies_are_refused_now_and_later() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    let later = [
        "CREATE TABLE docs_child () INHERITS (docs)",
        "CREATE TABLE other (LIKE docs); ALTER TABLE other INHERIT docs",
        "CREATE TABLE docs_parent (LIKE docs); ALTER TABLE docs INHERIT docs_parent",
    ];
    for sql in later {
        let result = db.batch_execute(sql);
        ensure!(
            sqlstate(&result).as_deref() == Some("5F016"),
            "{sql}: {result:?}"
        );
    }
    db.batch_execute(
        "CREATE TABLE parts (scope text PRIMARY KEY, body text, token text, fence_state bytea) PARTITION BY LIST (scope);
         CREATE TABLE part_a PARTITION OF parts FOR VALUES IN ('a');
         CREATE TABLE base (scope text PRIMARY KEY, body text, token text, fence_state bytea);
         CREATE TABLE derived (scope text PRIMARY KEY, body text, token text, fence_state bytea);
         ALTER TABLE derived INHERIT base;",
    )?;
    for table in ["parts", "part_a", "base", "derived"] {
        let result = db.execute(
            "SELECT fence_protect($1::text::regclass, 'scope', 'token', 'fence_state')",
            &[&table],
        );
        ensure!(
            sqlstate(&result).as_deref() == Some("5F012"),
            "{table}: {result:?}"
        );
    }
    behind_the_guard(&mut db, "CREATE TABLE sneaky () INHERITS (docs)")?;
    db.batch_execute("GRANT ALL ON sneaky TO w")?;
    let write = w.execute(
        "UPDATE docs SET body = 'x', token = '0.50' WHERE scope = $1",
        &[&JULY],
    );
    ensure!(sqlstate(&write).as_deref() == Some("5F016"), "{write:?}");
    ensure!(july(&mut db)? == untouched());
    Ok(())
}

/// Item 5: a deferrable key or a nondeterministic collation on the scope
/// column breaks "one row per scope" as the tombstones and key prefixes
/// compare it: fence_protect refuses both (5F012), and so does the guard
/// when a fenced table would acquire one (5F016).
#[test]
fn deferrable_keys_and_nondeterministic_collations_are_refused() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute(
        "CREATE COLLATION ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
         CREATE TABLE d1 (scope text PRIMARY KEY DEFERRABLE, token text, st bytea);
         CREATE TABLE d2 (scope text COLLATE ci PRIMARY KEY, token text, st bytea);
         CREATE TABLE d3 (scope text, token text, st bytea);
         CREATE UNIQUE INDEX d3_scope ON d3 (scope COLLATE ci);",
    )?;
    for table in ["d1", "d2", "d3"] {
        let result = db.execute(
            "SELECT fence_protect($1::text::regclass, 'scope', 'token', 'st')",
            &[&table],
        );
        ensure!(
            sqlstate(&result).as_deref() == Some("5F012"),
            "{table}: {result:?}"
        );
    }
    let later = [
        "ALTER TABLE docs ALTER COLUMN scope TYPE text COLLATE ci",
        "ALTER TABLE docs DROP CONSTRAINT docs_pkey, ADD PRIMARY KEY (scope) DEFERRABLE",
        "ALTER TABLE docs DROP CONSTRAINT docs_pkey",
    ];
    for sql in later {
        let result = db.batch_execute(sql);
        ensure!(
            sqlstate(&result).as_deref() == Some("5F016"),
            "{sql}: {result:?}"
        );
    }
    behind_the_guard(&mut db, "ALTER TABLE docs DROP CONSTRAINT docs_pkey")?;
    let write = w.execute(
        "UPDATE docs SET body = 'x', token = '0.50' WHERE scope = $1",
        &[&JULY],
    );
    ensure!(sqlstate(&write).as_deref() == Some("5F016"), "{write:?}");
    ensure!(july(&mut db)? == untouched());
    Ok(())
}

/// Item 6: the token column keeps the token, never its signature, so what
/// any reader sees cannot be replayed as a signed token under allow-equal
/// with a fresh op-id (5F014).
#[test]
fn what_a_reader_sees_is_not_a_credential() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute(
        "CREATE TABLE signed_docs (scope text PRIMARY KEY, body text, token text, fence_state bytea);
         SELECT fence_protect('signed_docs', 'scope', 'token', 'fence_state', 'allow-equal');
         GRANT SELECT, INSERT, UPDATE, DELETE ON signed_docs TO w;",
    )?;
    db.execute(
        "INSERT INTO fencecheck.keys VALUES ('report/', 3, $1)",
        &[&crate::common::SECRET.as_slice()],
    )?;
    let grant = signed(JULY, 42)?;
    let mut tx = db.transaction()?;
    tx.execute("SET LOCAL fencecheck.op_id = 'op-1'", &[])?;
    tx.execute(
        "INSERT INTO signed_docs (scope, body, token) VALUES ($1, 'b9', $2)",
        &[&JULY, &grant],
    )?;
    tx.commit()?;
    let seen: String = w
        .query_one("SELECT token FROM signed_docs WHERE scope = $1", &[&JULY])?
        .get(0);
    ensure!(seen == "1.42", "a reader sees {seen:?}");
    let mut tx = w.transaction()?;
    tx.execute("SET LOCAL fencecheck.op_id = 'op-2'", &[])?;
    let replay = tx.execute(
        "UPDATE signed_docs SET body = 'evil', token = $2 WHERE scope = $1",
        &[&JULY, &seen],
    );
    ensure!(sqlstate(&replay).as_deref() == Some("5F014"), "{replay:?}");
    drop(tx);
    let body: String = db
        .query_one("SELECT body FROM signed_docs WHERE scope = $1", &[&JULY])?
        .get(0);
    ensure!(body == "b9");
    Ok(())
}

/// Item 6: a token presented with a session-level SET outlives its
/// transaction, so it counts only in the transaction that set it: a later
/// DELETE on the same (pooled) connection presents nothing (5F011), also
/// when the SET came before the extension's library was loaded.
#[test]
fn a_presented_token_does_not_outlive_its_transaction() -> Result<()> {
    let (server, mut db, mut w) = docs()?;
    // Set in one transaction, inherited by the next "client" of the pool.
    w.batch_execute("BEGIN; SET fencecheck.token = '0.50'; COMMIT;")?;
    let inherited = w.execute("DELETE FROM docs WHERE scope = $1", &[&JULY]);
    ensure!(
        sqlstate(&inherited).as_deref() == Some("5F011"),
        "{inherited:?}"
    );
    // A session-level SET before the library was ever loaded in this
    // backend (a placeholder setting), then a DELETE that loads it.
    let mut fresh = server.client_as("w")?;
    fresh.batch_execute("SET fencecheck.token = '0.50'")?;
    let placeholder = fresh.execute("DELETE FROM docs WHERE scope = $1", &[&JULY]);
    ensure!(
        sqlstate(&placeholder).as_deref() == Some("5F011"),
        "{placeholder:?}"
    );
    // A token set and rolled back to a savepoint does not count either.
    let mut tx = w.transaction()?;
    tx.batch_execute("SAVEPOINT s; SET LOCAL fencecheck.token = '0.60'; ROLLBACK TO SAVEPOINT s")?;
    let rolled_back = tx.execute("DELETE FROM docs WHERE scope = $1", &[&JULY]);
    ensure!(
        sqlstate(&rolled_back).as_deref() == Some("5F011"),
        "{rolled_back:?}"
    );
    drop(tx);
    ensure!(july(&mut db)? == untouched());
    // Within its transaction it is the token, SET or SET LOCAL alike, also
    // on a connection that had not loaded the library before the SET.
    let mut first = server.client_as("w")?;
    let mut tx = first.transaction()?;
    tx.batch_execute("SET LOCAL fencecheck.token = '0.50'")?;
    ensure!(tx.execute("DELETE FROM docs WHERE scope = $1", &[&JULY])? == 1);
    tx.commit()?;
    ensure!(july(&mut db)?.is_none());
    w.execute(
        "INSERT INTO docs (scope, body, token) VALUES ($1, 'c3', '0.51')",
        &[&JULY],
    )?;
    let mut second = server.client_as("w")?;
    let mut tx = second.transaction()?;
    tx.batch_execute("SET fencecheck.token = '0.52'")?;
    ensure!(tx.execute("DELETE FROM docs WHERE scope = $1", &[&JULY])? == 1);
    tx.commit()?;
    ensure!(july(&mut db)?.is_none());
    Ok(())
}
