//! The fence check over a sequence of requests and damage steps threading
//! one stored-state slot, like a conformance vector: the native reference
//! and the component over both transports decide the same, never trap, and
//! decide what the rules of docs/design.md §3 say (a model written from the
//! rules, on the decoded state). Applied requests are never below the
//! highest accepted token, leave a state that decodes to what the model
//! says and is canonical, and applying the same request again never applies.
//!
//! Input: `flags u8` (bit 0: a starting state follows as a blob; bit 1:
//! make the slot's frame intact before each check), then up to 40 steps:
//! `op u8`, odd: a request (lib.rs, "Input format"), even: a damage step.
#![no_main]

use fencecheck::Decision;
use fencecheck_fuzz::{
    Damage, Src, encode_state, fix_frame, model_check, model_validate, read_request, with_runtimes,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut src = Src(data);
    let flags = src.u8();
    let mut slot = (flags & 1 != 0).then(|| src.blob().to_vec());
    with_runtimes(|rt| {
        for _ in 0..40 {
            if src.is_empty() {
                break;
            }
            if src.u8() & 1 == 0 {
                Damage::read(&mut src).apply(&mut slot);
                continue;
            }
            let request = read_request(&mut src);
            if flags & 2 != 0
                && let Some(state) = slot.as_mut()
            {
                fix_frame(state);
            }
            let state = slot.as_deref();
            let outcome = rt.all("check", |c| c.check(state, &request));
            let old = state.map(|s| rt.all("inspect", |c| c.inspect(s)));
            let expected = match (model_validate(&request), &old) {
                (Some(reason), _) => Err(fencecheck::CheckError::InvalidRequest(reason)),
                (None, Some(Err(e))) => Err(e.clone()),
                (None, Some(Ok(info))) => model_check(Some(info), &request),
                (None, None) => model_check(None, &request),
            };
            match (outcome, expected) {
                (
                    Ok(Decision::Applied {
                        version,
                        highest,
                        state: new,
                    }),
                    Ok((Decision::Applied { version: v, .. }, Some(info))),
                ) => {
                    assert_eq!(version, v, "applied at the wrong version");
                    assert_eq!(highest, request.token, "the new highest is not the token");
                    if let Some(Ok(old)) = &old {
                        // Never applied below the highest accepted token.
                        assert!(
                            (highest.epoch, highest.counter)
                                >= (old.highest.epoch, old.highest.counter),
                            "applied {highest:?} below {:?}",
                            old.highest
                        );
                        assert_eq!(highest.authority, old.authority);
                    }
                    let decoded = rt
                        .all("inspect", |c| c.inspect(&new))
                        .unwrap_or_else(|e| panic!("an applied state does not decode: {e}"));
                    assert_eq!(decoded, info, "the applied state is not the model's");
                    assert_eq!(
                        encode_state(&decoded),
                        new,
                        "the applied state is not canonical"
                    );
                    let again = rt.all("check", |c| c.check(Some(&new), &request));
                    assert!(
                        !matches!(again, Ok(Decision::Applied { .. })),
                        "the same request applied twice: {again:?}"
                    );
                    slot = Some(new);
                }
                (outcome, expected) => {
                    let expected = expected.map(|(decision, _)| decision);
                    assert_eq!(outcome, expected, "{request:?} on {old:?}");
                }
            }
        }
    });
});
