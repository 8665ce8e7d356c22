//! fence_check, fence_next and fence_inspect against a real server: the
//! outcomes, their SQLSTATEs, and bad inputs that must change nothing.

use crate::common::{message, server, sqlstate};
use anyhow::{Result, ensure};

/// The seed's conditional UPDATE in one statement, fenced: 0.42 applies,
/// 0.41 afterwards raises stale-fence (5F001) and changes nothing.
#[test]
fn one_statement_update_applies_then_refuses_stale() -> Result<()> {
    let (_server, mut db) = server()?;
    db.batch_execute(
        "CREATE TABLE report_catalog (report_id text PRIMARY KEY, visible_object text, fence_state bytea);
         INSERT INTO report_catalog VALUES ('report/july', 'reports/july/a', NULL);",
    )?;
    let update = "UPDATE report_catalog
                     SET visible_object = $1,
                         fence_state = fence_next(fence_state, report_id, $2, 'strict', NULL, NULL)
                   WHERE report_id = 'report/july'";
    ensure!(db.execute(update, &[&"reports/july/b9", &"0.42"])? == 1);
    let stale = db.execute(update, &[&"reports/july/a7", &"0.41"]);
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    ensure!(
        message(&stale) == "stale-fence: token 0.41 is not above the highest accepted 0.42",
        "{}",
        message(&stale)
    );
    let again = db.execute(update, &[&"reports/july/b9-again", &"0.42"]);
    ensure!(
        sqlstate(&again).as_deref() == Some("5F001"),
        "strict: one write per grant"
    );
    let row = db.query_one(
        "SELECT visible_object, (fence_inspect(fence_state)->>'version')::int FROM report_catalog",
        &[],
    )?;
    ensure!(row.get::<_, String>(0) == "reports/july/b9" && row.get::<_, i32>(1) == 1);
    Ok(())
}

/// Every decision has a name from fence_check and its own SQLSTATE from
/// fence_next: applied, stale-fence, duplicate, version-conflict.
#[test]
fn every_outcome_is_named_and_coded() -> Result<()> {
    let (_server, mut db) = server()?;
    let first: Vec<u8> = db
        .query_one(
            "SELECT fence_next(NULL, 's', '0.42', 'allow-equal', 'op-1', NULL)",
            &[],
        )?
        .get(0);
    // (token, op_id, expected_version, decision, SQLSTATE of fence_next)
    type Case<'a> = (&'a str, Option<&'a str>, Option<i64>, &'a str, &'a str);
    let cases: [Case<'_>; 5] = [
        ("0.43", None, None, "applied", ""),
        ("0.41", None, None, "stale-fence", "5F001"),
        ("0.42", Some("op-1"), None, "duplicate", "5F003"),
        ("0.42", None, Some(7), "version-conflict", "5F002"),
        ("0.42", Some("op-2"), Some(1), "applied", ""),
    ];
    for (token, op_id, expected, name, code) in cases {
        let args: [&(dyn postgres::types::ToSql + Sync); 5] =
            [&first, &token, &op_id, &expected, &"allow-equal"];
        let got: String = db
            .query_one("SELECT fence_check($1, 's', $2, $5, $3, $4)", &args)?
            .get(0);
        ensure!(got == name, "{token} {op_id:?} {expected:?}: {got}");
        let next = db.query_one("SELECT fence_next($1, 's', $2, $5, $3, $4)", &args);
        if code.is_empty() {
            ensure!(next.is_ok(), "{next:?}");
        } else {
            ensure!(sqlstate(&next).as_deref() == Some(code), "{name}: {next:?}");
            ensure!(message(&next).starts_with(name), "{}", message(&next));
        }
    }
    Ok(())
}

/// Bad inputs raise named errors with distinct SQLSTATEs, and a fenced
/// UPDATE that raises leaves the row exactly as it was.
#[test]
fn bad_inputs_raise_named_errors_and_change_nothing() -> Result<()> {
    let (_server, mut db) = server()?;
    db.batch_execute(
        "CREATE TABLE t (id text PRIMARY KEY, body text, fence_state bytea);
         INSERT INTO t VALUES ('s', 'before', fence_next(NULL, 's', '0.42', 'strict', NULL, NULL));",
    )?;
    let long_scope = "x".repeat(2048);
    let cases: Vec<(String, &str, &str)> = vec![
        (
            "fence_next(fence_state, id, 'garbage', 'strict', NULL, NULL)".into(),
            "5F004",
            "invalid-token",
        ),
        (
            "fence_next(fence_state, id, '-1.2', 'strict', NULL, NULL)".into(),
            "5F004",
            "invalid-token",
        ),
        (
            "fence_next(fence_state, id, '0.0', 'strict', NULL, NULL)".into(),
            "5F005",
            "invalid-request: missing-token",
        ),
        (
            format!("fence_next(NULL, '{long_scope}', '0.43', 'strict', NULL, NULL)"),
            "5F005",
            "invalid-request: scope-too-long",
        ),
        (
            "fence_next(fence_state, '', '0.43', 'strict', NULL, NULL)".into(),
            "5F005",
            "invalid-request: empty-scope",
        ),
        (
            "fence_next('\\x00ff'::bytea, id, '0.43', 'strict', NULL, NULL)".into(),
            "5F006",
            "corrupt-state",
        ),
        (
            "fence_next(fence_state || '\\x00'::bytea, id, '0.43', 'strict', NULL, NULL)".into(),
            "5F006",
            "corrupt-state",
        ),
        (
            "fence_next(fence_state, 'other', '0.43', 'strict', NULL, NULL)".into(),
            "5F008",
            "scope-mismatch",
        ),
        (
            "fence_next(fence_state, id, '7:0.43', 'strict', NULL, NULL)".into(),
            "5F009",
            "foreign-authority",
        ),
        (
            "fence_next(fence_state, id, NULL, 'strict', NULL, NULL)".into(),
            "5F012",
            "invalid-argument: token must be TEXT, got NULL",
        ),
        (
            "fence_next(fence_state, NULL, '0.43', 'strict', NULL, NULL)".into(),
            "5F012",
            "invalid-argument: scope must be TEXT, got NULL",
        ),
        (
            "fence_next(fence_state, id, '0.43', NULL, NULL, NULL)".into(),
            "5F012",
            "invalid-argument: policy must be TEXT, got NULL",
        ),
        (
            "fence_next(fence_state, id, '0.43', 'lenient', NULL, NULL)".into(),
            "5F012",
            "invalid-argument: policy must be",
        ),
        (
            "fence_next(fence_state, id, '0.43', 'strict', NULL, -1)".into(),
            "5F012",
            "invalid-argument: expected_version must not be negative",
        ),
        (
            "fence_next(fence_state, id, '0.43', 'strict', '', NULL)".into(),
            "5F005",
            "invalid-request: empty-op-id",
        ),
        (
            "fence_next(fence_state, id, '0.42', 'allow-equal', NULL, NULL)".into(),
            "5F005",
            "invalid-request: equal-token-unguarded",
        ),
    ];
    for (call, code, prefix) in &cases {
        let result = db.execute(
            &format!("UPDATE t SET body = 'after', fence_state = {call}"),
            &[],
        );
        ensure!(
            sqlstate(&result).as_deref() == Some(*code),
            "{call}: {result:?}"
        );
        ensure!(
            message(&result).starts_with(prefix),
            "{call}: {}",
            message(&result)
        );
    }
    // Wrong types are PostgreSQL's own refusal, before any call.
    let wrong = db.execute("UPDATE t SET fence_state = fence_next(42, id, '0.43')", &[]);
    ensure!(sqlstate(&wrong).as_deref() == Some("42883"), "{wrong:?}");
    let row = db.query_one(
        "SELECT body, fence_inspect(fence_state)->>'version' FROM t",
        &[],
    )?;
    ensure!(row.get::<_, String>(0) == "before" && row.get::<_, String>(1) == "1");
    Ok(())
}

/// fence_inspect decodes to jsonb, is NULL for NULL, and raises 5F006 on
/// damage; fence_check(NULL, …) is `applied` (no state yet).
#[test]
fn inspect_shapes() -> Result<()> {
    let (_server, mut db) = server()?;
    let row = db.query_one(
        "SELECT fence_inspect(fence_next(NULL, 'report/july', '3:1.42', 'strict', 'op', NULL))::text,
                fence_inspect(NULL) IS NULL,
                fence_check(NULL, 'report/july', '0.1')",
        &[],
    )?;
    let json: String = row.get(0);
    for part in [
        r#""scope": "report/july""#,
        r#""version": 1"#,
        r#""authority": 3"#,
        r#""op_id": "op""#,
    ] {
        ensure!(json.contains(part), "{part} in {json}");
    }
    ensure!(row.get::<_, bool>(1));
    ensure!(row.get::<_, String>(2) == "applied");
    let damaged = db.query_one("SELECT fence_inspect('\\x01'::bytea)", &[]);
    ensure!(
        sqlstate(&damaged).as_deref() == Some("5F006"),
        "{damaged:?}"
    );
    Ok(())
}

/// The functions are declared as the issue asks: IMMUTABLE and PARALLEL
/// SAFE; fence_inspect STRICT; fence_check/fence_next not (NULL state is "no
/// state yet").
#[test]
fn declared_volatility_and_strictness() -> Result<()> {
    let (_server, mut db) = server()?;
    let rows = db.query(
        "SELECT proname, provolatile::text, proparallel::text, proisstrict FROM pg_proc
          WHERE proname IN ('fence_check', 'fence_next', 'fence_inspect') ORDER BY proname, pronargs",
        &[],
    )?;
    let got: Vec<(String, String, String, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    // fence_check and fence_next twice: 6 arguments, and 7 with the keys.
    let want = [
        ("fence_check", "i", "s", false),
        ("fence_check", "i", "s", false),
        ("fence_inspect", "i", "s", true),
        ("fence_next", "i", "s", false),
        ("fence_next", "i", "s", false),
    ];
    ensure!(got.len() == want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        ensure!(
            (g.0.as_str(), g.1.as_str(), g.2.as_str(), g.3) == w,
            "{got:?}"
        );
    }
    Ok(())
}

/// fence_version() returns the WIT package version of the component built
/// into the installed extension: the WIT's, the workspace's (this test
/// crate's version). The extension cannot be handed another component, so
/// there is no refusal to test here (the runtime's tests cover it).
#[test]
fn fence_version_is_the_components() -> Result<()> {
    let (_server, mut db) = server()?;
    let row = db.query_one(
        "SELECT fence_version(), p.provolatile::text, p.proparallel::text
           FROM pg_proc p WHERE p.proname = 'fence_version'",
        &[],
    )?;
    let version: String = row.get(0);
    ensure!(version == fencecheck::WIT_VERSION, "{version}");
    ensure!(row.get::<_, String>(1) == "i" && row.get::<_, String>(2) == "s");
    Ok(())
}
