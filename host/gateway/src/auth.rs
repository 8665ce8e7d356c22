//! Who may do what: principals from a TOML file (`--auth FILE`), each
//! presented as `Authorization: Bearer SECRET`, with rights per key prefix.
//! The file holds only the SHA-256 of each secret; a presented secret is
//! hashed and looked up, and neither is ever logged or echoed.
//!
//! ```toml
//! [[principal]]
//! name = "report-writer"
//! secret_sha256 = "<hex SHA-256 of the bearer secret>"
//! read = ["reports/"]    # GET, HEAD, listing
//! write = ["reports/"]   # PUT, DELETE
//! lock = ["reports/"]    # acquire, renew, release
//! ```
//!
//! Prefixes are plain string prefixes of the decoded key (`""` is every key;
//! `"reports"` also matches `reports-old/…`: end a directory with `/`).
//!
//! A principal may also carry S3 credentials for the S3 front (AWS
//! Signature V4, see `crate::s3`): `access_key_id` and `secret_access_key`.
//! SigV4 needs the secret itself, not a hash, so a file that holds one is
//! refused unless only its owner can read it (mode `0600` or stricter). A
//! key `K` of bucket `B` is the key `B/K` for the rights above.
//!
//! ```toml
//! [[principal]]
//! name = "backup"
//! access_key_id = "AKIAFENCECHECK0001"
//! secret_access_key = "<40 characters, from a password generator>"
//! read = ["backups/"]
//! write = ["backups/"]
//! ```

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::Error;

/// Longest principal name (it prefixes the lease ids the principal holds).
pub const MAX_PRINCIPAL_NAME: usize = 64;

/// What a request needs on its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    /// GET, HEAD, listing.
    Read,
    /// PUT, DELETE.
    Write,
    /// acquire, renew, release.
    Lock,
}

impl Right {
    /// The right's name in the file and in 403 answers.
    pub fn name(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Lock => "lock",
        }
    }
}

/// One principal and its rights.
#[derive(Debug)]
pub struct Principal {
    /// Its name (logged; never its secret).
    pub name: String,
    read: Vec<String>,
    write: Vec<String>,
    lock: Vec<String>,
}

impl Principal {
    /// Whether this principal holds `right` on `key` (or on every key that
    /// starts with `key`, for a listing prefix).
    pub fn may(&self, right: Right, key: &str) -> bool {
        let prefixes = match right {
            Right::Read => &self.read,
            Right::Write => &self.write,
            Right::Lock => &self.lock,
        };
        prefixes.iter().any(|p| key.starts_with(p.as_str()))
    }
}

/// Why a request is not authenticated (answered 401).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unauthenticated {
    /// No `Authorization` header.
    Missing,
    /// Not `Bearer <secret>`, or more than one header.
    Malformed,
    /// No principal has this secret.
    Unknown,
}

/// The principals of one file, indexed by the hash of their secret.
#[derive(Default)]
pub struct Principals {
    by_hash: HashMap<[u8; 32], Arc<Principal>>,
    /// S3 access key id → the principal and its secret access key.
    by_access_key: HashMap<String, (Arc<Principal>, S3Secret)>,
}

/// A secret access key, kept out of `Debug` output.
#[derive(Clone)]
pub struct S3Secret(String);

impl S3Secret {
    /// The secret's text (for computing a signature, never for logging).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for S3Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("S3Secret(..)")
    }
}

impl std::fmt::Debug for Principals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Principals")
            .field("bearer", &self.by_hash.len())
            .field("s3", &self.by_access_key.len())
            .finish()
    }
}

/// Shortest accepted secret access key (AWS issues 40 characters).
pub const MIN_S3_SECRET: usize = 16;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    principal: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    secret_sha256: Option<String>,
    access_key_id: Option<String>,
    secret_access_key: Option<String>,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    write: Vec<String>,
    #[serde(default)]
    lock: Vec<String>,
}

impl Principals {
    /// Parse the file's text. Errors name the principal and the problem,
    /// never a hash.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = |why: String| Error::Config(format!("auth file: {why}"));
        // toml's message quotes the offending line, which may hold a hash.
        let file: File = toml::from_str(text).map_err(|e| {
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].lines().count().max(1);
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            bad(format!("not the expected TOML{at}: {}", e.message()))
        })?;
        let mut by_hash = HashMap::new();
        let mut by_access_key = HashMap::new();
        let mut names = HashSet::new();
        for entry in file.principal {
            let name = entry.name;
            if name.is_empty()
                || name.len() > MAX_PRINCIPAL_NAME
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            {
                return Err(bad(format!(
                    "principal name {name:?}: 1 to {MAX_PRINCIPAL_NAME} of A-Z a-z 0-9 . _ -"
                )));
            }
            if !names.insert(name.clone()) {
                return Err(bad(format!("principal {name:?} is listed twice")));
            }
            let hash = entry
                .secret_sha256
                .as_deref()
                .map(|text| {
                    decode_hash(text).ok_or_else(|| {
                        bad(format!(
                            "principal {name:?}: secret_sha256 must be 64 hex digits"
                        ))
                    })
                })
                .transpose()?;
            let s3 = match (entry.access_key_id, entry.secret_access_key) {
                (None, None) => None,
                (Some(id), Some(secret)) => {
                    if id.len() < 3
                        || id.len() > 128
                        || !id.bytes().all(|b| b.is_ascii_alphanumeric())
                    {
                        return Err(bad(format!(
                            "principal {name:?}: access_key_id must be 3 to 128 of A-Z a-z 0-9"
                        )));
                    }
                    if secret.len() < MIN_S3_SECRET
                        || secret.len() > 128
                        || !secret.bytes().all(|b| b.is_ascii_graphic())
                    {
                        return Err(bad(format!(
                            "principal {name:?}: secret_access_key must be {MIN_S3_SECRET} to 128 visible ASCII characters"
                        )));
                    }
                    Some((id, S3Secret(secret)))
                }
                _ => {
                    return Err(bad(format!(
                        "principal {name:?}: access_key_id and secret_access_key go together"
                    )));
                }
            };
            if hash.is_none() && s3.is_none() {
                return Err(bad(format!(
                    "principal {name:?}: give secret_sha256 (bearer), access_key_id and secret_access_key (S3), or both"
                )));
            }
            for prefix in entry.read.iter().chain(&entry.write).chain(&entry.lock) {
                if prefix.len() > fencecheck::MAX_SCOPE_BYTES
                    || prefix.chars().any(char::is_control)
                {
                    return Err(bad(format!(
                        "principal {name:?}: a prefix is over 1024 bytes or has control characters"
                    )));
                }
            }
            let principal = Arc::new(Principal {
                name: name.clone(),
                read: entry.read,
                write: entry.write,
                lock: entry.lock,
            });
            if let Some(hash) = hash
                && by_hash.insert(hash, principal.clone()).is_some()
            {
                return Err(bad(format!(
                    "principal {name:?} has the same secret as another"
                )));
            }
            if let Some((id, secret)) = s3
                && by_access_key.insert(id, (principal, secret)).is_some()
            {
                return Err(bad(format!(
                    "principal {name:?} has the same access_key_id as another"
                )));
            }
        }
        Ok(Self {
            by_hash,
            by_access_key,
        })
    }

    /// Read and parse `path`.
    /// A file that holds secret access keys must be readable by its
    /// owner only.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("reading the auth file {}: {e}", path.display())))?;
        let principals = Self::parse(&text)?;
        if !principals.by_access_key.is_empty() {
            use std::os::unix::fs::MetadataExt;
            let mode = std::fs::metadata(path)
                .map_err(|e| {
                    Error::Config(format!("reading the auth file {}: {e}", path.display()))
                })?
                .mode();
            if mode & 0o077 != 0 {
                return Err(Error::Config(format!(
                    "auth file {}: it holds secret access keys, so only its owner may read it (chmod 600; it is {:o})",
                    path.display(),
                    mode & 0o777
                )));
            }
        }
        Ok(principals)
    }

    /// The principal and secret of an S3 access key id.
    pub fn s3_key(&self, access_key_id: &str) -> Option<(Arc<Principal>, S3Secret)> {
        self.by_access_key.get(access_key_id).cloned()
    }

    /// How many credentials there are (bearer secrets and S3 keys).
    pub fn len(&self) -> usize {
        self.by_hash.len() + self.by_access_key.len()
    }

    /// Whether there are none (every request is then refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The principal an `Authorization` header value names.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Arc<Principal>, Unauthenticated> {
        let value = header.ok_or(Unauthenticated::Missing)?;
        let value = std::str::from_utf8(value).map_err(|_| Unauthenticated::Malformed)?;
        let (scheme, secret) = value
            .trim()
            .split_once(' ')
            .ok_or(Unauthenticated::Malformed)?;
        let secret = secret.trim();
        if !scheme.eq_ignore_ascii_case("bearer") || secret.is_empty() {
            return Err(Unauthenticated::Malformed);
        }
        let hash: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        self.by_hash
            .get(&hash)
            .cloned()
            .ok_or(Unauthenticated::Unknown)
    }
}

fn decode_hash(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let digits = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(digits, 16).ok()?;
    }
    Some(out)
}

/// The gateway's access policy: open (no `--auth`), or the principals of a
/// file, swapped whole on reload.
pub struct Auth {
    file: Option<PathBuf>,
    current: RwLock<Arc<Principals>>,
}

/// Who is asking.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Open mode: anyone, with every right.
    Anyone,
    /// An authenticated principal.
    Principal(Arc<Principal>),
}

impl Caller {
    /// Whether the caller holds `right` on `key`.
    pub fn may(&self, right: Right, key: &str) -> bool {
        match self {
            Caller::Anyone => true,
            Caller::Principal(p) => p.may(right, key),
        }
    }

    /// The name leases are bound to: `None` in open mode.
    pub fn name(&self) -> Option<&str> {
        match self {
            Caller::Anyone => None,
            Caller::Principal(p) => Some(&p.name),
        }
    }
}

impl Auth {
    /// Open mode: every request is allowed everything.
    pub fn open() -> Self {
        Self {
            file: None,
            current: RwLock::new(Arc::new(Principals::default())),
        }
    }

    /// The principals of `path` (read now; [`Auth::reload`] reads it again).
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let principals = Principals::load(path)?;
        Ok(Self {
            file: Some(path.to_owned()),
            current: RwLock::new(Arc::new(principals)),
        })
    }

    /// Whether requests must authenticate.
    pub fn is_open(&self) -> bool {
        self.file.is_none()
    }

    /// How many principals are loaded.
    pub fn principals(&self) -> usize {
        self.current.read().map(|p| p.len()).unwrap_or(0)
    }

    /// Read the file again; the old principals stay unless it parses.
    /// `Ok(false)`: open mode, nothing to reload.
    pub fn reload(&self) -> Result<bool, Error> {
        let Some(path) = &self.file else {
            return Ok(false);
        };
        let principals = Principals::load(path)?;
        let mut current = self
            .current
            .write()
            .map_err(|_| Error::Task("the auth lock is poisoned".into()))?;
        *current = Arc::new(principals);
        Ok(true)
    }

    /// The principal and secret of an S3 access key id (none in open mode).
    pub fn s3_key(&self, access_key_id: &str) -> Option<(Arc<Principal>, S3Secret)> {
        self.current.read().ok()?.s3_key(access_key_id)
    }

    /// The caller an `Authorization` header value names.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Caller, Unauthenticated> {
        if self.is_open() {
            return Ok(Caller::Anyone);
        }
        let principals = self
            .current
            .read()
            .map(|p| p.clone())
            .map_err(|_| Unauthenticated::Unknown)?;
        principals.authenticate(header).map(Caller::Principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash(secret: &str) -> String {
        Sha256::digest(secret.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[test]
    fn rights_by_prefix() -> Result<(), Error> {
        let text = format!(
            r#"
[[principal]]
name = "writer"
secret_sha256 = "{}"
read = ["reports/"]
write = ["reports/"]

[[principal]]
name = "root"
secret_sha256 = "{}"
read = [""]
write = [""]
lock = [""]
"#,
            hash("s1"),
            hash("s2")
        );
        let p = Principals::parse(&text)?;
        let writer = p
            .authenticate(Some(b"Bearer s1"))
            .map_err(|e| Error::Config(format!("{e:?}")))?;
        assert_eq!(writer.name, "writer");
        assert!(writer.may(Right::Write, "reports/july"));
        assert!(!writer.may(Right::Write, "notes/a"));
        assert!(!writer.may(Right::Lock, "reports/july"));
        let root = p
            .authenticate(Some(b"bearer  s2 "))
            .map_err(|e| Error::Config(format!("{e:?}")))?;
        assert!(root.may(Right::Lock, "anything"));
        assert_eq!(p.authenticate(None).err(), Some(Unauthenticated::Missing));
        assert_eq!(
            p.authenticate(Some(b"Basic czE=")).err(),
            Some(Unauthenticated::Malformed)
        );
        assert_eq!(
            p.authenticate(Some(b"Bearer s3")).err(),
            Some(Unauthenticated::Unknown)
        );
        // The hash itself is not a secret that works.
        let by_hash = format!("Bearer {}", hash("s1"));
        assert_eq!(
            p.authenticate(Some(by_hash.as_bytes())).err(),
            Some(Unauthenticated::Unknown)
        );
        Ok(())
    }

    #[test]
    fn bad_files_are_refused_without_echoing_hashes() {
        let h = hash("s");
        for (text, needle) in [
            (
                format!("[[principal]]\nname = \"a\"\nsecret_sha256 = \"{h}\"\nwrite = 3\n"),
                "line",
            ),
            (
                format!("[[principal]]\nname = \"a b\"\nsecret_sha256 = \"{h}\"\n"),
                "name",
            ),
            (
                "[[principal]]\nname = \"a\"\nsecret_sha256 = \"abc\"\n".to_string(),
                "64 hex",
            ),
            (
                format!(
                    "[[principal]]\nname = \"a\"\nsecret_sha256 = \"{h}\"\n[[principal]]\nname = \"b\"\nsecret_sha256 = \"{h}\"\n"
                ),
                "same secret",
            ),
            (
                format!(
                    "[[principal]]\nname = \"a\"\nsecret_sha256 = \"{h}\"\n[[principal]]\nname = \"a\"\nsecret_sha256 = \"{}\"\n",
                    hash("t")
                ),
                "twice",
            ),
            (
                format!("[[principal]]\nname = \"a\"\nsecret_sha256 = \"{h}\"\nadmin = true\n"),
                "TOML",
            ),
        ] {
            let err = Principals::parse(&text)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(needle), "{text}: {err}");
            assert!(!err.contains(&h), "the hash was echoed: {err}");
        }
    }
}
