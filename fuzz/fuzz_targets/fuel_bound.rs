//! The guest's cost is linear in its input: every call's fuel (about one
//! unit per wasm instruction, counted by a metered runtime over the embedded
//! component) stays below `FUEL_BOUND_BASE + FUEL_BOUND_PER_BYTE ×
//! input_bytes` (host/runtime/src/runtime.rs, docs/design.md §7). This is
//! what lets the embedded component run without fuel: a guest change that
//! makes any call superlinear in its input (a quadratic loop over a state,
//! a scope, a batch) exceeds the line on a large enough input and fails
//! here, in CI's fuzzing step, before it ships unmetered.
//!
//! Input: `sel u8`, then by `sel % 4`:
//! - 0: `mode u8 | batch`, as the `check_packed` target (bit 0 of `mode`:
//!   make each parsed state's frame intact): `check-packed` over the core
//!   transport and the component API; input bytes: the batch;
//! - 1: `fix u8 | state blob | request` (lib.rs `read_request`): `check`
//!   over both transports (the core transport's single-check export), and
//!   `inspect` of the state; input bytes: state, scope and op-id;
//! - 2: `state blob | lock string | lease-id string | now u64 | ttl u64 |
//!   token`: `acquire`, `renew`, `release`, `restore` and `inspect_lease`
//!   on the state; input bytes: state, lock and lease-id;
//! - 3: as 0, through the typed `check-batch` for the unkeyed items.
//!
//! Nothing here compares answers (the other targets do): only the cost.
#![no_main]

use std::cell::RefCell;

use fencecheck::{
    AcquireRequest, FUEL_BOUND_BASE, FUEL_BOUND_PER_BYTE, Instance, Limits, ReleaseRequest,
    RenewRequest, Runtime, Token,
};
use fencecheck_fuzz::{Src, fix_frame, packed_input, read_request};
use libfuzzer_sys::fuzz_target;

struct Metered {
    core: Instance,
    component: Instance,
}

thread_local! {
    static METERED: RefCell<Option<Metered>> = const { RefCell::new(None) };
}

fn metered() -> Metered {
    // Fuel enough never to trap: the bound, not the budget, is under test.
    let limits = Limits {
        fuel_per_check: 1 << 40,
        ..Limits::default()
    };
    let rt = Runtime::from_bytes_metered(fencecheck::COMPONENT, limits)
        .unwrap_or_else(|e| panic!("loading the component metered: {e}"));
    let instance = |rt: &Runtime| {
        rt.instance()
            .unwrap_or_else(|e| panic!("instantiating: {e}"))
    };
    Metered {
        core: instance(&rt),
        component: instance(&rt.with_component_transport()),
    }
}

/// Assert the last call of `guest` stayed under the line for `bytes`.
fn within(guest: &Instance, what: &str, bytes: usize) {
    let Some(fuel) = guest.last_fuel() else {
        panic!("{what}: a metered call reported no fuel (it trapped?)");
    };
    let bound = FUEL_BOUND_BASE.saturating_add(FUEL_BOUND_PER_BYTE.saturating_mul(bytes as u64));
    assert!(
        fuel <= bound,
        "{what}: {fuel} fuel for {bytes} input bytes, above the documented bound {bound} \
         ({FUEL_BOUND_BASE} + {FUEL_BOUND_PER_BYTE} per byte): the guest is no longer linear in its input"
    );
}

fuzz_target!(|data: &[u8]| {
    let mut src = Src(data);
    let sel = src.u8() % 4;
    METERED.with(|cell| {
        let mut cell = cell.borrow_mut();
        let m = cell.get_or_insert_with(metered);
        match sel {
            0 => {
                let (batch, _) = packed_input(&mut src);
                for (name, guest) in [("core", &mut m.core), ("component", &mut m.component)] {
                    let _ = guest.check_packed_raw(&batch);
                    within(guest, &format!("check-packed ({name})"), batch.len());
                }
            }
            1 => {
                let fix = src.u8() & 1 != 0;
                let mut state = src.blob().to_vec();
                if fix {
                    fix_frame(&mut state);
                }
                let request = read_request(&mut src);
                let bytes = state.len()
                    + request.scope.len()
                    + request.op_id.as_ref().map_or(0, String::len);
                for (name, guest) in [("core", &mut m.core), ("component", &mut m.component)] {
                    for state in [None, Some(state.as_slice())] {
                        if guest.check(state, &request).is_ok() {
                            within(guest, &format!("check ({name})"), bytes);
                        }
                    }
                }
                if m.component.inspect(&state).is_ok() {
                    within(&m.component, "inspect", state.len());
                }
            }
            2 => {
                let state = src.blob().to_vec();
                let lock = src.string();
                let lease_id = src.string();
                let (now, ttl) = (src.u64(), src.u64());
                let token = Token::new(src.u64(), src.u64(), src.u64());
                let bytes = state.len() + lock.len() + lease_id.len();
                let g = &mut m.component;
                for state in [None, Some(state.as_slice())] {
                    let acquire = AcquireRequest {
                        lock: lock.clone(),
                        lease_id: lease_id.clone(),
                        authority: token.authority,
                        epoch_floor: token.epoch,
                        now,
                        ttl,
                    };
                    if g.acquire(state, &acquire).is_ok() {
                        within(g, "acquire", bytes);
                    }
                    let renew = RenewRequest {
                        lease_id: lease_id.clone(),
                        token,
                        now,
                        ttl,
                    };
                    if g.renew(state, &renew).is_ok() {
                        within(g, "renew", bytes);
                    }
                    let release = ReleaseRequest {
                        lease_id: lease_id.clone(),
                        token,
                    };
                    if g.release(state, &release).is_ok() {
                        within(g, "release", bytes);
                    }
                    if g.restore(state).is_ok() {
                        within(g, "restore", bytes);
                    }
                }
                if g.inspect_lease(&state).is_ok() {
                    within(g, "inspect_lease", bytes);
                }
            }
            _ => {
                let (_, items) = packed_input(&mut src);
                let Some(items) = items else { return };
                let pairs: Vec<_> = items
                    .iter()
                    .filter(|(_, _, keys)| keys.is_none())
                    .map(|(s, r, _)| (s.as_deref(), r))
                    .collect();
                let bytes = pairs
                    .iter()
                    .map(|(s, r)| {
                        s.map_or(0, <[u8]>::len)
                            + r.scope.len()
                            + r.op_id.as_ref().map_or(0, String::len)
                    })
                    .sum::<usize>()
                    // Each item's fixed fields (flags, token, lengths) cost
                    // per item, as a packed item's 29 bytes do.
                    + 29 * pairs.len();
                if m.component.check_batch_typed(&pairs).is_ok() {
                    within(&m.component, "check-batch (typed)", bytes);
                }
            }
        }
    });
});
