//! `check-packed`: the same decisions as `check`, over one byte buffer each
//! way (the format is specified in `wit/fence.wit`). Strings and states are
//! borrowed from the input and new states are written straight into the
//! output, so a batch costs no allocation per item.

use crate::auth::{AuthFailure, KeyProblem, KeyRef, SignatureRef, SignedCheckError, authenticate};
use crate::check::{RequestRef, Verdict, decide};
use crate::frame::Reader;
use crate::types::{CheckError, Corruption, Decision, InvalidReason, Policy, Token};

/// A packed batch that does not follow the format. Nothing was decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchError {
    /// Truncated, trailing bytes, reserved flag bits, or a non-UTF-8 string.
    Malformed,
}

const HAS_STATE: u8 = 1;
const HAS_OP_ID: u8 = 1 << 1;
const HAS_EXPECTED: u8 = 1 << 2;
const ALLOW_EQUAL: u8 = 1 << 3;
const HAS_KEYS: u8 = 1 << 4;
const HAS_SIGNATURE: u8 = 1 << 5;
const KNOWN_FLAGS: u8 =
    HAS_STATE | HAS_OP_ID | HAS_EXPECTED | ALLOW_EQUAL | HAS_KEYS | HAS_SIGNATURE;

/// Output tags, as documented on `check-packed`.
mod tag {
    pub const APPLIED: u8 = 0;
    pub const DUPLICATE: u8 = 1;
    pub const STALE_FENCE: u8 = 2;
    pub const VERSION_CONFLICT: u8 = 3;
    pub const INVALID_REQUEST: u8 = 128;
    pub const CORRUPT_STATE: u8 = 129;
    pub const UNSUPPORTED_STATE_VERSION: u8 = 130;
    pub const SCOPE_MISMATCH: u8 = 131;
    pub const FOREIGN_AUTHORITY: u8 = 132;
    pub const EXHAUSTED: u8 = 133;
    pub const UNAUTHENTICATED: u8 = 134;
    pub const INVALID_KEYS: u8 = 135;
}

/// What authentication (rule 1b) decided for one item, at parse time: a
/// byte or two per item, so unsigned batches carry no key or signature.
#[derive(Clone, Copy, Debug)]
enum Gate {
    /// Not opted in, authenticated, or an invalid request (which `decide`
    /// reports itself, as rule 1 comes before rule 1b).
    Open,
    /// Refused: the key set is unusable.
    InvalidKeys(KeyProblem),
    /// Refused: not authenticated.
    Unauthenticated(AuthFailure),
}

/// Decide every item of a packed batch. The whole input is parsed before
/// anything is decided, so a malformed batch yields no partial output.
pub fn check_packed(input: &[u8]) -> Result<Vec<u8>, BatchError> {
    let items = parse(input)?;
    // Most outputs are a tag, a few integers and one state of about the
    // input's size: reserve once.
    let mut out = Vec::with_capacity(input.len().saturating_add(items.len().saturating_mul(48)));
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for (state, request, gate) in items {
        write_gated(&mut out, state, request, gate);
    }
    Ok(out)
}

type Item<'a> = (Option<&'a [u8]>, RequestRef<'a>, Gate);

/// [`check_packed`] for a batch of exactly one item, written into `out`
/// (cleared first): the same bytes out for the same bytes in, without the
/// batch's item list. What the component's single-check core export calls.
/// A batch whose count is not 1 is `malformed` here (callers send one).
pub fn check_one_packed(input: &[u8], out: &mut Vec<u8>) -> Result<(), BatchError> {
    out.clear();
    let mut r = Reader(input);
    if r.u32().map_err(|_| BatchError::Malformed)? != 1 {
        return Err(BatchError::Malformed);
    }
    let (state, request, gate) = item(&mut r)?;
    r.end().map_err(|_| BatchError::Malformed)?;
    out.reserve(input.len().saturating_add(48));
    out.extend_from_slice(&1u32.to_le_bytes());
    write_gated(out, state, request, gate);
    Ok(())
}

fn write_gated(out: &mut Vec<u8>, state: Option<&[u8]>, request: RequestRef<'_>, gate: Gate) {
    match gate {
        Gate::Open => write_result(out, decide(state, request)),
        Gate::InvalidKeys(problem) => {
            out.push(tag::INVALID_KEYS);
            out.push(problem as u8);
        }
        Gate::Unauthenticated(failure) => {
            out.push(tag::UNAUTHENTICATED);
            out.push(failure as u8);
        }
    }
}

fn parse(input: &[u8]) -> Result<Vec<Item<'_>>, BatchError> {
    let malformed = |_| BatchError::Malformed;
    let mut r = Reader(input);
    let count = r.u32().map_err(malformed)?;
    // Every item takes at least 29 bytes: never trust `count` for capacity.
    let capacity = usize::try_from(count)
        .unwrap_or(usize::MAX)
        .min(input.len() / 29);
    let mut items = Vec::with_capacity(capacity);
    for _ in 0..count {
        items.push(item(&mut r)?);
    }
    r.end().map_err(malformed)?;
    Ok(items)
}

/// One item of a packed batch, authenticated if it opted in.
fn item<'a>(r: &mut Reader<'a>) -> Result<Item<'a>, BatchError> {
    let malformed = |_| BatchError::Malformed;
    // Flags and token: one bounds check for the fixed 25 bytes.
    let (fixed, rest) = r.0.split_first_chunk::<25>().ok_or(BatchError::Malformed)?;
    r.0 = rest;
    let flags = fixed[0];
    if flags & !KNOWN_FLAGS != 0 {
        return Err(BatchError::Malformed);
    }
    let word = |b: &[u8]| b.first_chunk::<8>().map_or(0, |w| u64::from_le_bytes(*w));
    let token = Token::new(word(&fixed[1..9]), word(&fixed[9..17]), word(&fixed[17..]));
    let expected_version = if flags & HAS_EXPECTED != 0 {
        Some(r.u64().map_err(malformed)?)
    } else {
        None
    };
    let scope = text(r)?;
    let op_id = if flags & HAS_OP_ID != 0 {
        Some(text(r)?)
    } else {
        None
    };
    let state = if flags & HAS_STATE != 0 {
        Some(bytes(r)?)
    } else {
        None
    };
    let policy = if flags & ALLOW_EQUAL != 0 {
        Policy::AllowEqual
    } else {
        Policy::Strict
    };
    let request = RequestRef {
        scope,
        token,
        policy,
        op_id,
        expected_version,
    };
    let gate = match (flags & HAS_KEYS != 0, flags & HAS_SIGNATURE != 0) {
        (false, false) => Gate::Open,
        // A signature is only ever checked against keys: without them
        // the item would mean two things, so the batch is refused.
        (false, true) => return Err(BatchError::Malformed),
        (true, signed) => {
            let keys = keys(r)?;
            let signature = if signed { Some(signature(r)?) } else { None };
            match authenticate(&request, signature, &keys) {
                Ok(()) | Err(SignedCheckError::Check(_)) => Gate::Open,
                Err(SignedCheckError::InvalidKeys(p)) => Gate::InvalidKeys(p),
                Err(SignedCheckError::Unauthenticated(a)) => Gate::Unauthenticated(a),
            }
        }
    };
    Ok((state, request, gate))
}

/// `count u8 | count × (key-id u32 | secret-len u8 | secret)`.
fn keys<'a>(r: &mut Reader<'a>) -> Result<Vec<KeyRef<'a>>, BatchError> {
    let malformed = |_| BatchError::Malformed;
    let count = r.take(1).map_err(malformed)?.first().copied().unwrap_or(0);
    let mut keys = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let id = r.u32().map_err(malformed)?;
        let len = r.take(1).map_err(malformed)?.first().copied().unwrap_or(0);
        let secret = r.take(usize::from(len)).map_err(malformed)?;
        keys.push(KeyRef { id, secret });
    }
    Ok(keys)
}

/// `key-id u32 | lease-len u32 | lease-id (UTF-8) | tag-len u8 | tag`.
fn signature<'a>(r: &mut Reader<'a>) -> Result<SignatureRef<'a>, BatchError> {
    let malformed = |_| BatchError::Malformed;
    let key_id = r.u32().map_err(malformed)?;
    let lease_id = text(r)?;
    let len = r.take(1).map_err(malformed)?.first().copied().unwrap_or(0);
    let tag = r.take(usize::from(len)).map_err(malformed)?;
    Ok(SignatureRef {
        key_id,
        lease_id,
        tag,
    })
}

fn bytes<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], BatchError> {
    let len = r.u32().map_err(|_| BatchError::Malformed)?;
    let len = usize::try_from(len).map_err(|_| BatchError::Malformed)?;
    r.take(len).map_err(|_| BatchError::Malformed)
}

/// A string of the batch: its bytes, once checked to be UTF-8. Short ASCII
/// strings (most scopes and op-ids) take `is_ascii`, which costs a fraction
/// of `from_utf8`'s setup; the answer is the same.
fn text<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], BatchError> {
    let text = bytes(r)?;
    if text.is_ascii() || core::str::from_utf8(text).is_ok() {
        Ok(text)
    } else {
        Err(BatchError::Malformed)
    }
}

fn u64s(out: &mut Vec<u8>, values: &[u64]) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn token(out: &mut Vec<u8>, t: Token) {
    u64s(out, &[t.authority, t.epoch, t.counter]);
}

fn write_result(out: &mut Vec<u8>, result: Result<Verdict<'_>, CheckError>) {
    match result {
        Ok(Verdict::Applied { version, next }) => {
            // Tag, version, token and state length in one write.
            let mut head = [0u8; 37];
            head[0] = tag::APPLIED;
            head[1..9].copy_from_slice(&version.to_le_bytes());
            head[9..17].copy_from_slice(&next.highest.authority.to_le_bytes());
            head[17..25].copy_from_slice(&next.highest.epoch.to_le_bytes());
            head[25..33].copy_from_slice(&next.highest.counter.to_le_bytes());
            head[33..].copy_from_slice(&(next.encoded_len() as u32).to_le_bytes());
            out.extend_from_slice(&head);
            next.encode_into(out);
        }
        Ok(Verdict::Decided(decision)) => match decision {
            // `decide` returns applied decisions as `Verdict::Applied`; this
            // arm keeps the match total without a panic.
            Decision::Applied {
                version,
                highest,
                state,
            } => {
                out.push(tag::APPLIED);
                u64s(out, &[version]);
                token(out, highest);
                out.extend_from_slice(&(state.len() as u32).to_le_bytes());
                out.extend_from_slice(&state);
            }
            Decision::Duplicate { version } => {
                out.push(tag::DUPLICATE);
                u64s(out, &[version]);
            }
            Decision::StaleFence { presented, highest } => {
                out.push(tag::STALE_FENCE);
                token(out, presented);
                token(out, highest);
            }
            Decision::VersionConflict { expected, actual } => {
                out.push(tag::VERSION_CONFLICT);
                u64s(out, &[expected, actual]);
            }
        },
        Err(error) => match error {
            CheckError::InvalidRequest(reason) => {
                out.push(tag::INVALID_REQUEST);
                out.push(match reason {
                    InvalidReason::MissingToken => 0,
                    InvalidReason::EmptyScope => 1,
                    InvalidReason::ScopeTooLong => 2,
                    InvalidReason::EmptyOpId => 3,
                    InvalidReason::OpIdTooLong => 4,
                    InvalidReason::EqualTokenUnguarded => 5,
                });
            }
            CheckError::CorruptState(c) => {
                out.push(tag::CORRUPT_STATE);
                out.push(match c {
                    Corruption::Truncated => 0,
                    Corruption::LengthMismatch => 1,
                    Corruption::ChecksumMismatch => 2,
                    Corruption::Malformed => 3,
                });
            }
            CheckError::UnsupportedStateVersion(v) => {
                out.push(tag::UNSUPPORTED_STATE_VERSION);
                out.push(v);
            }
            CheckError::ScopeMismatch(scope) => {
                out.push(tag::SCOPE_MISMATCH);
                out.extend_from_slice(&(scope.len() as u32).to_le_bytes());
                out.extend_from_slice(scope.as_bytes());
            }
            CheckError::ForeignAuthority { stored, presented } => {
                out.push(tag::FOREIGN_AUTHORITY);
                u64s(out, &[stored, presented]);
            }
            CheckError::Exhausted => out.push(tag::EXHAUSTED),
        },
    }
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]
mod tests {
    use super::*;

    fn item(flags: u8, scope: &[u8], extra: &[u8]) -> Vec<u8> {
        let mut v = vec![flags];
        for x in [0u64, 0, 7] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v.extend_from_slice(&(scope.len() as u32).to_le_bytes());
        v.extend_from_slice(scope);
        v.extend_from_slice(extra);
        v
    }

    fn batch(items: &[Vec<u8>]) -> Vec<u8> {
        let mut v = (items.len() as u32).to_le_bytes().to_vec();
        for i in items {
            v.extend_from_slice(i);
        }
        v
    }

    /// A well-formed batch of one fresh-scope request is applied at version 1.
    #[test]
    fn decides_a_well_formed_batch() {
        let out = check_packed(&batch(&[item(0, b"s", &[])]));
        let out = out.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(&out[..4], &1u32.to_le_bytes());
        assert_eq!(out[4], tag::APPLIED);
        assert_eq!(&out[5..13], &1u64.to_le_bytes());
    }

    /// Every departure from the format is `malformed`, never a partial answer.
    #[test]
    fn refuses_malformed_batches() {
        let good = batch(&[item(0, b"s", &[])]);
        let mut trailing = good.clone();
        trailing.push(0);
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            good[..good.len() - 1].to_vec(),
            trailing,
            batch(&[item(1 << 6, b"s", &[])]),
            batch(&[item(HAS_SIGNATURE, b"s", &[0; 9])]),
            batch(&[item(HAS_KEYS, b"s", &[1, 0, 0, 0, 0, 16])]),
            batch(&[item(0, &[0xff, 0xfe], &[])]),
            batch(&[item(HAS_STATE, b"s", &[9, 0, 0, 0, 1])]),
            {
                let mut v = good.clone();
                v[0] = 2; // claims two items, holds one
                v
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            assert_eq!(check_packed(case), Err(BatchError::Malformed), "case {i}");
        }
    }

    /// Signed items: keys (bit 4) and a signature (bit 5) decide exactly as
    /// `check-signed`; keys without a signature are `unsigned`.
    #[test]
    fn signed_items() {
        use crate::auth::{GrantKey, sign};
        let key = GrantKey {
            key_id: 3,
            secret: vec![7; 32],
        };
        let sig = sign("s", Token::new(0, 0, 7), "lease", &key).unwrap_or_else(|e| panic!("{e}"));
        let mut keys = vec![1u8];
        keys.extend_from_slice(&3u32.to_le_bytes());
        keys.push(32);
        keys.extend_from_slice(&key.secret);
        let mut signature = 3u32.to_le_bytes().to_vec();
        signature.extend_from_slice(&5u32.to_le_bytes());
        signature.extend_from_slice(b"lease");
        signature.push(32);
        let mut good = keys.clone();
        good.extend_from_slice(&signature);
        good.extend_from_slice(&sig.tag);
        let mut forged = keys.clone();
        forged.extend_from_slice(&signature);
        forged.extend_from_slice(&[0; 32]);
        let out = check_packed(&batch(&[
            item(HAS_KEYS | HAS_SIGNATURE, b"s", &good),
            item(HAS_KEYS | HAS_SIGNATURE, b"s", &forged),
            item(HAS_KEYS, b"s", &keys),
            item(HAS_KEYS, b"s", &[0]),
        ]));
        let out = out.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(out[4], tag::APPLIED);
        let rest = &out[4 + 37 + usize::from(out[37]) + usize::from(out[38]) * 256..];
        assert_eq!(rest, &[134, 3, 134, 0, 135, 0]);
    }

    /// The one-item path answers byte for byte what a one-item batch
    /// answers, for every well-formed and malformed case above, and refuses
    /// any other count.
    #[test]
    fn one_item_path_matches_the_batch() {
        let mut out = Vec::new();
        let mut cases = vec![
            batch(&[item(0, b"s", &[])]),
            batch(&[item(ALLOW_EQUAL, b"s", &[])]),
            batch(&[item(HAS_KEYS, b"s", &[0])]),
            batch(&[item(0, &[0xff, 0xfe], &[])]),
            batch(&[item(HAS_STATE, b"s", &[9, 0, 0, 0, 1])]),
            batch(&[item(1 << 6, b"s", &[])]),
        ];
        // A state from a first check, then a stale and a newer request on it.
        let first = check_packed(&cases[0]).unwrap_or_else(|e| panic!("{e:?}"));
        let state = &first[4 + 37..];
        let mut with_state = (state.len() as u32).to_le_bytes().to_vec();
        with_state.extend_from_slice(state);
        cases.push(batch(&[item(HAS_STATE, b"s", &with_state)]));
        cases.push(batch(&[item(HAS_STATE, b"t", &with_state)]));
        let mut good = cases[0].clone();
        good.push(0);
        cases.push(good);
        for (i, case) in cases.iter().enumerate() {
            let one = check_one_packed(case, &mut out).map(|()| out.clone());
            assert_eq!(one, check_packed(case), "case {i}");
        }
        let two = batch(&[item(0, b"s", &[]), item(0, b"t", &[])]);
        assert!(check_packed(&two).is_ok());
        assert_eq!(check_one_packed(&two, &mut out), Err(BatchError::Malformed));
        assert_eq!(
            check_one_packed(&0u32.to_le_bytes(), &mut out),
            Err(BatchError::Malformed)
        );
    }

    /// An empty batch is valid and answers zero outcomes.
    #[test]
    fn empty_batch() {
        assert_eq!(
            check_packed(&0u32.to_le_bytes()),
            Ok(0u32.to_le_bytes().to_vec())
        );
    }
}
