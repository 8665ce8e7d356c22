//! Moving a lineage from one lease store to another without locking any
//! resource out.
//!
//! Every token carries its authority id, and a resource refuses every other
//! authority for a scope forever. So the authority id is a *lineage* stored
//! with the locks (a row in SQLite and PostgreSQL, a key in etcd), and
//! moving the service moves the lineage:
//!
//! 1. **Seal the source** in one atomic step: check every lock state, mark
//!    the source as moved to the target (it then refuses every decision),
//!    and read the lineage, the epoch floor and every lock state as of that
//!    step. A re-run finds the source already sealed for the same target
//!    and reads it again (nothing can have changed); a source sealed for
//!    another target is refused.
//! 2. **Import into the target** (one transaction in SQLite and
//!    PostgreSQL; in etcd a marked, resumable sequence, see `etcd`): the
//!    lineage, every lock state (so current holders keep their leases and
//!    can renew there), and an epoch floor above every epoch the source
//!    knows and above `at_least` (as `restore` does), so the target's first
//!    grant on any lock compares above every token the source ever issued.
//!    A target holding another lineage or live state is refused; one that
//!    already holds this lineage, live, is the finished migration (a re-run
//!    reports it and changes nothing); one holding this lineage sealed (an
//!    earlier source moved back to) takes the import.
//!
//! Each store does both steps itself, behind [`LineageStore`]; this module
//! checks both sides, then drives the steps, and names no store.

use fencecheck::Runtime;

use crate::AuthorityError;
use crate::lineage::{Imported, Lineage, LineageStore, MigrationStep, target_verdict};
use crate::store_url::{EtcdAccess, StoreUrl};

/// What a migration did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migrated {
    /// The lineage (authority id) every token of both stores carries.
    pub lineage: u64,
    /// The target's epoch floor: its first grant on any lock has this epoch.
    pub epoch_floor: u64,
    /// How many lock states were copied (0 when `already` is set).
    pub locks: usize,
    /// The target already held the finished migration; nothing changed.
    pub already: bool,
}

/// Move the lineage in `from` to `to` (see the module docs); `at_least` is
/// the lowest acceptable new epoch (the CLI passes the Unix time in
/// milliseconds, as for `restore`).
pub fn migrate(
    runtime: &Runtime,
    from: &StoreUrl,
    to: &StoreUrl,
    at_least: u64,
) -> Result<Migrated, AuthorityError> {
    migrate_with(runtime, from, to, at_least, &mut |_| {})
}

/// [`migrate`], calling `step` as each [`MigrationStep`] is reached.
pub fn migrate_with(
    runtime: &Runtime,
    from: &StoreUrl,
    to: &StoreUrl,
    at_least: u64,
    step: &mut dyn FnMut(MigrationStep),
) -> Result<Migrated, AuthorityError> {
    migrate_with_etcd(runtime, from, to, at_least, step, &EtcdAccess::default())
}

/// [`migrate_with`], reaching etcd stores with `etcd`.
pub fn migrate_with_etcd(
    runtime: &Runtime,
    from: &StoreUrl,
    to: &StoreUrl,
    at_least: u64,
    step: &mut dyn FnMut(MigrationStep),
    etcd: &EtcdAccess,
) -> Result<Migrated, AuthorityError> {
    let from = from.store(runtime, etcd);
    let to = to.store(runtime, etcd);
    run(&*from, &*to, at_least, step)
}

/// The migration between two opened stores.
fn run(
    from: &dyn LineageStore,
    to: &dyn LineageStore,
    at_least: u64,
    step: &mut dyn FnMut(MigrationStep),
) -> Result<Migrated, AuthorityError> {
    let target = to.identity()?;
    if from.identity()? == target {
        return Err(AuthorityError::MigrationRefused(
            "the source and the target are the same store".into(),
        ));
    }
    // Both sides are checked before the source is sealed, so that a refusal
    // changes nothing. (A target that changes between this check and the
    // import is refused then, with the source sealed for it: re-run once
    // the target is sorted out.)
    let source = from.peek()?;
    let lineage = match (&source.held, source.legacy) {
        (Some(Lineage::Live(l) | Lineage::Moved(l, _)), _) => *l,
        (Some(Lineage::Importing(_)), _) => {
            return Err(AuthorityError::MigrationRefused(
                "a migration into the source has not finished".into(),
            ));
        }
        (None, Some(l)) if source.has_state => l,
        (None, _) => {
            return Err(AuthorityError::MigrationRefused(
                "the source has no lineage: no coordinator ever used it".into(),
            ));
        }
    };
    if let Some(Lineage::Moved(_, to)) = &source.held
        && *to != target
    {
        return Err(AuthorityError::MigrationRefused(format!(
            "the source was already moved to {to}"
        )));
    }
    let destination = to.peek()?;
    target_verdict(destination.held.as_ref(), destination.has_state, lineage)?;
    let export = from.seal(&target, at_least)?;
    step(MigrationStep::Sealed);
    Ok(match to.import(&export, step)? {
        Imported::Done { floor } => Migrated {
            lineage: export.lineage,
            epoch_floor: floor,
            locks: export.locks.len(),
            already: false,
        },
        Imported::Already { floor } => Migrated {
            lineage: export.lineage,
            epoch_floor: floor,
            locks: 0,
            already: true,
        },
    })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::lineage::{Export, Peek};

    /// A store that answers from memory and records the steps run on it.
    struct Fake {
        identity: &'static str,
        peek: Peek,
        log: RefCell<Vec<String>>,
    }

    fn fake(identity: &'static str, held: Option<Lineage>, has_state: bool) -> Fake {
        Fake {
            identity,
            peek: Peek {
                held,
                has_state,
                legacy: None,
            },
            log: RefCell::default(),
        }
    }

    impl LineageStore for Fake {
        fn identity(&self) -> Result<String, AuthorityError> {
            Ok(self.identity.into())
        }
        fn peek(&self) -> Result<Peek, AuthorityError> {
            Ok(self.peek.clone())
        }
        fn seal(&self, target: &str, at_least: u64) -> Result<Export, AuthorityError> {
            self.log.borrow_mut().push(format!("seal for {target}"));
            Ok(Export {
                lineage: 7,
                floor: at_least,
                locks: vec![("a".into(), vec![1])],
            })
        }
        fn import(
            &self,
            export: &Export,
            _step: &mut dyn FnMut(MigrationStep),
        ) -> Result<Imported, AuthorityError> {
            self.log.borrow_mut().push("import".into());
            Ok(Imported::Done {
                floor: export.floor,
            })
        }
    }

    /// The checks run before the seal: a refused migration touches neither
    /// store; an accepted one seals the source for the target's identity,
    /// reports the seal and imports.
    #[test]
    fn refusals_come_before_the_seal() {
        let live = |l| Some(Lineage::Live(l));
        let moved = |to: &str| Some(Lineage::Moved(7, to.into()));
        let source = |held| fake("s", held, true);
        let empty = || fake("t", None, false);
        let refused = [
            (source(live(7)), fake("s", None, false)),
            (source(Some(Lineage::Importing(7))), empty()),
            (fake("s", None, false), empty()),
            (source(moved("elsewhere")), empty()),
            (source(live(7)), fake("t", live(8), false)),
            (source(live(7)), fake("t", None, true)),
        ];
        for (from, to) in &refused {
            let result = run(from, to, 5, &mut |_| panic!("no step is reached"));
            assert!(matches!(result, Err(AuthorityError::MigrationRefused(_))));
            assert!(from.log.borrow().is_empty() && to.log.borrow().is_empty());
        }
        for held in [live(7), moved("t")] {
            let (from, to) = (source(held), empty());
            let mut steps = Vec::new();
            let migrated = run(&from, &to, 5, &mut |s| steps.push(s)).expect("migrates");
            assert_eq!((migrated.lineage, migrated.locks), (7, 1));
            assert_eq!(from.log.borrow().as_slice(), ["seal for t"]);
            assert_eq!(to.log.borrow().as_slice(), ["import"]);
            assert_eq!(steps, [MigrationStep::Sealed]);
        }
    }
}
