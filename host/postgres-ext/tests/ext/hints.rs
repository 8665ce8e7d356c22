//! The extension's hints, as a client receives them from a real server:
//! each names the section of docs/postgres.md that says what to do
//! (scripts/check-links holds those anchors to the guide's headings), and
//! the remedy the "Changing a fenced table" section gives works.

use crate::common::{hint, protected_catalog, server, sqlstate};
use anyhow::{Result, ensure};
use fencecheck_tests::pgserver::wait_for_lock_waiter;
use postgres::Client;

const JULY: &str = "report/july";
const JUNE: &str = "report/june";

/// The fenced catalog with July at 0.42 and June deleted at 0.51 (its
/// tombstone holds the mark).
fn catalog_with_marks(db: &mut Client) -> Result<()> {
    protected_catalog(db, "strict")?;
    db.batch_execute(
        "INSERT INTO report_catalog (report_id, visible_object, fence_token)
             VALUES ('report/july', 'b9', '0.42'), ('report/june', 'j', '0.50');
         BEGIN; SET LOCAL fencecheck.token = '0.51';
         DELETE FROM report_catalog WHERE report_id = 'report/june'; COMMIT;",
    )?;
    Ok(())
}

fn stale_update(db: &mut Client) -> Result<u64, postgres::Error> {
    db.execute(
        "UPDATE report_catalog SET visible_object = 'a7', fence_token = '0.41' WHERE report_id = $1",
        &[&JULY],
    )
}

/// Expect `result` to fail with `code` and a hint naming `anchor` of
/// docs/postgres.md.
pub(crate) fn refused_pointing_at<T: std::fmt::Debug>(
    what: &str,
    result: &Result<T, postgres::Error>,
    code: &str,
    anchor: &str,
) -> Result<()> {
    ensure!(
        sqlstate(result).as_deref() == Some(code),
        "{what}: {result:?}"
    );
    let link = format!("(docs/postgres.md#{anchor})");
    ensure!(
        hint(result).ends_with(&link),
        "{what}: hint {:?} does not end with {link}",
        hint(result)
    );
    Ok(())
}

/// Every hint the extension raises, from the library and from its SQL,
/// reaches the client naming its section: stale-fence, fence-required
/// (UPDATE without token, TRUNCATE), fence_protect's refusal of a table it
/// cannot fence (a hint 0.1.2 lost on the way out), the DDL guard, a table
/// changed behind the guard; and the settings' descriptions.
#[test]
fn every_hint_names_its_section() -> Result<()> {
    let (_server, mut db) = server()?;
    catalog_with_marks(&mut db)?;
    refused_pointing_at("stale", &stale_update(&mut db), "5F001", "sqlstates")?;
    refused_pointing_at(
        "no token",
        &db.execute("UPDATE report_catalog SET visible_object = 'x'", &[]),
        "5F011",
        "fenced-tables",
    )?;
    refused_pointing_at(
        "truncate",
        &db.execute("TRUNCATE report_catalog", &[]),
        "5F011",
        "fenced-tables",
    )?;
    db.batch_execute("CREATE TABLE loose (scope text, token text, fence_state bytea)")?;
    refused_pointing_at(
        "fence_protect",
        &db.execute(
            "SELECT fence_protect('loose', 'scope', 'token', 'fence_state')",
            &[],
        ),
        "5F012",
        "fenced-tables",
    )?;
    refused_pointing_at(
        "guard",
        &db.execute(
            "ALTER TABLE report_catalog RENAME COLUMN fence_token TO lease_token",
            &[],
        ),
        "5F016",
        "changing-a-fenced-table",
    )?;
    // Behind the guard (a superuser turned it off): every write refused.
    db.batch_execute(
        "ALTER EVENT TRIGGER fencecheck_guard DISABLE;
         ALTER TABLE report_catalog RENAME COLUMN fence_token TO lease_token;
         ALTER EVENT TRIGGER fencecheck_guard ENABLE;",
    )?;
    refused_pointing_at(
        "behind the guard",
        &db.execute(
            "UPDATE report_catalog SET visible_object = 'c3', lease_token = '0.43'",
            &[],
        ),
        "5F016",
        "changing-a-fenced-table",
    )?;
    for setting in [
        "fencecheck.token",
        "fencecheck.op_id",
        "fencecheck.expected_version",
    ] {
        let extra: String = db
            .query_one(
                "SELECT extra_desc FROM pg_settings WHERE name = $1",
                &[&setting],
            )?
            .get(0);
        ensure!(
            extra.ends_with("(docs/postgres.md#settings)."),
            "{setting}: {extra:?}"
        );
    }
    Ok(())
}

/// The remedy the hint points at: fence_unprotect, the change (a fenced
/// column renamed), fence_protect in one transaction. A writer that comes
/// after fence_unprotect without a token waits for the commit and is then
/// refused (5F011); the row's kept state still makes an older token stale
/// and a deleted scope's tombstone still holds its mark; writes present
/// their token in the renamed column.
#[test]
fn changing_a_fenced_table_keeps_its_marks() -> Result<()> {
    let (server, mut db) = server()?;
    catalog_with_marks(&mut db)?;
    db.batch_execute("BEGIN; SELECT fence_unprotect('report_catalog');")?;
    let mut writer = server.client()?;
    // A write with no token: it would land on the unfenced table.
    let unfenced = std::thread::spawn(move || {
        sqlstate(&writer.execute(
            "UPDATE report_catalog SET visible_object = 'unfenced' WHERE report_id = $1",
            &[&JULY],
        ))
    });
    // Another session watches: this one's view of pg_stat_activity is
    // fixed for its transaction.
    wait_for_lock_waiter(&mut server.client()?)?;
    db.batch_execute(
        "ALTER TABLE report_catalog RENAME COLUMN fence_token TO lease_token;
         SELECT fence_protect('report_catalog', 'report_id', 'lease_token', 'fence_state');
         COMMIT;",
    )?;
    let unfenced = unfenced
        .join()
        .map_err(|_| anyhow::anyhow!("the writer's thread panicked"))?;
    ensure!(
        unfenced.as_deref() == Some("5F011"),
        "the writer that waited: {unfenced:?}"
    );
    let back = db.execute(
        "INSERT INTO report_catalog (report_id, visible_object, lease_token) VALUES ($1, 'old', '0.49')",
        &[&JUNE],
    );
    ensure!(sqlstate(&back).as_deref() == Some("5F001"), "{back:?}");
    let stale = db.execute(
        "UPDATE report_catalog SET visible_object = 'a7', lease_token = '0.41' WHERE report_id = $1",
        &[&JULY],
    );
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    ensure!(
        db.execute(
            "UPDATE report_catalog SET visible_object = 'c3', lease_token = '0.43' WHERE report_id = $1",
            &[&JULY]
        )? == 1
    );
    Ok(())
}
