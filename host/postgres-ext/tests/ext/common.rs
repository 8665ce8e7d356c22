//! Helpers for the extension's tests: a real server with the installed
//! extension created, and reading SQLSTATEs.
#![allow(dead_code)]

use anyhow::{Context, Result, bail};
use fencecheck::{GrantKey, Runtime, SignedTokenText, Token};
pub use fencecheck_tests::pgserver::PgServer;
use postgres::Client;

/// The secret of key 3, the signing key of the signed-token tests.
pub const SECRET: [u8; 32] = [0x33; 32];
/// Key 3 as key-set text (`ID:HEX`).
pub const KEYS: &str = "3:3333333333333333333333333333333333333333333333333333333333333333";

/// The signed token text of `0.1.counter` for `scope`, signed by key 3.
pub fn signed(scope: &str, counter: u64) -> Result<String> {
    let token = Token::new(0, 1, counter);
    let key = GrantKey {
        key_id: 3,
        secret: SECRET.to_vec(),
    };
    let Ok(signature) = Runtime::new()?
        .instance()?
        .sign(scope, token, "lease-1", &key)?
    else {
        bail!("signing failed");
    };
    Ok(SignedTokenText {
        token,
        signature: Some(signature),
    }
    .to_string())
}

/// A fresh server whose `postgres` database has `CREATE EXTENSION fencecheck`
/// (the extension installed by scripts/install-pg-extension).
pub fn server() -> Result<(PgServer, Client)> {
    let server = PgServer::start()?;
    let mut client = server.client()?;
    client
        .batch_execute("CREATE EXTENSION fencecheck")
        .context("CREATE EXTENSION fencecheck (run scripts/install-pg-extension first)")?;
    Ok((server, client))
}

/// The SQLSTATE of a failed statement (`None` for success or a non-server
/// error such as a lost connection).
pub fn sqlstate<T>(result: &Result<T, postgres::Error>) -> Option<String> {
    match result {
        Ok(_) => None,
        Err(e) => e.code().map(|c| c.code().to_string()),
    }
}

/// The server's message of a failed statement.
pub fn message<T>(result: &Result<T, postgres::Error>) -> String {
    match result {
        Ok(_) => String::new(),
        Err(e) => e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_else(|| e.to_string()),
    }
}

/// The server's HINT of a failed statement (empty when it has none).
pub fn hint<T>(result: &Result<T, postgres::Error>) -> String {
    match result {
        Ok(_) => String::new(),
        Err(e) => e
            .as_db_error()
            .and_then(|d| d.hint())
            .unwrap_or_default()
            .to_string(),
    }
}

/// The seed's report catalog as a fenced table.
pub const CATALOG: &str = "
CREATE TABLE report_catalog (
    report_id      text PRIMARY KEY,
    visible_object text,
    fence_token    text,
    fence_state    bytea
);";

/// `report_catalog` with `fence_protect` under `policy`.
pub fn protected_catalog(client: &mut Client, policy: &str) -> Result<()> {
    client.batch_execute(CATALOG)?;
    client.execute(
        "SELECT fence_protect('report_catalog', 'report_id', 'fence_token', 'fence_state', $1)",
        &[&policy],
    )?;
    Ok(())
}

/// A catalog row: (visible_object, fence_token, version of its state).
pub type Row = (Option<String>, Option<String>, i64);

/// The row of `report_id`.
pub fn row(client: &mut Client, report_id: &str) -> Result<Option<Row>> {
    let row = client.query_opt(
        "SELECT visible_object, fence_token, \
                coalesce((fence_inspect(fence_state)->>'version')::bigint, 0) \
           FROM report_catalog WHERE report_id = $1",
        &[&report_id],
    )?;
    Ok(row.map(|r| (r.get(0), r.get(1), r.get(2))))
}
