//! Fence decisions counted in the server (docs/design.md §12's
//! `fencecheck_decisions_total`), read with `FENCE.METRICS` as Prometheus
//! text. Counters live in the module, per server process, since it was
//! loaded; a replica counts nothing (it applies effects, not FENCE
//! commands). Labels are fixed arrays: 4 operations × 7 outcomes × 18
//! epochs (the runtime crate's label lists), never a key.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::rules::Refusal;

/// The table's `operation` of each fenced command.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operation {
    /// FENCE.SET
    Put = 0,
    /// FENCE.DEL
    Delete = 1,
    /// FENCE.EXEC
    Execute = 2,
    /// FENCE.CHECK (decides, writes nothing)
    Check = 3,
}

const OPERATIONS: [&str; 4] = ["put", "delete", "execute", "check"];
const OUTCOMES: usize = fencecheck::OUTCOME_LABELS.len();
const EPOCHS: usize = fencecheck::EPOCH_LABELS.len();

#[allow(clippy::declare_interior_mutable_const)] // only to build the array
const ZERO: AtomicU64 = AtomicU64::new(0);
static COUNTS: [AtomicU64; OPERATIONS.len() * OUTCOMES * EPOCHS] =
    [ZERO; OPERATIONS.len() * OUTCOMES * EPOCHS];

/// The `epoch` label's index of a token argument (`none` when it is not
/// a token).
pub(crate) fn epoch_index(token: &[u8]) -> usize {
    let token = std::str::from_utf8(token)
        .ok()
        .and_then(|t| t.parse::<fencecheck::SignedTokenText>().ok())
        .map(|t| t.token);
    fencecheck::epoch_index(token)
}

/// The outcome index of a command's reply: `applied`/`duplicate` by its
/// first element, a refusal by its error word.
fn outcome_index<T>(result: &Result<T, Refusal>, duplicate: impl Fn(&T) -> bool) -> usize {
    match result {
        Ok(value) if duplicate(value) => 1,
        Ok(_) => 0,
        Err(Refusal(line)) => match line.split(' ').next().unwrap_or_default() {
            "STALEFENCE" => 2,
            "VERSIONCONFLICT" => 3,
            "UNAUTHENTICATED" => 4,
            // The component or the server failed: no decision was made.
            "FENCERUNTIME" => 6,
            _ => 5,
        },
    }
}

/// Count one fenced command's result under its `epoch` label index.
/// `-TRYAGAIN` (a cluster slot mid-move) is not counted: nothing was
/// decided, and the client's retry, which is, would count it twice.
pub(crate) fn count<T>(
    operation: Operation,
    epoch: usize,
    result: &Result<T, Refusal>,
    duplicate: impl Fn(&T) -> bool,
) {
    if matches!(result, Err(Refusal(line)) if line.starts_with("TRYAGAIN ")) {
        return;
    }
    let i = (operation as usize * OUTCOMES + outcome_index(result, duplicate)) * EPOCHS + epoch;
    if let Some(counter) = COUNTS.get(i) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every nonzero counter as Prometheus text exposition.
pub(crate) fn exposition() -> String {
    let counts: Vec<u64> = COUNTS.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    fencecheck::decisions_text(&OPERATIONS, &counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Token texts map onto the bounded epoch labels; refusals onto outcomes.
    #[test]
    fn labels() {
        assert_eq!(epoch_index(b"0.41"), 0);
        assert_eq!(epoch_index(b"15.1"), 15);
        assert_eq!(epoch_index(b"16.1"), 16);
        assert_eq!(epoch_index(b"not a token"), 17);
        assert_eq!(epoch_index(b"0.0"), 17);
        let stale: Result<(), Refusal> = Err(Refusal("STALEFENCE presented 0.41".into()));
        assert_eq!(outcome_index(&stale, |_| false), 2);
        let syntax: Result<(), Refusal> = Err(Refusal("ERR syntax error".into()));
        assert_eq!(outcome_index(&syntax, |_| false), 5);
    }
}
