//! Every conformance vector through the module: a [`Checker`] whose check,
//! check-signed, acquire, renew and release are the module's commands on a
//! real server. Each call plants the slot's state in the state key with a
//! plain SET (so damaged states are real Redis values), runs the command,
//! reads the stored state back, and turns the reply or error line back
//! into the component's outcome, which the shared runner compares with
//! the file. `sign` (the authority's own operation, not a resource's) and
//! the per-lock `restore` export (the module restores with a
//! coordinator-wide floor instead) run on the embedded component directly.

use crate::common::{Conn, Options, Server, Value, kinds};
use anyhow::{Context, Result, ensure};
use fencecheck::{
    Acquire, AcquireRequest, AuthFailure, CheckError, Checker, Corruption, Decision, Error,
    GrantKey, GrantSignature, Instance, InvalidReason, KeyProblem, LeaseError, LeaseInfo,
    LeaseInvalidReason, Outcome, Release, ReleaseRequest, Renew, RenewRequest, Request, Runtime,
    SignError, SignedCheckError, SignedOutcome, SignedTokenText, StateInfo, Token, TokenText,
    vectors,
};

struct Module {
    conn: Conn,
    local: Instance,
    lock: String,
}

fn proto(message: impl Into<String>) -> Error {
    Error::Protocol {
        call: "redis",
        message: message.into(),
    }
}

fn io<T>(r: Result<T>) -> Result<T, Error> {
    r.map_err(|e| proto(format!("{e:#}")))
}

fn invalid_reason(s: &str) -> Option<InvalidReason> {
    use InvalidReason::*;
    [
        MissingToken,
        EmptyScope,
        ScopeTooLong,
        EmptyOpId,
        OpIdTooLong,
        EqualTokenUnguarded,
    ]
    .into_iter()
    .find(|r| r.name() == s)
}

fn lease_reason(s: &str) -> Option<LeaseInvalidReason> {
    use LeaseInvalidReason::*;
    [
        EmptyLock,
        LockTooLong,
        EmptyLeaseId,
        LeaseIdTooLong,
        ZeroTtl,
        ExpiryOverflow,
        MissingToken,
        NoState,
    ]
    .into_iter()
    .find(|r| r.name() == s)
}

fn corruption(s: &str) -> Option<Corruption> {
    use Corruption::*;
    [Truncated, LengthMismatch, ChecksumMismatch, Malformed]
        .into_iter()
        .find(|c| c.name() == s)
}

fn auth_failure(s: &str) -> Option<AuthFailure> {
    use AuthFailure::*;
    [Unsigned, UnknownKey, MalformedSignature, BadSignature]
        .into_iter()
        .find(|a| a.name() == s)
}

fn key_problem(s: &str) -> Option<KeyProblem> {
    use KeyProblem::*;
    [NoKeys, TooManyKeys, ShortSecret, LongSecret, DuplicateKeyId]
        .into_iter()
        .find(|p| p.name() == s)
}

fn token(s: &str) -> Result<Token, Error> {
    s.parse::<TokenText>()
        .map(|t| t.0)
        .map_err(|e| proto(e.to_string()))
}

fn int(v: &Value) -> Result<u64, Error> {
    match v {
        Value::Int(i) => u64::try_from(*i).map_err(|e| proto(e.to_string())),
        Value::Bulk(b) => String::from_utf8_lossy(b)
            .parse()
            .map_err(|_| proto("not a number")),
        other => Err(proto(format!("not a number: {other:?}"))),
    }
}

/// `-CODE detail` → the component's error.
fn signed_error(line: &str) -> Result<SignedCheckError, Error> {
    let (code, detail) = line.split_once(' ').unwrap_or((line, ""));
    let words: Vec<&str> = detail.split(' ').collect();
    let e = match code {
        "INVALIDREQUEST" => {
            CheckError::InvalidRequest(invalid_reason(detail).ok_or_else(|| proto(line))?)
        }
        "CORRUPTSTATE" => CheckError::CorruptState(corruption(detail).ok_or_else(|| proto(line))?),
        "UNSUPPORTEDSTATEVERSION" => CheckError::UnsupportedStateVersion(
            words
                .get(1)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| proto(line))?,
        ),
        "SCOPEMISMATCH" => CheckError::ScopeMismatch(String::new()),
        "FOREIGNAUTHORITY" => CheckError::ForeignAuthority {
            stored: words
                .get(1)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| proto(line))?,
            presented: words
                .get(3)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| proto(line))?,
        },
        "EXHAUSTED" => CheckError::Exhausted,
        "UNAUTHENTICATED" => {
            return Ok(SignedCheckError::Unauthenticated(
                auth_failure(detail).ok_or_else(|| proto(line))?,
            ));
        }
        "INVALIDKEYS" => {
            return Ok(SignedCheckError::InvalidKeys(
                key_problem(detail).ok_or_else(|| proto(line))?,
            ));
        }
        _ => return Err(proto(format!("not an outcome: -{line}"))),
    };
    Ok(SignedCheckError::Check(e))
}

fn lease_error(line: &str) -> Result<LeaseError, Error> {
    let (code, detail) = line.split_once(' ').unwrap_or((line, ""));
    let words: Vec<&str> = detail.split(' ').collect();
    Ok(match code {
        "INVALIDREQUEST" => {
            LeaseError::InvalidRequest(lease_reason(detail).ok_or_else(|| proto(line))?)
        }
        "CORRUPTSTATE" => LeaseError::CorruptState(corruption(detail).ok_or_else(|| proto(line))?),
        "UNSUPPORTEDSTATEVERSION" => LeaseError::UnsupportedStateVersion(
            words
                .get(1)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| proto(line))?,
        ),
        "LOCKMISMATCH" => LeaseError::LockMismatch(String::new()),
        "FOREIGNAUTHORITY" => LeaseError::ForeignAuthority {
            stored: words
                .get(1)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| proto(line))?,
            presented: words
                .get(3)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| proto(line))?,
        },
        "EXHAUSTED" => LeaseError::Exhausted,
        _ => return Err(proto(format!("not a lease outcome: -{line}"))),
    })
}

impl Module {
    /// SET or DEL `key` to hold `state`.
    fn plant(&mut self, key: &[u8], state: Option<&[u8]>) -> Result<(), Error> {
        let r = match state {
            Some(s) => self.conn.cmd(&[b"SET".as_slice(), key, s]),
            None => self.conn.cmd(&[b"DEL".as_slice(), key]),
        };
        match io(r)? {
            Value::Error(e) => Err(proto(e)),
            _ => Ok(()),
        }
    }

    fn stored(&mut self, key: &[u8]) -> Result<Vec<u8>, Error> {
        match io(self.conn.cmd(&[b"GET".as_slice(), key]))? {
            Value::Bulk(b) => Ok(b),
            other => Err(proto(format!("no state stored: {other:?}"))),
        }
    }

    fn fenced(
        &mut self,
        state: Option<&[u8]>,
        request: &Request,
        keys: Option<&[GrantKey]>,
    ) -> Result<SignedOutcome, Error> {
        let scope = request.scope.as_bytes();
        let key =
            fencecheck_redis::fence_key(scope).map_err(|_| proto("scope without a slot key"))?;
        self.plant(&key, state)?;
        let keys_key = fencecheck_redis::SIGNING_KEYS_KEY.as_bytes();
        self.plant(keys_key, None)?;
        if let Some(keys) = keys {
            let text: Vec<String> = keys
                .iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        k.key_id,
                        k.secret
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<String>()
                    )
                })
                .collect();
            let set = io(self.conn.cmd(&[
                b"HSET".as_slice(),
                keys_key,
                scope,
                text.join(",").as_bytes(),
            ]))?;
            if let Value::Error(e) = set {
                return Err(proto(e));
            }
        }
        let text = SignedTokenText {
            token: request.token,
            signature: request.signature.clone(),
        }
        .to_string();
        let mut args: Vec<Vec<u8>> = vec![
            b"FENCE.SET".to_vec(),
            scope.to_vec(),
            text.into_bytes(),
            b"value".to_vec(),
        ];
        if request.policy == fencecheck::Policy::AllowEqual {
            args.extend([b"POLICY".to_vec(), b"allow-equal".to_vec()]);
        }
        if let Some(op) = &request.op_id {
            args.extend([b"OPID".to_vec(), op.as_bytes().to_vec()]);
        }
        if let Some(v) = request.expected_version {
            args.extend([b"VERSION".to_vec(), v.to_string().into_bytes()]);
        }
        let reply = io(self.conn.cmd(&args))?;
        match &reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Simple(s), v] if s == "applied" => Ok(Ok(Decision::Applied {
                    version: int(v)?,
                    highest: request.token,
                    state: self.stored(&key)?,
                })),
                [Value::Simple(s), v] if s == "duplicate" => {
                    Ok(Ok(Decision::Duplicate { version: int(v)? }))
                }
                _ => Err(proto(format!("unexpected reply {reply:?}"))),
            },
            Value::Error(line) => {
                let (code, detail) = line.split_once(' ').unwrap_or((line, ""));
                let words: Vec<&str> = detail.split(' ').collect();
                match (code, words.as_slice()) {
                    ("STALEFENCE", ["presented", p, "highest", h]) => {
                        Ok(Ok(Decision::StaleFence {
                            presented: token(p)?,
                            highest: token(h)?,
                        }))
                    }
                    ("VERSIONCONFLICT", ["expected", e, "actual", a]) => {
                        Ok(Ok(Decision::VersionConflict {
                            expected: e.parse().map_err(|_| proto(line.clone()))?,
                            actual: a.parse().map_err(|_| proto(line.clone()))?,
                        }))
                    }
                    _ => Ok(Err(signed_error(line)?)),
                }
            }
            other => Err(proto(format!("unexpected reply {other:?}"))),
        }
    }

    fn lease_key(&mut self, lock: &str) -> Result<Vec<u8>, Error> {
        fencecheck_redis::lease_key(lock.as_bytes()).map_err(|_| proto("lock without a slot key"))
    }
}

impl Checker for Module {
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
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        self.lock = request.lock.clone();
        let key = self.lease_key(&request.lock)?;
        self.plant(&key, state)?;
        self.plant(
            fencecheck_redis::LINEAGE_KEY.as_bytes(),
            Some(request.authority.to_string().as_bytes()),
        )?;
        self.plant(
            fencecheck_redis::FLOOR_KEY.as_bytes(),
            Some(request.epoch_floor.to_string().as_bytes()),
        )?;
        let reply = io(self.conn.cmd(&[
            "FENCE.ACQUIRE",
            &request.lock,
            &request.lease_id,
            &request.ttl.to_string(),
            "NOW",
            &request.now.to_string(),
        ]))?;
        match &reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Simple(s), Value::Bulk(t), e, _] if s == "acquired" => {
                    Ok(Ok(Acquire::Acquired {
                        token: token(&String::from_utf8_lossy(t))?,
                        expires_at: int(e)?,
                        state: self.stored(&key)?,
                    }))
                }
                [Value::Simple(s), Value::Bulk(h), e] if s == "busy" => Ok(Ok(Acquire::Busy {
                    holder: String::from_utf8_lossy(h).into_owned(),
                    expires_at: int(e)?,
                })),
                _ => Err(proto(format!("unexpected reply {reply:?}"))),
            },
            Value::Error(line) => Ok(Err(lease_error(line)?)),
            other => Err(proto(format!("unexpected reply {other:?}"))),
        }
    }

    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        let lock = self.lock.clone();
        let key = self.lease_key(&lock)?;
        self.plant(&key, state)?;
        let reply = io(self.conn.cmd(&[
            "FENCE.RENEW",
            &lock,
            &request.lease_id,
            &TokenText(request.token).to_string(),
            &request.ttl.to_string(),
            "NOW",
            &request.now.to_string(),
        ]))?;
        match &reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Simple(s), e] if s == "renewed" => Ok(Ok(Renew::Renewed {
                    expires_at: int(e)?,
                    state: self.stored(&key)?,
                })),
                [Value::Simple(s)] if s == "lost" => Ok(Ok(Renew::Lost)),
                _ => Err(proto(format!("unexpected reply {reply:?}"))),
            },
            Value::Error(line) => Ok(Err(lease_error(line)?)),
            other => Err(proto(format!("unexpected reply {other:?}"))),
        }
    }

    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        let lock = self.lock.clone();
        let key = self.lease_key(&lock)?;
        self.plant(&key, state)?;
        let reply = io(self.conn.cmd(&[
            "FENCE.RELEASE",
            &lock,
            &request.lease_id,
            &TokenText(request.token).to_string(),
        ]))?;
        match &reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Simple(s)] if s == "released" => Ok(Ok(Release::Released {
                    state: self.stored(&key)?,
                })),
                [Value::Simple(s)] if s == "not-owner" => Ok(Ok(Release::NotOwner)),
                _ => Err(proto(format!("unexpected reply {reply:?}"))),
            },
            Value::Error(line) => Ok(Err(lease_error(line)?)),
            other => Err(proto(format!("unexpected reply {other:?}"))),
        }
    }

    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        self.local.restore(state)
    }

    fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error> {
        self.local.inspect_lease(state)
    }

    fn runtime_name(&self) -> &'static str {
        "redis-module"
    }
}

/// Every file in tests/vectors passes through the module on Redis and on
/// Valkey, as it does through the CLI, Python and Node runners.
#[test]
fn every_vector_passes_through_the_module() -> Result<()> {
    let mut files: Vec<_> = std::fs::read_dir(crate::common::vectors_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    ensure!(files.len() > 20, "only {} vector files", files.len());
    let runtime = Runtime::new()?;
    for kind in kinds() {
        let server = Server::start(kind, Options::test_clock())?;
        let mut module = Module {
            conn: server.conn()?,
            local: runtime.instance()?,
            lock: "vector-lock".into(),
        };
        let mut failures = Vec::new();
        for path in &files {
            let file = vectors::load(path).map_err(anyhow::Error::msg)?;
            let report = vectors::run(&file, &mut module);
            for f in &report.failures {
                failures.push(format!(
                    "{}: {f}",
                    path.file_name().and_then(|n| n.to_str()).unwrap_or("?")
                ));
            }
            io(module.conn.cmd(&["FLUSHALL"])).context("flush")?;
        }
        ensure!(failures.is_empty(), "{kind:?}:\n{}", failures.join("\n"));
    }
    Ok(())
}
