//! The S3 front with the clients people use: boto3 (tests/s3/clients.py),
//! aws-cli and rclone, against a real gateway on loopback. Tokens come from
//! the gateway's own lock endpoints; the same keys are read back through
//! `/objects`, so both surfaces are one fenced store.

use crate::common;
// The HTTP and S3 fuzzer (issue 34): here, for this file's S3 credentials and
// so as not to link one more test binary.
#[path = "fuzz/mod.rs"]
pub(crate) mod fuzz;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, ensure};
use common::{Gateway, ROOT_SECRET, sha256_hex};
use fencecheck_tests::pgserver::PgServer;
use fencecheck_tests::s3server::{self as s3fs, S3Server};
use serde_json::json;

const KEY: &str = "AKIAFENCECHECKROOT";
const SECRET: &str = "rootSecretAccessKey/0123456789abcdefABCDEF";
const READER_KEY: &str = "AKIAFENCECHECKREAD";
const READER_SECRET: &str = "readerSecretAccessKey/0123456789abcdefAB";

/// An auth file with `root` (bearer and S3, every right) and `reader` (S3,
/// read only), mode 600 as the gateway requires of S3 secrets.
fn s3_auth(data: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(data)?;
    let file = data.join("auth.toml");
    std::fs::write(
        &file,
        format!(
            r#"[[principal]]
name = "root"
secret_sha256 = "{}"
access_key_id = "{KEY}"
secret_access_key = "{SECRET}"
read = [""]
write = [""]
lock = [""]

[[principal]]
name = "reader"
access_key_id = "{READER_KEY}"
secret_access_key = "{READER_SECRET}"
read = ["reports/"]
"#,
            sha256_hex(ROOT_SECRET)
        ),
    )?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

fn start(data: &Path) -> anyhow::Result<Gateway> {
    start_with(data, &[], &[])
}

fn start_with(data: &Path, extra: &[&str], env: &[(&str, &Path)]) -> anyhow::Result<Gateway> {
    let auth = s3_auth(data)?.display().to_string();
    let mut args = vec!["--auth", &auth, "--bucket", "reports", "--bucket", "other"];
    args.extend_from_slice(extra);
    let mut gw = Gateway::spawn_logged(data, &args, Some(ROOT_SECRET.to_owned()), None, env)?;
    gw.wait_healthy()?;
    Ok(gw)
}

/// A gateway whose blobs are in an S3 bucket (`blobs`) of an in-process
/// s3s-fs server under `root`.
fn start_on_s3(data: &Path, root: &Path, extra: &[&str]) -> anyhow::Result<(Gateway, S3Server)> {
    let upstream = S3Server::start(root, &["blobs"])?;
    let url = format!("http://{}", upstream.addr);
    let mut args = vec!["--s3-upstream", url.as_str(), "--s3-bucket", "blobs"];
    args.extend_from_slice(extra);
    let gw = start_with(
        data,
        &args,
        &[
            ("AWS_ACCESS_KEY_ID", Path::new(s3fs::KEY)),
            ("AWS_SECRET_ACCESS_KEY", Path::new(s3fs::SECRET)),
        ],
    )?;
    Ok((gw, upstream))
}

/// The size of the largest blob in the upstream bucket (0: none).
fn largest_upstream_blob(root: &Path) -> anyhow::Result<u64> {
    let mut largest = 0;
    match std::fs::read_dir(root.join("blobs/fencecheck-blobs")) {
        Ok(entries) => {
            for entry in entries {
                largest = largest.max(entry?.metadata()?.len());
            }
            Ok(largest)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// The blobs kept in the upstream bucket.
fn upstream_blobs(root: &Path) -> anyhow::Result<usize> {
    match std::fs::read_dir(root.join("blobs/fencecheck-blobs")) {
        Ok(entries) => Ok(entries
            .filter_map(Result::ok)
            .filter(|e| e.path().is_file())
            .count()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// A fencing token from the gateway's lock endpoint.
fn acquire(gw: &Gateway, lock: &str, lease: &str) -> anyhow::Result<String> {
    let r = gw.request(
        "POST",
        &format!("/v1/locks/{lock}/acquire"),
        &[("Content-Type", "application/json")],
        json!({"lease_id": lease, "ttl_ms": 60_000})
            .to_string()
            .as_bytes(),
    )?;
    ensure!(r.status == 200, "acquire: {r:?}");
    Ok(r.json()?["token"].as_str().context("no token")?.to_owned())
}

fn release(gw: &Gateway, lock: &str, lease: &str, token: &str) -> anyhow::Result<()> {
    let r = gw.request(
        "POST",
        &format!("/v1/locks/{lock}/release"),
        &[("Content-Type", "application/json")],
        json!({"lease_id": lease, "token": token})
            .to_string()
            .as_bytes(),
    )?;
    ensure!(r.status == 200, "release: {r:?}");
    Ok(())
}

/// boto3's multipart scenario on `reports/mp/big.bin` under three
/// successive grants A, B, C (A and B released, so both are stale).
fn boto3_multipart(gw: &Gateway) -> anyhow::Result<()> {
    let lock = "reports/mp/big.bin";
    let a = acquire(gw, lock, "a")?;
    release(gw, lock, "a", &a)?;
    let b = acquire(gw, lock, "b")?;
    release(gw, lock, "b", &b)?;
    let c = acquire(gw, lock, "c")?;
    boto3(
        gw,
        "multipart",
        &[("TOKEN_A", &a), ("TOKEN_B", &b), ("TOKEN_C", &c)],
    )
}

/// Run a command; its output if it succeeded, else an error with both.
fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(stdout)
}

/// One boto3 scenario of tests/s3/clients.py.
fn boto3(gw: &Gateway, scenario: &str, env: &[(&str, &str)]) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/clients.py");
    run(Command::new("python3")
        .arg(script)
        .arg(scenario)
        .env("S3_ENDPOINT", format!("http://{}", gw.addr))
        .env("S3_KEY", KEY)
        .env("S3_SECRET", SECRET)
        .env("READER_KEY", READER_KEY)
        .env("READER_SECRET", READER_SECRET)
        .envs(env.iter().copied()))?;
    Ok(())
}

/// One minio-py scenario of tests/s3/minio_client.py.
fn minio(gw: &Gateway, scenario: &str, env: &[(&str, &str)]) -> anyhow::Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/s3/minio_client.py");
    run(Command::new("python3")
        .arg(script)
        .arg(scenario)
        .env("S3_ENDPOINT", format!("http://{}", gw.addr))
        .env("S3_KEY", KEY)
        .env("S3_SECRET", SECRET)
        .env("READER_KEY", READER_KEY)
        .env("READER_SECRET", READER_SECRET)
        .envs(env.iter().copied()))?;
    Ok(())
}

/// minio-py, which reads an error only from a body typed
/// `application/xml`: put and get; a stale PUT and DELETE are S3Errors
/// with code StaleFence read from the body; a missing token, a missing
/// right, key or bucket, failed conditions (If-Match, If-None-Match: *, a
/// range) and a bad signature all reach it with their S3 codes; the
/// current token deletes.
#[test]
fn minio_reads_every_refusal() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    let lock = "reports/minio/report.csv";
    let a = acquire(&gw, lock, "a")?;
    release(&gw, lock, "a", &a)?;
    let b = acquire(&gw, lock, "b")?;
    minio(&gw, "fenced", &[("TOKEN_A", &a), ("TOKEN_B", &b)])?;
    let r = gw.request("GET", "/objects/reports/minio/report.csv", &[], b"")?;
    ensure!(r.status == 404, "{r:?}");
    Ok(())
}

/// The seed's paused writer over S3: A's lease ends (released here: the
/// coordinator's own expiry is tested with a fake clock in
/// host/authority), B acquires a higher token and writes with boto3; A's
/// boto3 PUT and DELETE with its old token are StaleFence 409, and B's
/// object is what both surfaces serve.
#[test]
fn boto3_paused_writer_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    let lock = "reports/paused/report.csv";
    let a = acquire(&gw, lock, "a")?;
    release(&gw, lock, "a", &a)?;
    let b = acquire(&gw, lock, "b")?;
    boto3(&gw, "paused_writer", &[("TOKEN_A", &a), ("TOKEN_B", &b)])?;
    // B deleted it at the end: /objects agrees it is gone.
    let r = gw.request("GET", "/objects/reports/paused/report.csv", &[], b"")?;
    ensure!(r.status == 404, "{r:?}");
    Ok(())
}

/// Multipart through boto3: a Complete whose token went stale during the
/// upload is StaleFence and changes nothing; a fresh one publishes the
/// parts in order with S3's multipart ETag; bad part lists are refused.
#[test]
fn boto3_multipart_is_fenced_at_complete() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    boto3_multipart(&gw)?;
    let r = gw.request("GET", "/objects/reports/mp/big.bin", &[], b"")?;
    ensure!(r.status == 200 && r.body.len() == 6 << 20, "{}", r.status);
    Ok(())
}

/// A CompleteMultipartUpload at or over `--complete-keepalive-from`
/// answers 200 at once and streams its result after whitespace (as S3
/// does); boto3 reads it as the same result, a Complete refused before
/// the copy (stale at once) keeps its own status, and a failure found
/// during the copy reaches boto3 with its S3 code.
#[test]
fn boto3_multipart_with_keep_alive() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let twelve = (12u64 << 20).to_string();
    let gw = start_with(
        dir.path(),
        &["--complete-keepalive-from", "1", "--max-upload", &twelve],
        &[],
    )?;
    let lock = "reports/mp/big.bin";
    let a = acquire(&gw, lock, "a")?;
    release(&gw, lock, "a", &a)?;
    let b = acquire(&gw, lock, "b")?;
    release(&gw, lock, "b", &b)?;
    let c = acquire(&gw, lock, "c")?;
    boto3(
        &gw,
        "multipart",
        &[
            ("TOKEN_A", &a),
            ("TOKEN_B", &b),
            ("TOKEN_C", &c),
            ("KEEPALIVE", "1"),
        ],
    )?;
    let r = gw.request("GET", "/objects/reports/mp/big.bin", &[], b"")?;
    ensure!(r.status == 200 && r.body.len() == 6 << 20, "{}", r.status);
    // A failure found during the copy (a part's blob removed behind the
    // gateway's back) comes as an error document in the 200.
    let blobs = |dir: &Path| -> anyhow::Result<Vec<PathBuf>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir.join("blobs"))? {
            found.push(entry?.path());
        }
        Ok(found)
    };
    let before = blobs(dir.path())?;
    let state = dir.path().join("upload.json");
    let state = state.to_str().context("path")?;
    boto3(&gw, "upload_bounded", &[("STATE", state)])?;
    let part = blobs(dir.path())?
        .into_iter()
        .find(|b| !before.contains(b))
        .context("no part blob")?;
    std::fs::remove_file(part)?;
    boto3(
        &gw,
        "complete_saved",
        &[
            ("STATE", state),
            ("EXPECT", "InvalidPart"),
            // botocore reads an error in a Complete's 200 as a 500 (and
            // retries it); the code is the gateway's.
            ("EXPECT_STATUS", "500"),
        ],
    )?;
    Ok(())
}

/// SIGKILL with an upload in progress: after a restart nothing of it is
/// visible, and the collector deletes its parts after `--upload-retention`.
#[test]
fn killed_upload_leaves_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut gw = start(dir.path())?;
    boto3(&gw, "begin_only", &[])?;
    ensure!(gw.blob_count()? == 2, "{} blobs", gw.blob_count()?);
    gw.child.kill()?;
    gw.child.wait()?;
    let auth = dir.path().join("auth.toml").display().to_string();
    let mut gw = Gateway::spawn(
        dir.path(),
        &[
            "--auth",
            &auth,
            "--bucket",
            "reports",
            "--upload-retention",
            "1",
            "--gc-interval",
            "1",
        ],
        Some(ROOT_SECRET.to_owned()),
    )?;
    gw.wait_healthy()?;
    let r = gw.request("GET", "/objects/reports/killed/big.bin", &[], b"")?;
    ensure!(r.status == 404, "{r:?}");
    // The collector's passes are a second apart: wait for the condition,
    // bounded, not for a guessed time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while gw.blob_count()? > 0 {
        ensure!(
            std::time::Instant::now() < deadline,
            "{} blobs still kept",
            gw.blob_count()?
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
}

/// An upload outlives `--retention` (how long a PUT's staged blob is
/// kept) and is kept for `--upload-retention` (24 h): once a collector
/// pass has taken a replaced blob staged after the upload's parts, the
/// parts are all still there and the upload completes.
#[test]
fn uploads_outlive_the_blob_retention() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    uploads_outlive(dir.path(), &[])
}

/// As `uploads_outlive_the_blob_retention`, with pointers in PostgreSQL
/// (its collector locks and deletes in two statements of its own).
#[test]
fn uploads_outlive_the_blob_retention_on_postgres() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let dir = tempfile::tempdir()?;
    uploads_outlive(dir.path(), &["--postgres", &server.url()])
}

fn uploads_outlive(data: &Path, extra: &[&str]) -> anyhow::Result<()> {
    let twelve = (12u64 << 20).to_string();
    let mut args = vec![
        "--retention",
        "1",
        "--gc-interval",
        "1",
        "--max-upload",
        &twelve,
    ];
    args.extend_from_slice(extra);
    let gw = start_with(data, &args, &[])?;
    let state = data.join("upload.json");
    let state = state.to_str().context("path")?;
    boto3(&gw, "upload_bounded", &[("STATE", state)])?;
    for token in ["1.1", "1.2"] {
        let r = gw.request(
            "PUT",
            "/objects/reports/churn",
            &[("Fence-Token", token)],
            token.as_bytes(),
        )?;
        ensure!(r.status == 200 || r.status == 201, "{r:?}");
    }
    // Three parts and two bodies; the first body, replaced, goes at the
    // collector's first pass after a second (bounded wait for it). A pass
    // that took it took everything older under the same rule.
    ensure!(gw.blob_count()? == 5, "{} blobs", gw.blob_count()?);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while gw.blob_count()? == 5 {
        ensure!(
            std::time::Instant::now() < deadline,
            "the replaced blob outlived --retention"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ensure!(
        gw.blob_count()? == 4,
        "{} blobs: the upload's parts went with the replaced blob",
        gw.blob_count()?
    );
    boto3(&gw, "complete_saved", &[("STATE", state), ("EXPECT", "ok")])?;
    Ok(())
}

/// `--max-upload` bounds a multipart upload's parts together: at
/// UploadPart (a part that would pass it is EntityTooLarge and kept
/// nowhere) and again at Complete (here under a gateway restarted with a
/// smaller bound: refused, nothing visible). A part number sent again
/// replaces its blob instead of adding one. The answer kept for a retried
/// Complete is pruned after `--retention`.
#[test]
fn multipart_is_bounded_by_max_upload() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("upload.json");
    let state = state.to_str().context("path")?;
    let restart = |gw: Gateway, max: &str| -> anyhow::Result<Gateway> {
        drop(gw);
        start_with(dir.path(), &["--max-upload", max], &[])
    };
    let twelve = (12u64 << 20).to_string();
    let gw = start_with(dir.path(), &["--max-upload", &twelve], &[])?;
    boto3(&gw, "upload_bounded", &[("STATE", state)])?;
    // Parts 1, 2, 3: the two earlier uploads of part 1 and the refused
    // part 3 left no blob.
    ensure!(gw.blob_count()? == 3, "{} blobs", gw.blob_count()?);
    let gw = restart(gw, &(8u64 << 20).to_string())?;
    boto3(
        &gw,
        "complete_saved",
        &[("STATE", state), ("EXPECT", "EntityTooLarge")],
    )?;
    ensure!(gw.blob_count()? == 3, "{} blobs", gw.blob_count()?);
    let gw = restart(gw, &twelve)?;
    boto3(&gw, "complete_saved", &[("STATE", state), ("EXPECT", "ok")])?;
    // Published: one blob, the parts gone.
    ensure!(gw.blob_count()? == 1, "{} blobs", gw.blob_count()?);
    drop(gw);
    let gw = start_with(dir.path(), &["--retention", "1", "--gc-interval", "1"], &[])?;
    // The completed upload's answer (kept for a retried Complete) is
    // pruned after --retention: wait for it, bounded.
    let db = rusqlite::Connection::open(dir.path().join("fencecheck.db"))?;
    let kept = || -> anyhow::Result<i64> {
        Ok(db.query_row(
            "SELECT count(*) FROM fencecheck_gateway_completed",
            [],
            |r| r.get(0),
        )?)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while kept()? > 0 {
        ensure!(
            std::time::Instant::now() < deadline,
            "a completed upload's record outlived --retention"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    ensure!(gw.blob_count()? == 1, "{} blobs", gw.blob_count()?);
    Ok(())
}

/// The S3 front over `--postgres` (pointers, marks, ETags and the parts
/// table in PostgreSQL): reads and conditional writes, a multipart upload
/// fenced at Complete, the `--max-upload` bound with a part retried, and
/// the listings of parts and uploads in progress, as on SQLite.
#[test]
fn s3_front_on_postgres() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let dir = tempfile::tempdir()?;
    let url = server.url();
    let twelve = (12u64 << 20).to_string();
    let gw = start_with(
        dir.path(),
        &["--postgres", &url, "--max-upload", &twelve],
        &[],
    )?;
    boto3(&gw, "objects", &[])?;
    boto3_multipart(&gw)?;
    let before = gw.blob_count()?;
    let state = dir.path().join("upload.json");
    let state = state.to_str().context("path")?;
    boto3(&gw, "upload_bounded", &[("STATE", state)])?;
    ensure!(
        gw.blob_count()? == before + 3,
        "{} blobs, {before} before",
        gw.blob_count()?
    );
    boto3(&gw, "complete_saved", &[("STATE", state), ("EXPECT", "ok")])?;
    ensure!(
        gw.blob_count()? == before + 1,
        "{} blobs, {before} before",
        gw.blob_count()?
    );
    let r = gw.request("GET", "/objects/reports/bounded/big.bin", &[], b"")?;
    ensure!(r.status == 200 && r.body.len() == 12 << 20, "{}", r.status);
    boto3(&gw, "upload_listings", &[])?;
    Ok(())
}

/// Bad signatures, secrets, dates, digests, rights, buckets and keys are
/// refused with S3's errors, and none of those writes leaves a blob.
#[test]
fn boto3_refusals_change_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    boto3(&gw, "refusals", &[])?;
    // Refused bodies were never kept: no blob is left behind.
    ensure!(gw.blob_count()? == 0, "{} blobs left", gw.blob_count()?);
    Ok(())
}

/// CopyObject through boto3: a fenced write of the destination with the
/// copier's token (a stale copier is refused, the source's metadata is
/// no token), REPLACE, the source's conditions, S3's rules and rights;
/// UploadPartCopy with ranges and through boto3's managed copy.
#[test]
fn boto3_copies_are_fenced() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    boto3(&gw, "copies", &[])?;
    let r = gw.request("GET", "/objects/reports/cp/dst.bin", &[], b"")?;
    ensure!(r.status == 200 && r.body.len() == 100_000, "{}", r.status);
    Ok(())
}

/// DeleteObjects through boto3 (the client call and the resource API's
/// prefix delete): one token, each key decided by its own mark; stale,
/// unauthorized and versioned keys are Errors entries, the rest deleted.
#[test]
fn boto3_batch_deletes_are_fenced_per_key() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    boto3(&gw, "batch_deletes", &[])?;
    let r = gw.request("GET", "/objects/reports/bd/c", &[], b"")?;
    ensure!(r.status == 404, "{}", r.status);
    Ok(())
}

/// Ranges, MD5 ETags, versions, trailing checksums, conditional reads,
/// listings (version 2 and 1) with a delimiter and continuation,
/// presigned URLs and conditional writes, through boto3; the S3 key is
/// the `/objects` key `bucket/key`.
#[test]
fn boto3_reads_what_it_wrote() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    boto3(&gw, "objects", &[])?;
    let r = gw.request("GET", "/objects/reports/o/data.bin", &[], b"")?;
    ensure!(r.status == 200 && r.body == b"y", "{r:?}");
    Ok(())
}

fn aws(gw: &Gateway, args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("aws")
        .args(["--endpoint-url", &format!("http://{}", gw.addr), "s3"])
        .args(args)
        .env("AWS_ACCESS_KEY_ID", KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"))
}

/// aws-cli: `s3 cp` up (multipart; the token as metadata) and down, byte for byte;
/// `s3 ls` lists it; a copy with an older token fails and changes nothing;
/// `s3 cp` from S3 to S3 is a CopyObject (small) or UploadPartCopy
/// (large) under the copier's token.
#[test]
fn aws_cli_cp_and_ls() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    let file = dir.path().join("upload.bin");
    // Over aws-cli's 8 MiB multipart threshold: three parts.
    let body: Vec<u8> = (0..20 << 20).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(&file, &body)?;
    let up = file.display().to_string();
    aws(
        &gw,
        &[
            "cp",
            &up,
            "s3://reports/cli/upload.bin",
            "--metadata",
            "fence-token=2.5",
        ],
    )?;
    let head = run(Command::new("aws")
        .args(["--endpoint-url", &format!("http://{}", gw.addr)])
        .args([
            "s3api",
            "head-object",
            "--bucket",
            "reports",
            "--key",
            "cli/upload.bin",
        ])
        .env("AWS_ACCESS_KEY_ID", KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"))?;
    ensure!(head.contains("-3\\\""), "not a three-part upload: {head}");
    let listed = aws(&gw, &["ls", "s3://reports/cli/"])?;
    ensure!(
        listed.contains("upload.bin") && listed.contains(&body.len().to_string()),
        "{listed}"
    );
    let down = dir.path().join("download.bin");
    aws(
        &gw,
        &[
            "cp",
            "s3://reports/cli/upload.bin",
            &down.display().to_string(),
        ],
    )?;
    ensure!(std::fs::read(&down)? == body, "the download differs");
    let stale = aws(
        &gw,
        &[
            "cp",
            &up,
            "s3://reports/cli/upload.bin",
            "--metadata",
            "fence-token=2.4",
        ],
    );
    ensure!(stale.is_err(), "a stale copy succeeded");
    ensure!(
        format!("{:?}", stale.err()).contains("StaleFence"),
        "not refused as stale"
    );
    let r = gw.request("GET", "/objects/reports/cli/upload.bin", &[], b"")?;
    ensure!(r.status == 200 && r.body == body, "status {}", r.status);
    // A copy inside the gateway (CopyObject, under aws-cli's multipart
    // threshold), the copier's token as the new metadata.
    let small = dir.path().join("small.txt");
    std::fs::write(&small, b"copied by the gateway")?;
    aws(
        &gw,
        &[
            "cp",
            &small.display().to_string(),
            "s3://reports/cli/small.txt",
            "--metadata",
            "fence-token=2.5",
        ],
    )?;
    aws(
        &gw,
        &[
            "cp",
            "s3://reports/cli/small.txt",
            "s3://reports/cli/copy.txt",
            "--metadata",
            "fence-token=2.6",
            "--metadata-directive",
            "REPLACE",
        ],
    )?;
    // Over the threshold: a multipart copy (UploadPartCopy), the token as
    // the new upload's metadata.
    aws(
        &gw,
        &[
            "cp",
            "s3://reports/cli/upload.bin",
            "s3://reports/cli/upload-copy.bin",
            "--metadata",
            "fence-token=2.6",
            "--metadata-directive",
            "REPLACE",
        ],
    )?;
    let r = gw.request("GET", "/objects/reports/cli/upload-copy.bin", &[], b"")?;
    ensure!(r.status == 200 && r.body == body, "status {}", r.status);
    let r = gw.request("GET", "/objects/reports/cli/copy.txt", &[], b"")?;
    ensure!(
        r.status == 200
            && r.body == b"copied by the gateway"
            && r.header("fence-token") == Some("2.6"),
        "{r:?}"
    );
    Ok(())
}

fn s3cmd(gw: &Gateway, args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("s3cmd")
        .args(["-c", "/dev/null", "--no-ssl", "--region=us-east-1"])
        .arg(format!("--access_key={KEY}"))
        .arg(format!("--secret_key={SECRET}"))
        .arg(format!("--host={}", gw.addr))
        // No %(bucket)s in it: path-style requests.
        .arg(format!("--host-bucket={}", gw.addr))
        .args(args))
}

/// The clients docs/gateway.md names as unable to send a token on a
/// delete, s3cmd (`--add-header` reaches uploads only) and aws-cli, upload
/// with the token as metadata; their delete, without it, is refused
/// `MissingFenceToken` and the object stays; the documented way round,
/// `DELETE /objects/{bucket}/{key}` with `Fence-Token`, deletes it.
#[test]
fn deletes_from_clients_without_a_header() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    let file = dir.path().join("up.txt");
    std::fs::write(&file, b"kept")?;
    let up = file.display().to_string();
    s3cmd(
        &gw,
        &[
            "put",
            &up,
            "s3://reports/del/s3cmd.txt",
            "--add-header=x-amz-meta-fence-token:7.1",
        ],
    )?;
    let refused = s3cmd(&gw, &["del", "s3://reports/del/s3cmd.txt"]);
    ensure!(
        format!("{:?}", refused.err()).contains("MissingFenceToken"),
        "s3cmd del was not refused for its missing token"
    );
    aws(
        &gw,
        &[
            "cp",
            &up,
            "s3://reports/del/aws.txt",
            "--metadata",
            "fence-token=7.1",
        ],
    )?;
    let refused = aws(&gw, &["rm", "s3://reports/del/aws.txt"]);
    ensure!(
        format!("{:?}", refused.err()).contains("MissingFenceToken"),
        "aws s3 rm was not refused for its missing token"
    );
    for key in ["s3cmd.txt", "aws.txt"] {
        let path = format!("/objects/reports/del/{key}");
        let r = gw.request("GET", &path, &[], b"")?;
        ensure!(r.status == 200 && r.body == b"kept", "{key}: {r:?}");
        // A token is used once: the delete comes with the next grant.
        let r = gw.request("DELETE", &path, &[("Fence-Token", "7.2")], b"")?;
        ensure!(r.status == 200 || r.status == 204, "{key}: {r:?}");
        let r = gw.request("GET", &path, &[], b"")?;
        ensure!(r.status == 404, "{key} after DELETE: {r:?}");
    }
    Ok(())
}

fn rclone(gw: &Gateway, args: &[&str]) -> anyhow::Result<String> {
    run(Command::new("rclone")
        .args(args)
        // A machine-wide CA bundle for AWS tools would be loaded for this
        // plain-HTTP loopback endpoint too (and refused by rclone).
        .env_remove("AWS_CA_BUNDLE")
        .args([
            "--s3-no-check-bucket",
            "--retries",
            "1",
            "--low-level-retries",
            "1",
        ])
        .env("RCLONE_CONFIG", "/dev/null")
        .env("RCLONE_CONFIG_GW_TYPE", "s3")
        .env("RCLONE_CONFIG_GW_PROVIDER", "Other")
        .env("RCLONE_CONFIG_GW_ENDPOINT", format!("http://{}", gw.addr))
        .env("RCLONE_CONFIG_GW_ACCESS_KEY_ID", KEY)
        .env("RCLONE_CONFIG_GW_SECRET_ACCESS_KEY", SECRET)
        .env("RCLONE_CONFIG_GW_FORCE_PATH_STYLE", "true")
        .env("RCLONE_CONFIG_GW_LIST_VERSION", "2"))
}

/// rclone: `copy` a directory with the token as metadata
/// (`--header-upload "X-Amz-Meta-Fence-Token: …"`: rclone's S3 backend
/// passes only headers it knows on uploads), `ls` and `cat` it back; its
/// modtime metadata is kept (`lsl`; an unchanged file is not written
/// again); a copy of a changed file with an older token (as `--header
/// "Fence-Token: …"`, sent on every request) is refused and the first
/// copy stays.
#[test]
fn rclone_copy_with_the_header() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("nested"))?;
    std::fs::write(src.join("a.txt"), b"alpha")?;
    std::fs::write(src.join("nested/b.txt"), b"beta")?;
    run(Command::new("touch")
        .args(["-d", "2001-02-03 04:05:06 UTC"])
        .arg(src.join("a.txt")))?;
    let from = src.display().to_string();
    let copy = |extra: &[&str]| -> anyhow::Result<String> {
        let mut args = vec!["copy", from.as_str(), "gw:reports/rc"];
        args.extend_from_slice(extra);
        rclone(&gw, &args)
    };
    copy(&["--header-upload", "X-Amz-Meta-Fence-Token: 4.2"])?;
    let listed = rclone(&gw, &["ls", "gw:reports/rc"])?;
    ensure!(
        listed.contains("a.txt") && listed.contains("nested/b.txt"),
        "{listed}"
    );
    // rclone's modtime (its X-Amz-Meta-Mtime) is kept: it lists the file's
    // own time, and a second copy of unchanged files writes nothing.
    let long = rclone(&gw, &["lsl", "gw:reports/rc/a.txt"])?;
    ensure!(long.contains("2001-02-03 04:05:06"), "{long}");
    let before = gw.request("GET", "/objects/reports/rc/a.txt", &[], b"")?;
    copy(&["--header", "Fence-Token: 4.2"])?;
    let after = gw.request("GET", "/objects/reports/rc/a.txt", &[], b"")?;
    ensure!(
        before.header("etag") == after.header("etag"),
        "an unchanged file was written again"
    );
    let cat = rclone(&gw, &["cat", "gw:reports/rc/nested/b.txt"])?;
    ensure!(cat == "beta", "{cat}");
    std::fs::write(src.join("a.txt"), b"alpha, changed")?;
    let stale = rclone(
        &gw,
        &[
            "copy",
            &from,
            "gw:reports/rc",
            "--size-only",
            "--header",
            "Fence-Token: 4.1",
        ],
    );
    ensure!(stale.is_err(), "a stale rclone copy succeeded");
    ensure!(
        format!("{:?}", stale.err()).contains("StaleFence"),
        "not refused as stale"
    );
    let r = gw.request("GET", "/objects/reports/rc/a.txt", &[], b"")?;
    ensure!(r.status == 200 && r.body == b"alpha", "{r:?}");
    Ok(())
}

/// ListParts and ListMultipartUploads through boto3 (pages, markers,
/// prefixes, delimiters, rights; uploads leave the list when completed or
/// aborted), and rclone's `backend list-multipart-uploads` and `backend
/// cleanup`, which list the uploads left and abort them.
#[test]
fn uploads_in_progress_are_listed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = start(dir.path())?;
    boto3(&gw, "upload_listings", &[])?;
    let listed = rclone(&gw, &["backend", "list-multipart-uploads", "gw:reports"])?;
    ensure!(
        listed.contains("pending/c.bin")
            && listed.contains("pending/dir/b.bin")
            && listed.contains("zzz/outside.bin"),
        "{listed}"
    );
    rclone(
        &gw,
        &[
            "backend",
            "cleanup",
            "gw:reports/pending",
            "-o",
            "max-age=0s",
        ],
    )?;
    boto3(&gw, "no_uploads_left", &[("PREFIX", "pending/")])?;
    // Outside the path rclone was given: kept.
    let listed = rclone(&gw, &["backend", "list-multipart-uploads", "gw:reports"])?;
    ensure!(
        listed.contains("zzz/outside.bin") && !listed.contains("pending/"),
        "{listed}"
    );
    Ok(())
}

/// With `--s3-upstream` the blobs are objects of an S3 bucket (an s3s-fs
/// server here): the boto3 scenarios pass unchanged, a 20 MiB `/objects`
/// PUT goes up as a multipart upload and reads back whole and by range,
/// nothing is refused into the bucket, and the collector deletes a
/// replaced blob there after `--retention`.
#[test]
fn s3_upstream_keeps_the_blobs() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("upstream");
    let data = dir.path().join("data");
    let (mut gw, upstream) = start_on_s3(&data, &root, &[])?;
    boto3(&gw, "objects", &[])?;
    boto3(&gw, "refusals", &[])?;
    let body: Vec<u8> = (0..20u32 << 20).map(|i| (i % 241) as u8).collect();
    let put = gw.request(
        "PUT",
        "/objects/reports/big.bin",
        &[("Fence-Token", "9.1")],
        &body,
    )?;
    ensure!(put.status == 201, "{put:?}");
    let got = gw.request("GET", "/objects/reports/big.bin", &[], b"")?;
    ensure!(
        got.status == 200 && got.body == body,
        "status {}",
        got.status
    );
    let part = gw.request(
        "GET",
        "/objects/reports/big.bin",
        &[("Range", "bytes=10485750-10485769")],
        b"",
    )?;
    ensure!(
        part.status == 206 && part.body == body[10_485_750..10_485_770],
        "status {}",
        part.status
    );
    // Again with a retention of a second (shorter than the upload above
    // took in a debug build: the collector would have taken its staged row
    // mid-upload, and the publish refused it, 503).
    gw.child.kill()?;
    gw.child.wait()?;
    let url = format!("http://{}", upstream.addr);
    let gw = start_with(
        &data,
        &[
            "--s3-upstream",
            &url,
            "--s3-bucket",
            "blobs",
            "--retention",
            "1",
            "--gc-interval",
            "1",
        ],
        &[
            ("AWS_ACCESS_KEY_ID", Path::new(s3fs::KEY)),
            ("AWS_SECRET_ACCESS_KEY", Path::new(s3fs::SECRET)),
        ],
    )?;
    // Replace it: the first blob is unreferenced now, and goes after the
    // retention (the collector's passes are a second apart; bounded wait).
    let put = gw.request(
        "PUT",
        "/objects/reports/big.bin",
        &[("Fence-Token", "9.2")],
        b"small now",
    )?;
    ensure!(put.status == 200, "{put:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The replaced blob is the only one of 20 MiB.
    while largest_upstream_blob(&root)? >= body.len() as u64 {
        ensure!(
            std::time::Instant::now() < deadline,
            "the replaced 20 MiB blob is still in the bucket ({} blobs)",
            upstream_blobs(&root)?
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let got = gw.request("GET", "/objects/reports/big.bin", &[], b"")?;
    ensure!(got.status == 200 && got.body == b"small now", "{got:?}");
    Ok(())
}

/// The history test over S3, with the S3 upstream in place: eight boto3
/// writers of one key with random tokens; applied tokens rise strictly in
/// version order, every refusal names a highest at least the presented
/// token, and the key ends with the last applied body.
#[test]
fn s3_history_holds_the_fence() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (gw, _upstream) = start_on_s3(&dir.path().join("data"), &dir.path().join("upstream"), &[])?;
    boto3(&gw, "history", &[])?;
    Ok(())
}

/// A TCP relay in front of a server that counts the bytes each way: what
/// the gateway sent its upstream and what it read from it.
struct CountingRelay {
    port: u16,
    sent: Arc<AtomicU64>,
    read: Arc<AtomicU64>,
}

impl CountingRelay {
    fn start(target: &str) -> anyhow::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let (sent, read) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (s, r, target) = (sent.clone(), read.clone(), target.to_owned());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                let (s, r) = (s.clone(), r.clone());
                std::thread::spawn(move || pump_counted(client, server, &s));
                std::thread::spawn(move || pump_counted(s2, c2, &r));
            }
        });
        Ok(Self { port, sent, read })
    }

    /// Bytes sent to the server and read from it so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::SeqCst),
            self.read.load(Ordering::SeqCst),
        )
    }
}

fn pump_counted(mut from: std::net::TcpStream, mut to: std::net::TcpStream, count: &AtomicU64) {
    use std::io::{Read, Write};
    let mut buf = [0u8; 64 << 10];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        count.fetch_add(n as u64, Ordering::SeqCst);
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

fn hex_sha256(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Multipart uploads the S3 upstream has in progress (s3s-fs keeps one
/// `.upload-ID.json` per upload at its root).
fn upstream_uploads(root: &Path) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(".upload-") && name.ends_with(".json")
        })
        .count())
}

/// The blob files in the upstream bucket.
fn upstream_blob_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    match std::fs::read_dir(root.join("blobs/fencecheck-blobs")) {
        Ok(entries) => Ok(entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// On an S3 upstream a multipart Complete composes the object inside the
/// bucket (UploadPartCopy and the upstream's own Complete): through a
/// relay that counts, the gateway neither reads the 11 MiB of parts back
/// nor sends them again, and the object has the parts' bytes, length and
/// S3's multipart ETag, with no upstream upload left behind. A part's blob
/// gone before Complete is InvalidPart: nothing visible, the upstream's
/// upload aborted, no composed blob kept. boto3's multipart scenario (a
/// stale Complete changes nothing, bad part lists, a repeated Complete)
/// passes on the upstream unchanged.
#[test]
fn s3_upstream_complete_composes_in_the_bucket() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("upstream");
    let upstream = S3Server::start(&root, &["blobs"])?;
    let relay = CountingRelay::start(&upstream.addr)?;
    let url = format!("http://127.0.0.1:{}", relay.port);
    let gw = start_with(
        &dir.path().join("data"),
        &["--s3-upstream", &url, "--s3-bucket", "blobs"],
        &[
            ("AWS_ACCESS_KEY_ID", Path::new(s3fs::KEY)),
            ("AWS_SECRET_ACCESS_KEY", Path::new(s3fs::SECRET)),
        ],
    )?;
    let state = dir.path().join("upload.json");
    let state = state.to_str().context("path")?;
    let sizes = format!("{},{},{}", 5 << 20, 5 << 20, 1 << 20);
    boto3(
        &gw,
        "upload_sized",
        &[
            ("KEY", "composed/big.bin"),
            ("SIZES", &sizes),
            ("STATE", state),
        ],
    )?;
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(state)?)?;
    let (sent, read) = relay.counts();
    boto3(&gw, "complete_saved", &[("STATE", state), ("EXPECT", "ok")])?;
    let (sent_after, read_after) = relay.counts();
    // Requests and their XML answers only: a few KiB, not 11 MiB.
    ensure!(
        sent_after - sent < 64 << 10 && read_after - read < 64 << 10,
        "the Complete moved {} bytes to the upstream and {} from it",
        sent_after - sent,
        read_after - read
    );
    let got = gw.request("GET", "/objects/reports/composed/big.bin", &[], b"")?;
    ensure!(
        got.status == 200
            && got.body.len() == 11 << 20
            && Some(hex_sha256(&got.body).as_str()) == saved["Sha256"].as_str(),
        "status {}, {} bytes",
        got.status,
        got.body.len()
    );
    ensure!(upstream_uploads(&root)? == 0, "an upstream upload is left");
    // The parts' blobs went with the upload: the composed one is left.
    ensure!(
        upstream_blob_files(&root)?.len() == 1,
        "{:?}",
        upstream_blob_files(&root)?
    );

    // A part's blob removed behind the gateway's back.
    let before = upstream_blob_files(&root)?;
    boto3(
        &gw,
        "upload_sized",
        &[
            ("KEY", "composed/gone.bin"),
            ("SIZES", &sizes),
            ("STATE", state),
        ],
    )?;
    let part = upstream_blob_files(&root)?
        .into_iter()
        .find(|b| !before.contains(b))
        .context("no part blob")?;
    std::fs::remove_file(part)?;
    boto3(
        &gw,
        "complete_saved",
        &[("STATE", state), ("EXPECT", "InvalidPart")],
    )?;
    ensure!(
        upstream_uploads(&root)? == 0,
        "the upstream upload was not aborted"
    );
    ensure!(
        upstream_blob_files(&root)?.len() == before.len() + 2,
        "{:?}",
        upstream_blob_files(&root)?
    );

    boto3_multipart(&gw)?;
    ensure!(upstream_uploads(&root)? == 0, "an upstream upload is left");
    Ok(())
}

/// On an S3 upstream a PUT signed with its body's SHA-256 is streamed to
/// the upstream under that SHA-256 (hashed once): the right body is
/// stored and reads back; a body that differs from its declared SHA-256
/// is refused, publishes nothing and leaves no blob in the bucket.
#[test]
fn s3_upstream_put_is_checked_against_its_declared_sha256() -> anyhow::Result<()> {
    use fuzz::sigv4::{Signer, sha256_hex};
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("upstream");
    let (gw, _upstream) = start_on_s3(&dir.path().join("data"), &root, &[])?;
    let put = |key: &str, body: &[u8], declared: &str, token: &str| {
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let signer = Signer::at(KEY, SECRET, unix);
        let path = format!("/reports/{key}");
        let values: Vec<(String, String)> = vec![
            ("host".into(), gw.addr.clone()),
            ("x-amz-content-sha256".into(), declared.to_owned()),
            ("x-amz-date".into(), signer.amz_date.clone()),
            ("x-amz-meta-fence-token".into(), token.to_owned()),
        ];
        let (authorization, _) = signer.sign(
            "PUT",
            &path,
            "",
            &values,
            &[
                "host",
                "x-amz-content-sha256",
                "x-amz-date",
                "x-amz-meta-fence-token",
            ],
            declared,
        );
        gw.request(
            "PUT",
            &path,
            &[
                ("x-amz-content-sha256", declared),
                ("x-amz-date", &signer.amz_date),
                ("x-amz-meta-fence-token", token),
                ("Authorization", &authorization),
            ],
            body,
        )
    };
    let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
    let r = put("hashed.bin", &body, &sha256_hex(&body), "3.1")?;
    ensure!(r.status == 200, "{r:?}");
    let got = gw.request("GET", "/objects/reports/hashed.bin", &[], b"")?;
    ensure!(got.status == 200 && got.body == body, "{}", got.status);
    ensure!(upstream_blob_files(&root)?.len() == 1);
    let other = sha256_hex(b"not this body");
    let r = put("wrong.bin", &body, &other, "3.2")?;
    ensure!(r.status == 400, "{r:?}");
    let got = gw.request("GET", "/objects/reports/wrong.bin", &[], b"")?;
    ensure!(got.status == 404, "{}", got.status);
    ensure!(
        upstream_blob_files(&root)?.len() == 1,
        "{:?}",
        upstream_blob_files(&root)?
    );
    Ok(())
}

/// An auth file that holds secret access keys and that others can read is
/// refused at startup.
#[test]
fn readable_secrets_are_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = s3_auth(dir.path())?;
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o644))?;
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path())
        .arg("--auth")
        .arg(&auth)
        .args(["--bucket", "reports"])
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "it started");
    ensure!(stderr.contains("chmod 600"), "{stderr}");
    Ok(())
}
