//! The grant side of fencecheck: lease coordinators that issue one strictly
//! increasing token sequence per lock, and the client capability that carries
//! a grant to the protected resource.
//!
//! The grant *rules* live in the fencecheck component (`wit/fence.wit`,
//! interface `lease`); a coordinator only supplies the clock, the store and
//! the atomicity: it reads a lock's state, asks the component for a decision,
//! and stores the returned state in the same transaction (SQLite) or with a
//! compare-and-swap on the revision it read (etcd).
//!
//! # Layout
//!
//! - [`Coordinator`]: the trait every coordinator implements.
//! - [`SqliteCoordinator`]: the embedded default; one `BEGIN IMMEDIATE`
//!   transaction per decision.
//! - [`EtcdCoordinator`], [`EtcdOptions`]: an etcd v3 cluster through its JSON
//!   gateway; one compare-and-swap transaction per decision; over TLS
//!   ([`EtcdTls`]) and as an etcd user ([`EtcdCredentials`]) when the
//!   cluster requires them.
//! - [`RedisCoordinator`]: a Redis or Valkey server loading the fencecheck
//!   module (host/redis); each decision is one module command run on the
//!   server's main thread, on the server's clock.
//! - [`Clock`], [`SystemClock`], [`MonotonicClock`], [`ManualClock`]: the
//!   coordinator's time authority and the client's local clock; tests drive
//!   manual ones.
//! - [`migrate`], [`StoreUrl`], [`Migrated`]: move a lineage (the authority
//!   id every token carries) with its locks to another store, sealing the
//!   old one, so resources keep accepting the new store's grants. The
//!   SQLite, PostgreSQL and etcd stores each seal and import themselves
//!   behind one crate-private trait (`lineage`); `migrate` drives that
//!   trait and names no store (`store_url` opens one from its URL).
//! - [`SigningCoordinator`]: any coordinator whose grants carry the
//!   authority's signature ([`Grant::signature`], [`Grant::token_text`]),
//!   for resources that require signed tokens.
//! - [`Client`], [`Lease`]: the client capability (scope, lease id, token, a
//!   conservative local validity deadline) and protected-write outcomes.
//!   Both record the lease signals of docs/design.md §12 through the
//!   [`metrics`](https://docs.rs/metrics) facade (nothing is exported until
//!   the application installs a recorder).
//! - [`AuthorityError`]: every infrastructure failure, kept apart from the
//!   domain outcomes (`busy`, `lost`, `not-owner`).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use fencecheck::Runtime;
//! use fencecheck_authority::{AcquireOutcome, Coordinator, ManualClock, SqliteCoordinator};
//!
//! # fn main() -> Result<(), fencecheck_authority::AuthorityError> {
//! let clock = Arc::new(ManualClock::new(0));
//! let coordinator = SqliteCoordinator::open_in_memory(Runtime::new()?, clock.clone())?;
//! let AcquireOutcome::Acquired(a) = coordinator.acquire("report/july", "a7", 30_000)? else {
//!     unreachable!("a fresh lock is free")
//! };
//! clock.advance(30_000); // A's lease expires on the coordinator's clock
//! let AcquireOutcome::Acquired(b) = coordinator.acquire("report/july", "b9", 30_000)? else {
//!     unreachable!("an expired lease frees the lock")
//! };
//! assert!(b.token.grant_order(&a.token).is_gt());
//! # Ok(()) }
//! ```

mod client;
mod clock;
mod error;
mod etcd;
mod lineage;
mod migrate;
mod postgres;
mod redis;
mod rules;
mod signals;
mod signing;
mod sqlite;
mod store_url;

pub use client::{AcquireResult, Client, DriftBound, Lease, WriteError, WriteOutcome};
pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use error::AuthorityError;
pub use etcd::{EtcdCoordinator, EtcdCredentials, EtcdOptions, EtcdTls};
pub use lineage::MigrationStep;
pub use migrate::{Migrated, migrate, migrate_with, migrate_with_etcd};
pub use postgres::{Connect as PostgresConnect, PostgresCoordinator};
pub use redis::RedisCoordinator;
pub use signing::SigningCoordinator;
pub use sqlite::SqliteCoordinator;
pub use store_url::{EtcdAccess, StoreUrl};

use fencecheck::{GrantSignature, SignedTokenText, Token};

/// A grant: what a successful acquisition returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The lock, which is also the fencing scope its token is for.
    pub lock: String,
    /// The acquisition's unique id.
    pub lease_id: String,
    /// The fencing token every protected write under this lease carries.
    pub token: Token,
    /// When the lease ends, in the coordinator's milliseconds.
    pub expires_at: u64,
    /// The coordinator's time when it decided, in its milliseconds. With
    /// `expires_at` it says how much of the lease was left at the decision:
    /// less than the ttl when an acquire retried with the same lease id got
    /// the original grant back.
    pub decided_at: u64,
    /// The authority's signature of this grant, from a
    /// [`SigningCoordinator`]; `None` from a plain coordinator. Resources
    /// that require signed tokens for the lock's scope need it.
    pub signature: Option<GrantSignature>,
}

impl Grant {
    /// The token as a client presents it: `EPOCH.COUNTER`, with
    /// `~KEY-ID~LEASE~TAG` appended when the grant is signed.
    pub fn token_text(&self) -> SignedTokenText {
        SignedTokenText {
            token: self.token,
            signature: self.signature.clone(),
        }
    }

    /// Milliseconds of the lease left on the coordinator's clock when it
    /// decided (at most the ttl asked for).
    pub fn remaining_ms(&self) -> u64 {
        self.expires_at.saturating_sub(self.decided_at)
    }
}

/// The outcome of [`Coordinator::acquire`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// Granted (or a retry of the current grant with the same lease id).
    Acquired(Grant),
    /// Held by another unexpired lease.
    Busy {
        /// The holder's lease id.
        holder: String,
        /// When its lease ends (coordinator milliseconds).
        expires_at: u64,
    },
}

/// The outcome of [`Coordinator::renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenewOutcome {
    /// Extended until `expires_at`; the token is unchanged.
    Renewed {
        /// The new end of the lease (coordinator milliseconds).
        expires_at: u64,
    },
    /// Not the current, unexpired lease: stop working under it.
    Lost,
}

/// The outcome of [`Coordinator::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lock is free.
    Released,
    /// Not the current lease (e.g. an old owner's delayed release); nothing changed.
    NotOwner,
}

/// A lease coordinator: one monotonic grant sequence per lock.
///
/// Every method is one atomic decision against the store. Domain outcomes
/// are values; `Err` is always an infrastructure failure (store down, guest
/// trapped, lost compare-and-swap races) or a refused request (corrupt state,
/// invalid input), after which nothing has changed.
pub trait Coordinator: Send + Sync {
    /// The grant authority every token of this coordinator carries.
    fn authority(&self) -> u64;

    /// Acquire `lock` for `ttl_ms` milliseconds of coordinator time.
    fn acquire(
        &self,
        lock: &str,
        lease_id: &str,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, AuthorityError>;

    /// Renew the exact current lease (lease id and token) for `ttl_ms` from now.
    fn renew(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
        ttl_ms: u64,
    ) -> Result<RenewOutcome, AuthorityError>;

    /// Release the exact current lease.
    fn release(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, AuthorityError>;

    /// After restoring the coordinator's store from a backup: start a new
    /// epoch above every epoch it knows and above `at_least` (which the
    /// operator or the caller takes from outside the backup, e.g. wall-clock
    /// seconds), so that every new grant compares above every token resources
    /// may hold. Returns the new epoch floor.
    fn restore(&self, at_least: u64) -> Result<u64, AuthorityError>;
}

/// A boxed or shared coordinator is one (so a [`SigningCoordinator`] can wrap
/// whichever store a program opened at run time).
macro_rules! forward_coordinator {
    ($($wrapper:ident),*) => {$(
        impl<C: Coordinator + ?Sized> Coordinator for $wrapper<C> {
            fn authority(&self) -> u64 {
                (**self).authority()
            }
            fn acquire(&self, lock: &str, lease_id: &str, ttl_ms: u64) -> Result<AcquireOutcome, AuthorityError> {
                (**self).acquire(lock, lease_id, ttl_ms)
            }
            fn renew(&self, lock: &str, lease_id: &str, token: Token, ttl_ms: u64) -> Result<RenewOutcome, AuthorityError> {
                (**self).renew(lock, lease_id, token, ttl_ms)
            }
            fn release(&self, lock: &str, lease_id: &str, token: Token) -> Result<ReleaseOutcome, AuthorityError> {
                (**self).release(lock, lease_id, token)
            }
            fn restore(&self, at_least: u64) -> Result<u64, AuthorityError> {
                (**self).restore(at_least)
            }
        }
    )*};
}

use std::sync::Arc;
forward_coordinator!(Box, Arc);
