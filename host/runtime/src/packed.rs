//! The host half of `check-packed` (format: `wit/fence.wit`): encode a batch
//! of requests, decode the guest's outcomes. The guest half is
//! `guest/src/packed.rs`; `tests/properties.rs` checks the round trip
//! against `check` item by item.

use crate::{
    AuthFailure, CheckError, Corruption, Decision, GrantKey, GrantSignature, InvalidReason,
    KeyProblem, MAX_KEYS, Outcome, Policy, Request, SignedCheckError, SignedOutcome, Token,
};

const HAS_STATE: u8 = 1;
const HAS_OP_ID: u8 = 1 << 1;
const HAS_EXPECTED: u8 = 1 << 2;
const ALLOW_EQUAL: u8 = 1 << 3;
const HAS_KEYS: u8 = 1 << 4;
const HAS_SIGNATURE: u8 = 1 << 5;

/// Append `items` to `out` as a packed batch. `None` if a count or length
/// does not fit its u32 field (far beyond any transport bound).
pub(crate) fn encode_into(out: &mut Vec<u8>, items: &[(Option<&[u8]>, &Request)]) -> Option<()> {
    encode_items(out, items, None)
}

/// One item of a scope that requires signed tokens (`keys`), as a one-item
/// batch; the signature is the request's own.
pub(crate) fn encode_signed_into(
    out: &mut Vec<u8>,
    state: Option<&[u8]>,
    request: &Request,
    keys: &[GrantKey],
) -> Option<()> {
    encode_items(out, &[(state, request)], Some(keys))
}

/// `keys`: `None` for unsigned items (a request's signature is then not
/// sent: `check` ignores it), else every item is checked against them.
fn encode_items(
    out: &mut Vec<u8>,
    items: &[(Option<&[u8]>, &Request)],
    keys: Option<&[GrantKey]>,
) -> Option<()> {
    let size: usize = items
        .iter()
        .map(|(s, r)| {
            45usize
                .saturating_add(s.map_or(0, <[u8]>::len))
                .saturating_add(r.scope.len())
                .saturating_add(r.op_id.as_ref().map_or(0, String::len))
        })
        .fold(4, usize::saturating_add);
    out.reserve(size);
    out.extend_from_slice(&u32::try_from(items.len()).ok()?.to_le_bytes());
    for (state, request) in items {
        let mut flags = 0;
        if state.is_some() {
            flags |= HAS_STATE;
        }
        if request.op_id.is_some() {
            flags |= HAS_OP_ID;
        }
        if request.expected_version.is_some() {
            flags |= HAS_EXPECTED;
        }
        if request.policy == Policy::AllowEqual {
            flags |= ALLOW_EQUAL;
        }
        if keys.is_some() {
            flags |= HAS_KEYS;
            if request.signature.is_some() {
                flags |= HAS_SIGNATURE;
            }
        }
        out.push(flags);
        for v in [
            request.token.authority,
            request.token.epoch,
            request.token.counter,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(v) = request.expected_version {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put_bytes(out, request.scope.as_bytes())?;
        if let Some(op) = &request.op_id {
            put_bytes(out, op.as_bytes())?;
        }
        if let Some(s) = state {
            put_bytes(out, s)?;
        }
        if let Some(keys) = keys {
            put_auth(out, request.signature.as_ref(), keys)?;
        }
    }
    Some(())
}

/// Keys and signature. Counts and lengths the format cannot carry (a u8)
/// are cut to a size that the guest judges the same way, so the guest
/// still makes every decision: more than 255 keys become the first
/// `MAX_KEYS + 1` (`too-many-keys`, checked before any key), a secret or
/// tag longer than 255 bytes becomes its first 255 (`long-secret` at the
/// same key; a tag that is not 32 bytes is `malformed-signature`).
fn put_auth(
    out: &mut Vec<u8>,
    signature: Option<&GrantSignature>,
    keys: &[GrantKey],
) -> Option<()> {
    let keys = if keys.len() > usize::from(u8::MAX) {
        keys.get(..MAX_KEYS + 1)?
    } else {
        keys
    };
    out.push(u8::try_from(keys.len()).ok()?);
    for key in keys {
        out.extend_from_slice(&key.key_id.to_le_bytes());
        put_short(out, &key.secret);
    }
    if let Some(signature) = signature {
        out.extend_from_slice(&signature.key_id.to_le_bytes());
        put_bytes(out, signature.lease_id.as_bytes())?;
        put_short(out, &signature.tag);
    }
    Some(())
}

fn put_short(out: &mut Vec<u8>, bytes: &[u8]) {
    let bytes = bytes.get(..usize::from(u8::MAX)).unwrap_or(bytes);
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Option<()> {
    out.extend_from_slice(&u32::try_from(bytes.len()).ok()?.to_le_bytes());
    out.extend_from_slice(bytes);
    Some(())
}

/// Decode the guest's packed outcomes; `Err` describes the first thing that
/// does not follow the format (a guest bug: never guess an outcome).
pub(crate) fn decode(bytes: &[u8], expected: usize) -> Result<Vec<Outcome>, String> {
    let mut r = Cursor(bytes);
    let count = r.u32()? as usize;
    if count != expected {
        return Err(format!("{count} results for {expected} items"));
    }
    let mut outcomes = Vec::with_capacity(count);
    for _ in 0..count {
        outcomes.push(outcome(&mut r)?);
    }
    if !r.0.is_empty() {
        return Err(format!("{} trailing bytes", r.0.len()));
    }
    Ok(outcomes)
}

/// [`decode`] of a one-item batch, without the vector.
pub(crate) fn decode_one(bytes: &[u8]) -> Result<Outcome, String> {
    one(bytes, outcome)
}

/// The outcome of a one-item signed batch ([`encode_signed_into`]).
pub(crate) fn decode_signed(bytes: &[u8]) -> Result<SignedOutcome, String> {
    one(bytes, |r| match r.u8()? {
        134 => Ok(Err(SignedCheckError::Unauthenticated(match r.u8()? {
            0 => AuthFailure::Unsigned,
            1 => AuthFailure::UnknownKey,
            2 => AuthFailure::MalformedSignature,
            3 => AuthFailure::BadSignature,
            other => return Err(format!("unknown auth-failure {other}")),
        }))),
        135 => Ok(Err(SignedCheckError::InvalidKeys(match r.u8()? {
            0 => KeyProblem::NoKeys,
            1 => KeyProblem::TooManyKeys,
            2 => KeyProblem::ShortSecret,
            3 => KeyProblem::LongSecret,
            4 => KeyProblem::DuplicateKeyId,
            other => return Err(format!("unknown key-problem {other}")),
        }))),
        tag => Ok(tagged(tag, r)?.map_err(SignedCheckError::Check)),
    })
}

fn one<T>(
    bytes: &[u8],
    read: impl FnOnce(&mut Cursor<'_>) -> Result<T, String>,
) -> Result<T, String> {
    let mut r = Cursor(bytes);
    let count = r.u32()?;
    if count != 1 {
        return Err(format!("{count} results for 1 item"));
    }
    let outcome = read(&mut r)?;
    if !r.0.is_empty() {
        return Err(format!("{} trailing bytes", r.0.len()));
    }
    Ok(outcome)
}

fn outcome(r: &mut Cursor<'_>) -> Result<Outcome, String> {
    let tag = r.u8()?;
    tagged(tag, r)
}

/// An outcome of `check` after its tag (an unsigned batch never holds 134 or 135).
fn tagged(tag: u8, r: &mut Cursor<'_>) -> Result<Outcome, String> {
    {
        Ok(match tag {
            0 => {
                // The common answer: version, token and length in one read.
                let head: [u8; 36] = r.array()?;
                let word = |i: usize| {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(&head[i..i + 8]);
                    u64::from_le_bytes(w)
                };
                let mut len = [0u8; 4];
                len.copy_from_slice(&head[32..]);
                Ok(Decision::Applied {
                    version: word(0),
                    highest: Token::new(word(8), word(16), word(24)),
                    state: r.take(u32::from_le_bytes(len) as usize)?.to_vec(),
                })
            }
            1 => Ok(Decision::Duplicate { version: r.u64()? }),
            2 => Ok(Decision::StaleFence {
                presented: r.token()?,
                highest: r.token()?,
            }),
            3 => Ok(Decision::VersionConflict {
                expected: r.u64()?,
                actual: r.u64()?,
            }),
            128 => Err(CheckError::InvalidRequest(match r.u8()? {
                0 => InvalidReason::MissingToken,
                1 => InvalidReason::EmptyScope,
                2 => InvalidReason::ScopeTooLong,
                3 => InvalidReason::EmptyOpId,
                4 => InvalidReason::OpIdTooLong,
                5 => InvalidReason::EqualTokenUnguarded,
                other => return Err(format!("unknown invalid-reason {other}")),
            })),
            129 => Err(CheckError::CorruptState(match r.u8()? {
                0 => Corruption::Truncated,
                1 => Corruption::LengthMismatch,
                2 => Corruption::ChecksumMismatch,
                3 => Corruption::Malformed,
                other => return Err(format!("unknown corruption {other}")),
            })),
            130 => Err(CheckError::UnsupportedStateVersion(r.u8()?)),
            131 => {
                let len = r.u32()? as usize;
                let scope = std::str::from_utf8(r.take(len)?)
                    .map_err(|_| "scope-mismatch scope is not UTF-8".to_string())?;
                Err(CheckError::ScopeMismatch(scope.to_owned()))
            }
            132 => Err(CheckError::ForeignAuthority {
                stored: r.u64()?,
                presented: r.u64()?,
            }),
            133 => Err(CheckError::Exhausted),
            other => return Err(format!("unknown outcome tag {other}")),
        })
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let (head, rest) = self
            .0
            .split_at_checked(n)
            .ok_or_else(|| "truncated output".to_string())?;
        self.0 = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        self.take(N)?
            .try_into()
            .map_err(|_| "truncated output".to_string())
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn token(&mut self) -> Result<Token, String> {
        Ok(Token::new(self.u64()?, self.u64()?, self.u64()?))
    }
}
