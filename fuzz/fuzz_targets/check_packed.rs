//! `check-packed` on any bytes: the native reference and the component over
//! both transports return the same bytes (or both refuse the batch), never
//! trap; a batch is refused exactly when it breaks the documented format
//! (this crate's own parser); and an accepted batch's output is, item by
//! item, what `check` decides for that item (encoded with this crate's own
//! writer), also through the host's typed `check_batch`.
//!
//! Input: `mode u8 | batch`. Mode bit 0: if the batch parses, make every
//! state's frame intact (length and CRC-32C) and encode the batch again.
#![no_main]

use fencecheck_fuzz::{
    Src, encode_packed, encode_packed_outcomes, fix_frame, parse_packed, with_runtimes,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut src = Src(data);
    let mode = src.u8();
    let mut batch = src.0.to_vec();
    let mut items = parse_packed(&batch);
    if mode & 1 != 0
        && let Some(items) = items.as_mut()
    {
        for (state, _) in items.iter_mut() {
            if let Some(state) = state {
                fix_frame(state);
            }
        }
        batch = encode_packed(items);
    }
    with_runtimes(|rt| {
        let output = rt.check_packed(&batch);
        let Some(items) = items else {
            assert!(
                output.is_err(),
                "a batch that breaks the format was accepted"
            );
            return;
        };
        let output = output.unwrap_or_else(|e| panic!("a well-formed batch was refused: {e:?}"));
        let outcomes: Vec<_> = items
            .iter()
            .map(|(state, request)| rt.all("check", |c| c.check(state.as_deref(), request)))
            .collect();
        assert_eq!(
            output,
            encode_packed_outcomes(&outcomes),
            "not the items' checks"
        );
        let pairs: Vec<_> = items.iter().map(|(s, r)| (s.as_deref(), r)).collect();
        let batched = rt.all("check_batch", |c| c.check_batch(&pairs));
        assert_eq!(batched, outcomes, "check_batch differs from check");
    });
});
