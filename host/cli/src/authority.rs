//! `fencecheck authority …`: the SQLite, PostgreSQL or etcd lease coordinator
//! from the shell.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use fencecheck::{Runtime, TokenText};
use fencecheck_authority::{
    AcquireOutcome, Coordinator, EtcdAccess, EtcdCoordinator, EtcdCredentials, EtcdOptions,
    EtcdTls, MigrationStep, PostgresCoordinator, RedisCoordinator, ReleaseOutcome, RenewOutcome,
    SigningCoordinator, SqliteCoordinator, StoreUrl, SystemClock,
};

/// Where the coordinator keeps its leases: exactly one of `--db` (SQLite),
/// `--postgres`, `--etcd` and `--redis`.
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
    /// etcd cluster: its members' client URLs, comma-separated
    /// (`http://…`, or `https://…` with `--etcd-cacert`).
    #[arg(long)]
    etcd: Option<String>,
    /// Redis or Valkey server loading the fencecheck module
    /// (`redis://[[user]:password@]host:port`): the module's FENCE.ACQUIRE,
    /// FENCE.RENEW, FENCE.RELEASE and FENCE.RESTORE decide, on the server's
    /// clock. For a Redis Cluster or Valkey cluster, give two or more of its
    /// nodes (repeat the flag or separate URLs with commas): each lock's
    /// command goes to the master of the lock's slot.
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    redis: Vec<String>,
}

/// The environment variable that may hold the etcd password (never a flag:
/// command lines are visible to every user of the machine).
const PASSWORD_ENV: &str = "FENCECHECK_ETCD_PASSWORD";

/// How to reach a secured etcd cluster (`--etcd`, and `migrate`'s `etcd:`
/// stores).
#[derive(Args)]
pub struct EtcdFlags {
    /// PEM file of the CA that signed the etcd members' certificates
    /// (required for https:// endpoints; the system's roots are not used).
    #[arg(long, value_name = "PEM")]
    etcd_cacert: Option<PathBuf>,
    /// PEM file of the client certificate to present to etcd (members
    /// started with --client-cert-auth). With etcd authentication on it
    /// must have no CommonName: etcd's JSON gateway refuses one.
    #[arg(long, value_name = "PEM", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[arg(long, value_name = "PEM", requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// etcd user to authenticate as; its role must grant readwrite on the
    /// key prefix. The password comes from --etcd-password-file or the
    /// FENCECHECK_ETCD_PASSWORD environment variable.
    #[arg(long, value_name = "NAME")]
    etcd_user: Option<String>,
    /// File holding the etcd user's password (one line).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    etcd_password_file: Option<PathBuf>,
    /// Prefix of every etcd key the coordinator uses.
    #[arg(long, value_name = "PREFIX", default_value = "fencecheck/")]
    etcd_prefix: String,
}

impl EtcdFlags {
    /// The TLS settings and credentials the flags name, files read.
    fn access(&self) -> Result<EtcdAccess> {
        let tls = match (&self.etcd_cacert, &self.etcd_cert) {
            (Some(ca), cert) => Some(EtcdTls::from_files(
                ca,
                cert.as_deref(),
                self.etcd_key.as_deref(),
            )?),
            (None, Some(_)) => anyhow::bail!("--etcd-cert needs --etcd-cacert"),
            (None, None) => None,
        };
        let env = std::env::var_os(PASSWORD_ENV);
        let credentials = match (&self.etcd_user, &self.etcd_password_file) {
            (Some(user), Some(file)) => Some(EtcdCredentials {
                user: user.clone(),
                password: password_file(file)?,
            }),
            (Some(user), None) => {
                let password = env
                    .context(format!(
                        "--etcd-user needs --etcd-password-file or {PASSWORD_ENV}"
                    ))?
                    .into_string()
                    .map_err(|_| anyhow::anyhow!("{PASSWORD_ENV} is not UTF-8"))?;
                anyhow::ensure!(!password.is_empty(), "{PASSWORD_ENV} is empty");
                Some(EtcdCredentials {
                    user: user.clone(),
                    password,
                })
            }
            (None, _) => None,
        };
        Ok(EtcdAccess { tls, credentials })
    }
}

/// The password in `path`: its first line, without the line break.
fn password_file(path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the etcd password file {}", path.display()))?;
    let password = text.lines().next().unwrap_or_default();
    anyhow::ensure!(
        !password.is_empty(),
        "the etcd password file {} is empty",
        path.display()
    );
    Ok(password.to_owned())
}

/// Lease-coordinator commands; every one is one transaction on the store.
#[derive(Subcommand)]
pub enum Authority {
    /// Acquire a lock; prints the token on success, exits 3 when busy.
    Acquire {
        #[command(flatten)]
        store: Store,
        #[command(flatten)]
        etcd: Box<EtcdFlags>,
        /// Sign the grant with the one key in this file (`ID:HEX`, from
        /// `fencecheck keygen`): the token printed is the signed text
        /// `TOKEN~KEY-ID~LEASE~TAG`, for resources that require signatures.
        #[arg(long, value_name = "FILE")]
        signing_key: Option<PathBuf>,
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
        #[command(flatten)]
        etcd: Box<EtcdFlags>,
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
        #[command(flatten)]
        etcd: Box<EtcdFlags>,
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
        #[command(flatten)]
        etcd: Box<EtcdFlags>,
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
    /// `sqlite:PATH`, `etcd:http[s]://HOST:PORT[,…]` (reached with the
    /// `--etcd-…` flags), `postgres://…`.
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
        #[command(flatten)]
        etcd: Box<EtcdFlags>,
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

fn open(runtime: &Runtime, store: &Store, etcd: &EtcdFlags) -> Result<Box<dyn Coordinator>> {
    let clock = Arc::new(SystemClock);
    match store.redis.as_slice() {
        [] => {}
        [url] => {
            return Ok(Box::new(
                RedisCoordinator::connect(url).context("connecting to the Redis coordinator")?,
            ));
        }
        seeds => {
            return Ok(Box::new(
                RedisCoordinator::connect_cluster(seeds)
                    .context("connecting to the Redis Cluster coordinator")?,
            ));
        }
    }
    match (&store.db, &store.postgres, &store.etcd) {
        (Some(db), _, _) => Ok(Box::new(
            SqliteCoordinator::open(db, runtime.clone(), clock)
                .with_context(|| format!("opening the coordinator at {}", db.display()))?,
        )),
        (None, Some(url), _) => Ok(Box::new(
            PostgresCoordinator::open(url, runtime.clone(), clock)
                .context("opening the PostgreSQL coordinator")?,
        )),
        (None, None, Some(endpoints)) => {
            let access = etcd.access()?;
            let options = EtcdOptions {
                prefix: etcd.etcd_prefix.clone(),
                tls: access.tls,
                credentials: access.credentials,
                ..EtcdOptions::new(endpoints.split(','))
            };
            Ok(Box::new(
                EtcdCoordinator::with_options(options, runtime.clone(), clock)
                    .with_context(|| format!("connecting to etcd at {endpoints}"))?,
            ))
        }
        (None, None, None) => anyhow::bail!("give --db, --postgres, --etcd or --redis"),
    }
}

fn acquire(
    coordinator: &dyn Coordinator,
    lock: &str,
    lease_id: &str,
    ttl_ms: u64,
) -> Result<ExitCode> {
    match coordinator.acquire(lock, lease_id, ttl_ms)? {
        AcquireOutcome::Acquired(grant) => {
            println!(
                "acquired {} lease {} token {} expires-at {}",
                grant.lock,
                grant.lease_id,
                grant.token_text(),
                grant.expires_at
            );
            Ok(ExitCode::SUCCESS)
        }
        AcquireOutcome::Busy { holder, expires_at } => {
            println!("busy holder {holder} expires-at {expires_at}");
            Ok(ExitCode::from(BUSY))
        }
    }
}

/// Run one authority command.
pub fn run(runtime: &Runtime, command: Authority) -> Result<ExitCode> {
    match command {
        Authority::Acquire {
            store,
            etcd,
            signing_key,
            lock,
            lease_id,
            ttl_ms,
        } => {
            let coordinator = open(runtime, &store, &etcd)?;
            let coordinator: Box<dyn Coordinator> = match signing_key {
                Some(path) => {
                    let key = crate::keys::read_signing_key(&path)?;
                    Box::new(SigningCoordinator::new(coordinator, runtime, key)?)
                }
                None => coordinator,
            };
            acquire(coordinator.as_ref(), &lock, &lease_id, ttl_ms)
        }
        Authority::Renew {
            store,
            etcd,
            lock,
            lease_id,
            token,
            ttl_ms,
        } => match open(runtime, &store, &etcd)?.renew(&lock, &lease_id, token.0, ttl_ms)? {
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
            etcd,
            lock,
            lease_id,
            token,
        } => match open(runtime, &store, &etcd)?.release(&lock, &lease_id, token.0)? {
            ReleaseOutcome::Released => {
                println!("released");
                Ok(ExitCode::SUCCESS)
            }
            ReleaseOutcome::NotOwner => {
                println!("not-owner");
                Ok(ExitCode::from(BUSY))
            }
        },
        Authority::Restore {
            store,
            etcd,
            at_least,
        } => {
            let floor = open(runtime, &store, &etcd)?.restore(at_least.unwrap_or_else(now_ms))?;
            println!("restored epoch-floor {floor}");
            Ok(ExitCode::SUCCESS)
        }
        Authority::Migrate {
            from,
            to,
            at_least,
            etcd,
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
            anyhow::ensure!(
                etcd.etcd_prefix == "fencecheck/",
                "migrate reaches etcd stores under the default prefix fencecheck/ only"
            );
            let etcd = etcd.access()?;
            let migrated = fencecheck_authority::migrate_with_etcd(
                runtime,
                &from,
                &to,
                at_least.unwrap_or_else(now_ms),
                &mut step,
                &etcd,
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
