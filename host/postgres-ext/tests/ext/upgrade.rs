//! Versions of the extension's SQL: `ALTER EXTENSION fencecheck UPDATE`
//! from 0.1.0, 0.1.1 and 0.1.2 (their install scripts as they shipped, in
//! tests/sql/) fences their tables the way a fresh install does, with its
//! hints, and ends with the objects a fresh install makes; and
//! pg_dump/restore keeps a fenced table fenced.

use std::path::PathBuf;
use std::process::Command;

use crate::common::{PgServer, message, sqlstate};
use crate::hints::refused_pointing_at;
use anyhow::{Context, Result, bail, ensure};
use postgres::Client;

const JULY: &str = "report/july";
const OLD: [&str; 3] = ["0.1.0", "0.1.1", "0.1.2"];
/// The versions whose SQL the current library does not trust (their fenced
/// tables refuse every row until the update); 0.1.2's it serves as is.
const UNTRUSTED: [&str; 2] = ["0.1.0", "0.1.1"];

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
/// installed before would have them. Each lands whole (written aside, then
/// renamed): tests running at once may be reading it.
fn install_old_scripts() -> Result<()> {
    let dir = PathBuf::from(pg_config("--sharedir")?).join("extension");
    for version in OLD {
        let name = format!("fencecheck--{version}.sql");
        let from = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/sql")
            .join(&name);
        let text = std::fs::read(&from).with_context(|| format!("reading {}", from.display()))?;
        let to = dir.join(&name);
        if std::fs::read(&to).ok().as_ref() == Some(&text) {
            continue;
        }
        let aside = dir.join(format!(
            ".{name}.{}.{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&aside, &text)
            .and_then(|()| std::fs::rename(&aside, &to))
            .with_context(|| format!("installing {} into {}", from.display(), dir.display()))?;
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

/// The 0.1.1 -> 0.1.2 script holds the protect.sql 0.1.2 shipped (the
/// tail of its install script) verbatim: that install and that update
/// defined the new objects from one text.
#[test]
fn the_0_1_2_update_carries_its_protect_sql() -> Result<()> {
    let shipped = include_str!("../sql/fencecheck--0.1.2.sql");
    let start = shipped
        .find("-- Fenced tables (0.1.2)")
        .context("tests/sql/fencecheck--0.1.2.sql has no protect.sql part")?;
    let upgrade = include_str!("../../sql/fencecheck--0.1.1--0.1.2.sql");
    ensure!(
        upgrade.contains(shipped[start..].trim_end()),
        "sql/fencecheck--0.1.1--0.1.2.sql must hold 0.1.2's sql/protect.sql verbatim"
    );
    Ok(())
}

/// The function `name` as `sql` defines it: from its CREATE to the end of
/// its `$fn$` body.
fn definition<'a>(sql: &'a str, create: &str, name: &str) -> Result<&'a str> {
    let head = format!("{create} {name}(");
    let start = sql.find(&head).with_context(|| format!("no {head}"))?;
    let end = sql[start..]
        .find("$fn$;\n")
        .with_context(|| format!("{name} has no $fn$ body"))?;
    Ok(&sql[start + create.len()..start + end])
}

/// The 0.1.2 -> 0.1.3 script defines each function it replaces exactly as
/// sql/protect.sql does (CREATE OR REPLACE for CREATE), and does nothing
/// else.
#[test]
fn the_0_1_3_update_carries_protect_sql_definitions() -> Result<()> {
    let protect = include_str!("../../sql/protect.sql");
    let upgrade = include_str!("../../sql/fencecheck--0.1.2--0.1.3.sql");
    let replaced: Vec<&str> = upgrade
        .match_indices("CREATE OR REPLACE FUNCTION ")
        .filter_map(|(i, m)| upgrade[i + m.len()..].split('(').next())
        .collect();
    ensure!(
        replaced == ["fencecheck.protect", "fencecheck.guard"],
        "{replaced:?}"
    );
    let mut rest = upgrade.to_string();
    for name in replaced {
        let replacing = definition(upgrade, "CREATE OR REPLACE FUNCTION", name)?;
        ensure!(
            replacing == definition(protect, "CREATE FUNCTION", name)?,
            "{name} differs from sql/protect.sql's"
        );
        rest = rest.replace(&format!("CREATE OR REPLACE FUNCTION{replacing}$fn$;\n"), "");
    }
    // Besides them, comments only.
    ensure!(
        rest.lines()
            .all(|l| l.trim().is_empty() || l.starts_with("--")),
        "the update does more than replace the functions: {rest}"
    );
    Ok(())
}

/// From each old version: its tables fenced with its own fence_protect, a
/// tombstone, a partitioned table 0.1.0/0.1.1 accepted; then the new
/// library is installed (writes to 0.1.0/0.1.1 tables are refused until the
/// SQL is updated: 5F016 naming ALTER EXTENSION, its hint the guide's
/// upgrading section; 0.1.2's keep working), and ALTER EXTENSION UPDATE
/// fences the plain table the current way (its marks and tombstones kept,
/// the trigger renamed, writers kept out) and leaves the partitioned one
/// refusing every write, with a warning naming it.
#[test]
fn alter_extension_update_refences_every_table() -> Result<()> {
    install_old_scripts()?;
    for old in OLD {
        let server = PgServer::start()?;
        let mut db = server.client()?;
        let untrusted = UNTRUSTED.contains(&old);
        db.batch_execute(&format!(
            "CREATE EXTENSION fencecheck VERSION '{old}';
             CREATE TABLE docs (scope text PRIMARY KEY, body text, token text, fence_state bytea);
             SELECT fence_protect('docs', 'scope', 'token', 'fence_state');
             CREATE ROLE w LOGIN;
             GRANT ALL ON docs TO w;"
        ))?;
        if untrusted {
            // 0.1.2 and later refuse to fence a partitioned table.
            db.batch_execute(
                "CREATE TABLE parts (scope text PRIMARY KEY, body text, token text, fence_state bytea)
                     PARTITION BY LIST (scope);
                 CREATE TABLE parts_a PARTITION OF parts FOR VALUES IN ('a');
                 SELECT fence_protect('parts', 'scope', 'token', 'fence_state');",
            )?;
        }
        ensure!(version(&mut db)? == old);
        let early = db.execute(
            "INSERT INTO docs (scope, body, token) VALUES ('report/early', 'a', '0.40')",
            &[],
        );
        if untrusted {
            // The library serving old SQL: nothing to trust, every row refused.
            refused_pointing_at(old, &early, "5F016", "upgrading")?;
            ensure!(
                message(&early).contains("ALTER EXTENSION fencecheck UPDATE"),
                "{old}: {}",
                message(&early)
            );
        } else {
            ensure!(early.as_ref().ok() == Some(&1), "{old}: {early:?}");
        }

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
        if untrusted {
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
    }
    Ok(())
}

/// After ALTER EXTENSION UPDATE from each old version, a table fenced
/// before refuses like one fenced by a fresh install, with the hints that
/// name docs/postgres.md's sections: stale-fence from the library, the
/// DDL guard's from the replaced SQL function, fence_protect's refusal of
/// a table it cannot fence.
#[test]
fn updated_installs_hint_like_fresh_ones() -> Result<()> {
    install_old_scripts()?;
    for old in OLD {
        let server = PgServer::start()?;
        let mut db = server.client()?;
        db.batch_execute(&format!(
            "CREATE EXTENSION fencecheck VERSION '{old}';
             CREATE TABLE docs (scope text PRIMARY KEY, body text, token text, fence_state bytea);
             SELECT fence_protect('docs', 'scope', 'token', 'fence_state');
             CREATE TABLE loose (scope text, token text, fence_state bytea);
             ALTER EXTENSION fencecheck UPDATE;"
        ))?;
        ensure!(version(&mut db)? == env!("CARGO_PKG_VERSION"));
        ensure!(
            db.execute(
                "INSERT INTO docs (scope, body, token) VALUES ($1, 'b9', '0.42')",
                &[&JULY]
            )? == 1
        );
        refused_pointing_at(
            old,
            &db.execute("UPDATE docs SET body = 'a7', token = '0.41'", &[]),
            "5F001",
            "sqlstates",
        )?;
        refused_pointing_at(
            old,
            &db.execute("ALTER TABLE docs RENAME COLUMN token TO lease_token", &[]),
            "5F016",
            "changing-a-fenced-table",
        )?;
        refused_pointing_at(
            old,
            &db.execute(
                "SELECT fence_protect('loose', 'scope', 'token', 'fence_state')",
                &[],
            ),
            "5F012",
            "fenced-tables",
        )?;
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

/// CREATE EXTENSION at the current version and CREATE EXTENSION at 0.1.0,
/// 0.1.1 or 0.1.2 then ALTER EXTENSION UPDATE end with the same objects,
/// definitions (hint texts included) and privileges.
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
