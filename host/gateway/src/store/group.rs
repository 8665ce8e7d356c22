//! Group commit for SQLite: the writes of concurrent requests run in
//! batches on one connection, each write still its own transaction, check
//! and answer; a batch's commits use `synchronous=NORMAL` (in WAL mode:
//! their frames are written, not fsynced), then one fsync of the WAL covers
//! every commit of the batch, and no publish is answered before it. While
//! one thread runs a batch (the combiner), writes that arrive queue for the
//! next; the combiner runs batches until the queue is empty, handing each
//! batch's publishes to a sync thread, which answers them after an fsync
//! that started after their commits (batches that reach it during one
//! fsync share the next). So 64 writers cost one lock round per batch
//! instead of a convoy through the writer mutex, commits go on while the
//! WAL is synced, and there is one fsync per group of batches instead of
//! one per publish.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use fencecheck::Instance;

use super::pool::{Conn, Pool};
use crate::error::Error;

/// Called with the batch's fsync outcome; sends the waiter its answer.
type Finish = Box<dyn FnOnce(Result<(), &std::io::Error>) + Send>;

/// What a queued write does with the batch's connection (or, if no
/// connection could be had, with that error): `Some` if it committed
/// something that must be durable before its answer; `failed` if it left
/// an infrastructure error (the connection is then not reused).
type Job = Box<dyn FnOnce(Result<(&mut Conn, &mut Instance), &Error>) -> Ran + Send>;

struct Ran {
    finish: Option<Finish>,
    failed: bool,
}

#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// Whether a thread is running batches now.
    combining: bool,
}

pub(crate) struct GroupSync {
    db: PathBuf,
    queue: Mutex<Queue>,
    /// To the sync thread: a batch's waiters, once its commits are written.
    /// The combiner goes on with the next batch while the WAL is synced;
    /// batches that reach the thread during one fsync share the next.
    syncer: Mutex<Option<mpsc::Sender<Vec<Finish>>>>,
    /// fsyncs run (tests).
    syncs: Arc<AtomicU64>,
    /// Batches run (tests).
    batches: AtomicU64,
}

fn poisoned() -> Error {
    Error::Task("the group commit lock is poisoned".into())
}

impl GroupSync {
    pub fn new(db: PathBuf) -> Self {
        let syncs = Arc::new(AtomicU64::new(0));
        let (tx, rx) = mpsc::channel::<Vec<Finish>>();
        let (path, count) = (db.clone(), syncs.clone());
        // Ends when the store (the sender) is dropped. If it cannot start,
        // combiners sync themselves.
        let started = std::thread::Builder::new()
            .name("fencecheck-sync".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut finishes = first;
                    while let Ok(more) = rx.try_recv() {
                        finishes.extend(more);
                    }
                    let synced = fsync(&path, &count);
                    for finish in finishes {
                        finish(synced.as_ref().map(|_| ()));
                    }
                }
            })
            .is_ok();
        Self {
            db,
            queue: Mutex::new(Queue::default()),
            syncer: Mutex::new(started.then_some(tx)),
            syncs,
            batches: AtomicU64::new(0),
        }
    }

    /// Run `write` in a batch (see the module) and return its value once
    /// it is answered: at once if it returned `durable: false`, after the
    /// batch's fsync if `true`. `write` runs with `synchronous=NORMAL`,
    /// under `turn` (the in-process writers' mutex), and must leave the
    /// connection outside any transaction.
    pub fn run<T: Send + 'static>(
        &self,
        pool: &Pool,
        turn: &Mutex<()>,
        write: impl FnOnce(&mut Conn, &mut Instance) -> Result<(T, bool), Error> + Send + 'static,
    ) -> Result<T, Error> {
        let (tx, rx) = mpsc::sync_channel::<Result<T, Error>>(1);
        let job: Job = Box::new(move |slot| {
            let (conn, guest) = match slot {
                Ok(slot) => slot,
                Err(e) => {
                    let _ = tx.send(Err(Error::Task(format!("no database connection: {e}"))));
                    return Ran {
                        finish: None,
                        failed: true,
                    };
                }
            };
            match write(conn, guest) {
                Ok((value, true)) => Ran {
                    finish: Some(Box::new(move |synced: Result<(), &std::io::Error>| {
                        let answer = synced.map(|()| value).map_err(|e| {
                            Error::Unsynced(std::io::Error::new(e.kind(), e.to_string()))
                        });
                        let _ = tx.send(answer);
                    })),
                    failed: false,
                },
                Ok((value, false)) => {
                    let _ = tx.send(Ok(value));
                    Ran {
                        finish: None,
                        failed: false,
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    Ran {
                        finish: None,
                        failed: true,
                    }
                }
            }
        });
        let combine = {
            let mut queue = self.queue.lock().map_err(|_| poisoned())?;
            queue.jobs.push(job);
            !std::mem::replace(&mut queue.combining, true)
        };
        if combine {
            self.combine(pool, turn);
        }
        rx.recv()
            .map_err(|_| Error::Task("the group commit dropped a write".into()))?
    }

    /// Run batches until the queue is empty.
    fn combine(&self, pool: &Pool, turn: &Mutex<()>) {
        loop {
            let mut jobs = match self.queue.lock() {
                Ok(mut queue) if queue.jobs.is_empty() => {
                    queue.combining = false;
                    return;
                }
                Ok(mut queue) => std::mem::take(&mut queue.jobs),
                // A panic held the queue: its waiters see their channel
                // dropped (an error), never a false answer.
                Err(_) => return,
            };
            self.batches.fetch_add(1, Ordering::Relaxed);
            let mut finishes: Vec<Finish> = Vec::new();
            {
                let _turn = turn.lock();
                let mut drained = jobs.drain(..);
                let ran = pool.with(|conn, guest| {
                    let mut failed = false;
                    if let Conn::Sqlite(c) = conn {
                        c.pragma_update(None, "synchronous", "NORMAL")
                            .map_err(|source| Error::Sqlite {
                                doing: "setting synchronous",
                                source,
                            })?;
                    }
                    for job in drained.by_ref() {
                        let ran = job(Ok((&mut *conn, &mut *guest)));
                        failed |= ran.failed;
                        finishes.extend(ran.finish);
                        if let Conn::Sqlite(c) = conn
                            && !c.is_autocommit()
                        {
                            // Never carry one write's transaction into the next.
                            let _ = c.execute_batch("ROLLBACK");
                            failed = true;
                        }
                    }
                    if let Conn::Sqlite(c) = conn
                        && c.pragma_update(None, "synchronous", "FULL").is_err()
                    {
                        // Other users of the connection expect FULL.
                        failed = true;
                    }
                    if failed {
                        // A fresh connection for the next batch.
                        return Err(Error::Task("a write of the batch failed".into()));
                    }
                    Ok(())
                });
                if let Err(e) = ran {
                    // Writes the batch did not reach (no connection) fail with it.
                    for job in drained {
                        job(Err(&e));
                    }
                }
            }
            if !finishes.is_empty() {
                let unsent = match self.syncer.lock() {
                    Ok(syncer) => match syncer.as_ref() {
                        Some(tx) => tx.send(finishes).err().map(|e| e.0),
                        None => Some(finishes),
                    },
                    Err(_) => Some(finishes),
                };
                if let Some(finishes) = unsent {
                    let synced = fsync(&self.db, &self.syncs);
                    for finish in finishes {
                        finish(synced.as_ref().map(|_| ()));
                    }
                }
            }
        }
    }

    /// (fsyncs, batches) so far.
    #[cfg(test)]
    pub fn counts(&self) -> (u64, u64) {
        (
            self.syncs.load(Ordering::Relaxed),
            self.batches.load(Ordering::Relaxed),
        )
    }
}

/// fsync the WAL (where NORMAL commits wait for a checkpoint); if there is
/// none, everything is in the database file: sync that.
fn fsync(db: &std::path::Path, count: &AtomicU64) -> std::io::Result<()> {
    let mut wal = db.to_owned().into_os_string();
    wal.push("-wal");
    let file = match std::fs::File::open(&wal) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::File::open(db),
        other => other,
    };
    count.fetch_add(1, Ordering::Relaxed);
    file.and_then(|f| f.sync_data())
}
