//! Shared helpers for fencecheck integration tests.
