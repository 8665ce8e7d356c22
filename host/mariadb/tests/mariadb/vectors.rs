//! Every conformance vector (fence checks, damage, signed scopes) through
//! SQL on a real server: a [`Checker`] whose `check` and `check_signed` run
//! `SELECT fence_check(...)` and `SELECT fence_next(...)` with the state as
//! a bound parameter, and turn the answers back into the component's
//! outcome for the shared runner to compare with the file:
//! - `applied`: the state is the bytes `fence_next` returned, its version
//!   and highest token what `fence_inspect` says about them;
//! - a refusal: parsed from `fence_next`'s message;
//! - an error: both functions must raise exactly the reference's message
//!   for that input (the runner then compares the error with the file).
//!
//! `sign` (the authority's operation, not a resource's) runs on the
//! embedded component directly. Lease files are skipped: this host has no
//! lease functions yet.

use anyhow::{Result, ensure};
use fencecheck::{
    Acquire, AcquireRequest, CheckError, Checker, Decision, Error, GrantKey, GrantSignature,
    Instance, KeysText, LeaseError, Native, Outcome, Policy, Release, ReleaseRequest, Renew,
    RenewRequest, Request, SignError, SignedCheckError, SignedOutcome, SignedTokenText, StateInfo,
    Token, TokenText, vectors,
};
use mysql::prelude::Queryable;
use mysql::{Conn, Value};

use crate::common::Server;

struct Sql {
    conn: Conn,
    local: Instance,
}

fn proto(message: impl Into<String>) -> Error {
    Error::Protocol {
        call: "mariadb",
        message: message.into(),
    }
}

fn token(s: &str) -> Result<Token, Error> {
    s.parse::<TokenText>()
        .map(|t| t.0)
        .map_err(|e| proto(format!("{e}: {s}")))
}

fn json_token(v: &serde_json::Value) -> Result<Token, Error> {
    let field = |name: &str| {
        v.get(name)
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| proto(format!("no {name} in {v}")))
    };
    Ok(Token {
        authority: field("authority")?,
        epoch: field("epoch")?,
        counter: field("counter")?,
    })
}

/// A message as MariaDB sends it: error messages are utf8mb3, so each
/// 4-byte UTF-8 character (🔒 in a scope) arrives as `????`.
fn server_words(message: &str) -> String {
    message
        .chars()
        .map(|c| {
            if c.len_utf8() == 4 {
                "????".to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Ok(bytes) or Err(server message).
type Answer = std::result::Result<Option<Vec<u8>>, String>;

impl Sql {
    fn call(&mut self, function: &str, params: &[Value], big: bool) -> Result<Answer, Error> {
        let mut placeholders = vec!["?"; params.len()];
        if big {
            placeholders[5] = "CAST(? AS DECIMAL(20,0))";
        }
        let placeholders = placeholders.join(", ");
        let sql = format!("SELECT {function}({placeholders})");
        match self.conn.exec_first::<Value, _, _>(sql, params.to_vec()) {
            Ok(Some(Value::Bytes(b))) => Ok(Ok(Some(b))),
            Ok(Some(Value::NULL)) => Ok(Ok(None)),
            Ok(other) => Err(proto(format!("{function}: unexpected {other:?}"))),
            Err(mysql::Error::MySqlError(e)) if e.code == 1644 => Ok(Err(e.message)),
            Err(e) => Err(proto(format!("{function}: {e}"))),
        }
    }

    fn fenced(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: Option<&[GrantKey]>,
    ) -> Result<SignedOutcome, Error> {
        let text = SignedTokenText {
            token: request.token,
            signature: request.signature.clone(),
        }
        .to_string();
        let mut params = vec![
            state.map_or(Value::NULL, |s| Value::Bytes(s.to_vec())),
            Value::Bytes(request.scope.as_bytes().to_vec()),
            Value::Bytes(text.into_bytes()),
            Value::Bytes(
                match request.policy {
                    Policy::Strict => "strict",
                    Policy::AllowEqual => "allow-equal",
                }
                .into(),
            ),
            request
                .op_id
                .as_ref()
                .map_or(Value::NULL, |o| Value::Bytes(o.as_bytes().to_vec())),
            match request.expected_version {
                None => Value::NULL,
                Some(v) => i64::try_from(v)
                    .map_or_else(|_| Value::Bytes(v.to_string().into_bytes()), Value::Int),
            },
        ];
        // Above i64 max a version travels as DECIMAL (docs/mariadb.md).
        let big = request
            .expected_version
            .is_some_and(|v| i64::try_from(v).is_err());
        if let Some(keys) = keys {
            params.push(Value::Bytes(
                KeysText(keys.to_vec()).to_string().into_bytes(),
            ));
        }
        let checked = self.call("fence_check", &params, big)?;
        let next = self.call("fence_next", &params, big)?;
        let name = match checked {
            Ok(Some(name)) => String::from_utf8(name).map_err(|e| proto(e.to_string()))?,
            Ok(None) => return Err(proto("fence_check returned NULL")),
            Err(message) => {
                // An error: both functions must word it as the reference does.
                let reference = Native.decide(state, request, keys)?;
                let same = |e: &SignedCheckError| {
                    server_words(&e.to_string()) == message
                        // The host refuses unusable key text before the
                        // component sees it, naming the same problem.
                        || matches!(e, SignedCheckError::InvalidKeys(p)
                            if message == format!("invalid-argument: keys: invalid key set: {}", p.name()))
                };
                return match reference {
                    Err(e) if same(&e) && next == Err(message.clone()) => Ok(Err(e)),
                    other => Err(proto(format!(
                        "SQL raised {message:?} / {next:?}, the reference decided {other:?}"
                    ))),
                };
            }
        };
        let message = match next {
            Ok(Some(state)) if name == "applied" => {
                let info = self.call("fence_inspect", &[Value::Bytes(state.clone())], false)?;
                let info: serde_json::Value = match info {
                    Ok(Some(json)) => {
                        serde_json::from_slice(&json).map_err(|e| proto(e.to_string()))?
                    }
                    other => return Err(proto(format!("fence_inspect: {other:?}"))),
                };
                let version = info
                    .get("version")
                    .and_then(serde_json::Value::as_u64)
                    .ok_or_else(|| proto("no version"))?;
                let highest = json_token(info.get("highest").unwrap_or(&serde_json::Value::Null))?;
                return Ok(Ok(Decision::Applied {
                    version,
                    highest,
                    state,
                }));
            }
            Err(message) => message,
            other => return Err(proto(format!("fence_check {name}, fence_next {other:?}"))),
        };
        let (outcome, detail) = message
            .split_once(": ")
            .ok_or_else(|| proto(format!("unnamed refusal {message}")))?;
        if outcome != name {
            return Err(proto(format!("fence_check {name}, fence_next {message}")));
        }
        let words: Vec<&str> = detail
            .split([' ', ',', '(', ')'])
            .filter(|w| !w.is_empty())
            .collect();
        let number = |i: usize| -> Result<u64, Error> {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| proto(format!("no number in {message}")))
        };
        let decision = match (outcome, words.as_slice()) {
            (
                "stale-fence",
                [
                    "token",
                    p,
                    "is",
                    "not",
                    "above",
                    "the",
                    "highest",
                    "accepted",
                    h,
                ],
            ) => Decision::StaleFence {
                presented: token(p)?,
                highest: token(h)?,
            },
            ("duplicate", _) => Decision::Duplicate {
                version: number(words.len().saturating_sub(1))?,
            },
            ("version-conflict", _) => Decision::VersionConflict {
                expected: number(2)?,
                actual: number(words.len().saturating_sub(1))?,
            },
            _ => return Err(proto(format!("unknown refusal {message}"))),
        };
        Ok(Ok(decision))
    }
}

impl Checker for Sql {
    fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        Ok(self.fenced(state, request, None)?.map_err(|e| match e {
            SignedCheckError::Check(c) => c,
            other => CheckError::ScopeMismatch(format!("unexpected {other}")),
        }))
    }

    fn check_batch(&mut self, items: &[(Option<&[u8]>, &Request)]) -> Result<Vec<Outcome>, Error> {
        items.iter().map(|(s, r)| self.check(*s, r)).collect()
    }

    fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error> {
        self.local.inspect(state)
    }

    fn check_signed(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: &[GrantKey],
    ) -> Result<SignedOutcome, Error> {
        self.fenced(state, request, Some(keys))
    }

    fn sign(
        &mut self,
        scope: &str,
        token: Token,
        lease_id: &str,
        key: &GrantKey,
    ) -> Result<Result<GrantSignature, SignError>, Error> {
        self.local.sign(scope, token, lease_id, key)
    }

    fn acquire(
        &mut self,
        _: Option<&[u8]>,
        _: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        Err(proto("no lease functions in this host"))
    }

    fn renew(
        &mut self,
        _: Option<&[u8]>,
        _: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        Err(proto("no lease functions in this host"))
    }

    fn release(
        &mut self,
        _: Option<&[u8]>,
        _: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        Err(proto("no lease functions in this host"))
    }

    fn restore(&mut self, _: Option<&[u8]>) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        Err(proto("no lease functions in this host"))
    }

    fn inspect_lease(
        &mut self,
        state: &[u8],
    ) -> Result<Result<fencecheck::LeaseInfo, LeaseError>, Error> {
        self.local.inspect_lease(state)
    }

    fn runtime_name(&self) -> &'static str {
        "mariadb"
    }
}

/// Every fence-check vector file (all but the lease files) passes through
/// the SQL functions on a real server: outcomes, versions, highest tokens,
/// state bytes threaded from step to step, damaged states, signed scopes.
#[test]
fn shared_vectors_pass_through_sql() -> Result<()> {
    let server = Server::start()?;
    let mut sql = Sql {
        conn: server.conn()?,
        local: fencecheck_tests::runtime()?.instance()?,
    };
    let mut ran = 0;
    let mut failures = Vec::new();
    for path in fencecheck_tests::vector_files()? {
        let file = vectors::load(&path).map_err(anyhow::Error::msg)?;
        if file.name.starts_with("lease-") {
            continue;
        }
        let report = vectors::run(&file, &mut sql);
        ran += 1;
        if !report.passed() {
            failures.push(format!("{}: {:?}", file.name, report.failures));
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    ensure!(ran > 50, "only {ran} vector files ran");
    ensure!(server.answers());
    Ok(())
}
