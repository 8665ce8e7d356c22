//! The decision rules of docs/design.md (§3, "The fence check"), in their order.

use core::cmp::Ordering;

use crate::frame::same;
use crate::state::{Next, State, Window};
use crate::types::{
    CheckError, Decision, InvalidReason, MAX_OP_ID_BYTES, MAX_SCOPE_BYTES, Policy, Request, Token,
};

/// A request with borrowed strings: what the rules actually need, so a
/// packed batch can be decided without copying its strings. The rules only
/// compare, measure and copy the strings, so they are kept as bytes; both
/// are valid UTF-8 (a `Request`'s strings, or checked by the packed parser).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestRef<'r> {
    pub scope: &'r [u8],
    pub token: Token,
    pub policy: Policy,
    pub op_id: Option<&'r [u8]>,
    pub expected_version: Option<u64>,
}

impl<'r> From<&'r Request> for RequestRef<'r> {
    fn from(r: &'r Request) -> Self {
        RequestRef {
            scope: r.scope.as_bytes(),
            token: r.token,
            policy: r.policy,
            op_id: r.op_id.as_deref().map(str::as_bytes),
            expected_version: r.expected_version,
        }
    }
}

/// The rules' answer before the new state is encoded: the caller chooses
/// where its bytes go (a fresh `Vec`, or a batch's output buffer).
#[derive(Debug)]
pub(crate) enum Verdict<'s> {
    Applied { version: u64, next: Next<'s> },
    Decided(Decision),
}

/// Decide one request against a scope's stored state (`None` if the scope has
/// never accepted a token).
///
/// Only [`Decision::Applied`] asks the host to change anything: it must apply
/// the mutation and store the returned state in the same transaction.
pub fn check(state: Option<&[u8]>, request: &Request) -> Result<Decision, CheckError> {
    Ok(match decide(state, RequestRef::from(request))? {
        Verdict::Applied { version, next } => Decision::Applied {
            version,
            highest: next.highest,
            state: next.encode(),
        },
        Verdict::Decided(decision) => decision,
    })
}

/// The rules, in order, over borrowed inputs.
#[inline]
pub(crate) fn decide<'s>(
    state: Option<&'s [u8]>,
    request: RequestRef<'s>,
) -> Result<Verdict<'s>, CheckError> {
    // Rule 1: the request itself.
    validate(&request).map_err(CheckError::InvalidRequest)?;

    // Rule 2: the stored state, its scope and its authority.
    let current = match state {
        None => None,
        Some(bytes) => Some(State::decode(bytes)?),
    };
    // What the new state keeps of the stored window, and the stored state
    // itself when the new bytes will differ from it only in epoch, counter
    // and version (its CRC is then patched rather than recomputed).
    let (version, kept, base) = match current {
        // Rule 3: a scope with no state is at version 0; rules 4-7 do not apply.
        None => (0, Window::default(), None),
        Some(current) => {
            // The request's scope is valid UTF-8, so equal bytes are too;
            // only a different stored scope needs checking before it is shown.
            if !same(current.scope, request.scope) {
                return Err(CheckError::ScopeMismatch(current.scope_str()?.to_owned()));
            }
            if current.highest.authority != request.token.authority {
                return Err(CheckError::ForeignAuthority {
                    stored: current.highest.authority,
                    presented: request.token.authority,
                });
            }
            match request.token.grant_order(&current.highest) {
                // Rule 4.
                Ordering::Less => {
                    return Ok(Verdict::Decided(Decision::StaleFence {
                        presented: request.token,
                        highest: current.highest,
                    }));
                }
                Ordering::Equal => {
                    // Rule 5: a repeat of an applied op-id, under any policy.
                    let seen = request.op_id.and_then(|op| current.window.find(op));
                    if let Some(version) = seen {
                        return Ok(Verdict::Decided(Decision::Duplicate { version }));
                    }
                    match request.policy {
                        // Rule 6: the grant was already used.
                        Policy::Strict => {
                            return Ok(Verdict::Decided(Decision::StaleFence {
                                presented: request.token,
                                highest: current.highest,
                            }));
                        }
                        // Rule 7: same-token writes need an ordering guard.
                        Policy::AllowEqual
                            if request.op_id.is_none() && request.expected_version.is_none() =>
                        {
                            return Err(CheckError::InvalidRequest(
                                InvalidReason::EqualTokenUnguarded,
                            ));
                        }
                        Policy::AllowEqual => {
                            (current.version, current.window, Some(current.base()))
                        }
                    }
                }
                // A newer grant: the idempotency window restarts.
                Ordering::Greater => {
                    let base = current.window.is_empty().then(|| current.base());
                    (current.version, Window::default(), base)
                }
            }
        }
    };

    // Rule 8.
    if let Some(expected) = request.expected_version
        && expected != version
    {
        return Ok(Verdict::Decided(Decision::VersionConflict {
            expected,
            actual: version,
        }));
    }

    // Rule 9.
    let next = version.checked_add(1).ok_or(CheckError::Exhausted)?;
    Ok(Verdict::Applied {
        version: next,
        next: Next::new(
            request.scope,
            request.token,
            next,
            kept,
            request.op_id,
            base,
        ),
    })
}

pub(crate) fn validate(request: &RequestRef<'_>) -> Result<(), InvalidReason> {
    if request.token.is_missing() {
        return Err(InvalidReason::MissingToken);
    }
    if request.scope.is_empty() {
        return Err(InvalidReason::EmptyScope);
    }
    if request.scope.len() > MAX_SCOPE_BYTES {
        return Err(InvalidReason::ScopeTooLong);
    }
    match request.op_id {
        Some([]) => Err(InvalidReason::EmptyOpId),
        Some(op) if op.len() > MAX_OP_ID_BYTES => Err(InvalidReason::OpIdTooLong),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]
mod tests {
    use super::*;
    use crate::types::Token;

    fn applied_state(d: Result<Decision, CheckError>) -> Vec<u8> {
        match d {
            Ok(Decision::Applied { state, .. }) => state,
            other => panic!("expected applied, got {other:?}"),
        }
    }

    /// The seed's paused writer: after 42 is accepted, 41 is stale forever.
    #[test]
    fn paused_writer_is_fenced() {
        let t41 = Request::new("report/july", Token::new(0, 0, 41), Policy::Strict);
        let t42 = Request::new("report/july", Token::new(0, 0, 42), Policy::Strict);
        let s = applied_state(check(None, &t41));
        let s = applied_state(check(Some(&s), &t42));
        assert_eq!(
            check(Some(&s), &t41),
            Ok(Decision::StaleFence {
                presented: t41.token,
                highest: t42.token
            })
        );
    }

    /// Under allow-equal, an op-id repeat is a duplicate carrying the original
    /// version, and the window restarts when the token advances.
    #[test]
    fn duplicates_report_the_original_version() {
        let t = Token::new(0, 0, 5);
        let a = Request::new("s", t, Policy::AllowEqual).with_op_id("a");
        let b = Request::new("s", t, Policy::AllowEqual).with_op_id("b");
        let s = applied_state(check(None, &a));
        let s = applied_state(check(Some(&s), &b));
        assert_eq!(check(Some(&s), &a), Ok(Decision::Duplicate { version: 1 }));
        let newer = Request::new("s", Token::new(0, 0, 6), Policy::AllowEqual).with_op_id("c");
        let s = applied_state(check(Some(&s), &newer));
        let again = Request::new("s", Token::new(0, 0, 6), Policy::AllowEqual).with_op_id("a");
        assert!(matches!(
            check(Some(&s), &again),
            Ok(Decision::Applied { version: 4, .. })
        ));
    }

    /// The window keeps the newest WINDOW_CAPACITY op-ids.
    #[test]
    fn window_is_bounded() {
        use crate::state::WINDOW_CAPACITY;
        let t = Token::new(0, 0, 1);
        let mut state: Option<Vec<u8>> = None;
        for i in 0..WINDOW_CAPACITY + 1 {
            let r = Request::new("s", t, Policy::AllowEqual).with_op_id(format!("op{i}"));
            state = Some(applied_state(check(state.as_deref(), &r)));
        }
        let info = crate::inspect(state.as_deref().unwrap_or_default());
        let info = info.unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(info.window.len(), WINDOW_CAPACITY);
        assert_eq!(info.window[0].op_id, "op1");
    }
}
