//! Lease stores named by URL, as `fencecheck authority migrate` takes them,
//! and opened as the [`LineageStore`] each one implements: the one place
//! that maps a URL to a store, so `migrate` names no store.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use fencecheck::Runtime;

use crate::etcd::EtcdStore;
use crate::lineage::LineageStore;
use crate::postgres::PostgresStore;
use crate::sqlite::SqliteStore;
use crate::{AuthorityError, EtcdCredentials, EtcdOptions, EtcdTls};

/// A lease store, as `fencecheck authority migrate` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite:PATH`: a SQLite coordinator database.
    Sqlite(PathBuf),
    /// `etcd:http://HOST:PORT[,http://…]` or `etcd:https://…`: an etcd
    /// cluster (default prefix); TLS settings and credentials come from the
    /// [`EtcdAccess`] given to [`crate::migrate_with_etcd`].
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

impl StoreUrl {
    /// The store this URL names, reaching etcd with `etcd`. Nothing is
    /// connected or opened until the store is used.
    pub(crate) fn store(&self, runtime: &Runtime, etcd: &EtcdAccess) -> Box<dyn LineageStore> {
        let runtime = runtime.clone();
        match self {
            Self::Sqlite(path) => Box::new(SqliteStore::new(path.clone(), runtime)),
            Self::Postgres(url) => Box::new(PostgresStore::new(url.clone(), runtime)),
            Self::Etcd(endpoints) => Box::new(EtcdStore::new(options(endpoints, etcd), runtime)),
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
}
