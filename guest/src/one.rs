//! The single-check core export: one crossing per check.
//!
//! A check through `check-packed` costs three calls into the guest
//! (`cabi_realloc` for the argument, the export, its post-return) and two
//! heap blocks that live across calls. Here the input and the output live
//! in two static buffers, so a host that instantiates the core module
//! itself (host/runtime's core transport) makes exactly one call per check:
//!
//! 1. once per instance, `fencecheck-one-input() -> i64` gives the input
//!    buffer's address (high 32 bits) and capacity (low 32 bits);
//! 2. per check, the host writes a one-item `check-packed` batch there and
//!    calls `fencecheck-one(len: i32) -> i64`, which answers the output's
//!    address (high 32 bits) and length (low 32 bits): exactly the bytes
//!    `check-packed` would answer for that batch. `-1` means `malformed`,
//!    `-2` that the input or the answer does not fit the buffers (the host
//!    then sends the batch through `check-packed`).
//!
//! These are core exports outside the WIT: wit-component passes unknown
//! core exports through unlifted, so component hosts never see them and the
//! component's interface is unchanged. Every valid request fits the input
//! buffer (scope, op-id, state window, keys and signature are bounded: about
//! 13 KiB at most); larger inputs are invalid anyway and take the general
//! path, which decides them the same way.

use core::cell::UnsafeCell;

/// The largest one-item batch the input buffer holds.
const INPUT: usize = 16 << 10;
/// The largest answer: a new state is at most the old one plus one op-id.
const OUTPUT: usize = 2 * INPUT + 256;

struct Buffers {
    input: [u8; INPUT],
    output: [u8; OUTPUT],
}

struct Shared(UnsafeCell<Buffers>);

// SAFETY: wasm32 without threads, and an instance is never re-entered.
unsafe impl Sync for Shared {}

static BUFFERS: Shared = Shared(UnsafeCell::new(Buffers {
    input: [0; INPUT],
    output: [0; OUTPUT],
}));

const MALFORMED: i64 = -1;
const DOES_NOT_FIT: i64 = -2;

/// `(address << 32) | length` of a region of linear memory (wasm32: both
/// fit 32 bits).
fn region(at: *const u8, len: usize) -> i64 {
    ((at as usize as u64).wrapping_shl(32) | u64::from(len as u32)) as i64
}

/// The input buffer's address and capacity.
#[unsafe(export_name = "fencecheck-one-input")]
extern "C" fn input() -> i64 {
    // SAFETY: only the address is taken; no reference is made.
    let at = unsafe { core::ptr::addr_of!((*BUFFERS.0.get()).input) };
    region(at.cast(), INPUT)
}

/// Decide the one-item batch in the first `len` bytes of the input buffer.
#[unsafe(export_name = "fencecheck-one")]
extern "C" fn one(len: i32) -> i64 {
    // SAFETY: single-threaded, not re-entered: these are the only live
    // references to the buffers for the duration of this call.
    let buffers = unsafe { &mut *BUFFERS.0.get() };
    let Some(input) = usize::try_from(len)
        .ok()
        .and_then(|len| buffers.input.get(..len))
    else {
        return DOES_NOT_FIT;
    };
    // Allocated from the bump heap and freed on return: the heap is empty
    // again after the call, as after every other export.
    let mut out = Vec::new();
    if crate::check_one_packed(input, &mut out).is_err() {
        return MALFORMED;
    }
    match buffers.output.get_mut(..out.len()) {
        Some(slot) => {
            slot.copy_from_slice(&out);
            region(buffers.output.as_ptr(), out.len())
        }
        None => DOES_NOT_FIT,
    }
}
