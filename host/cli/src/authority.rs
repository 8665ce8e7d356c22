//! `fencecheck authority …`: the SQLite or PostgreSQL lease coordinator from
//! the shell.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use fencecheck::{Runtime, TokenText};
use fencecheck_authority::{
    AcquireOutcome, Coordinator, MigrationStep, PostgresCoordinator, ReleaseOutcome, RenewOutcome,
    SqliteCoordinator, StoreUrl, SystemClock,
};

/// Where the coordinator keeps its leases: exactly one of `--db` (SQLite)
/// and `--postgres`.
#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct Store {
    /// Coordinator SQLite database (created if missing).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Coordinator PostgreSQL database, as a libpq connection string
    /// (`host=… user=… dbname=…` or `postgresql://…`); tables created if missing.
    #[arg(long)]
    postgres: Option<String>,
}

/// Lease-coordinator commands; every one is one transaction on the store.
#[derive(Subcommand)]
pub enum Authority {
    /// Acquire a lock; prints the token on success, exits 3 when busy.
    Acquire {
        #[command(flatten)]
        store: Store,
        /// The lock (also the fencing scope).
        lock: String,
        /// This acquisition's unique id.
        lease_id: String,
        /// Lease length, milliseconds.
        ttl_ms: u64,
    },
    /// Renew the exact current lease; exits 3 when lost.
    Renew {
        #[command(flatten)]
        store: Store,
        /// The lock.
        lock: String,
        /// The lease id.
        lease_id: String,
        /// The token, `EPOCH.COUNTER` or `AUTHORITY:EPOCH.COUNTER`.
        token: TokenText,
        /// New lease length from now, milliseconds.
        ttl_ms: u64,
    },
    /// Release the exact current lease; exits 3 when not the owner.
    Release {
        #[command(flatten)]
        store: Store,
        /// The lock.
        lock: String,
        /// The lease id.
        lease_id: String,
        /// The token.
        token: TokenText,
    },
    /// After restoring the database from a backup: start a new epoch above
    /// every epoch it knows and above `--at-least` (default: the current Unix
    /// time in milliseconds, which also stays above earlier restores of the
    /// same backup, even two within one second). Prints the new epoch floor.
    Restore {
        #[command(flatten)]
        store: Store,
        /// The lowest acceptable new epoch.
        #[arg(long)]
        at_least: Option<u64>,
    },
    /// Move the lock service to another store: copy the lineage (the
    /// authority id every token carries) and every lock's state, start the
    /// target's epochs above every token the source issued and above
    /// `--at-least` (default: the Unix time in milliseconds), and seal the
    /// source so that it grants nothing more. Refuses a target that holds
    /// another lineage or live state; safe to re-run after a crash. Stores:
    /// `sqlite:PATH`, `etcd:http://HOST:PORT[,…]`, `postgres://…`.
    Migrate {
        /// The store the coordinators use now.
        #[arg(long)]
        from: StoreUrl,
        /// The new, unused store.
        #[arg(long)]
        to: StoreUrl,
        /// The lowest acceptable new epoch.
        #[arg(long)]
        at_least: Option<u64>,
        /// Fault injection for the tests: after this step (`sealed`,
        /// `importing`) print it and wait for a line on stdin.
        #[arg(long, hide = true)]
        pause_after: Option<String>,
    },
}

/// The Unix time in milliseconds: the default lowest new epoch.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

const BUSY: u8 = 3;

fn open(runtime: &Runtime, store: &Store) -> Result<Box<dyn Coordinator>> {
    let clock = Arc::new(SystemClock);
    match (&store.db, &store.postgres) {
        (Some(db), _) => Ok(Box::new(
            SqliteCoordinator::open(db, runtime.clone(), clock)
                .with_context(|| format!("opening the coordinator at {}", db.display()))?,
        )),
        (None, Some(url)) => Ok(Box::new(
            PostgresCoordinator::open(url, runtime.clone(), clock)
                .context("opening the PostgreSQL coordinator")?,
        )),
        (None, None) => anyhow::bail!("give --db or --postgres"),
    }
}

/// Run one authority command.
pub fn run(runtime: &Runtime, command: Authority) -> Result<ExitCode> {
    match command {
        Authority::Acquire {
            store,
            lock,
            lease_id,
            ttl_ms,
        } => match open(runtime, &store)?.acquire(&lock, &lease_id, ttl_ms)? {
            AcquireOutcome::Acquired(grant) => {
                println!(
                    "acquired {} lease {} token {} expires-at {}",
                    grant.lock,
                    grant.lease_id,
                    TokenText(grant.token),
                    grant.expires_at
                );
                Ok(ExitCode::SUCCESS)
            }
            AcquireOutcome::Busy { holder, expires_at } => {
                println!("busy holder {holder} expires-at {expires_at}");
                Ok(ExitCode::from(BUSY))
            }
        },
        Authority::Renew {
            store,
            lock,
            lease_id,
            token,
            ttl_ms,
        } => match open(runtime, &store)?.renew(&lock, &lease_id, token.0, ttl_ms)? {
            RenewOutcome::Renewed { expires_at } => {
                println!("renewed expires-at {expires_at}");
                Ok(ExitCode::SUCCESS)
            }
            RenewOutcome::Lost => {
                println!("lost");
                Ok(ExitCode::from(BUSY))
            }
        },
        Authority::Release {
            store,
            lock,
            lease_id,
            token,
        } => match open(runtime, &store)?.release(&lock, &lease_id, token.0)? {
            ReleaseOutcome::Released => {
                println!("released");
                Ok(ExitCode::SUCCESS)
            }
            ReleaseOutcome::NotOwner => {
                println!("not-owner");
                Ok(ExitCode::from(BUSY))
            }
        },
        Authority::Restore { store, at_least } => {
            let floor = open(runtime, &store)?.restore(at_least.unwrap_or_else(now_ms))?;
            println!("restored epoch-floor {floor}");
            Ok(ExitCode::SUCCESS)
        }
        Authority::Migrate {
            from,
            to,
            at_least,
            pause_after,
        } => {
            let mut step = |step: MigrationStep| {
                let name = match step {
                    MigrationStep::Sealed => "sealed",
                    MigrationStep::Importing => "importing",
                    _ => "other",
                };
                if pause_after.as_deref() == Some(name) {
                    println!("paused after {name}");
                    let mut line = String::new();
                    // Whatever stdin says (or its end) resumes.
                    let _ = std::io::stdin().read_line(&mut line);
                }
            };
            let migrated = fencecheck_authority::migrate_with(
                runtime,
                &from,
                &to,
                at_least.unwrap_or_else(now_ms),
                &mut step,
            )
            .with_context(|| format!("migrating {from} to {to}"))?;
            println!(
                "{} lineage {} epoch-floor {} locks {}",
                if migrated.already {
                    "already-migrated"
                } else {
                    "migrated"
                },
                migrated.lineage,
                migrated.epoch_floor,
                migrated.locks
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
