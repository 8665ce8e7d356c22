//! `check-packed` on any bytes: the native reference and the component over
//! both transports return the same bytes (or both refuse the batch), never
//! trap; a batch is refused exactly when it breaks the documented format
//! (this crate's own parser); and an accepted batch's output is, item by
//! item, what `check` decides for that item (encoded with this crate's own
//! writer), also through the host's typed `check_batch` for items that
//! carry no keys; a keyed item (flag 4: its scope requires signed tokens)
//! is what `check-signed` decides for it, and that refuses exactly what
//! this crate's own authentication model (`auth_model`, HMAC-SHA256 over
//! the documented grant message) refuses.
//!
//! Input: `mode u8 | batch`. Mode bit 0: if the batch parses, make every
//! state's frame intact (length and CRC-32C) and encode the batch again.
#![no_main]

use fencecheck_fuzz::{Src, auth_model, encode_packed_outcomes, packed_input, with_runtimes};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (batch, items) = packed_input(&mut Src(data));
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
            .map(|(state, request, keys)| match keys {
                None => rt
                    .all("check", |c| c.check(state.as_deref(), request))
                    .map_err(fencecheck::SignedCheckError::Check),
                Some(keys) => {
                    let signed = rt.all("check_signed", |c| {
                        c.check_signed(state.as_deref(), request, keys)
                    });
                    match auth_model(request, keys) {
                        Some(refusal) => assert_eq!(signed, Err(refusal), "not the auth model"),
                        None => {
                            let unsigned = rt.all("check", |c| c.check(state.as_deref(), request));
                            let unsigned = unsigned.map_err(fencecheck::SignedCheckError::Check);
                            assert_eq!(signed, unsigned, "authenticated, but not check's answer");
                        }
                    }
                    signed
                }
            })
            .collect();
        assert_eq!(
            output,
            encode_packed_outcomes(&outcomes),
            "not the items' checks"
        );
        let unkeyed: Vec<_> = items
            .iter()
            .zip(&outcomes)
            .filter(|((_, _, keys), _)| keys.is_none())
            .collect();
        let pairs: Vec<_> = unkeyed
            .iter()
            .map(|((s, r, _), _)| (s.as_deref(), r))
            .collect();
        let batched = rt.all("check_batch", |c| c.check_batch(&pairs));
        let want: Vec<_> = unkeyed.iter().map(|(_, o)| (*o).clone()).collect();
        let batched: Vec<_> = batched
            .into_iter()
            .map(|o| o.map_err(fencecheck::SignedCheckError::Check))
            .collect();
        assert_eq!(batched, want, "check_batch differs from check");
    });
});
