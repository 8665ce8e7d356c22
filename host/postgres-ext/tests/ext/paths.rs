//! Every other way a row of a fenced table can change, tried by a writer
//! role (`w`: SELECT, INSERT, UPDATE, DELETE on the table, and on a table of
//! its own that references it): each goes through the fence, or is refused
//! (docs/postgres.md, "Fenced tables", the path table).

use crate::common::{PgServer, server, sqlstate};
use anyhow::{Result, ensure};
use postgres::Client;

const JULY: &str = "report/july";

/// `docs` fenced, `w` a writer, `report/july` at 0.42 (as in trust.rs), and
/// `w`'s own table `notes` with a foreign key to `docs` ON DELETE CASCADE
/// on `docs`' side (`docs_refs`, owned by the superuser).
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

fn body(db: &mut Client) -> Result<Option<(String, String)>> {
    Ok(db
        .query_opt("SELECT body, token FROM docs WHERE scope = $1", &[&JULY])?
        .map(|r| (r.get(0), r.get(1))))
}

fn b9() -> Option<(String, String)> {
    Some(("b9".into(), "0.42".into()))
}

/// COPY FROM fires the row trigger for every row: re-creating a deleted
/// scope below its tombstone is 5F001 (the whole COPY, nothing kept), a row
/// carrying a state 5F011, a fresh token applies.
#[test]
fn copy_is_fenced_row_by_row() -> Result<()> {
    use std::io::Write;
    let (_server, mut db, mut w) = docs()?;
    let mut tx = w.transaction()?;
    tx.execute("SET LOCAL fencecheck.token = '0.43'", &[])?;
    tx.execute("DELETE FROM docs WHERE scope = $1", &[&JULY])?;
    tx.commit()?;
    let mut copy = |columns: &str, data: &str| -> Result<Result<u64, postgres::Error>> {
        let mut writer = w.copy_in(&format!("COPY docs ({columns}) FROM STDIN"))?;
        writer.write_all(data.as_bytes())?;
        Ok(writer.finish())
    };
    let stale = copy(
        "scope, body, token",
        "report/june\ta\t0.1\nreport/july\ta7\t0.41\n",
    )?;
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    let stated = copy(
        "scope, body, token, fence_state",
        "report/june\ta\t0.1\t\\\\x00\n",
    )?;
    ensure!(sqlstate(&stated).as_deref() == Some("5F011"), "{stated:?}");
    let rows: i64 = db.query_one("SELECT count(*) FROM docs", &[])?.get(0);
    ensure!(rows == 0, "a refused COPY keeps nothing");
    ensure!(copy("scope, body, token", "report/july\tc3\t0.44\n")?.ok() == Some(1));
    ensure!(body(&mut db)? == Some(("c3".into(), "0.44".into())));
    Ok(())
}

/// MERGE's UPDATE, INSERT and DELETE actions go through the row trigger
/// like the statements they stand for.
#[test]
fn merge_is_fenced() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    let stale = w.execute(
        "MERGE INTO docs d USING (VALUES ('report/july', 'a7', '0.41')) s(scope, body, token) ON d.scope = s.scope \
         WHEN MATCHED THEN UPDATE SET body = s.body, token = s.token \
         WHEN NOT MATCHED THEN INSERT (scope, body, token) VALUES (s.scope, s.body, s.token)",
        &[],
    );
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    let bare = w.execute(
        "MERGE INTO docs d USING (VALUES ('report/july')) s(scope) ON d.scope = s.scope \
         WHEN MATCHED THEN UPDATE SET body = 'x'",
        &[],
    );
    ensure!(sqlstate(&bare).as_deref() == Some("5F011"), "{bare:?}");
    let delete = w.execute(
        "MERGE INTO docs d USING (VALUES ('report/july')) s(scope) ON d.scope = s.scope \
         WHEN MATCHED THEN DELETE",
        &[],
    );
    ensure!(sqlstate(&delete).as_deref() == Some("5F011"), "{delete:?}");
    ensure!(body(&mut db)? == b9());
    ensure!(
        w.execute(
            "MERGE INTO docs d USING (VALUES ('report/july', 'c3', '0.43')) s(scope, body, token) ON d.scope = s.scope \
             WHEN MATCHED THEN UPDATE SET body = s.body, token = s.token",
            &[],
        )? == 1
    );
    ensure!(body(&mut db)? == Some(("c3".into(), "0.43".into())));
    Ok(())
}

/// Writable CTEs and updatable views are statements on the table: fenced.
#[test]
fn ctes_and_views_are_fenced() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute(
        "CREATE VIEW docs_view AS SELECT scope, body, token FROM docs;
         GRANT SELECT, INSERT, UPDATE, DELETE ON docs_view TO w;",
    )?;
    let attempts = [
        (
            "5F001",
            "WITH u AS (UPDATE docs SET body = 'a7', token = '0.41' RETURNING 1) SELECT count(*) FROM u",
        ),
        (
            "5F011",
            "WITH d AS (DELETE FROM docs RETURNING 1) SELECT count(*) FROM d",
        ),
        ("5F011", "UPDATE docs_view SET body = 'x'"),
        ("5F001", "UPDATE docs_view SET body = 'a7', token = '0.41'"),
        ("5F011", "DELETE FROM docs_view"),
        (
            "5F001",
            "INSERT INTO docs_view VALUES ('report/july', 'a7', '0.41') ON CONFLICT (scope) DO UPDATE SET body = EXCLUDED.body, token = EXCLUDED.token",
        ),
    ];
    for (code, sql) in attempts {
        let result = w.batch_execute(sql);
        ensure!(
            sqlstate(&result).as_deref() == Some(code),
            "{sql}: {result:?}"
        );
    }
    ensure!(body(&mut db)? == b9());
    Ok(())
}

/// A foreign key's cascade is a DELETE or UPDATE on the fenced table: it
/// needs a token too (the parent's delete fails without one, 5F011), and
/// goes through with one presented in the transaction.
#[test]
fn foreign_key_cascades_are_fenced() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute(
        "CREATE TABLE owners (name text PRIMARY KEY);
         INSERT INTO owners VALUES ('ann');
         ALTER TABLE docs ADD COLUMN owner text REFERENCES owners ON DELETE CASCADE ON UPDATE CASCADE;
         UPDATE docs SET owner = 'ann', token = '0.43';
         GRANT ALL ON owners TO w;",
    )?;
    let delete = w.execute("DELETE FROM owners", &[]);
    ensure!(sqlstate(&delete).as_deref() == Some("5F011"), "{delete:?}");
    let rename = w.execute("UPDATE owners SET name = 'bob'", &[]);
    ensure!(sqlstate(&rename).as_deref() == Some("5F011"), "{rename:?}");
    let mut tx = w.transaction()?;
    tx.execute("SET LOCAL fencecheck.token = '0.41'", &[])?;
    let stale = tx.execute("DELETE FROM owners", &[]);
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    drop(tx);
    ensure!(body(&mut db)?.is_some());
    let mut tx = w.transaction()?;
    tx.execute("SET LOCAL fencecheck.token = '0.44'", &[])?;
    ensure!(tx.execute("DELETE FROM owners", &[])? == 1);
    tx.commit()?;
    ensure!(body(&mut db)?.is_none());
    Ok(())
}

/// What a writer role cannot do at all: DDL on the table (rules, ALTER
/// TABLE, triggers off), session_replication_role (which turns triggers
/// off), TRUNCATE, and reading the extension's own tables.
#[test]
fn a_writer_has_no_other_way_in() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute("GRANT TRUNCATE ON docs TO w")?;
    let attempts = [
        (
            "42501",
            "CREATE RULE r AS ON UPDATE TO docs DO INSTEAD NOTHING",
        ),
        (
            "42501",
            "ALTER TABLE docs DISABLE TRIGGER zz_fencecheck_row",
        ),
        ("42501", "ALTER TABLE docs DISABLE TRIGGER ALL"),
        (
            "42501",
            "ALTER TABLE docs ALTER COLUMN token TYPE bytea USING token::bytea",
        ),
        ("42501", "DROP TRIGGER zz_fencecheck_row ON docs"),
        ("42501", "SET session_replication_role = replica"),
        ("5F011", "TRUNCATE docs"),
        ("42501", "SELECT * FROM fencecheck.keys"),
        ("42501", "SELECT * FROM fencecheck.tombstones"),
        ("42501", "DELETE FROM fencecheck.tombstones"),
        (
            "42501",
            "INSERT INTO fencecheck.protected VALUES ('docs', 'body', 'token', 'fence_state', 'strict')",
        ),
        ("42501", "DELETE FROM fencecheck.protected"),
        (
            "42501",
            "SELECT fencecheck.protect('docs', 'scope', 'token', 'fence_state', 'allow-equal', 10)",
        ),
        ("42501", "SELECT fencecheck.unprotect('docs', 10)"),
    ];
    for (code, sql) in attempts {
        let result = w.batch_execute(sql);
        ensure!(
            sqlstate(&result).as_deref() == Some(code),
            "{sql}: {result:?}"
        );
    }
    // What it may read: which tables are fenced, and how.
    let fenced: i64 = w
        .query_one("SELECT count(*) FROM fencecheck.protected", &[])?
        .get(0);
    ensure!(fenced == 1);
    ensure!(body(&mut db)? == b9());
    Ok(())
}

/// The owner's own DDL that keeps the table sound goes through: a new
/// column, a rename of the table, a BEFORE trigger that sorts before the
/// fence; fence_protect again changes the policy; fence_unprotect removes
/// the fence (then writes are unfenced, as asked), and dropping a fenced
/// table forgets it.
#[test]
fn the_owner_keeps_ordinary_ddl() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    db.batch_execute(
        "ALTER TABLE docs ADD COLUMN note text;
         ALTER TABLE docs RENAME TO papers;
         CREATE INDEX ON papers (body);
         SELECT fence_protect('papers', 'scope', 'token', 'fence_state', 'allow-equal');",
    )?;
    let policy: String = db
        .query_one(
            "SELECT policy FROM fencecheck.protected WHERE relid = 'papers'::regclass",
            &[],
        )?
        .get(0);
    ensure!(policy == "allow-equal");
    let stale = w.execute(
        "UPDATE papers SET body = 'a7', token = '0.41' WHERE scope = $1",
        &[&JULY],
    );
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    let rename = db.batch_execute("ALTER TABLE papers RENAME COLUMN token TO fence_token");
    ensure!(sqlstate(&rename).as_deref() == Some("5F016"), "{rename:?}");
    db.batch_execute("SELECT fence_unprotect('papers')")?;
    ensure!(w.execute("UPDATE papers SET body = 'free'", &[])? == 1);
    db.batch_execute(
        "SELECT fence_protect('papers', 'scope', 'token', 'fence_state');
         DROP TABLE papers;",
    )?;
    let left: i64 = db
        .query_one("SELECT count(*) FROM fencecheck.protected", &[])?
        .get(0);
    ensure!(left == 0, "a dropped table is forgotten");
    Ok(())
}

/// A table owner who is not a superuser fences its own table, adds a
/// trigger that fires before the fence, and unprotects it; another role's
/// fence_protect of that table is 42501.
#[test]
fn an_owner_who_is_not_a_superuser_fences_its_own_table() -> Result<()> {
    let (server, mut db, mut w) = docs()?;
    db.batch_execute(
        "CREATE ROLE o LOGIN;
         GRANT CREATE ON SCHEMA public TO o;",
    )?;
    let mut o = server.client_as("o")?;
    o.batch_execute(
        "CREATE TABLE mine (scope text PRIMARY KEY, body text, token text, fence_state bytea);
         SELECT fence_protect('mine', 'scope', 'token', 'fence_state');
         INSERT INTO mine (scope, body, token) VALUES ('a', 'x', '0.5');
         CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS
             $$BEGIN NEW.body := NEW.body || '!'; RETURN NEW; END$$;
         CREATE TRIGGER set_body BEFORE UPDATE ON mine FOR EACH ROW EXECUTE FUNCTION stamp();
         GRANT SELECT, INSERT, UPDATE, DELETE ON mine TO w;",
    )?;
    let stale = w.execute("UPDATE mine SET body = 'y', token = '0.4'", &[]);
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    ensure!(w.execute("UPDATE mine SET body = 'y', token = '0.6'", &[])? == 1);
    let not_theirs = w.batch_execute("SELECT fence_unprotect('mine')");
    ensure!(
        sqlstate(&not_theirs).as_deref() == Some("42501"),
        "{not_theirs:?}"
    );
    let not_mine = o.batch_execute("SELECT fence_unprotect('docs')");
    ensure!(
        sqlstate(&not_mine).as_deref() == Some("42501"),
        "{not_mine:?}"
    );
    o.batch_execute("SELECT fence_unprotect('mine')")?;
    ensure!(w.execute("UPDATE mine SET body = 'z'", &[])? == 1);
    ensure!(body(&mut db)? == b9());
    Ok(())
}

/// `DROP EXTENSION fencecheck CASCADE` with fenced tables in place drops
/// their triggers with it (the tables stay, unfenced, as the operator
/// asked); a temporary table cannot be fenced (its marks would end with
/// the session).
#[test]
fn drop_extension_cascade_and_temporary_tables() -> Result<()> {
    let (_server, mut db, mut w) = docs()?;
    let temp = w.batch_execute(
        "CREATE TEMP TABLE scratch (scope text PRIMARY KEY, token text, st bytea);
         SELECT fence_protect('scratch', 'scope', 'token', 'st');",
    );
    ensure!(sqlstate(&temp).as_deref() == Some("5F012"), "{temp:?}");
    db.batch_execute("DROP EXTENSION fencecheck CASCADE")?;
    let triggers: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'docs'::regclass",
            &[],
        )?
        .get(0);
    ensure!(triggers == 0, "{triggers} triggers left");
    ensure!(w.execute("UPDATE docs SET body = 'free'", &[])? == 1);
    Ok(())
}
