//! Fenced writes on SQLite, and the seed's fenced publish protocol, decided by
//! the fencecheck component.
//!
//! Every write runs "read state → check → store state and mutation" in ONE
//! write transaction that takes the lock before the read; anything but
//! `applied` rolls back and changes nothing. [`fenced_write`] runs it as
//! `BEGIN IMMEDIATE` … `COMMIT`, with the read, the check and the store of
//! an existing scope's state in one statement before the mutation;
//! [`publish`] to an existing scope as ONE UPDATE statement. Both check
//! inside the statement, through an SQL function this crate registers on
//! the connection. The decision comes from the same
//! component every other host loads (a [`fencecheck::Instance`]), or any
//! [`fencecheck::Checker`].
//!
//! # Layout
//!
//! - [`install`] creates the tables of `host/sqlite/schema.sql`, the layout
//!   the Python and Node hosts install too (one fence per scope whatever
//!   language writes it): `fencecheck_scopes` (one row per scope: fence state
//!   BLOB, version, catalog pointer), `fencecheck_objects` (immutable staged
//!   objects) and `fencecheck_meta` (the layout number, [`LAYOUT_VERSION`];
//!   another number is refused with [`Error::UnsupportedLayout`]).
//!   Layout 2 adds `fencecheck_keys` (signed tokens, below); `install`
//!   upgrades a layout-1 database in place.
//! - [`fenced_write`]: any mutation, passed as a closure, under the fence.
//! - Signed tokens, opt-in per scope prefix: [`set_keys`] makes every scope
//!   under a prefix require tokens signed by one of its keys (the request's
//!   [`fencecheck::Request::signature`]); every fenced write reads the
//!   scope's keys ([`scope_keys`]) inside its transaction and decides with
//!   `check-signed`, so a forged token is [`Rejection::Unauthenticated`].
//!   [`remove_keys`], [`key_prefixes`].
//! - The publish protocol: [`stage`] an immutable object under a unique key,
//!   [`publish`] it (fenced move of the catalog pointer; the replaced object is
//!   left alone), read it with [`visible`], [`discard`] an unpublished one, and
//!   [`collect_garbage`]: the asynchronous collector, with time passed in.
//! - Results: [`Fenced`] (applied, or a [`Rejection`], all definitive) inside
//!   `Result<_, `[`Error`]`>` (infrastructure: SQLite busy, guest trapped).
//!
//! Durability is the connection's setting: with `synchronous=NORMAL` in WAL
//! mode a power loss may forget the last commits, fence state and mutation
//! together; use `FULL` if an `applied` answer must survive it.
//!
//! # Example
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use fencecheck::{Policy, Request, Runtime, Token};
//! use fencecheck_sqlite::{Fenced, Rejection, collect_garbage, install, publish, stage, visible};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut conn = rusqlite::Connection::open_in_memory()?;
//! install(&conn)?;
//! let runtime = Runtime::new()?;          // once per process
//! let mut guest = runtime.instance()?;    // once per thread or connection
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
//!
//! // B (token 42) stages and publishes; A (token 41) resumes too late.
//! let b = stage(&conn, "report/july", "b9.tmp", b"corrected", now)?;
//! let req_b = Request::new("report/july", Token::new(0, 0, 42), Policy::Strict);
//! assert!(publish(&mut conn, &mut guest, &req_b, b, now)?.is_applied());
//!
//! let a = stage(&conn, "report/july", "a7.tmp", b"stale", now)?;
//! let req_a = Request::new("report/july", Token::new(0, 0, 41), Policy::Strict);
//! let outcome = publish(&mut conn, &mut guest, &req_a, a, now)?;
//! assert!(matches!(outcome, Fenced::Rejected(Rejection::StaleFence { .. })));
//! assert_eq!(visible(&conn, "report/july")?.map(|v| v.object), Some(b));
//!
//! // Later, the collector removes A's unreferenced object; B's stays.
//! let later = now + Duration::from_secs(3_600);
//! assert_eq!(collect_garbage(&mut conn, later, Duration::from_secs(600))?.deleted, 1);
//! # Ok(()) }
//! ```

mod apply;
mod error;
mod fence;
mod keys;
mod publish;
mod schema;

pub use error::Error;
pub use fence::{Accepted, Fenced, Rejection, fenced_write, stored_state};
pub use keys::{key_prefixes, remove_keys, scope_keys, set_keys};
pub use publish::{GcReport, ObjectId, Visible, collect_garbage, discard, publish, stage, visible};
pub use schema::{LAYOUT_VERSION, install};
