//! Shared helpers for the authority tests: one runtime per test process, a
//! SQLite coordinator on a manual clock, and the seed's report catalog as the
//! protected resource.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use fencecheck::{Decision, Instance, Outcome, Request, Runtime};
use fencecheck_authority::{Client, DriftBound, ManualClock, SqliteCoordinator};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// The process-wide runtime (the component is compiled once).
pub fn runtime() -> Result<Runtime> {
    Runtime::shared().context("loading the embedded component")
}

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new, empty directory named after `tag`.
    pub fn new(tag: &str) -> Result<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("fencecheck-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    /// A path inside the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A coordinator with a manual clock at t = 0, and clients whose local
/// clocks are manual too.
pub struct World {
    pub coordinator_clock: Arc<ManualClock>,
    pub coordinator: Arc<SqliteCoordinator>,
}

impl World {
    /// A coordinator on a database file in `dir`.
    pub fn on_file(path: &Path) -> Result<Self> {
        let coordinator_clock = Arc::new(ManualClock::new(0));
        let coordinator = Arc::new(SqliteCoordinator::open(
            path,
            runtime()?,
            coordinator_clock.clone(),
        )?);
        Ok(Self {
            coordinator_clock,
            coordinator,
        })
    }

    /// A client whose local clock is `local`, with no drift allowance (the
    /// tests move both clocks explicitly).
    pub fn client(&self, local: Arc<ManualClock>) -> Client {
        Client::new(
            self.coordinator.clone(),
            local,
            DriftBound {
                ppm: 0,
                margin_ms: 0,
            },
        )
    }
}

/// The seed's report catalog: immutable staged objects, and a row per report
/// whose visible pointer moves only through the fence check.
pub struct Catalog {
    conn: Connection,
    guest: Instance,
}

const CATALOG_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS report_catalog (
    report_id      TEXT PRIMARY KEY,
    visible_object TEXT NOT NULL,
    fence_state    BLOB NOT NULL,
    writes         INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS staged_objects (
    object_key TEXT PRIMARY KEY,
    body       TEXT NOT NULL
);";

impl Catalog {
    /// Open the catalog in the database at `path` (its own connection).
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.execute_batch(CATALOG_SCHEMA)?;
        Ok(Self {
            conn,
            guest: runtime()?.instance()?,
        })
    }

    /// Stage an immutable object under a unique key (invisible until published).
    pub fn stage(&self, key: &str, body: &str) -> Result<()> {
        self.conn.execute(
            "INSERT INTO staged_objects (object_key, body) VALUES (?1, ?2)",
            params![key, body],
        )?;
        Ok(())
    }

    /// The fenced publish: read state, check, and on `applied` move the
    /// pointer and store the state, in one `BEGIN IMMEDIATE` transaction.
    /// `Err` is a transient failure (the resource's infrastructure).
    pub fn publish(&mut self, request: &Request, object_key: &str) -> Result<Outcome> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let stored: Option<Vec<u8>> = tx
            .query_row(
                "SELECT fence_state FROM report_catalog WHERE report_id = ?1",
                [&request.scope],
                |r| r.get(0),
            )
            .optional()?;
        let outcome = self.guest.check(stored.as_deref(), request)?;
        if let Ok(Decision::Applied { state, .. }) = &outcome {
            tx.execute(
                "INSERT INTO report_catalog (report_id, visible_object, fence_state)
                 VALUES (?1, ?2, ?3)
                 ON CONFLICT (report_id) DO UPDATE
                   SET visible_object = excluded.visible_object,
                       fence_state = excluded.fence_state,
                       writes = writes + 1",
                params![request.scope, object_key, state],
            )?;
            tx.commit()?;
        }
        Ok(outcome)
    }

    /// The visible object of a report and how many writes were applied.
    pub fn visible(&self, report_id: &str) -> Result<Option<(String, u64)>> {
        Ok(self
            .conn
            .query_row(
                "SELECT visible_object, writes FROM report_catalog WHERE report_id = ?1",
                [report_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// Staged objects no catalog row references: what garbage collection
    /// may delete. Returns the deleted keys.
    pub fn collect_unreferenced(&self) -> Result<Vec<String>> {
        let keys: Vec<String> = self
            .conn
            .prepare(
                "SELECT object_key FROM staged_objects
                 WHERE object_key NOT IN (SELECT visible_object FROM report_catalog)
                 ORDER BY object_key",
            )?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for key in &keys {
            self.conn
                .execute("DELETE FROM staged_objects WHERE object_key = ?1", [key])?;
        }
        Ok(keys)
    }
}
