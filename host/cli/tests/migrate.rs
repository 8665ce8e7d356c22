//! `fencecheck authority migrate` between real stores (SQLite files, two
//! etcd clusters, a PostgreSQL server), with the resources that already
//! hold a mark from the old store: the SQLite adapter, the SQLite
//! extension, the PostgreSQL client-side adapter and a PostgreSQL table
//! protected by the extension. After a move every resource accepts the new
//! store's first grant and still refuses every old token, and the old store
//! grants nothing.
#![allow(unsafe_code)] // loading the SQLite extension is `unsafe` in rusqlite's API

use crate::etcd;

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use common::fencecheck;
use fencecheck::{Fenced, Instance, Policy, Rejection, Request, Token, TokenText};
use fencecheck_authority::{
    AcquireOutcome, AuthorityError, Coordinator, EtcdCoordinator, ManualClock, PostgresCoordinator,
    RenewOutcome, SqliteCoordinator,
};
use fencecheck_tests::pgserver::PgServer;
use fencecheck_tests::runtime;

const LOCK: &str = "report/july";
/// A lock whose holder's lease is still running at the move.
const HELD: &str = "report/aug";
const TTL: u64 = 30_000;

/// `fencecheck authority migrate`; its stdout, or an error with its stderr.
fn migrate(from: &str, to: &str) -> Result<String> {
    let out = fencecheck(&["authority", "migrate", "--from", from, "--to", to])?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "migrate {from} -> {to} failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// Start `migrate` paused after `step`, wait until it says so, SIGKILL it.
fn migrate_killed_after(from: &str, to: &str, step: &str) -> Result<()> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencecheck"))
        .args(["authority", "migrate", "--from", from, "--to", to])
        .args(["--pause-after", step])
        .env_remove("FENCECHECK_COMPONENT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    // The pipe stays open (stdin held): the process is blocked at the step.
    let stdin = child.stdin.take();
    ensure!(
        line.trim() == format!("paused after {step}"),
        "expected a pause after {step}, got {line:?}"
    );
    child.kill()?;
    let status = child.wait()?;
    drop(stdin);
    ensure!(!status.success(), "the killed migration reported success");
    Ok(())
}

/// A store and how to open a coordinator on it.
enum Store {
    Sqlite(PathBuf),
    Etcd(etcd::Cluster),
    Postgres(PgServer),
}

impl Store {
    fn url(&self) -> String {
        match self {
            Store::Sqlite(path) => format!("sqlite:{}", path.display()),
            Store::Etcd(cluster) => format!("etcd:{}", cluster.endpoints().join(",")),
            Store::Postgres(server) => {
                format!("postgres://postgres@127.0.0.1:{}/postgres", server.port())
            }
        }
    }

    fn open(&self, clock: Arc<ManualClock>) -> Result<Arc<dyn Coordinator>> {
        let runtime = runtime()?;
        Ok(match self {
            Store::Sqlite(path) => Arc::new(SqliteCoordinator::open(path, runtime, clock)?),
            Store::Etcd(cluster) => Arc::new(EtcdCoordinator::connect(
                cluster.endpoints(),
                runtime,
                clock,
            )?),
            Store::Postgres(server) => {
                Arc::new(PostgresCoordinator::open(&server.url(), runtime, clock)?)
            }
        })
    }
}

fn acquired(outcome: AcquireOutcome) -> Result<Token> {
    match outcome {
        AcquireOutcome::Acquired(grant) => Ok(grant.token),
        AcquireOutcome::Busy { holder, .. } => bail!("busy, held by {holder}"),
    }
}

/// Every kind of resource, each protecting `LOCK` with its own mark.
struct Resources {
    sqlite: rusqlite::Connection,
    sqlite_ext: rusqlite::Connection,
    pg: postgres::Client,
    guest: Instance,
    // Last: the server outlives its clients.
    _server: PgServer,
    _dir: tempfile::TempDir,
}

impl Resources {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let sqlite = rusqlite::Connection::open(dir.path().join("resource.db"))?;
        fencecheck_sqlite::install(&sqlite)?;

        let sqlite_ext = rusqlite::Connection::open_in_memory()?;
        // SAFETY: loading our own extension; it registers three pure functions.
        unsafe {
            let _guard = rusqlite::LoadExtensionGuard::new(&sqlite_ext)?;
            sqlite_ext.load_extension(sqlite_extension()?, None::<&str>)?;
        }
        sqlite_ext.execute_batch(
            "CREATE TABLE report_catalog (report_id TEXT PRIMARY KEY, fence_state BLOB);",
        )?;
        sqlite_ext.execute("INSERT INTO report_catalog VALUES (?1, NULL)", [LOCK])?;

        let server = PgServer::start()?;
        let mut pg = server.client()?;
        fencecheck_postgres::install(&mut pg)?;
        pg.batch_execute(
            "CREATE EXTENSION fencecheck;
             CREATE TABLE report_catalog (
                 report_id text PRIMARY KEY, visible_object text,
                 fence_token text, fence_state bytea);
             SELECT fence_protect('report_catalog', 'report_id', 'fence_token', 'fence_state');",
        )
        .context("CREATE EXTENSION fencecheck (run scripts/install-pg-extension first)")?;
        Ok(Self {
            sqlite,
            sqlite_ext,
            pg,
            guest: runtime()?.instance()?,
            _server: server,
            _dir: dir,
        })
    }

    /// Write `LOCK` with `token` at every resource: `true` where applied,
    /// `false` where refused as stale; any other answer is an error.
    fn write(&mut self, token: Token) -> Result<[bool; 4]> {
        let text = TokenText(token).to_string();
        let request = Request::new(LOCK, token, Policy::Strict);
        let adapter = match fencecheck_sqlite::fenced_write(
            &mut self.sqlite,
            &mut self.guest,
            &request,
            |_, _| Ok::<_, rusqlite::Error>(()),
        )? {
            Fenced::Applied { .. } => true,
            Fenced::Rejected(Rejection::StaleFence { .. }) => false,
            Fenced::Rejected(other) => bail!("SQLite adapter: {}", other.name()),
        };
        let ext = match self.sqlite_ext.execute(
            "UPDATE report_catalog
                SET fence_state = fence_next(fence_state, report_id, ?2, 'strict', NULL, NULL)
              WHERE report_id = ?1",
            [LOCK, &text],
        ) {
            Ok(1) => true,
            Err(e) if e.to_string().contains("stale-fence") => false,
            other => bail!("SQLite extension: {other:?}"),
        };
        let pg_adapter = match fencecheck_postgres::fenced_write(
            &mut self.pg,
            &mut self.guest,
            &request,
            |_, _| Ok::<_, postgres::Error>(()),
        )? {
            Fenced::Applied { .. } => true,
            Fenced::Rejected(Rejection::StaleFence { .. }) => false,
            Fenced::Rejected(other) => bail!("PostgreSQL adapter: {}", other.name()),
        };
        let protected = match self.pg.execute(
            "INSERT INTO report_catalog (report_id, visible_object, fence_token)
             VALUES ($1, $2, $2)
             ON CONFLICT (report_id) DO UPDATE
                SET visible_object = excluded.visible_object, fence_token = excluded.fence_token",
            &[&LOCK, &text],
        ) {
            Ok(1) => true,
            // stale-fence, as documented in docs/postgres.md's SQLSTATE table.
            Err(e) if e.code().map(|c| c.code()) == Some("5F001") => false,
            other => bail!("PostgreSQL extension: {other:?}"),
        };
        Ok([adapter, ext, pg_adapter, protected])
    }
}

/// The extension's cdylib, built by cargo next to this test binary
/// (the dev-dependency on fencecheck-sqlite-ext), or `FENCECHECK_SQLITE_EXT`.
fn sqlite_extension() -> Result<PathBuf> {
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

/// The whole move, from a source that granted and whose tokens every
/// resource accepted, to a new target; `interrupt` runs the migration
/// killed after that step first.
fn move_between(from: &Store, to: &Store, interrupt: Option<&str>) -> Result<()> {
    let clock = Arc::new(ManualClock::new(1_000));
    let old = from.open(clock.clone())?;
    let lineage = old.authority();
    let first = acquired(old.acquire(LOCK, "a7", TTL)?)?;
    let mut resources = Resources::new()?;
    ensure!(
        resources.write(first)? == [true; 4],
        "the first grant is accepted"
    );
    clock.advance(TTL); // a7's lease ends on the old coordinator's clock
    let last_old = acquired(old.acquire(LOCK, "c3", TTL)?)?;
    ensure!(
        resources.write(last_old)? == [true; 4],
        "the old store's last grant"
    );
    let held = acquired(old.acquire(HELD, "h1", TTL)?)?;

    if let Some(step) = interrupt {
        migrate_killed_after(&from.url(), &to.url(), step)?;
        ensure!(
            matches!(
                old.acquire("other", "x", TTL),
                Err(AuthorityError::Moved { .. })
            ),
            "a source sealed by a killed migration stays sealed"
        );
    }
    let said = migrate(&from.url(), &to.url())?;
    ensure!(
        said.starts_with(&format!("migrated lineage {lineage} ")),
        "{said}"
    );
    ensure!(
        migrate(&from.url(), &to.url())?.starts_with("already-migrated"),
        "a re-run changes nothing"
    );
    let floor: u64 = said
        .split_whitespace()
        .skip_while(|w| *w != "epoch-floor")
        .nth(1)
        .context("no epoch-floor in the output")?
        .parse()?;

    // The old store refuses, through a coordinator opened before the move
    // and one opened after it.
    for coordinator in [old.clone(), from.open(clock.clone())?] {
        match coordinator.acquire(LOCK, "d4", TTL) {
            Err(AuthorityError::Moved { to }) => ensure!(!to.is_empty()),
            other => bail!("the old store still decides: {other:?}"),
        }
        ensure!(matches!(
            coordinator.renew(HELD, "h1", held, TTL),
            Err(AuthorityError::Moved { .. })
        ));
    }

    let new = to.open(clock.clone())?;
    ensure!(
        new.authority() == lineage,
        "the lineage moved with the locks"
    );
    // The holder of a running lease keeps it: renew at the new store.
    ensure!(matches!(
        new.renew(HELD, "h1", held, TTL)?,
        RenewOutcome::Renewed { .. }
    ));
    ensure!(matches!(
        new.acquire(HELD, "h2", TTL)?,
        AcquireOutcome::Busy { .. }
    ));
    clock.advance(TTL);
    let next = acquired(new.acquire(LOCK, "b9", TTL)?)?;
    ensure!(
        next.grant_order(&last_old).is_gt() && next.epoch == floor && next.counter == 1,
        "{next:?}: the new store's first grant opens the epoch floor {floor}, above {last_old:?}"
    );
    ensure!(
        resources.write(next)? == [true; 4],
        "every resource accepts the new store's first grant"
    );
    for old_token in [first, last_old, held] {
        ensure!(
            resources.write(old_token)? == [false; 4],
            "every resource still refuses {old_token:?}"
        );
    }
    Ok(())
}

fn sqlite_store(dir: &Path, name: &str) -> Store {
    Store::Sqlite(dir.join(name))
}

/// SQLite → SQLite: resources accept the new store's first grant, refuse
/// every old token, and the old store grants nothing.
#[test]
fn sqlite_to_sqlite() -> Result<()> {
    let dir = tempfile::tempdir()?;
    move_between(
        &sqlite_store(dir.path(), "old.db"),
        &sqlite_store(dir.path(), "new.db"),
        None,
    )
}

/// SQLite → etcd (a real single-member cluster).
#[test]
fn sqlite_to_etcd() -> Result<()> {
    let dir = tempfile::tempdir()?;
    move_between(
        &sqlite_store(dir.path(), "old.db"),
        &Store::Etcd(etcd::Cluster::start(1)?),
        None,
    )
}

/// etcd → etcd between two clusters (different cluster ids): the lineage,
/// not the cluster id, is the authority after the move.
#[test]
fn etcd_to_etcd_across_clusters() -> Result<()> {
    move_between(
        &Store::Etcd(etcd::Cluster::start(1)?),
        &Store::Etcd(etcd::Cluster::start(1)?),
        None,
    )
}

/// SQLite → PostgreSQL.
#[test]
fn sqlite_to_postgres() -> Result<()> {
    let dir = tempfile::tempdir()?;
    move_between(
        &sqlite_store(dir.path(), "old.db"),
        &Store::Postgres(PgServer::start()?),
        None,
    )
}

/// A migration SIGKILLed after sealing the source (target untouched) is
/// re-run to completion.
#[test]
fn killed_after_the_seal_and_rerun() -> Result<()> {
    let dir = tempfile::tempdir()?;
    move_between(
        &sqlite_store(dir.path(), "old.db"),
        &sqlite_store(dir.path(), "new.db"),
        Some("sealed"),
    )
}

/// A migration into etcd SIGKILLed half way through the import (the target
/// marked importing, some locks written) is re-run to completion; until
/// then the target refuses to grant.
#[test]
fn killed_during_an_etcd_import_and_rerun() -> Result<()> {
    let source = Store::Etcd(etcd::Cluster::start(1)?);
    let target = Store::Etcd(etcd::Cluster::start(1)?);
    let clock = Arc::new(ManualClock::new(1_000));
    let old = source.open(clock.clone())?;
    // More locks than one import transaction holds.
    for n in 0..150 {
        acquired(old.acquire(&format!("bulk/{n}"), "w", TTL)?)?;
    }
    migrate_killed_after(&source.url(), &target.url(), "importing")?;
    let Store::Etcd(cluster) = &target else {
        bail!("the target is etcd")
    };
    match EtcdCoordinator::connect(cluster.endpoints(), runtime()?, clock.clone())?
        .acquire(LOCK, "x", TTL)
    {
        Err(AuthorityError::MigrationIncomplete) => {}
        other => bail!("a half-imported store decided: {other:?}"),
    }
    let said = migrate(&source.url(), &target.url())?;
    ensure!(said.contains(" locks 150"), "{said}");
    let new = target.open(clock.clone())?;
    ensure!(new.authority() == old.authority());
    for n in [0, 149] {
        ensure!(
            matches!(
                new.acquire(&format!("bulk/{n}"), "v", TTL)?,
                AcquireOutcome::Busy { .. }
            ),
            "bulk/{n}'s lease came along"
        );
    }
    Ok(())
}

/// Refusals that change nothing: a target a coordinator already used
/// (another lineage), a source already moved elsewhere, the same store on
/// both sides, a source no coordinator ever used.
#[test]
fn refusals_change_nothing() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(ManualClock::new(1_000));
    let old = sqlite_store(dir.path(), "old.db");
    let used = sqlite_store(dir.path(), "used.db");
    let new = sqlite_store(dir.path(), "new.db");
    let elsewhere = sqlite_store(dir.path(), "elsewhere.db");
    let coordinator = old.open(clock.clone())?;
    let token = acquired(coordinator.acquire(LOCK, "a7", TTL)?)?;
    let other = used.open(clock.clone())?;
    acquired(other.acquire(LOCK, "z", TTL)?)?;

    let refused = |from: &Store, to: &Store, why: &str| -> Result<()> {
        let out = fencecheck(&[
            "authority",
            "migrate",
            "--from",
            &from.url(),
            "--to",
            &to.url(),
        ])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success(),
            "migrate {} -> {} ran",
            from.url(),
            to.url()
        );
        ensure!(stderr.contains(why), "expected {why:?} in {stderr}");
        Ok(())
    };
    refused(&old, &used, "already belongs to lineage")?;
    refused(&old, &old, "the same store")?;
    refused(&sqlite_store(dir.path(), "never.db"), &new, "no lineage")?;
    ensure!(
        !dir.path().join("new.db").exists() && !dir.path().join("never.db").exists(),
        "a refused migration creates no store"
    );
    // Still granting: nothing was sealed by the refusals.
    ensure!(matches!(
        coordinator.renew(LOCK, "a7", token, TTL)?,
        RenewOutcome::Renewed { .. }
    ));
    ensure!(other.authority() != coordinator.authority());

    migrate(&old.url(), &new.url())?;
    refused(&old, &elsewhere, "already moved to")?;
    ensure!(!matches!(&elsewhere, Store::Sqlite(p) if p.exists()));
    Ok(())
}

/// Moving back: A → B → A, the second move into the sealed original.
#[test]
fn moving_back_to_a_sealed_store() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(ManualClock::new(1_000));
    let a = sqlite_store(dir.path(), "a.db");
    let b = sqlite_store(dir.path(), "b.db");
    let first = acquired(a.open(clock.clone())?.acquire(LOCK, "a7", TTL)?)?;
    migrate(&a.url(), &b.url())?;
    clock.advance(TTL);
    let on_b = acquired(b.open(clock.clone())?.acquire(LOCK, "b9", TTL)?)?;
    migrate(&b.url(), &a.url())?;
    clock.advance(TTL);
    let back = acquired(a.open(clock.clone())?.acquire(LOCK, "c3", TTL)?)?;
    ensure!(back.grant_order(&on_b).is_gt() && on_b.grant_order(&first).is_gt());
    ensure!(matches!(
        b.open(clock)?.acquire(LOCK, "d", TTL),
        Err(AuthorityError::Moved { .. })
    ));
    Ok(())
}
