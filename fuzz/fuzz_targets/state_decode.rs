//! Decoding stored states: `inspect` (fence state) and `inspect-lease`
//! (lease state) on any bytes answer the same on the native reference and on
//! the component over both transports, never trap, and every state that
//! decodes is canonical: written again from its decoded fields (with this
//! crate's own encoder, from the documented layout) it is the same bytes.
//!
//! Input: `mode u8 | bytes`. Mode bit 0: first make the frame intact (length
//! field and CRC-32C), so that mutations reach the field checks behind the
//! checksum.
#![no_main]

use fencecheck_fuzz::{Src, encode_lease, encode_state, fix_frame, with_runtimes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut src = Src(data);
    let mode = src.u8();
    let mut bytes = src.0.to_vec();
    if mode & 1 != 0 {
        fix_frame(&mut bytes);
    }
    with_runtimes(|rt| {
        if let Ok(info) = rt.all("inspect", |c| c.inspect(&bytes)) {
            assert_eq!(encode_state(&info), bytes, "not canonical: {info:?}");
        }
        if let Ok(info) = rt.all("inspect-lease", |c| c.inspect_lease(&bytes)) {
            assert_eq!(encode_lease(&info), bytes, "not canonical: {info:?}");
        }
    });
});
