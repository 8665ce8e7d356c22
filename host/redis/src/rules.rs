//! The commands' arguments and answers as plain Rust: parsing, and the
//! error lines every refusal becomes. Nothing here talks to Redis.

use fencecheck::{
    CheckError, Decision, GrantKey, LeaseError, Policy, Request, SignedCheckError, SignedTokenText,
    Token, TokenText,
};

/// A refusal or error sent to the client as `-CODE detail`: the first word
/// names what happened, Redis style. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub String);

impl Refusal {
    pub fn new(code: &str, detail: impl std::fmt::Display) -> Self {
        Refusal(format!("{code} {detail}"))
    }

    /// `ERR …`: a malformed command (Redis's own code for those).
    pub fn syntax(detail: impl std::fmt::Display) -> Self {
        Refusal::new("ERR", detail)
    }

    /// The line as sent: printable ASCII only, at most [`MAX_LINE`] bytes.
    /// A client's bytes reach some lines (an unknown option, a scope, an
    /// inner command's own error), and `redis-module` writes each char as
    /// one byte (`c as u8`: U+0200 becomes NUL, and its `CString::new`
    /// then panics, which aborts the server): everything else is escaped
    /// as Rust does (`\u{200}`, `\n`).
    pub fn wire(&self) -> String {
        wire_line(&self.0)
    }
}

/// The longest error line sent; a longer one is cut and ends in `...`.
pub const MAX_LINE: usize = 400;

/// `line` as printable ASCII (see [`Refusal::wire`]).
pub fn wire_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len().min(MAX_LINE));
    for c in line.chars() {
        let before = out.len();
        if c == ' ' || c.is_ascii_graphic() {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
        if out.len() > MAX_LINE - 3 {
            out.truncate(before);
            out.push_str("...");
            break;
        }
    }
    out
}

/// Arguments longer than this are refused before any copy (the guest's own
/// limits are far below it: scope 1024 bytes, op-id 256).
pub const MAX_ARG: usize = 1 << 16;

/// `what` as UTF-8 text of at most [`MAX_ARG`] bytes.
pub fn text<'a>(what: &str, bytes: &'a [u8]) -> Result<&'a str, Refusal> {
    if bytes.len() > MAX_ARG {
        return Err(Refusal::syntax(format!(
            "{what} is {} bytes, above {MAX_ARG}",
            bytes.len()
        )));
    }
    std::str::from_utf8(bytes).map_err(|_| Refusal::syntax(format!("{what} is not valid UTF-8")))
}

/// A u64 in canonical decimal (digits only, no sign, no spaces).
pub fn number(what: &str, bytes: &[u8]) -> Result<u64, Refusal> {
    let bad = || Refusal::syntax(format!("{what} must be a non-negative integer"));
    if bytes.is_empty() || bytes.len() > 20 || !bytes.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(bad)
}

/// A token as text (`[AUTHORITY:]EPOCH.COUNTER`, optionally signed).
pub fn token(bytes: &[u8]) -> Result<SignedTokenText, Refusal> {
    let text = std::str::from_utf8(bytes).map_err(|_| {
        let shown: String = String::from_utf8_lossy(bytes).chars().take(80).collect();
        Refusal::new("BADTOKEN", format!("invalid token {shown:?}"))
    })?;
    text.parse::<SignedTokenText>()
        .map_err(|e| Refusal::new("BADTOKEN", e))
}

/// `POLICY`, `OPID`, `VERSION`, each at most once, in any order.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub policy: Option<Policy>,
    pub op_id: Option<String>,
    pub expected_version: Option<u64>,
}

/// Options a command accepts besides the fence's (`NOW`), with their values.
pub type Extra<'a> = Vec<(String, &'a [u8])>;

/// Parse option pairs; `extra` names more options the caller accepts
/// (returned in order, with their value) or is empty.
pub fn options<'a>(args: &[&'a [u8]], extra: &[&str]) -> Result<(Options, Extra<'a>), Refusal> {
    let mut opts = Options::default();
    let mut more = Vec::new();
    let mut it = args.iter();
    while let Some(name) = it.next() {
        let upper = String::from_utf8_lossy(name).to_ascii_uppercase();
        let Some(value) = it.next() else {
            return Err(Refusal::syntax(format!(
                "option {:?} needs a value",
                shorten(&upper)
            )));
        };
        let twice = || Refusal::syntax(format!("option {upper} given twice"));
        match upper.as_str() {
            "POLICY" => {
                if opts.policy.is_some() {
                    return Err(twice());
                }
                opts.policy = Some(match value.to_ascii_lowercase().as_slice() {
                    b"strict" => Policy::Strict,
                    b"allow-equal" => Policy::AllowEqual,
                    _ => return Err(Refusal::syntax("POLICY must be strict or allow-equal")),
                });
            }
            "OPID" => {
                if opts.op_id.is_some() {
                    return Err(twice());
                }
                opts.op_id = Some(text("OPID", value)?.to_string());
            }
            "VERSION" => {
                if opts.expected_version.is_some() {
                    return Err(twice());
                }
                opts.expected_version = Some(number("VERSION", value)?);
            }
            other if extra.contains(&other) => {
                if more.iter().any(|(n, _)| n == other) {
                    return Err(twice());
                }
                more.push((upper, *value));
            }
            _ => {
                return Err(Refusal::syntax(format!(
                    "unknown option {:?}",
                    shorten(&upper)
                )));
            }
        }
    }
    Ok((opts, more))
}

fn shorten(s: &str) -> String {
    s.chars().take(40).collect()
}

/// The check request for `scope` with `token` and the options.
pub fn request(scope: &[u8], token_text: &[u8], opts: Options) -> Result<Request, Refusal> {
    let scope = text("scope", scope)?;
    let presented = token(token_text)?;
    let mut request = Request::new(
        scope,
        presented.token,
        opts.policy.unwrap_or(Policy::Strict),
    );
    request.signature = presented.signature;
    if let Some(op_id) = opts.op_id {
        request = request.with_op_id(op_id);
    }
    if let Some(v) = opts.expected_version {
        request = request.with_expected_version(v);
    }
    Ok(request)
}

/// What a fenced write answers: `applied` with the new state, or the
/// decision as a reply (`duplicate`) or a refusal.
pub enum Verdict {
    /// Apply: store `state`; the scope is then at `version`.
    Apply { version: u64, state: Vec<u8> },
    /// Nothing to do; reply `duplicate` with the original version.
    Duplicate { version: u64 },
}

/// Turn a decision into what the command does.
pub fn verdict(outcome: Result<Decision, SignedCheckError>) -> Result<Verdict, Refusal> {
    match outcome {
        Ok(Decision::Applied { version, state, .. }) => Ok(Verdict::Apply { version, state }),
        Ok(Decision::Duplicate { version }) => Ok(Verdict::Duplicate { version }),
        Ok(Decision::StaleFence { presented, highest }) => Err(Refusal::new(
            "STALEFENCE",
            format!(
                "presented {} highest {}",
                TokenText(presented),
                TokenText(highest)
            ),
        )),
        Ok(Decision::VersionConflict { expected, actual }) => Err(Refusal::new(
            "VERSIONCONFLICT",
            format!("expected {expected} actual {actual}"),
        )),
        Err(SignedCheckError::Check(e)) => Err(check_error(&e)),
        Err(SignedCheckError::Unauthenticated(a)) => Err(Refusal::new("UNAUTHENTICATED", a.name())),
        Err(SignedCheckError::InvalidKeys(p)) => Err(Refusal::new("INVALIDKEYS", p.name())),
    }
}

/// `CORRUPTSTATE checksum-mismatch`, `FOREIGNAUTHORITY stored 0 presented 7`…
pub fn check_error(e: &CheckError) -> Refusal {
    match e {
        CheckError::InvalidRequest(r) => Refusal::new("INVALIDREQUEST", r.name()),
        CheckError::CorruptState(c) => Refusal::new("CORRUPTSTATE", c.name()),
        CheckError::UnsupportedStateVersion(v) => {
            Refusal::new("UNSUPPORTEDSTATEVERSION", format!("format {v}"))
        }
        CheckError::ScopeMismatch(s) => Refusal::new(
            "SCOPEMISMATCH",
            format!("the state belongs to scope {:?}", shorten(s)),
        ),
        CheckError::ForeignAuthority { stored, presented } => Refusal::new(
            "FOREIGNAUTHORITY",
            format!("stored {stored} presented {presented}"),
        ),
        CheckError::Exhausted => Refusal::new("EXHAUSTED", "the scope's version would overflow"),
    }
}

/// `LEASECORRUPTSTATE`-style names are not needed: lease errors use the
/// same codes as check errors where they mean the same.
pub fn lease_error(e: &LeaseError) -> Refusal {
    match e {
        LeaseError::InvalidRequest(r) => Refusal::new("INVALIDREQUEST", r.name()),
        LeaseError::CorruptState(c) => Refusal::new("CORRUPTSTATE", c.name()),
        LeaseError::UnsupportedStateVersion(v) => {
            Refusal::new("UNSUPPORTEDSTATEVERSION", format!("format {v}"))
        }
        LeaseError::LockMismatch(l) => Refusal::new(
            "LOCKMISMATCH",
            format!("the state belongs to lock {:?}", shorten(l)),
        ),
        LeaseError::ForeignAuthority { stored, presented } => Refusal::new(
            "FOREIGNAUTHORITY",
            format!("stored {stored} presented {presented}"),
        ),
        LeaseError::Exhausted => Refusal::new("EXHAUSTED", "the lock's counter would overflow"),
    }
}

/// An infrastructure failure: the component could not decide. Never a
/// fencing outcome; nothing changed.
pub fn runtime_error(e: &fencecheck::Error) -> Refusal {
    Refusal::new("FENCERUNTIME", e)
}

/// A stored key set, `ID:HEX,ID:HEX…` (empty: no keys). Only the form is
/// checked here; the component judges the set itself (`no-keys`,
/// `short-secret`…) in its own order, after the request. Errors never
/// quote the text: it holds secrets.
pub fn key_set(text: &[u8]) -> Result<Vec<GrantKey>, Refusal> {
    let malformed = |n: usize| Refusal::new("INVALIDKEYS", format!("entry {n} is not ID:HEX"));
    let text = std::str::from_utf8(text).map_err(|_| malformed(1))?;
    let mut keys = Vec::new();
    for (n, entry) in text
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .enumerate()
    {
        let (id, hex) = entry.split_once(':').ok_or_else(|| malformed(n + 1))?;
        let key_id = number("key id", id.as_bytes())
            .ok()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| malformed(n + 1))?;
        if !hex.len().is_multiple_of(2)
            || hex.len() > 256
            || !hex.bytes().all(|b| b.is_ascii_hexdigit())
        {
            return Err(malformed(n + 1));
        }
        let secret = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .ok_or_else(|| malformed(n + 1))?;
        keys.push(GrantKey { key_id, secret });
    }
    Ok(keys)
}

/// A token as the text clients present back.
pub fn token_text(token: Token) -> String {
    TokenText(token).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencecheck::{Checker, Native};

    fn refusal<T>(r: Result<T, Refusal>) -> String {
        match r {
            Ok(_) => "ok".into(),
            Err(Refusal(s)) => s,
        }
    }

    /// Options parse in any order and case, each once; everything else is
    /// a syntax error naming the problem.
    #[test]
    fn options_parse_or_name_the_problem() {
        let (o, more) = options(
            &[
                b"version",
                b"3",
                b"OPID",
                b"op-1",
                b"Policy",
                b"ALLOW-EQUAL",
                b"NOW",
                b"5",
            ],
            &["NOW"],
        )
        .unwrap_or_default_for_test();
        assert_eq!(o.expected_version, Some(3));
        assert_eq!(o.op_id.as_deref(), Some("op-1"));
        assert_eq!(o.policy, Some(Policy::AllowEqual));
        assert_eq!(more, vec![("NOW".to_string(), &b"5"[..])]);
        let bad: [(&[&[u8]], &str); 7] = [
            (&[b"POLICY"], "ERR option \"POLICY\" needs a value"),
            (
                &[b"POLICY", b"lax"],
                "ERR POLICY must be strict or allow-equal",
            ),
            (
                &[b"VERSION", b"-1"],
                "ERR VERSION must be a non-negative integer",
            ),
            (
                &[b"VERSION", b"18446744073709551616"],
                "ERR VERSION must be a non-negative integer",
            ),
            (&[b"OPID", b"\xff"], "ERR OPID is not valid UTF-8"),
            (
                &[b"OPID", b"a", b"opid", b"b"],
                "ERR option OPID given twice",
            ),
            (&[b"NOW", b"1"], "ERR unknown option \"NOW\""),
        ];
        for (args, want) in bad {
            assert_eq!(refusal(options(args, &[])), want);
        }
    }

    /// Every decision and error maps to its documented first word.
    #[test]
    fn decisions_name_themselves() {
        let first = Native
            .check(
                None,
                &Request::new("s", Token::new(0, 0, 42), Policy::Strict),
            )
            .ok()
            .and_then(|o| o.ok());
        let Some(Decision::Applied { state, .. }) = first else {
            panic!("first write applies");
        };
        let run = |token: Token| {
            let r = Request::new("s", token, Policy::Strict);
            let outcome = Native
                .check(Some(&state), &r)
                .map_err(|e| runtime_error(&e));
            refusal(outcome.and_then(|o| verdict(o.map_err(SignedCheckError::Check))))
        };
        assert_eq!(
            run(Token::new(0, 0, 41)),
            "STALEFENCE presented 0.41 highest 0.42"
        );
        assert_eq!(
            run(Token::new(7, 0, 43)),
            "FOREIGNAUTHORITY stored 0 presented 7"
        );
        assert_eq!(run(Token::new(0, 0, 0)), "INVALIDREQUEST missing-token");
        assert_eq!(run(Token::new(0, 0, 43)), "ok");
        assert_eq!(
            refusal(token(b"0.4x")),
            "BADTOKEN invalid token \"0.4x\": expected EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER (decimal u64), signed: TOKEN~KEY-ID~LEASE~TAG (base64url)"
        );
    }

    /// Every error line is printable ASCII of bounded length, whatever a
    /// client put in it: the bytes `redis-module` can write without
    /// panicking (each char one byte, no NUL).
    #[test]
    fn wire_lines_are_printable_ascii() {
        let unknown = refusal(options(&["opt\u{200}".as_bytes(), b"v"], &[]));
        let sent = Refusal(unknown).wire();
        assert_eq!(sent, "ERR unknown option \"OPT\\u{200}\"");
        for c in (0u32..0x1_0000).filter_map(char::from_u32) {
            let line = Refusal::new("ERR", format!("x{c}\0\r\n")).wire();
            assert!(
                line.bytes().all(|b| b == b' ' || b.is_ascii_graphic()),
                "{line:?}"
            );
        }
        let long = Refusal::new("ERR", "\u{ffff}".repeat(1000)).wire();
        assert!(long.len() <= MAX_LINE && long.ends_with("..."), "{long}");
        assert_eq!(Refusal::syntax("plain text").wire(), "ERR plain text");
    }

    trait OrDefault<T> {
        fn unwrap_or_default_for_test(self) -> T;
    }
    impl<'a> OrDefault<(Options, Extra<'a>)> for Result<(Options, Extra<'a>), Refusal> {
        fn unwrap_or_default_for_test(self) -> (Options, Extra<'a>) {
            match self {
                Ok(v) => v,
                Err(e) => panic!("{e:?}"),
            }
        }
    }
}
