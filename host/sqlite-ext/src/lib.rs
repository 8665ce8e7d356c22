//! A loadable SQLite extension that puts the fencecheck component behind
//! four SQL functions, so any program that opens a SQLite database can fence
//! its writes with one statement.
//!
//! # Layout
//!
//! - `fence_next(state, scope, token, policy, op_id, expected_version)` →
//!   the new state BLOB when the outcome is `applied`; otherwise an SQL error
//!   whose message starts with the outcome's name (`stale-fence: …`,
//!   `duplicate: …`, `version-conflict: …`), so an UPDATE can never store a
//!   state the fence refused. This is the function a fenced write calls.
//! - `fence_check(...same...)` → `'applied'`, `'duplicate'`, `'stale-fence'`
//!   or `'version-conflict'`: asks why not, changes nothing.
//! - `fence_inspect(state)` → the state as JSON TEXT (NULL for NULL).
//! - `fence_version()` → the WIT package version of the embedded component
//!   (`'0.1.0'`). The extension runs only the component built into it, so it
//!   is never handed a component of another version.
//!
//! `state` is a BLOB or NULL (no state yet); `scope` TEXT; `token` TEXT in
//! the canonical form `EPOCH.COUNTER` or `AUTHORITY:EPOCH.COUNTER`; `policy`
//! `'strict'` or `'allow-equal'`; `op_id` TEXT or NULL; `expected_version` a
//! non-negative INTEGER or NULL. Anything else, and every check error
//! (`corrupt-state`, `scope-mismatch`, `invalid-request`…), raises an SQL
//! error whose message starts with the error's name. All three functions are
//! deterministic.
//!
//! Internals: `functions` (safe Rust, the rules above) and `ffi` (the entry
//! points `sqlite3_extension_init` / `sqlite3_fencecheck_init` and the
//! trampolines). One component runtime per process, one instance per
//! connection.
//!
//! # Example
//!
//! The seed's conditional update, fenced, is ONE statement with ONE
//! component call: `fence_next` in SET reads the row's state, decides, and
//! either returns the new state or raises, and SQLite aborts a statement
//! whose function raises, changing nothing.
//!
//! ```sql
//! .load target/release/libfencecheck_sqlite_ext
//! UPDATE report_catalog
//!    SET visible_object = :object_key,
//!        fence_state = fence_next(fence_state, :report_id, :token, 'strict', NULL, NULL)
//!  WHERE report_id = :report_id;
//! -- one row changed: applied. An error `stale-fence: …`, `duplicate: …` or
//! -- `version-conflict: …`: refused, nothing changed. No row: no state yet,
//! -- the first write inserts one with fence_next(NULL, …).
//! ```
//!
//! Inside a longer transaction, SQLite undoes only the statement that
//! raised: roll back the transaction to drop its other writes too.

mod ffi;
mod functions;

pub use ffi::{
    ApiRoutines, Context, Sqlite3, Value, sqlite3_extension_init, sqlite3_fencecheck_init,
};
