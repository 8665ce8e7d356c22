//! The `fencecheck` binary as a user runs it.

use crate::common;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use common::fencecheck;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors")
}

fn vector_args(runtime: &str) -> Result<Vec<String>> {
    let mut args = vec!["vectors".to_string(), "--runtime".into(), runtime.into()];
    for entry in std::fs::read_dir(vectors_dir())? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            args.push(path.display().to_string());
        }
    }
    Ok(args)
}

/// The demo shows the fence holding: B applied, A refused as stale, exit 0.
#[test]
fn demo_shows_the_fence_holding() -> Result<()> {
    let out = fencecheck(&["demo"])?;
    let text = String::from_utf8(out.stdout)?;
    ensure!(out.status.success(), "demo failed:\n{text}");
    ensure!(
        text.contains("B publishes with token 0.42 -> applied"),
        "{text}"
    );
    ensure!(
        text.contains("A publishes with token 0.41 -> stale-fence"),
        "{text}"
    );
    ensure!(
        text.contains("visible object : reports/july/b9.tmp"),
        "{text}"
    );
    Ok(())
}

/// `vectors` passes every file under both runtimes and says so in the last line.
#[test]
fn vectors_pass_under_both_runtimes() -> Result<()> {
    for runtime in ["wasm", "native"] {
        let args = vector_args(runtime)?;
        let files = args.len() - 3;
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = fencecheck(&refs)?;
        let text = String::from_utf8(out.stdout)?;
        ensure!(out.status.success(), "[{runtime}] {text}");
        ensure!(
            text.lines().last() == Some(format!("{files} passed, 0 failed").as_str()),
            "[{runtime}] {text}"
        );
    }
    Ok(())
}

/// An unreadable or malformed file is a failure with a non-zero exit.
#[test]
fn bad_vector_files_fail() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("fencecheck-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let broken = dir.join("broken.json");
    std::fs::write(&broken, "{\"name\": \"x\", \"steps\": [ {\"check\": {}} ]}")?;
    let missing = dir.join("missing.json");
    let out = fencecheck(&[
        "vectors",
        &broken.display().to_string(),
        &missing.display().to_string(),
    ])?;
    std::fs::remove_dir_all(&dir)?;
    let text = String::from_utf8(out.stdout)?;
    ensure!(!out.status.success(), "{text}");
    ensure!(text.lines().last() == Some("0 passed, 2 failed"), "{text}");
    Ok(())
}

/// `inspect` prints a state as JSON and refuses damaged or non-hex input.
#[test]
fn inspect_prints_json_and_refuses_damage() -> Result<()> {
    // A format-1 state: scope "report/july", highest 0.42, version 1.
    let hex = "46530139000000000000000000000000000000000000002a0000000000000001000000000000000b007265706f72742f6a756c7900";
    let good = format!("{hex}{}", crc_hex(hex)?);
    let out = fencecheck(&["inspect", &good])?;
    let text = String::from_utf8(out.stdout)?;
    ensure!(out.status.success(), "{text}");
    let json: serde_json::Value = serde_json::from_str(&text)?;
    ensure!(
        json["scope"] == "report/july" && json["version"] == 1,
        "{json}"
    );
    ensure!(json["highest"]["counter"] == 42, "{json}");

    let mut damaged = good.clone().into_bytes();
    damaged[20] = if damaged[20] == b'0' { b'1' } else { b'0' };
    for bad in [String::from_utf8(damaged)?, "zz".to_string()] {
        let out = fencecheck(&["inspect", &bad])?;
        ensure!(!out.status.success(), "accepted {bad}");
        ensure!(out.stdout.is_empty());
    }
    Ok(())
}

/// The CRC-32C of a hex string's bytes, little-endian hex, via the binary
/// itself would be circular, so computed here from the definition.
fn crc_hex(hex: &str) -> Result<String> {
    let bytes = hex::decode(hex)?;
    let mut crc = !0u32;
    for b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    Ok(hex::encode((!crc).to_le_bytes()))
}

/// `authority` acquires, reports busy (exit 3), refuses an old owner's
/// release, restores to a new epoch, and `inspect` reads the lease state.
#[test]
fn authority_commands_follow_the_lease_rules() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("fencecheck-cli-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("authority.db");
    let db = db.display().to_string();
    let run = |args: &[&str]| -> Result<(i32, String)> {
        let out = fencecheck(args)?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout)?,
        ))
    };
    let (code, text) = run(&[
        "authority",
        "acquire",
        "--db",
        &db,
        "report/july",
        "a7",
        "60000",
    ])?;
    ensure!(
        code == 0 && text.starts_with("acquired report/july lease a7 token "),
        "{text}"
    );
    let token = text
        .split_whitespace()
        .nth(5)
        .context("no token")?
        .to_string();
    ensure!(token.ends_with(":0.1"), "{token}");
    let (code, text) = run(&[
        "authority",
        "acquire",
        "--db",
        &db,
        "report/july",
        "b9",
        "60000",
    ])?;
    ensure!(
        code == 3 && text.starts_with("busy holder a7"),
        "{code} {text}"
    );
    let (code, text) = run(&[
        "authority",
        "release",
        "--db",
        &db,
        "report/july",
        "b9",
        &token,
    ])?;
    ensure!(code == 3 && text.trim() == "not-owner", "{code} {text}");
    let (code, text) = run(&[
        "authority",
        "release",
        "--db",
        &db,
        "report/july",
        "a7",
        &token,
    ])?;
    ensure!(code == 0 && text.trim() == "released", "{code} {text}");
    let (code, text) = run(&["authority", "restore", "--db", &db, "--at-least", "5"])?;
    ensure!(
        code == 0 && text.trim() == "restored epoch-floor 5",
        "{code} {text}"
    );
    let (code, text) = run(&[
        "authority",
        "acquire",
        "--db",
        &db,
        "report/july",
        "c1",
        "60000",
    ])?;
    ensure!(code == 0 && text.contains(":5.1 "), "{code} {text}");
    let (code, _) = run(&[
        "authority",
        "renew",
        "--db",
        &db,
        "report/july",
        "c1",
        "5.x",
        "10",
    ])?;
    ensure!(code == 2, "a malformed token is a usage error");

    let state: Vec<u8> = rusqlite::Connection::open(&db)?.query_row(
        "SELECT state FROM fencecheck_leases WHERE lock = 'report/july'",
        [],
        |r| r.get(0),
    )?;
    let (code, text) = run(&["inspect", &hex::encode(state)])?;
    std::fs::remove_dir_all(&dir)?;
    let json: serde_json::Value = serde_json::from_str(&text)?;
    ensure!(
        code == 0 && json["epoch"] == 5 && json["holder"]["lease_id"] == "c1",
        "{json}"
    );
    Ok(())
}

/// `authority … --postgres URL` runs the PostgreSQL coordinator: acquire,
/// busy for another holder, release, restore into a new epoch.
#[test]
fn authority_on_postgres() -> Result<()> {
    let server = fencecheck_tests::pgserver::PgServer::start()?;
    let url = server.url();
    let run = |args: &[&str]| -> Result<(i32, String)> {
        let out = fencecheck(args)?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8(out.stdout)? + &String::from_utf8(out.stderr)?,
        ))
    };
    let pg = ["--postgres", url.as_str()];
    let (code, text) = run(&[
        &["authority", "acquire"],
        &pg[..],
        &["report/july", "a7", "60000"],
    ]
    .concat())?;
    ensure!(
        code == 0 && text.starts_with("acquired report/july lease a7 token "),
        "{text}"
    );
    let token = text
        .split_whitespace()
        .nth(5)
        .context("no token")?
        .to_string();
    let (code, text) = run(&[
        &["authority", "acquire"],
        &pg[..],
        &["report/july", "b9", "60000"],
    ]
    .concat())?;
    ensure!(
        code == 3 && text.starts_with("busy holder a7"),
        "{code} {text}"
    );
    let (code, text) = run(&[
        &["authority", "release"],
        &pg[..],
        &["report/july", "a7", &token],
    ]
    .concat())?;
    ensure!(code == 0 && text.trim() == "released", "{code} {text}");
    let (code, text) = run(&[&["authority", "restore"], &pg[..], &["--at-least", "9"]].concat())?;
    ensure!(code == 0 && text.contains('9'), "{code} {text}");
    let (code, text) = run(&[
        &["authority", "acquire"],
        &pg[..],
        &["report/july", "c1", "60000"],
    ]
    .concat())?;
    ensure!(
        code == 0 && text.contains(":9.1 expires-at"),
        "{code} {text}"
    );
    // Exactly one store must be named.
    let (code, _) = run(&["authority", "acquire", "report/july", "x", "1"])?;
    ensure!(code != 0);
    Ok(())
}
