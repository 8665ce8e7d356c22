//! The SQL functions as safe Rust: arguments in, a value or an SQL error
//! message out, worded exactly as the SQLite extension words them.
//! `udfs.rs` moves values between MariaDB and these.
//!
//! MariaDB hands a UDF every string as bytes (its `STRING_RESULT` does not
//! tell BINARY/BLOB from TEXT), so `state` is "bytes or NULL" here: a text
//! value in that position is decoded as a state and refused as corrupt.

use fencecheck::{
    Acquire, AcquireRequest, CheckError, Checker, Decision, GrantKey, KeysText, LeaseError, Policy,
    Release, ReleaseRequest, Renew, RenewRequest, Request, SignedCheckError, SignedTokenText,
    Token, TokenText,
};

/// One SQL argument, borrowed from MariaDB for the duration of the call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg<'a> {
    /// SQL NULL.
    Null,
    /// An INTEGER result.
    Integer(i64),
    /// A REAL result.
    Real,
    /// A DECIMAL result, as MariaDB writes it (`18446744073709551615`,
    /// `4.2`): the only way a UDF is handed an integer above i64 max.
    Decimal(&'a str),
    /// A string result (text or binary: MariaDB does not say which).
    Text(&'a [u8]),
}

impl Arg<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Arg::Null => "NULL",
            Arg::Integer(_) => "INTEGER",
            Arg::Real => "REAL",
            Arg::Decimal(_) => "DECIMAL",
            Arg::Text(_) => "a string",
        }
    }
}

/// A function's result.
#[derive(Debug, PartialEq, Eq)]
pub enum Output {
    /// SQL NULL.
    Null,
    /// An outcome's name.
    Name(&'static str),
    /// Text (JSON, a version).
    Text(String),
    /// A state's bytes.
    Blob(Vec<u8>),
}

/// An SQL error whose message starts with the error's name
/// (`corrupt-state: checksum-mismatch`, `stale-fence: …`).
#[derive(Debug, PartialEq, Eq)]
pub struct SqlError(pub String);

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
        return Err(invalid(what, "a string", arg));
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
        Arg::Text(bytes) => Some(bytes),
        ref other => return Err(invalid("state", "bytes or NULL", other)),
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
        // A UDF gets an unsigned BIGINT as its i64 bits, so versions above
        // i64 max come as DECIMAL (`CAST(v AS DECIMAL(20,0))`).
        Arg::Decimal(text) => {
            let v = text.parse::<u64>().map_err(|_| {
                SqlError::new(
                    "invalid-argument",
                    format!(
                        "expected_version must be a whole number from 0 to 2^64-1, got {:?}",
                        text.chars().take(64).collect::<String>()
                    ),
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
            let text = text("keys", other)?;
            // No key at all: the component decides (`invalid-keys: no-keys`),
            // after its own request checks, as in every host.
            if text.trim().is_empty() {
                return Ok(Some(Vec::new()));
            }
            let keys = text
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
pub fn fence_check(checker: &mut dyn Checker, args: &[Arg<'_>]) -> Result<Output, SqlError> {
    match decide(checker, args)? {
        Ok(decision) => Ok(Output::Name(decision.name())),
        Err(e) => Err(check_error(&e)),
    }
}

/// `fence_next(...)`: the new state on `applied`; any other outcome raises an
/// error naming it, so an UPDATE can never store a state the fence refused.
pub fn fence_next(checker: &mut dyn Checker, args: &[Arg<'_>]) -> Result<Output, SqlError> {
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
pub fn fence_inspect(checker: &mut dyn Checker, args: &[Arg<'_>]) -> Result<Output, SqlError> {
    let state = match args {
        [Arg::Null] => return Ok(Output::Null),
        [Arg::Text(bytes)] => *bytes,
        [other] => return Err(invalid("state", "bytes or NULL", other)),
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
/// plugin runs (the one built into it), e.g. `'0.1.0'`, as TEXT.
pub fn fence_version(version: &str, args: &[Arg<'_>]) -> Result<Output, SqlError> {
    if !args.is_empty() {
        return Err(SqlError::new(
            "invalid-argument",
            format!("expected no arguments, got {}", args.len()),
        ));
    }
    Ok(Output::Text(version.to_string()))
}

// ---- leases ----

/// A u64 argument: a non-negative INTEGER, or its canonical decimal text
/// (the lease procedures pass their arguments as strings, and an unsigned
/// BIGINT above i64 max reaches a UDF as DECIMAL).
fn number(what: &str, arg: &Arg<'_>) -> Result<u64, SqlError> {
    let bad = |shown: &str| {
        SqlError::new(
            "invalid-argument",
            format!(
                "{what} must be a whole number from 0 to 2^64-1, got {:?}",
                shown.chars().take(64).collect::<String>()
            ),
        )
    };
    match *arg {
        Arg::Integer(v) => u64::try_from(v).map_err(|_| bad(&v.to_string())),
        Arg::Decimal(text) => canonical_u64(text).ok_or_else(|| bad(text)),
        Arg::Text(bytes) => {
            let text = std::str::from_utf8(bytes).map_err(|_| bad("(not UTF-8)"))?;
            canonical_u64(text).ok_or_else(|| bad(text))
        }
        ref other => Err(invalid(what, "a whole number", other)),
    }
}

/// Decimal digits only: no sign, spaces, fraction or exponent.
fn canonical_u64(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The clock a lease decision uses: the server's, or `now_ms` when the
/// server runs with the test clock on.
pub struct Clock {
    /// Whether an explicit `now_ms` is honoured (`FENCECHECK_MARIADB_TEST_CLOCK=1`).
    pub test_clock: bool,
    /// The server's clock, in Unix milliseconds.
    pub system_ms: fn() -> Result<u64, SqlError>,
}

impl Clock {
    fn now(&self, arg: &Arg<'_>) -> Result<u64, SqlError> {
        match arg {
            Arg::Null => (self.system_ms)(),
            _ if !self.test_clock => Err(SqlError::new(
                "invalid-argument",
                "now_ms needs the server started with FENCECHECK_MARIADB_TEST_CLOCK=1 (tests only): leave @fencecheck_now_ms NULL",
            )),
            other => number("now_ms", other),
        }
    }
}

/// The lease state argument: bytes, or NULL for a lock never granted.
fn lease_state<'a>(arg: &Arg<'a>) -> Result<Option<&'a [u8]>, SqlError> {
    match *arg {
        Arg::Null => Ok(None),
        Arg::Text(bytes) => Ok(Some(bytes)),
        ref other => Err(invalid("state", "bytes or NULL", other)),
    }
}

/// A lease token: `AUTHORITY:EPOCH.COUNTER`, or `EPOCH.COUNTER` meaning
/// this server's authority (as FENCE.RENEW takes it).
fn lease_token(arg: &Arg<'_>, authority: u64) -> Result<Token, SqlError> {
    let mut token = text("token", arg)?
        .parse::<TokenText>()
        .map_err(|e| SqlError::new("invalid-token", e))?
        .0;
    if token.authority == 0 {
        token.authority = authority;
    }
    Ok(token)
}

fn lease_error(e: &LeaseError) -> SqlError {
    SqlError(e.to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn count_error(expected: &str, got: usize) -> SqlError {
    SqlError::new(
        "invalid-argument",
        format!("expected {expected}, got {got} arguments"),
    )
}

/// `fence_lease_acquire(state, lock, lease_id, ttl_ms, authority,
/// epoch_floor, now_ms)`: the component's acquire as JSON,
/// `{"outcome":"acquired","token","expires_at","now","state"(hex)}` or
/// `{"outcome":"busy","holder","expires_at"}` (numbers as strings); errors
/// raise. `fencecheck.acquire` stores `state` in the same transaction.
pub fn fence_lease_acquire(
    checker: &mut dyn Checker,
    clock: &Clock,
    args: &[Arg<'_>],
) -> Result<Output, SqlError> {
    let [state, lock, lease_id, ttl, authority, floor, now] = args else {
        return Err(count_error(
            "7 (state, lock, lease_id, ttl_ms, authority, epoch_floor, now_ms)",
            args.len(),
        ));
    };
    let state = lease_state(state)?;
    let request = AcquireRequest {
        lock: text("lock", lock)?.to_string(),
        lease_id: text("lease_id", lease_id)?.to_string(),
        ttl: number("ttl_ms", ttl)?,
        authority: number("authority", authority)?,
        epoch_floor: number("epoch_floor", floor)?,
        now: clock.now(now)?,
    };
    let decided = checker
        .acquire(state, &request)
        .map_err(|e| runtime_error(&e))?
        .map_err(|e| lease_error(&e))?;
    let json = match decided {
        Acquire::Acquired {
            token,
            expires_at,
            state,
        } => serde_json::json!({
            "outcome": "acquired",
            "token": TokenText(token).to_string(),
            "expires_at": expires_at.to_string(),
            "now": request.now.to_string(),
            "state": hex(&state),
        }),
        Acquire::Busy { holder, expires_at } => serde_json::json!({
            "outcome": "busy",
            "holder": holder,
            "expires_at": expires_at.to_string(),
        }),
    };
    Ok(Output::Text(json.to_string()))
}

/// `fence_lease_renew(state, lease_id, token, ttl_ms, authority, now_ms)`:
/// `{"outcome":"renewed","expires_at","state"}` or `{"outcome":"lost"}`.
pub fn fence_lease_renew(
    checker: &mut dyn Checker,
    clock: &Clock,
    args: &[Arg<'_>],
) -> Result<Output, SqlError> {
    let [state, lease_id, token, ttl, authority, now] = args else {
        return Err(count_error(
            "6 (state, lease_id, token, ttl_ms, authority, now_ms)",
            args.len(),
        ));
    };
    let state = lease_state(state)?;
    let authority = number("authority", authority)?;
    let request = RenewRequest {
        lease_id: text("lease_id", lease_id)?.to_string(),
        token: lease_token(token, authority)?,
        ttl: number("ttl_ms", ttl)?,
        now: clock.now(now)?,
    };
    let decided = checker
        .renew(state, &request)
        .map_err(|e| runtime_error(&e))?
        .map_err(|e| lease_error(&e))?;
    let json = match decided {
        Renew::Renewed { expires_at, state } => serde_json::json!({
            "outcome": "renewed",
            "expires_at": expires_at.to_string(),
            "state": hex(&state),
        }),
        Renew::Lost => serde_json::json!({"outcome": "lost"}),
    };
    Ok(Output::Text(json.to_string()))
}

/// `fence_lease_release(state, lease_id, token, authority)`:
/// `{"outcome":"released","state"}` or `{"outcome":"not-owner"}`.
pub fn fence_lease_release(
    checker: &mut dyn Checker,
    args: &[Arg<'_>],
) -> Result<Output, SqlError> {
    let [state, lease_id, token, authority] = args else {
        return Err(count_error(
            "4 (state, lease_id, token, authority)",
            args.len(),
        ));
    };
    let state = lease_state(state)?;
    let authority = number("authority", authority)?;
    let request = ReleaseRequest {
        lease_id: text("lease_id", lease_id)?.to_string(),
        token: lease_token(token, authority)?,
    };
    let decided = checker
        .release(state, &request)
        .map_err(|e| runtime_error(&e))?
        .map_err(|e| lease_error(&e))?;
    let json = match decided {
        Release::Released { state } => {
            serde_json::json!({"outcome": "released", "state": hex(&state)})
        }
        Release::NotOwner => serde_json::json!({"outcome": "not-owner"}),
    };
    Ok(Output::Text(json.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencecheck::Native;

    fn t(s: &str) -> Arg<'_> {
        Arg::Text(s.as_bytes())
    }

    fn args<'a>(state: Arg<'a>, token: Arg<'a>, expected: Arg<'a>) -> [Arg<'a>; 6] {
        [state, t("s"), token, t("allow-equal"), Arg::Null, expected]
    }

    fn first_state() -> Result<Vec<u8>, SqlError> {
        match fence_next(&mut Native, &args(Arg::Null, t("0.41"), Arg::Null))? {
            Output::Blob(b) => Ok(b),
            other => Err(SqlError(format!("{other:?}"))),
        }
    }

    /// Refusals raise with the SQLite extension's wording; fence_check names
    /// the same decision without raising.
    #[test]
    fn refusals_are_named_as_in_sqlite() -> Result<(), SqlError> {
        let state = first_state()?;
        let mut stale = args(Arg::Text(&state), t("0.40"), Arg::Null);
        stale[3] = t("strict");
        let err = fence_next(&mut Native, &stale).err().map(|e| e.0);
        assert_eq!(
            err.as_deref(),
            Some("stale-fence: token 0.40 is not above the highest accepted 0.41")
        );
        assert_eq!(
            fence_check(&mut Native, &stale)?,
            Output::Name("stale-fence")
        );
        let conflict = args(Arg::Text(&state), t("0.41"), Arg::Integer(7));
        let err = fence_next(&mut Native, &conflict).err().map(|e| e.0);
        assert_eq!(
            err.as_deref(),
            Some("version-conflict: expected version 7, the scope is at 1")
        );
        Ok(())
    }

    /// A version above i64 max arrives as DECIMAL text and is decided; a
    /// DECIMAL that is not a whole u64 is refused by name, as is a
    /// negative INTEGER.
    #[test]
    fn expected_version_as_decimal() -> Result<(), SqlError> {
        let state = first_state()?;
        let big = args(
            Arg::Text(&state),
            t("0.41"),
            Arg::Decimal("18446744073709551615"),
        );
        assert_eq!(
            fence_check(&mut Native, &big)?,
            Output::Name("version-conflict")
        );
        for (arg, start) in [
            (
                Arg::Decimal("1.5"),
                "invalid-argument: expected_version must be a whole number",
            ),
            (
                Arg::Decimal("18446744073709551616"),
                "invalid-argument: expected_version must be a whole number",
            ),
            (
                Arg::Integer(-1),
                "invalid-argument: expected_version must not be negative, got -1",
            ),
            (
                Arg::Real,
                "invalid-argument: expected_version must be an INTEGER or NULL, got REAL",
            ),
        ] {
            let got = fence_check(&mut Native, &args(Arg::Text(&state), t("0.42"), arg))
                .err()
                .map(|e| e.0)
                .unwrap_or_default();
            assert!(got.starts_with(start), "{arg:?}: {got}");
        }
        Ok(())
    }

    /// Empty key text reaches the component (`invalid-keys: no-keys`, after
    /// its request checks); malformed key text is refused without quoting it.
    #[test]
    fn keys_argument() {
        let mut call = [
            Arg::Null,
            t("s"),
            t("0.41"),
            t("strict"),
            Arg::Null,
            Arg::Null,
            t(""),
        ];
        let got = fence_check(&mut Native, &call).err().map(|e| e.0);
        assert_eq!(got.as_deref(), Some("invalid-keys: no-keys"));
        call[2] = t("0.0");
        let got = fence_check(&mut Native, &call).err().map(|e| e.0);
        assert_eq!(got.as_deref(), Some("invalid-request: missing-token"));
        call[6] = t("1:secretsecret");
        let got = fence_check(&mut Native, &call)
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert!(got.starts_with("invalid-argument: keys: "), "{got}");
        assert!(!got.contains("secretsecret"), "{got}");
    }

    /// fence_inspect: JSON for a state, NULL for NULL, named errors else.
    #[test]
    fn inspect_shapes() -> Result<(), SqlError> {
        let state = first_state()?;
        let Output::Text(json) = fence_inspect(&mut Native, &[Arg::Text(&state)])? else {
            return Err(SqlError("not text".into()));
        };
        assert!(json.contains("\"scope\":\"s\""), "{json}");
        assert_eq!(fence_inspect(&mut Native, &[Arg::Null])?, Output::Null);
        let err = fence_inspect(&mut Native, &[Arg::Integer(1)])
            .err()
            .map(|e| e.0);
        assert_eq!(
            err.as_deref(),
            Some("invalid-argument: state must be bytes or NULL, got INTEGER")
        );
        Ok(())
    }

    /// Lease numbers are whole u64s only (a non-negative INTEGER or
    /// canonical decimal text); an explicit `now_ms` needs the test clock,
    /// and with it the grant is decided at that time.
    #[test]
    fn lease_numbers_and_clock() -> Result<(), SqlError> {
        for (arg, ok) in [
            (Arg::Integer(5), Some(5)),
            (t("18446744073709551615"), Some(u64::MAX)),
            (Arg::Decimal("7"), Some(7)),
            (Arg::Integer(-1), None),
            (t("+5"), None),
            (t(" 5"), None),
            (t("1e3"), None),
            (t("18446744073709551616"), None),
            (Arg::Real, None),
            (Arg::Null, None),
        ] {
            assert_eq!(number("ttl_ms", &arg).ok(), ok, "{arg:?}");
        }
        let fixed = |test_clock| Clock {
            test_clock,
            system_ms: || Ok(1),
        };
        let call = [
            Arg::Null,
            t("l"),
            t("a"),
            t("10"),
            t("9"),
            t("0"),
            Arg::Integer(100),
        ];
        let refused = fence_lease_acquire(&mut Native, &fixed(false), &call)
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        assert!(
            refused.contains("FENCECHECK_MARIADB_TEST_CLOCK"),
            "{refused}"
        );
        let Output::Text(json) = fence_lease_acquire(&mut Native, &fixed(true), &call)? else {
            return Err(SqlError("not text".into()));
        };
        assert!(json.contains("\"token\":\"9:0.1\""), "{json}");
        assert!(json.contains("\"expires_at\":\"110\""), "{json}");
        Ok(())
    }
}
