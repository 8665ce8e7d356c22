//! Callgrind driver for the native fence check: the publish path of
//! `benches/check.rs` (the scope has accepted `0.41`, the request presents
//! `0.42` under `strict`), looped, so instruction counts are per check and
//! independent of machine load:
//!
//! ```sh
//! cargo build --release -p fencecheck-guest --example check_loop
//! valgrind --tool=callgrind --toggle-collect='check_loop::measured' \
//!     --callgrind-out-file=/tmp/cg.out target/release/examples/check_loop 100000
//! callgrind_annotate /tmp/cg.out     # total / 100,000 = instructions per check
//! ```
//!
//! `check_loop COUNT packed` runs the same pairs through `check_packed` in
//! batches of 256 (COUNT checks in all), the path `check-packed` takes in wasm.

use std::hint::black_box;

use fencecheck_guest::{Decision, Policy, Request, Token, check, check_packed};

const BATCH: u32 = 256;

/// The loop callgrind counts (`--toggle-collect`); setup is excluded.
#[inline(never)]
fn measured(state: &[u8], request: &Request, packed: Option<&[u8]>, count: u32) -> usize {
    let mut bytes = 0usize;
    match packed {
        None => {
            for _ in 0..count {
                let decision = check(black_box(Some(state)), black_box(request));
                if let Ok(Decision::Applied { state, .. }) = decision {
                    bytes = bytes.wrapping_add(state.len());
                }
            }
        }
        Some(batch) => {
            for _ in 0..count / BATCH {
                if let Ok(out) = check_packed(black_box(batch)) {
                    bytes = bytes.wrapping_add(out.len());
                }
            }
        }
    }
    bytes
}

/// `BATCH` copies of one strict item (format: `wit/fence.wit`, `check-packed`).
fn packed(state: &[u8], request: &Request) -> Vec<u8> {
    let mut item = vec![1u8]; // has-state
    for v in [
        request.token.authority,
        request.token.epoch,
        request.token.counter,
    ] {
        item.extend_from_slice(&v.to_le_bytes());
    }
    for bytes in [request.scope.as_bytes(), state] {
        item.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        item.extend_from_slice(bytes);
    }
    let mut batch = BATCH.to_le_bytes().to_vec();
    for _ in 0..BATCH {
        batch.extend_from_slice(&item);
    }
    batch
}

fn main() {
    let mut args = std::env::args().skip(1);
    let count = args
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000u32);
    let first = Request::new("report/july", Token::new(0, 0, 41), Policy::Strict);
    let Ok(Decision::Applied { state, .. }) = check(None, &first) else {
        eprintln!("setup check was not applied");
        std::process::exit(1);
    };
    let request = Request::new("report/july", Token::new(0, 0, 42), Policy::Strict);
    let batch = (args.next().as_deref() == Some("packed")).then(|| packed(&state, &request));
    let bytes = measured(&state, &request, batch.as_deref(), count);
    println!("{count} checks, {bytes} bytes out");
}
