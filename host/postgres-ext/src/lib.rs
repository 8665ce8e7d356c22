//! fencecheck inside PostgreSQL: the component behind SQL functions and
//! fenced tables, so the check runs in the database's own write path.
//!
//! # Layout
//!
//! - `fence_check(state, scope, token, policy, op_id, expected_version)` →
//!   the decision's name; `fence_next(…)` → the new state on `applied`,
//!   otherwise an error with the outcome's own SQLSTATE; `fence_inspect(state)`
//!   → `jsonb`; `fence_version()` → the embedded component's WIT package
//!   version (`0.1.0`; only that component runs here). Same names, arguments
//!   and meaning as the SQLite extension, so one statement works on both
//!   ([`calls`](self) holds the rules).
//! - `fence_protect(tbl, scope_column, token_column, state_column, policy)`
//!   and `fence_unprotect(tbl)`: fenced tables, whose every write must
//!   present a token (`protect.rs` documents each path).
//! - Every refusal has a distinct SQLSTATE in class `5F` (`sqlstate.rs`);
//!   `ffi.rs` holds the C entry points; `sql/fencecheck.sql` the SQL objects.
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
mod sqlstate;
mod stats;

pub use ffi::*;

pgrx::pg_module_magic!();

pgrx::extension_sql_file!("../sql/fencecheck.sql", name = "fencecheck", bootstrap);
pgrx::extension_sql_file!("../sql/protect.sql", name = "protect", finalize);

/// Loaded into a backend (on first use) or the postmaster (from
/// `shared_preload_libraries`): define the settings, and ask for the
/// shared decision counters when preloaded.
#[pgrx::pg_guard]
pub extern "C-unwind" fn _PG_init() {
    settings::define();
    stats::request_shared_memory();
}
