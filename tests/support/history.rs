//! One history checker for every store's concurrency and crash tests.
//!
//! A test records every attempt (who, scope, token, guards, a unique
//! payload, and what the client saw: applied at a version, refused, or
//! unknown because the connection broke), then reads back what the store
//! kept: an audit log of committed writes per scope (written in the same
//! transaction as the fenced write, keyed by version) and the scope's final
//! value. [`check`] then holds, per scope:
//!
//! 1. the audited versions are exactly `1..=n` (each commit advanced the
//!    state by one; none lost, none doubled);
//! 2. audited tokens never decrease along versions, and an equal token only
//!    came with a guard (op-id or expected version);
//! 3. every acknowledged write is audited at the version it was told;
//! 4. every refused write left no trace (its payload is not audited);
//! 5. the scope's final value is its last audited write.
//!
//! [`check_issued`] holds for grants: every token issued exceeds all
//! issued before it (per lock).

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};

use anyhow::{Context, Result, bail, ensure};
use fencecheck::Token;

/// What a client saw of one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Committed and acknowledged; the scope is at this version.
    Applied(u64),
    /// Refused with this outcome or SQLSTATE: nothing may have changed.
    Refused(String),
    /// No answer (the connection broke): it may or may not have committed.
    Unknown,
}

/// One attempted write.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// Which client sent it.
    pub client: usize,
    /// The scope written.
    pub scope: String,
    /// The token presented.
    pub token: Token,
    /// The op-id guard, if any.
    pub op_id: Option<String>,
    /// The expected-version guard, if any.
    pub expected_version: Option<u64>,
    /// A value unique to this attempt, written by it if applied.
    pub payload: String,
    /// What the client saw.
    pub seen: Seen,
}

/// A committed write as the store recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Audited {
    /// The attempt's payload.
    pub payload: String,
    /// The token it was applied under.
    pub token: Token,
}

/// What the store kept, per scope: committed writes by version, and the
/// scope's final (version, payload).
#[derive(Clone, Debug, Default)]
pub struct Kept {
    /// scope → version → write.
    pub audit: HashMap<String, BTreeMap<u64, Audited>>,
    /// scope → (version, payload) of the scope's current value.
    pub finals: HashMap<String, (u64, String)>,
}

/// Totals of a checked history, for the test's report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Acknowledged applied writes.
    pub applied: usize,
    /// Refused writes.
    pub refused: usize,
    /// Writes whose outcome the client never learned.
    pub unknown: usize,
}

/// Check `history` against what the store `kept` (rules 1-5 above).
pub fn check(history: &[Attempt], kept: &Kept) -> Result<Summary> {
    let by_payload: HashMap<&str, &Attempt> =
        history.iter().map(|a| (a.payload.as_str(), a)).collect();
    ensure!(
        by_payload.len() == history.len(),
        "payloads must be unique per attempt"
    );
    for (scope, log) in &kept.audit {
        ensure!(
            log.keys().copied().eq(1..=log.len() as u64),
            "rule 1, {scope}: audited versions {:?} are not 1..={}",
            log.keys().collect::<Vec<_>>(),
            log.len()
        );
        let mut previous: Option<&Audited> = None;
        for (version, write) in log {
            if let Some(prev) = previous {
                match write.token.grant_order(&prev.token) {
                    Ordering::Less => bail!(
                        "rule 2, {scope} v{version}: token {:?} applied after {:?}",
                        write.token,
                        prev.token
                    ),
                    Ordering::Equal => {
                        let guarded = by_payload
                            .get(write.payload.as_str())
                            .is_some_and(|a| a.op_id.is_some() || a.expected_version.is_some());
                        ensure!(
                            guarded,
                            "rule 2, {scope} v{version}: equal token without a guard"
                        );
                    }
                    Ordering::Greater => {}
                }
            }
            previous = Some(write);
        }
        let (last_version, last) = log.iter().next_back().context("non-empty audit")?;
        let final_value = kept
            .finals
            .get(scope)
            .context("a final value per audited scope")?;
        ensure!(
            final_value == &(*last_version, last.payload.clone()),
            "rule 5, {scope}: final {final_value:?} is not the last audited write v{last_version} {:?}",
            last.payload
        );
    }
    let mut summary = Summary::default();
    for a in history {
        let audited = kept
            .audit
            .get(&a.scope)
            .and_then(|log| log.iter().find(|(_, w)| w.payload == a.payload));
        match &a.seen {
            Seen::Applied(v) => {
                summary.applied += 1;
                ensure!(
                    audited.map(|(version, _)| *version) == Some(*v),
                    "rule 3: acknowledged write lost or misplaced: {a:?} (audited: {audited:?})"
                );
            }
            Seen::Refused(why) => {
                summary.refused += 1;
                ensure!(
                    audited.is_none(),
                    "rule 4: refused ({why}) write left a trace: {a:?}"
                );
            }
            Seen::Unknown => summary.unknown += 1,
        }
    }
    Ok(summary)
}

/// Every issued token exceeds all issued before it for the same lock
/// (`issued` in the order the grants were decided).
pub fn check_issued(issued: &[(String, Token)]) -> Result<()> {
    let mut highest: HashMap<&str, Token> = HashMap::new();
    for (i, (lock, token)) in issued.iter().enumerate() {
        if let Some(prev) = highest.get(lock.as_str()) {
            ensure!(
                token.grant_order(prev) == Ordering::Greater,
                "grant {i} on {lock}: token {token:?} does not exceed {prev:?}"
            );
        }
        highest.insert(lock, *token);
    }
    Ok(())
}

/// A small deterministic generator (xorshift) for a load test's choices, one
/// per client, seeded by the client: no dependency, same run every time.
pub struct Rng(pub u64);

impl Rng {
    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}
