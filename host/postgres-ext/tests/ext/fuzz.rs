//! The extension fuzzed at its own interface, SQL, on a real server: random
//! calls of every function it exposes (argument counts, types and names,
//! NULLs, bytea blobs real, damaged, empty and ~1 MiB, huge and odd text,
//! tokens valid, signed, overflowing and malformed, random policies, keys
//! and regclasses), random writes to fenced tables through every path the
//! docs list (UPDATE, INSERT … ON CONFLICT, DELETE with a presented token,
//! COPY, MERGE, writable CTEs, an updatable view, TRUNCATE), the documented
//! one-statement `fence_next` UPDATE on an unfenced table, states damaged
//! by a superuser where they live (the row, the tombstone) and tombstones
//! made up, signing keys, settings, DDL on scratch tables (also behind the
//! DDL guard), and text that is not UTF-8 (a SQL_ASCII database). Checked
//! after every input:
//!
//! - the server stays up: both connections keep their backend (a backend
//!   crash ends every connection), the postmaster keeps its start time, and
//!   the server log never shows a backend terminated by a signal or a
//!   crash restart;
//! - every error is a clear one: an ERROR with a SQLSTATE and a message,
//!   never class `XX` (internal, where a panic inside pgrx ends up) or `58`,
//!   never `5F900` (the component could not decide; every input is within
//!   its bounds), and every `5F…` message starts with its documented name;
//! - a refused statement changes nothing, a row of a fenced table changes
//!   only with a new state, and each new state of a scope (in its row, or
//!   its tombstone after a DELETE) decodes, names the scope, and carries an
//!   accepted token strictly above the last one (`allow-equal`: not below)
//!   with a higher version; the token column holds that token, unsigned;
//!   nothing is ever accepted over a damaged state;
//! - at the end `fence_inspect` decodes every state a fenced call wrote,
//!   and refuses every damaged one with `5F006`.
//!
//! Seeded and bounded (`fencecheck_tests::fuzzing`; docs/development.md).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::Write;

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{GrantKey, Instance, SignedTokenText, StateInfo, Token, TokenText};
use fencecheck_tests::fuzzing::{Fuzz, shown};
use postgres::types::{ToSql, Type};
use postgres::{Client, GenericClient, Row};

use crate::common::{KEYS, PgServer, SECRET, server};

/// Inputs per run: 17-50 s in the release profile on a 2-core machine
/// (idle to busy).
const INPUTS: u64 = 12_000;

/// The extension's SQLSTATEs and the names their messages start with
/// (docs/postgres.md, src/sqlstate.rs).
const OURS: [(&str, &str); 17] = [
    ("5F001", "stale-fence"),
    ("5F002", "version-conflict"),
    ("5F003", "duplicate"),
    ("5F004", "invalid-token"),
    ("5F005", "invalid-request"),
    ("5F006", "corrupt-state"),
    ("5F007", "unsupported-state-version"),
    ("5F008", "scope-mismatch"),
    ("5F009", "foreign-authority"),
    ("5F010", "exhausted"),
    ("5F011", "fence-required"),
    ("5F012", "invalid-argument"),
    ("5F013", "too-large"),
    ("5F014", "unauthenticated"),
    ("5F015", "invalid-keys"),
    ("5F016", "unsound-fence"),
    ("5F900", "runtime-error"),
];

/// What the server log says when a backend died (and the postmaster
/// restarted every other one) or an assertion failed.
const CRASH_LINES: [&str; 6] = [
    "terminated by signal",
    "terminating any other active server processes",
    "all server processes terminated",
    "exited with exit code",
    "PANIC:",
    "TRAP:",
];

/// The scopes most writes go to: ASCII, multi-byte, controls, `%`.
const SCOPES: [&str; 5] = [
    "report/july",
    "r",
    "é/ü\u{100}",
    "\u{1}\u{7f}\u{a0}",
    "r/%s\u{ff0a}",
];

/// The tables and everything the test makes: `fz` fenced `strict`, `fq`
/// fenced `allow-equal` (varchar columns), `plain` written only by the
/// documented `fence_next` UPDATE, scratch tables for `fence_protect`, DDL
/// and unmodelled writes, and the writer role `w`.
const SETUP: &str = r#"
CREATE TABLE fz (id text PRIMARY KEY, v text, tok text, st bytea);
SELECT fence_protect('fz', 'id', 'tok', 'st');
CREATE TABLE fq (id varchar(2000) PRIMARY KEY, v text, tok varchar, st bytea);
SELECT fence_protect('fq', 'id', 'tok', 'st', 'allow-equal');
CREATE VIEW fz_view AS SELECT id, v, tok FROM fz;
CREATE TABLE plain (id text PRIMARY KEY, v text, st bytea);
CREATE TABLE s1 (id text PRIMARY KEY, v text, tok text, st bytea);
SELECT fence_protect('s1', 'id', 'tok', 'st');
CREATE VIEW s1_view AS SELECT id, v, tok FROM s1;
CREATE TABLE s2 (id text, v int, tok int, st text);
CREATE TABLE s3 (id text UNIQUE DEFERRABLE, v text, tok text, st bytea);
CREATE UNLOGGED TABLE s4 (id text PRIMARY KEY, v text, tok text, st bytea);
CREATE TABLE s5 (id text, v text, tok text, st bytea) PARTITION BY LIST (id);
CREATE TABLE s5a PARTITION OF s5 FOR VALUES IN ('a');
CREATE TABLE s6 (id varchar(10) COLLATE "C" PRIMARY KEY, v text, tok varchar, st bytea,
                 g text GENERATED ALWAYS AS (v || 'g') STORED);
CREATE SEQUENCE sq;
CREATE FUNCTION s_noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
CREATE ROLE w LOGIN;
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO w;
"#;

/// Database `ascii` (SQL_ASCII, where text holds any bytes but NUL): the
/// extension and a fenced table, to present text that is not UTF-8.
const ASCII_SETUP: &str = "
CREATE EXTENSION fencecheck;
CREATE TABLE fa (id text PRIMARY KEY, v text, tok text, st bytea);
SELECT fence_protect('fa', 'id', 'tok', 'st');
INSERT INTO fa (id, v, tok) VALUES ('a', 'first', '0.1');
";

/// Statements on the scratch tables: fencing them, and DDL the guard
/// judges (types, keys, triggers, inheritance, ownership, rules).
const DDL: [&str; 34] = [
    "SELECT fence_protect('s1', 'id', 'tok', 'st')",
    "SELECT fence_protect('s1', 'id', 'v', 'st', 'allow-equal')",
    "SELECT fence_unprotect('s1')",
    "SELECT fence_protect('s6', 'id', 'tok', 'st')",
    "SELECT fence_unprotect('s6')",
    "SELECT fence_protect('s3', 'id', 'tok', 'st')",
    "SELECT fence_protect('s4', 'id', 'tok', 'st')",
    "SELECT fence_protect('s5', 'id', 'tok', 'st')",
    "SELECT fence_protect('s2', 'id', 'tok', 'st')",
    "ALTER TABLE s1 ALTER COLUMN tok TYPE varchar",
    "ALTER TABLE s1 ALTER COLUMN tok TYPE text",
    "ALTER TABLE s1 ALTER COLUMN st TYPE text USING encode(st, 'hex')",
    "ALTER TABLE s1 RENAME COLUMN tok TO tok2",
    "ALTER TABLE s1 RENAME COLUMN tok2 TO tok",
    "ALTER TABLE s1 DROP CONSTRAINT s1_pkey",
    "ALTER TABLE s1 ADD PRIMARY KEY (id)",
    "ALTER TABLE s1 ADD COLUMN x int",
    "ALTER TABLE s1 DROP COLUMN x",
    "ALTER TABLE s1 SET UNLOGGED",
    "ALTER TABLE s1 SET LOGGED",
    "CREATE TABLE s1c () INHERITS (s1)",
    "DROP TABLE IF EXISTS s1c",
    "CREATE TRIGGER a_before BEFORE UPDATE ON s1 FOR EACH ROW EXECUTE FUNCTION s_noop()",
    "CREATE TRIGGER zzz_late BEFORE INSERT ON s1 FOR EACH ROW EXECUTE FUNCTION s_noop()",
    "DROP TRIGGER IF EXISTS a_before ON s1",
    "ALTER TABLE s1 DISABLE TRIGGER zz_fencecheck_row",
    "ALTER TABLE s1 ENABLE TRIGGER ALL",
    "DROP TRIGGER zz_fencecheck_row ON s1",
    "CREATE TRIGGER t_row BEFORE INSERT ON s6 FOR EACH ROW EXECUTE FUNCTION fencecheck.row_trigger('id', 'tok', 'st', 'strict')",
    "CREATE UNIQUE INDEX IF NOT EXISTS s1_id ON s1 (id)",
    "ALTER TABLE s1 ALTER COLUMN id TYPE text COLLATE \"C\"",
    "CREATE RULE r1 AS ON UPDATE TO s1 DO INSTEAD NOTHING",
    "ALTER TABLE s1 OWNER TO w",
    "DROP TABLE IF EXISTS s1 CASCADE; CREATE TABLE s1 (id text PRIMARY KEY, v text, tok text, st bytea); \
     CREATE VIEW s1_view AS SELECT id, v, tok FROM s1; \
     GRANT SELECT, INSERT, UPDATE, DELETE ON s1, s1_view TO w; SELECT fence_protect('s1', 'id', 'tok', 'st')",
];

/// What a superuser can do behind the DDL guard (its event triggers
/// disabled): fencecheck's trigger functions where fence_protect did not
/// put them, with other arguments, events, timing or levels, and the
/// registry edited by hand. Writes to those tables must fail closed.
const BEHIND_THE_GUARD: [&str; 14] = [
    "DROP TRIGGER zz_fencecheck_row ON s1; CREATE TRIGGER zz_fencecheck_row AFTER INSERT OR UPDATE OR DELETE \
     ON s1 FOR EACH ROW EXECUTE FUNCTION fencecheck.row_trigger('id', 'tok', 'st', 'strict')",
    "DROP TRIGGER zz_fencecheck_row ON s1; CREATE TRIGGER zz_fencecheck_row BEFORE INSERT OR UPDATE OR DELETE \
     ON s1 FOR EACH STATEMENT EXECUTE FUNCTION fencecheck.row_trigger('id', 'tok', 'st', 'strict')",
    "DROP TRIGGER zz_fencecheck_row ON s1; CREATE TRIGGER zz_fencecheck_row BEFORE INSERT OR UPDATE OR DELETE \
     ON s1 FOR EACH ROW EXECUTE FUNCTION fencecheck.row_trigger('v', 'tok', 'st', 'bogus')",
    "CREATE TRIGGER a_fence BEFORE INSERT OR UPDATE ON s1 FOR EACH ROW EXECUTE FUNCTION fencecheck.row_trigger()",
    "CREATE TRIGGER a_fence BEFORE INSERT OR UPDATE ON s1 FOR EACH ROW EXECUTE FUNCTION fencecheck.row_trigger('id', 'tok')",
    "CREATE TRIGGER a_fence BEFORE INSERT OR DELETE ON s1 FOR EACH ROW \
     EXECUTE FUNCTION fencecheck.inserted_trigger('id', 'tok', 'st', 'strict')",
    "CREATE TRIGGER a_fence BEFORE INSERT ON s1 FOR EACH ROW EXECUTE FUNCTION fencecheck.truncate_trigger()",
    "CREATE TRIGGER a_fence BEFORE UPDATE ON s1 FOR EACH ROW EXECUTE FUNCTION fencecheck.keys_changed()",
    "CREATE TRIGGER a_fence INSTEAD OF INSERT OR UPDATE OR DELETE ON s1_view FOR EACH ROW \
     EXECUTE FUNCTION fencecheck.row_trigger('id', 'tok', 'st', 'strict')",
    "CREATE TRIGGER a_fence BEFORE INSERT OR UPDATE ON s2 FOR EACH ROW \
     EXECUTE FUNCTION fencecheck.row_trigger('id', 'tok', 'st', 'strict')",
    "INSERT INTO fencecheck.protected VALUES ('s2', 'id', 'tok', 'st', 'strict') ON CONFLICT DO NOTHING",
    "DELETE FROM fencecheck.protected WHERE relid = 's1'::regclass",
    "ALTER TABLE s1 ALTER COLUMN st TYPE text USING encode(st, 'hex')",
    "DROP TRIGGER IF EXISTS a_fence ON s1; DROP TRIGGER IF EXISTS a_fence ON s2; \
     DROP TRIGGER IF EXISTS a_fence ON s1_view; DELETE FROM fencecheck.protected WHERE relid = 's2'::regclass",
];

/// Calls every run makes first, whatever the seed: relations that do not
/// exist (OID 0, an unused OID), where `fencecheck.unfit` once closed a
/// NULL relation and took the server down.
const EDGES: [&str; 12] = [
    "SELECT fencecheck.unfit(0::oid::regclass, 'id', 'tok', 'st')",
    "SELECT fencecheck.unfit(4294967295::oid::regclass, 'id', 'tok', 'st')",
    "SELECT fencecheck.unsound(0::oid::regclass)",
    "SELECT fencecheck.unsound(4294967295::oid::regclass)",
    "SELECT fencecheck.trigger_trouble(0::oid::regclass, true, NULL)",
    "SELECT fencecheck.trigger_trouble(4294967295::oid::regclass, false, 'zz_fencecheck_row')",
    "SELECT fencecheck.forget(4294967295)",
    "SELECT fence_protect(4294967295::oid::regclass, 'id', 'tok', 'st')",
    "SELECT fence_unprotect(4294967295::oid::regclass)",
    "SELECT fence_protect(NULL, NULL, NULL, NULL, NULL)",
    "SELECT fence_check(NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "SELECT fence_next(NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
];

/// Every function the extension's SQL declares, with its arguments' names
/// and types (sql/fencecheck.sql, sql/protect.sql).
type Signature = (&'static str, &'static [(&'static str, &'static str)]);
const CHECK_ARGS: &[(&str, &str)] = &[
    ("state", "bytea"),
    ("scope", "text"),
    ("token", "text"),
    ("policy", "text"),
    ("op_id", "text"),
    ("expected_version", "int8"),
    ("keys", "text"),
];
const FUNCTIONS: [Signature; 22] = [
    ("fence_check", CHECK_ARGS),
    ("fence_next", CHECK_ARGS),
    ("fence_inspect", &[("state", "bytea")]),
    ("fence_version", &[]),
    (
        "fence_protect",
        &[
            ("tbl", "regclass"),
            ("scope_column", "text"),
            ("token_column", "text"),
            ("state_column", "text"),
            ("policy", "text"),
        ],
    ),
    ("fence_unprotect", &[("tbl", "regclass")]),
    ("fencecheck.metrics", &[]),
    ("fencecheck.decision_counts", &[]),
    ("fencecheck.decision_coverage", &[]),
    (
        "fencecheck.unfit",
        &[
            ("tbl", "regclass"),
            ("scope_column", "text"),
            ("token_column", "text"),
            ("state_column", "text"),
        ],
    ),
    (
        "fencecheck.trigger_trouble",
        &[("tbl", "regclass"), ("complete", "bool"), ("just", "name")],
    ),
    ("fencecheck.unsound", &[("tbl", "regclass")]),
    ("fencecheck.forget", &[("tbl", "oid")]),
    (
        "fencecheck.protect",
        &[
            ("tbl", "regclass"),
            ("scope_column", "text"),
            ("token_column", "text"),
            ("state_column", "text"),
            ("policy", "text"),
            ("caller", "oid"),
        ],
    ),
    (
        "fencecheck.unprotect",
        &[("tbl", "regclass"), ("caller", "oid")],
    ),
    ("fencecheck.row_trigger", &[]),
    ("fencecheck.truncate_trigger", &[]),
    ("fencecheck.inserted_trigger", &[]),
    ("fencecheck.keys_changed", &[]),
    ("fencecheck.guard", &[]),
    ("fencecheck.on_drop", &[]),
    // Not a function: the counters' view, read like one.
    ("* FROM fencecheck.decisions", &[]),
];

/// The functions that change how a table is fenced: the superuser calls
/// them only on scratch tables (on `fz` they would be the owner's own,
/// legitimate change of the fence the run checks).
const FENCING: [&str; 4] = [
    "fence_protect",
    "fence_unprotect",
    "fencecheck.protect",
    "fencecheck.unprotect",
];

/// (table, scope): one fence the run follows.
type Key = (String, String);

/// A row as the run last saw it: (v, tok).
type RowSeen = Option<(Option<String>, Option<String>)>;

/// A scope as the server holds it now: its row (if any) and its state (the
/// row's, or its tombstone's after a DELETE).
#[derive(Clone, Debug, Default, PartialEq)]
struct Seen {
    row: RowSeen,
    state: Option<Vec<u8>>,
}

/// What the run knows of one scope.
#[derive(Clone, Debug, Default)]
struct Mark {
    row: RowSeen,
    /// The last state a fenced write stored, its token and version.
    state: Option<Vec<u8>>,
    highest: Option<Token>,
    version: u64,
    /// The bytes a superuser stored over `state`, until repaired.
    damaged: Option<Vec<u8>>,
}

/// A statement and its bind parameters.
#[derive(Default)]
struct Sql {
    text: String,
    params: Vec<Box<dyn ToSql + Sync>>,
    /// The parameters, shortened, for a finding's message.
    shown: Vec<String>,
}

impl Sql {
    /// A new parameter cast to `cast`; returns its placeholder.
    fn bind<T: ToSql + Sync + std::fmt::Debug + 'static>(
        &mut self,
        value: T,
        cast: &str,
    ) -> String {
        // At most ~100 characters of the value, without formatting all of
        // a 1 MiB blob first.
        struct Bounded(String);
        impl std::fmt::Write for Bounded {
            fn write_str(&mut self, s: &str) -> std::fmt::Result {
                if self.0.len() >= 100 {
                    return Err(std::fmt::Error);
                }
                self.0.push_str(s);
                Ok(())
            }
        }
        let mut shown = Bounded(String::new());
        let _ = std::fmt::Write::write_fmt(&mut shown, format_args!("{value:?}"));
        self.shown.push(shown.0.chars().take(100).collect());
        self.params.push(Box::new(value));
        format!("${}::{cast}", self.params.len())
    }

    fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params
            .iter()
            .map(|p| &**p as &(dyn ToSql + Sync))
            .collect()
    }
}

/// One argument of a call: SQL text, or a typed bind parameter.
enum Arg {
    Lit(String),
    Bytea(Vec<u8>),
    Text(String, &'static str),
    Int(i64, &'static str),
    Float(f64),
    Bool(bool),
    Oid(u32, &'static str),
}

impl Arg {
    fn null() -> Arg {
        Arg::Lit("NULL".into())
    }

    fn place(self, sql: &mut Sql) -> String {
        match self {
            Arg::Lit(s) => s,
            Arg::Bytea(b) => sql.bind(b, "bytea"),
            Arg::Text(s, cast) => sql.bind(s, cast),
            Arg::Int(v, "int4") => sql.bind(v as i32, "int4"),
            Arg::Int(v, "int2") => sql.bind(v as i16, "int2"),
            Arg::Int(v, _) => sql.bind(v, "int8"),
            Arg::Float(v) => sql.bind(v, "float8"),
            Arg::Bool(b) => sql.bind(b, "bool"),
            Arg::Oid(o, cast) => sql.bind(o, cast),
        }
    }
}

/// What one input sends.
enum Stmt {
    Exec(Sql),
    Query(Sql),
    Copy(String, Vec<u8>),
    Batch(String),
    Many(Vec<Stmt>),
}

/// One input: who sends it, the settings it presents, the statement.
struct Plan {
    admin: bool,
    /// Sent to the SQL_ASCII database (where text can be any bytes).
    ascii: bool,
    /// `set_config(name, value, false)` before the transaction: a setting
    /// from an earlier transaction, which a fenced write must ignore.
    session: Vec<(String, String)>,
    /// `set_config(name, value, true)` in the statement's transaction.
    local: Vec<(String, String)>,
    tx: bool,
    stmt: Stmt,
    /// The plain table's write was under `strict`.
    strict_plain: bool,
    /// The function called, for checking what it returned.
    call: Option<&'static str>,
    keys_changed: bool,
    /// What kind of input, for the summary.
    kind: &'static str,
}

impl Plan {
    fn new(admin: bool, stmt: Stmt) -> Plan {
        Plan {
            admin,
            ascii: false,
            session: Vec::new(),
            local: Vec::new(),
            tx: false,
            stmt,
            strict_plain: false,
            call: None,
            keys_changed: false,
            kind: "",
        }
    }
}

fn run<C: GenericClient>(c: &mut C, stmt: &Stmt) -> Result<Vec<Row>, postgres::Error> {
    match stmt {
        Stmt::Exec(sql) => c
            .execute(sql.text.as_str(), &sql.refs())
            .map(|_| Vec::new()),
        Stmt::Query(sql) => c.query(sql.text.as_str(), &sql.refs()),
        Stmt::Copy(sql, data) => {
            let mut writer = c.copy_in(sql.as_str())?;
            // A refused row ends the COPY early; finish reports why.
            let _ = writer.write_all(data);
            writer.finish().map(|_| Vec::new())
        }
        Stmt::Batch(sql) => c.batch_execute(sql).map(|_| Vec::new()),
        Stmt::Many(stmts) => {
            let mut rows = Vec::new();
            for s in stmts {
                rows = run(c, s)?;
            }
            Ok(rows)
        }
    }
}

fn execute(c: &mut Client, plan: &Plan) -> Result<Vec<Row>, postgres::Error> {
    let set = "SELECT pg_catalog.set_config($1, $2, $3)";
    for (name, value) in &plan.session {
        c.execute(set, &[name, value, &false])?;
    }
    if !plan.tx {
        return run(c, &plan.stmt);
    }
    let mut tx = c.transaction()?;
    for (name, value) in &plan.local {
        tx.execute(set, &[name, value, &true])?;
    }
    let rows = run(&mut tx, &plan.stmt)?;
    tx.commit()?;
    Ok(rows)
}

/// The SQLSTATE of a clear error; a finding for anything else.
fn judge(e: &postgres::Error) -> Result<String> {
    let Some(db) = e.as_db_error() else {
        bail!("an error without a SQLSTATE (is the backend gone?): {e}");
    };
    let (code, message) = (db.code().code(), db.message());
    let shown_message = shown(message.as_bytes());
    ensure!(
        db.severity() == "ERROR",
        "{code} at severity {}: {shown_message}",
        db.severity()
    );
    ensure!(!message.is_empty(), "{code} without a message");
    ensure!(
        !code.starts_with("XX") && !code.starts_with("58"),
        "internal error {code}: {shown_message}"
    );
    if code.starts_with("5F") {
        let name = OURS
            .iter()
            .find(|(c, _)| *c == code)
            .map(|(_, n)| *n)
            .with_context(|| format!("undocumented SQLSTATE {code}: {shown_message}"))?;
        ensure!(
            code != "5F900",
            "runtime-error (the component could not decide): {shown_message}"
        );
        ensure!(
            message.starts_with(&format!("{name}: ")),
            "{code}'s message does not start with {name:?}: {shown_message}"
        );
    }
    Ok(code.to_string())
}

fn crash_line(log: &str) -> Option<String> {
    log.lines()
        .find(|l| CRASH_LINES.iter().any(|p| l.contains(p)))
        .map(str::to_string)
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A COPY text-format field.
fn field(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('\t', "\\t")
        .replace('\n', "\\n")
        .replace('\r', "\\r")
}

/// Random text without NUL (which PostgreSQL's text refuses before the
/// extension sees it).
fn text(f: &mut Fuzz, max: usize) -> String {
    f.text(max).replace('\0', "\u{1}")
}

/// Decode a state with the same component, outside the server.
fn decode(guest: &mut Instance, state: &[u8]) -> Result<Option<StateInfo>> {
    Ok(guest.inspect(state)?.ok())
}

struct Run {
    f: Fuzz,
    server: PgServer,
    /// The superuser: damages states, manages keys, DDL, observes.
    db: Client,
    /// The writer role: SELECT, INSERT, UPDATE, DELETE.
    w: Client,
    /// The superuser in database `ascii` (SQL_ASCII: text of any bytes).
    ascii: Client,
    pids: (i32, i32, i32),
    started: String,
    guest: Instance,
    marks: BTreeMap<Key, Mark>,
    /// Real states, for arguments and damage.
    pool: Vec<Vec<u8>>,
    /// Every state a fenced call wrote, for `fence_inspect` at the end.
    written: HashSet<Vec<u8>>,
    key_prefixes: Vec<String>,
    /// pg_class's relations but the modelled tables, for regclass arguments.
    oids: Vec<u32>,
    /// The modelled tables' relations (the writer's arguments only).
    own_oids: Vec<u32>,
    w_oid: u32,
    codes: BTreeMap<String, u64>,
    /// Per kind of input: (sent, succeeded).
    kinds: BTreeMap<&'static str, (u64, u64)>,
    applied: u64,
    damaged: u64,
}

impl Run {
    fn start(f: Fuzz) -> Result<Run> {
        let (server, mut db) = server()?;
        db.batch_execute(SETUP)?;
        for scope in SCOPES {
            for table in ["fz", "fq"] {
                db.execute(
                    &format!("INSERT INTO {table} (id, v, tok) VALUES ($1, 'first', '0.1')"),
                    &[&scope],
                )?;
            }
            db.execute(
                "INSERT INTO plain VALUES ($1, 'first', fence_next(NULL, $1, '0.1', 'strict', NULL, NULL))",
                &[&scope],
            )?;
        }
        let mut oids = Vec::new();
        let mut own_oids = Vec::new();
        for row in db.query(
            "SELECT oid::int8, relname IN ('fz', 'fq', 'plain') FROM pg_class",
            &[],
        )? {
            let oid = u32::try_from(row.try_get::<_, i64>(0)?)?;
            if row.try_get::<_, bool>(1)? {
                own_oids.push(oid);
            } else {
                oids.push(oid);
            }
        }
        let w_oid = u32::try_from(
            db.query_one("SELECT oid::int8 FROM pg_roles WHERE rolname = 'w'", &[])?
                .try_get::<_, i64>(0)?,
        )?;
        let mut w = server.client_as("w")?;
        db.batch_execute(
            "CREATE DATABASE ascii TEMPLATE template0 ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'",
        )?;
        let mut ascii = Client::connect(
            &server.url().replace("dbname=postgres", "dbname=ascii"),
            postgres::NoTls,
        )?;
        ascii.batch_execute(ASCII_SETUP)?;
        let started: String = db
            .query_one("SELECT pg_postmaster_start_time()::text", &[])?
            .try_get(0)?;
        let pids = (
            db.query_one("SELECT pg_backend_pid()", &[])?.try_get(0)?,
            w.query_one("SELECT pg_backend_pid()", &[])?.try_get(0)?,
            ascii
                .query_one("SELECT pg_backend_pid()", &[])?
                .try_get(0)?,
        );
        let guest = fencecheck_tests::runtime()?.instance()?;
        let mut run = Run {
            f,
            server,
            db,
            w,
            ascii,
            pids,
            started,
            guest,
            marks: BTreeMap::new(),
            pool: Vec::new(),
            written: HashSet::new(),
            key_prefixes: Vec::new(),
            oids,
            own_oids,
            w_oid,
            codes: BTreeMap::new(),
            kinds: BTreeMap::new(),
            applied: 0,
            damaged: 0,
        };
        run.check("setup", false, true)?;
        for edge in EDGES {
            for admin in [false, true] {
                let mut plan = Plan::new(admin, Stmt::Batch(edge.into()));
                plan.kind = "edge";
                run.send(&format!("edge case {edge:?}"), &plan)?;
            }
        }
        run.alive()?;
        Ok(run)
    }

    // ---- values ----------------------------------------------------------

    fn scope(&mut self) -> String {
        match self.f.below(40) {
            0 => text(&mut self.f, 40),
            // Over the component's 1024-byte limit.
            1 => "x".repeat(1025),
            // Over the extension's 1 MiB copy bound.
            2 if self.f.one_in(4) => "y".repeat((1 << 20) + 1),
            3 => String::new(),
            _ => self.f.pick(&SCOPES).into(),
        }
    }

    /// A scope of `table` that has a row now, or any scope.
    fn row_scope(&mut self, table: &str) -> String {
        let rows: Vec<&String> = self
            .marks
            .iter()
            .filter(|(k, m)| k.0 == table && m.row.is_some())
            .map(|(k, _)| &k.1)
            .collect();
        if rows.is_empty() || self.f.one_in(4) {
            return self.scope();
        }
        rows[self.f.index(rows.len())].clone()
    }

    /// A scope of `table` whose row was deleted (its mark in a tombstone),
    /// or one with a row, or any scope: what an INSERT goes to.
    fn new_scope(&mut self, table: &str) -> String {
        let gone: Vec<&String> = self
            .marks
            .iter()
            .filter(|(k, m)| k.0 == table && m.row.is_none())
            .map(|(k, _)| &k.1)
            .collect();
        if gone.is_empty() || self.f.one_in(3) {
            return self.row_scope(table);
        }
        gone[self.f.index(gone.len())].clone()
    }

    /// A token close to the scope's highest accepted one: just below,
    /// equal, or above.
    fn near(&mut self, key: &Key) -> Token {
        let mut t = self
            .marks
            .get(key)
            .and_then(|m| m.highest)
            .unwrap_or_default();
        match self.f.below(8) {
            0 => t.counter = t.counter.saturating_sub(1),
            1 => {}
            2 => {
                t.epoch = t.epoch.saturating_add(1);
                t.counter = 0;
            }
            3 => t.counter = t.counter.saturating_add(2),
            _ => t.counter = t.counter.saturating_add(1),
        }
        t
    }

    /// `token` signed for `scope` by key 3 (sometimes tampered with).
    fn signed(&mut self, scope: &str, token: Token) -> String {
        let key = GrantKey {
            key_id: 3,
            secret: SECRET.to_vec(),
        };
        match self.guest.sign(scope, token, "lease-1", &key) {
            Ok(Ok(signature)) => {
                let text = SignedTokenText {
                    token,
                    signature: Some(signature),
                }
                .to_string();
                if self.f.one_in(8) {
                    let damaged = self.f.damage(text.as_bytes());
                    String::from_utf8_lossy(&damaged).replace('\0', "\u{1}")
                } else {
                    text
                }
            }
            _ => TokenText(token).to_string(),
        }
    }

    fn requires_keys(&self, scope: &str) -> bool {
        self.key_prefixes
            .iter()
            .any(|p| scope.starts_with(p.as_str()))
    }

    /// A token for a write to `key`: near its highest (signed where the
    /// scope has keys), or any token text.
    fn token_for(&mut self, key: &Key) -> String {
        let keyed = self.requires_keys(&key.1);
        let pick = self.f.below(10);
        if pick < 5 || (keyed && pick < 8) {
            let t = self.near(key);
            if keyed || self.f.one_in(8) {
                return self.signed(&key.1.clone(), t);
            }
            return TokenText(t).to_string();
        }
        if self.f.one_in(60) {
            return "9".repeat((1 << 20) + 1);
        }
        self.f.token().replace('\0', "\u{1}")
    }

    /// A bytea argument: a real state, a damaged one, empty, random, or
    /// about 1 MiB.
    fn state_arg(&mut self) -> Vec<u8> {
        match self.f.below(10) {
            0..=2 if !self.pool.is_empty() => self.f.pick(&self.pool),
            3 | 4 if !self.pool.is_empty() => {
                let s = self.f.pick(&self.pool);
                self.f.damage(&s)
            }
            5 => Vec::new(),
            6 if self.f.one_in(6) => self.f.bytes(1 << 20),
            7 if self.f.one_in(6) => {
                let mut s = self.pool.first().cloned().unwrap_or_default();
                s.resize(1 << 20, 0);
                s
            }
            _ => self.f.binary(64),
        }
    }

    /// A literal in the statement's text.
    fn literal(&mut self) -> String {
        match self.f.below(20) {
            0 => "NULL".into(),
            1 => "NULL::bytea".into(),
            2 => "''".into(),
            3 => "'\\x'::bytea".into(),
            4 => "'\\xzz'::bytea".into(),
            5 if self.f.one_in(4) => "decode(repeat('ab', 600000), 'hex')".into(),
            6 if self.f.one_in(4) => "repeat('é', 600000)".into(),
            7 => quote(&text(&mut self.f, 30)),
            8 => quote(&self.f.token().replace('\0', "\u{1}")),
            9 => format!("{}", self.f.u64() as i64),
            10 => "9223372036854775808".into(),
            11 => "'NaN'::float8".into(),
            12 => "true".into(),
            13 => "'{}'::jsonb".into(),
            14 => "ARRAY[1, 2]".into(),
            15 => "ROW(1, 'a')".into(),
            16 => "(SELECT st FROM fz ORDER BY id LIMIT 1)".into(),
            17 => "chr(0)".into(),
            18 => "U&'\\0000'".into(),
            _ => "$$strict$$".into(),
        }
    }

    /// A regclass argument; the superuser's never names a modelled table.
    fn table_arg(&mut self, admin: bool) -> Arg {
        const NAMES: [&str; 18] = [
            "s1",
            "s2",
            "s3",
            "s4",
            "s5",
            "s5a",
            "s6",
            "sq",
            "fz_view",
            "fz_pkey",
            "fencecheck.keys",
            "fencecheck.tombstones",
            "fencecheck.protected",
            "pg_class",
            "pg_toast.pg_toast_2619",
            "nonexistent",
            "\"S1\"",
            "1",
        ];
        match self.f.below(6) {
            0 => {
                let oid = match self.f.below(4) {
                    0 => self.f.u64() as u32,
                    1 if !admin && !self.own_oids.is_empty() => self.f.pick(&self.own_oids),
                    _ => self.f.pick(&self.oids),
                };
                Arg::Oid(oid, "oid::regclass")
            }
            1 if !admin => Arg::Text(
                self.f.pick(&["fz", "fq", "plain", "public.fz"]).into(),
                "text::regclass",
            ),
            2 => Arg::Text(text(&mut self.f, 12), "text::regclass"),
            3 => Arg::Lit(quote(self.f.pick(&NAMES))),
            _ => Arg::Text(self.f.pick(&NAMES).into(), "text::regclass"),
        }
    }

    /// A random value of any type.
    fn any_arg(&mut self) -> Arg {
        match self.f.below(12) {
            0 => Arg::Lit(self.literal()),
            1 => Arg::null(),
            2 => Arg::Bytea(self.f.binary(64)),
            3 => Arg::Bytea(self.state_arg()),
            4 => {
                let cast = self.f.pick(&["text", "varchar", "name"]);
                Arg::Text(text(&mut self.f, 40), cast)
            }
            5 => Arg::Text(self.f.token().replace('\0', "\u{1}"), "text"),
            6 => {
                let v = if self.f.one_in(2) {
                    self.f.pick(&[0, -1, 1, i64::MIN, i64::MAX])
                } else {
                    self.f.u64() as i64
                };
                Arg::Int(v, self.f.pick(&["int8", "int4", "int2"]))
            }
            7 => Arg::Float(self.f.pick(&[0.5, -0.0, 1e308, f64::INFINITY, f64::NAN])),
            8 => Arg::Bool(self.f.one_in(2)),
            9 => {
                let oid = self.f.pick(&self.oids);
                Arg::Oid(oid, self.f.pick(&["oid", "oid::regclass"]))
            }
            10 => Arg::Text(self.scope(), "text"),
            _ => Arg::Text(self.f.pick(&["strict", "allow-equal"]).into(), "text"),
        }
    }

    /// A policy text: mostly a valid one.
    fn policy(&mut self) -> String {
        match self.f.below(10) {
            0..=4 => "strict".into(),
            5..=7 => "allow-equal".into(),
            8 => self
                .f
                .pick(&["STRICT", "", " strict", "allow_equal", "strict\u{0}"])
                .replace('\0', "\u{1}"),
            _ if self.f.one_in(10) => "s".repeat((1 << 20) + 1),
            _ => text(&mut self.f, 12),
        }
    }

    fn op_id(&mut self) -> Option<String> {
        match self.f.below(8) {
            0..=3 => None,
            4 => Some("op-1".into()),
            5 => Some("o".repeat(257)),
            6 => Some(String::new()),
            _ => Some(text(&mut self.f, 20)),
        }
    }

    fn keys_text(&mut self) -> String {
        match self.f.below(8) {
            0..=2 => KEYS.into(),
            3 => format!("{KEYS},{KEYS}"),
            4 => {
                let n = self.f.size(80);
                let hex: String = self.f.bytes(n).iter().map(|b| format!("{b:02x}")).collect();
                format!("{}:{hex}", self.f.u64() as u32)
            }
            5 => (0..40)
                .map(|i| format!("{i}:{}", "ab".repeat(16)))
                .collect::<Vec<_>>()
                .join(","),
            6 if self.f.one_in(10) => "1:".repeat(600_000),
            _ => text(&mut self.f, 30),
        }
    }

    /// An argument for the declared parameter `name`.
    fn arg(&mut self, name: &str, admin: bool) -> Arg {
        if self.f.one_in(12) {
            return Arg::null();
        }
        match name {
            "state" => Arg::Bytea(self.state_arg()),
            "scope" => {
                let cast = self.f.pick(&["text", "text", "varchar"]);
                Arg::Text(self.scope(), cast)
            }
            "token" => {
                let key = (self.f.pick(&["fz", "fq", "plain"]).into(), self.scope());
                Arg::Text(self.token_for(&key), "text")
            }
            "policy" => Arg::Text(self.policy(), "text"),
            "op_id" => self
                .op_id()
                .map_or_else(Arg::null, |o| Arg::Text(o, "text")),
            "expected_version" => Arg::Int(
                if self.f.one_in(2) {
                    self.f.pick(&[0, 1, 2, -1, i64::MIN, i64::MAX])
                } else {
                    self.f.u64() as i64
                },
                "int8",
            ),
            "keys" => Arg::Text(self.keys_text(), "text"),
            "tbl" => self.table_arg(admin),
            "scope_column" | "token_column" | "state_column" => {
                let column = match self.f.below(10) {
                    0 => text(&mut self.f, 10),
                    1 => "c".repeat(100),
                    _ => self
                        .f
                        .pick(&["id", "v", "tok", "st", "g", "ctid", "xmin", "tableoid", ""])
                        .into(),
                };
                Arg::Text(column, "text")
            }
            "complete" => Arg::Bool(self.f.one_in(2)),
            "just" => {
                let name = if self.f.one_in(4) {
                    text(&mut self.f, 70)
                } else {
                    self.f
                        .pick(&[
                            "zz_fencecheck_row",
                            "fencecheck_inserted",
                            "fencecheck_truncate",
                        ])
                        .into()
                };
                Arg::Text(name, "name")
            }
            "caller" => {
                let oid = match self.f.below(4) {
                    0 => 10,
                    1 => self.w_oid,
                    2 => 0,
                    _ => self.f.u64() as u32,
                };
                Arg::Oid(oid, "oid")
            }
            _ => self.any_arg(),
        }
    }

    // ---- inputs ------------------------------------------------------------

    /// `SELECT f(…)`: any function, any argument count, types and names.
    fn call_plan(&mut self) -> Plan {
        let admin = self.f.one_in(5);
        let weighted = [0, 0, 0, 1, 1, 1, 2, 2];
        let i = if self.f.one_in(2) {
            self.f.pick(&weighted)
        } else {
            self.f.index(FUNCTIONS.len())
        };
        let (name, params) = FUNCTIONS[i];
        let fencing = FENCING.contains(&name);
        let n = if name.starts_with('*') {
            0
        } else if self.f.one_in(8) {
            self.f.index(9)
        } else if params.len() == 7 {
            3 + self.f.index(5)
        } else {
            params.len()
        };
        let named = self.f.one_in(8);
        let mut sql = Sql::default();
        let mut parts = Vec::new();
        for at in 0..n {
            let declared = params.get(at).map(|p| p.0);
            let arg = match declared {
                // The superuser fences only scratch tables.
                Some("tbl") if admin && fencing => Arg::Text(
                    self.f.pick(&["s1", "s2", "s3", "s4", "s5", "s6"]).into(),
                    "text::regclass",
                ),
                Some(p) if !self.f.one_in(20) => self.arg(p, admin),
                _ if admin && fencing && at == 0 => Arg::Text("s1".into(), "text::regclass"),
                _ => self.any_arg(),
            };
            let place = arg.place(&mut sql);
            parts.push(match (named, declared) {
                (true, Some(_)) if self.f.one_in(10) => format!("bogus => {place}"),
                (true, Some(p)) => format!("{p} => {place}"),
                (true, None) => format!("extra{at} => {place}"),
                (false, _) => place,
            });
        }
        sql.text = if name.starts_with('*') {
            format!("SELECT {name}")
        } else {
            format!("SELECT {name}({})", parts.join(", "))
        };
        let mut plan = Plan::new(admin, Stmt::Query(sql));
        plan.call = Some(name);
        plan.kind = "call";
        plan
    }

    /// A write to a fenced table (or the view over one, or a scratch
    /// table) through one of the documented paths.
    fn write_plan(&mut self) -> Plan {
        let table = self.f.pick(&[
            "fz", "fz", "fz", "fz", "fq", "fq", "fq", "fz_view", "s1", "s1_view", "s6",
        ]);
        let model = if table == "fz_view" { "fz" } else { table };
        let admin = self.f.one_in(8);
        let pick = self.f.below(17);
        let id = if matches!(pick, 9 | 10 | 13) {
            self.new_scope(model)
        } else {
            self.row_scope(model)
        };
        let key: Key = (model.into(), id.clone());
        let tok = self.token_for(&key);
        let v = if self.f.one_in(100) {
            "v".repeat(1 << 20)
        } else {
            text(&mut self.f, 20)
        };
        let mut sql = Sql::default();
        let mut local_token = None;
        let mut tx = false;
        let kind;
        let stmt = match pick {
            0..=4 => {
                kind = "update";
                sql.text = format!(
                    "UPDATE {table} SET v = {}, tok = {} WHERE id = {}",
                    sql.bind(v, "text"),
                    sql.bind(tok, "text"),
                    sql.bind(id, "text")
                );
                Stmt::Exec(sql)
            }
            5 => {
                kind = "update without token";
                sql.text = format!(
                    "UPDATE {table} SET v = {} WHERE id = {}",
                    sql.bind(v, "text"),
                    sql.bind(id, "text")
                );
                Stmt::Exec(sql)
            }
            6 => {
                kind = "update same token";
                sql.text = format!(
                    "UPDATE {table} SET tok = tok WHERE id = {}",
                    sql.bind(id, "text")
                );
                Stmt::Exec(sql)
            }
            7 => {
                kind = "update state or scope";
                let set = if self.f.one_in(2) {
                    let state = self.state_arg();
                    format!("st = {}", sql.bind(state, "bytea"))
                } else {
                    let other = self.scope();
                    format!("id = {}", sql.bind(other, "text"))
                };
                sql.text = format!(
                    "UPDATE {table} SET {set}, tok = {} WHERE id = {}",
                    sql.bind(tok, "text"),
                    sql.bind(id, "text")
                );
                Stmt::Exec(sql)
            }
            8 => {
                kind = "update every row";
                sql.text = format!(
                    "UPDATE {table} SET tok = {}, v = {}",
                    sql.bind(tok, "text"),
                    sql.bind(v, "text")
                );
                Stmt::Exec(sql)
            }
            9 | 10 => {
                kind = "insert";
                let with_state = self.f.one_in(10);
                let mut values = format!(
                    "({}, {}, {}",
                    sql.bind(id, "text"),
                    sql.bind(v, "text"),
                    if self.f.one_in(15) {
                        "NULL".into()
                    } else {
                        sql.bind(tok, "text")
                    }
                );
                if with_state {
                    let state = self.state_arg();
                    values.push_str(&format!(", {}", sql.bind(state, "bytea")));
                }
                values.push(')');
                if self.f.one_in(4) {
                    let other = self.scope();
                    let other_key: Key = (model.into(), other.clone());
                    let other_tok = self.token_for(&other_key);
                    values.push_str(&format!(
                        ", ({}, 'second', {}{})",
                        sql.bind(other, "text"),
                        sql.bind(other_tok, "text"),
                        if with_state { ", NULL" } else { "" }
                    ));
                }
                let conflict = self.f.pick(&[
                    "",
                    "",
                    " ON CONFLICT DO NOTHING",
                    " ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v, tok = EXCLUDED.tok",
                    " ON CONFLICT (id) DO UPDATE SET v = EXCLUDED.v",
                ]);
                let columns = if with_state {
                    "id, v, tok, st"
                } else {
                    "id, v, tok"
                };
                sql.text = format!("INSERT INTO {table} ({columns}) VALUES {values}{conflict}");
                Stmt::Exec(sql)
            }
            11 | 12 => {
                kind = "delete";
                tx = true;
                local_token = Some(tok);
                sql.text = format!("DELETE FROM {table} WHERE id = {}", sql.bind(id, "text"));
                Stmt::Exec(sql)
            }
            // COPY only into fz and fq: a COPY PostgreSQL refuses before
            // it starts (a view, a renamed column) leaves the client out of
            // step (rust-postgres sends Sync twice: issue 789), which would
            // look like a lost backend.
            13 if model == table && (table == "fz" || table == "fq") => {
                kind = "copy";
                let with_state = self.f.one_in(6);
                let mut data = String::new();
                for _ in 0..1 + self.f.below(3) {
                    let id = self.new_scope(model);
                    let tok = self.token_for(&(model.into(), id.clone()));
                    let v = text(&mut self.f, 10);
                    data.push_str(&format!("{}\t{}\t{}", field(&id), field(&v), field(&tok)));
                    if with_state {
                        data.push_str(if self.f.one_in(2) {
                            "\t\\N"
                        } else {
                            "\t\\\\x00ff"
                        });
                    }
                    data.push('\n');
                }
                let mut data = data.into_bytes();
                if self.f.one_in(10) {
                    data.extend(self.f.binary(64));
                }
                let columns = if with_state {
                    "id, v, tok, st"
                } else {
                    "id, v, tok"
                };
                Stmt::Copy(format!("COPY {table} ({columns}) FROM STDIN"), data)
            }
            14 => {
                kind = "merge";
                let update = self.f.one_in(2);
                if !update {
                    tx = true;
                    local_token = Some(self.token_for(&key));
                }
                sql.text = format!(
                    "MERGE INTO {table} t USING (VALUES ({}, {}, {})) AS s(id, v, tok) ON t.id = s.id \
                     WHEN MATCHED AND {} THEN UPDATE SET v = s.v, tok = s.tok \
                     WHEN MATCHED THEN DELETE \
                     WHEN NOT MATCHED THEN INSERT (id, v, tok) VALUES (s.id, s.v, s.tok)",
                    sql.bind(id, "text"),
                    sql.bind(v, "text"),
                    sql.bind(tok, "text"),
                    sql.bind(update, "bool")
                );
                Stmt::Exec(sql)
            }
            15 => {
                kind = "writable cte";
                sql.text = format!(
                    "WITH u AS (UPDATE {table} SET v = {}, tok = {} WHERE id = {} RETURNING id) \
                     SELECT count(*) FROM u",
                    sql.bind(v, "text"),
                    sql.bind(tok, "text"),
                    sql.bind(id, "text")
                );
                Stmt::Query(sql)
            }
            _ => {
                kind = "delete and insert";
                // DELETE and re-INSERT of one scope in one transaction (or
                // one statement): the INSERT must be decided against the
                // DELETE's tombstone.
                tx = true;
                let first = self.near(&key);
                let mut second = first;
                second.counter = second.counter.saturating_add(1);
                let (first, second) = if self.requires_keys(&id) {
                    (self.signed(&id, first), self.signed(&id, second))
                } else {
                    (TokenText(first).to_string(), TokenText(second).to_string())
                };
                local_token = Some(first);
                if self.f.one_in(2) {
                    sql.text = format!(
                        "WITH d AS (DELETE FROM {table} WHERE id = {} RETURNING id) \
                         INSERT INTO {table} (id, v, tok) SELECT id, 'again', {} FROM d",
                        sql.bind(id, "text"),
                        sql.bind(second, "text")
                    );
                    Stmt::Exec(sql)
                } else {
                    let mut delete = Sql::default();
                    delete.text = format!(
                        "DELETE FROM {table} WHERE id = {}",
                        delete.bind(id.clone(), "text")
                    );
                    sql.text = format!(
                        "INSERT INTO {table} (id, v, tok) VALUES ({}, 'again', {})",
                        sql.bind(id, "text"),
                        sql.bind(second, "text")
                    );
                    Stmt::Many(vec![Stmt::Exec(delete), Stmt::Exec(sql)])
                }
            }
        };
        let mut plan = Plan::new(admin, stmt);
        plan.kind = kind;
        if let Some(token) = local_token.filter(|_| !self.f.one_in(6)) {
            plan.local.push(("fencecheck.token".into(), token));
        }
        if self.f.one_in(3) {
            tx = true;
            if let Some(op) = self.op_id().filter(|_| self.f.one_in(2)) {
                plan.local.push(("fencecheck.op_id".into(), op));
            }
            if self.f.one_in(2) {
                let version = self.marks.get(&key).map_or(0, |m| m.version);
                let text = match self.f.below(4) {
                    0 => text(&mut self.f, 8),
                    1 => "-1".into(),
                    _ => (version + self.f.below(2)).to_string(),
                };
                plan.local
                    .push(("fencecheck.expected_version".into(), text));
            }
        }
        if self.f.one_in(20) {
            // Set in an earlier transaction: never presented.
            let token = self.token_for(&key);
            plan.session.push(("fencecheck.token".into(), token));
        }
        plan.tx = tx;
        plan
    }

    /// The documented one-statement write on an unfenced table:
    /// `fence_state = fence_next(fence_state, …)`.
    fn plain_plan(&mut self) -> Plan {
        let id = self.row_scope("plain");
        let key: Key = ("plain".into(), id.clone());
        let policy = self.policy();
        let keyed = self.f.one_in(5);
        let token = if keyed {
            let t = self.near(&key);
            self.signed(&id, t)
        } else {
            self.token_for(&key)
        };
        let op_id = self.op_id();
        let version = self.marks.get(&key).map_or(0, |m| m.version);
        let expected: Option<i64> = match self.f.below(4) {
            0 => i64::try_from(version).ok(),
            1 => Some(self.f.pick(&[-1, i64::MAX])),
            _ => None,
        };
        let keys = match self.f.below(10) {
            0 => Some(self.keys_text()),
            _ if keyed => Some(KEYS.to_string()),
            _ => None,
        };
        let mut sql = Sql::default();
        let mut args = vec![
            sql.bind(token, "text"),
            sql.bind(policy.clone(), "text"),
            sql.bind(op_id, "text"),
            sql.bind(expected, "int8"),
        ];
        if keys.is_some() || self.f.one_in(4) {
            args.push(sql.bind(keys, "text"));
        }
        let args = args.join(", ");
        let v = text(&mut self.f, 20);
        sql.text = if self.f.one_in(5) {
            let id = sql.bind(id, "text");
            format!("INSERT INTO plain VALUES ({id}, 'new', fence_next(NULL, {id}, {args}))")
        } else {
            format!(
                "UPDATE plain SET v = {}, st = fence_next(st, id, {args}) WHERE id = {}",
                sql.bind(v, "text"),
                sql.bind(id, "text")
            )
        };
        let mut plan = Plan::new(self.f.one_in(8), Stmt::Exec(sql));
        plan.strict_plain = policy == "strict";
        plan.kind = "fence_next write";
        plan
    }

    /// Bytes for a text argument in the SQL_ASCII database: mostly not
    /// UTF-8 (never NUL, which text cannot hold).
    fn raw(&mut self) -> Vec<u8> {
        let mut raw = match self.f.below(4) {
            0 => self.f.pick(&SCOPES).as_bytes().to_vec(),
            1 => self.f.token().into_bytes(),
            _ => self.f.binary(40),
        };
        for b in &mut raw {
            if *b == 0 {
                *b = 0xff;
            }
        }
        raw
    }

    /// Calls and fenced writes whose text is not UTF-8 (database `ascii`).
    fn ascii_plan(&mut self) -> Plan {
        let mut sql = Sql::default();
        let raw = |run: &mut Run, sql: &mut Sql| {
            let bytes = run.raw();
            format!("convert_from({}, 'SQL_ASCII')", sql.bind(bytes, "bytea"))
        };
        let mut tx = false;
        let stmt = match self.f.below(5) {
            0 => {
                let state = self.state_arg();
                let state = sql.bind(state, "bytea");
                let (scope, token, policy) = (
                    raw(self, &mut sql),
                    raw(self, &mut sql),
                    raw(self, &mut sql),
                );
                sql.text = format!("SELECT fence_check({state}, {scope}, {token}, {policy})");
                Stmt::Query(sql)
            }
            1 => {
                let (scope, token, op, keys) = (
                    raw(self, &mut sql),
                    raw(self, &mut sql),
                    raw(self, &mut sql),
                    raw(self, &mut sql),
                );
                sql.text = format!(
                    "SELECT fence_next(NULL, {scope}, {token}, 'allow-equal', {op}, NULL, {keys})"
                );
                Stmt::Query(sql)
            }
            2 => {
                let (id, token) = (raw(self, &mut sql), raw(self, &mut sql));
                sql.text = format!("INSERT INTO fa (id, v, tok) VALUES ({id}, 'v', {token})");
                Stmt::Exec(sql)
            }
            3 => {
                // A guard setting that is not UTF-8, then an UPDATE.
                tx = true;
                let mut set = Sql::default();
                let name = self.f.pick(&[
                    "fencecheck.op_id",
                    "fencecheck.expected_version",
                    "fencecheck.token",
                ]);
                let value = raw(self, &mut set);
                set.text = format!("SELECT set_config('{name}', {value}, true)");
                let token = if self.f.one_in(2) {
                    raw(self, &mut sql)
                } else {
                    sql.bind(
                        TokenText(Token::new(0, 1 + self.f.below(3), self.f.u64())).to_string(),
                        "text",
                    )
                };
                sql.text = format!("UPDATE fa SET v = 'u', tok = {token} WHERE id = 'a'");
                Stmt::Many(vec![Stmt::Query(set), Stmt::Exec(sql)])
            }
            _ => {
                tx = true;
                let mut set = Sql::default();
                let value = raw(self, &mut set);
                set.text = format!("SELECT set_config('fencecheck.token', {value}, true)");
                let id = raw(self, &mut sql);
                sql.text = format!("DELETE FROM fa WHERE id = {id} OR id = 'gone'");
                Stmt::Many(vec![Stmt::Query(set), Stmt::Exec(sql)])
            }
        };
        let mut plan = Plan::new(true, stmt);
        plan.ascii = true;
        plan.tx = tx;
        plan.kind = "not UTF-8";
        plan
    }

    /// Signing keys for scope prefixes: key 3 (what `signed` signs with),
    /// or a random one, maybe unusable; or none again.
    fn keys_plan(&mut self) -> Plan {
        let prefix = match self.f.below(6) {
            0 => "r".to_string(),
            1 => "report/".into(),
            2 => "é".into(),
            3 if self.f.one_in(3) => String::new(),
            _ => text(&mut self.f, 6),
        };
        let mut sql = Sql::default();
        sql.text = match self.f.below(6) {
            5 => {
                // More keys than a scope may have, or one huge secret.
                let secret = if self.f.one_in(2) {
                    self.f.bytes(1 << 20)
                } else {
                    SECRET.to_vec()
                };
                format!(
                    "INSERT INTO fencecheck.keys SELECT {}, g, {} FROM generate_series(0, {}) AS g \
                     ON CONFLICT DO NOTHING",
                    sql.bind(prefix, "text"),
                    sql.bind(secret, "bytea"),
                    sql.bind(self.f.pick(&[0i64, 40]), "int8")
                )
            }
            0 => format!(
                "INSERT INTO fencecheck.keys VALUES ({}, 3, {}) ON CONFLICT DO NOTHING",
                sql.bind(prefix, "text"),
                sql.bind(SECRET.to_vec(), "bytea")
            ),
            1 => {
                let id = if self.f.one_in(2) {
                    self.f.below(8) as i64
                } else {
                    self.f.u64() as i64
                };
                let n = self.f.size(80);
                let secret = self.f.bytes(n);
                format!(
                    "INSERT INTO fencecheck.keys VALUES ({}, {}, {}) \
                     ON CONFLICT (scope_prefix, key_id) DO UPDATE SET secret = EXCLUDED.secret",
                    sql.bind(prefix, "text"),
                    sql.bind(id, "int8"),
                    sql.bind(secret, "bytea")
                )
            }
            2 => format!(
                "DELETE FROM fencecheck.keys WHERE scope_prefix = {}",
                sql.bind(prefix, "text")
            ),
            _ => "DELETE FROM fencecheck.keys".into(),
        };
        let mut plan = Plan::new(true, Stmt::Exec(sql));
        plan.keys_changed = true;
        plan.kind = "keys";
        plan
    }

    /// The extension's settings, set, reset and shown every way.
    fn settings_plan(&mut self) -> Plan {
        let name = self.f.pick(&[
            "fencecheck.token",
            "fencecheck.token",
            "fencecheck.op_id",
            "fencecheck.expected_version",
            "fencecheck.log_stale",
            "fencecheck.bogus",
        ]);
        let value = match self.f.below(6) {
            0 => self.f.token().replace('\0', "\u{1}"),
            1 => self
                .f
                .pick(&["off", "debug1", "log", "info", "notice", "warning", "error"])
                .into(),
            2 if self.f.one_in(10) => "t".repeat(1 << 20),
            3 => self.f.pick(&["1", "-1", "99999999999999999999"]).into(),
            _ => text(&mut self.f, 16),
        };
        let admin = self.f.one_in(4);
        let mut sql = Sql::default();
        let stmt = match self.f.below(6) {
            0 => Stmt::Batch(format!("SET {name} = {}", quote(&value))),
            1 => Stmt::Batch(format!("SET LOCAL {name} = {}", quote(&value))),
            2 => Stmt::Batch(format!("RESET {name}")),
            3 => Stmt::Batch(format!("SHOW {name}")),
            _ => {
                sql.text = format!(
                    "SELECT set_config({}, {}, {})",
                    sql.bind(name.to_string(), "text"),
                    sql.bind(value, "text"),
                    sql.bind(self.f.one_in(2), "bool")
                );
                Stmt::Query(sql)
            }
        };
        let mut plan = Plan::new(admin, stmt);
        plan.kind = "settings";
        plan
    }

    fn ddl_plan(&mut self) -> Plan {
        let ddl = if self.f.one_in(4) {
            format!(
                "ALTER EVENT TRIGGER fencecheck_guard DISABLE; ALTER EVENT TRIGGER fencecheck_on_drop DISABLE; \
                 {}; ALTER EVENT TRIGGER fencecheck_guard ENABLE; ALTER EVENT TRIGGER fencecheck_on_drop ENABLE",
                self.f.pick(&BEHIND_THE_GUARD)
            )
        } else {
            self.f.pick(&DDL).to_string()
        };
        let mut plan = Plan::new(!self.f.one_in(5), Stmt::Batch(ddl));
        plan.kind = "ddl";
        plan
    }

    fn truncate_plan(&mut self) -> Plan {
        let what = self
            .f
            .pick(&["fz", "fq", "fz, fq", "fz CASCADE", "s1", "fz_view"]);
        let mut plan = Plan::new(self.f.one_in(2), Stmt::Batch(format!("TRUNCATE {what}")));
        plan.kind = "truncate";
        plan
    }

    /// A superuser damages a state where it lives (the row, bypassing the
    /// triggers; or the tombstone), makes up a tombstone, or repairs what
    /// it damaged.
    fn damage(&mut self, at: &str) -> Result<()> {
        let damaged: Vec<Key> = self
            .marks
            .iter()
            .filter(|(_, m)| m.damaged.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        // Mostly repaired soon: a damaged scope refuses every write.
        let repair = !damaged.is_empty() && (damaged.len() > 2 || !self.f.one_in(4));
        if !repair && self.f.one_in(5) {
            return self.forge(at);
        }
        let key = if repair {
            self.f.pick(&damaged)
        } else {
            let clean: Vec<Key> = self
                .marks
                .iter()
                .filter(|(_, m)| m.damaged.is_none() && m.state.is_some())
                .map(|(k, _)| k.clone())
                .collect();
            if clean.is_empty() {
                return Ok(());
            }
            self.f.pick(&clean)
        };
        let Some(mark) = self.marks.get(&key).cloned() else {
            return Ok(());
        };
        let good = mark.state.clone().unwrap_or_default();
        let bad = if repair {
            good.clone()
        } else {
            self.bad_state(&key.1, &good)?
        };
        if !repair && bad == good {
            return Ok(());
        }
        let (table, scope) = (&key.0, &key.1);
        if mark.row.is_some() {
            let mut tx = self.db.transaction()?;
            tx.batch_execute("SET LOCAL session_replication_role = replica")?;
            let n = tx.execute(
                &format!("UPDATE {table} SET st = $1 WHERE id = $2"),
                &[&bad, scope],
            )?;
            tx.commit()?;
            ensure!(n == 1, "{at}: damaging {key:?} updated {n} rows");
        } else if mark.state.is_none() {
            // A made-up tombstone (forge), taken away again.
            let n = self.db.execute(
                "DELETE FROM fencecheck.tombstones WHERE relid = $1::text::regclass AND scope = $2",
                &[table, scope],
            )?;
            ensure!(
                n == 1,
                "{at}: removing {key:?}'s made-up tombstone removed {n} rows"
            );
        } else {
            let n = self.db.execute(
                "UPDATE fencecheck.tombstones SET fence_state = $1 \
                  WHERE relid = $2::text::regclass AND scope = $3",
                &[&bad, table, scope],
            )?;
            ensure!(
                n == 1,
                "{at}: damaging {key:?}'s tombstone updated {n} rows"
            );
        }
        if !repair {
            self.inspect_damaged(at, &bad)?;
        }
        if let Some(m) = self.marks.get_mut(&key) {
            m.damaged = (!repair).then_some(bad);
        }
        self.damaged += u64::from(!repair);
        self.check(at, false, true)
    }

    /// Damaged bytes for `scope`, whose good state is `good`: flipped or
    /// cut, a real state of another scope, random, about 1 MiB, or empty.
    fn bad_state(&mut self, scope: &str, good: &[u8]) -> Result<Vec<u8>> {
        Ok(match self.f.below(6) {
            0..=2 => self.f.damage(good),
            3 if !self.pool.is_empty() => {
                let other = self.f.pick(&self.pool);
                match decode(&mut self.guest, &other)? {
                    Some(info) if info.scope != scope => other,
                    _ => self.f.damage(good),
                }
            }
            4 => self.f.binary(64),
            _ if self.f.one_in(4) => self.f.bytes(1 << 20),
            _ => Vec::new(),
        })
    }

    /// `fence_inspect` decodes what the component decodes and refuses the
    /// rest with 5F006.
    fn inspect_damaged(&mut self, at: &str, bad: &[u8]) -> Result<()> {
        let inspected = self.db.query_one("SELECT fence_inspect($1)::text", &[&bad]);
        match (decode(&mut self.guest, bad)?, &inspected) {
            (Some(_), Ok(_)) => Ok(()),
            (None, Err(e)) if e.code().map(|c| c.code()) == Some("5F006") => Ok(()),
            (decoded, other) => bail!(
                "{at}: fence_inspect of {} (decodes here: {}): {other:?}",
                shown(bad),
                decoded.is_some()
            ),
        }
    }

    /// A superuser makes up a tombstone for a scope that never had one: an
    /// INSERT of that scope is decided against it, and refused.
    fn forge(&mut self, at: &str) -> Result<()> {
        let table = self.f.pick(&["fz", "fq"]);
        let scope = format!("forged/{}", text(&mut self.f, 8));
        let key: Key = (table.into(), scope.clone());
        if self.marks.contains_key(&key) {
            return Ok(());
        }
        let bad = self.bad_state(&scope, &[])?;
        let n = self.db.execute(
            "INSERT INTO fencecheck.tombstones VALUES ($1::text::regclass, $2, $3) \
             ON CONFLICT DO NOTHING",
            &[&table, &scope, &bad],
        )?;
        if n == 0 {
            return Ok(());
        }
        self.inspect_damaged(at, &bad)?;
        self.marks.entry(key).or_default().damaged = Some(bad);
        self.damaged += 1;
        self.check(at, false, true)
    }

    // ---- checks ------------------------------------------------------------

    fn input(&mut self, at: &str) -> Result<()> {
        let plan = match self.f.below(100) {
            0..=34 => self.call_plan(),
            35..=74 => self.write_plan(),
            75..=80 => self.plain_plan(),
            81..=84 => self.ascii_plan(),
            85..=88 => return self.damage(at),
            89..=90 => self.keys_plan(),
            91..=94 => self.settings_plan(),
            95..=97 => self.ddl_plan(),
            _ => self.truncate_plan(),
        };
        self.send(at, &plan)
    }

    /// Send one input and check everything after it.
    fn send(&mut self, at: &str, plan: &Plan) -> Result<()> {
        let client = if plan.ascii {
            &mut self.ascii
        } else if plan.admin {
            &mut self.db
        } else {
            &mut self.w
        };
        let result = execute(client, plan);
        let counts = self.kinds.entry(plan.kind).or_default();
        counts.0 += 1;
        counts.1 += u64::from(result.is_ok());
        let failed = match &result {
            Ok(rows) => {
                self.returned(at, plan, rows)?;
                false
            }
            Err(e) => {
                let code = judge(e).with_context(|| format!("{at}: {}", describe(plan)))?;
                *self.codes.entry(code).or_default() += 1;
                true
            }
        };
        if plan.keys_changed {
            self.key_prefixes = self
                .db
                .query("SELECT scope_prefix FROM fencecheck.keys", &[])?
                .iter()
                .map(|r| r.try_get(0))
                .collect::<Result<_, _>>()?;
        }
        self.check(at, failed, plan.strict_plain)
    }

    /// What a call returned: `fence_next`'s state decodes, `fence_check`
    /// names a decision.
    fn returned(&mut self, at: &str, plan: &Plan, rows: &[Row]) -> Result<()> {
        let Some(name) = plan.call else {
            return Ok(());
        };
        for row in rows {
            let Some(column) = row.columns().first() else {
                continue;
            };
            if *column.type_() == Type::BYTEA {
                if let Some(state) = row.try_get::<_, Option<Vec<u8>>>(0)? {
                    let info = decode(&mut self.guest, &state)?;
                    ensure!(
                        info.is_some(),
                        "{at}: {name} returned a state that does not decode: {}",
                        shown(&state)
                    );
                    self.remember(state);
                }
            } else if name == "fence_check" && *column.type_() == Type::TEXT {
                let decision: Option<String> = row.try_get(0)?;
                ensure!(
                    decision.as_deref().is_some_and(|d| {
                        ["applied", "duplicate", "stale-fence", "version-conflict"].contains(&d)
                    }),
                    "{at}: fence_check returned {decision:?}"
                );
            }
        }
        Ok(())
    }

    fn remember(&mut self, state: Vec<u8>) {
        if self.pool.len() < 256 {
            self.pool.push(state.clone());
        } else {
            let i = self.f.index(self.pool.len());
            self.pool[i] = state.clone();
        }
        self.written.insert(state);
    }

    /// Every modelled scope as the server holds it now.
    fn observe(&mut self) -> Result<BTreeMap<Key, Seen>> {
        let mut seen = BTreeMap::new();
        for r in self.db.query(
            "SELECT 'fz', id, v, tok, st FROM fz \
             UNION ALL SELECT 'fq', id::text, v, tok::text, st FROM fq \
             UNION ALL SELECT 'plain', id, v, NULL, st FROM plain",
            &[],
        )? {
            seen.insert(
                (r.try_get(0)?, r.try_get(1)?),
                Seen {
                    row: Some((r.try_get(2)?, r.try_get(3)?)),
                    state: r.try_get(4)?,
                },
            );
        }
        for r in self.db.query(
            "SELECT relid::text, scope, fence_state FROM fencecheck.tombstones \
              WHERE relid IN ('fz'::regclass, 'fq'::regclass)",
            &[],
        )? {
            let key: Key = (r.try_get(0)?, r.try_get(1)?);
            let state: Option<Vec<u8>> = r.try_get(2)?;
            match seen.get(&key) {
                Some(_) => ensure!(
                    state.is_none(),
                    "{key:?}: a tombstone with a state beside the scope's row"
                ),
                None if state.is_some() => {
                    seen.insert(key, Seen { row: None, state });
                }
                None => {}
            }
        }
        Ok(seen)
    }

    /// Every scope's change since the last input is a fenced write's.
    fn check(&mut self, at: &str, failed: bool, strict_plain: bool) -> Result<()> {
        let seen = self.observe()?;
        let keys: BTreeSet<Key> = self.marks.keys().chain(seen.keys()).cloned().collect();
        let mut new_states = Vec::new();
        for key in keys {
            let now = seen.get(&key).cloned().unwrap_or_default();
            let mark = self.marks.entry(key.clone()).or_default();
            let stored = mark.damaged.as_ref().or(mark.state.as_ref());
            if now.state.as_ref() == stored {
                ensure!(
                    now.row == mark.row,
                    "{at}: {key:?} changed without a fence decision: {:?} -> {:?}",
                    mark.row,
                    now.row
                );
                continue;
            }
            ensure!(!failed, "{at}: a refused statement changed {key:?}");
            ensure!(
                mark.damaged.is_none(),
                "{at}: {key:?}: a write was accepted over a damaged state"
            );
            let state = now
                .state
                .clone()
                .with_context(|| format!("{at}: {key:?}: the scope's state is gone"))?;
            let info = decode(&mut self.guest, &state)?.with_context(|| {
                format!(
                    "{at}: {key:?}: stored a state that does not decode: {}",
                    shown(&state)
                )
            })?;
            ensure!(
                info.scope == key.1,
                "{at}: {key:?}: a state of {:?}",
                info.scope
            );
            let t = info.highest;
            if let Some(h) = mark.highest {
                let strict = key.0 == "fz" || (key.0 == "plain" && strict_plain);
                let (old, new) = ((h.epoch, h.counter), (t.epoch, t.counter));
                ensure!(
                    t.authority == h.authority && (new > old || (!strict && new == old)),
                    "{at}: {key:?}: accepted {} after {} (strict: {strict})",
                    TokenText(t),
                    TokenText(h)
                );
            }
            ensure!(
                info.version > mark.version,
                "{at}: {key:?}: version {} after {}",
                info.version,
                mark.version
            );
            if key.0 != "plain"
                && let Some((_, tok)) = &now.row
            {
                let shown_tok = tok.as_deref().unwrap_or_default();
                let parsed = shown_tok.parse::<SignedTokenText>().ok();
                ensure!(
                    parsed.is_some_and(|p| p.signature.is_none() && p.token == t),
                    "{at}: {key:?}: the token column holds {:?}, the state {}",
                    shown(shown_tok.as_bytes()),
                    TokenText(t)
                );
            }
            mark.state = Some(state.clone());
            mark.highest = Some(t);
            mark.version = info.version;
            mark.row = now.row.clone();
            new_states.push(state);
        }
        self.applied += new_states.len() as u64;
        for s in new_states {
            self.remember(s);
        }
        Ok(())
    }

    /// Both backends and the postmaster are the ones the run started with,
    /// and the log shows no crash.
    fn alive(&mut self) -> Result<()> {
        let db: i32 = self
            .db
            .query_one("SELECT pg_backend_pid()", &[])?
            .try_get(0)?;
        let w: i32 = self
            .w
            .query_one("SELECT pg_backend_pid()", &[])?
            .try_get(0)?;
        let ascii: i32 = self
            .ascii
            .query_one("SELECT pg_backend_pid()", &[])?
            .try_get(0)?;
        ensure!(
            (db, w, ascii) == self.pids,
            "a backend changed: {:?} -> {:?}",
            self.pids,
            (db, w, ascii)
        );
        let started: String = self
            .db
            .query_one("SELECT pg_postmaster_start_time()::text", &[])?
            .try_get(0)?;
        ensure!(started == self.started, "the postmaster restarted");
        if let Some(line) = crash_line(&self.server.log()) {
            bail!("the server log shows a crash: {line}");
        }
        Ok(())
    }

    /// The server log's last lines, for a finding's message.
    fn log_tail(&self) -> String {
        let log = self.server.log();
        let lines: Vec<String> = log
            .lines()
            .rev()
            .take(30)
            .map(|l| l.chars().take(300).collect())
            .collect();
        let mut lines = lines;
        lines.reverse();
        format!("--- server log (last lines) ---\n{}", lines.join("\n"))
    }

    /// The end: every written state decodes through `fence_inspect`, as the
    /// component decodes it; every damaged one still stored is refused.
    fn finish(&mut self) -> Result<()> {
        self.check("the end", false, true)?;
        let written: Vec<Vec<u8>> = self.written.iter().cloned().collect();
        for chunk in written.chunks(1000) {
            let rows = self.w.query(
                "SELECT s, fence_inspect(s)::text FROM unnest($1::bytea[]) AS u(s)",
                &[&chunk],
            )?;
            ensure!(rows.len() == chunk.len(), "fence_inspect lost a state");
            for row in rows {
                let state: Vec<u8> = row.try_get(0)?;
                let json: String = row.try_get(1)?;
                let json: serde_json::Value = serde_json::from_str(&json)?;
                let info = decode(&mut self.guest, &state)?.with_context(|| {
                    format!("a written state does not decode: {}", shown(&state))
                })?;
                ensure!(
                    json["scope"] == info.scope.as_str() && json["version"] == info.version,
                    "fence_inspect says {json}, the component {info:?}"
                );
            }
        }
        let damaged: Vec<Vec<u8>> = self
            .marks
            .values()
            .filter_map(|m| m.damaged.clone())
            .collect();
        for bad in &damaged {
            let result = self.w.query_one("SELECT fence_inspect($1)::text", &[bad]);
            let decodes = decode(&mut self.guest, bad)?.is_some();
            ensure!(
                decodes == result.is_ok()
                    && (decodes
                        || result
                            .as_ref()
                            .err()
                            .and_then(|e| e.code())
                            .map(|c| c.code())
                            == Some("5F006")),
                "fence_inspect of damaged {}: {result:?}",
                shown(bad)
            );
        }
        // What the SQL_ASCII database's fenced table accepted is UTF-8,
        // with a state of its scope.
        for row in self.ascii.query(
            "SELECT convert_to(id, 'SQL_ASCII'), convert_to(tok, 'SQL_ASCII'), st FROM fa",
            &[],
        )? {
            let (id, tok, st): (Vec<u8>, Vec<u8>, Vec<u8>) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            let (id, tok) = (String::from_utf8(id)?, String::from_utf8(tok)?);
            let info = decode(&mut self.guest, &st)?.context("fa: a state that does not decode")?;
            ensure!(
                info.scope == id,
                "fa: {id:?} holds a state of {:?}",
                info.scope
            );
            ensure!(
                tok.parse::<SignedTokenText>().is_ok(),
                "fa: {id:?} holds token {tok:?}"
            );
        }
        self.alive()?;
        let mut fresh = self.server.client_as("w")?;
        let version: String = fresh.query_one("SELECT fence_version()", &[])?.try_get(0)?;
        ensure!(!version.is_empty());
        let errors: u64 = self.codes.values().sum();
        let mut top: Vec<(&String, &u64)> = self.codes.iter().collect();
        top.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = top
            .iter()
            .take(12)
            .map(|(c, n)| format!("{c}×{n}"))
            .collect();
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|(k, (sent, ok))| format!("{k} {ok}/{sent}"))
            .collect();
        self.f.finish(&format!(
            "{} states applied, {} damaged, {} written states inspected; \
             succeeded/sent: {}; {errors} errors ({})",
            self.applied,
            self.damaged,
            written.len(),
            kinds.join(", "),
            top.join(" ")
        ));
        Ok(())
    }
}

/// A plan's statement, short, for a finding's message.
fn describe(plan: &Plan) -> String {
    fn stmt(s: &Stmt) -> String {
        match s {
            Stmt::Exec(sql) | Stmt::Query(sql) => {
                format!("{} with {}", sql.text, sql.shown.join(", "))
            }
            Stmt::Copy(sql, data) => format!("{sql} <- {}", shown(data)),
            Stmt::Batch(sql) => sql.clone(),
            Stmt::Many(s) => s.iter().map(stmt).collect::<Vec<_>>().join("; "),
        }
    }
    let text: String = stmt(&plan.stmt).chars().take(1200).collect();
    format!(
        "{} ran {text} (local settings {:?})",
        if plan.ascii {
            "the superuser in SQL_ASCII"
        } else if plan.admin {
            "the superuser"
        } else {
            "the writer"
        },
        plan.local
            .iter()
            .map(|(n, v)| (n.as_str(), v.chars().take(80).collect::<String>()))
            .collect::<Vec<_>>()
    )
}

/// Random SQL against every function the extension exposes and every path
/// into its fenced tables, with damaged states, keys, settings and DDL: the
/// server never crashes, every error is a clear one (a documented SQLSTATE,
/// never internal), refusals change nothing, accepted tokens per scope only
/// rise, and `fence_inspect` decodes every state written and refuses every
/// damaged one.
#[test]
fn sql_fuzz_never_crashes_the_server_and_errors_are_clear() -> Result<()> {
    let f = Fuzz::from_env("postgres-sql", INPUTS)?;
    let mut run = Run::start(f)?;
    while run.f.next_input() {
        let at = run.f.at();
        let step = run.input(&at).and_then(|()| {
            if run.f.done() % 500 == 0 {
                run.alive()
            } else {
                Ok(())
            }
        });
        if let Err(e) = step {
            let crash = crash_line(&run.server.log()).unwrap_or_default();
            return Err(e.context(format!("{at}\n{crash}\n{}", run.log_tail())));
        }
    }
    run.finish()
}
