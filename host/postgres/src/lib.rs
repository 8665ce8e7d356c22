//! Fenced writes on PostgreSQL from the client side, decided by the
//! fencecheck component: for databases where no extension can be installed
//! (managed services). The check runs in this process, inside the caller's
//! transaction, over the same state table layout as the SQLite adapter.
//!
//! # Layout
//!
//! - [`install`] creates the one layout ([`LAYOUT_VERSION`], `schema.sql`:
//!   `fencecheck_meta`, `fencecheck_scopes`, `fencecheck_objects`, the
//!   SQLite tables with PostgreSQL types) and refuses any other.
//!   Layout 2 adds `fencecheck_keys`; a layout-1 database is upgraded.
//! - Signed tokens, opt-in per scope prefix as in the SQLite adapter:
//!   [`set_keys`], [`remove_keys`], [`key_prefixes`], [`scope_keys`]; a
//!   scope with keys refuses every token its authority did not sign
//!   ([`Rejection::Unauthenticated`]).
//! - [`fenced_write`] locks the scope's row, checks, stores the new state
//!   and runs the caller's mutation in one transaction. Results are
//!   [`Fenced`] (applied, or a definitive [`Rejection`]); failures are
//!   [`Error`], with [`Error::is_retryable`] for serialization failures and
//!   deadlocks and [`Error::CommitUnknown`] when the commit's fate is unknown.
//! - [`fenced_execute`] runs one statement under the fence in one round
//!   trip when the writer's [`StateCache`] holds the scope's current state
//!   (the normal case: one lease holder per scope), the state's
//!   compare-and-set and the statement together in one autocommit
//!   statement; on a mismatch or a first write it takes [`fenced_write`]'s
//!   locking path. Same outcomes, same layout.
//! - The publish protocol, as in the SQLite adapter: [`stage`] an immutable
//!   object under a unique key, [`publish`] it (fenced move of the scope's
//!   catalog pointer, in the same transaction as the fence state; the
//!   replaced object is left alone; an object not staged under the scope is
//!   [`Error::UnknownObject`]), read it with [`visible`], [`discard`] an
//!   unpublished one, and [`collect_garbage`]: the asynchronous collector,
//!   with time passed in, in bounded batches that skip objects a concurrent
//!   publish has locked.
//!
//! # Example
//!
//! ```no_run
//! use fencecheck::{Policy, Request, Runtime, TokenText};
//! use fencecheck_postgres::{Fenced, Rejection, fenced_write, install};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut db = postgres::Client::connect("host=127.0.0.1 user=app", postgres::NoTls)?;
//! install(&mut db)?;
//! let mut guest = Runtime::new()?.instance()?;
//! let token = "0.42".parse::<TokenText>()?.0;
//! let request = Request::new("report/july", token, Policy::Strict);
//! let outcome = fenced_write(&mut db, &mut guest, &request, |tx, _accepted| {
//!     tx.execute("UPDATE report_catalog SET visible_object = $1 WHERE report_id = $2",
//!                &[&"reports/july/b9", &"report/july"])
//! })?;
//! match outcome {
//!     Fenced::Applied { version, .. } => println!("published, version {version}"),
//!     Fenced::Rejected(Rejection::StaleFence { .. }) => { /* definitive: stop */ }
//!     Fenced::Rejected(other) => println!("nothing changed: {}", other.name()),
//! }
//! # Ok(())
//! # }
//! ```

mod cached;
mod error;
mod fence;
mod keys;
mod publish;
mod schema;

pub use cached::{CacheStats, StateCache, fenced_execute};
pub use error::Error;
pub use fence::{fenced_write, stored_state};
pub use fencecheck::{Accepted, Fenced, Rejection};
pub use keys::{key_prefixes, remove_keys, scope_keys, set_keys};
pub use publish::{GcReport, ObjectId, Visible, collect_garbage, discard, publish, stage, visible};
pub use schema::{LAYOUT_VERSION, install};
