//! Benchmarks live in benches/*.rs.
