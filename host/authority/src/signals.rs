//! The lease signals of the cross-host metric table (docs/design.md §12),
//! recorded through the `metrics` facade: nothing is exported unless the
//! application installs a recorder (`metrics-exporter-prometheus`, …), and
//! then under exactly the table's names and labels. No per-lock labels.

use std::time::Duration;

use crate::AuthorityError;
use fencecheck::Token;

pub(crate) const ACQUIRE_SECONDS: &str = "fencecheck_lease_acquire_duration_seconds";
pub(crate) const RENEWALS: &str = "fencecheck_lease_renewals_total";
pub(crate) const LEASE_AGE: &str = "fencecheck_lease_age_seconds";
pub(crate) const HOLDER_LOST: &str = "fencecheck_lease_holder_lost_total";
pub(crate) const EPOCH: &str = "fencecheck_lease_epoch";
pub(crate) const HEADROOM: &str = "fencecheck_token_headroom";
pub(crate) const COORDINATOR_ERRORS: &str = "fencecheck_coordinator_errors_total";

/// An acquisition answered (`acquired`, `busy`) or failed (`error`).
pub(crate) fn acquired(result: &'static str, took: Duration) {
    metrics::histogram!(ACQUIRE_SECONDS, "result" => result).record(took.as_secs_f64());
}

/// A grant's token: the service's epoch, and the grants left in it.
pub(crate) fn granted(token: Token) {
    // As floats, as Prometheus keeps every value: exact up to 2^53, and an
    // alert on headroom needs its order of magnitude, not its last digit.
    metrics::gauge!(EPOCH).set(token.epoch as f64);
    metrics::gauge!(HEADROOM).set(u64::MAX.saturating_sub(token.counter) as f64);
}

/// A renewal `renewed`, `lost` or `error`.
pub(crate) fn renewed(result: &'static str) {
    metrics::counter!(RENEWALS, "result" => result).increment(1);
}

/// A lease ended: `released`, or `lost` (then also a holder loss).
pub(crate) fn ended(end: &'static str, age: Duration) {
    metrics::histogram!(LEASE_AGE, "end" => end).record(age.as_secs_f64());
    if end == "lost" {
        metrics::counter!(HOLDER_LOST).increment(1);
    }
}

/// A coordinator call that got no answer, by kind.
pub(crate) fn coordinator_error(e: &AuthorityError) {
    if let Some(kind) = kind(e) {
        metrics::counter!(COORDINATOR_ERRORS, "kind" => kind).increment(1);
    }
}

/// The table's `kind` of an error, or `None` for an answer (a refusal,
/// contention that the caller retries, a store moved elsewhere: the
/// coordinator was reached and decided).
pub(crate) fn kind(e: &AuthorityError) -> Option<&'static str> {
    let text = match e {
        AuthorityError::Sqlite(e) => e.to_string(),
        AuthorityError::Postgres(e) => e.to_string(),
        AuthorityError::Etcd(text) | AuthorityError::Redis(text) => text.clone(),
        AuthorityError::Tls(_)
        | AuthorityError::AuthenticationFailed(_)
        | AuthorityError::PermissionDenied { .. }
        | AuthorityError::Signing { .. }
        | AuthorityError::Guest(_) => return Some("other"),
        AuthorityError::Refused { .. }
        | AuthorityError::UnsupportedLayout(_)
        | AuthorityError::Moved { .. }
        | AuthorityError::MigrationIncomplete
        | AuthorityError::MigrationRefused(_)
        | AuthorityError::Contention { .. } => return None,
    }
    .to_ascii_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    Some(
        if has(&["no leader", "unhealthy", "quorum", "leader changed"]) {
            "quorum-lost"
        } else if has(&["timed out", "timeout", "database is locked", "busy"]) {
            "timeout"
        } else if has(&[
            "connection refused",
            "unreachable",
            "connection reset",
            "broken pipe",
            "could not connect",
            "connect",
            "closed",
        ]) {
            "unreachable"
        } else {
            "other"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::kind;
    use crate::AuthorityError;

    /// etcd's and the transports' words map onto the table's kinds; answers
    /// are not errors of the coordinator.
    #[test]
    fn kinds() {
        let etcd = |s: &str| AuthorityError::Etcd(s.to_owned());
        assert_eq!(kind(&etcd("etcdserver: no leader")), Some("quorum-lost"));
        assert_eq!(kind(&etcd("unhealthy cluster")), Some("quorum-lost"));
        assert_eq!(
            kind(&etcd("etcdserver: request timed out")),
            Some("timeout")
        );
        assert_eq!(
            kind(&etcd("io: Connection refused (os error 111)")),
            Some("unreachable")
        );
        assert_eq!(kind(&etcd("unexpected reply")), Some("other"));
        let contention = AuthorityError::Contention {
            lock: "l".into(),
            attempts: 3,
        };
        assert_eq!(kind(&contention), None);
    }
}
