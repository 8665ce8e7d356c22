//! fencecheck inside PostgreSQL: the component behind SQL functions and
//! fenced tables, so the check runs in the database's own write path.
//!
//! # Layout
//!
//! - `fence_check(state, scope, token, policy, op_id, expected_version)` →
//!   the decision's name; `fence_next(…)` → the new state on `applied`,
//!   otherwise an error with the outcome's own SQLSTATE; `fence_inspect(state)`
//!   → `jsonb`; `fence_version()` → the embedded component's WIT package
//!   version (only that component runs here). Same names, arguments
//!   and meaning as the SQLite extension, so one statement works on both
//!   ([`calls`](self) holds the rules).
//! - `fence_protect(tbl, scope_column, token_column, state_column, policy)`
//!   and `fence_unprotect(tbl)`: fenced tables, whose every write must
//!   present a token (`protect.rs` documents each path; `soundness.rs` what
//!   makes a table fit to be fenced; `registry.rs` what the trigger caches;
//!   `settings.rs` the `fencecheck.*` settings; `stats.rs` the counters).
//! - Every refusal has a distinct SQLSTATE in class `5F` (`sqlstate.rs`);
//!   `ffi.rs` holds the C entry points; `sql/fencecheck.sql` and
//!   `sql/protect.sql` the SQL objects (`scripts/pg-package` assembles them).
//! - One component runtime per backend, made on the backend's first call
//!   from the artifact precompiled at build time; one instance per backend.
//!
//! # Example
//!
//! ```sql
//! CREATE EXTENSION fencecheck;
//! -- One statement, one component call: applied, or an error and no change.
//! UPDATE report_catalog
//!    SET visible_object = $1,
//!        fence_state = fence_next(fence_state, report_id, $2, 'strict', NULL, NULL)
//!  WHERE report_id = 'report/july';
//!
//! -- Or make the table itself refuse unfenced writes:
//! SELECT fence_protect('report_catalog', 'report_id', 'fence_token', 'fence_state');
//! UPDATE report_catalog SET visible_object = $1, fence_token = '0.42'
//!  WHERE report_id = 'report/july';   -- applied; '0.41' afterwards: 5F001
//! ```

mod calls;
mod ffi;
mod protect;
mod registry;
mod settings;
mod soundness;
mod sqlstate;
mod stats;

pub use ffi::*;

pgrx::pg_module_magic!();

// The extension's SQL is all hand-written (sql/): scripts/pg-package makes
// the install script fencecheck--V.sql from sql/fencecheck.sql and
// sql/protect.sql, and ships the upgrade scripts as they are. No cargo-pgrx
// schema generation is involved.

/// Loaded into a backend (on first use) or the postmaster (from
/// `shared_preload_libraries`): define the settings, and ask for the
/// shared decision counters when preloaded.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::define();
    stats::request_shared_memory();
}
