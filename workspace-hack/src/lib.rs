//! No code: see this crate's Cargo.toml. Its dependencies only ask cargo
//! for features, so that `cargo build --workspace` and `cargo test
//! --workspace` compile each shared crate with one feature set.
