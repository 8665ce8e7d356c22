//! One lease decision, store-independent: build the component's request, ask
//! it, and map its answer to the coordinator's outcome plus the state to
//! store (`None`: store nothing). Every coordinator runs these inside its own
//! atomic read-decide-write step.

use fencecheck::{
    Acquire, AcquireRequest, Instance, LeaseError, Release, ReleaseRequest, Renew, RenewRequest,
    Token,
};

use crate::{AcquireOutcome, AuthorityError, Grant, ReleaseOutcome, RenewOutcome};

/// An outcome and the lock state to store with it.
pub(crate) type Decided<T> = Result<(T, Option<Vec<u8>>), AuthorityError>;

/// What a coordinator read before deciding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Read<'s> {
    /// The lock's stored state, if any.
    pub state: Option<&'s [u8]>,
    /// The coordinator's epoch floor.
    pub floor: u64,
    /// The coordinator's clock, read inside the atomic step.
    pub now: u64,
}

pub(crate) fn acquire(
    guest: &mut Instance,
    read: Read<'_>,
    authority: u64,
    lock: &str,
    lease_id: &str,
    ttl_ms: u64,
) -> Decided<AcquireOutcome> {
    let request = AcquireRequest {
        lock: lock.to_owned(),
        lease_id: lease_id.to_owned(),
        authority,
        epoch_floor: read.floor,
        now: read.now,
        ttl: ttl_ms,
    };
    Ok(match guest.acquire(read.state, &request)?? {
        Acquire::Acquired {
            token,
            expires_at,
            state,
        } => (
            AcquireOutcome::Acquired(Grant {
                lock: request.lock,
                lease_id: request.lease_id,
                token,
                expires_at,
                decided_at: read.now,
                signature: None,
            }),
            Some(state),
        ),
        Acquire::Busy { holder, expires_at } => (AcquireOutcome::Busy { holder, expires_at }, None),
    })
}

pub(crate) fn renew(
    guest: &mut Instance,
    read: Read<'_>,
    lease_id: &str,
    token: Token,
    ttl_ms: u64,
) -> Decided<RenewOutcome> {
    let request = RenewRequest {
        lease_id: lease_id.to_owned(),
        token,
        now: read.now,
        ttl: ttl_ms,
    };
    Ok(match guest.renew(read.state, &request)?? {
        Renew::Renewed { expires_at, state } => (RenewOutcome::Renewed { expires_at }, Some(state)),
        Renew::Lost => (RenewOutcome::Lost, None),
    })
}

pub(crate) fn release(
    guest: &mut Instance,
    read: Read<'_>,
    lease_id: &str,
    token: Token,
) -> Decided<ReleaseOutcome> {
    let request = ReleaseRequest {
        lease_id: lease_id.to_owned(),
        token,
    };
    Ok(match guest.release(read.state, &request)?? {
        Release::Released { state } => (ReleaseOutcome::Released, Some(state)),
        Release::NotOwner => (ReleaseOutcome::NotOwner, None),
    })
}

/// The epoch floor a restore sets: above the current floor, at least
/// `at_least`, and above the epoch of every stored lock.
///
/// Raising the floor is the whole restore: `acquire` lifts any lock whose
/// epoch is below the floor to `(floor, 1)`, which is what rewriting each
/// lock's state to its next epoch used to achieve, so no lock state is
/// written and a restore costs one write however many locks there are. A
/// holder whose lease is still running keeps its token until it expires or
/// is released, as before. The stored locks are read only to find their
/// epochs (states written before this rule may stand above the floor) and to
/// fail closed: any damaged state, or one filed under another lock's name,
/// aborts the restore and nothing changes.
pub(crate) fn restored_floor<'s>(
    guest: &mut Instance,
    floor: u64,
    at_least: u64,
    locks: impl IntoIterator<Item = (&'s [u8], &'s [u8])>,
) -> Result<u64, AuthorityError> {
    let mut next = floor
        .checked_add(1)
        .ok_or(LeaseError::Exhausted)?
        .max(at_least);
    for (name, state) in locks {
        let info = guest.inspect_lease(state)??;
        if info.lock.as_bytes() != name {
            return Err(LeaseError::LockMismatch(info.lock).into());
        }
        next = next.max(info.epoch.checked_add(1).ok_or(LeaseError::Exhausted)?);
    }
    Ok(next)
}

/// `Coordinator::{authority, acquire, renew, release}` for a store whose
/// `decide(lock, |guest, read| …)` runs one decision in one transaction and
/// whose `restore_floor(at_least)` restores: the rules are the component's,
/// so every such store states them once, here.
macro_rules! transactional_coordinator {
    ($store:ty) => {
        impl $crate::Coordinator for $store {
            fn authority(&self) -> u64 {
                self.authority
            }

            fn acquire(
                &self,
                lock: &str,
                lease_id: &str,
                ttl_ms: u64,
            ) -> Result<$crate::AcquireOutcome, $crate::AuthorityError> {
                self.decide(lock, |guest, read| {
                    $crate::rules::acquire(guest, read, self.authority, lock, lease_id, ttl_ms)
                })
            }

            fn renew(
                &self,
                lock: &str,
                lease_id: &str,
                token: fencecheck::Token,
                ttl_ms: u64,
            ) -> Result<$crate::RenewOutcome, $crate::AuthorityError> {
                self.decide(lock, |guest, read| {
                    $crate::rules::renew(guest, read, lease_id, token, ttl_ms)
                })
            }

            fn release(
                &self,
                lock: &str,
                lease_id: &str,
                token: fencecheck::Token,
            ) -> Result<$crate::ReleaseOutcome, $crate::AuthorityError> {
                self.decide(lock, |guest, read| {
                    $crate::rules::release(guest, read, lease_id, token)
                })
            }

            fn restore(&self, at_least: u64) -> Result<u64, $crate::AuthorityError> {
                self.restore_floor(at_least)
            }
        }
    };
}
pub(crate) use transactional_coordinator;
