//! The functions in SQL on a real server: the seed's paused writer, bad
//! input to every function, concurrent writers with an audit trail.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{Token, TokenText};
use mysql::prelude::Queryable;
use mysql::{Conn, params};

use crate::common::{Server, error_of};

const CATALOG: &str = "CREATE TABLE report_catalog (
    report_id      VARCHAR(200) COLLATE utf8mb4_bin PRIMARY KEY,
    visible_object VARCHAR(200) NOT NULL,
    fence_state    VARBINARY(16384) NOT NULL) ENGINE=InnoDB";

/// The one-call fenced UPDATE (docs/mariadb.md).
const PUBLISH: &str = "UPDATE report_catalog
   SET visible_object = :object,
       fence_state = fence_next(fence_state, report_id, :token, 'strict', NULL, NULL)
 WHERE report_id = :id";

fn publish(conn: &mut Conn, token: &str, object: &str) -> mysql::Result<u64> {
    conn.exec_drop(
        PUBLISH,
        params! {"object" => object, "token" => token, "id" => "report/july"},
    )?;
    Ok(conn.affected_rows())
}

fn visible(conn: &mut Conn) -> Result<String> {
    conn.query_first("SELECT visible_object FROM report_catalog WHERE report_id = 'report/july'")?
        .context("no catalog row")
}

fn setup(server: &Server) -> Result<Conn> {
    let mut conn = server.conn()?;
    conn.query_drop(CATALOG)?;
    conn.query_drop(
        "INSERT INTO report_catalog VALUES ('report/july', 'reports/july/first',
             fence_next(NULL, 'report/july', '0.40', 'strict', NULL, NULL))",
    )?;
    Ok(conn)
}

/// The seed's paused writer: writer 41 pauses holding an old grant, writer
/// 42 publishes B; writer 41 wakes and its UPDATE fails with
/// `stale-fence`, changing nothing: B stays visible, and writer 42 may
/// publish again with 43.
#[test]
fn paused_writer_is_fenced_in_sql() -> Result<()> {
    let server = Server::start()?;
    let mut setup_conn = setup(&server)?;
    let mut paused = server.conn()?;
    let mut current = server.conn()?;
    // Writer 41 was granted first and paused before its write.
    ensure!(publish(&mut current, "0.42", "reports/july/b.tmp")? == 1);
    let (code, state, message) = error_of(publish(&mut paused, "0.41", "reports/july/a.tmp"))?;
    ensure!(code == 1644 && state == "HY000", "{code} {state}");
    ensure!(
        message == "stale-fence: token 0.41 is not above the highest accepted 0.42",
        "{message}"
    );
    ensure!(visible(&mut setup_conn)? == "reports/july/b.tmp");
    // Strict: the same token twice is stale too.
    let (_, _, message) = error_of(publish(&mut current, "0.42", "reports/july/c.tmp"))?;
    ensure!(message.starts_with("stale-fence: "), "{message}");
    ensure!(publish(&mut current, "0.43", "reports/july/c.tmp")? == 1);
    ensure!(visible(&mut setup_conn)? == "reports/july/c.tmp");
    let json: String = setup_conn
        .query_first("SELECT fence_inspect(fence_state) FROM report_catalog")?
        .context("no state")?;
    ensure!(
        json.contains("\"counter\":43") && json.contains("\"version\":3"),
        "{json}"
    );
    let check: String = setup_conn
        .query_first(
            "SELECT fence_check(fence_state, report_id, '0.41', 'strict', NULL, NULL) FROM report_catalog",
        )?
        .context("no row")?;
    ensure!(check == "stale-fence");
    Ok(())
}

/// Bad input to every function (NULL, wrong types, huge values, damaged
/// and foreign states, wrong argument counts) is an error naming what is
/// wrong; the row is unchanged and the server still answers after each.
#[test]
fn bad_input_is_refused_by_name_without_a_crash() -> Result<()> {
    let server = Server::start()?;
    let mut conn = setup(&server)?;
    let before: Vec<u8> = conn
        .query_first("SELECT fence_state FROM report_catalog")?
        .context("no row")?;
    let mut damaged = before.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40;
    let cases: Vec<(String, &str)> = vec![
        ("fence_next(NULL, NULL, '0.41', 'strict', NULL, NULL)".into(), "invalid-argument: scope must be a string, got NULL"),
        ("fence_next(fence_state, report_id, NULL, 'strict', NULL, NULL)".into(), "invalid-argument: token must be a string, got NULL"),
        ("fence_next(fence_state, report_id, 42, 'strict', NULL, NULL)".into(), "invalid-argument: token must be a string, got INTEGER"),
        ("fence_next(fence_state, report_id, 4.2, 'strict', NULL, NULL)".into(), "invalid-argument: token must be a string, got DECIMAL"),
        ("fence_next(fence_state, report_id, 4.2e0, 'strict', NULL, NULL)".into(), "invalid-argument: token must be a string, got REAL"),
        ("fence_next(1, report_id, '0.41', 'strict', NULL, NULL)".into(), "invalid-argument: state must be bytes or NULL, got INTEGER"),
        ("fence_next(fence_state, report_id, '0.41', NULL, NULL, NULL)".into(), "invalid-argument: policy must be a string, got NULL"),
        ("fence_next(fence_state, report_id, '0.41', 'lenient', NULL, NULL)".into(), "invalid-argument: policy must be 'strict' or 'allow-equal'"),
        ("fence_next(fence_state, report_id, '0.41', 'strict', 5, NULL)".into(), "invalid-argument: op_id must be a string, got INTEGER"),
        ("fence_next(fence_state, report_id, '0.41', 'allow-equal', NULL, -1)".into(), "invalid-argument: expected_version must not be negative, got -1"),
        ("fence_next(fence_state, report_id, '0.41', 'allow-equal', NULL, '1')".into(), "invalid-argument: expected_version must be an INTEGER or NULL, got a string"),
        ("fence_next(fence_state, report_id, '0.41', 'allow-equal', NULL, 1.5)".into(), "invalid-argument: expected_version must be a whole number from 0 to 2^64-1, got \"1.5\""),
        ("fence_next(fence_state, report_id, '0.41', 'allow-equal', NULL, 18446744073709551616)".into(), "invalid-argument: expected_version must be a whole number"),
        ("fence_next(fence_state, report_id, '0.18446744073709551616', 'strict', NULL, NULL)".into(), "invalid-token: "),
        ("fence_next(fence_state, report_id, '+0.41', 'strict', NULL, NULL)".into(), "invalid-token: "),
        ("fence_next(fence_state, report_id, '0.0', 'strict', NULL, NULL)".into(), "invalid-request: missing-token"),
        ("fence_next(NULL, '', '0.41', 'strict', NULL, NULL)".into(), "invalid-request: empty-scope"),
        ("fence_next(fence_state, REPEAT('a', 2000000), '0.41', 'strict', NULL, NULL)".into(), "too-large: scope is 2000000 bytes"),
        ("fence_next(fence_state, REPEAT('a', 5000), '0.41', 'strict', NULL, NULL)".into(), "invalid-request: scope-too-long"),
        ("fence_next(fence_state, report_id, '0.43', 'strict', REPEAT('o', 300), NULL)".into(), "invalid-request: op-id-too-long"),
        ("fence_next(fence_state, 'report/august', '0.43', 'strict', NULL, NULL)".into(), "scope-mismatch: "),
        ("fence_next(fence_state, report_id, '7:0.43', 'strict', NULL, NULL)".into(), "foreign-authority: "),
        (format!("fence_next(x'{}', report_id, '0.43', 'strict', NULL, NULL)", hex::encode(&damaged)), "corrupt-state: checksum-mismatch"),
        ("fence_next(LEFT(fence_state, 5), report_id, '0.43', 'strict', NULL, NULL)".into(), "corrupt-state: truncated"),
        ("fence_next('', report_id, '0.43', 'strict', NULL, NULL)".into(), "corrupt-state: truncated"),
        ("fence_next(CONCAT(fence_state, REPEAT(x'00', 3000000)), report_id, '0.43', 'strict', NULL, NULL)".into(), ""),
        ("fence_next(fence_state, report_id, '0.43', 'strict', NULL, NULL, '1:zz')".into(), "invalid-argument: keys: "),
        ("fence_check(fence_state, report_id, 42, 'strict', NULL, NULL)".into(), "invalid-argument: token must be a string, got INTEGER"),
        (format!("fence_check(x'{}', report_id, '0.43', 'strict', NULL, NULL)", hex::encode(&damaged)), "corrupt-state: checksum-mismatch"),
        ("fence_inspect(1)".into(), "invalid-argument: state must be bytes or NULL, got INTEGER"),
        ("fence_inspect(LEFT(fence_state, 3))".into(), "corrupt-state: truncated"),
        (format!("fence_inspect(x'{}')", hex::encode(&damaged)), "corrupt-state: checksum-mismatch"),
    ];
    for (call, expected) in &cases {
        let update = format!(
            "UPDATE report_catalog SET visible_object = 'bad', fence_state = {call} WHERE report_id = 'report/july'"
        );
        let target = if call.starts_with("fence_next") {
            update
        } else {
            format!("SELECT {call} FROM report_catalog")
        };
        // Collect the rows: an error raised while rows are sent must surface.
        let (code, _, message) =
            error_of(conn.query::<mysql::Row, _>(&target)).with_context(|| call.clone())?;
        ensure!(code == 1644, "{call}: error {code} {message}");
        if expected.is_empty() {
            ensure!(
                ["too-large: ", "corrupt-state: "]
                    .iter()
                    .any(|p| message.starts_with(p)),
                "{call}: {message}"
            );
        } else {
            ensure!(message.starts_with(expected), "{call}: {message}");
        }
        ensure!(server.answers(), "{call}: the server stopped answering");
    }
    // Wrong argument counts are refused when the statement is prepared.
    for call in [
        "fence_next(fence_state, report_id, '0.43', 'strict', NULL)",
        "fence_check()",
        "fence_inspect(fence_state, 1)",
        "fence_version(1)",
    ] {
        let (code, _, message) =
            error_of(conn.query::<mysql::Row, _>(format!("SELECT {call} FROM report_catalog")))?;
        ensure!(code == 1123, "{call}: {code} {message}");
        ensure!(
            message.contains("invalid-argument: expected"),
            "{call}: {message}"
        );
    }
    let after: Vec<u8> = conn
        .query_first("SELECT fence_state FROM report_catalog")?
        .context("no row")?;
    ensure!(after == before, "a refused statement changed the state");
    ensure!(visible(&mut conn)? == "reports/july/first");
    let null: Option<Option<String>> = conn.query_first("SELECT fence_inspect(NULL)")?;
    ensure!(null == Some(None));
    let version: Option<String> = conn.query_first("SELECT fence_version()")?;
    ensure!(
        version.as_deref().is_some_and(|v| v.starts_with("0.")),
        "{version:?}"
    );
    Ok(())
}

/// A statement over several rows where one row is refused changes no row
/// (InnoDB rolls the statement back), and the transaction stays usable.
#[test]
fn a_refused_row_undoes_the_whole_statement() -> Result<()> {
    let server = Server::start()?;
    let mut conn = setup(&server)?;
    conn.query_drop(
        "INSERT INTO report_catalog VALUES ('report/june', 'reports/june/first',
             fence_next(NULL, 'report/june', '0.50', 'strict', NULL, NULL))",
    )?;
    conn.query_drop("START TRANSACTION")?;
    // 0.45 is above july's 0.40 but below june's 0.50.
    let result = conn.query_drop(
        "UPDATE report_catalog SET visible_object = 'x',
             fence_state = fence_next(fence_state, report_id, '0.45', 'strict', NULL, NULL)
          ORDER BY report_id DESC",
    );
    let (_, _, message) = error_of(result)?;
    ensure!(message.starts_with("stale-fence: "), "{message}");
    conn.query_drop("COMMIT")?;
    let changed: Option<i64> =
        conn.query_first("SELECT COUNT(*) FROM report_catalog WHERE visible_object = 'x'")?;
    ensure!(changed == Some(0));
    Ok(())
}

/// Eight clients publish at once through `fence_next`, each with tokens
/// from one issuer, each applied write adding an audit row in the same
/// transaction: the audit's tokens, in commit order, strictly increase;
/// every refusal is `stale-fence`; the final state's highest token is the
/// last audited one; the catalog shows the last audited object.
#[test]
fn eight_clients_audit_strictly_increasing_tokens() -> Result<()> {
    const CLIENTS: usize = 8;
    const WRITES: u64 = 25;
    let server = Server::start()?;
    let mut conn = setup(&server)?;
    conn.query_drop(
        "CREATE TABLE audit (id BIGINT AUTO_INCREMENT PRIMARY KEY,
             counter BIGINT UNSIGNED NOT NULL, client INT NOT NULL) ENGINE=InnoDB",
    )?;
    let issuer = Arc::new(AtomicU64::new(41));
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let mut handles = Vec::new();
    for client in 0..CLIENTS {
        let mut c = server.conn()?;
        let issuer = Arc::clone(&issuer);
        let barrier = Arc::clone(&barrier);
        handles.push(thread::spawn(move || -> Result<(u64, u64)> {
            barrier.wait();
            let (mut applied, mut stale) = (0, 0);
            for _ in 0..WRITES {
                let counter = issuer.fetch_add(1, Ordering::SeqCst);
                let token = TokenText(Token {
                    authority: 0,
                    epoch: 0,
                    counter,
                })
                .to_string();
                c.query_drop("START TRANSACTION")?;
                match publish(&mut c, &token, &format!("obj/{counter}")) {
                    Ok(1) => {
                        c.exec_drop(
                            "INSERT INTO audit (counter, client) VALUES (?, ?)",
                            (counter, client),
                        )?;
                        c.query_drop("COMMIT")?;
                        applied += 1;
                    }
                    Ok(n) => bail!("{n} rows changed"),
                    Err(mysql::Error::MySqlError(e)) if e.message.starts_with("stale-fence: ") => {
                        c.query_drop("ROLLBACK")?;
                        stale += 1;
                    }
                    Err(e) => bail!("client {client}: {e}"),
                }
            }
            Ok((applied, stale))
        }));
    }
    let mut applied = 0;
    for h in handles {
        let (a, _) = h.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
        applied += a;
    }
    let audit: Vec<u64> = conn.query("SELECT counter FROM audit ORDER BY id")?;
    ensure!(audit.len() as u64 == applied && applied > 0);
    let issued: Vec<(String, Token)> = audit
        .iter()
        .map(|&counter| {
            (
                "report/july".to_string(),
                Token {
                    authority: 0,
                    epoch: 0,
                    counter,
                },
            )
        })
        .collect();
    fencecheck_tests::history::check_issued(&issued)?;
    let last = *audit.last().context("empty audit")?;
    let json: String = conn
        .query_first("SELECT fence_inspect(fence_state) FROM report_catalog")?
        .context("no row")?;
    ensure!(
        json.contains(&format!("\"counter\":{last}}}")),
        "{json} vs {last}"
    );
    ensure!(
        json.contains(&format!("\"version\":{}", applied + 1)),
        "{json}"
    );
    ensure!(visible(&mut conn)? == format!("obj/{last}"));
    Ok(())
}
