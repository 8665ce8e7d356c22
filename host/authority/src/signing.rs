//! Signed grants: a coordinator wrapper that signs every grant it hands out
//! with the component's `auth.sign` (HMAC-SHA256 over the canonical grant
//! message), so resources that require signed tokens for a scope accept it.

use std::sync::{Mutex, PoisonError};

use fencecheck::{GrantKey, Instance, Runtime, Token, check_keys};

use crate::{AcquireOutcome, AuthorityError, Coordinator, ReleaseOutcome, RenewOutcome};

/// A [`Coordinator`] whose grants carry [`crate::Grant::signature`], made
/// with `key` by the component: the same code every verifier runs.
///
/// Signing happens after the grant committed, from the grant alone (lock,
/// token, lease id), so a retried acquire with the same lease id gets the
/// same signature back. Renewals keep the token, hence the signature; to
/// rotate keys, give resources `{old, new}`, restart the authority on the
/// new key, and drop the old one once every lease signed with it has ended
/// (its holders' writes are `unknown-key` from then on: they re-acquire).
pub struct SigningCoordinator {
    inner: Box<dyn Coordinator>,
    key: GrantKey,
    guest: Mutex<Instance>,
}

impl std::fmt::Debug for SigningCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningCoordinator")
            .field("key_id", &self.key.key_id)
            .finish_non_exhaustive()
    }
}

impl SigningCoordinator {
    /// Sign `inner`'s grants with `key`. An unusable key (shorter than 16
    /// bytes, longer than 64) is refused here, before any grant is made; so
    /// is a component without signed tokens (0.1.0).
    pub fn new(
        inner: impl Coordinator + 'static,
        runtime: &Runtime,
        key: GrantKey,
    ) -> Result<Self, AuthorityError> {
        check_keys(std::slice::from_ref(&key)).map_err(|problem| AuthorityError::Signing {
            why: format!("the signing key is unusable: {problem}"),
        })?;
        if !runtime.supports_signing() {
            return Err(AuthorityError::Signing {
                why: format!(
                    "the component (fencecheck:fence@{}) has no signed tokens",
                    runtime.component_version()
                ),
            });
        }
        Ok(Self {
            inner: Box::new(inner),
            key,
            guest: Mutex::new(runtime.instance()?),
        })
    }

    /// The id of the key this coordinator signs with.
    pub fn key_id(&self) -> u32 {
        self.key.key_id
    }
}

impl Coordinator for SigningCoordinator {
    fn authority(&self) -> u64 {
        self.inner.authority()
    }

    fn acquire(
        &self,
        lock: &str,
        lease_id: &str,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, AuthorityError> {
        let mut grant = match self.inner.acquire(lock, lease_id, ttl_ms)? {
            AcquireOutcome::Acquired(grant) => grant,
            busy @ AcquireOutcome::Busy { .. } => return Ok(busy),
        };
        let mut guest = self.guest.lock().unwrap_or_else(PoisonError::into_inner);
        // The lease rules bound locks and lease ids as signing does, so this
        // refuses nothing a coordinator granted; if it did, the caller may
        // retry with the same lease id and gets this grant back.
        let signature = guest
            .sign(&grant.lock, grant.token, &grant.lease_id, &self.key)?
            .map_err(|e| AuthorityError::Signing {
                why: format!("the grant was made but could not be signed: {e}"),
            })?;
        grant.signature = Some(signature);
        Ok(AcquireOutcome::Acquired(grant))
    }

    fn renew(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
        ttl_ms: u64,
    ) -> Result<RenewOutcome, AuthorityError> {
        self.inner.renew(lock, lease_id, token, ttl_ms)
    }

    fn release(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, AuthorityError> {
        self.inner.release(lock, lease_id, token)
    }

    fn restore(&self, at_least: u64) -> Result<u64, AuthorityError> {
        self.inner.restore(at_least)
    }
}
