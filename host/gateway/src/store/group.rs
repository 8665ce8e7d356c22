//! Group commit for SQLite: publishes commit with `synchronous=NORMAL` (in
//! WAL mode: their frames are written, not fsynced) and each then waits
//! until an fsync of the WAL file covers it. One publisher at a time runs
//! that fsync for every commit written before it started, so the publishes
//! that arrive together share one fsync, and none is answered before its
//! commit is on disk. Each publish is still its own transaction, its own
//! check and its own answer.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use crate::error::Error;

struct State {
    /// Commits written (numbered in commit order).
    written: u64,
    /// Commits known durable.
    synced: u64,
    /// Whether someone is syncing now.
    syncing: bool,
}

pub(crate) struct GroupSync {
    db: PathBuf,
    state: Mutex<State>,
    done: Condvar,
    /// fsyncs run (tests).
    syncs: AtomicU64,
}

fn poisoned() -> Error {
    Error::Task("the group commit lock is poisoned".into())
}

impl GroupSync {
    pub fn new(db: PathBuf) -> Self {
        Self {
            db,
            state: Mutex::new(State {
                written: 0,
                synced: 0,
                syncing: false,
            }),
            done: Condvar::new(),
            syncs: AtomicU64::new(0),
        }
    }

    /// A commit was written; its number. Call under the writer's turn,
    /// right after the commit, so numbers follow commit order.
    pub fn wrote(&self) -> Result<u64, Error> {
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        state.written += 1;
        Ok(state.written)
    }

    /// Return once commit `seq` is durable, syncing if nobody is.
    pub fn sync_through(&self, seq: u64) -> Result<(), Error> {
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        loop {
            if state.synced >= seq {
                return Ok(());
            }
            if state.syncing {
                state = self.done.wait(state).map_err(|_| poisoned())?;
                continue;
            }
            state.syncing = true;
            let target = state.written;
            drop(state);
            let result = self.fsync();
            state = self.state.lock().map_err(|_| poisoned())?;
            state.syncing = false;
            if result.is_ok() {
                state.synced = state.synced.max(target);
            }
            self.done.notify_all();
            result?;
        }
    }

    /// fsync the WAL (where NORMAL commits wait for a checkpoint); if there
    /// is none, everything is in the database file: sync that.
    fn fsync(&self) -> Result<(), Error> {
        let mut wal = self.db.clone().into_os_string();
        wal.push("-wal");
        let file = match std::fs::File::open(&wal) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::File::open(&self.db),
            other => other,
        };
        self.syncs.fetch_add(1, Ordering::Relaxed);
        file.and_then(|f| f.sync_data()).map_err(Error::Unsynced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commits written before a sync starts share it: three commits, one
    /// fsync; a commit after it needs (and starts) another.
    #[test]
    fn commits_share_a_sync() -> Result<(), Error> {
        let dir = tempfile::tempdir().map_err(Error::Unsynced)?;
        let db = dir.path().join("x.db");
        std::fs::write(&db, b"").map_err(Error::Unsynced)?;
        let g = GroupSync::new(db);
        let seqs = [g.wrote()?, g.wrote()?, g.wrote()?];
        assert_eq!(seqs, [1, 2, 3]);
        g.sync_through(1)?;
        g.sync_through(3)?;
        g.sync_through(2)?;
        assert_eq!(g.syncs.load(Ordering::Relaxed), 1);
        let four = g.wrote()?;
        g.sync_through(four)?;
        assert_eq!(g.syncs.load(Ordering::Relaxed), 2);
        Ok(())
    }
}
