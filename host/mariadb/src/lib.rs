//! A MariaDB/MySQL UDF plugin that puts the fencecheck component inside the
//! server's write path: `fence_check`, `fence_next`, `fence_inspect` and
//! `fence_version` with the same arguments, outcomes and state bytes as the
//! SQLite extension (`host/sqlite-ext`) and the PostgreSQL functions, and
//! `sql/fencecheck.sql`, the `fencecheck.protect(...)` procedure that fences
//! a table with triggers, and a lease coordinator: `fencecheck.acquire/
//! renew/release/restore`, procedures that lock a lease row and let the
//! pure `fence_lease_acquire/renew/release` functions decide.
//!
//! ```sql
//! CREATE FUNCTION fence_next RETURNS STRING SONAME 'libfencecheck_mariadb.so';
//! UPDATE report_catalog
//!    SET visible_object = ?,
//!        fence_state = fence_next(fence_state, report_id, ?, 'strict', NULL, NULL)
//!  WHERE report_id = ?;
//! -- one row changed: applied. Error 1644 `stale-fence: …`, `duplicate: …`,
//! -- `version-conflict: …`: refused, the statement changed nothing.
//! ```
//!
//! `state` is bytes (store it in a `VARBINARY`/`BLOB` column) or NULL;
//! `scope`, `token`, `policy`, `op_id` strings; `expected_version` an
//! INTEGER or NULL; an optional 7th argument, the scope's signing keys
//! (`'ID:HEX,…'`). docs/mariadb.md has the whole reference.
//!
//! # Layout
//!
//! - `functions`: the decisions in safe Rust (arguments in, outcome or
//!   refusal out), worded as the SQLite extension words them.
//! - `udfs`: the C entry points the server calls (`catch_unwind` around
//!   each), the runtime and its pool of instances, raising refusals through
//!   the server's `my_message`.
//! - `sql/fencecheck.sql` ([`INSTALL_SQL`]): `CREATE FUNCTION`s, the
//!   `fencecheck` schema (`protect`, tombstones, the lease procedures).
//!
//! The crate's Rust API is what the tests and tools need: [`INSTALL_SQL`],
//! [`ER_FENCE`] (the error number a refusal raises) and [`TEST_CLOCK_ENV`].

mod functions;
mod udfs;

pub use udfs::{ER_FENCE, TEST_CLOCK_ENV};

/// The SQL that installs the functions and the `fencecheck` schema
/// (`protect`, the tombstones): run it as an administrator after copying
/// the library into the server's `plugin_dir`.
pub const INSTALL_SQL: &str = include_str!("../sql/fencecheck.sql");
