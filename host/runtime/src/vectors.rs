//! The conformance-vector runner (docs/design.md §9).
//!
//! A vector file is JSON: `{"name": …, "steps": [ … ]}`. Check steps thread one
//! stored state (a single slot per file) through the file; only `applied`
//! replaces it. `damage` steps alter the stored bytes. Lease steps (`acquire`,
//! `renew`, `release`, `restore`) thread their own slot, replaced by every
//! outcome that carries a state (`acquired`, `renewed`, `released`, `restored`).
//!
//! Extensions to the starting design (documented in `tests/vectors/README.md`): `expect`
//! may name a `reason` for `invalid-request` and `corrupt-state` errors (the
//! WIT reason / `corruption` case, kebab-case) and an `epoch` for `restored`;
//! `damage` may name `"state": "lease"` to damage the lease slot (default:
//! the fence slot); `acquire` may carry `authority` and `epoch_floor`, and
//! `renew`/`release` tokens an `authority` (all default 0).
//!
//! Signed tokens (0.1.1): a `check` step with `keys` is a check on a scope
//! that requires signed tokens (`check-signed`), with an optional
//! `signature` (which a step without `keys` may carry too: `check` ignores
//! it); its errors include `unauthenticated` and `invalid-keys`
//! with their reasons. A `sign` step signs a grant and expects `signed`
//! with the exact `tag` (which pins the message encoding in every runner)
//! or an error. [`VectorFile::needs_signing`] tells which files need a
//! component that has signed tokens.

use std::path::Path;

use serde::Deserialize;

use crate::{Acquire, AcquireRequest, LeaseError, Release, ReleaseRequest};
use crate::{Checker, Decision, Error, Outcome, Policy, SignedCheckError, SignedOutcome};
use crate::{GrantKey, GrantSignature, SignError};
use crate::{Renew, RenewRequest, Request, Token};

/// A parsed vector file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorFile {
    /// The vector's name.
    pub name: String,
    /// What the vector proves (free text).
    #[serde(default)]
    pub description: Option<String>,
    /// The steps, in order.
    pub steps: Vec<Step>,
}

impl VectorFile {
    /// Whether a step signs or checks a signed scope: such a file needs a
    /// component with signed tokens (0.1.1 or later).
    pub fn needs_signing(&self) -> bool {
        self.steps
            .iter()
            .any(|s| s.sign.is_some() || s.check.as_ref().is_some_and(|c| c.keys.is_some()))
    }
}

/// One step: exactly one action, and an `expect` for non-damage actions.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// A fence check.
    #[serde(default)]
    pub check: Option<CheckStep>,
    /// Damage to the stored state: `flip-bit`, `truncate`, `append`, `replace`, `clear`.
    #[serde(default)]
    pub damage: Option<String>,
    /// For `flip-bit`: the bit index (wraps modulo the state's length in bits).
    #[serde(default)]
    pub bit: Option<u64>,
    /// For `truncate`: how many bytes to keep.
    #[serde(default)]
    pub len: Option<u64>,
    /// For `append` and `replace`: the bytes, in hex.
    #[serde(default)]
    pub hex: Option<String>,
    /// For damage: which slot, `fence` (default) or `lease`.
    #[serde(default)]
    pub state: Option<String>,
    /// Lease: acquire a lock.
    #[serde(default)]
    pub acquire: Option<AcquireStep>,
    /// Lease: renew the current lease.
    #[serde(default)]
    pub renew: Option<RenewStep>,
    /// Lease: release the current lease.
    #[serde(default)]
    pub release: Option<ReleaseStep>,
    /// Lease: start the next epoch (`{}`).
    #[serde(default)]
    pub restore: Option<RestoreStep>,
    /// Sign a grant.
    #[serde(default)]
    pub sign: Option<SignStep>,
    /// What the step must produce.
    #[serde(default)]
    pub expect: Option<Expect>,
}

/// A `check` step's request.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckStep {
    /// The scope.
    pub scope: String,
    /// `[epoch, counter]`.
    pub token: [u64; 2],
    /// The token's authority (default 0).
    #[serde(default)]
    pub authority: u64,
    /// `strict` (default) or `allow-equal`.
    #[serde(default)]
    pub policy: Policy,
    /// Idempotency key.
    #[serde(default)]
    pub op_id: Option<String>,
    /// Expected scope version.
    #[serde(default)]
    pub expected_version: Option<u64>,
    /// The scope requires signed tokens, with these keys (may be empty, to
    /// test that refusal).
    #[serde(default)]
    pub keys: Option<Vec<KeySpec>>,
    /// The token's signature. Without `keys` the scope is not opted in and
    /// `check` ignores it.
    #[serde(default)]
    pub signature: Option<SignatureSpec>,
}

/// A key: `{"id": 3, "secret": "HEX"}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySpec {
    /// The key id.
    pub id: u32,
    /// The secret, in hex.
    pub secret: String,
}

impl KeySpec {
    fn key(&self) -> Result<GrantKey, String> {
        Ok(GrantKey {
            key_id: self.id,
            secret: hex::decode(&self.secret).map_err(|e| format!("bad secret hex: {e}"))?,
        })
    }
}

/// A signature: `{"key_id": 3, "lease_id": "…", "tag": "HEX"}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureSpec {
    /// The key id it names.
    pub key_id: u32,
    /// The lease id it carries.
    pub lease_id: String,
    /// The tag, in hex.
    pub tag: String,
}

/// A `sign` step.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignStep {
    /// The scope (the lock's name).
    pub scope: String,
    /// `[epoch, counter]`.
    pub token: [u64; 2],
    /// The token's authority (default 0).
    #[serde(default)]
    pub authority: u64,
    /// The lease id.
    pub lease_id: String,
    /// The signing key.
    pub key: KeySpec,
}

impl CheckStep {
    /// The request this step presents, without its signature.
    pub fn request(&self) -> Request {
        Request {
            scope: self.scope.clone(),
            token: Token::new(self.authority, self.token[0], self.token[1]),
            policy: self.policy,
            op_id: self.op_id.clone(),
            expected_version: self.expected_version,
            signature: None,
        }
    }

    /// The request with its signature, and the scope's keys if it requires
    /// signed tokens; an error names a malformed hex field.
    pub fn signed_request(&self) -> Result<(Request, Option<Vec<GrantKey>>), String> {
        let mut request = self.request();
        if let Some(s) = &self.signature {
            request.signature = Some(GrantSignature {
                key_id: s.key_id,
                lease_id: s.lease_id.clone(),
                tag: hex::decode(&s.tag).map_err(|e| format!("bad tag hex: {e}"))?,
            });
        }
        let keys = match &self.keys {
            Some(keys) => Some(keys.iter().map(KeySpec::key).collect::<Result<_, _>>()?),
            None => None,
        };
        Ok((request, keys))
    }
}

/// An `acquire` step.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireStep {
    /// The lock.
    pub lock: String,
    /// The lease id.
    pub lease_id: String,
    /// Coordinator time (ms).
    pub now: u64,
    /// Lease length (ms).
    pub ttl: u64,
    /// Grant authority (default 0).
    #[serde(default)]
    pub authority: u64,
    /// Lowest epoch for a new grant (default 0).
    #[serde(default)]
    pub epoch_floor: u64,
}

/// A `renew` step.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewStep {
    /// The lease id.
    pub lease_id: String,
    /// `[epoch, counter]`.
    pub token: [u64; 2],
    /// The token's authority (default 0).
    #[serde(default)]
    pub authority: u64,
    /// Coordinator time (ms).
    pub now: u64,
    /// New lease length (ms).
    pub ttl: u64,
}

/// A `release` step.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseStep {
    /// The lease id.
    pub lease_id: String,
    /// `[epoch, counter]`.
    pub token: [u64; 2],
    /// The token's authority (default 0).
    #[serde(default)]
    pub authority: u64,
}

/// A `restore` step (no fields).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreStep {}

/// What a step must produce; only the named fields are compared.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// `applied`, `duplicate`, `stale-fence`, `version-conflict` or `error`.
    pub outcome: String,
    /// `applied` / `duplicate`: the version.
    #[serde(default)]
    pub version: Option<u64>,
    /// `applied` / `stale-fence`: the highest token `[epoch, counter]`.
    #[serde(default)]
    pub highest: Option<[u64; 2]>,
    /// `stale-fence`: the presented token.
    #[serde(default)]
    pub presented: Option<[u64; 2]>,
    /// `version-conflict`: the expected version.
    #[serde(default)]
    pub expected: Option<u64>,
    /// `version-conflict`: the actual version.
    #[serde(default)]
    pub actual: Option<u64>,
    /// `error`: the error's name.
    #[serde(default)]
    pub error: Option<String>,
    /// `error` (extension): the `invalid-reason` or `corruption` case.
    #[serde(default)]
    pub reason: Option<String>,
    /// `acquired`: the granted token `[epoch, counter]`.
    #[serde(default)]
    pub token: Option<[u64; 2]>,
    /// `acquired`, `busy`, `renewed`: the lease's end.
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// `busy`: the holder's lease id.
    #[serde(default)]
    pub holder: Option<String>,
    /// `restored` (extension): the new epoch.
    #[serde(default)]
    pub epoch: Option<u64>,
    /// `signed`: the tag, in hex.
    #[serde(default)]
    pub tag: Option<String>,
}

/// A lease step's outcome, whichever function it called.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// From `acquire`.
    Acquire(Result<Acquire, LeaseError>),
    /// From `renew`.
    Renew(Result<Renew, LeaseError>),
    /// From `release`.
    Release(Result<Release, LeaseError>),
    /// From `restore`: the new epoch and state.
    Restore(Result<(u64, Vec<u8>), LeaseError>),
}

/// What one step did, for comparing runtimes against each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// A check step's outcome.
    pub outcome: Option<Outcome>,
    /// A signed check step's outcome.
    pub signed: Option<SignedOutcome>,
    /// A sign step's outcome.
    pub signature: Option<Result<GrantSignature, SignError>>,
    /// A lease step's outcome.
    pub lease: Option<LeaseOutcome>,
    /// The fence slot after the step.
    pub state: Option<Vec<u8>>,
    /// The lease slot after the step.
    pub lease_state: Option<Vec<u8>>,
}

/// The result of running one file.
#[derive(Clone, Debug, Default)]
pub struct FileReport {
    /// One line per failing step.
    pub failures: Vec<String>,
    /// What each step did.
    pub records: Vec<StepRecord>,
}

impl FileReport {
    /// True when no step failed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Read and parse a vector file; errors are readable one-liners.
pub fn load(path: &Path) -> Result<VectorFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    parse(&text)
}

/// Parse a vector file's text; errors are readable one-liners.
pub fn parse(text: &str) -> Result<VectorFile, String> {
    serde_json::from_str(text).map_err(|e| format!("cannot parse: {e}"))
}

/// Run a parsed file against one checker. Infrastructure errors (a trapped
/// guest) end the file with a failure line; they are never treated as outcomes.
pub fn run(file: &VectorFile, checker: &mut dyn Checker) -> FileReport {
    let mut report = FileReport::default();
    let mut slots = Slots::default();
    for (index, step) in file.steps.iter().enumerate() {
        let n = index + 1;
        match run_step(step, &mut slots, checker) {
            Ok(done) => {
                if let Some(problem) = done.problem {
                    report.failures.push(format!("step {n}: {problem}"));
                }
                report.records.push(StepRecord {
                    outcome: done.outcome,
                    signed: done.signed,
                    signature: done.signature,
                    lease: done.lease,
                    state: slots.fence.clone(),
                    lease_state: slots.lease.clone(),
                });
            }
            Err(e) => {
                report.failures.push(format!("step {n}: {e}"));
                break;
            }
        }
    }
    report
}

/// The two stored-state slots a file threads through its steps.
#[derive(Default)]
struct Slots {
    fence: Option<Vec<u8>>,
    lease: Option<Vec<u8>>,
}

/// What one step did, and what did not match its `expect`.
#[derive(Default)]
struct Done {
    outcome: Option<Outcome>,
    signed: Option<SignedOutcome>,
    signature: Option<Result<GrantSignature, SignError>>,
    lease: Option<LeaseOutcome>,
    problem: Option<String>,
}

fn problem(text: impl Into<String>) -> Done {
    Done {
        problem: Some(text.into()),
        ..Done::default()
    }
}

fn run_step(step: &Step, slots: &mut Slots, checker: &mut dyn Checker) -> Result<Done, Error> {
    let actions = [
        step.sign.is_some(),
        step.check.is_some(),
        step.damage.is_some(),
        step.acquire.is_some(),
        step.renew.is_some(),
        step.release.is_some(),
        step.restore.is_some(),
    ];
    if actions.iter().filter(|a| **a).count() != 1 {
        return Ok(problem("a step needs exactly one action"));
    }
    if let Some(kind) = &step.damage {
        let slot = match step.state.as_deref() {
            None | Some("fence") => &mut slots.fence,
            Some("lease") => &mut slots.lease,
            Some(other) => return Ok(problem(format!("unknown state slot {other:?}"))),
        };
        let args = DamageArgs {
            bit: step.bit,
            len: step.len,
            hex: step.hex.as_deref(),
        };
        return Ok(Done {
            problem: damage(slot, kind, args).err(),
            ..Done::default()
        });
    }
    let Some(expect) = &step.expect else {
        return Ok(problem("step without `expect`"));
    };
    if let Some(sign) = &step.sign {
        let key = match sign.key.key() {
            Ok(key) => key,
            Err(e) => return Ok(problem(e)),
        };
        let token = Token::new(sign.authority, sign.token[0], sign.token[1]);
        let signature = checker.sign(&sign.scope, token, &sign.lease_id, &key)?;
        return Ok(Done {
            problem: compare_signature(expect, &signature).err(),
            signature: Some(signature),
            ..Done::default()
        });
    }
    if let Some(check) = &step.check {
        let (request, keys) = match check.signed_request() {
            Ok(inputs) => inputs,
            Err(e) => return Ok(problem(e)),
        };
        let fence = slots.fence.as_deref();
        let (done, applied) = match &keys {
            // Not opted in: `check`, which ignores any signature the request carries.
            None => {
                let outcome = checker.check(fence, &request)?;
                let done = Done {
                    problem: compare(expect, &outcome).err(),
                    ..Done::default()
                };
                let applied = applied_state(outcome.as_ref().ok());
                (
                    Done {
                        outcome: Some(outcome),
                        ..done
                    },
                    applied,
                )
            }
            Some(keys) => {
                let outcome = checker.check_signed(fence, &request, keys)?;
                let done = Done {
                    problem: compare_signed(expect, &outcome).err(),
                    ..Done::default()
                };
                let applied = applied_state(outcome.as_ref().ok());
                (
                    Done {
                        signed: Some(outcome),
                        ..done
                    },
                    applied,
                )
            }
        };
        if let Some(next) = applied {
            slots.fence = Some(next);
        }
        return Ok(done);
    }
    let current = slots.lease.as_deref();
    let outcome = if let Some(a) = &step.acquire {
        LeaseOutcome::Acquire(checker.acquire(
            current,
            &AcquireRequest {
                lock: a.lock.clone(),
                lease_id: a.lease_id.clone(),
                authority: a.authority,
                epoch_floor: a.epoch_floor,
                now: a.now,
                ttl: a.ttl,
            },
        )?)
    } else if let Some(r) = &step.renew {
        LeaseOutcome::Renew(checker.renew(
            current,
            &RenewRequest {
                lease_id: r.lease_id.clone(),
                token: Token::new(r.authority, r.token[0], r.token[1]),
                now: r.now,
                ttl: r.ttl,
            },
        )?)
    } else if let Some(r) = &step.release {
        LeaseOutcome::Release(checker.release(
            current,
            &ReleaseRequest {
                lease_id: r.lease_id.clone(),
                token: Token::new(r.authority, r.token[0], r.token[1]),
            },
        )?)
    } else {
        LeaseOutcome::Restore(checker.restore(current)?)
    };
    let problem = compare_lease(expect, &outcome).err();
    if let Some(next) = lease_state(&outcome) {
        slots.lease = Some(next.to_vec());
    }
    Ok(Done {
        lease: Some(outcome),
        problem,
        ..Done::default()
    })
}

/// The new state an `applied` decision carries.
fn applied_state(decision: Option<&Decision>) -> Option<Vec<u8>> {
    match decision {
        Some(Decision::Applied { state, .. }) => Some(state.clone()),
        _ => None,
    }
}

/// Compare a signed check's outcome with the fields `expect` names.
pub fn compare_signed(expect: &Expect, outcome: &SignedOutcome) -> Result<(), String> {
    match outcome {
        Ok(decision) => compare(expect, &Ok(decision.clone())),
        Err(SignedCheckError::Check(e)) => compare(expect, &Err(e.clone())),
        Err(e) => {
            if expect.outcome != "error" {
                return Err(format!(
                    "expected {}, got {}",
                    expect.outcome,
                    describe_signed(outcome)
                ));
            }
            field("error", expect.error.as_deref(), e.name())?;
            field(
                "reason",
                expect.reason.as_deref(),
                e.reason().unwrap_or("none"),
            )
        }
    }
}

/// A one-line description of a signed check's outcome.
pub fn describe_signed(outcome: &SignedOutcome) -> String {
    match outcome {
        Ok(decision) => describe(&Ok(decision.clone())),
        Err(SignedCheckError::Check(e)) => describe(&Err(e.clone())),
        Err(e) => match e.reason() {
            Some(r) => format!("error {} ({r})", e.name()),
            None => format!("error {}", e.name()),
        },
    }
}

/// Compare a sign step's outcome with the fields `expect` names: `signed`
/// with its `tag`, or `error` with the sign error's name and, for
/// `invalid-key`, the key problem as `reason`.
pub fn compare_signature(
    expect: &Expect,
    outcome: &Result<GrantSignature, SignError>,
) -> Result<(), String> {
    match outcome {
        Ok(signature) => {
            if expect.outcome != "signed" {
                return Err(format!("expected {}, got signed", expect.outcome));
            }
            field(
                "tag",
                expect.tag.as_deref(),
                hex::encode(&signature.tag).as_str(),
            )
        }
        Err(e) => {
            if expect.outcome != "error" {
                return Err(format!("expected {}, got error {e}", expect.outcome));
            }
            field("error", expect.error.as_deref(), e.name())?;
            let reason = match e {
                SignError::InvalidKey(p) => p.name(),
                _ => "none",
            };
            field("reason", expect.reason.as_deref(), reason)
        }
    }
}

/// The new lease state an outcome carries, if it changes the lock.
pub fn lease_state(outcome: &LeaseOutcome) -> Option<&[u8]> {
    match outcome {
        LeaseOutcome::Acquire(Ok(Acquire::Acquired { state, .. }))
        | LeaseOutcome::Renew(Ok(Renew::Renewed { state, .. }))
        | LeaseOutcome::Release(Ok(Release::Released { state }))
        | LeaseOutcome::Restore(Ok((_, state))) => Some(state),
        _ => None,
    }
}

/// Compare a lease outcome with the fields `expect` names.
pub fn compare_lease(expect: &Expect, outcome: &LeaseOutcome) -> Result<(), String> {
    let error = match outcome {
        LeaseOutcome::Acquire(Err(e))
        | LeaseOutcome::Renew(Err(e))
        | LeaseOutcome::Release(Err(e))
        | LeaseOutcome::Restore(Err(e)) => Some(e),
        _ => None,
    };
    let got = describe_lease(outcome);
    let name = got.split(' ').next().unwrap_or_default();
    if expect.outcome != name {
        return Err(format!("expected {}, got {got}", expect.outcome));
    }
    if let Some(e) = error {
        field("error", expect.error.as_deref(), e.name())?;
        return field(
            "reason",
            expect.reason.as_deref(),
            e.reason().unwrap_or("none"),
        );
    }
    match outcome {
        LeaseOutcome::Acquire(Ok(Acquire::Acquired {
            token, expires_at, ..
        })) => {
            field("token", expect.token, pair(*token))?;
            field("expires_at", expect.expires_at, *expires_at)
        }
        LeaseOutcome::Acquire(Ok(Acquire::Busy { holder, expires_at })) => {
            field("holder", expect.holder.as_deref(), holder.as_str())?;
            field("expires_at", expect.expires_at, *expires_at)
        }
        LeaseOutcome::Renew(Ok(Renew::Renewed { expires_at, .. })) => {
            field("expires_at", expect.expires_at, *expires_at)
        }
        LeaseOutcome::Restore(Ok((epoch, _))) => field("epoch", expect.epoch, *epoch),
        _ => Ok(()),
    }
}

/// A one-line description of a lease outcome, starting with its name.
pub fn describe_lease(outcome: &LeaseOutcome) -> String {
    match outcome {
        LeaseOutcome::Acquire(Ok(Acquire::Acquired {
            token, expires_at, ..
        })) => format!(
            "acquired (token {:?}, expires_at {expires_at})",
            pair(*token)
        ),
        LeaseOutcome::Acquire(Ok(Acquire::Busy { holder, expires_at })) => {
            format!("busy (holder {holder:?}, expires_at {expires_at})")
        }
        LeaseOutcome::Renew(Ok(Renew::Renewed { expires_at, .. })) => {
            format!("renewed (expires_at {expires_at})")
        }
        LeaseOutcome::Renew(Ok(Renew::Lost)) => "lost".into(),
        LeaseOutcome::Release(Ok(Release::Released { .. })) => "released".into(),
        LeaseOutcome::Release(Ok(Release::NotOwner)) => "not-owner".into(),
        LeaseOutcome::Restore(Ok((epoch, _))) => format!("restored (epoch {epoch})"),
        LeaseOutcome::Acquire(Err(e))
        | LeaseOutcome::Renew(Err(e))
        | LeaseOutcome::Release(Err(e))
        | LeaseOutcome::Restore(Err(e)) => match e.reason() {
            Some(r) => format!("error {} ({r})", e.name()),
            None => format!("error {}", e.name()),
        },
    }
}

/// The arguments of a damage step, as vector files and agreement sequences
/// spell them (`bit` for `flip-bit`, `len` for `truncate`, `hex` for
/// `append` and `replace`).
#[derive(Clone, Copy, Debug, Default)]
pub struct DamageArgs<'a> {
    /// `flip-bit`: the bit index (wraps modulo the state's length in bits).
    pub bit: Option<u64>,
    /// `truncate`: how many bytes to keep.
    pub len: Option<u64>,
    /// `append`, `replace`: the bytes, in hex.
    pub hex: Option<&'a str>,
}

/// Apply one damage step (`flip-bit`, `truncate`, `append`, `replace`,
/// `clear`) to a stored state slot; tests/vectors/README.md defines them. On
/// a slot without state only `replace` creates bytes.
pub fn damage(state: &mut Option<Vec<u8>>, kind: &str, args: DamageArgs<'_>) -> Result<(), String> {
    let hex_arg = || -> Result<Vec<u8>, String> {
        let text = args.hex.ok_or(format!("`{kind}` needs `hex`"))?;
        hex::decode(text).map_err(|e| format!("bad hex: {e}"))
    };
    match kind {
        "flip-bit" => {
            let bit = args.bit.ok_or("`flip-bit` needs `bit`")?;
            if let Some(bytes) = state.as_mut() {
                let bits = (bytes.len() as u64).saturating_mul(8);
                if bits > 0 {
                    let at = bit % bits;
                    if let Some(byte) = bytes.get_mut((at / 8) as usize) {
                        *byte ^= 1 << (at % 8);
                    }
                }
            }
        }
        "truncate" => {
            let len = args.len.ok_or("`truncate` needs `len`")?;
            if let Some(bytes) = state.as_mut() {
                bytes.truncate(usize::try_from(len).unwrap_or(usize::MAX));
            }
        }
        "append" => {
            let extra = hex_arg()?;
            if let Some(bytes) = state.as_mut() {
                bytes.extend_from_slice(&extra);
            }
        }
        "replace" => *state = Some(hex_arg()?),
        "clear" => *state = None,
        other => return Err(format!("unknown damage kind {other:?}")),
    }
    Ok(())
}

fn pair(t: Token) -> [u64; 2] {
    [t.epoch, t.counter]
}

fn field<T: PartialEq + std::fmt::Debug>(
    name: &str,
    want: Option<T>,
    got: T,
) -> Result<(), String> {
    match want {
        Some(want) if want != got => Err(format!("{name}: expected {want:?}, got {got:?}")),
        _ => Ok(()),
    }
}

/// Compare an outcome with the fields `expect` names.
pub fn compare(expect: &Expect, outcome: &Outcome) -> Result<(), String> {
    let got_name = match outcome {
        Ok(d) => d.name(),
        Err(_) => "error",
    };
    if expect.outcome != got_name {
        return Err(format!(
            "expected {}, got {}",
            expect.outcome,
            describe(outcome)
        ));
    }
    match outcome {
        Ok(Decision::Applied {
            version, highest, ..
        }) => {
            field("version", expect.version, *version)?;
            field("highest", expect.highest, pair(*highest))
        }
        Ok(Decision::Duplicate { version }) => field("version", expect.version, *version),
        Ok(Decision::StaleFence { presented, highest }) => {
            field("presented", expect.presented, pair(*presented))?;
            field("highest", expect.highest, pair(*highest))
        }
        Ok(Decision::VersionConflict { expected, actual }) => {
            field("expected", expect.expected, *expected)?;
            field("actual", expect.actual, *actual)
        }
        Err(e) => {
            field("error", expect.error.as_deref(), e.name())?;
            field(
                "reason",
                expect.reason.as_deref(),
                e.reason().unwrap_or("none"),
            )
        }
    }
}

/// A one-line description of an outcome, for failure lines.
pub fn describe(outcome: &Outcome) -> String {
    match outcome {
        Ok(Decision::Applied {
            version, highest, ..
        }) => format!("applied (version {version}, highest {:?})", pair(*highest)),
        Ok(Decision::Duplicate { version }) => format!("duplicate (version {version})"),
        Ok(Decision::StaleFence { presented, highest }) => format!(
            "stale-fence (presented {:?}, highest {:?})",
            pair(*presented),
            pair(*highest)
        ),
        Ok(Decision::VersionConflict { expected, actual }) => {
            format!("version-conflict (expected {expected}, actual {actual})")
        }
        Err(e) => match e.reason() {
            Some(r) => format!("error {} ({r})", e.name()),
            None => format!("error {}", e.name()),
        },
    }
}
