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

const EPOCHS: [&str; 16] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
];

/// The `epoch` label of a presented token's epoch: `0`–`15`, `other` above,
/// `none` without a token.
pub fn epoch_label(epoch: Option<u64>) -> &'static str {
    match epoch {
        None => "none",
        Some(e) => usize::try_from(e)
            .ok()
            .and_then(|e| EPOCHS.get(e))
            .copied()
            .unwrap_or("other"),
    }
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
        // The zero token is "no token" (docs/design.md §2): `none`, as in
        // every other host.
        "epoch" => epoch_label(token.filter(|t| t.epoch != 0 || t.counter != 0).map(|t| t.epoch)),
    )
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::epoch_label;

    /// Epochs map onto a bounded label set.
    #[test]
    fn epochs() {
        assert_eq!(epoch_label(None), "none");
        assert_eq!(epoch_label(Some(0)), "0");
        assert_eq!(epoch_label(Some(15)), "15");
        assert_eq!(epoch_label(Some(16)), "other");
        assert_eq!(epoch_label(Some(u64::MAX)), "other");
    }
}
