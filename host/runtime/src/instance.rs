//! [`Instance`]: one instantiation of the component, for one thread or
//! connection, every call bounded by fuel and memory.

use wasmtime::Store;

use crate::abi::{
    Bindings, check_abi as abi, error_in, info_in, key_out, lease_abi, lease_error_in, outcome_in,
    request_bytes, request_out, sign_in, signature_out, signed_outcome_in, token_in, token_out,
};
use crate::core::{CoreError, CoreGuest};
use crate::runtime::Limiter;
use crate::{
    Acquire, AcquireRequest, CheckError, Checker, Error, GrantKey, GrantSignature, Holder,
    LeaseError, LeaseInfo, Outcome, Release, ReleaseRequest, Renew, RenewRequest, Request, Runtime,
    SignError, SignedOutcome, StateInfo, Token,
};

/// One instance of the component, for one thread or connection at a time.
///
/// Every call is bounded by the instance's memory limit and by its input
/// (at most [`crate::Limits::call_bytes`]); a metered runtime (any component
/// but the embedded one) also bounds it by fuel. If the
/// guest traps, the call returns [`Error::Trapped`], nothing was decided, and
/// the instance is replaced before the next call.
///
/// `check`, `check_batch` and `check_packed_raw` go through the component's
/// core module when the runtime found one of the expected shape (see
/// [`crate::Transport`]); the other exports through the component API, in
/// an instantiation made on their first use.
pub struct Instance {
    runtime: Runtime,
    core: Option<CoreGuest>,
    component: Option<ComponentGuest>,
    /// The packed request of the last check, kept to reuse its allocation.
    buffer: Vec<u8>,
    /// Fuel the last call consumed, when the runtime is metered.
    last_fuel: Option<u64>,
    /// The input size of the call under way (set by `bound`).
    input_bytes: usize,
}

/// How a packed call crosses into the core module.
#[derive(Clone, Copy)]
enum Crossing {
    /// One item: the single-check export when the guest has it.
    One,
    /// `check-packed`.
    Batch,
}

struct ComponentGuest {
    store: Store<Limiter>,
    bindings: Bindings,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("core", &self.core.is_some())
            .field("component", &self.component.is_some())
            .finish_non_exhaustive()
    }
}

impl Instance {
    pub(crate) fn new(runtime: Runtime) -> Result<Self, Error> {
        let mut instance = Self {
            core: runtime.core_guest()?,
            runtime,
            component: None,
            buffer: Vec::new(),
            last_fuel: None,
            input_bytes: 0,
        };
        if instance.core.is_none() {
            instance.component = Some(instance.component_guest()?);
        }
        Ok(instance)
    }

    fn component_guest(&self) -> Result<ComponentGuest, Error> {
        let (store, bindings) = self.runtime.instantiate()?;
        Ok(ComponentGuest { store, bindings })
    }

    /// Decide one request; see [`Checker::check`].
    pub fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        const CALL: &str = "check";
        self.bound(CALL, request_bytes(state, request))?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        if self.core.is_some() {
            let mut buffer = std::mem::take(&mut self.buffer);
            buffer.clear();
            let result = match crate::packed::encode_into(&mut buffer, &[(state, request)]) {
                Some(()) => self.core_call(CALL, Crossing::One, &buffer, fuel, |out| {
                    let out = out.map_err(|crate::BatchError::Malformed| Error::Protocol {
                        call: CALL,
                        message: "the guest refused the host's encoding as malformed".into(),
                    })?;
                    crate::packed::decode_one(out).map_err(|message| Error::Protocol {
                        call: CALL,
                        message,
                    })
                }),
                None => Err(too_large(CALL, self.runtime.shared.limits.call_bytes)),
            };
            self.buffer = buffer;
            return result;
        }
        let abi_request = request_out(request);
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check()
                .call_check(store, state, abi_request)
        })?;
        Ok(outcome_in(result))
    }

    /// Decide one request on a scope that requires signed tokens; see
    /// [`Checker::check_signed`]. Over the core transport it crosses as a
    /// one-item `check-packed` batch with keys and signature (flags 4 and
    /// 5); over the component API through the typed `auth.check-signed`.
    /// [`Error::Unsupported`] if the component predates signed tokens.
    pub fn check_signed(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: &[GrantKey],
    ) -> Result<SignedOutcome, Error> {
        const CALL: &str = "check-signed";
        self.require_auth()?;
        let signature = request.signature.as_ref();
        let auth_bytes = keys
            .iter()
            .map(|k| k.secret.len().saturating_add(5))
            .chain(signature.map(|s| s.lease_id.len().saturating_add(s.tag.len())))
            .fold(0usize, usize::saturating_add);
        self.bound(
            CALL,
            request_bytes(state, request).saturating_add(auth_bytes),
        )?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        if self.core.is_some() {
            let mut buffer = std::mem::take(&mut self.buffer);
            buffer.clear();
            let result = match crate::packed::encode_signed_into(&mut buffer, state, request, keys)
            {
                Some(()) => self.core_call(CALL, Crossing::One, &buffer, fuel, |out| {
                    let out = out.map_err(|crate::BatchError::Malformed| Error::Protocol {
                        call: CALL,
                        message: "the guest refused the host's encoding as malformed".into(),
                    })?;
                    crate::packed::decode_signed(out).map_err(|message| Error::Protocol {
                        call: CALL,
                        message,
                    })
                }),
                None => Err(too_large(CALL, self.runtime.shared.limits.call_bytes)),
            };
            self.buffer = buffer;
            return result;
        }
        let abi_request = request_out(request);
        let abi_signature = signature.map(signature_out);
        let abi_keys: Vec<_> = keys.iter().map(key_out).collect();
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_auth()
                .ok_or_else(|| wasmtime::Error::msg("no auth interface"))?
                .call_check_signed(store, state, abi_request, abi_signature, &abi_keys)
        })?;
        Ok(signed_outcome_in(result))
    }

    /// Sign the grant of `token` to `lease_id` for `scope` (the lock's
    /// name) with `key`; see [`Checker::sign`]. [`Error::Unsupported`] if
    /// the component predates signed tokens.
    pub fn sign(
        &mut self,
        scope: &str,
        token: Token,
        lease_id: &str,
        key: &GrantKey,
    ) -> Result<Result<GrantSignature, SignError>, Error> {
        const CALL: &str = "sign";
        self.require_auth()?;
        self.bound(
            CALL,
            scope
                .len()
                .saturating_add(lease_id.len())
                .saturating_add(key.secret.len()),
        )?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_auth()
                .ok_or_else(|| wasmtime::Error::msg("no auth interface"))?
                .call_sign(store, scope, token_out(token), lease_id, key_out(key))
        })?;
        Ok(sign_in(result))
    }

    fn require_auth(&self) -> Result<(), Error> {
        if self.runtime.supports_signing() {
            return Ok(());
        }
        Err(Error::Unsupported {
            feature: "signed tokens",
            version: self.runtime.component_version().to_owned(),
            since: "0.1.1",
        })
    }

    /// Decide many independent pairs in one crossing; see [`Checker::check_batch`].
    ///
    /// Uses the component's `check-packed` export: the batch crosses as one
    /// byte buffer each way, which costs far less per item than the typed
    /// `check-batch` (see BENCHMARKS.md). The outcomes are identical.
    pub fn check_batch(
        &mut self,
        items: &[(Option<&[u8]>, &Request)],
    ) -> Result<Vec<Outcome>, Error> {
        const CALL: &str = "check-packed";
        let mut packed = Vec::new();
        crate::packed::encode_into(&mut packed, items)
            .ok_or_else(|| too_large(CALL, self.runtime.shared.limits.call_bytes))?;
        self.bound(CALL, packed.len())?;
        let fuel = self.batch_fuel(items.len());
        let decode = |out: Result<&[u8], crate::BatchError>| -> Result<Vec<Outcome>, Error> {
            let out = out.map_err(|crate::BatchError::Malformed| Error::Protocol {
                call: CALL,
                message: "the guest refused the host's encoding as malformed".into(),
            })?;
            crate::packed::decode(out, items.len()).map_err(|message| Error::Protocol {
                call: CALL,
                message,
            })
        };
        if self.core.is_some() {
            return self.core_call(CALL, Crossing::Batch, &packed, fuel, decode);
        }
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check().call_check_packed(store, &packed)
        })?;
        decode(
            result
                .as_deref()
                .map_err(|abi::BatchError::Malformed| crate::BatchError::Malformed),
        )
    }

    /// Send an already-packed batch to `check-packed` and return the guest's
    /// packed outcomes as they are (format: `wit/fence.wit`). For hosts and
    /// tests that do their own encoding; most callers want [`Instance::check_batch`].
    pub fn check_packed_raw(
        &mut self,
        batch: &[u8],
    ) -> Result<Result<Vec<u8>, crate::BatchError>, Error> {
        const CALL: &str = "check-packed";
        self.bound(CALL, batch.len())?;
        // A raw batch may hold up to len / 29 items; fuel for that many.
        let fuel = self.batch_fuel(batch.len() / 29);
        if self.core.is_some() {
            return self.core_call(CALL, Crossing::Batch, batch, fuel, |out| {
                Ok(out.map(<[u8]>::to_vec))
            });
        }
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check().call_check_packed(store, batch)
        })?;
        Ok(result.map_err(|abi::BatchError::Malformed| crate::BatchError::Malformed))
    }

    /// Run `check-packed` through the core transport; on a trap or a reply
    /// that breaks the ABI, replace the core instance and report it.
    fn core_call<T>(
        &mut self,
        call: &'static str,
        crossing: Crossing,
        batch: &[u8],
        fuel: u64,
        read: impl FnOnce(Result<&[u8], crate::BatchError>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        // Per byte of the batch: over the core transport the guest also
        // validates the strings' UTF-8 (the component API does that on the host).
        let fuel = fuel.saturating_add(self.per_byte(batch.len()));
        let Some(core) = self.core.as_mut() else {
            return Err(Error::Protocol {
                call,
                message: "no core transport".into(),
            });
        };
        let result = match crossing {
            Crossing::One => core.call_one(batch, fuel, read),
            Crossing::Batch => core.call(batch, fuel, read),
        };
        self.last_fuel = core.last_fuel();
        match result {
            Ok(value) => value,
            Err(e) => {
                // The guest's memory may be inconsistent after a trap, and a
                // reply that broke the ABI proves nothing about it either.
                self.core = self.runtime.core_guest()?;
                Err(match e {
                    CoreError::Trap(e) => Error::Trapped {
                        call,
                        message: format!("{e:#}"),
                    },
                    CoreError::Abi(message) => Error::Protocol { call, message },
                })
            }
        }
    }

    /// [`Instance::check_batch`] through the typed `check-batch` export (a
    /// `list<batch-item>` each way), kept for comparison in tests and benches.
    pub fn check_batch_typed(
        &mut self,
        items: &[(Option<&[u8]>, &Request)],
    ) -> Result<Vec<Outcome>, Error> {
        const CALL: &str = "check-batch";
        let bytes = items
            .iter()
            .map(|(s, r)| request_bytes(*s, r))
            .fold(0usize, usize::saturating_add);
        self.bound(CALL, bytes)?;
        let abi_items: Vec<abi::BatchItem> = items
            .iter()
            .map(|(state, request)| abi::BatchItem {
                state: *state,
                request: request_out(request),
            })
            .collect();
        let fuel = self.batch_fuel(items.len());
        let results = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check()
                .call_check_batch(store, &abi_items)
        })?;
        if results.len() != items.len() {
            // A guest bug, not a decision: refuse to guess which result is whose.
            return Err(Error::Protocol {
                call: CALL,
                message: format!(
                    "returned {} results for {} items",
                    results.len(),
                    items.len()
                ),
            });
        }
        Ok(results.into_iter().map(outcome_in).collect())
    }

    fn batch_fuel(&self, items: usize) -> u64 {
        let count = u64::try_from(items.max(1)).unwrap_or(u64::MAX);
        self.runtime
            .shared
            .limits
            .fuel_per_check
            .saturating_mul(count)
    }

    /// Decode a stored state; see [`Checker::inspect`].
    pub fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error> {
        const CALL: &str = "inspect";
        self.bound(CALL, state.len())?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check().call_inspect(store, state)
        })?;
        Ok(result.map(info_in).map_err(error_in))
    }

    /// Acquire a lock; see [`Checker::acquire`].
    pub fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        const CALL: &str = "acquire";
        let bytes = state
            .map_or(0, <[u8]>::len)
            .saturating_add(request.lock.len())
            .saturating_add(request.lease_id.len());
        self.bound(CALL, bytes)?;
        let abi_request = lease_abi::AcquireRequest {
            lock: &request.lock,
            lease_id: &request.lease_id,
            authority: request.authority,
            epoch_floor: request.epoch_floor,
            now: request.now,
            ttl: request.ttl,
        };
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease()
                .call_acquire(store, state, abi_request)
        })?;
        Ok(match result {
            Ok(lease_abi::AcquireOutcome::Acquired(a)) => Ok(Acquire::Acquired {
                token: token_in(a.token),
                expires_at: a.expires_at,
                state: a.state,
            }),
            Ok(lease_abi::AcquireOutcome::Busy(b)) => Ok(Acquire::Busy {
                holder: b.holder,
                expires_at: b.expires_at,
            }),
            Err(e) => Err(lease_error_in(e)),
        })
    }

    /// Renew the exact current lease; see [`Checker::renew`].
    pub fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        const CALL: &str = "renew";
        let bytes = state
            .map_or(0, <[u8]>::len)
            .saturating_add(request.lease_id.len());
        self.bound(CALL, bytes)?;
        let abi_request = lease_abi::RenewRequest {
            lease_id: &request.lease_id,
            token: token_out(request.token),
            now: request.now,
            ttl: request.ttl,
        };
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease()
                .call_renew(store, state, abi_request)
        })?;
        Ok(match result {
            Ok(lease_abi::RenewOutcome::Renewed(r)) => Ok(Renew::Renewed {
                expires_at: r.expires_at,
                state: r.state,
            }),
            Ok(lease_abi::RenewOutcome::Lost) => Ok(Renew::Lost),
            Err(e) => Err(lease_error_in(e)),
        })
    }

    /// Release the exact current lease; see [`Checker::release`].
    pub fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        const CALL: &str = "release";
        let bytes = state
            .map_or(0, <[u8]>::len)
            .saturating_add(request.lease_id.len());
        self.bound(CALL, bytes)?;
        let abi_request = lease_abi::ReleaseRequest {
            lease_id: &request.lease_id,
            token: token_out(request.token),
        };
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease()
                .call_release(store, state, abi_request)
        })?;
        Ok(match result {
            Ok(lease_abi::ReleaseOutcome::Released(state)) => Ok(Release::Released { state }),
            Ok(lease_abi::ReleaseOutcome::NotOwner) => Ok(Release::NotOwner),
            Err(e) => Err(lease_error_in(e)),
        })
    }

    /// Start the lock's next epoch; see [`Checker::restore`].
    pub fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        const CALL: &str = "restore";
        self.bound(CALL, state.map_or(0, <[u8]>::len))?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease().call_restore(store, state)
        })?;
        Ok(result.map(|r| (r.epoch, r.state)).map_err(lease_error_in))
    }

    /// Decode a stored lease state; see [`Checker::inspect_lease`].
    pub fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error> {
        const CALL: &str = "lease.inspect";
        self.bound(CALL, state.len())?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease().call_inspect(store, state)
        })?;
        Ok(result
            .map(|i| LeaseInfo {
                format_version: i.format_version,
                lock: i.lock,
                authority: i.authority,
                epoch: i.epoch,
                counter: i.counter,
                holder: i.holder.map(|h| Holder {
                    lease_id: h.lease_id,
                    token: token_in(h.token),
                    expires_at: h.expires_at,
                }),
            })
            .map_err(lease_error_in))
    }

    /// The fuel the last call consumed, if this instance's runtime is
    /// metered ([`Runtime::metered`]); `None` for the embedded component,
    /// and after a call that trapped. About one unit per wasm instruction:
    /// the guest's cost independent of the CPU (`fuzz/fuzz_targets/fuel_bound.rs`
    /// holds every call below a line in its input size).
    pub fn last_fuel(&self) -> Option<u64> {
        self.last_fuel
    }

    /// Fuel for a call's input bytes on top of the per-check budget
    /// ([`crate::Limits::fuel_per_input_byte`]).
    fn per_byte(&self, bytes: usize) -> u64 {
        let rate = self.runtime.shared.limits.fuel_per_input_byte;
        rate.saturating_mul(bytes as u64)
    }

    /// Refuse a call above [`crate::Limits::call_bytes`]; else remember
    /// its size for the call's per-byte fuel.
    fn bound(&mut self, call: &'static str, bytes: usize) -> Result<(), Error> {
        let limit = self.runtime.shared.limits.call_bytes;
        if bytes > limit {
            return Err(Error::TooLarge { call, bytes, limit });
        }
        self.input_bytes = bytes;
        Ok(())
    }

    /// Run one component export with a fresh fuel budget, instantiating the
    /// component on first use; on a trap, drop the instantiation (its memory
    /// may be inconsistent; the next call makes a fresh one) and report it.
    fn call<T>(
        &mut self,
        call: &'static str,
        fuel: u64,
        f: impl FnOnce(&Bindings, &mut Store<Limiter>) -> wasmtime::Result<T>,
    ) -> Result<T, Error> {
        let trapped = |e: wasmtime::Error| Error::Trapped {
            call,
            message: format!("{e:#}"),
        };
        let guest = match self.component.take() {
            Some(guest) => guest,
            None => self.component_guest()?,
        };
        let ComponentGuest {
            mut store,
            bindings,
        } = guest;
        self.last_fuel = None;
        let metered = self.runtime.metered();
        let fuel = fuel.saturating_add(self.per_byte(self.input_bytes));
        if metered {
            store.set_fuel(fuel).map_err(trapped)?;
        }
        let result = f(&bindings, &mut store);
        if metered {
            self.last_fuel = store.get_fuel().ok().map(|left| fuel.saturating_sub(left));
        }
        match result {
            Ok(value) => {
                self.component = Some(ComponentGuest { store, bindings });
                Ok(value)
            }
            Err(e) => Err(trapped(e)),
        }
    }
}

fn too_large(call: &'static str, limit: usize) -> Error {
    Error::TooLarge {
        call,
        bytes: usize::MAX,
        limit,
    }
}

impl Checker for Instance {
    fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        Instance::check(self, state, request)
    }

    fn check_batch(&mut self, items: &[(Option<&[u8]>, &Request)]) -> Result<Vec<Outcome>, Error> {
        Instance::check_batch(self, items)
    }

    fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error> {
        Instance::inspect(self, state)
    }

    fn check_signed(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: &[GrantKey],
    ) -> Result<SignedOutcome, Error> {
        Instance::check_signed(self, state, request, keys)
    }

    fn sign(
        &mut self,
        scope: &str,
        token: Token,
        lease_id: &str,
        key: &GrantKey,
    ) -> Result<Result<GrantSignature, SignError>, Error> {
        Instance::sign(self, scope, token, lease_id, key)
    }

    fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        Instance::acquire(self, state, request)
    }

    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        Instance::renew(self, state, request)
    }

    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        Instance::release(self, state, request)
    }

    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        Instance::restore(self, state)
    }

    fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error> {
        Instance::inspect_lease(self, state)
    }

    fn runtime_name(&self) -> &'static str {
        "wasm"
    }
}
