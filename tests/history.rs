//! The history checker (tests/support/history.rs) can fail: each rule is
//! fed a history that breaks it.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use fencecheck::Token;
use fencecheck_tests::history::{Attempt, Audited, Kept, Seen, check, check_issued};

fn t(counter: u64) -> Token {
    Token {
        authority: 0,
        epoch: 0,
        counter,
    }
}

fn attempt(payload: &str, counter: u64, seen: Seen) -> Attempt {
    Attempt {
        client: 0,
        scope: "s".into(),
        token: t(counter),
        op_id: None,
        expected_version: None,
        payload: payload.into(),
        seen,
    }
}

/// A sound history: w1 v1, w2 v2, a refused stale write, an unknown one.
fn sound() -> (Vec<Attempt>, Kept) {
    let history = vec![
        attempt("w1", 1, Seen::Applied(1)),
        attempt("w2", 2, Seen::Applied(2)),
        attempt("old", 1, Seen::Refused("stale-fence".into())),
        attempt("lost", 3, Seen::Unknown),
    ];
    let mut log = BTreeMap::new();
    log.insert(
        1,
        Audited {
            payload: "w1".into(),
            token: t(1),
        },
    );
    log.insert(
        2,
        Audited {
            payload: "w2".into(),
            token: t(2),
        },
    );
    let mut kept = Kept::default();
    kept.audit.insert("s".into(), log);
    kept.finals.insert("s".into(), (2, "w2".into()));
    (history, kept)
}

fn fails_with(history: &[Attempt], kept: &Kept, rule: &str) -> Result<()> {
    match check(history, kept) {
        Ok(s) => anyhow::bail!("{rule} broken but the check passed: {s:?}"),
        Err(e) => ensure!(e.to_string().contains(rule), "{rule}: {e}"),
    }
    Ok(())
}

/// The sound history passes and is counted.
#[test]
fn a_sound_history_passes() -> Result<()> {
    let (history, kept) = sound();
    let summary = check(&history, &kept)?;
    ensure!((summary.applied, summary.refused, summary.unknown) == (2, 1, 1));
    Ok(())
}

/// Each rule, broken on its own, is reported by number.
#[test]
fn every_rule_can_fail() -> Result<()> {
    // 1: a version gap (v3 audited, no v2 … here: v1, v3).
    let (history, mut kept) = sound();
    let log = kept
        .audit
        .get_mut("s")
        .ok_or_else(|| anyhow::anyhow!("s"))?;
    let w2 = log.remove(&2).ok_or_else(|| anyhow::anyhow!("v2"))?;
    log.insert(3, w2);
    kept.finals.insert("s".into(), (3, "w2".into()));
    fails_with(&history, &kept, "rule 1")?;

    // 2: a lower token applied after a higher one.
    let (mut history, mut kept) = sound();
    kept.audit
        .get_mut("s")
        .ok_or_else(|| anyhow::anyhow!("s"))?
        .insert(
            3,
            Audited {
                payload: "old".into(),
                token: t(1),
            },
        );
    kept.finals.insert("s".into(), (3, "old".into()));
    history[2].seen = Seen::Unknown;
    fails_with(&history, &kept, "rule 2")?;

    // 2: an equal token without a guard.
    let (mut history, mut kept) = sound();
    history.push(attempt("again", 2, Seen::Applied(3)));
    kept.audit
        .get_mut("s")
        .ok_or_else(|| anyhow::anyhow!("s"))?
        .insert(
            3,
            Audited {
                payload: "again".into(),
                token: t(2),
            },
        );
    kept.finals.insert("s".into(), (3, "again".into()));
    fails_with(&history, &kept, "rule 2")?;

    // 3: an acknowledged write that is not audited.
    let (mut history, kept) = sound();
    history[3].seen = Seen::Applied(3);
    fails_with(&history, &kept, "rule 3")?;

    // 4: a refused write that is audited.
    let (mut history, kept) = sound();
    history[1].seen = Seen::Refused("stale-fence".into());
    fails_with(&history, &kept, "rule 4")?;

    // 5: the final value is not the last audited write.
    let (history, mut kept) = sound();
    kept.finals.insert("s".into(), (2, "w1".into()));
    fails_with(&history, &kept, "rule 5")?;
    Ok(())
}

/// Issued tokens must grow per lock; a repeat or a decrease fails.
#[test]
fn issued_tokens_must_grow() -> Result<()> {
    let ok = [
        ("a".to_string(), t(1)),
        ("b".to_string(), t(1)),
        ("a".to_string(), t(2)),
    ];
    check_issued(&ok)?;
    for bad in [
        vec![("a".to_string(), t(2)), ("a".to_string(), t(2))],
        vec![("a".to_string(), t(2)), ("a".to_string(), t(1))],
    ] {
        ensure!(check_issued(&bad).is_err(), "{bad:?}");
    }
    Ok(())
}
