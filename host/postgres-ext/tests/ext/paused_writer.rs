//! The seed's paused report writer against a fenced PostgreSQL table: a
//! lease coordinator on a fake clock, owners forced into the bad
//! interleaving with channels (never sleeps), and the same story in plain
//! SQL through psql.

use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::thread;

use crate::common::{PgServer, protected_catalog, row, server, sqlstate};
use anyhow::{Context, Result, bail, ensure};
use fencecheck::TokenText;
use fencecheck_authority::{
    AcquireResult, Client, DriftBound, Lease, ManualClock, SqliteCoordinator,
};

const JULY: &str = "report/july";
const TTL: u64 = 30_000;

fn acquired(result: AcquireResult) -> Result<Lease> {
    match result {
        AcquireResult::Acquired(lease) => Ok(lease),
        AcquireResult::Busy { holder, .. } => bail!("busy: held by {holder}"),
        AcquireResult::Unavailable(e) => bail!("unavailable: {e}"),
    }
}

fn publish(server: &PgServer, token: &str, object: &str) -> Result<Result<u64, postgres::Error>> {
    let mut db = server.client()?;
    Ok(db.execute(
        "UPDATE report_catalog SET visible_object = $1, fence_token = $2 WHERE report_id = $3",
        &[&object, &token, &JULY],
    ))
}

/// Owner A pauses past its lease's expiry; B acquires a newer token and
/// publishes; A resumes and publishes: PostgreSQL itself refuses A with
/// stale-fence (5F001), B stays visible, and A's lease is lost.
#[test]
fn paused_owner_is_fenced_by_the_table() -> Result<()> {
    let (server, mut db) = server()?;
    protected_catalog(&mut db, "strict")?;
    let dir = std::env::temp_dir().join(format!("fencecheck-pg-paused-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let clock = Arc::new(ManualClock::new(0));
    let runtime = fencecheck_tests::runtime()?;
    let coordinator = Arc::new(SqliteCoordinator::open(
        &dir.join("leases.db"),
        runtime,
        clock.clone(),
    )?);
    let client = |c: &Arc<SqliteCoordinator>| {
        Client::new(
            c.clone(),
            Arc::new(ManualClock::new(0)),
            DriftBound {
                ppm: 0,
                margin_ms: 0,
            },
        )
    };

    // The report exists, written under an earlier grant of the same lock.
    let first = acquired(client(&coordinator).acquire(JULY, "setup", TTL))?;
    db.execute(
        "INSERT INTO report_catalog (report_id, visible_object, fence_token) VALUES ($1, 'reports/july/draft', $2)",
        &[&JULY, &TokenText(first.token()).to_string()],
    )?;
    first.release()?;

    let (a_token_tx, a_token) = mpsc::channel::<String>();
    let (resume_a, a_paused) = mpsc::channel::<()>();
    let a_client = client(&coordinator);
    let a_server_url = server.url();
    let writer_a = thread::spawn(move || -> Result<(Option<String>, bool)> {
        let mut lease = acquired(a_client.acquire(JULY, "a7", TTL))?;
        a_token_tx.send(TokenText(lease.token()).to_string())?;
        a_paused.recv()?; // the pause: GC, VM suspension, …
        let mut db = postgres::Client::connect(&a_server_url, postgres::NoTls)?;
        let result = db.execute(
            "UPDATE report_catalog SET visible_object = 'reports/july/a7', fence_token = $1 WHERE report_id = $2",
            &[&TokenText(lease.token()).to_string(), &JULY],
        );
        Ok((sqlstate(&result), lease.renew()?))
    });

    let token_a = a_token.recv()?;
    clock.advance(TTL); // A's lease expires at the coordinator
    let lease_b = acquired(client(&coordinator).acquire(JULY, "b9", TTL))?;
    let token_b = TokenText(lease_b.token()).to_string();
    ensure!(token_b != token_a);
    ensure!(publish(&server, &token_b, "reports/july/b9")?? == 1);

    resume_a.send(())?;
    let (a_state, a_still_held) = writer_a
        .join()
        .map_err(|_| anyhow::anyhow!("writer A panicked"))??;
    ensure!(
        a_state.as_deref() == Some("5F001"),
        "A must be stale: {a_state:?}"
    );
    ensure!(!a_still_held, "A's lease expired at the coordinator");
    let (object, token, version) = row(&mut db, JULY)?.context("the report row")?;
    ensure!(object.as_deref() == Some("reports/july/b9") && token == Some(token_b) && version == 2);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The same story in plain SQL through psql (tests/sql/paused_writer.sql):
/// its output, SQLSTATEs included, is exactly the recorded one.
#[test]
fn paused_writer_in_plain_sql_through_psql() -> Result<()> {
    let (server, _db) = server()?;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sql");
    let got = server.psql(&dir.join("paused_writer.sql"))?;
    // FENCECHECK_BLESS=1 records the output after a deliberate change.
    if std::env::var_os("FENCECHECK_BLESS").is_some() {
        std::fs::write(dir.join("paused_writer.out"), &got)?;
    }
    let want = std::fs::read_to_string(dir.join("paused_writer.out"))?;
    ensure!(
        got == want,
        "psql output differs:\n--- got ---\n{got}\n--- want ---\n{want}"
    );
    Ok(())
}
