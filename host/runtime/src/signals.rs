//! Fence decisions in the cross-host metric table's terms (docs/design.md
//! §12), recorded through the `metrics` facade: nothing is exported unless
//! the application installs a recorder (`metrics-exporter-prometheus`, …),
//! and then as `fencecheck_decisions_total{operation, outcome, epoch}`.
//! Every label value is a `&'static str` from a fixed set, so recording
//! allocates nothing and no scope ever becomes a series.

use crate::{Fenced, Rejection, Token};

/// The table's name for fence decisions.
pub const DECISIONS: &str = "fencecheck_decisions_total";

/// Epochs above this share the label `other`: the label stays bounded
/// however many times the lease service is restored.
pub const MAX_EPOCH_LABEL: u64 = 15;

/// The table's `epoch` values in index order: `0`–`15`, `other`, `none`
/// (hosts that count in fixed arrays index them so).
pub const EPOCH_LABELS: [&str; 18] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "other",
    "none",
];

/// The table's `outcome` values in index order.
pub const OUTCOME_LABELS: [&str; 7] = [
    "applied",
    "duplicate",
    "stale-fence",
    "version-conflict",
    "unauthenticated",
    "refused",
    "error",
];

/// The index in [`EPOCH_LABELS`] of a presented epoch: itself up to 15,
/// `other` above, `none` without one.
fn epoch_at(epoch: Option<u64>) -> usize {
    match epoch {
        None => EPOCH_LABELS.len() - 1,
        Some(e) => usize::try_from(e)
            .ok()
            .filter(|e| *e <= MAX_EPOCH_LABEL as usize)
            .unwrap_or(EPOCH_LABELS.len() - 2),
    }
}

/// The index in [`EPOCH_LABELS`] of a presented token; the zero token is
/// "no token" (docs/design.md §2): `none`, as without one.
pub fn epoch_index(token: Option<Token>) -> usize {
    epoch_at(
        token
            .filter(|t| t.epoch != 0 || t.counter != 0)
            .map(|t| t.epoch),
    )
}

/// The `epoch` label of a presented token's epoch: `0`–`15`, `other` above,
/// `none` without a token.
pub fn epoch_label(epoch: Option<u64>) -> &'static str {
    EPOCH_LABELS[epoch_at(epoch)]
}

/// Prometheus text of `fencecheck_decisions_total` from a fixed counter
/// array indexed operation × [`OUTCOME_LABELS`] × [`EPOCH_LABELS`]
/// (operation-major), nonzero counters only: for hosts that count in
/// shared memory or a server process and answer a scraper's query.
pub fn decisions_text(operations: &[&str], counts: &[u64]) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "# HELP {DECISIONS} Fence decisions by operation, outcome and token epoch (docs/design.md §12)\n\
         # TYPE {DECISIONS} counter\n"
    );
    let per_operation = OUTCOME_LABELS.len() * EPOCH_LABELS.len();
    for (i, n) in counts.iter().enumerate().filter(|(_, n)| **n != 0) {
        let Some(operation) = operations.get(i / per_operation) else {
            break;
        };
        let outcome = OUTCOME_LABELS[(i / EPOCH_LABELS.len()) % OUTCOME_LABELS.len()];
        let epoch = EPOCH_LABELS[i % EPOCH_LABELS.len()];
        // Writing into a String cannot fail.
        let _ = writeln!(
            out,
            "{DECISIONS}{{operation=\"{operation}\",outcome=\"{outcome}\",epoch=\"{epoch}\"}} {n}"
        );
    }
    out
}

impl Rejection {
    /// The table's `outcome` label: `duplicate`, `stale-fence`,
    /// `version-conflict`, `unauthenticated`, or `refused` for a request or
    /// state that could not be decided on (and for unusable keys).
    pub fn outcome_label(&self) -> &'static str {
        match self {
            Rejection::Duplicate { .. } => "duplicate",
            Rejection::StaleFence { .. } => "stale-fence",
            Rejection::VersionConflict { .. } => "version-conflict",
            Rejection::Unauthenticated(_) => "unauthenticated",
            Rejection::Refused(_) | Rejection::InvalidKeys(_) => "refused",
        }
    }
}

/// Record one fence decision of `operation` (the host's own small, fixed
/// set: `write`, `publish`, …) for a request that presented `token`: the
/// result of a fenced write, or `Err` for an infrastructure failure
/// (outcome `error`: no decision was made).
pub fn record_decision<T, E>(
    operation: &'static str,
    token: Option<Token>,
    result: &Result<Fenced<T>, E>,
) {
    let outcome = match result {
        Ok(Fenced::Applied { .. }) => "applied",
        Ok(Fenced::Rejected(r)) => r.outcome_label(),
        Err(_) => "error",
    };
    metrics::counter!(
        DECISIONS,
        "operation" => operation,
        "outcome" => outcome,
        "epoch" => EPOCH_LABELS[epoch_index(token)],
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::{decisions_text, epoch_index, epoch_label};
    use crate::Token;

    /// Epochs map onto a bounded label set.
    #[test]
    fn epochs() {
        assert_eq!(epoch_label(None), "none");
        assert_eq!(epoch_label(Some(0)), "0");
        assert_eq!(epoch_label(Some(15)), "15");
        assert_eq!(epoch_label(Some(16)), "other");
        assert_eq!(epoch_label(Some(u64::MAX)), "other");
        assert_eq!(epoch_index(Some(Token::new(0, 0, 0))), 17);
        assert_eq!(epoch_index(Some(Token::new(0, 3, 1))), 3);
    }

    /// A fixed counter array's nonzero cells, with their labels.
    #[test]
    fn text() {
        let mut counts = vec![0u64; 2 * 7 * 18];
        counts[7 * 18 + 2 * 18 + 17] = 4; // second operation, stale-fence, none
        let text = decisions_text(&["put", "delete"], &counts);
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            [
                r#"fencecheck_decisions_total{operation="delete",outcome="stale-fence",epoch="none"} 4"#
            ]
        );
    }
}
