//! `fencecheck keygen` and `fencecheck keys …`: signing keys for signed
//! tokens. A key file holds `KEY-ID:SECRET-HEX` entries (fencecheck's key
//! text: commas or lines, `#` comments); the authority signs with one key,
//! a resource trusts a set of them per scope prefix.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use fencecheck::{GrantKey, KeysText};

/// The keys a resource's scopes require (the `fencecheck_keys` table of a
/// SQLite database in fencecheck's layout, shared by every host).
#[derive(Subcommand)]
pub enum Keys {
    /// Require tokens signed by one of the file's keys on every scope that
    /// starts with PREFIX ("" for every scope), replacing PREFIX's keys.
    Set {
        /// The resource's SQLite database (fencecheck's layout is installed).
        #[arg(long)]
        db: PathBuf,
        /// The scope prefix.
        prefix: String,
        /// A key file (`KEY-ID:SECRET-HEX` per line).
        key_file: PathBuf,
    },
    /// Stop requiring signed tokens under PREFIX.
    Remove {
        /// The resource's SQLite database.
        #[arg(long)]
        db: PathBuf,
        /// The scope prefix.
        prefix: String,
    },
    /// Print every prefix and its key ids (never a secret).
    List {
        /// The resource's SQLite database.
        #[arg(long)]
        db: PathBuf,
    },
}

/// Read a key file; its keys must be a usable set.
pub fn read_keys(path: &Path) -> Result<Vec<GrantKey>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the key file {}", path.display()))?;
    let keys: KeysText = text
        .parse()
        .with_context(|| format!("the key file {}", path.display()))?;
    Ok(keys.0)
}

/// Read a key file that holds exactly one key (an authority signs with one).
pub fn read_signing_key(path: &Path) -> Result<GrantKey> {
    KeysText(read_keys(path)?)
        .signing_key()
        .with_context(|| format!("the signing key file {}", path.display()))
}

/// `keygen ID`: a new key of 32 random bytes, as key text.
pub fn keygen(id: u32) -> Result<ExitCode> {
    let mut secret = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .context("reading /dev/urandom")?;
    println!("{}", KeysText(vec![GrantKey { key_id: id, secret }]));
    Ok(ExitCode::SUCCESS)
}

fn open(db: &Path) -> Result<rusqlite::Connection> {
    let conn =
        rusqlite::Connection::open(db).with_context(|| format!("opening {}", db.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    fencecheck_sqlite::install(&conn)?;
    Ok(conn)
}

/// Run one `keys` command.
pub fn run(command: Keys) -> Result<ExitCode> {
    match command {
        Keys::Set {
            db,
            prefix,
            key_file,
        } => {
            let keys = read_keys(&key_file)?;
            fencecheck_sqlite::set_keys(&open(&db)?, &prefix, &keys)?;
            let ids: Vec<String> = keys.iter().map(|k| k.key_id.to_string()).collect();
            println!("prefix {prefix:?} requires keys {}", ids.join(","));
        }
        Keys::Remove { db, prefix } => {
            if fencecheck_sqlite::remove_keys(&open(&db)?, &prefix)? {
                println!("prefix {prefix:?} removed");
            } else {
                println!("prefix {prefix:?} had no keys");
            }
        }
        Keys::List { db } => {
            for (prefix, ids) in fencecheck_sqlite::key_prefixes(&open(&db)?)? {
                let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
                println!("{prefix:?} {}", ids.join(","));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
