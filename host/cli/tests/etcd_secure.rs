//! `fencecheck authority … --etcd https://…` against an etcd member that
//! serves clients over TLS, requires a client certificate and has
//! authentication on: the flags, the password from a file or the
//! environment (never the command line), the errors an operator sees, and
//! `migrate --from etcd:https://…`.

use crate::pki;
use crate::secure_etcd;

use std::process::{Command, Output};

use anyhow::{Context, Result, ensure};
use pki::Pki;
use secure_etcd::{Admin, PASSWORD, secure_cluster};

const LOCK: &str = "report/july";

/// Run `fencecheck` with `args`; `password` in FENCECHECK_ETCD_PASSWORD.
fn fencecheck(args: &[String], password: Option<&str>) -> Result<Output> {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencecheck"));
    command
        .args(args)
        .env_remove("FENCECHECK_COMPONENT")
        .env_remove("FENCECHECK_ETCD_PASSWORD");
    if let Some(password) = password {
        command.env("FENCECHECK_ETCD_PASSWORD", password);
    }
    command.output().context("running fencecheck")
}

fn stdout(out: &Output) -> Result<String> {
    ensure!(
        out.status.success(),
        "fencecheck failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A failure whose message says `says`, and that printed no outcome.
fn refused(out: &Output, says: &str) -> Result<()> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1) && out.stdout.is_empty() && stderr.contains(says),
        "expected a failure saying {says:?}, got {}: {}{stderr}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(())
}

/// Acquire, renew and release through the CLI over TLS as the etcd user
/// `fencer` (password from a file, then from the environment); a wrong
/// password, no client certificate, no password and a user limited to
/// another prefix are errors that say so (exit 1, not the busy/lost exit
/// 3); `migrate --from etcd:https://…` moves the lineage to SQLite.
#[test]
fn authority_commands_over_tls_as_an_etcd_user() -> Result<()> {
    let pki = Pki::new()?;
    let cluster = secure_cluster(&pki, &[])?;
    let mut admin = Admin::new(&pki, &cluster)?;
    admin.enable_auth()?;
    let password_file = pki.dir().join("password");
    std::fs::write(&password_file, format!("{PASSWORD}\n"))?;
    let path = |p: &std::path::Path| p.display().to_string();
    let tls = [
        "--etcd".to_owned(),
        cluster.endpoint(0),
        "--etcd-cacert".into(),
        path(&pki.ca),
        "--etcd-cert".into(),
        path(&pki.client.cert),
        "--etcd-key".into(),
        path(&pki.client.key),
    ];
    let command = |words: &[&str], extra: &[&str]| -> Vec<String> {
        let mut args = vec!["authority".to_owned(), words[0].to_owned()];
        args.extend(tls.iter().cloned());
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(words[1..].iter().map(|s| s.to_string()));
        args
    };
    let with_file = ["--etcd-user", "fencer", "--etcd-password-file"];
    let mut file_args: Vec<&str> = with_file.to_vec();
    let password_path = path(&password_file);
    file_args.push(&password_path);

    let acquired = stdout(&fencecheck(
        &command(&["acquire", LOCK, "a7", "30000"], &file_args),
        None,
    )?)?;
    let token = acquired
        .split_whitespace()
        .skip_while(|w| *w != "token")
        .nth(1)
        .context(format!("no token in {acquired:?}"))?
        .to_owned();
    let renewed = stdout(&fencecheck(
        &command(
            &["renew", LOCK, "a7", &token, "30000"],
            &["--etcd-user", "fencer"],
        ),
        Some(PASSWORD),
    )?)?;
    ensure!(renewed.starts_with("renewed"), "{renewed}");
    let busy = fencecheck(
        &command(&["acquire", LOCK, "b9", "30000"], &file_args),
        None,
    )?;
    ensure!(
        busy.status.code() == Some(3),
        "a held lock is busy: {busy:?}"
    );

    // Errors an operator can act on; nothing changes.
    refused(
        &fencecheck(
            &command(&["release", LOCK, "a7", &token], &["--etcd-user", "fencer"]),
            Some("wrong"),
        )?,
        "wrong user name or password",
    )?;
    refused(
        &fencecheck(
            &command(&["release", LOCK, "a7", &token], &["--etcd-user", "fencer"]),
            None,
        )?,
        "FENCECHECK_ETCD_PASSWORD",
    )?;
    refused(
        &fencecheck(
            &command(
                &["release", LOCK, "a7", &token],
                &["--etcd-user", "stranger"],
            ),
            Some(PASSWORD),
        )?,
        "etcd permission denied: user \"stranger\"",
    )?;
    let mut no_cert: Vec<String> = command(&["release", LOCK, "a7", &token], &file_args);
    let at = no_cert
        .iter()
        .position(|a| a == "--etcd-cert")
        .context("no --etcd-cert")?;
    no_cert.drain(at..at + 4); // --etcd-cert PEM --etcd-key PEM
    refused(&fencecheck(&no_cert, None)?, "etcd TLS")?;

    let released = stdout(&fencecheck(
        &command(&["release", LOCK, "a7", &token], &file_args),
        None,
    )?)?;
    ensure!(released.trim() == "released", "{released}");

    // migrate reads the same flags for an etcd:https store.
    let target = pki.dir().join("moved.db");
    let mut migrate = vec![
        "authority".to_owned(),
        "migrate".into(),
        "--from".into(),
        format!("etcd:{}", cluster.endpoint(0)),
        "--to".into(),
        format!("sqlite:{}", target.display()),
    ];
    migrate.extend(tls[2..].iter().cloned());
    migrate.extend(file_args.iter().map(|s| s.to_string()));
    let moved = stdout(&fencecheck(&migrate, None)?)?;
    ensure!(moved.starts_with("migrated lineage"), "{moved}");
    let sealed = fencecheck(
        &command(&["acquire", LOCK, "c1", "30000"], &file_args),
        None,
    )?;
    refused(&sealed, "moved to sqlite:")?;
    Ok(())
}
