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
        CheckError::CorruptState(c) => wit::CheckError::CorruptState(match c {
            Corruption::Truncated => wit::Corruption::Truncated,
            Corruption::LengthMismatch => wit::Corruption::LengthMismatch,
            Corruption::ChecksumMismatch => wit::Corruption::ChecksumMismatch,
            Corruption::Malformed => wit::Corruption::Malformed,
        }),
        CheckError::UnsupportedStateVersion(v) => wit::CheckError::UnsupportedStateVersion(v),
        CheckError::ScopeMismatch(s) => wit::CheckError::ScopeMismatch(s),
        CheckError::ForeignAuthority { stored, presented } => {
            wit::CheckError::ForeignAuthority(wit::ForeignAuthority { stored, presented })
        }
        CheckError::Exhausted => wit::CheckError::Exhausted,
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
