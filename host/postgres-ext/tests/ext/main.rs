//! The extension's tests, one binary (it links the component runtime once):
//! each module starts real PostgreSQL servers that load the installed
//! extension (scripts/install-pg-extension, or the package scripts/dist
//! made, first).

mod common;
mod functions;
mod fuzz;
mod hints;
mod load;
mod observe;
mod paths;
mod paused_writer;
mod protected;
mod signed;
mod trust;
mod upgrade;
