//! A real PostgreSQL server for a test: `initdb` and `pg_ctl` in a fresh
//! temporary directory, on a free loopback port, stopped and removed when
//! dropped. Shared by every PostgreSQL test (the extension's, the client
//! adapter's).
//!
//! initdb refuses to run as root, and CI runs as root: then the server runs
//! as an unprivileged user (`postgres` if the system has it, else `nobody`)
//! through `runuser`. Binaries come from `$PG_BINDIR`, else from
//! `pg_config --bindir` (`$PG_CONFIG`, else `pg_config` on PATH).
//!
//! Streaming replication, for failover tests: [`PgServer::start_primary`],
//! [`PgServer::replica_of`] (`pg_basebackup -R`, asynchronous),
//! [`PgServer::catch_up`], [`PgServer::stop_streaming`] and
//! [`PgServer::promote`]. Every wait is a bounded poll of a condition.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// One server, its data directory, and how to reach it.
pub struct PgServer {
    root: PathBuf,
    bin: PathBuf,
    run_as: Option<String>,
    port: u16,
    durable: bool,
    /// Extra `postgres -c NAME=VALUE` settings ([`PgServer::start_with_settings`]).
    settings: Vec<String>,
}

fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let pg_config = std::env::var("PG_CONFIG").unwrap_or_else(|_| "pg_config".into());
    let out = Command::new(&pg_config)
        .arg("--bindir")
        .output()
        .with_context(|| format!("running {pg_config} --bindir (set PG_CONFIG or PG_BINDIR)"))?;
    if !out.status.success() {
        bail!("{pg_config} --bindir failed");
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn is_root() -> Result<bool> {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .context("running id -u")?;
    Ok(String::from_utf8(out.stdout)?.trim() == "0")
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

impl PgServer {
    /// initdb a new cluster and start it on a free loopback port, fsync off
    /// (tests: see [`PgServer::pg_ctl_start`]).
    pub fn start() -> Result<Self> {
        Self::start_with(false)
    }

    /// The same with PostgreSQL's default durability (fsync on), for
    /// benchmarks whose numbers must include the commit's flush.
    pub fn start_durable() -> Result<Self> {
        Self::start_with(true)
    }

    /// As [`PgServer::start`], with extra server settings (`NAME=VALUE`,
    /// e.g. `shared_preload_libraries=fencecheck`), kept across restarts.
    pub fn start_with_settings(settings: &[&str]) -> Result<Self> {
        let mut server = Self::init(false)?;
        server.settings = settings.iter().map(|s| s.to_string()).collect();
        server.pg_ctl_start()?;
        Ok(server)
    }

    /// A server ready to be the primary of streaming replicas
    /// ([`PgServer::replica_of`]): `wal_level = replica`, WAL senders and
    /// slots, and replication connections from 127.0.0.1 trusted. Otherwise
    /// as [`PgServer::start`].
    pub fn start_primary() -> Result<Self> {
        let server = Self::init(false)?;
        append(
            &server.data().join("postgresql.conf"),
            "\n# fencecheck tests: a primary for streaming replicas\n\
             wal_level = replica\nmax_wal_senders = 8\nmax_replication_slots = 8\n\
             wal_keep_size = '64MB'\n",
        )?;
        // initdb -A trust already writes this line; stated here so the
        // primary does not depend on initdb's defaults.
        append(
            &server.data().join("pg_hba.conf"),
            "\nhost replication all 127.0.0.1/32 trust\n",
        )?;
        server.pg_ctl_start()?;
        Ok(server)
    }

    /// An asynchronous streaming replica of `primary` (a hot standby):
    /// `pg_basebackup -R -X stream` into its own temporary directory, as
    /// the same user, started on its own free port. It replays what the
    /// primary streams until [`PgServer::stop_streaming`] or
    /// [`PgServer::promote`]; read-only until promoted.
    pub fn replica_of(primary: &PgServer) -> Result<Self> {
        let replica = Self::empty(primary.durable)?;
        replica.check(
            replica
                .command("pg_basebackup")
                .args(["-h", "127.0.0.1", "-U", "postgres", "-p"])
                .arg(primary.port.to_string())
                .args(["-R", "-X", "stream", "-c", "fast", "--no-sync", "-D"])
                .arg(replica.data()),
        )?;
        replica.pg_ctl_start()?;
        Ok(replica)
    }

    /// On a replica: wait (bounded: 30 s) until it has replayed everything
    /// `primary` has written so far.
    pub fn catch_up(&self, primary: &PgServer) -> Result<()> {
        let target: String = primary
            .client()?
            .query_one("SELECT pg_current_wal_lsn()::text", &[])?
            .get(0);
        let mut client = self.client()?;
        self.wait_for(&format!("replay to reach {target}"), || {
            Ok(client
                .query_one(
                    "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::text::pg_lsn, false)",
                    &[&target],
                )?
                .get(0))
        })
    }

    /// On a replica: stop receiving WAL, deterministically. Its
    /// `primary_conninfo` is emptied and the configuration reloaded, then
    /// this waits (bounded) until its WAL receiver has exited and the
    /// primary (if given) has no replication connection left. From then
    /// on nothing the primary commits reaches this server; the server stays
    /// up, read-only, as a lagging asynchronous replica would be.
    ///
    /// (`pg_wal_replay_pause()` does not do this: WAL keeps arriving while
    /// replay is paused, and promotion replays all of it.)
    pub fn stop_streaming(&self, primary: Option<&PgServer>) -> Result<()> {
        let mut client = self.client()?;
        // ALTER SYSTEM refuses to run in a transaction block: one statement
        // per call.
        client.batch_execute("ALTER SYSTEM SET primary_conninfo = ''")?;
        client.batch_execute("SELECT pg_reload_conf()")?;
        self.wait_for("the WAL receiver to exit", || {
            let receivers: i64 = client
                .query_one("SELECT count(*) FROM pg_stat_wal_receiver", &[])?
                .get(0);
            Ok(receivers == 0)
        })?;
        if let Some(primary) = primary {
            let mut client = primary.client()?;
            self.wait_for("the primary's WAL senders to exit", || {
                let senders: i64 = client
                    .query_one("SELECT count(*) FROM pg_stat_replication", &[])?
                    .get(0);
                Ok(senders == 0)
            })?;
        }
        Ok(())
    }

    /// On a replica: `pg_ctl promote`, waiting until it accepts writes.
    pub fn promote(&self) -> Result<()> {
        self.check(
            self.command("pg_ctl")
                .args(["-w", "-t", "60", "-D"])
                .arg(self.data())
                .arg("promote"),
        )?;
        let in_recovery: bool = self
            .client()?
            .query_one("SELECT pg_is_in_recovery()", &[])?
            .get(0);
        if in_recovery {
            bail!("still in recovery after pg_ctl promote\n{}", self.log());
        }
        Ok(())
    }

    /// Poll `done` every 20 ms until it is true (bounded: 30 s).
    fn wait_for(&self, what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if done()? {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!(
            "timed out waiting for {what}\n--- server log ---\n{}",
            self.log()
        )
    }

    fn start_with(durable: bool) -> Result<Self> {
        let server = Self::init(durable)?;
        server.pg_ctl_start()?;
        Ok(server)
    }

    /// initdb a new cluster, not started.
    fn init(durable: bool) -> Result<Self> {
        let server = Self::empty(durable)?;
        server.check(
            server
                .command("initdb")
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(server.data()),
        )?;
        Ok(server)
    }

    /// A fresh directory (owned by the server's user) and a free port; no
    /// data directory yet.
    fn empty(durable: bool) -> Result<Self> {
        let bin = bin_dir()?;
        let run_as = if is_root()? {
            Some(
                if user_exists("postgres") {
                    "postgres"
                } else {
                    "nobody"
                }
                .to_string(),
            )
        } else {
            None
        };
        let root = std::env::temp_dir().join(format!(
            "fencecheck-pg-{}-{}",
            std::process::id(),
            free_port()?
        ));
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let server = PgServer {
            root,
            bin,
            run_as,
            port: free_port()?,
            durable,
            settings: Vec::new(),
        };
        if let Some(user) = &server.run_as {
            server.check(Command::new("chown").arg(user).arg(&server.root))?;
        }
        Ok(server)
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// A command for one of the server's binaries, as the server's user.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(path);
                c
            }
            None => Command::new(path),
        }
    }

    fn check(&self, command: &mut Command) -> Result<Output> {
        let out = command
            .output()
            .with_context(|| format!("running {command:?}"))?;
        if !out.status.success() {
            bail!(
                "{command:?} failed: {}{}\n--- server log ---\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        Ok(out)
    }

    /// Start (or restart after a stop) the server and wait until it accepts
    /// connections. fsync is off: the tests stop the server, they never cut
    /// the machine's power, and WAL replay after `-m immediate` still runs.
    pub fn pg_ctl_start(&self) -> Result<()> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync={} -c max_connections=100",
            self.port,
            self.root.display(),
            if self.durable { "on" } else { "off" }
        );
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        self.check(
            self.command("pg_ctl")
                .args(["-w", "-t", "60", "-D"])
                .arg(self.data())
                .arg("-l")
                .arg(self.root.join("server.log"))
                .args(["-o", &options, "start"]),
        )?;
        Ok(())
    }

    /// `pg_ctl stop -m immediate`: every backend is killed, nothing is
    /// flushed; the next start replays the WAL, as after a crash.
    pub fn stop_immediate(&self) -> Result<()> {
        self.check(
            self.command("pg_ctl")
                .args(["-w", "-D"])
                .arg(self.data())
                .args(["-m", "immediate", "stop"]),
        )?;
        Ok(())
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq connection string for database `postgres`.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10",
            self.port
        )
    }

    /// A new client connection.
    pub fn client(&self) -> Result<postgres::Client> {
        postgres::Client::connect(&self.url(), postgres::NoTls)
            .with_context(|| format!("connecting to {}", self.url()))
    }

    /// A new client connection as `role` (which must be a LOGIN role; the
    /// test cluster trusts loopback), for tests of what a non-superuser can
    /// and cannot do.
    pub fn client_as(&self, role: &str) -> Result<postgres::Client> {
        let url = self.url().replace("user=postgres", &format!("user={role}"));
        postgres::Client::connect(&url, postgres::NoTls)
            .with_context(|| format!("connecting as {role} to {url}"))
    }

    /// A client program of the server's installation (`pg_dump`, `psql`…),
    /// run as the current user; point it at the server with `-h 127.0.0.1
    /// -p PORT -U postgres`.
    pub fn tool(&self, program: &str) -> Command {
        Command::new(self.bin.join(program))
    }

    /// The data directory's root, where the server log and socket live.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Run `psql` (from the server's binaries) on the file `sql`; returns its
    /// stdout and stderr interleaved as a terminal would show them, whatever
    /// its exit status.
    pub fn psql(&self, sql: &Path) -> Result<String> {
        let out = self.root.join(format!("psql-{}.out", free_port()?));
        let file = std::fs::File::create(&out)?;
        let status = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .arg("-p")
            .arg(self.port.to_string())
            // Run from the file's directory so psql's messages name it
            // relatively (`psql:name.sql:21: ERROR: …`), the same anywhere.
            .current_dir(sql.parent().unwrap_or(Path::new(".")))
            .arg("-f")
            .arg(sql.file_name().unwrap_or(sql.as_os_str()))
            .stdout(file.try_clone()?)
            .stderr(file)
            .status()
            .context("running psql")?;
        let text = std::fs::read_to_string(&out)?;
        let _ = std::fs::remove_file(&out);
        let _ = status;
        Ok(text)
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }
}

/// Append `text` to the file at `path`.
fn append(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .with_context(|| format!("appending to {}", path.display()))
}

/// Connect to `url`, retrying while a server restarts (bounded: 30 s), for
/// clients of the crash tests.
pub fn connect_retrying(url: &str) -> Result<postgres::Client> {
    let mut last = None;
    for _ in 0..600 {
        match postgres::Client::connect(url, postgres::NoTls) {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    bail!("the server did not come back: {last:?}")
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-w", "-D"])
            .arg(self.data())
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Block until some backend of `client`'s server waits on a lock (a race a
/// test set up is in place), polling `pg_stat_activity`, never sleeping.
pub fn wait_for_lock_waiter(client: &mut postgres::Client) -> Result<()> {
    for _ in 0..100_000 {
        let n: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                &[],
            )?
            .get(0);
        if n > 0 {
            return Ok(());
        }
        std::thread::yield_now();
    }
    anyhow::bail!("no backend ever waited on a lock: the race was not set up")
}
