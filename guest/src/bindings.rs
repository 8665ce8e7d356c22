//! The component's exports: conversions between the WIT types and the
//! reference types, and nothing else, so the wasm build and the native build
//! run the same decision code.

wit_bindgen::generate!({
    path: "../wit",
    world: "fencecheck",
});

use exports::fencecheck::fence::check as wit;
use exports::fencecheck::fence::types::Token as WitToken;

use crate::types::{
    CheckError, Corruption, Decision, InvalidReason, Policy, Request, StateInfo, Token,
};

struct Component;

export!(Component);

impl wit::Guest for Component {
    fn check(
        state: Option<Vec<u8>>,
        request: wit::Request,
    ) -> Result<wit::Decision, wit::CheckError> {
        decide(state.as_deref(), request)
    }

    fn check_batch(items: Vec<wit::BatchItem>) -> Vec<Result<wit::Decision, wit::CheckError>> {
        items
            .into_iter()
            .map(|item| decide(item.state.as_deref(), item.request))
            .collect()
    }

    fn inspect(state: Vec<u8>) -> Result<wit::StateInfo, wit::CheckError> {
        crate::inspect(&state).map(info_out).map_err(error_out)
    }

    fn check_packed(batch: Vec<u8>) -> Result<Vec<u8>, wit::BatchError> {
        crate::check_packed(&batch)
            .map_err(|crate::BatchError::Malformed| wit::BatchError::Malformed)
    }
}

fn decide(state: Option<&[u8]>, request: wit::Request) -> Result<wit::Decision, wit::CheckError> {
    crate::check(state, &request_in(request))
        .map(decision_out)
        .map_err(error_out)
}

fn token_in(t: WitToken) -> Token {
    Token::new(t.authority, t.epoch, t.counter)
}

fn token_out(t: Token) -> WitToken {
    WitToken {
        authority: t.authority,
        epoch: t.epoch,
        counter: t.counter,
    }
}

fn request_in(r: wit::Request) -> Request {
    Request {
        scope: r.scope,
        token: token_in(r.token),
        policy: match r.policy {
            wit::Policy::Strict => Policy::Strict,
            wit::Policy::AllowEqual => Policy::AllowEqual,
        },
        op_id: r.op_id,
        expected_version: r.expected_version,
        signature: None,
    }
}

fn decision_out(d: Decision) -> wit::Decision {
    match d {
        Decision::Applied {
            version,
            highest,
            state,
        } => wit::Decision::Applied(wit::Applied {
            version,
            highest: token_out(highest),
            state,
        }),
        Decision::Duplicate { version } => wit::Decision::Duplicate(version),
        Decision::StaleFence { presented, highest } => wit::Decision::StaleFence(wit::StaleFence {
            presented: token_out(presented),
            highest: token_out(highest),
        }),
        Decision::VersionConflict { expected, actual } => {
            wit::Decision::VersionConflict(wit::VersionConflict { expected, actual })
        }
    }
}

fn error_out(e: CheckError) -> wit::CheckError {
    match e {
        CheckError::InvalidRequest(reason) => wit::CheckError::InvalidRequest(match reason {
            InvalidReason::MissingToken => wit::InvalidReason::MissingToken,
            InvalidReason::EmptyScope => wit::InvalidReason::EmptyScope,
            InvalidReason::ScopeTooLong => wit::InvalidReason::ScopeTooLong,
            InvalidReason::EmptyOpId => wit::InvalidReason::EmptyOpId,
            InvalidReason::OpIdTooLong => wit::InvalidReason::OpIdTooLong,
            InvalidReason::EqualTokenUnguarded => wit::InvalidReason::EqualTokenUnguarded,
        }),
        CheckError::CorruptState(c) => wit::CheckError::CorruptState(corruption_out(c)),
        CheckError::UnsupportedStateVersion(v) => wit::CheckError::UnsupportedStateVersion(v),
        CheckError::ScopeMismatch(s) => wit::CheckError::ScopeMismatch(s),
        CheckError::ForeignAuthority { stored, presented } => {
            wit::CheckError::ForeignAuthority(wit::ForeignAuthority { stored, presented })
        }
        CheckError::Exhausted => wit::CheckError::Exhausted,
    }
}

fn corruption_out(c: Corruption) -> wit::Corruption {
    match c {
        Corruption::Truncated => wit::Corruption::Truncated,
        Corruption::LengthMismatch => wit::Corruption::LengthMismatch,
        Corruption::ChecksumMismatch => wit::Corruption::ChecksumMismatch,
        Corruption::Malformed => wit::Corruption::Malformed,
    }
}

fn info_out(i: StateInfo) -> wit::StateInfo {
    wit::StateInfo {
        format_version: i.format_version,
        scope: i.scope,
        authority: i.authority,
        highest: token_out(i.highest),
        version: i.version,
        window: i
            .window
            .into_iter()
            .map(|e| wit::WindowEntry {
                op_id: e.op_id,
                version: e.version,
            })
            .collect(),
    }
}

mod lease_exports {
    use super::exports::fencecheck::fence::lease as wit;
    use super::{Component, corruption_out, token_in, token_out};
    use crate::lease::{
        Acquire, AcquireRequest, LeaseError, LeaseInfo, LeaseInvalidReason, Release,
        ReleaseRequest, Renew, RenewRequest,
    };

    impl wit::Guest for Component {
        fn acquire(
            state: Option<Vec<u8>>,
            r: wit::AcquireRequest,
        ) -> Result<wit::AcquireOutcome, wit::LeaseError> {
            let request = AcquireRequest {
                lock: r.lock,
                lease_id: r.lease_id,
                authority: r.authority,
                epoch_floor: r.epoch_floor,
                now: r.now,
                ttl: r.ttl,
            };
            match crate::lease::acquire(state.as_deref(), &request) {
                Ok(Acquire::Acquired {
                    token,
                    expires_at,
                    state,
                }) => Ok(wit::AcquireOutcome::Acquired(wit::Acquired {
                    token: token_out(token),
                    expires_at,
                    state,
                })),
                Ok(Acquire::Busy { holder, expires_at }) => {
                    Ok(wit::AcquireOutcome::Busy(wit::Busy { holder, expires_at }))
                }
                Err(e) => Err(error_out(e)),
            }
        }

        fn renew(
            state: Option<Vec<u8>>,
            r: wit::RenewRequest,
        ) -> Result<wit::RenewOutcome, wit::LeaseError> {
            let request = RenewRequest {
                lease_id: r.lease_id,
                token: token_in(r.token),
                now: r.now,
                ttl: r.ttl,
            };
            match crate::lease::renew(state.as_deref(), &request) {
                Ok(Renew::Renewed { expires_at, state }) => {
                    Ok(wit::RenewOutcome::Renewed(wit::Renewed {
                        expires_at,
                        state,
                    }))
                }
                Ok(Renew::Lost) => Ok(wit::RenewOutcome::Lost),
                Err(e) => Err(error_out(e)),
            }
        }

        fn release(
            state: Option<Vec<u8>>,
            r: wit::ReleaseRequest,
        ) -> Result<wit::ReleaseOutcome, wit::LeaseError> {
            let request = ReleaseRequest {
                lease_id: r.lease_id,
                token: token_in(r.token),
            };
            match crate::lease::release(state.as_deref(), &request) {
                Ok(Release::Released { state }) => Ok(wit::ReleaseOutcome::Released(state)),
                Ok(Release::NotOwner) => Ok(wit::ReleaseOutcome::NotOwner),
                Err(e) => Err(error_out(e)),
            }
        }

        fn restore(state: Option<Vec<u8>>) -> Result<wit::Restored, wit::LeaseError> {
            crate::lease::restore(state.as_deref())
                .map(|(epoch, state)| wit::Restored { epoch, state })
                .map_err(error_out)
        }

        fn inspect(state: Vec<u8>) -> Result<wit::LeaseInfo, wit::LeaseError> {
            crate::lease::inspect_lease(&state)
                .map(info_out)
                .map_err(error_out)
        }
    }

    fn info_out(i: LeaseInfo) -> wit::LeaseInfo {
        wit::LeaseInfo {
            format_version: i.format_version,
            lock: i.lock,
            authority: i.authority,
            epoch: i.epoch,
            counter: i.counter,
            holder: i.holder.map(|h| wit::Holder {
                lease_id: h.lease_id,
                token: token_out(h.token),
                expires_at: h.expires_at,
            }),
        }
    }

    fn error_out(e: LeaseError) -> wit::LeaseError {
        match e {
            LeaseError::InvalidRequest(reason) => wit::LeaseError::InvalidRequest(match reason {
                LeaseInvalidReason::EmptyLock => wit::LeaseInvalidReason::EmptyLock,
                LeaseInvalidReason::LockTooLong => wit::LeaseInvalidReason::LockTooLong,
                LeaseInvalidReason::EmptyLeaseId => wit::LeaseInvalidReason::EmptyLeaseId,
                LeaseInvalidReason::LeaseIdTooLong => wit::LeaseInvalidReason::LeaseIdTooLong,
                LeaseInvalidReason::ZeroTtl => wit::LeaseInvalidReason::ZeroTtl,
                LeaseInvalidReason::ExpiryOverflow => wit::LeaseInvalidReason::ExpiryOverflow,
                LeaseInvalidReason::MissingToken => wit::LeaseInvalidReason::MissingToken,
                LeaseInvalidReason::NoState => wit::LeaseInvalidReason::NoState,
            }),
            LeaseError::CorruptState(c) => wit::LeaseError::CorruptState(corruption_out(c)),
            LeaseError::UnsupportedStateVersion(v) => wit::LeaseError::UnsupportedStateVersion(v),
            LeaseError::LockMismatch(lock) => wit::LeaseError::LockMismatch(lock),
            LeaseError::ForeignAuthority { stored, presented } => {
                wit::LeaseError::ForeignAuthority(wit::ForeignAuthority { stored, presented })
            }
            LeaseError::Exhausted => wit::LeaseError::Exhausted,
        }
    }
}

mod auth_exports {
    use super::exports::fencecheck::fence::auth as wit;
    use super::{Component, decision_out, error_out, request_in, token_in};
    use crate::auth::{
        AuthFailure, GrantKey, GrantSignature, KeyProblem, SignError, SignedCheckError,
    };

    impl wit::Guest for Component {
        fn check_signed(
            state: Option<Vec<u8>>,
            request: wit::Request,
            signature: Option<wit::GrantSignature>,
            keys: Vec<wit::GrantKey>,
        ) -> Result<wit::Decision, wit::SignedCheckError> {
            let keys: Vec<GrantKey> = keys.into_iter().map(key_in).collect();
            let mut request = request_in(request);
            request.signature = signature.map(|s| GrantSignature {
                key_id: s.key_id,
                lease_id: s.lease_id,
                tag: s.tag,
            });
            crate::check_signed(state.as_deref(), &request, &keys)
                .map(decision_out)
                .map_err(|e| match e {
                    SignedCheckError::Check(e) => wit::SignedCheckError::Check(error_out(e)),
                    SignedCheckError::InvalidKeys(p) => {
                        wit::SignedCheckError::InvalidKeys(problem_out(p))
                    }
                    SignedCheckError::Unauthenticated(a) => {
                        wit::SignedCheckError::Unauthenticated(match a {
                            AuthFailure::Unsigned => wit::AuthFailure::Unsigned,
                            AuthFailure::UnknownKey => wit::AuthFailure::UnknownKey,
                            AuthFailure::MalformedSignature => wit::AuthFailure::MalformedSignature,
                            AuthFailure::BadSignature => wit::AuthFailure::BadSignature,
                        })
                    }
                })
        }

        fn sign(
            scope: String,
            token: wit::Token,
            lease_id: String,
            key: wit::GrantKey,
        ) -> Result<wit::GrantSignature, wit::SignError> {
            crate::sign(&scope, token_in(token), &lease_id, &key_in(key))
                .map(|s| wit::GrantSignature {
                    key_id: s.key_id,
                    lease_id: s.lease_id,
                    tag: s.tag,
                })
                .map_err(|e| match e {
                    SignError::EmptyScope => wit::SignError::EmptyScope,
                    SignError::ScopeTooLong => wit::SignError::ScopeTooLong,
                    SignError::MissingToken => wit::SignError::MissingToken,
                    SignError::EmptyLeaseId => wit::SignError::EmptyLeaseId,
                    SignError::LeaseIdTooLong => wit::SignError::LeaseIdTooLong,
                    SignError::InvalidKey(p) => wit::SignError::InvalidKey(problem_out(p)),
                })
        }

        fn grant_message(
            scope: String,
            token: wit::Token,
            key_id: u32,
            lease_id: String,
        ) -> Vec<u8> {
            crate::grant_message(&scope, token_in(token), key_id, &lease_id)
        }
    }

    fn key_in(k: wit::GrantKey) -> GrantKey {
        GrantKey {
            key_id: k.key_id,
            secret: k.secret,
        }
    }

    fn problem_out(p: KeyProblem) -> wit::KeyProblem {
        match p {
            KeyProblem::NoKeys => wit::KeyProblem::NoKeys,
            KeyProblem::TooManyKeys => wit::KeyProblem::TooManyKeys,
            KeyProblem::ShortSecret => wit::KeyProblem::ShortSecret,
            KeyProblem::LongSecret => wit::KeyProblem::LongSecret,
            KeyProblem::DuplicateKeyId => wit::KeyProblem::DuplicateKeyId,
        }
    }
}
