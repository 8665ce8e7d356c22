//! The guest's cost in wasm, as wasmtime fuel (about one unit per wasm
//! instruction executed, the same on any machine at any load), for the
//! publish path of `benches/check.rs`: the scope has accepted `0.41`, the
//! request presents `0.42` under `strict`.
//!
//! `Instance` does not expose the fuel left after a call, so this finds the
//! least `Limits::fuel_per_check` under which the calls still succeed (a
//! binary search, compiling the component once per probe):
//!
//! ```sh
//! cargo run -p fencecheck-benches --example guest_fuel [COMPONENT.wasm]
//! ```
//!
//! - `packed`: a 256-item `check-packed` batch gets `256 × fuel_per_check`,
//!   so the least passing value is the batch's cost per check (rounded up).
//! - `single`: one typed `check` on a warm instance (after a warm-up batch).

use fencecheck::{COMPONENT, Decision, Instance, Limits, Policy, Request, Runtime, Token};

const BATCH: usize = 256;

fn instance(component: &[u8], fuel: u64) -> anyhow::Result<Instance> {
    let limits = Limits {
        fuel_per_check: fuel,
        fuel_per_input_byte: 0,
        ..Limits::default()
    };
    // No per-byte allowance, and the component API (the core transport's
    // guest also validates UTF-8): either would skew the least passing budget.
    Ok(Runtime::from_bytes_metered(component, limits)?
        .with_component_transport()
        .instance()?)
}

fn applied(outcome: &fencecheck::Outcome) -> bool {
    matches!(outcome, Ok(Decision::Applied { .. }))
}

/// Whether a 256-item batch succeeds under `fuel` per check.
fn packed_fits(
    component: &[u8],
    fuel: u64,
    state: &[u8],
    request: &Request,
) -> anyhow::Result<bool> {
    let mut guest = instance(component, fuel)?;
    let items: Vec<(Option<&[u8]>, &Request)> =
        (0..BATCH).map(|_| (Some(state), request)).collect();
    Ok(guest
        .check_batch(&items)
        .is_ok_and(|outcomes| outcomes.iter().all(applied)))
}

/// Whether a warm-up batch and then two single checks succeed under `fuel`.
fn single_fits(
    component: &[u8],
    fuel: u64,
    state: &[u8],
    request: &Request,
) -> anyhow::Result<bool> {
    let mut guest = instance(component, fuel)?;
    let items: Vec<(Option<&[u8]>, &Request)> =
        (0..BATCH).map(|_| (Some(state), request)).collect();
    if !guest
        .check_batch(&items)
        .is_ok_and(|o| o.iter().all(applied))
    {
        return Ok(false);
    }
    for _ in 0..2 {
        if !guest.check(Some(state), request).is_ok_and(|o| applied(&o)) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The least fuel in `1..=high` for which `fits` holds (it is monotone).
fn least(mut high: u64, fits: impl Fn(u64) -> anyhow::Result<bool>) -> anyhow::Result<u64> {
    anyhow::ensure!(fits(high)?, "{high} fuel is not enough");
    let mut low = 0u64; // known not to fit
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if fits(mid)? {
            high = mid;
        } else {
            low = mid;
        }
    }
    Ok(high)
}

fn main() -> anyhow::Result<()> {
    let component = match std::env::args().nth(1) {
        Some(path) => std::fs::read(path)?,
        None => COMPONENT.to_vec(),
    };
    let first = Request::new("report/july", Token::new(0, 0, 41), Policy::Strict);
    let Ok(Decision::Applied { state, .. }) = fencecheck_guest::check(None, &first) else {
        anyhow::bail!("setup check was not applied");
    };
    let request = Request::new("report/july", Token::new(0, 0, 42), Policy::Strict);
    let packed = least(16_384, |f| packed_fits(&component, f, &state, &request))?;
    println!("check-packed, {BATCH} items: {packed} fuel per check (rounded up)");
    let single = least(16_384, |f| single_fits(&component, f, &state, &request))?;
    println!("check, one call on a warm instance: {single} fuel");
    Ok(())
}
