//! The seed's paused report writer (A acquires, pauses past its lease, B
//! acquires and publishes, A resumes and publishes with its old token)
//! through clients nobody here wrote: redis-cli / valkey-cli against a
//! golden transcript, redis-py and ioredis against the same expected lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{Options, Server, kinds};
use anyhow::{Context, Result, ensure};

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn run(cmd: &mut Command, stdin: Option<&Path>) -> Result<String> {
    if let Some(path) = stdin {
        cmd.stdin(std::fs::File::open(path)?);
    } else {
        cmd.stdin(Stdio::null());
    }
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn same(got: &str, golden: &Path) -> Result<()> {
    let want = std::fs::read_to_string(golden)?;
    ensure!(
        got == want,
        "{} differs:\n--- got\n{got}--- want\n{want}",
        golden.display()
    );
    Ok(())
}

/// redis-cli (Redis) and valkey-cli (Valkey) print the golden transcript:
/// B's object stays visible, A gets STALEFENCE, A's late renew and
/// release change nothing.
#[test]
fn paused_writer_through_the_cli() -> Result<()> {
    let dir = clients_dir();
    for kind in kinds() {
        let server = Server::start(kind, Options::test_clock())?;
        let got = run(
            Command::new(kind.cli()?).args(["-p", &server.port.to_string(), "--no-raw"]),
            Some(&dir.join("paused_writer.redis")),
        )?;
        same(&got, &dir.join("paused_writer.out")).with_context(|| format!("{kind:?}"))?;
    }
    Ok(())
}

/// redis-py and ioredis run the same scenario and print the same lines.
#[test]
fn paused_writer_through_redis_py_and_ioredis() -> Result<()> {
    let dir = clients_dir();
    ensure!(
        dir.join("node_modules/ioredis").exists(),
        "ioredis is not installed: npm ci --prefix host/redis/tests/clients (.ci/install.d/75-redis.sh)"
    );
    for kind in kinds() {
        let server = Server::start(kind, Options::test_clock())?;
        let got = run(
            Command::new("python3")
                .arg(dir.join("paused_writer.py"))
                .arg(server.port.to_string()),
            None,
        )?;
        same(&got, &dir.join("paused_writer.expected"))
            .with_context(|| format!("redis-py, {kind:?}"))?;
        let server = Server::start(kind, Options::test_clock())?;
        let got = run(
            Command::new("node")
                .arg(dir.join("paused_writer.mjs"))
                .arg(server.port.to_string()),
            None,
        )?;
        same(&got, &dir.join("paused_writer.expected"))
            .with_context(|| format!("ioredis, {kind:?}"))?;
    }
    Ok(())
}
