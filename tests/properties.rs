//! Property tests: random request sequences through the wasm component and the
//! native reference, checked for agreement and for the fencing invariants.

use std::cmp::Ordering;
use std::collections::HashSet;

use fencecheck::{CheckError, Checker, Decision, Native, Policy, Request, Token};
use fencecheck_tests::runtime;
use proptest::prelude::*;

fn token() -> impl Strategy<Value = Token> {
    // Mostly authority 0 and small numbers (so tokens collide and repeat),
    // sometimes the extremes.
    let small = (0u64..3, 0u64..6);
    let edge = (
        prop_oneof![Just(0), Just(u64::MAX)],
        prop_oneof![Just(0), Just(1), Just(u64::MAX)],
    );
    (
        prop_oneof![8 => Just(0u64), 1 => Just(1u64), 1 => Just(u64::MAX)],
        prop_oneof![9 => small, 1 => edge],
    )
        .prop_map(|(authority, (epoch, counter))| Token::new(authority, epoch, counter))
}

fn scope() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => Just("report/july".to_string()),
        2 => Just("rapport/juillet-é".to_string()),
        1 => Just(String::new()),
        1 => "[a-zé😀]{1,8}",
        1 => Just("s".repeat(1024)),
        1 => Just("s".repeat(1025)),
    ]
}

fn op_id() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        6 => "op[0-9]{1,2}".prop_map(Some),
        1 => Just(Some(String::new())),
        1 => Just(Some("o".repeat(257))),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    (
        scope(),
        token(),
        prop_oneof![Just(Policy::Strict), Just(Policy::AllowEqual)],
        op_id(),
        prop_oneof![3 => Just(None), 1 => (0u64..6).prop_map(Some)],
    )
        .prop_map(|(scope, token, policy, op_id, expected_version)| Request {
            scope,
            token,
            policy,
            op_id,
            expected_version,
            signature: None,
        })
}

/// Damage to apply to a stored state: (kind, position, byte).
fn damage() -> impl Strategy<Value = (u8, usize, u8)> {
    (0u8..4, any::<usize>(), any::<u8>())
}

fn damaged(state: &[u8], (kind, at, byte): (u8, usize, u8)) -> Vec<u8> {
    let mut out = state.to_vec();
    match kind {
        0 => {
            let bit = at % (out.len() * 8);
            out[bit / 8] ^= 1 << (bit % 8);
        }
        1 => out.truncate(at % out.len()),
        2 => out.push(byte),
        _ => {
            // Flip two bits in different bytes: still caught by CRC-32C.
            let bit = at % (out.len() * 8);
            out[bit / 8] ^= 1 << (bit % 8);
            let other = (bit / 8 + 1 + at % 7) % out.len();
            if other != bit / 8 {
                out[other] ^= 0x80;
            } else {
                out.push(byte);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    /// Wasm and native give identical decisions and state bytes on random
    /// sequences; the wasm guest never traps; the fencing invariants hold; and
    /// every damaged state is refused.
    #[test]
    fn random_sequences_agree_and_stay_fenced(
        requests in prop::collection::vec(request(), 1..60),
        damages in prop::collection::vec(damage(), 1..8),
    ) {
        let mut wasm = runtime().map_err(|e| TestCaseError::fail(format!("{e:#}")))?.instance()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let mut state: Option<Vec<u8>> = None;
        let mut highest: Option<Token> = None;
        let mut applied_strict: HashSet<(u64, u64, u64)> = HashSet::new();
        for request in &requests {
            let on_wasm = wasm.check(state.as_deref(), request)
                .map_err(|e| TestCaseError::fail(format!("guest failed: {e}")))?;
            let on_native = Native.check(state.as_deref(), request)
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(&on_wasm, &on_native);
            if let Ok(Decision::Applied { state: next, highest: new_highest, .. }) = on_wasm {
                if let Some(previous) = highest {
                    let order = request.token.grant_order(&previous);
                    // Nothing below the highest is ever applied; equal only under allow-equal.
                    prop_assert!(order != Ordering::Less);
                    if request.policy == Policy::Strict {
                        prop_assert_eq!(order, Ordering::Greater);
                    }
                }
                if request.policy == Policy::Strict {
                    let key = (request.token.authority, request.token.epoch, request.token.counter);
                    // Under strict a token is applied at most once.
                    prop_assert!(applied_strict.insert(key), "strict token {:?} applied twice", key);
                }
                prop_assert_eq!(new_highest, request.token);
                highest = Some(new_highest);
                state = Some(next);
            }
        }
        if let Some(bytes) = &state {
            // The stored state decodes to the tracked high-water mark in both runtimes.
            let info = wasm.inspect(bytes).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(&info, &Native.inspect(bytes).map_err(|e| TestCaseError::fail(format!("{e}")))?);
            prop_assert_eq!(info.map(|i| i.highest).ok(), highest);
            for d in &damages {
                let bad = damaged(bytes, *d);
                let probe = Request::new("report/july", Token::new(0, 9, 9), Policy::Strict);
                let on_wasm = wasm.check(Some(&bad), &probe)
                    .map_err(|e| TestCaseError::fail(format!("guest failed: {e}")))?;
                prop_assert!(matches!(on_wasm, Err(CheckError::CorruptState(_))), "{:?} accepted: {:?}", d, on_wasm);
                prop_assert_eq!(&on_wasm, &native(&bad, &probe)?);
            }
        }
    }

    /// A random batch gives the same outcomes, item by item, through single
    /// `check` calls, the typed `check-batch`, the packed `check-packed`, and
    /// the native reference: the packed transport changes nothing.
    #[test]
    fn batches_agree_with_single_checks(
        requests in prop::collection::vec(request(), 0..40),
        seeds in prop::collection::vec(prop::collection::vec(request(), 1..4), 1..4),
        damages in prop::collection::vec(damage(), 0..4),
    ) {
        let mut wasm = runtime().map_err(|e| TestCaseError::fail(format!("{e:#}")))?.instance()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        // A few stored states to check against: built by applying seed
        // sequences, some of them then damaged.
        let mut states: Vec<Option<Vec<u8>>> = vec![None];
        for seq in &seeds {
            let mut state: Option<Vec<u8>> = None;
            for r in seq {
                if let Ok(Ok(Decision::Applied { state: next, .. })) = Native.check(state.as_deref(), r) {
                    state = Some(next);
                }
            }
            if let Some(bytes) = &state {
                for d in &damages {
                    states.push(Some(damaged(bytes, *d)));
                }
            }
            states.push(state);
        }
        let items: Vec<(Option<&[u8]>, &Request)> = requests
            .iter()
            .enumerate()
            .map(|(i, r)| (states[i % states.len()].as_deref(), r))
            .collect();
        let single: Vec<fencecheck::Outcome> = items
            .iter()
            .map(|(s, r)| wasm.check(*s, r))
            .collect::<Result<_, _>>()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let packed = wasm.check_batch(&items).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let typed = wasm.check_batch_typed(&items).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let native = Native.check_batch(&items).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        prop_assert_eq!(&packed, &single);
        prop_assert_eq!(&typed, &single);
        prop_assert_eq!(&native, &single);
    }

    /// The core transport (the default) and the component API answer every
    /// check of a random sequence, damaged states included, identically:
    /// decisions, errors and state bytes.
    #[test]
    fn core_and_component_transports_agree(
        requests in prop::collection::vec(request(), 1..40),
        damages in prop::collection::vec(damage(), 1..6),
    ) {
        let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}"));
        let rt = runtime().map_err(|e| fail(&format!("{e:#}")))?;
        prop_assert_eq!(rt.transport(), fencecheck::Transport::Core);
        let component_rt = rt.with_component_transport();
        prop_assert_eq!(component_rt.transport(), fencecheck::Transport::Component);
        let mut core = rt.instance().map_err(|e| fail(&e))?;
        let mut component = component_rt.instance().map_err(|e| fail(&e))?;
        let mut state: Option<Vec<u8>> = None;
        for (i, request) in requests.iter().enumerate() {
            let input = match (i % 5, &state) {
                (4, Some(s)) => Some(damaged(s, damages[i % damages.len()])),
                _ => state.clone(),
            };
            let on_core = core.check(input.as_deref(), request).map_err(|e| fail(&e))?;
            let on_component = component.check(input.as_deref(), request).map_err(|e| fail(&e))?;
            prop_assert_eq!(&on_core, &on_component);
            if let Ok(Decision::Applied { state: next, .. }) = on_core {
                state = Some(next);
            }
        }
    }

    /// Arbitrary bytes sent to `check-packed` never trap the guest, and wasm
    /// answers exactly what the native reference answers (usually `malformed`).
    #[test]
    fn arbitrary_packed_batches_never_trap(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut wasm = runtime().map_err(|e| TestCaseError::fail(format!("{e:#}")))?.instance()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let on_wasm = wasm.check_packed_raw(&bytes)
            .map_err(|e| TestCaseError::fail(format!("guest failed: {e}")))?;
        prop_assert_eq!(on_wasm, fencecheck_guest::check_packed(&bytes));
    }

    /// Arbitrary bytes as state never trap the guest and never decide
    /// anything but an error (they are never a valid, checksummed frame here).
    #[test]
    fn arbitrary_state_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut wasm = runtime().map_err(|e| TestCaseError::fail(format!("{e:#}")))?.instance()
            .map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let probe = Request::new("report/july", Token::new(0, 1, 1), Policy::Strict);
        let on_wasm = wasm.check(Some(&bytes), &probe)
            .map_err(|e| TestCaseError::fail(format!("guest failed: {e}")))?;
        prop_assert!(on_wasm.is_err(), "{:?}", on_wasm);
        prop_assert_eq!(&on_wasm, &native(&bytes, &probe)?);
    }
}

fn native(state: &[u8], request: &Request) -> Result<fencecheck::Outcome, TestCaseError> {
    Native
        .check(Some(state), request)
        .map_err(|e| TestCaseError::fail(format!("{e}")))
}

/// A key with a secret of 10 to 70 bytes (some unusable) and a small id
/// (so ids repeat).
fn grant_key() -> impl Strategy<Value = fencecheck::GrantKey> {
    (0u32..4, prop::collection::vec(any::<u8>(), 10..70))
        .prop_map(|(key_id, secret)| fencecheck::GrantKey { key_id, secret })
}

/// How a signed request's signature is made: honestly by one of the keys,
/// by a key outside the set, or as bytes; then maybe tampered.
#[derive(Clone, Debug)]
enum Signing {
    Honest(usize),
    Stranger(fencecheck::GrantKey),
    Garbage(u32, String, Vec<u8>),
    None,
}

fn signing() -> impl Strategy<Value = (Signing, Option<u8>)> {
    (
        prop_oneof![
            6 => any::<usize>().prop_map(Signing::Honest),
            1 => grant_key().prop_map(Signing::Stranger),
            1 => (0u32..4, "[a-z]{0,3}", prop::collection::vec(any::<u8>(), 30..34))
                .prop_map(|(k, l, t)| Signing::Garbage(k, l, t)),
            1 => Just(Signing::None),
        ],
        prop_oneof![4 => Just(None), 1 => (0u8..4).prop_map(Some)],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Signed checks on random sequences agree byte for byte between the
    /// native reference and both wasm transports; an applied signed request
    /// always carried an honest, untampered signature by a key of the set;
    /// and nothing below the highest token is ever applied.
    #[test]
    fn signed_sequences_agree_and_only_honest_grants_apply(
        steps in prop::collection::vec((request(), signing()), 1..30),
        keys in prop::collection::vec(grant_key(), 0..4),
    ) {
        let fail = |e: &dyn std::fmt::Display| TestCaseError::fail(format!("{e}"));
        let rt = runtime().map_err(|e| fail(&format!("{e:#}")))?;
        let mut core = rt.instance().map_err(|e| fail(&e))?;
        let mut component = rt.with_component_transport().instance().map_err(|e| fail(&e))?;
        let mut state: Option<Vec<u8>> = None;
        let mut highest: Option<Token> = None;
        for (request, (how, tamper)) in &steps {
            let mut request = request.clone();
            let mut honest = false;
            request.signature = match how {
                Signing::Honest(i) if !keys.is_empty() => {
                    let key = &keys[i % keys.len()];
                    honest = true;
                    fencecheck_guest::sign(&request.scope, request.token, "lease-1", key).ok()
                }
                Signing::Stranger(key) => {
                    fencecheck_guest::sign(&request.scope, request.token, "lease-1", key).ok()
                }
                Signing::Garbage(key_id, lease_id, tag) => Some(fencecheck::GrantSignature {
                    key_id: *key_id, lease_id: lease_id.clone(), tag: tag.clone(),
                }),
                _ => None,
            };
            if let (Some(t), Some(s)) = (tamper, request.signature.as_mut()) {
                honest = false;
                match t {
                    0 => request.token.counter ^= 1,
                    1 => s.lease_id.push('x'),
                    2 => s.tag[0] ^= 1,
                    _ => request.scope.push('x'),
                }
            }
            let native = Native.check_signed(state.as_deref(), &request, &keys).map_err(|e| fail(&e))?;
            for wasm in [&mut core, &mut component] {
                let answer = wasm.check_signed(state.as_deref(), &request, &keys)
                    .map_err(|e| fail(&format!("guest failed: {e}")))?;
                prop_assert_eq!(&answer, &native);
            }
            if let Ok(Decision::Applied { state: next, highest: new_highest, .. }) = native {
                // Keys that sign a colliding id could authenticate the other
                // key's signature only if both secrets were equal.
                prop_assert!(honest || request.signature.as_ref().is_some_and(|s| keys.iter().any(|k| {
                    k.key_id == s.key_id
                        && fencecheck_guest::sign(&request.scope, request.token, &s.lease_id, k).ok().as_ref() == Some(s)
                })), "a request without an honest signature was applied: {:?}", request);
                if let Some(previous) = highest {
                    prop_assert!(request.token.grant_order(&previous) != Ordering::Less);
                }
                highest = Some(new_highest);
                state = Some(next);
            }
        }
    }
}
