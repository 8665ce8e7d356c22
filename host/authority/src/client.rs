//! The client capability: what an acquisition hands to the code that writes.

use std::sync::Arc;
use std::time::Instant;

use fencecheck::{CheckError, Decision, Outcome, Policy, Request, Token};

use crate::{
    AcquireOutcome, AuthorityError, Clock, Coordinator, Grant, ReleaseOutcome, RenewOutcome,
    signals,
};

/// How far the client's clock may run slow against the coordinator's, as a
/// rate (parts per million of the ttl) plus a fixed margin. The local validity
/// deadline is shortened by this much, so a client stops *starting* work
/// before the coordinator can consider its lease expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriftBound {
    /// Relative drift, parts per million of the ttl.
    pub ppm: u64,
    /// Fixed margin, milliseconds.
    pub margin_ms: u64,
}

impl Default for DriftBound {
    fn default() -> Self {
        // 1% of the ttl plus 50 ms: far above real crystal drift, cheap insurance.
        Self {
            ppm: 10_000,
            margin_ms: 50,
        }
    }
}

impl DriftBound {
    fn deadline(&self, sent_at: u64, ttl_ms: u64) -> u64 {
        let drift = (ttl_ms / 1_000_000)
            .saturating_mul(self.ppm)
            .saturating_add((ttl_ms % 1_000_000).saturating_mul(self.ppm) / 1_000_000)
            .saturating_add(self.margin_ms);
        sent_at.saturating_add(ttl_ms.saturating_sub(drift))
    }
}

/// Acquires leases on a coordinator and measures validity on the local clock.
#[derive(Clone)]
pub struct Client {
    coordinator: Arc<dyn Coordinator>,
    local: Arc<dyn Clock>,
    drift: DriftBound,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("drift", &self.drift)
            .finish_non_exhaustive()
    }
}

/// The result of [`Client::acquire`]: the three answers a caller must handle.
#[derive(Debug)]
pub enum AcquireResult {
    /// A lease, with its local validity deadline.
    Acquired(Lease),
    /// Someone else holds the lock.
    Busy {
        /// The holder's lease id.
        holder: String,
        /// When its lease ends (coordinator milliseconds).
        expires_at: u64,
    },
    /// The coordinator could not decide (store down, contention, …).
    Unavailable(AuthorityError),
}

impl Client {
    /// A client of `coordinator`, measuring its own validity on `local`.
    pub fn new(
        coordinator: Arc<dyn Coordinator>,
        local: Arc<dyn Clock>,
        drift: DriftBound,
    ) -> Self {
        Self {
            coordinator,
            local,
            drift,
        }
    }

    /// Acquire `lock` for `ttl_ms`. The validity deadline counts from when the
    /// request was *sent*: the time the request and reply spent in flight is
    /// charged to the lease.
    ///
    /// Only the part of the lease the coordinator still had when it decided
    /// is counted, never more than `ttl_ms`: a retry with the same lease id
    /// (the recovery after an unknown outcome) gets the original grant back,
    /// whose lease started at the first attempt, not at the retry.
    pub fn acquire(&self, lock: &str, lease_id: &str, ttl_ms: u64) -> AcquireResult {
        let sent_at = self.local.now_ms();
        let started = Instant::now();
        let answer = self.coordinator.acquire(lock, lease_id, ttl_ms);
        let took = started.elapsed();
        match answer {
            Ok(AcquireOutcome::Acquired(grant)) => {
                signals::acquired("acquired", took);
                signals::granted(grant.token);
                AcquireResult::Acquired(Lease {
                    valid_until: self
                        .drift
                        .deadline(sent_at, ttl_ms.min(grant.remaining_ms())),
                    grant,
                    ttl_ms,
                    lost: false,
                    acquired_at: started,
                    client: self.clone(),
                })
            }
            Ok(AcquireOutcome::Busy { holder, expires_at }) => {
                signals::acquired("busy", took);
                AcquireResult::Busy { holder, expires_at }
            }
            Err(e) => {
                signals::acquired("error", took);
                signals::coordinator_error(&e);
                AcquireResult::Unavailable(e)
            }
        }
    }
}

/// A protected write's domain outcome. `StaleFence` is definitive: the lease
/// is marked lost and the write must not be retried under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Applied; the resource is now at `version`.
    Applied {
        /// The resource's version after the write.
        version: u64,
    },
    /// Already applied earlier under this grant (same op-id).
    Duplicate {
        /// The version the original write produced.
        version: u64,
    },
    /// A newer grant has written to the resource. Stop; do not retry.
    StaleFence {
        /// The highest token the resource has accepted.
        highest: Token,
    },
    /// The resource moved on since the caller read it.
    VersionConflict {
        /// What the write expected.
        expected: u64,
        /// What the resource has.
        actual: u64,
    },
}

/// Why a protected write did not produce a [`WriteOutcome`]. Kept apart from
/// `StaleFence`, which is an outcome and never retryable.
#[derive(Debug, thiserror::Error)]
pub enum WriteError<E> {
    /// The lease is lost or past its local validity deadline; the write was
    /// not attempted. (An efficiency check: the fence is the guarantee.)
    #[error("the lease is lost or past its local validity deadline")]
    LeaseLost,
    /// The resource refused the request or its stored state (invalid
    /// request, corrupt state…). Not retryable as is.
    #[error("the resource refused the write: {}", .0.name())]
    Refused(CheckError),
    /// The resource could not be reached or its transaction failed; the write
    /// may be retried under the same lease while it is valid.
    #[error("transient resource failure: {0}")]
    Transient(E),
}

/// A held lease: the capability a protected write needs.
///
/// Carries the scope (the lock), the lease id, the fencing token and a
/// conservative local validity deadline. Once lost, it stays lost, whatever a
/// late reply says.
#[derive(Debug)]
pub struct Lease {
    grant: Grant,
    ttl_ms: u64,
    valid_until: u64,
    lost: bool,
    /// When the acquisition was sent (the lease's age, for the signals).
    acquired_at: Instant,
    client: Client,
}

impl Lease {
    /// The fencing scope (the lock's name).
    pub fn scope(&self) -> &str {
        &self.grant.lock
    }

    /// The acquisition's lease id.
    pub fn lease_id(&self) -> &str {
        &self.grant.lease_id
    }

    /// The fencing token every protected write carries.
    pub fn token(&self) -> Token {
        self.grant.token
    }

    /// The coordinator's expiry at grant or last renewal.
    pub fn grant(&self) -> &Grant {
        &self.grant
    }

    /// The local deadline (local clock milliseconds) before which new work may start.
    pub fn valid_until(&self) -> u64 {
        self.valid_until
    }

    /// True once the lease is known lost (or stale at a resource).
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Milliseconds of local validity left; 0 when lost. Check before
    /// expensive work; it is an efficiency check, not the safety mechanism.
    pub fn remaining_ms(&self) -> u64 {
        if self.lost {
            return 0;
        }
        self.valid_until.saturating_sub(self.client.local.now_ms())
    }

    /// Renew for another ttl. Returns whether the lease is still held.
    ///
    /// A lease past its local deadline is lost without asking. A reply that
    /// arrives after the local deadline does not resurrect it. A transport
    /// error leaves the lease as it was (the renewal may or may not have
    /// committed) and is returned.
    pub fn renew(&mut self) -> Result<bool, AuthorityError> {
        let sent_at = self.client.local.now_ms();
        if self.lost || sent_at >= self.valid_until {
            self.lose();
            return Ok(false);
        }
        let reply = self
            .client
            .coordinator
            .renew(
                &self.grant.lock,
                &self.grant.lease_id,
                self.grant.token,
                self.ttl_ms,
            )
            .inspect_err(|e| {
                signals::renewed("error");
                signals::coordinator_error(e);
            })?;
        let received_at = self.client.local.now_ms();
        match reply {
            RenewOutcome::Renewed { expires_at } if received_at < self.valid_until => {
                self.grant.expires_at = expires_at;
                self.valid_until = self.client.drift.deadline(sent_at, self.ttl_ms);
                signals::renewed("renewed");
                Ok(true)
            }
            // Lost, or renewed too late: stay lost.
            _ => {
                signals::renewed("lost");
                self.lose();
                Ok(false)
            }
        }
    }

    /// Mark the lease lost; the first time, record the holder's loss.
    fn lose(&mut self) {
        if !self.lost {
            signals::ended("lost", self.acquired_at.elapsed());
        }
        self.lost = true;
    }

    /// Release the lease at the coordinator (an optimisation: expiry frees it too).
    pub fn release(mut self) -> Result<ReleaseOutcome, AuthorityError> {
        if !self.lost {
            signals::ended("released", self.acquired_at.elapsed());
        }
        self.lost = true;
        self.client
            .coordinator
            .release(&self.grant.lock, &self.grant.lease_id, self.grant.token)
    }

    /// The fence request for a protected write under this lease: scope and
    /// token are explicit, never ambient; the grant's signature, if any,
    /// travels with it.
    pub fn request(&self, policy: Policy) -> Request {
        let mut request = Request::new(self.grant.lock.clone(), self.grant.token, policy);
        request.signature = self.grant.signature.clone();
        request
    }

    /// Run a protected write: `write` performs the resource's atomic
    /// check-and-apply for `request` and returns its outcome (or a transport
    /// error). A stale fence marks this lease lost.
    pub fn write<E>(
        &mut self,
        request: Request,
        write: impl FnOnce(&Request) -> Result<Outcome, E>,
    ) -> Result<WriteOutcome, WriteError<E>> {
        if self.remaining_ms() == 0 {
            self.lose();
            return Err(WriteError::LeaseLost);
        }
        match write(&request) {
            Err(e) => Err(WriteError::Transient(e)),
            Ok(Err(refused)) => Err(WriteError::Refused(refused)),
            Ok(Ok(decision)) => Ok(match decision {
                Decision::Applied { version, .. } => WriteOutcome::Applied { version },
                Decision::Duplicate { version } => WriteOutcome::Duplicate { version },
                Decision::StaleFence { highest, .. } => {
                    self.lose();
                    WriteOutcome::StaleFence { highest }
                }
                Decision::VersionConflict { expected, actual } => {
                    WriteOutcome::VersionConflict { expected, actual }
                }
            }),
        }
    }
}
