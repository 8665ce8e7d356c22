//! The grant side: lease decisions over one lock's state (docs/design.md §5, "The
//! lease authority").
//!
//! Pure like the fence check: the coordinator's clock comes in as `now`
//! (milliseconds of its time authority), and the host stores the returned
//! state in the same transaction (or compare-and-swap) that read it.
//!
//! Lease state, inside the shared frame with magic `"LS"`, format 1:
//!
//! ```text
//! authority u64 | epoch u64 | counter u64 (last issued in this epoch; 0: none yet)
//! lock-len u16 | lock (UTF-8)
//! held u8 (0 | 1) [ lease-id-len u16 | lease-id | token.epoch u64 | token.counter u64 | expires-at u64 ]
//! ```
//!
//! A holder's token may be from an earlier epoch than the lock's (after
//! `restore`); it is always at or below the lock's `(epoch, counter)`.

use core::fmt;

use crate::frame::{self, FORMAT_VERSION, FrameError, Reader, Writer};
use crate::types::{Corruption, Token};

/// Longest lock name accepted, in bytes (as long as a fence scope).
pub const MAX_LOCK_BYTES: usize = crate::types::MAX_SCOPE_BYTES;
/// Longest lease id accepted, in bytes.
pub const MAX_LEASE_ID_BYTES: usize = 256;

const MAGIC: [u8; 2] = *b"LS";

/// A request to acquire a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The lock (the fencing scope its tokens are for).
    pub lock: String,
    /// Unique id of this acquisition attempt; a retry with the same id while
    /// the lease is held returns the same grant.
    pub lease_id: String,
    /// The grant authority; pinned into the lock's state on first use.
    pub authority: u64,
    /// The lowest epoch new grants may use: a coordinator that was restored
    /// raises it, so locks its backup did not know also start above every
    /// token a resource may hold. 0 when unused.
    pub epoch_floor: u64,
    /// The coordinator's time, in milliseconds.
    pub now: u64,
    /// Lease length in milliseconds; must be positive.
    pub ttl: u64,
}

/// A request to renew the exact current lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewRequest {
    /// The lease id returned at acquisition.
    pub lease_id: String,
    /// The token returned at acquisition.
    pub token: Token,
    /// The coordinator's time, in milliseconds.
    pub now: u64,
    /// New lease length from `now`; must be positive.
    pub ttl: u64,
}

/// A request to release the exact current lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// The lease id returned at acquisition.
    pub lease_id: String,
    /// The token returned at acquisition.
    pub token: Token,
}

/// The current holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Holder {
    /// Its lease id.
    pub lease_id: String,
    /// Its fencing token.
    pub token: Token,
    /// When its lease ends (`expires_at <= now` means expired).
    pub expires_at: u64,
}

/// The outcome of `acquire`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquire {
    /// Granted (or a retry of the current grant); store `state`.
    Acquired {
        /// The grant's fencing token.
        token: Token,
        /// When the lease ends.
        expires_at: u64,
        /// The new lock state.
        state: Vec<u8>,
    },
    /// Another unexpired lease holds the lock. Nothing changes.
    Busy {
        /// The holder's lease id.
        holder: String,
        /// When its lease ends.
        expires_at: u64,
    },
}

/// The outcome of `renew`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Renew {
    /// Extended; store `state`. The token is unchanged.
    Renewed {
        /// The new end of the lease.
        expires_at: u64,
        /// The new lock state.
        state: Vec<u8>,
    },
    /// Not the current, unexpired lease. Nothing changes; stop working.
    Lost,
}

/// The outcome of `release`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// The lock is free; store `state`. The counter is kept.
    Released {
        /// The new lock state.
        state: Vec<u8>,
    },
    /// Not the current lease (e.g. an old owner's delayed release). Nothing changes.
    NotOwner,
}

/// Why a lease request is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LeaseInvalidReason {
    /// Empty lock name.
    EmptyLock,
    /// Lock name longer than [`MAX_LOCK_BYTES`].
    LockTooLong,
    /// Empty lease id.
    EmptyLeaseId,
    /// Lease id longer than [`MAX_LEASE_ID_BYTES`].
    LeaseIdTooLong,
    /// `ttl = 0`.
    ZeroTtl,
    /// `now + ttl` overflows u64.
    ExpiryOverflow,
    /// A renew or release without a token (`epoch = counter = 0`).
    MissingToken,
    /// `restore` of a lock that has no state.
    NoState,
}

/// Why a lease decision could not be made. Nothing may change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseError {
    /// The request is malformed.
    InvalidRequest(LeaseInvalidReason),
    /// The stored lease state is damaged.
    CorruptState(Corruption),
    /// The lease state was written by a newer format version.
    UnsupportedStateVersion(u8),
    /// The state belongs to another lock (carried here).
    LockMismatch(String),
    /// The request's authority is not the lock's.
    ForeignAuthority {
        /// The lock's authority.
        stored: u64,
        /// The request's authority.
        presented: u64,
    },
    /// The counter (or, for restore, the epoch) would overflow: start a new
    /// epoch (or a new authority).
    Exhausted,
}

impl LeaseInvalidReason {
    /// The reason's kebab-case name, as in WIT (`zero-ttl`…).
    pub const fn name(self) -> &'static str {
        match self {
            LeaseInvalidReason::EmptyLock => "empty-lock",
            LeaseInvalidReason::LockTooLong => "lock-too-long",
            LeaseInvalidReason::EmptyLeaseId => "empty-lease-id",
            LeaseInvalidReason::LeaseIdTooLong => "lease-id-too-long",
            LeaseInvalidReason::ZeroTtl => "zero-ttl",
            LeaseInvalidReason::ExpiryOverflow => "expiry-overflow",
            LeaseInvalidReason::MissingToken => "missing-token",
            LeaseInvalidReason::NoState => "no-state",
        }
    }
}

impl LeaseError {
    /// The error's kebab-case name, as in WIT and in conformance vectors.
    /// Stable: hosts and clients match on it.
    pub fn name(&self) -> &'static str {
        match self {
            LeaseError::InvalidRequest(_) => "invalid-request",
            LeaseError::CorruptState(_) => "corrupt-state",
            LeaseError::UnsupportedStateVersion(_) => "unsupported-state-version",
            LeaseError::LockMismatch(_) => "lock-mismatch",
            LeaseError::ForeignAuthority { .. } => "foreign-authority",
            LeaseError::Exhausted => "exhausted",
        }
    }

    /// The kebab-case sub-case of `invalid-request` and `corrupt-state`
    /// (`zero-ttl`, `checksum-mismatch`…); `None` for the other errors.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            LeaseError::InvalidRequest(r) => Some(r.name()),
            LeaseError::CorruptState(c) => Some(c.name()),
            _ => None,
        }
    }
}

impl fmt::Display for LeaseInvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `name: detail`, e.g. `invalid-request: zero-ttl` or `lock-mismatch: the
/// state belongs to lock "report/june"`. The name is stable; the detail is
/// for people.
impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.name())?;
        match self {
            LeaseError::InvalidRequest(r) => f.write_str(r.name()),
            LeaseError::CorruptState(c) => f.write_str(c.name()),
            LeaseError::UnsupportedStateVersion(v) => write!(
                f,
                "the lease state has format version {v}, newer than this component reads"
            ),
            LeaseError::LockMismatch(l) => write!(f, "the state belongs to lock {l:?}"),
            LeaseError::ForeignAuthority { stored, presented } => write!(
                f,
                "the lock is pinned to authority {stored}, the request is from {presented}"
            ),
            LeaseError::Exhausted => {
                f.write_str("the lock's counter (or, for restore, its epoch) would overflow")
            }
        }
    }
}

impl std::error::Error for LeaseError {}

impl From<FrameError> for LeaseError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Corrupt(c) => LeaseError::CorruptState(c),
            FrameError::Unsupported(v) => LeaseError::UnsupportedStateVersion(v),
        }
    }
}

/// A decoded lease state, for tools and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LeaseInfo {
    /// Encoding format version.
    pub format_version: u8,
    /// The lock.
    pub lock: String,
    /// Its grant authority.
    pub authority: u64,
    /// The current epoch.
    pub epoch: u64,
    /// The last counter issued in this epoch (0: none yet).
    pub counter: u64,
    /// The current holder, expired or not; `None` after release.
    pub holder: Option<Holder>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct LeaseState {
    lock: String,
    authority: u64,
    epoch: u64,
    counter: u64,
    holder: Option<Holder>,
}

impl LeaseState {
    fn encode(&self) -> Vec<u8> {
        let holder_len = self
            .holder
            .as_ref()
            .map_or(0, |h| h.lease_id.len().saturating_add(26));
        let body_len = holder_len
            .saturating_add(27)
            .saturating_add(self.lock.len());
        let mut out = Vec::with_capacity(frame::framed_len(body_len));
        let mut w = Writer::new(&mut out, MAGIC, body_len);
        w.u64(self.authority);
        w.u64(self.epoch);
        w.u64(self.counter);
        w.str(&self.lock);
        match &self.holder {
            None => w.u8(0),
            Some(h) => {
                w.u8(1);
                w.str(&h.lease_id);
                w.u64(h.token.epoch);
                w.u64(h.token.counter);
                w.u64(h.expires_at);
            }
        }
        w.finish();
        out
    }

    fn decode(bytes: &[u8]) -> Result<LeaseState, LeaseError> {
        let (body, _) = frame::open(bytes, MAGIC)?;
        Self::decode_body(body).map_err(LeaseError::CorruptState)
    }

    fn decode_body(body: &[u8]) -> Result<LeaseState, Corruption> {
        let mut r = Reader(body);
        let authority = r.u64()?;
        let epoch = r.u64()?;
        let counter = r.u64()?;
        let lock = r.str(1, MAX_LOCK_BYTES)?.to_owned();
        let holder = match r.u8()? {
            0 => None,
            1 => {
                let lease_id = r.str(1, MAX_LEASE_ID_BYTES)?.to_owned();
                let token = Token::new(authority, r.u64()?, r.u64()?);
                let expires_at = r.u64()?;
                // A holder's grant was issued by this lock: never above the
                // lock's counter, never "no token".
                if token.is_missing() || (token.epoch, token.counter) > (epoch, counter) {
                    return Err(Corruption::Malformed);
                }
                Some(Holder {
                    lease_id,
                    token,
                    expires_at,
                })
            }
            _ => return Err(Corruption::Malformed),
        };
        r.end()?;
        Ok(LeaseState {
            lock,
            authority,
            epoch,
            counter,
            holder,
        })
    }
}

fn check_lock(lock: &str) -> Result<(), LeaseInvalidReason> {
    match lock.len() {
        0 => Err(LeaseInvalidReason::EmptyLock),
        n if n > MAX_LOCK_BYTES => Err(LeaseInvalidReason::LockTooLong),
        _ => Ok(()),
    }
}

fn check_lease_id(id: &str) -> Result<(), LeaseInvalidReason> {
    match id.len() {
        0 => Err(LeaseInvalidReason::EmptyLeaseId),
        n if n > MAX_LEASE_ID_BYTES => Err(LeaseInvalidReason::LeaseIdTooLong),
        _ => Ok(()),
    }
}

fn expiry(now: u64, ttl: u64) -> Result<u64, LeaseInvalidReason> {
    if ttl == 0 {
        return Err(LeaseInvalidReason::ZeroTtl);
    }
    now.checked_add(ttl)
        .ok_or(LeaseInvalidReason::ExpiryOverflow)
}

/// Acquire `request.lock`, or report who holds it.
pub fn acquire(state: Option<&[u8]>, request: &AcquireRequest) -> Result<Acquire, LeaseError> {
    let invalid = LeaseError::InvalidRequest;
    check_lock(&request.lock).map_err(invalid)?;
    check_lease_id(&request.lease_id).map_err(invalid)?;
    let expires_at = expiry(request.now, request.ttl).map_err(invalid)?;

    let mut lease = match state {
        None => LeaseState {
            lock: request.lock.clone(),
            authority: request.authority,
            epoch: request.epoch_floor,
            counter: 0,
            holder: None,
        },
        Some(bytes) => {
            let lease = LeaseState::decode(bytes)?;
            if lease.lock != request.lock {
                return Err(LeaseError::LockMismatch(lease.lock));
            }
            if lease.authority != request.authority {
                return Err(LeaseError::ForeignAuthority {
                    stored: lease.authority,
                    presented: request.authority,
                });
            }
            lease
        }
    };
    if let Some(holder) = &lease.holder
        && request.now < holder.expires_at
    {
        return Ok(if holder.lease_id == request.lease_id {
            // A retried request: the same grant, unchanged.
            Acquire::Acquired {
                token: holder.token,
                expires_at: holder.expires_at,
                state: lease.encode(),
            }
        } else {
            Acquire::Busy {
                holder: holder.lease_id.clone(),
                expires_at: holder.expires_at,
            }
        });
    }
    if lease.epoch < request.epoch_floor {
        lease.epoch = request.epoch_floor;
        lease.counter = 0;
    }
    let counter = lease.counter.checked_add(1).ok_or(LeaseError::Exhausted)?;
    let token = Token::new(lease.authority, lease.epoch, counter);
    if token.is_missing() {
        // Unreachable (counter >= 1), but "no token" must never be issued.
        return Err(LeaseError::Exhausted);
    }
    lease.counter = counter;
    lease.holder = Some(Holder {
        lease_id: request.lease_id.clone(),
        token,
        expires_at,
    });
    Ok(Acquire::Acquired {
        token,
        expires_at,
        state: lease.encode(),
    })
}

/// The decoded state if `(lease_id, token)` is its exact current holder.
fn current_holder(
    state: Option<&[u8]>,
    lease_id: &str,
    token: Token,
) -> Result<Option<LeaseState>, LeaseError> {
    check_lease_id(lease_id).map_err(LeaseError::InvalidRequest)?;
    if token.is_missing() {
        return Err(LeaseError::InvalidRequest(LeaseInvalidReason::MissingToken));
    }
    let Some(bytes) = state else {
        return Ok(None);
    };
    let lease = LeaseState::decode(bytes)?;
    let exact = lease
        .holder
        .as_ref()
        .is_some_and(|h| h.lease_id == lease_id && h.token == token);
    Ok(exact.then_some(lease))
}

/// Extend the exact current, unexpired lease; anything else is `Lost`.
pub fn renew(state: Option<&[u8]>, request: &RenewRequest) -> Result<Renew, LeaseError> {
    let expires_at = expiry(request.now, request.ttl).map_err(LeaseError::InvalidRequest)?;
    let Some(mut lease) = current_holder(state, &request.lease_id, request.token)? else {
        return Ok(Renew::Lost);
    };
    match lease.holder.as_mut() {
        Some(holder) if request.now < holder.expires_at => {
            holder.expires_at = expires_at;
            Ok(Renew::Renewed {
                expires_at,
                state: lease.encode(),
            })
        }
        _ => Ok(Renew::Lost),
    }
}

/// Release the exact current lease; anything else is `NotOwner`.
pub fn release(state: Option<&[u8]>, request: &ReleaseRequest) -> Result<Release, LeaseError> {
    let Some(mut lease) = current_holder(state, &request.lease_id, request.token)? else {
        return Ok(Release::NotOwner);
    };
    lease.holder = None;
    Ok(Release::Released {
        state: lease.encode(),
    })
}

/// Start the lock's next epoch (after restoring a coordinator from a backup):
/// only the epoch and counter change; the next grant is `(epoch + 1, 1)`.
/// Returns the new epoch and state.
pub fn restore(state: Option<&[u8]>) -> Result<(u64, Vec<u8>), LeaseError> {
    let Some(bytes) = state else {
        return Err(LeaseError::InvalidRequest(LeaseInvalidReason::NoState));
    };
    let mut lease = LeaseState::decode(bytes)?;
    lease.epoch = lease.epoch.checked_add(1).ok_or(LeaseError::Exhausted)?;
    lease.counter = 0;
    Ok((lease.epoch, lease.encode()))
}

/// Decode a stored lease state.
pub fn inspect_lease(bytes: &[u8]) -> Result<LeaseInfo, LeaseError> {
    let lease = LeaseState::decode(bytes)?;
    Ok(LeaseInfo {
        format_version: FORMAT_VERSION,
        lock: lease.lock,
        authority: lease.authority,
        epoch: lease.epoch,
        counter: lease.counter,
        holder: lease.holder,
    })
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]
mod tests {
    use super::*;

    fn req(lease_id: &str, now: u64) -> AcquireRequest {
        AcquireRequest {
            lock: "report/july".into(),
            lease_id: lease_id.into(),
            authority: 3,
            epoch_floor: 0,
            now,
            ttl: 30,
        }
    }

    fn acquired(r: Result<Acquire, LeaseError>) -> (Token, Vec<u8>) {
        match r {
            Ok(Acquire::Acquired { token, state, .. }) => (token, state),
            other => panic!("expected acquired, got {other:?}"),
        }
    }

    /// The seed's race: A holds 0.1; after expiry B gets 0.2; A's renew and
    /// release are refused; restore makes the next grant (1, 1).
    #[test]
    fn expiry_race_and_restore() {
        let (a, s) = acquired(acquire(None, &req("a7", 0)));
        assert_eq!(a, Token::new(3, 0, 1));
        assert!(matches!(
            acquire(Some(&s), &req("b9", 29)),
            Ok(Acquire::Busy { .. })
        ));
        let (b, s) = acquired(acquire(Some(&s), &req("b9", 30)));
        assert_eq!(b, Token::new(3, 0, 2));
        let a_renew = RenewRequest {
            lease_id: "a7".into(),
            token: a,
            now: 31,
            ttl: 30,
        };
        assert_eq!(renew(Some(&s), &a_renew), Ok(Renew::Lost));
        let a_release = ReleaseRequest {
            lease_id: "a7".into(),
            token: a,
        };
        assert_eq!(release(Some(&s), &a_release), Ok(Release::NotOwner));
        let (epoch, s) = restore(Some(&s)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(epoch, 1);
        let (c, _) = acquired(acquire(Some(&s), &req("c1", 100)));
        assert_eq!(c, Token::new(3, 1, 1));
    }

    /// Every single-bit flip of a lease state is refused as corrupt.
    #[test]
    fn every_bit_flip_is_corrupt() {
        let (_, s) = acquired(acquire(None, &req("a7", 0)));
        for bit in 0..s.len() * 8 {
            let mut bad = s.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(inspect_lease(&bad), Err(LeaseError::CorruptState(_))),
                "bit {bit}"
            );
        }
    }
}
