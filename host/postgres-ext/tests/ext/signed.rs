//! Signed tokens in PostgreSQL: fenced tables whose scopes have keys in
//! `fencecheck.keys` refuse every token their authority did not sign
//! (5F014), read as the extension's owner so writers never see a secret;
//! and the 7-argument fence_check/fence_next take the keys explicitly.

use crate::common::{KEYS, SECRET, message, protected_catalog, row, server, signed, sqlstate};
use anyhow::{Result, ensure};
use fencecheck::{Token, TokenText};
use postgres::Client;

const JULY: &str = "report/july";
fn insert(db: &mut Client, token: &str, object: &str) -> Result<u64, postgres::Error> {
    db.execute(
        "INSERT INTO report_catalog (report_id, visible_object, fence_token) VALUES ($1, $2, $3)",
        &[&JULY, &object, &token],
    )
}

fn update(db: &mut Client, token: &str, object: &str) -> Result<u64, postgres::Error> {
    db.execute(
        "UPDATE report_catalog SET visible_object = $1, fence_token = $2 WHERE report_id = $3",
        &[&object, &token, &JULY],
    )
}

/// The lock-out attack on a fenced table: with `report/` keyed, an INSERT,
/// UPDATE or DELETE presenting a forged u64::MAX token (unsigned, or with an
/// honest signature pasted on) or a tampered one raises 5F014 and changes
/// nothing; the authority's signed grants apply; and an application role
/// that writes through the trigger cannot read the keys.
#[test]
fn fenced_tables_require_signed_tokens() -> Result<()> {
    let (_server, mut db) = server()?;
    protected_catalog(&mut db, "strict")?;
    db.execute(
        "INSERT INTO fencecheck.keys VALUES ('report/', 3, $1)",
        &[&SECRET.as_slice()],
    )?;
    let max = TokenText(Token::new(0, u64::MAX, u64::MAX)).to_string();
    let unsigned = insert(&mut db, &max, "forged");
    ensure!(
        sqlstate(&unsigned).as_deref() == Some("5F014"),
        "{unsigned:?}"
    );
    ensure!(
        message(&unsigned) == "unauthenticated: unsigned",
        "{unsigned:?}"
    );
    let honest = signed(JULY, 41)?;
    let pasted = format!("{max}~{}", honest.split_once('~').map_or("", |p| p.1));
    let forged = insert(&mut db, &pasted, "forged");
    ensure!(
        message(&forged) == "unauthenticated: bad-signature",
        "{forged:?}"
    );
    ensure!(row(&mut db, JULY)?.is_none());

    ensure!(insert(&mut db, &honest, "a7")? == 1);
    let b = signed(JULY, 42)?;
    let tampered = b.replacen("1.42", "1.43", 1);
    let refused = update(&mut db, &tampered, "tampered");
    ensure!(
        sqlstate(&refused).as_deref() == Some("5F014"),
        "{refused:?}"
    );
    ensure!(update(&mut db, &b, "b9")? == 1);
    // The row keeps the token, not its signature (trust.rs shows why).
    ensure!(row(&mut db, JULY)? == Some((Some("b9".into()), Some("1.42".into()), 2)));
    // A signed but stale token is still stale: a signature never makes a
    // token new.
    let stale = update(&mut db, &honest, "a7");
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");

    // An application role writes through the trigger, never reads a key.
    db.batch_execute(
        "CREATE ROLE app LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON report_catalog TO app;",
    )?;
    db.batch_execute("SET ROLE app")?;
    let peek = db.query("SELECT secret FROM fencecheck.keys", &[]);
    ensure!(sqlstate(&peek).as_deref() == Some("42501"), "{peek:?}");
    let c = signed(JULY, 43)?;
    ensure!(update(&mut db, &c, "c1")? == 1);
    let mut tx = db.transaction()?;
    tx.execute("SELECT set_config('fencecheck.token', $1, true)", &[&max])?;
    let delete = tx.execute("DELETE FROM report_catalog WHERE report_id = $1", &[&JULY]);
    ensure!(sqlstate(&delete).as_deref() == Some("5F014"), "{delete:?}");
    drop(tx);
    let mut tx = db.transaction()?;
    tx.execute(
        "SELECT set_config('fencecheck.token', $1, true)",
        &[&signed(JULY, 44)?],
    )?;
    ensure!(tx.execute("DELETE FROM report_catalog WHERE report_id = $1", &[&JULY])? == 1);
    tx.commit()?;
    db.batch_execute("RESET ROLE")?;
    // Scopes no prefix covers take unsigned tokens.
    db.execute(
        "INSERT INTO report_catalog (report_id, visible_object, fence_token) VALUES ('notes/a', 'x', '0.5')",
        &[],
    )?;
    Ok(())
}

/// fence_check and fence_next with the keys as 7th argument: signed grants
/// apply, forged or unsigned ones raise 5F014, unusable key sets 5F015 from
/// the component or 5F012 from their text (never quoting a secret), and
/// NULL keys is the plain check, which ignores a signature.
#[test]
fn explicit_keys_in_sql_calls() -> Result<()> {
    let (_server, mut db) = server()?;
    let good = signed(JULY, 42)?;
    let call = |db: &mut Client, token: &str, keys: Option<&str>| {
        db.query_one(
            "SELECT fence_check(NULL, $1, $2, 'strict', NULL, NULL, $3)",
            &[&JULY, &token, &keys],
        )
        .map(|r| r.get::<_, String>(0))
    };
    ensure!(call(&mut db, &good, Some(KEYS))? == "applied");
    let tampered = call(&mut db, &good.replacen("1.42", "1.43", 1), Some(KEYS));
    ensure!(
        sqlstate(&tampered).as_deref() == Some("5F014"),
        "{tampered:?}"
    );
    let unsigned = call(&mut db, "1.42", Some(KEYS));
    ensure!(
        message(&unsigned) == "unauthenticated: unsigned",
        "{unsigned:?}"
    );
    ensure!(call(&mut db, &good, None)? == "applied");
    let next = db.query_one(
        "SELECT fence_inspect(fence_next(NULL, $1, $2, 'strict', NULL, NULL, $3))->>'version'",
        &[&JULY, &good, &KEYS],
    )?;
    ensure!(next.get::<_, Option<String>>(0).as_deref() == Some("1"));
    let short = call(&mut db, &good, Some("3:0011"));
    ensure!(sqlstate(&short).as_deref() == Some("5F012"), "{short:?}");
    ensure!(message(&short).contains("short-secret"), "{short:?}");
    let garbled = call(&mut db, &good, Some(&format!("x{KEYS}")));
    ensure!(
        sqlstate(&garbled).as_deref() == Some("5F012"),
        "{garbled:?}"
    );
    ensure!(
        !message(&garbled).contains(&KEYS[2..]),
        "a secret was quoted"
    );
    // A stored key the table's CHECK allows but the component cannot use.
    db.execute(
        "INSERT INTO fencecheck.keys VALUES ('report/', 3, '\\x00')",
        &[],
    )?;
    protected_catalog(&mut db, "strict")?;
    let invalid = insert(&mut db, &good, "x");
    ensure!(
        sqlstate(&invalid).as_deref() == Some("5F015"),
        "{invalid:?}"
    );
    ensure!(
        message(&invalid) == "invalid-keys: short-secret",
        "{invalid:?}"
    );
    Ok(())
}
