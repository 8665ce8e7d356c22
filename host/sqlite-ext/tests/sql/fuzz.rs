//! The extension fuzzed at its own interface, SQL: random calls of its
//! functions (argument counts and types, NULLs, blobs, damaged and huge
//! states, huge and odd text) and random fenced UPDATEs on a real SQLite.
//! A panic across the C ABI would abort this process (and any program that
//! loaded the extension), so getting to the end at all is half the check;
//! the rest: every error is SQLite's own or one of the extension's
//! documented names (never an internal failure), a refused statement
//! changes nothing, accepted tokens per row never go down, and
//! `fence_inspect` decodes every state the fenced writes stored. Seeded and
//! bounded (`fencecheck_tests::fuzzing`; docs/development.md, "Fuzzing the
//! hosts").

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail, ensure};
use fencecheck::SignedTokenText;
use fencecheck_tests::fuzzing::{Fuzz, shown};
use rusqlite::Connection;
use rusqlite::types::Value;

/// The names an error of the extension may start with (docs/sqlite.md, the
/// crate docs): outcomes, then bad input. `internal-error`,
/// `runtime-error` and `guest-trapped` are infrastructure failures: a
/// finding here, where every input is well within the limits.
const NAMES: [&str; 14] = [
    "invalid-token",
    "stale-fence",
    "duplicate",
    "version-conflict",
    "invalid-argument",
    "invalid-request",
    "corrupt-state",
    "unsupported-state-version",
    "scope-mismatch",
    "foreign-authority",
    "exhausted",
    "unauthenticated",
    "invalid-keys",
    "too-large",
];

const ROWS: [&str; 3] = ["report/july", "é/ü\u{200}", "r"];

/// Whether `message` is a clear error: the extension's (a documented name
/// and a colon) or SQLite's own (no such prefix: wrong argument count,
/// too big, …).
fn clear(message: &str) -> Result<()> {
    let name = message.split(':').next().unwrap_or_default();
    let ours = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
    ensure!(
        !ours || NAMES.contains(&name),
        "not a documented error: {message:?}"
    );
    ensure!(!message.is_empty(), "an error without a message");
    Ok(())
}

fn message(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(_, Some(m)) => m.clone(),
        other => other.to_string(),
    }
}

/// A random SQL value of any type.
fn value(f: &mut Fuzz, states: &[Vec<u8>]) -> Value {
    match f.below(12) {
        0 => Value::Null,
        1 => Value::Integer(f.pick(&[0, -1, 1, i64::MIN, i64::MAX, 42])),
        2 => Value::Integer(f.u64() as i64),
        3 => Value::Real(f.pick(&[0.5, -0.0, 1e308, f64::INFINITY, f64::NAN])),
        4 => Value::Text(f.text(64)),
        5 => Value::Text(f.token()),
        6 => Value::Text(f.pick(&["strict", "allow-equal", "STRICT", ""]).into()),
        7 if f.one_in(8) => Value::Text("x".repeat(1 << 20)),
        7 => Value::Blob(f.binary(64)),
        8 | 9 if !states.is_empty() => {
            let s = f.pick(states);
            Value::Blob(if f.one_in(2) { s } else { f.damage(&s) })
        }
        10 if f.one_in(8) => Value::Blob(vec![0; 1 << 20]),
        _ => Value::Text(f.pick(&ROWS).into()),
    }
}

/// A random call: a function of the extension (or not), any argument count.
fn call(f: &mut Fuzz, states: &[Vec<u8>]) -> (String, Vec<Value>) {
    let name = f.pick(&[
        "fence_next",
        "fence_next",
        "fence_check",
        "fence_check",
        "fence_inspect",
        "fence_version",
    ]);
    let n = match name {
        "fence_inspect" => [1, 1, 1, 0, 2][f.index(5)],
        "fence_version" => [0, 0, 1][f.index(3)],
        _ => [6, 6, 6, 7, 7, 5, 8, 0][f.index(8)],
    };
    let args: Vec<Value> = (0..n).map(|_| value(f, states)).collect();
    let marks = (1..=n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    (format!("SELECT {name}({marks})"), args)
}

/// Every row as (id, object, state), sorted: equal before and after a
/// statement exactly when it changed nothing.
fn snapshot(conn: &Connection) -> Result<Vec<(String, String, Vec<u8>)>> {
    let mut stmt = conn.prepare("SELECT id, v, fence_state FROM t ORDER BY id")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// (authority, epoch, counter) of a token text, if it parses.
fn order(token: &str) -> Option<(u64, u64, u64)> {
    let t = token.parse::<SignedTokenText>().ok()?.token;
    Some((t.authority, t.epoch, t.counter))
}

/// Random SQL calls of every function (argument counts and types, NULLs,
/// blobs, damaged and huge states, huge and non-ASCII text) and random
/// fenced UPDATEs: the process survives, every error is clear (SQLite's or
/// a documented name), refusals change nothing, accepted tokens per row
/// never go down, every state a fenced write stored decodes.
#[test]
fn sql_fuzz_never_crashes_and_errors_are_clear() -> Result<()> {
    let mut f = Fuzz::from_env("sqlite-sql", 50_000)?;
    let conn = super::connect()?;
    conn.execute_batch("CREATE TABLE t (id TEXT PRIMARY KEY, v TEXT, fence_state BLOB)")?;
    for id in ROWS {
        conn.execute(
            "INSERT INTO t VALUES (?1, 'first', fence_next(NULL, ?1, '0.1', 'strict', NULL, NULL))",
            [id],
        )?;
    }
    let mut states: Vec<Vec<u8>> = snapshot(&conn)?.into_iter().map(|r| r.2).collect();
    let mut accepted: BTreeMap<String, (u64, u64, u64)> =
        ROWS.iter().map(|r| (r.to_string(), (0, 0, 1))).collect();
    // Damaged rows: the good state and last accepted token to put back.
    type Saved = (Vec<u8>, Option<(u64, u64, u64)>);
    let mut saved: BTreeMap<String, Saved> = BTreeMap::new();
    let (mut calls, mut errors, mut applied) = (0u64, 0u64, 0u64);
    while f.next_input() {
        let at = f.at();
        match f.below(if saved.is_empty() { 30 } else { 10 }) {
            // A row's state damaged by a plain UPDATE (no extension), or a
            // damaged row put back as it was (else damage would pile up
            // and refuse everything).
            0 => {
                let id = f.pick(&ROWS);
                let state = snapshot(&conn)?
                    .into_iter()
                    .find(|r| r.0 == id)
                    .map(|r| r.2)
                    .unwrap_or_default();
                let (new, was) = match saved.remove(id) {
                    Some((good, last)) => (good, Some(last)),
                    None => {
                        saved.insert(id.to_string(), (state.clone(), accepted.get(id).copied()));
                        (f.damage(&state), None)
                    }
                };
                conn.execute(
                    "UPDATE t SET fence_state = ?1 WHERE id = ?2",
                    rusqlite::params![new, id],
                )?;
                match was {
                    Some(Some(last)) => {
                        accepted.insert(id.to_string(), last);
                    }
                    Some(None) => {
                        accepted.remove(id);
                    }
                    // A writer that bypassed the fence: the row's history
                    // stops until the row is put back.
                    None => {
                        accepted.remove(id);
                    }
                }
            }
            // The documented fenced UPDATE with random arguments.
            1..=5 => {
                let id = f.pick(&ROWS);
                // Mostly well-formed (near the row's last accepted token,
                // strict, no op-id or version), so writes apply and refuse.
                let token = if f.one_in(3) {
                    f.token()
                } else {
                    let (a, e, c) = accepted.get(id).copied().unwrap_or((0, 0, 1));
                    let c = (c + f.below(3)).saturating_sub(1);
                    if a == 0 {
                        format!("{e}.{c}")
                    } else {
                        format!("{a}:{e}.{c}")
                    }
                };
                let policy = if f.one_in(4) {
                    value(&mut f, &states)
                } else {
                    Value::Text("strict".into())
                };
                let op_id = if f.one_in(4) {
                    value(&mut f, &states)
                } else {
                    Value::Null
                };
                let version = if f.one_in(4) {
                    value(&mut f, &states)
                } else {
                    Value::Null
                };
                let before = snapshot(&conn)?;
                let result = conn.execute(
                    "UPDATE t SET v = ?1,
                        fence_state = fence_next(fence_state, id, ?2, ?3, ?4, ?5)
                      WHERE id = ?6",
                    rusqlite::params![format!("by {token}"), token, policy, op_id, version, id],
                );
                match result {
                    Ok(n) => {
                        ensure!(n == 1, "{at}: {n} rows");
                        let t = order(&token)
                            .with_context(|| format!("{at}: applied unparsable token {token:?}"))?;
                        if let Some(prev) = accepted.get(id) {
                            ensure!(t >= *prev, "{at}: accepted {token} on {id} after {prev:?}");
                        }
                        accepted.insert(id.to_string(), t);
                        applied += 1;
                    }
                    Err(e) => {
                        errors += 1;
                        clear(&message(&e)).context(at.clone())?;
                        ensure!(
                            snapshot(&conn)? == before,
                            "{at}: a refused UPDATE changed a row"
                        );
                    }
                }
            }
            // Any call, in a SELECT.
            _ => {
                calls += 1;
                let (sql, args) = call(&mut f, &states);
                let result = conn.query_row(&sql, rusqlite::params_from_iter(args.iter()), |r| {
                    r.get::<_, Value>(0)
                });
                match result {
                    Ok(Value::Blob(b)) if b.len() < 4096 => {
                        if states.len() < 64 {
                            states.push(b);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        errors += 1;
                        let m = message(&e);
                        clear(&m).with_context(|| {
                            format!(
                                "{at}: {sql} with {}",
                                args.iter()
                                    .map(|a| match a {
                                        Value::Text(t) => shown(t.as_bytes()),
                                        Value::Blob(b) =>
                                            format!("x'{}'", hex(&b[..b.len().min(40)])),
                                        other => format!("{other:?}"),
                                    })
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        })?;
                    }
                }
            }
        }
    }
    // Every state decodes; only a damaged one may be refused, as corrupt.
    for (id, _, state) in snapshot(&conn)? {
        let json: rusqlite::Result<String> =
            conn.query_row("SELECT fence_inspect(?1)", [&state], |r| r.get(0));
        match json {
            Ok(j) => ensure!(j.starts_with('{'), "{id}: {j}"),
            Err(e) if saved.contains_key(&id) => {
                let m = message(&e);
                ensure!(
                    ["corrupt-state", "unsupported-state-version"]
                        .iter()
                        .any(|n| m.starts_with(n)),
                    "{id}: {m}"
                );
            }
            Err(e) => bail!("{id}: a state the fence wrote does not decode: {e}"),
        }
    }
    ensure!(
        errors > 0 && applied > 0 && calls > 0,
        "{calls} calls, {errors} errors, {applied} applied: the generator misses a side"
    );
    f.finish(&format!(
        "{calls} calls, {applied} fenced updates applied, {errors} clear errors"
    ));
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
