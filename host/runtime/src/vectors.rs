//! The conformance-vector runner (DESIGN.md, "Conformance vectors").
//!
//! A vector file is JSON: `{"name": …, "steps": [ … ]}`. Check steps thread one
//! stored state (a single slot per file) through the file; only `applied`
//! replaces it. `damage` steps alter the stored bytes. Lease steps (`acquire`,
//! `renew`, `release`, `restore`) keep their own slot; this runner does not
//! implement them yet and reports each as a failing step rather than skipping it.
//!
//! Extension to DESIGN.md (documented in `tests/vectors/README.md`): `expect`
//! may name a `reason` for `invalid-request` and `corrupt-state` errors (the
//! WIT `invalid-reason` / `corruption` case, kebab-case).

use std::path::Path;

use serde::Deserialize;

use crate::{CheckError, Checker, Corruption, Decision, Error, InvalidReason, Outcome, Policy};
use crate::{Request, Token};

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
    /// Lease step (not implemented by this runner yet).
    #[serde(default)]
    pub acquire: Option<serde_json::Value>,
    /// Lease step (not implemented by this runner yet).
    #[serde(default)]
    pub renew: Option<serde_json::Value>,
    /// Lease step (not implemented by this runner yet).
    #[serde(default)]
    pub release: Option<serde_json::Value>,
    /// Lease step (not implemented by this runner yet).
    #[serde(default)]
    pub restore: Option<serde_json::Value>,
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
}

impl CheckStep {
    /// The request this step presents.
    pub fn request(&self) -> Request {
        Request {
            scope: self.scope.clone(),
            token: Token::new(self.authority, self.token[0], self.token[1]),
            policy: self.policy,
            op_id: self.op_id.clone(),
            expected_version: self.expected_version,
        }
    }
}

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
    /// Lease expectations (not interpreted yet).
    #[serde(default)]
    pub token: Option<serde_json::Value>,
    /// Lease expectations (not interpreted yet).
    #[serde(default)]
    pub expires_at: Option<serde_json::Value>,
    /// Lease expectations (not interpreted yet).
    #[serde(default)]
    pub holder: Option<serde_json::Value>,
}

/// What one step did, for comparing runtimes against each other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRecord {
    /// The check's outcome (`None` for damage and lease steps).
    pub outcome: Option<Outcome>,
    /// The stored state after the step.
    pub state: Option<Vec<u8>>,
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
    let mut state: Option<Vec<u8>> = None;
    for (index, step) in file.steps.iter().enumerate() {
        let n = index + 1;
        match run_step(step, &mut state, checker) {
            Ok((outcome, problem)) => {
                if let Some(problem) = problem {
                    report.failures.push(format!("step {n}: {problem}"));
                }
                report.records.push(StepRecord {
                    outcome,
                    state: state.clone(),
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

type StepResult = (Option<Outcome>, Option<String>);

fn run_step(
    step: &Step,
    state: &mut Option<Vec<u8>>,
    checker: &mut dyn Checker,
) -> Result<StepResult, Error> {
    let actions = [
        step.check.is_some(),
        step.damage.is_some(),
        step.acquire.is_some(),
        step.renew.is_some(),
        step.release.is_some(),
        step.restore.is_some(),
    ];
    if actions.iter().filter(|a| **a).count() != 1 {
        return Ok((None, Some("a step needs exactly one action".into())));
    }
    if let Some(kind) = &step.damage {
        return Ok((None, damage(state, kind, step).err()));
    }
    let Some(check) = &step.check else {
        return Ok((
            None,
            Some("lease steps are not implemented by this runner yet".into()),
        ));
    };
    let outcome = checker.check(state.as_deref(), &check.request())?;
    let problem = match &step.expect {
        None => Some("check step without `expect`".into()),
        Some(expect) => compare(expect, &outcome).err(),
    };
    if let Ok(Decision::Applied { state: next, .. }) = &outcome {
        *state = Some(next.clone());
    }
    Ok((Some(outcome), problem))
}

fn damage(state: &mut Option<Vec<u8>>, kind: &str, step: &Step) -> Result<(), String> {
    let hex_arg = || -> Result<Vec<u8>, String> {
        let text = step.hex.as_deref().ok_or(format!("`{kind}` needs `hex`"))?;
        hex::decode(text).map_err(|e| format!("bad hex: {e}"))
    };
    match kind {
        "flip-bit" => {
            let bit = step.bit.ok_or("`flip-bit` needs `bit`")?;
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
            let len = step.len.ok_or("`truncate` needs `len`")?;
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
                reason(e).unwrap_or("none"),
            )
        }
    }
}

/// The kebab-case sub-case of an error, if it has one.
pub fn reason(e: &CheckError) -> Option<&'static str> {
    Some(match e {
        CheckError::InvalidRequest(r) => match r {
            InvalidReason::MissingToken => "missing-token",
            InvalidReason::EmptyScope => "empty-scope",
            InvalidReason::ScopeTooLong => "scope-too-long",
            InvalidReason::EmptyOpId => "empty-op-id",
            InvalidReason::OpIdTooLong => "op-id-too-long",
            InvalidReason::EqualTokenUnguarded => "equal-token-unguarded",
        },
        CheckError::CorruptState(c) => match c {
            Corruption::Truncated => "truncated",
            Corruption::LengthMismatch => "length-mismatch",
            Corruption::ChecksumMismatch => "checksum-mismatch",
            Corruption::Malformed => "malformed",
        },
        _ => return None,
    })
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
        Err(e) => match reason(e) {
            Some(r) => format!("error {} ({r})", e.name()),
            None => format!("error {}", e.name()),
        },
    }
}
