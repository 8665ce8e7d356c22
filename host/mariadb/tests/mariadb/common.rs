//! A real `mariadbd` for each test: its own data directory (copied from one
//! `mariadb-install-db` run per test process), a free loopback port, the
//! plugin built by this `cargo test` in a `plugin_dir` the test owns, and
//! the install SQL applied. As root (CI) the server runs as the `mysql`
//! user (else `nobody`) through `runuser`, as the PostgreSQL tests do.
//! Dropping the [`Server`] kills it and removes its directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use mysql::prelude::Queryable;
use mysql::{Conn, OptsBuilder};

/// The plugin cargo built for this package, in the `deps/` directory the
/// test binary runs from (or `FENCECHECK_MARIADB_SO`).
pub fn plugin() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("FENCECHECK_MARIADB_SO") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe()?;
    let deps = exe.parent().context("test binary has no directory")?;
    let path = deps.join("libfencecheck_mariadb.so");
    ensure!(path.exists(), "{} not built", path.display());
    Ok(path)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run_as() -> Option<&'static str> {
    if !is_root() {
        return None;
    }
    Some(if user_exists("mysql") {
        "mysql"
    } else {
        "nobody"
    })
}

/// A free loopback port never handed out before in this process: the
/// kernel may give a just-closed port again, and two servers of one test
/// run on one port would connect tests to each other's server.
fn free_port() -> Result<u16> {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .map_err(|_| anyhow::anyhow!("port list poisoned"))?;
    for _ in 0..100 {
        let listener = TcpListener::bind("127.0.0.1:0").context("finding a free loopback port")?;
        let port = listener.local_addr()?.port();
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    bail!("no fresh loopback port after 100 tries")
}

fn as_server_user(program: &str) -> Command {
    match run_as() {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--", program]);
            c
        }
        None => Command::new(program),
    }
}

fn check(command: &mut Command) -> Result<()> {
    let out = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn chown(path: &Path) -> Result<()> {
    if let Some(user) = run_as() {
        check(Command::new("chown").arg("-R").arg(user).arg(path))?;
    }
    Ok(())
}

/// Templates of test processes that have exited (nothing runs at a Rust
/// process's exit to remove its own): each is named by its process id.
fn remove_dead_templates() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("fencecheck-mariadb-template-"))
        else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// One `mariadb-install-db` per test process; every server copies it.
fn template() -> Result<&'static Path> {
    static TEMPLATE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let make = || -> Result<PathBuf> {
                remove_dead_templates();
                let dir = std::env::temp_dir().join(format!(
                    "fencecheck-mariadb-template-{}",
                    std::process::id()
                ));
                let _ = std::fs::remove_dir_all(&dir);
                let tmp = dir.join("tmp");
                let dir = dir.join("data");
                std::fs::create_dir_all(&dir)?;
                std::fs::create_dir_all(&tmp)?;
                chown(dir.parent().unwrap_or(&dir))?;
                check(
                    as_server_user("mariadb-install-db")
                        .arg("--no-defaults")
                        .arg(format!("--datadir={}", dir.display()))
                        // Its own tmpdir, as every server's: a starting
                        // mariadbd deletes the `#sql*` files in its tmpdir,
                        // another server's temporary tables among them.
                        .arg(format!("--tmpdir={}", tmp.display()))
                        .args([
                            "--auth-root-authentication-method=normal",
                            "--skip-test-db",
                            "--skip-name-resolve",
                        ])
                        .current_dir(std::env::temp_dir()),
                )?;
                Ok(dir)
            };
            make().map_err(|e| format!("{e:#}"))
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// A running server.
pub struct Server {
    root: PathBuf,
    port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    test_clock: bool,
}

impl Server {
    /// A fresh server with the plugin and the `fencecheck` schema installed,
    /// and an empty database `app`.
    pub fn start() -> Result<Self> {
        Self::start_with(&[])
    }

    /// [`Server::start`] with extra `mariadbd` options.
    pub fn start_with(extra: &[&str]) -> Result<Self> {
        Self::start_opts(extra, false)
    }

    /// [`Server::start`] with the lease test clock on
    /// (`FENCECHECK_MARIADB_TEST_CLOCK=1`): `@fencecheck_now_ms` is honoured.
    pub fn start_with_test_clock() -> Result<Self> {
        Self::start_opts(&[], true)
    }

    fn start_opts(extra: &[&str], test_clock: bool) -> Result<Self> {
        let template = template()?;
        // Unique in this process: a reused name would remove a running
        // server's directory.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "fencecheck-mariadb-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("plugin"))?;
        std::fs::create_dir_all(root.join("tmp"))?;
        check(
            Command::new("cp")
                .arg("-a")
                .arg(template)
                .arg(root.join("data")),
        )?;
        std::fs::copy(plugin()?, root.join("plugin/libfencecheck_mariadb.so"))
            .context("copying the plugin")?;
        chown(&root)?;
        let mut server = Server {
            root,
            port: free_port()?,
            child: None,
            extra: extra.iter().map(|s| (*s).to_string()).collect(),
            test_clock,
        };
        server.launch()?;
        let mut conn = server.root_conn(None)?;
        run_script(&mut conn, fencecheck_mariadb::INSTALL_SQL)?;
        conn.query_drop("CREATE DATABASE app")?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<()> {
        let log = std::fs::File::create(self.root.join("stdout.log"))?;
        let mut command = as_server_user("/usr/sbin/mariadbd");
        // runuser keeps the environment; without it the variable is unset.
        if self.test_clock {
            command.env(fencecheck_mariadb::TEST_CLOCK_ENV, "1");
        } else {
            command.env_remove(fencecheck_mariadb::TEST_CLOCK_ENV);
        }
        let child = command
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.root.join("data").display()))
            .arg(format!(
                "--plugin-dir={}",
                self.root.join("plugin").display()
            ))
            .arg(format!("--socket={}", self.root.join("sock").display()))
            // Its own temporary files: none shared with other servers.
            .arg(format!("--tmpdir={}", self.root.join("tmp").display()))
            .arg(format!("--pid-file={}", self.root.join("pid").display()))
            .arg(format!(
                "--log-error={}",
                self.root.join("err.log").display()
            ))
            .arg(format!("--port={}", self.port))
            .args([
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
                "--max-connections=200",
            ])
            .args(&self.extra)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("starting mariadbd")?;
        self.child = Some(child);
        // Ready when it accepts a connection; a server that exits fails now.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("mariadbd exited ({status}): {}", self.log());
            }
            match Conn::new(self.opts("root", "", None)) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!("mariadbd did not accept connections: {e}\n{}", self.log())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The server's error log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("err.log")).unwrap_or_default()
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn opts(&self, user: &str, password: &str, db: Option<&str>) -> OptsBuilder {
        OptsBuilder::new()
            .ip_or_hostname(Some("127.0.0.1"))
            .tcp_port(self.port)
            .user(Some(user))
            .pass(Some(password))
            .db_name(db)
            .prefer_socket(false)
    }

    fn root_conn(&self, db: Option<&str>) -> Result<Conn> {
        Conn::new(self.opts("root", "", db)).context("connecting as root")
    }

    /// A root connection to database `app`.
    pub fn conn(&self) -> Result<Conn> {
        self.root_conn(Some("app"))
    }

    /// A connection to `app` as `user` (password `pw`).
    pub fn conn_as(&self, user: &str) -> Result<Conn> {
        Conn::new(self.opts(user, "pw", Some("app")))
            .with_context(|| format!("connecting as {user}"))
    }

    /// Whether the server answers a query.
    pub fn answers(&self) -> bool {
        self.conn()
            .and_then(|mut c| Ok(c.query_first::<i64, _>("SELECT 1")?))
            .is_ok_and(|v| v == Some(1))
    }

    /// SIGKILL the server (no shutdown, no flush) and wait for it to exit.
    pub fn kill9(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            // The child is `runuser` as root: kill the server itself by its pid file.
            let pid = std::fs::read_to_string(self.root.join("pid")).unwrap_or_default();
            if let Ok(pid) = pid.trim().parse::<i32>() {
                check(Command::new("kill").args(["-KILL", &pid.to_string()]))?;
            }
            let _ = child.kill();
            child.wait()?;
        }
        let _ = std::fs::remove_file(self.root.join("pid"));
        Ok(())
    }

    /// Start the server again on the same data directory and port.
    pub fn restart(&mut self) -> Result<()> {
        self.launch()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.kill9();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Run a script written for the `mariadb` client: statements end at the
/// current delimiter, which `DELIMITER x` lines change.
pub fn run_script(conn: &mut Conn, script: &str) -> Result<()> {
    for statement in split_script(script) {
        conn.query_drop(&statement)
            .with_context(|| format!("running {statement}"))?;
    }
    Ok(())
}

/// The statements of a `mariadb` client script.
pub fn split_script(script: &str) -> Vec<String> {
    let mut delimiter = ";".to_string();
    let mut statements = Vec::new();
    let mut current = String::new();
    for line in script.lines() {
        let trimmed = line.trim();
        if let Some(d) = trimmed.strip_prefix("DELIMITER ") {
            delimiter = d.trim().to_string();
            continue;
        }
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with("--")) {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if trimmed.ends_with(delimiter.as_str()) {
            let end = current.trim_end().len() - delimiter.len();
            statements.push(current[..end].to_string());
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        statements.push(current);
    }
    statements
}

/// The error of a statement that must fail: (error number, SQLSTATE, message).
pub fn error_of<T: std::fmt::Debug>(result: mysql::Result<T>) -> Result<(u16, String, String)> {
    match result {
        Err(mysql::Error::MySqlError(e)) => Ok((e.code, e.state, e.message)),
        Err(other) => bail!("expected a server error, got {other}"),
        Ok(value) => bail!("expected an error, got {value:?}"),
    }
}
