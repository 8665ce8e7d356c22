//! The SQL functions as safe Rust: arguments in, a value or an SQL error
//! message out. `ffi.rs` moves values between SQLite and these.

use fencecheck::{
    CheckError, Checker, Decision, GrantKey, KeysText, Policy, Request, SignedCheckError,
    SignedTokenText, TokenText,
};

/// One SQL argument, borrowed from SQLite for the duration of the call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Arg<'a> {
    Null,
    Integer(i64),
    Real,
    Text(&'a [u8]),
    Blob(&'a [u8]),
}

impl Arg<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Arg::Null => "NULL",
            Arg::Integer(_) => "INTEGER",
            Arg::Real => "REAL",
            Arg::Text(_) => "TEXT",
            Arg::Blob(_) => "BLOB",
        }
    }
}

/// A function's result.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Output {
    Null,
    /// An outcome's name: static, handed to SQLite without a copy.
    Name(&'static str),
    Text(String),
    Blob(Vec<u8>),
}

/// An SQL error whose message starts with the error's name
/// (`corrupt-state: checksum-mismatch`, `stale-fence: …`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SqlError(pub String);

impl SqlError {
    fn new(name: &str, detail: impl std::fmt::Display) -> Self {
        SqlError(format!("{name}: {detail}"))
    }
}

/// Text arguments longer than this are refused before they are copied; the
/// guest's own limits (scope 1024 bytes, op-id 256) are far below it, so the
/// guest still reports every ordinary oversized field itself.
const MAX_TEXT_ARG: usize = 1 << 20;

fn invalid(what: &str, expected: &str, got: &Arg<'_>) -> SqlError {
    SqlError::new(
        "invalid-argument",
        format!("{what} must be {expected}, got {}", got.kind()),
    )
}

fn text<'a>(what: &str, arg: &Arg<'a>) -> Result<&'a str, SqlError> {
    let Arg::Text(bytes) = *arg else {
        return Err(invalid(what, "TEXT", arg));
    };
    if bytes.len() > MAX_TEXT_ARG {
        return Err(SqlError::new(
            "too-large",
            format!("{what} is {} bytes", bytes.len()),
        ));
    }
    std::str::from_utf8(bytes)
        .map_err(|_| SqlError::new("invalid-argument", format!("{what} is not valid UTF-8")))
}

/// What a check call decides on: the stored state, the request (with the
/// token's signature, if its text carries one) and, when the scope requires
/// signed tokens, the keys.
type Inputs<'a> = (Option<&'a [u8]>, Request, Option<Vec<GrantKey>>);

/// `(state, scope, token, policy, op_id, expected_version[, keys])` → what
/// the check decides on. Every type is checked; nothing is coerced. `keys`
/// (TEXT, `ID:HEX,…`) makes the call `check-signed`; NULL or absent: the
/// scope takes unsigned tokens (a signature in the token text is ignored).
fn request<'a>(args: &[Arg<'a>]) -> Result<Inputs<'a>, SqlError> {
    let (args, keys) = match args {
        [rest @ .., keys] if args.len() == 7 => (rest, keys_arg(keys)?),
        _ => (args, None),
    };
    let [state, scope, token, policy, op_id, expected] = args else {
        return Err(SqlError::new(
            "invalid-argument",
            format!(
                "expected 6 or 7 arguments (state, scope, token, policy, op_id, expected_version[, keys]), got {}",
                args.len()
            ),
        ));
    };
    let state = match *state {
        Arg::Null => None,
        Arg::Blob(bytes) => Some(bytes),
        ref other => return Err(invalid("state", "a BLOB or NULL", other)),
    };
    let scope = text("scope", scope)?;
    let presented = text("token", token)?
        .parse::<SignedTokenText>()
        .map_err(|e| SqlError::new("invalid-token", e))?;
    let token = presented.token;
    let policy = match text("policy", policy)? {
        "strict" => Policy::Strict,
        "allow-equal" => Policy::AllowEqual,
        other => {
            return Err(SqlError::new(
                "invalid-argument",
                format!(
                    "policy must be 'strict' or 'allow-equal', got {:?}",
                    other.chars().take(64).collect::<String>()
                ),
            ));
        }
    };
    let mut request = Request::new(scope, token, policy);
    request.signature = presented.signature;
    match op_id {
        Arg::Null => {}
        other => request = request.with_op_id(text("op_id", other)?),
    }
    match *expected {
        Arg::Null => {}
        Arg::Integer(v) => {
            let v = u64::try_from(v).map_err(|_| {
                SqlError::new(
                    "invalid-argument",
                    format!("expected_version must not be negative, got {v}"),
                )
            })?;
            request = request.with_expected_version(v);
        }
        ref other => return Err(invalid("expected_version", "an INTEGER or NULL", other)),
    }
    Ok((state, request, keys))
}

/// The `keys` argument: NULL (not opted in) or a usable key set as text.
/// Its errors never quote the text: it holds secrets.
fn keys_arg(arg: &Arg<'_>) -> Result<Option<Vec<GrantKey>>, SqlError> {
    match arg {
        Arg::Null => Ok(None),
        other => {
            let keys = text("keys", other)?
                .parse::<KeysText>()
                .map_err(|e| SqlError::new("invalid-argument", format!("keys: {e}")))?;
            Ok(Some(keys.0))
        }
    }
}

/// `corrupt-state: checksum-mismatch`, `scope-mismatch: …`,
/// `unauthenticated: bad-signature`: the error's own `name: detail` text, so
/// every host words it the same.
fn check_error(e: &SignedCheckError) -> SqlError {
    SqlError(e.to_string())
}

/// Infrastructure failures: named apart from every domain outcome.
fn runtime_error(e: &fencecheck::Error) -> SqlError {
    let name = match e {
        fencecheck::Error::Trapped { .. } => "guest-trapped",
        fencecheck::Error::TooLarge { .. } => "too-large",
        _ => "runtime-error",
    };
    SqlError::new(name, e)
}

fn decide(
    checker: &mut dyn Checker,
    args: &[Arg<'_>],
) -> Result<Result<Decision, SignedCheckError>, SqlError> {
    let (state, request, keys) = request(args)?;
    checker
        .decide(state, &request, keys.as_deref())
        .map_err(|e| runtime_error(&e))
}

/// `fence_check(...)`: the outcome's name as TEXT; errors raise.
pub(crate) fn fence_check(checker: &mut dyn Checker, args: &[Arg<'_>]) -> Result<Output, SqlError> {
    match decide(checker, args)? {
        Ok(decision) => Ok(Output::Name(decision.name())),
        Err(e) => Err(check_error(&e)),
    }
}

/// `fence_next(...)`: the new state on `applied`; any other outcome raises an
/// error naming it, so an UPDATE can never store a state the fence refused.
pub(crate) fn fence_next(checker: &mut dyn Checker, args: &[Arg<'_>]) -> Result<Output, SqlError> {
    match decide(checker, args)? {
        Ok(Decision::Applied { state, .. }) => Ok(Output::Blob(state)),
        Ok(Decision::Duplicate { version }) => Err(SqlError::new(
            "duplicate",
            format!("this op-id was already applied (version {version})"),
        )),
        Ok(Decision::StaleFence { presented, highest }) => Err(SqlError::new(
            "stale-fence",
            format!(
                "token {} is not above the highest accepted {}",
                TokenText(presented),
                TokenText(highest)
            ),
        )),
        Ok(Decision::VersionConflict { expected, actual }) => Err(SqlError::new(
            "version-conflict",
            format!("expected version {expected}, the scope is at {actual}"),
        )),
        Err(e) => Err(check_error(&e)),
    }
}

/// `fence_inspect(state)`: the decoded state as JSON TEXT (the CLI's
/// `inspect` shape); NULL for NULL (no state yet).
pub(crate) fn fence_inspect(
    checker: &mut dyn Checker,
    args: &[Arg<'_>],
) -> Result<Output, SqlError> {
    let state = match args {
        [Arg::Null] => return Ok(Output::Null),
        [Arg::Blob(bytes)] => *bytes,
        [other] => return Err(invalid("state", "a BLOB or NULL", other)),
        _ => {
            return Err(SqlError::new(
                "invalid-argument",
                "expected 1 argument (state)",
            ));
        }
    };
    let info = checker
        .inspect(state)
        .map_err(|e| runtime_error(&e))?
        .map_err(|e: CheckError| SqlError(e.to_string()))?;
    serde_json::to_string(&info)
        .map(Output::Text)
        .map_err(|e| SqlError::new("runtime-error", e))
}

/// `fence_version()`: the WIT package version of the component this
/// extension runs (the one built into it), e.g. `'0.1.0'`, as TEXT.
pub(crate) fn fence_version(version: &str, args: &[Arg<'_>]) -> Result<Output, SqlError> {
    if !args.is_empty() {
        return Err(SqlError::new(
            "invalid-argument",
            format!("expected no arguments, got {}", args.len()),
        ));
    }
    Ok(Output::Text(version.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencecheck::Native;

    fn t(s: &str) -> Arg<'_> {
        Arg::Text(s.as_bytes())
    }

    fn args<'a>(state: Arg<'a>, scope: Arg<'a>, token: Arg<'a>) -> [Arg<'a>; 6] {
        [state, scope, token, t("strict"), Arg::Null, Arg::Null]
    }

    fn first_state() -> Result<Vec<u8>, SqlError> {
        match fence_next(&mut Native, &args(Arg::Null, t("s"), t("0.41")))? {
            Output::Blob(b) => Ok(b),
            other => Err(SqlError(format!("{other:?}"))),
        }
    }

    /// Outcomes come back by name; fence_next raises for every non-applied one.
    #[test]
    fn outcomes_are_named() -> Result<(), SqlError> {
        let state = first_state()?;
        let newer = args(Arg::Blob(&state), t("s"), t("0.42"));
        assert_eq!(fence_check(&mut Native, &newer)?, Output::Name("applied"));
        let stale = args(Arg::Blob(&state), t("s"), t("0.41"));
        assert_eq!(
            fence_check(&mut Native, &stale)?,
            Output::Name("stale-fence")
        );
        let err = fence_next(&mut Native, &stale).err().map(|e| e.0);
        assert_eq!(
            err.as_deref(),
            Some("stale-fence: token 0.41 is not above the highest accepted 0.41")
        );
        Ok(())
    }

    /// fence_next, the one-call form's only function, raises for every
    /// refused decision with the decision's name first; fence_check names
    /// the same decision without raising.
    #[test]
    fn fence_next_names_every_refusal() -> Result<(), SqlError> {
        // Token 0.42 applied under allow-equal with op-id op-1.
        let mut call = [
            Arg::Null,
            t("s"),
            t("0.42"),
            t("allow-equal"),
            t("op-1"),
            Arg::Null,
        ];
        let state = match fence_next(&mut Native, &call)? {
            Output::Blob(b) => b,
            other => return Err(SqlError(format!("{other:?}"))),
        };
        call[0] = Arg::Blob(&state);
        let cases: [([Arg<'_>; 4], &str, &str); 4] = [
            (
                [t("0.41"), t("strict"), Arg::Null, Arg::Null],
                "stale-fence",
                "token 0.41 is not above the highest accepted 0.42",
            ),
            (
                [t("0.42"), t("strict"), Arg::Null, Arg::Null],
                "stale-fence",
                "token 0.42 is not above the highest accepted 0.42",
            ),
            (
                [t("0.42"), t("allow-equal"), t("op-1"), Arg::Null],
                "duplicate",
                "this op-id was already applied (version 1)",
            ),
            (
                [t("0.42"), t("allow-equal"), Arg::Null, Arg::Integer(7)],
                "version-conflict",
                "expected version 7, the scope is at 1",
            ),
        ];
        for (rest, name, detail) in cases {
            call[2..].copy_from_slice(&rest);
            let got = fence_next(&mut Native, &call).err().map(|e| e.0);
            assert_eq!(got, Some(format!("{name}: {detail}")));
            assert_eq!(fence_check(&mut Native, &call)?, Output::Name(name));
        }
        Ok(())
    }

    /// Wrong types, bad token text, unknown policies and negative versions
    /// are refused with a message naming the argument.
    #[test]
    fn bad_arguments_are_refused_by_name() -> Result<(), SqlError> {
        let state = first_state()?;
        let cases: Vec<([Arg<'_>; 6], &str)> = vec![
            (
                args(t("x"), t("s"), t("0.42")),
                "invalid-argument: state must be a BLOB or NULL, got TEXT",
            ),
            (
                args(Arg::Integer(1), t("s"), t("0.42")),
                "invalid-argument: state must be a BLOB or NULL, got INTEGER",
            ),
            (
                args(Arg::Null, Arg::Null, t("0.42")),
                "invalid-argument: scope must be TEXT, got NULL",
            ),
            (
                args(Arg::Null, Arg::Blob(b"s"), t("0.42")),
                "invalid-argument: scope must be TEXT, got BLOB",
            ),
            (
                args(Arg::Null, Arg::Text(&[0xff]), t("0.42")),
                "invalid-argument: scope is not valid UTF-8",
            ),
            (
                args(Arg::Null, t("s"), Arg::Integer(42)),
                "invalid-argument: token must be TEXT, got INTEGER",
            ),
            (
                args(Arg::Null, t("s"), Arg::Real),
                "invalid-argument: token must be TEXT, got REAL",
            ),
            (
                args(Arg::Null, t("s"), t("42")),
                "invalid-token: invalid token \"42\"",
            ),
            (
                args(Arg::Null, t("s"), t("+0.42")),
                "invalid-token: invalid token \"+0.42\"",
            ),
            (
                args(Arg::Null, t("s"), t("0.18446744073709551616")),
                "invalid-token:",
            ),
            (
                args(Arg::Blob(&state), t("other"), t("0.42")),
                "scope-mismatch: the state belongs to scope \"s\"",
            ),
            (
                args(Arg::Blob(&state), t("s"), t("7:0.42")),
                "foreign-authority: the scope is pinned to authority 0, the token is from 7",
            ),
            (
                args(Arg::Blob(&state[..5]), t("s"), t("0.42")),
                "corrupt-state: truncated",
            ),
            (
                args(Arg::Null, t(""), t("0.42")),
                "invalid-request: empty-scope",
            ),
            (
                args(Arg::Null, t("s"), t("0.0")),
                "invalid-request: missing-token",
            ),
        ];
        for (case, expected) in cases {
            let got = fence_check(&mut Native, &case)
                .err()
                .map(|e| e.0)
                .unwrap_or_default();
            assert!(got.starts_with(expected), "{case:?}: {got}");
            let got = fence_next(&mut Native, &case)
                .err()
                .map(|e| e.0)
                .unwrap_or_default();
            assert!(got.starts_with(expected), "{case:?}: {got}");
        }
        let mut bad = args(Arg::Null, t("s"), t("0.42"));
        bad[3] = t("lenient");
        let got = fence_check(&mut Native, &bad)
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert!(got.starts_with("invalid-argument: policy must be"), "{got}");
        bad[3] = t("allow-equal");
        bad[5] = Arg::Integer(-1);
        let got = fence_check(&mut Native, &bad)
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert_eq!(
            got,
            "invalid-argument: expected_version must not be negative, got -1"
        );
        bad[5] = t("1");
        let got = fence_check(&mut Native, &bad)
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert_eq!(
            got,
            "invalid-argument: expected_version must be an INTEGER or NULL, got TEXT"
        );
        bad[5] = Arg::Null;
        bad[4] = Arg::Integer(5);
        let got = fence_check(&mut Native, &bad)
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert_eq!(got, "invalid-argument: op_id must be TEXT, got INTEGER");
        Ok(())
    }

    /// A text argument past the copy bound is refused without being copied.
    #[test]
    fn huge_text_is_refused() {
        let huge = vec![b'a'; MAX_TEXT_ARG + 1];
        let got = fence_check(&mut Native, &args(Arg::Null, Arg::Text(&huge), t("0.1")));
        assert_eq!(
            got.err().map(|e| e.0),
            Some(format!("too-large: scope is {} bytes", MAX_TEXT_ARG + 1))
        );
    }

    /// fence_inspect decodes a state to the CLI's JSON, NULL to NULL, and
    /// refuses anything else.
    #[test]
    fn inspect_shapes() -> Result<(), SqlError> {
        let state = first_state()?;
        let Output::Text(json) = fence_inspect(&mut Native, &[Arg::Blob(&state)])? else {
            return Err(SqlError("not text".into()));
        };
        assert!(
            json.contains("\"scope\":\"s\"") && json.contains("\"version\":1"),
            "{json}"
        );
        assert_eq!(fence_inspect(&mut Native, &[Arg::Null])?, Output::Null);
        let err = fence_inspect(&mut Native, &[t("x")]).err().map(|e| e.0);
        assert_eq!(
            err.as_deref(),
            Some("invalid-argument: state must be a BLOB or NULL, got TEXT")
        );
        let err = fence_inspect(&mut Native, &[Arg::Blob(b"")])
            .err()
            .map(|e| e.0);
        assert_eq!(err.as_deref(), Some("corrupt-state: truncated"));
        Ok(())
    }
}
