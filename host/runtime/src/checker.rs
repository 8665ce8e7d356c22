//! The [`Checker`] trait every way of running the rule implements, and the
//! [`Native`] reference: the guest's source compiled into this process.

use crate::{
    Acquire, AcquireRequest, CheckError, Error, GrantKey, GrantSignature, LeaseError, LeaseInfo,
    Outcome, Release, ReleaseRequest, Renew, RenewRequest, Request, SignError, SignedCheckError,
    SignedOutcome, StateInfo, Token,
};

/// Anything that can make the fence decision: the wasm [`Instance`] or the
/// [`Native`] reference. The conformance runner and the tests drive both
/// through this trait.
pub trait Checker {
    /// Decide one request against a scope's state (`None`: never accepted a token).
    fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error>;

    /// Decide independent state/request pairs; results in input order, each
    /// exactly what [`Checker::check`] would return for that pair.
    fn check_batch(&mut self, items: &[(Option<&[u8]>, &Request)]) -> Result<Vec<Outcome>, Error>;

    /// Decode a stored state.
    fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error>;

    /// Decide one request on a scope that requires signed tokens: the
    /// request's signature ([`Request::signature`]) is verified against
    /// `keys` before the state is read (`wit/fence.wit`, interface `auth`).
    fn check_signed(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: &[GrantKey],
    ) -> Result<SignedOutcome, Error>;

    /// The fence decision a write path makes: [`Checker::check_signed`]
    /// when the scope requires signed tokens (`keys` is `Some`, from a
    /// [`crate::Keyring`]), else [`Checker::check`] (any signature ignored).
    fn decide(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: Option<&[GrantKey]>,
    ) -> Result<SignedOutcome, Error> {
        match keys {
            Some(keys) => self.check_signed(state, request, keys),
            None => Ok(self.check(state, request)?.map_err(SignedCheckError::Check)),
        }
    }

    /// Sign the grant of `token` to `lease_id` for `scope` (the lock's name).
    fn sign(
        &mut self,
        scope: &str,
        token: Token,
        lease_id: &str,
        key: &GrantKey,
    ) -> Result<Result<GrantSignature, SignError>, Error>;

    /// Lease authority: acquire a lock (see `wit/fence.wit`, interface `lease`).
    fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error>;

    /// Lease authority: renew the exact current lease.
    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error>;

    /// Lease authority: release the exact current lease.
    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error>;

    /// Lease authority: start the lock's next epoch; returns it and the new state.
    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error>;

    /// Decode a stored lease state.
    fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error>;

    /// A short name for reports (`wasm`, `native`).
    fn runtime_name(&self) -> &'static str;
}

/// The native reference: the guest's source compiled into this process.
///
/// It never returns an infrastructure [`Error`]; it exists so that every wasm
/// decision can be compared against it, and as a baseline for benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Native;

/// The native reference through the same packed path the wasm core
/// transport takes: the host's encoding, the guest's `check_one_packed` /
/// `check_packed`, the host's decoding. For benchmarks that want both sides
/// of a ratio to do the same work; not part of the stable API.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct NativePacked {
    input: Vec<u8>,
    output: Vec<u8>,
}

impl NativePacked {
    /// One check, as [`crate::Instance::check`] sends it.
    pub fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        const CALL: &str = "check";
        self.input.clear();
        crate::packed::encode_into(&mut self.input, &[(state, request)]).ok_or(
            Error::TooLarge {
                call: CALL,
                bytes: usize::MAX,
                limit: u32::MAX as usize,
            },
        )?;
        let protocol = |message: String| Error::Protocol {
            call: CALL,
            message,
        };
        fencecheck_guest::check_one_packed(&self.input, &mut self.output)
            .map_err(|e| protocol(format!("{e:?}")))?;
        crate::packed::decode_one(&self.output).map_err(protocol)
    }

    /// A batch, as [`crate::Instance::check_batch`] sends it.
    pub fn check_batch(
        &mut self,
        items: &[(Option<&[u8]>, &Request)],
    ) -> Result<Vec<Outcome>, Error> {
        const CALL: &str = "check-packed";
        self.input.clear();
        crate::packed::encode_into(&mut self.input, items).ok_or(Error::TooLarge {
            call: CALL,
            bytes: usize::MAX,
            limit: u32::MAX as usize,
        })?;
        let protocol = |message: String| Error::Protocol {
            call: CALL,
            message,
        };
        let out =
            fencecheck_guest::check_packed(&self.input).map_err(|e| protocol(format!("{e:?}")))?;
        crate::packed::decode(&out, items.len()).map_err(protocol)
    }
}

impl Checker for Native {
    fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        Ok(fencecheck_guest::check(state, request))
    }

    fn check_batch(&mut self, items: &[(Option<&[u8]>, &Request)]) -> Result<Vec<Outcome>, Error> {
        Ok(items
            .iter()
            .map(|(state, request)| fencecheck_guest::check(*state, request))
            .collect())
    }

    fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error> {
        Ok(fencecheck_guest::inspect(state))
    }

    fn check_signed(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: &[GrantKey],
    ) -> Result<SignedOutcome, Error> {
        Ok(fencecheck_guest::check_signed(state, request, keys))
    }

    fn sign(
        &mut self,
        scope: &str,
        token: Token,
        lease_id: &str,
        key: &GrantKey,
    ) -> Result<Result<GrantSignature, SignError>, Error> {
        Ok(fencecheck_guest::sign(scope, token, lease_id, key))
    }

    fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        Ok(fencecheck_guest::acquire(state, request))
    }

    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        Ok(fencecheck_guest::renew(state, request))
    }

    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        Ok(fencecheck_guest::release(state, request))
    }

    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        Ok(fencecheck_guest::restore(state))
    }

    fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error> {
        Ok(fencecheck_guest::inspect_lease(state))
    }

    fn runtime_name(&self) -> &'static str {
        "native"
    }
}
