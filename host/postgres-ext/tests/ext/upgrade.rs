//! Versions of the extension's SQL: `ALTER EXTENSION fencecheck UPDATE`
//! from 0.1.0 and 0.1.1 (their install scripts as they shipped, in
//! tests/sql/) fences their tables the 0.1.2 way and ends with the objects
//! a fresh install makes; and pg_dump/restore keeps a fenced table fenced.

use std::path::PathBuf;
use std::process::Command;

use crate::common::{PgServer, message, sqlstate};
use anyhow::{Context, Result, bail, ensure};
use postgres::Client;

const JULY: &str = "report/july";
const OLD: [&str; 2] = ["0.1.0", "0.1.1"];

fn pg_config(arg: &str) -> Result<String> {
    let pg_config = std::env::var("PG_CONFIG").unwrap_or_else(|_| "pg_config".into());
    let out = Command::new(&pg_config)
        .arg(arg)
        .output()
        .with_context(|| format!("running {pg_config} {arg}"))?;
    ensure!(out.status.success(), "{pg_config} {arg} failed");
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Put the old versions' install scripts beside the installed extension
/// (PostgreSQL finds `fencecheck--V.sql` there), as a server that had them
/// installed before would have them.
fn install_old_scripts() -> Result<()> {
    let dir = PathBuf::from(pg_config("--sharedir")?).join("extension");
    for version in OLD {
        let name = format!("fencecheck--{version}.sql");
        let from = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/sql")
            .join(&name);
        std::fs::copy(&from, dir.join(&name))
            .with_context(|| format!("copying {} into {}", from.display(), dir.display()))?;
    }
    Ok(())
}

fn version(db: &mut Client) -> Result<String> {
    Ok(db
        .query_one(
            "SELECT extversion FROM pg_extension WHERE extname = 'fencecheck'",
            &[],
        )?
        .get(0))
}

/// The upgrade script holds sql/protect.sql verbatim: the fresh install and
/// the upgrade define the new objects from one text.
#[test]
fn the_upgrade_script_carries_protect_sql() -> Result<()> {
    let protect = include_str!("../../sql/protect.sql");
    let upgrade = include_str!("../../sql/fencecheck--0.1.1--0.1.2.sql");
    ensure!(
        upgrade.contains(protect),
        "sql/fencecheck--0.1.1--0.1.2.sql must hold sql/protect.sql verbatim"
    );
    Ok(())
}

/// From each old version: its tables fenced with its own fence_protect, a
/// tombstone, a partitioned table 0.1.0/0.1.1 accepted; then the new
/// library is installed (writes to the old tables are refused until the SQL
/// is updated: 5F016 naming ALTER EXTENSION), and ALTER EXTENSION UPDATE
/// fences the plain table the 0.1.2 way (its marks and tombstones kept,
/// the trigger renamed, writers kept out) and leaves the partitioned one
/// refusing every write, with a warning naming it.
#[test]
fn alter_extension_update_refences_every_table() -> Result<()> {
    install_old_scripts()?;
    for old in OLD {
        let server = PgServer::start()?;
        let mut db = server.client()?;
        db.batch_execute(&format!(
            "CREATE EXTENSION fencecheck VERSION '{old}';
             CREATE TABLE docs (scope text PRIMARY KEY, body text, token text, fence_state bytea);
             SELECT fence_protect('docs', 'scope', 'token', 'fence_state');
             CREATE TABLE parts (scope text PRIMARY KEY, body text, token text, fence_state bytea)
                 PARTITION BY LIST (scope);
             CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN ('a');
             SELECT fence_protect('parts', 'scope', 'token', 'fence_state');
             CREATE ROLE w LOGIN;
             GRANT ALL ON docs TO w;"
        ))?;
        ensure!(version(&mut db)? == old);
        // The library serving old SQL: nothing to trust, every row refused.
        let early = db.execute(
            "INSERT INTO docs (scope, body, token) VALUES ($1, 'a', '0.40')",
            &[&JULY],
        );
        ensure!(
            sqlstate(&early).as_deref() == Some("5F016"),
            "{old}: {early:?}"
        );
        ensure!(
            message(&early).contains("ALTER EXTENSION fencecheck UPDATE"),
            "{old}: {}",
            message(&early)
        );

        db.batch_execute("ALTER EXTENSION fencecheck UPDATE")?;
        ensure!(version(&mut db)? == env!("CARGO_PKG_VERSION"));
        let mut w = server.client_as("w")?;
        ensure!(
            w.execute(
                "INSERT INTO docs (scope, body, token) VALUES ($1, 'b9', '0.42')",
                &[&JULY]
            )? == 1
        );
        let stale = w.execute("UPDATE docs SET body = 'a7', token = '0.41'", &[]);
        ensure!(
            sqlstate(&stale).as_deref() == Some("5F001"),
            "{old}: {stale:?}"
        );
        let triggers: Vec<String> = db
            .query(
                "SELECT tgname::text FROM pg_trigger WHERE tgrelid = 'docs'::regclass ORDER BY 1",
                &[],
            )?
            .iter()
            .map(|r| r.get(0))
            .collect();
        ensure!(
            triggers
                == [
                    "fencecheck_inserted",
                    "fencecheck_truncate",
                    "zz_fencecheck_row"
                ],
            "{old}: {triggers:?}"
        );
        let replace = w.batch_execute(
            "CREATE OR REPLACE TRIGGER zz_fencecheck_row BEFORE INSERT OR UPDATE OR DELETE ON docs \
             FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        );
        ensure!(
            sqlstate(&replace).as_deref() == Some("42501"),
            "{old}: {replace:?}"
        );
        let part = db.execute(
            "INSERT INTO parts (scope, body, token) VALUES ('a', 'x', '0.1')",
            &[],
        );
        ensure!(
            sqlstate(&part).as_deref() == Some("5F016"),
            "{old}: {part:?}"
        );
        ensure!(
            server
                .log()
                .contains("parts refuses every write until it is fenced soundly"),
            "{old}: no warning named the partitioned table"
        );
    }
    Ok(())
}

/// The extension's objects, each with its definition and privileges, as
/// one sorted list: what must be equal between installs.
fn objects(db: &mut Client) -> Result<Vec<String>> {
    let rows = db.query(
        "SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ' = ' || coalesce(
             CASE d.classid
               WHEN 'pg_proc'::regclass THEN
                 (SELECT pg_get_functiondef(p.oid) || ' ' || coalesce(p.proacl::text, '') FROM pg_proc p WHERE p.oid = d.objid)
               WHEN 'pg_class'::regclass THEN
                 (SELECT c.relkind::text || ' ' || coalesce(c.relacl::text, '') || ' ' || coalesce(pg_get_viewdef(c.oid), '') || ' ' ||
                         coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END, ', ' ORDER BY a.attnum)
                                     FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '') || ' ' ||
                         coalesce((SELECT string_agg(pg_get_constraintdef(k.oid), ', ' ORDER BY k.conname) FROM pg_constraint k WHERE k.conrelid = c.oid), '') || ' ' ||
                         coalesce((SELECT string_agg(pg_get_triggerdef(t.oid), ', ' ORDER BY t.tgname) FROM pg_trigger t WHERE t.tgrelid = c.oid), '')
                    FROM pg_class c WHERE c.oid = d.objid)
               WHEN 'pg_event_trigger'::regclass THEN
                 (SELECT e.evtevent || ' ' || e.evtfoid::regproc::text || ' ' || e.evtenabled::text || ' ' || coalesce(e.evttags::text, '') FROM pg_event_trigger e WHERE e.oid = d.objid)
               ELSE '' END, '')
           FROM pg_depend d
          WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
            AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'fencecheck')
          ORDER BY 1",
        &[],
    )?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// CREATE EXTENSION at 0.1.2 and CREATE EXTENSION at 0.1.0 or 0.1.1 then
/// ALTER EXTENSION UPDATE end with the same objects, definitions and
/// privileges.
#[test]
fn fresh_and_updated_installs_are_the_same() -> Result<()> {
    install_old_scripts()?;
    let server = PgServer::start()?;
    let mut db = server.client()?;
    db.batch_execute("CREATE EXTENSION fencecheck")?;
    let fresh = objects(&mut db)?;
    ensure!(fresh.len() > 20, "{fresh:?}");
    for old in OLD {
        db.batch_execute(&format!(
            "DROP EXTENSION fencecheck; CREATE EXTENSION fencecheck VERSION '{old}'; ALTER EXTENSION fencecheck UPDATE"
        ))?;
        let updated = objects(&mut db)?;
        for (a, b) in fresh.iter().zip(&updated) {
            if a != b {
                bail!("from {old}, an object differs:\nfresh:   {a}\nupdated: {b}");
            }
        }
        ensure!(
            fresh.len() == updated.len(),
            "from {old}: {} objects, fresh {}",
            updated.len(),
            fresh.len()
        );
    }
    Ok(())
}

/// pg_dump and a restore into a new database keep the fence: the registry,
/// the triggers, the tombstones and the keys come back, a stale write is
/// still refused and a deleted scope still cannot come back below its mark.
#[test]
fn dump_and_restore_keep_the_fence() -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    db.batch_execute(
        "CREATE EXTENSION fencecheck;
         CREATE TABLE docs (scope text PRIMARY KEY, body text, token text, fence_state bytea);
         SELECT fence_protect('docs', 'scope', 'token', 'fence_state');
         INSERT INTO docs (scope, body, token) VALUES ('report/july', 'b9', '0.42'), ('report/june', 'j', '0.50');
         BEGIN; SET LOCAL fencecheck.token = '0.51'; DELETE FROM docs WHERE scope = 'report/june'; COMMIT;",
    )?;
    db.execute("CREATE DATABASE restored", &[])?;
    let dump = server.root().join("dump.sql");
    let port = server.port().to_string();
    let common = ["-h", "127.0.0.1", "-p", port.as_str(), "-U", "postgres"];
    let out = server
        .tool("pg_dump")
        .args(common)
        .args(["-d", "postgres", "-f"])
        .arg(&dump)
        .output()?;
    ensure!(
        out.status.success(),
        "pg_dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = server
        .tool("psql")
        .args(common)
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", "restored", "-f"])
        .arg(&dump)
        .output()?;
    ensure!(
        out.status.success(),
        "restore: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let url = server.url().replace("dbname=postgres", "dbname=restored");
    let mut restored = postgres::Client::connect(&url, postgres::NoTls)?;
    let registered: i64 = restored
        .query_one(
            "SELECT count(*) FROM fencecheck.protected WHERE relid = 'docs'::regclass",
            &[],
        )?
        .get(0);
    ensure!(registered == 1);
    let stale = restored.execute("UPDATE docs SET body = 'a7', token = '0.41'", &[]);
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    let back = restored.execute(
        "INSERT INTO docs (scope, body, token) VALUES ('report/june', 'old', '0.50')",
        &[],
    );
    ensure!(sqlstate(&back).as_deref() == Some("5F001"), "{back:?}");
    ensure!(restored.execute("UPDATE docs SET body = 'c3', token = '0.43'", &[])? == 1);
    Ok(())
}
