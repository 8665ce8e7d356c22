//! `fencecheck authority …`: the SQLite lease coordinator from the shell.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Subcommand;
use fencecheck::{Runtime, TokenText};
use fencecheck_authority::{
    AcquireOutcome, Coordinator, ReleaseOutcome, RenewOutcome, SqliteCoordinator, SystemClock,
};

/// Lease-coordinator commands; every one is one transaction on `--db`.
#[derive(Subcommand)]
pub enum Authority {
    /// Acquire a lock; prints the token on success, exits 3 when busy.
    Acquire {
        /// Coordinator database (created if missing).
        #[arg(long)]
        db: PathBuf,
        /// The lock (also the fencing scope).
        lock: String,
        /// This acquisition's unique id.
        lease_id: String,
        /// Lease length, milliseconds.
        ttl_ms: u64,
    },
    /// Renew the exact current lease; exits 3 when lost.
    Renew {
        /// Coordinator database.
        #[arg(long)]
        db: PathBuf,
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
        /// Coordinator database.
        #[arg(long)]
        db: PathBuf,
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
        /// Coordinator database.
        #[arg(long)]
        db: PathBuf,
        /// The lowest acceptable new epoch.
        #[arg(long)]
        at_least: Option<u64>,
    },
}

const BUSY: u8 = 3;

fn open(runtime: &Runtime, db: &Path) -> Result<SqliteCoordinator> {
    SqliteCoordinator::open(db, runtime.clone(), Arc::new(SystemClock))
        .with_context(|| format!("opening the coordinator at {}", db.display()))
}

/// Run one authority command.
pub fn run(runtime: &Runtime, command: Authority) -> Result<ExitCode> {
    match command {
        Authority::Acquire {
            db,
            lock,
            lease_id,
            ttl_ms,
        } => match open(runtime, &db)?.acquire(&lock, &lease_id, ttl_ms)? {
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
            db,
            lock,
            lease_id,
            token,
            ttl_ms,
        } => match open(runtime, &db)?.renew(&lock, &lease_id, token.0, ttl_ms)? {
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
            db,
            lock,
            lease_id,
            token,
        } => match open(runtime, &db)?.release(&lock, &lease_id, token.0)? {
            ReleaseOutcome::Released => {
                println!("released");
                Ok(ExitCode::SUCCESS)
            }
            ReleaseOutcome::NotOwner => {
                println!("not-owner");
                Ok(ExitCode::from(BUSY))
            }
        },
        Authority::Restore { db, at_least } => {
            let at_least = at_least.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            });
            let floor = open(runtime, &db)?.restore(at_least)?;
            println!("restored epoch-floor {floor}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
