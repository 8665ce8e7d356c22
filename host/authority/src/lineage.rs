//! What `migrate` needs from a lease store, and what the stores share to
//! give it: [`LineageStore`], which the SQLite, PostgreSQL and etcd stores
//! implement. The stores depend on this module, never on `migrate`.

use fencecheck::Instance;

use crate::{AuthorityError, rules};

/// A lease store as a migration sees it: the lineage it holds, sealed as a
/// source or imported into as a target (see `migrate` for the protocol).
pub(crate) trait LineageStore {
    /// The store's name as a seal records it: stable however the store is
    /// reached (an absolute path; an etcd cluster by id and key prefix, not
    /// by the members listed; a PostgreSQL server and database, no
    /// credentials).
    fn identity(&self) -> Result<String, AuthorityError>;

    /// The lineage and whether there is state, changing nothing.
    fn peek(&self) -> Result<Peek, AuthorityError>;

    /// In one atomic step: check every lock state, mark the store moved to
    /// `target` (it then refuses every decision) and read what it exports,
    /// with the floor above `at_least`. A store already sealed for `target`
    /// is read again; one sealed for another target is refused.
    fn seal(&self, target: &str, at_least: u64) -> Result<Export, AuthorityError>;

    /// Write `export` into the store, unless it already holds the lineage,
    /// live (the finished migration); calls `step` as each [`MigrationStep`]
    /// of its own is reached.
    fn import(
        &self,
        export: &Export,
        step: &mut dyn FnMut(MigrationStep),
    ) -> Result<Imported, AuthorityError>;
}

/// Where a migration stands; [`crate::migrate_with`] reports each step as
/// it is reached (the fault-injection tests stop the process there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MigrationStep {
    /// The source is sealed: it grants nothing any more; the target is
    /// untouched.
    Sealed,
    /// etcd targets only: the target is marked as importing and holds part
    /// of the locks.
    Importing,
}

/// The source's lineage and locks as of the seal, and the floor the target
/// must start at.
#[derive(Clone, Debug)]
pub(crate) struct Export {
    pub lineage: u64,
    /// Above the source's floor, every epoch it holds and `at_least`.
    pub floor: u64,
    /// Every lock and its state, checked by the component.
    pub locks: Vec<(String, Vec<u8>)>,
}

/// How the target received the import.
pub(crate) enum Imported {
    /// Written; the target's floor.
    Done { floor: u64 },
    /// The target already holds this lineage, live; its floor.
    Already { floor: u64 },
}

impl Export {
    /// The export of `lineage` with `locks`, starting at the floor `restore`
    /// would set over the stored `floor` and `locks`, checking every state
    /// (any damaged or misfiled state refuses the seal).
    pub(crate) fn checked(
        guest: &mut Instance,
        lineage: u64,
        floor: u64,
        at_least: u64,
        locks: Vec<(String, Vec<u8>)>,
    ) -> Result<Self, AuthorityError> {
        let floor = rules::restored_floor(
            guest,
            floor,
            at_least,
            locks.iter().map(|(l, s)| (l.as_bytes(), s.as_slice())),
        )?;
        Ok(Self {
            lineage,
            floor,
            locks,
        })
    }
}

/// A read-only look at a store before anything is sealed.
#[derive(Clone, Debug, Default)]
pub(crate) struct Peek {
    /// Its lineage, if it has one.
    pub held: Option<Lineage>,
    /// Whether it holds any lock state or epoch floor.
    pub has_state: bool,
    /// The lineage its tokens carry if it has state but no lineage of its
    /// own (etcd from before lineages: the cluster id).
    pub legacy: Option<u64>,
}

/// What a store says about its lineage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Lineage {
    /// Granting under this lineage.
    Live(u64),
    /// Sealed: moved to the named store.
    Moved(u64, String),
    /// etcd only: an import into it has not finished.
    Importing(u64),
}

/// Why a target cannot take `export`, given what it holds (`None`: no
/// lineage yet) and whether it holds any lock state or floor.
pub(crate) fn target_verdict(
    held: Option<&Lineage>,
    has_state: bool,
    lineage: u64,
) -> Result<Option<u64>, AuthorityError> {
    match held {
        None if has_state => Err(AuthorityError::MigrationRefused(
            "the target holds lock state but no lineage (a coordinator from before \
             lineages used it): refusing to overwrite it"
                .into(),
        )),
        None => Ok(None),
        Some(Lineage::Live(l) | Lineage::Moved(l, _) | Lineage::Importing(l)) if *l != lineage => {
            Err(AuthorityError::MigrationRefused(format!(
                "the target already belongs to lineage {l}, not {lineage}: a coordinator has \
                 used it; migrate only into a new, unused store"
            )))
        }
        Some(Lineage::Live(l)) => Ok(Some(*l)),
        Some(Lineage::Moved(..) | Lineage::Importing(_)) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_with_another_lineage_or_state_are_refused() {
        assert!(matches!(target_verdict(None, false, 7), Ok(None)));
        assert!(target_verdict(None, true, 7).is_err());
        assert!(target_verdict(Some(&Lineage::Live(8)), false, 7).is_err());
        assert!(target_verdict(Some(&Lineage::Moved(8, "x".into())), false, 7).is_err());
        assert!(matches!(
            target_verdict(Some(&Lineage::Live(7)), true, 7),
            Ok(Some(7))
        ));
        assert!(matches!(
            target_verdict(Some(&Lineage::Moved(7, "x".into())), true, 7),
            Ok(None)
        ));
        assert!(matches!(
            target_verdict(Some(&Lineage::Importing(7)), true, 7),
            Ok(None)
        ));
    }
}
