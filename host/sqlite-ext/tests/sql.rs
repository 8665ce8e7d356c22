//! The extension loaded into a real SQLite (rusqlite's bundled build) and
//! driven with SQL: the one-statement fenced UPDATE, byte-for-byte agreement
//! with the native reference, errors that change nothing, determinism,
//! per-connection instances on several threads.
#![allow(unsafe_code)] // loading an extension is `unsafe` in rusqlite's API

#[path = "sql/fuzz.rs"]
mod fuzz;

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::thread;

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{Checker, Decision, Native, Policy, Request, Token, TokenText};
use rusqlite::{Connection, OptionalExtension, params};

/// The cdylib cargo built for this package in the `deps/` directory this
/// test runs from (or `FENCECHECK_SQLITE_EXT`). `cargo test` refreshes the
/// copy in `deps/` (built with the rlib this test links), not the one it
/// uplifts to `target/<profile>/` on `cargo build`.
fn extension() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("FENCECHECK_SQLITE_EXT") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe()?;
    let deps = exe.parent().context("test binary has no directory")?;
    let path = deps.join(format!(
        "{}fencecheck_sqlite_ext{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    ensure!(path.exists(), "{} not built", path.display());
    Ok(path)
}

/// An in-memory connection with the extension loaded.
fn connect() -> Result<Connection> {
    let conn = Connection::open_in_memory()?;
    let path = extension()?;
    // SAFETY: loading our own extension; it registers three pure functions.
    unsafe {
        let _guard = rusqlite::LoadExtensionGuard::new(&conn)?;
        conn.load_extension(&path, None::<&str>)?;
    }
    conn.execute_batch(
        "CREATE TABLE report_catalog (
             report_id      TEXT PRIMARY KEY,
             visible_object TEXT NOT NULL,
             fence_state    BLOB NOT NULL)",
    )?;
    Ok(conn)
}

/// The documented one-call statement: `fence_next` in SET only.
const PUBLISH: &str = "
UPDATE report_catalog
   SET visible_object = :object_key,
       fence_state = fence_next(fence_state, :report_id, :token, 'strict', NULL, NULL)
 WHERE report_id = :report_id";

/// The earlier form, `fence_check` in WHERE as well: a refusal changes no
/// row instead of raising.
const GUARDED: &str = "
UPDATE report_catalog
   SET visible_object = :object_key,
       fence_state = fence_next(fence_state, :report_id, :token, 'strict', NULL, NULL)
 WHERE report_id = :report_id
   AND fence_check(fence_state, :report_id, :token, 'strict', NULL, NULL) = 'applied'";

fn run(conn: &Connection, sql: &str, token: &str, object: &str) -> rusqlite::Result<usize> {
    conn.execute(
        sql,
        rusqlite::named_params! {":object_key": object, ":report_id": "report/july", ":token": token},
    )
}

fn publish(conn: &Connection, token: &str, object: &str) -> Result<usize> {
    Ok(run(conn, PUBLISH, token, object)?)
}

fn text(s: &str) -> rusqlite::types::Value {
    rusqlite::types::Value::Text(s.into())
}

/// The error message of a statement that must fail.
fn error_of<T: std::fmt::Debug>(result: rusqlite::Result<T>) -> Result<String> {
    match result {
        Err(e) => Ok(e.to_string()),
        Ok(value) => bail!("expected an error, got {value:?}"),
    }
}

fn catalog(conn: &Connection) -> Result<Option<(String, Vec<u8>)>> {
    Ok(conn
        .query_row(
            "SELECT visible_object, fence_state FROM report_catalog",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?)
}

fn first_row(conn: &Connection) -> Result<()> {
    conn.execute(
        "INSERT INTO report_catalog VALUES ('report/july', 'reports/july/first',
             fence_next(NULL, 'report/july', '0.40', 'strict', NULL, NULL))",
        [],
    )?;
    Ok(())
}

/// The seed's conditional update as one statement with one component call:
/// token 42 moves the pointer; the late token 41, and 42 again under
/// strict, raise stale-fence and leave B visible.
#[test]
fn one_statement_update_fences_the_catalog() -> Result<()> {
    let conn = connect()?;
    first_row(&conn)?;
    ensure!(publish(&conn, "0.42", "reports/july/b9.tmp")? == 1);
    let late = error_of(run(&conn, PUBLISH, "0.41", "reports/july/a7.tmp"))?;
    ensure!(
        late == "stale-fence: token 0.41 is not above the highest accepted 0.42",
        "{late}"
    );
    let again = error_of(run(&conn, PUBLISH, "0.42", "reports/july/again"))?;
    ensure!(again.starts_with("stale-fence: "), "strict: {again}");
    let (visible, state) = catalog(&conn)?.context("no row")?;
    ensure!(visible == "reports/july/b9.tmp", "{visible}");
    let json: String = conn.query_row("SELECT fence_inspect(?1)", [&state], |r| r.get(0))?;
    ensure!(
        json.contains("\"counter\":42") && json.contains("\"version\":2"),
        "{json}"
    );
    // The guarded two-call form still works: a refusal changes no row.
    ensure!(run(&conn, GUARDED, "0.41", "reports/july/a7.tmp")? == 0);
    ensure!(run(&conn, GUARDED, "0.43", "reports/july/c1.tmp")? == 1);
    Ok(())
}

/// `fence_next`'s arguments after the state: scope, token, policy, op-id,
/// expected version.
type OneCall = (
    &'static str,
    rusqlite::types::Value,
    &'static str,
    Option<&'static str>,
    Option<i64>,
);

/// Every refusal of the one-call statement raises an error named by its
/// outcome or error and changes nothing; afterwards the next token applies
/// (nothing was consumed).
#[test]
fn one_call_refusals_are_named_and_change_nothing() -> Result<()> {
    let conn = connect()?;
    conn.execute(
        "INSERT INTO report_catalog VALUES ('report/july', 'first',
             fence_next(NULL, 'report/july', '0.42', 'allow-equal', 'op-1', NULL))",
        [],
    )?;
    let before = catalog(&conn)?;
    let one_call = "UPDATE report_catalog SET visible_object = 'x',
             fence_state = fence_next(fence_state, ?1, ?2, ?3, ?4, ?5)
         WHERE report_id = 'report/july'";
    let cases: Vec<(OneCall, &str)> = vec![
        (
            ("report/july", text("0.41"), "strict", None, None),
            "stale-fence: token 0.41 is not above the highest accepted 0.42",
        ),
        (
            ("report/july", text("0.42"), "strict", None, None),
            "stale-fence: token 0.42 is not above the highest accepted 0.42",
        ),
        (
            (
                "report/july",
                text("0.42"),
                "allow-equal",
                Some("op-1"),
                None,
            ),
            "duplicate: this op-id was already applied (version 1)",
        ),
        (
            ("report/july", text("0.42"), "allow-equal", None, Some(7)),
            "version-conflict: expected version 7, the scope is at 1",
        ),
        (
            ("report/july", text("0.42"), "allow-equal", None, None),
            "invalid-request: equal-token-unguarded",
        ),
        (
            ("report/july", text("0.43"), "strict", Some(""), None),
            "invalid-request: empty-op-id",
        ),
        (
            ("report/july", text("0.0"), "strict", None, None),
            "invalid-request: missing-token",
        ),
        (
            ("report/july", text("0.43 "), "strict", None, None),
            "invalid-token: invalid token \"0.43 \"",
        ),
        (
            ("report/july", 43i64.into(), "strict", None, None),
            "invalid-argument: token must be TEXT, got INTEGER",
        ),
        (
            ("report/july", text("0.43"), "STRICT", None, None),
            "invalid-argument: policy must be 'strict' or 'allow-equal'",
        ),
        (
            ("report/july", text("0.43"), "allow-equal", None, Some(-1)),
            "invalid-argument: expected_version must not be negative",
        ),
        (
            ("report/july", text("7:0.43"), "strict", None, None),
            "foreign-authority: the scope is pinned to authority 0, the token is from 7",
        ),
        (
            ("report/june", text("0.43"), "strict", None, None),
            "scope-mismatch: the state belongs to scope \"report/july\"",
        ),
    ];
    for ((scope, token, policy, op_id, expected), prefix) in cases {
        let message =
            error_of(conn.execute(one_call, params![scope, token, policy, op_id, expected]))?;
        ensure!(message.starts_with(prefix), "{prefix}: {message}");
        ensure!(conn.changes() == 0, "{prefix}: a row changed");
        ensure!(catalog(&conn)? == before, "{prefix}: something changed");
    }

    // A damaged state: corrupt-state, and the damage is left as it is.
    let (_, mut state) = before.clone().context("no row")?;
    state[12] ^= 0x10;
    conn.execute("UPDATE report_catalog SET fence_state = ?1", [&state])?;
    let damaged = catalog(&conn)?;
    let message = error_of(conn.execute(
        one_call,
        params!["report/july", "0.43", "strict", None::<&str>, None::<i64>],
    ))?;
    ensure!(message == "corrupt-state: checksum-mismatch", "{message}");
    ensure!(catalog(&conn)? == damaged);
    state[12] ^= 0x10;
    conn.execute("UPDATE report_catalog SET fence_state = ?1", [&state])?;

    ensure!(
        conn.execute(
            one_call,
            params!["report/july", "0.43", "strict", None::<&str>, None::<i64>]
        )? == 1
    );
    Ok(())
}

/// A one-call UPDATE over several rows, inside a transaction, where one row
/// is refused: SQLite undoes the whole statement (also rows changed before
/// the refusal), and the transaction stays open for the caller to decide.
#[test]
fn a_refused_row_undoes_the_whole_statement() -> Result<()> {
    let mut conn = connect()?;
    conn.execute_batch(
        "CREATE TABLE many (scope TEXT PRIMARY KEY, fence_state BLOB NOT NULL);
         INSERT INTO many VALUES
             ('a', fence_next(NULL, 'a', '0.5', 'strict', NULL, NULL)),
             ('b', fence_next(NULL, 'b', '0.9', 'strict', NULL, NULL)),
             ('c', fence_next(NULL, 'c', '0.5', 'strict', NULL, NULL));",
    )?;
    let states = |conn: &Connection| -> Result<Vec<Vec<u8>>> {
        let mut stmt = conn.prepare("SELECT fence_state FROM many ORDER BY scope")?;
        let rows = stmt
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        Ok(rows)
    };
    let before = states(&conn)?;
    let tx = conn.transaction()?;
    let message = error_of(tx.execute(
        "UPDATE many SET fence_state = fence_next(fence_state, scope, '0.7', 'strict', NULL, NULL)",
        [],
    ))?;
    ensure!(
        message == "stale-fence: token 0.7 is not above the highest accepted 0.9",
        "{message}"
    );
    ensure!(!tx.is_autocommit(), "the transaction was ended");
    ensure!(states(&tx)? == before, "row a kept its change");
    tx.commit()?;
    ensure!(states(&conn)? == before);
    Ok(())
}

/// Every state fence_next returns is exactly the native reference's, over a
/// sequence mixing policies, op-ids, expected versions and authorities; every
/// outcome fence_check names is the reference's.
#[test]
fn agrees_with_the_native_reference_byte_for_byte() -> Result<()> {
    let conn = connect()?;
    let mut state: Option<Vec<u8>> = None;
    let steps: Vec<Request> = vec![
        Request::new("s", Token::new(9, 1, 1), Policy::Strict),
        Request::new("s", Token::new(9, 1, 1), Policy::AllowEqual).with_op_id("a"),
        Request::new("s", Token::new(9, 1, 1), Policy::AllowEqual).with_op_id("b"),
        Request::new("s", Token::new(9, 1, 1), Policy::AllowEqual).with_op_id("a"),
        Request::new("s", Token::new(9, 1, 2), Policy::AllowEqual).with_expected_version(3),
        Request::new("s", Token::new(9, 1, 2), Policy::AllowEqual).with_expected_version(4),
        Request::new("s", Token::new(9, 0, u64::MAX), Policy::Strict),
        Request::new("s", Token::new(9, u64::MAX, u64::MAX), Policy::Strict),
    ];
    for request in &steps {
        let token = TokenText(request.token).to_string();
        let policy = match request.policy {
            Policy::Strict => "strict",
            Policy::AllowEqual => "allow-equal",
        };
        let expected = request.expected_version.map(|v| v as i64);
        let args = params![state, request.scope, token, policy, request.op_id, expected];
        let named: String =
            conn.query_row("SELECT fence_check(?1, ?2, ?3, ?4, ?5, ?6)", args, |r| {
                r.get(0)
            })?;
        let next: rusqlite::Result<Vec<u8>> =
            conn.query_row("SELECT fence_next(?1, ?2, ?3, ?4, ?5, ?6)", args, |r| {
                r.get(0)
            });
        match Native.check(state.as_deref(), request)? {
            Ok(Decision::Applied {
                state: reference, ..
            }) => {
                ensure!(named == "applied", "{request:?}: {named}");
                ensure!(next? == reference, "{request:?}: bytes differ");
                state = Some(reference);
            }
            Ok(other) => {
                ensure!(named == other.name(), "{request:?}: {named} vs {other:?}");
                let message = next.err().map(|e| e.to_string()).unwrap_or_default();
                ensure!(message.starts_with(other.name()), "{request:?}: {message}");
            }
            Err(e) => bail!("{request:?}: reference refused: {e:?}"),
        }
    }
    Ok(())
}

/// An UPDATE without any WHERE fails on a stale token; a corrupt state
/// fails both functions; either way the row is unchanged.
#[test]
fn refused_updates_change_nothing() -> Result<()> {
    let conn = connect()?;
    first_row(&conn)?;
    ensure!(publish(&conn, "0.42", "b")? == 1);
    let before = catalog(&conn)?;
    let careless = conn.execute(
        "UPDATE report_catalog SET visible_object = 'a',
             fence_state = fence_next(fence_state, report_id, '0.41', 'strict', NULL, NULL)",
        [],
    );
    let message = careless.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(message.starts_with("stale-fence: token 0.41"), "{message}");
    ensure!(catalog(&conn)? == before);

    let (_, mut state) = before.clone().context("no row")?;
    state[12] ^= 0x10;
    let corrupt = conn.query_row(
        "SELECT fence_check(?1, 'report/july', '0.43', 'strict', NULL, NULL)",
        [&state],
        |r| r.get::<_, String>(0),
    );
    let message = corrupt.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(message == "corrupt-state: checksum-mismatch", "{message}");
    conn.execute("UPDATE report_catalog SET fence_state = ?1", [&state])?;
    let damaged = catalog(&conn)?;
    let result = publish(&conn, "0.43", "c");
    let message = result.err().map(|e| e.to_string()).unwrap_or_default();
    ensure!(message == "corrupt-state: checksum-mismatch", "{message}");
    ensure!(catalog(&conn)? == damaged);
    Ok(())
}

/// The functions are registered deterministic: SQLite accepts them in an
/// index expression and a generated column, where it refuses anything else.
#[test]
fn functions_are_deterministic() -> Result<()> {
    let conn = connect()?;
    conn.execute_batch(
        "CREATE INDEX by_version ON report_catalog (fence_inspect(fence_state));
         CREATE TABLE g (s BLOB, info TEXT GENERATED ALWAYS AS (fence_inspect(s)));",
    )?;
    let refused = conn.execute_batch("CREATE INDEX r ON report_catalog (random())");
    ensure!(
        refused.is_err(),
        "SQLite accepted a non-deterministic index"
    );
    first_row(&conn)?;
    Ok(())
}

/// Several threads, each with its own connection (and so its own instance),
/// load the extension and decide at once; all agree with the reference.
#[test]
fn connections_on_many_threads() -> Result<()> {
    const THREADS: usize = 4;
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || -> Result<Vec<u8>> {
                let conn = connect()?;
                barrier.wait();
                let mut state: Option<Vec<u8>> = None;
                for counter in 1..=50u64 {
                    let token = format!("{i}:0.{counter}");
                    state = Some(conn.query_row(
                        "SELECT fence_next(?1, 'shared/scope', ?2, 'strict', NULL, NULL)",
                        params![state, token],
                        |r| r.get(0),
                    )?);
                }
                state.context("no state")
            })
        })
        .collect();
    for (i, handle) in handles.into_iter().enumerate() {
        let got = handle
            .join()
            .map_err(|_| anyhow::anyhow!("thread panicked"))??;
        let mut reference = None;
        for counter in 1..=50u64 {
            let request = Request::new(
                "shared/scope",
                Token::new(i as u64, 0, counter),
                Policy::Strict,
            );
            if let Ok(Decision::Applied { state, .. }) =
                Native.check(reference.as_deref(), &request)?
            {
                reference = Some(state);
            }
        }
        ensure!(Some(got) == reference, "thread {i} disagrees");
    }
    Ok(())
}

/// After the connection that loaded the extension closes, a new connection
/// loads it again and works (the process-wide runtime is reused).
#[test]
fn reload_after_close() -> Result<()> {
    for round in 0..3 {
        let conn = connect()?;
        let named: String = conn.query_row(
            "SELECT fence_check(NULL, 'x', '0.1', 'strict', NULL, NULL)",
            [],
            |r| r.get(0),
        )?;
        ensure!(named == "applied", "round {round}: {named}");
        conn.close().map_err(|(_, e)| e)?;
    }
    Ok(())
}

/// The library is linked `-z nodelete` (build.rs), so closing the last
/// connection never unmaps the code that wasmtime's signal handlers and the
/// process-wide runtime point into: DT_FLAGS_1 carries DF_1_NODELETE.
#[cfg(all(
    target_os = "linux",
    target_endian = "little",
    target_pointer_width = "64"
))]
#[test]
fn library_is_never_unloaded() -> Result<()> {
    const PT_DYNAMIC: u32 = 2;
    const DT_FLAGS_1: u64 = 0x6fff_fffb;
    const DF_1_NODELETE: u64 = 0x8;
    let elf = std::fs::read(extension()?)?;
    let u16_at = |o: usize| -> Result<u64> {
        Ok(u16::from_le_bytes(elf.get(o..o + 2).context("short ELF")?.try_into()?).into())
    };
    let u32_at = |o: usize| -> Result<u64> {
        Ok(u32::from_le_bytes(elf.get(o..o + 4).context("short ELF")?.try_into()?).into())
    };
    let u64_at = |o: usize| -> Result<u64> {
        Ok(u64::from_le_bytes(
            elf.get(o..o + 8).context("short ELF")?.try_into()?,
        ))
    };
    ensure!(
        elf.starts_with(b"\x7fELF\x02\x01"),
        "not a 64-bit little-endian ELF"
    );
    let (phoff, phentsize, phnum) = (
        u64_at(0x20)? as usize,
        u16_at(0x36)? as usize,
        u16_at(0x38)?,
    );
    for i in 0..phnum as usize {
        let ph = phoff + i * phentsize;
        if u32_at(ph)? != PT_DYNAMIC as u64 {
            continue;
        }
        let (offset, size) = (u64_at(ph + 8)? as usize, u64_at(ph + 32)? as usize);
        for entry in (offset..offset + size).step_by(16) {
            match u64_at(entry)? {
                0 => break,
                DT_FLAGS_1 => {
                    ensure!(
                        u64_at(entry + 8)? & DF_1_NODELETE != 0,
                        "DF_1_NODELETE not set"
                    );
                    return Ok(());
                }
                _ => {}
            }
        }
    }
    bail!("no DT_FLAGS_1 entry: the library was not linked -z nodelete")
}

/// `fence_version()` returns the WIT package version of the component built
/// into the extension (the WIT's); it takes no arguments.
/// The extension cannot be handed another component, so there is no refusal
/// to test here (the runtime's tests cover it).
#[test]
fn fence_version_is_the_components() -> Result<()> {
    let conn = connect()?;
    let version: String = conn.query_row("SELECT fence_version()", [], |r| r.get(0))?;
    ensure!(version == fencecheck::WIT_VERSION, "{version}");
    let refused = conn.query_row("SELECT fence_version(1)", [], |r| r.get::<_, String>(0));
    ensure!(refused.is_err(), "{refused:?}");
    Ok(())
}
