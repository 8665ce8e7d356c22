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

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use fencecheck::{Instance, Runtime};

use crate::{AuthorityError, EtcdCredentials, EtcdOptions, EtcdTls, rules};

/// A lease store, as `fencecheck authority migrate` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite:PATH`: a SQLite coordinator database.
    Sqlite(PathBuf),
    /// `etcd:http://HOST:PORT[,http://…]` or `etcd:https://…`: an etcd
    /// cluster (default prefix); TLS settings and credentials come from the
    /// [`EtcdAccess`] given to [`migrate_with_etcd`].
    Etcd(Vec<String>),
    /// `postgres://…` or `postgresql://…`: a PostgreSQL database.
    Postgres(String),
}

impl FromStr for StoreUrl {
    type Err = AuthorityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            AuthorityError::MigrationRefused(format!(
                "{s:?} is not a store URL ({why}): use sqlite:PATH, \
                 etcd:http[s]://HOST:PORT[,…] or postgres://…"
            ))
        };
        if let Some(path) = s.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(bad("no path"));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if let Some(list) = s.strip_prefix("etcd:") {
            let endpoints: Vec<String> = list.split(',').map(str::to_owned).collect();
            let all = |scheme: &str| endpoints.iter().all(|e| e.starts_with(scheme));
            if !all("http://") && !all("https://") {
                return Err(bad("etcd endpoints are all http:// or all https:// URLs"));
            }
            return Ok(Self::Etcd(endpoints));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(Self::Postgres(s.to_owned()));
        }
        Err(bad("unknown scheme"))
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Self::Etcd(endpoints) => write!(f, "etcd:{}", endpoints.join(",")),
            Self::Postgres(url) => f.write_str(&redact(url)),
        }
    }
}

/// A PostgreSQL URL without its password (it is shown and stored).
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.split_once('@') else {
        return url.to_owned();
    };
    let user = userinfo.split(':').next().unwrap_or_default();
    format!("{scheme}://{user}@{host}")
}

/// Where a migration stands; [`migrate_with`] reports each step as it is
/// reached (the fault-injection tests stop the process there).
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

/// The floor `restore` would set over the stored `floor` and `locks`,
/// checking every state (any damaged or misfiled state refuses the seal).
pub(crate) fn export(
    guest: &mut Instance,
    lineage: u64,
    floor: u64,
    at_least: u64,
    locks: Vec<(String, Vec<u8>)>,
) -> Result<Export, AuthorityError> {
    let floor = rules::restored_floor(
        guest,
        floor,
        at_least,
        locks.iter().map(|(l, s)| (l.as_bytes(), s.as_slice())),
    )?;
    Ok(Export {
        lineage,
        floor,
        locks,
    })
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

/// How a migration reaches the etcd stores it names by URL: TLS settings,
/// used for `https://` endpoints (and required for them), and credentials,
/// used for every etcd side (both sides need the same user if both are
/// etcd; a side without authentication enabled refuses credentials).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// TLS settings, as [`EtcdOptions::tls`].
    pub tls: Option<EtcdTls>,
    /// The etcd user, as [`EtcdOptions::credentials`].
    pub credentials: Option<EtcdCredentials>,
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
    let mut guest = runtime.instance()?;
    let target = identity(to, etcd)?;
    if identity(from, etcd)? == target {
        return Err(AuthorityError::MigrationRefused(
            "the source and the target are the same store".into(),
        ));
    }
    // Both sides are checked before the source is sealed, so that a refusal
    // changes nothing. (A target that changes between this check and the
    // import is refused then, with the source sealed for it: re-run once
    // the target is sorted out.)
    let source = peek(from, runtime, etcd)?;
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
    let destination = peek(to, runtime, etcd)?;
    target_verdict(destination.held.as_ref(), destination.has_state, lineage)?;
    let export = match from {
        StoreUrl::Sqlite(path) => crate::sqlite::seal(path, &target, &mut guest, at_least)?,
        StoreUrl::Postgres(url) => crate::postgres::seal(url, &target, &mut guest, at_least)?,
        StoreUrl::Etcd(endpoints) => {
            crate::etcd::seal(options(endpoints, etcd), &target, runtime, at_least)?
        }
    };
    step(MigrationStep::Sealed);
    let imported = match to {
        StoreUrl::Sqlite(path) => crate::sqlite::import(path, &export)?,
        StoreUrl::Postgres(url) => crate::postgres::import(url, &export)?,
        StoreUrl::Etcd(endpoints) => {
            crate::etcd::import(options(endpoints, etcd), &export, runtime, step)?
        }
    };
    Ok(match imported {
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

fn peek(store: &StoreUrl, runtime: &Runtime, etcd: &EtcdAccess) -> Result<Peek, AuthorityError> {
    match store {
        StoreUrl::Sqlite(path) => crate::sqlite::peek(path),
        StoreUrl::Postgres(url) => crate::postgres::peek(url),
        StoreUrl::Etcd(endpoints) => crate::etcd::peek(options(endpoints, etcd), runtime),
    }
}

fn options(endpoints: &[String], etcd: &EtcdAccess) -> EtcdOptions {
    // `StoreUrl` checked that a cluster's endpoints share one scheme; a
    // plain http:// side of a migration to or from TLS takes no TLS.
    let https = endpoints.iter().all(|e| e.starts_with("https://"));
    EtcdOptions {
        tls: etcd.tls.clone().filter(|_| https),
        credentials: etcd.credentials.clone(),
        ..EtcdOptions::new(endpoints.iter().cloned())
    }
}

/// A store's name as a seal records it: stable however the store is
/// reached (an absolute path; an etcd cluster by id and key prefix, not by
/// the members listed; a PostgreSQL server and database, no credentials).
fn identity(store: &StoreUrl, etcd: &EtcdAccess) -> Result<String, AuthorityError> {
    Ok(match store {
        StoreUrl::Sqlite(path) => format!("sqlite:{}", absolute(path)?.display()),
        StoreUrl::Etcd(endpoints) => crate::etcd::identity(options(endpoints, etcd))?,
        StoreUrl::Postgres(url) => crate::postgres::identity(url)?,
    })
}

/// `path` made absolute, resolving symbolic links in its directory (the
/// file itself may not exist yet).
fn absolute(path: &Path) -> Result<PathBuf, AuthorityError> {
    let io = |e: std::io::Error| {
        AuthorityError::MigrationRefused(format!("cannot resolve {}: {e}", path.display()))
    };
    let path = std::path::absolute(path).map_err(io)?;
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if dir.exists() => Ok(dir.canonicalize().map_err(io)?.join(name)),
        _ => Ok(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_parse_and_print() {
        let cases = [
            ("sqlite:/var/lib/locks.db", "sqlite:/var/lib/locks.db"),
            (
                "etcd:http://127.0.0.1:2379,http://127.0.0.1:2380",
                "etcd:http://127.0.0.1:2379,http://127.0.0.1:2380",
            ),
            (
                "postgres://app:secret@db:5432/locks",
                "postgres://app@db:5432/locks",
            ),
            ("postgresql://db/locks", "postgresql://db/locks"),
        ];
        for (text, shown) in cases {
            let url: StoreUrl = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(url.to_string(), shown);
        }
        for bad in [
            "",
            "sqlite:",
            "etcd:x:2379",
            "etcd:https://x,http://y",
            "mysql://x",
            "/tmp/x.db",
        ] {
            assert!(bad.parse::<StoreUrl>().is_err(), "{bad}");
        }
    }

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
