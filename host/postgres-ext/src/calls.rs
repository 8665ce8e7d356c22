//! The rules of the SQL functions and of the fenced-table trigger, in safe
//! Rust: arguments in, a decision or a [`Raise`] out. `ffi.rs` moves values
//! between PostgreSQL and these.

use std::cell::RefCell;
use std::sync::OnceLock;

use fencecheck::{
    Checker, Decision, GrantKey, Instance, KeysText, Policy, Request, Runtime, SignedCheckError,
    SignedTokenText, TokenText,
};

use crate::sqlstate::{Raise, SqlState, hint};

/// Text arguments longer than this are refused before they are copied into
/// the guest; its own limits (scope 1024 bytes, op-id 256) are far below
/// it, so it still reports every ordinary oversized field itself.
const MAX_TEXT_ARG: usize = 1 << 20;

/// One runtime per backend process, created on the first call in that
/// backend (never in the postmaster: the library is loaded on first use, not
/// preloaded). `Runtime::new` deserializes the component precompiled at
/// build time, so a new connection pays no compilation.
static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

thread_local! {
    /// The backend's one instance. A backend runs one query at a time on
    /// one thread, so a thread-local is the per-connection instance.
    static GUEST: RefCell<Option<Instance>> = const { RefCell::new(None) };
}

/// This backend's runtime over the embedded component, loaded on first use.
fn runtime() -> Result<&'static Runtime, Raise> {
    RUNTIME
        .get_or_init(|| Runtime::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Raise::new(SqlState::RuntimeError, e))
}

/// `fence_version`: the WIT package version of the component this
/// extension runs (the one built into it, read at load), e.g. `0.1.0`.
pub(crate) fn component_version() -> Result<&'static str, Raise> {
    Ok(runtime()?.component_version())
}

/// Run `f` with this backend's instance, creating it on first use.
pub(crate) fn with_guest<T>(
    f: impl FnOnce(&mut dyn Checker) -> Result<T, Raise>,
) -> Result<T, Raise> {
    let runtime = runtime()?;
    GUEST.with(|slot| {
        // A reentrant call (impossible from SQL: the guest calls nothing)
        // is refused rather than allowed to panic.
        let mut slot = slot
            .try_borrow_mut()
            .map_err(|_| Raise::new(SqlState::RuntimeError, "reentrant call"))?;
        if slot.is_none() {
            *slot = Some(
                runtime
                    .instance()
                    .map_err(|e| Raise::new(SqlState::RuntimeError, e))?,
            );
        }
        match slot.as_mut() {
            Some(instance) => f(instance),
            None => Err(Raise::new(SqlState::RuntimeError, "no instance")),
        }
    })
}

/// A required text argument: present, within the copy bound, UTF-8.
pub(crate) fn text<'a>(what: &str, arg: Option<&'a [u8]>) -> Result<&'a str, Raise> {
    let bytes = arg.ok_or_else(|| {
        Raise::new(
            SqlState::InvalidArgument,
            format!("{what} must be TEXT, got NULL"),
        )
    })?;
    if bytes.len() > MAX_TEXT_ARG {
        return Err(Raise::new(
            SqlState::TooLarge,
            format!("{what} is {} bytes", bytes.len()),
        ));
    }
    std::str::from_utf8(bytes).map_err(|_| {
        Raise::new(
            SqlState::InvalidArgument,
            format!("{what} is not valid UTF-8"),
        )
    })
}

/// `'strict'` or `'allow-equal'`.
pub(crate) fn policy(arg: Option<&[u8]>) -> Result<Policy, Raise> {
    match text("policy", arg)? {
        "strict" => Ok(Policy::Strict),
        "allow-equal" => Ok(Policy::AllowEqual),
        other => Err(Raise::new(
            SqlState::InvalidArgument,
            format!(
                "policy must be 'strict' or 'allow-equal', got {:?}",
                other.chars().take(64).collect::<String>()
            ),
        )),
    }
}

/// The arguments every check takes, as PostgreSQL hands them over (NULL as
/// `None`), before any validation.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Args<'a> {
    pub(crate) scope: Option<&'a [u8]>,
    pub(crate) token: Option<&'a [u8]>,
    pub(crate) policy: Option<&'a [u8]>,
    pub(crate) op_id: Option<&'a [u8]>,
    pub(crate) expected_version: Option<i64>,
}

impl Args<'_> {
    /// The request, every argument checked; nothing is coerced.
    pub(crate) fn request(&self) -> Result<Request, Raise> {
        let scope = text("scope", self.scope)?;
        let presented = text("token", self.token)?
            .parse::<SignedTokenText>()
            .map_err(|e| Raise::new(SqlState::InvalidToken, e))?;
        crate::stats::presented(presented.token);
        let mut request = Request::new(scope, presented.token, policy(self.policy)?);
        request.signature = presented.signature;
        if self.op_id.is_some() {
            request = request.with_op_id(text("op_id", self.op_id)?);
        }
        if let Some(v) = self.expected_version {
            let v = u64::try_from(v).map_err(|_| {
                Raise::new(
                    SqlState::InvalidArgument,
                    format!("expected_version must not be negative, got {v}"),
                )
            })?;
            request = request.with_expected_version(v);
        }
        Ok(request)
    }
}

/// Infrastructure failures: named apart from every fencing outcome.
fn runtime_error(e: &fencecheck::Error) -> Raise {
    match e {
        fencecheck::Error::TooLarge { .. } => Raise::new(SqlState::TooLarge, e),
        _ => Raise::new(SqlState::RuntimeError, e),
    }
}

/// A `keys` argument: a usable key set as text (`ID:HEX,…`). Its errors
/// never quote the text: it holds secrets.
pub(crate) fn keys(arg: &[u8]) -> Result<Vec<GrantKey>, Raise> {
    let keys = text("keys", Some(arg))?
        .parse::<KeysText>()
        .map_err(|e| Raise::new(SqlState::InvalidArgument, format!("keys: {e}")))?;
    Ok(keys.0)
}

/// The component's decision: `check`, or `check-signed` when the scope
/// requires signed tokens (`keys`). Its errors (corrupt state, scope
/// mismatch, unauthenticated…) raise with their own codes and the
/// component's own wording.
pub(crate) fn decide(
    state: Option<&[u8]>,
    args: &Args<'_>,
    keys: Option<&[GrantKey]>,
) -> Result<Decision, Raise> {
    decide_request(state, &args.request()?, keys)
}

/// [`decide`] for a request already made from its arguments.
pub(crate) fn decide_request(
    state: Option<&[u8]>,
    request: &Request,
    keys: Option<&[GrantKey]>,
) -> Result<Decision, Raise> {
    with_guest(|guest| {
        guest
            .decide(state, request, keys)
            .map_err(|e| runtime_error(&e))?
            .map_err(|e| Raise {
                state: match &e {
                    SignedCheckError::Check(e) => SqlState::of_check_error(e),
                    SignedCheckError::Unauthenticated(_) => SqlState::Unauthenticated,
                    SignedCheckError::InvalidKeys(_) => SqlState::InvalidKeys,
                },
                message: e.to_string(),
                hint: None,
            })
    })
}

/// The new state when the decision is `applied`; every other decision
/// raises with its own code, so no statement can store a state the fence
/// refused.
pub(crate) fn applied(decision: Decision) -> Result<Vec<u8>, Raise> {
    match decision {
        Decision::Applied { state, .. } => Ok(state),
        Decision::Duplicate { version } => Err(Raise::new(
            SqlState::Duplicate,
            format!("this op-id was already applied (version {version})"),
        )),
        Decision::StaleFence { presented, highest } => Err(Raise::new(
            SqlState::StaleFence,
            format!(
                "token {} is not above the highest accepted {}",
                TokenText(presented),
                TokenText(highest)
            ),
        )
        .with_hint(hint::STALE)),
        Decision::VersionConflict { expected, actual } => Err(Raise::new(
            SqlState::VersionConflict,
            format!("expected version {expected}, the scope is at {actual}"),
        )),
    }
}

/// `fence_inspect`: the decoded state as JSON (the CLI's `inspect` shape).
pub(crate) fn inspect(state: &[u8]) -> Result<serde_json::Value, Raise> {
    let info = with_guest(|guest| {
        guest
            .inspect(state)
            .map_err(|e| runtime_error(&e))?
            .map_err(|e| Raise {
                state: SqlState::of_check_error(&e),
                message: e.to_string(),
                hint: None,
            })
    })?;
    serde_json::to_value(&info).map_err(|e| Raise::new(SqlState::RuntimeError, e))
}
