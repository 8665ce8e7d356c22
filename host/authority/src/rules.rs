//! One lease decision, store-independent: build the component's request, ask
//! it, and map its answer to the coordinator's outcome plus the state to
//! store (`None`: store nothing). Every coordinator runs these inside its own
//! atomic read-decide-write step.

use fencecheck::{
    Acquire, AcquireRequest, Instance, Release, ReleaseRequest, Renew, RenewRequest, Token,
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
