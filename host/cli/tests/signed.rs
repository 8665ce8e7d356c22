//! Signed tokens from the shell: `keygen`, `keys set/list/remove` on a
//! SQLite resource, and `authority acquire --signing-key` printing the
//! signed token text that resource then accepts (and nothing else).

use crate::common;

use std::process::Output;

use anyhow::{Context, Result, bail, ensure};
use common::fencecheck;
use fencecheck::{AuthFailure, Policy, Request, Runtime, SignedTokenText};
use fencecheck_sqlite::{Fenced, Rejection, fenced_write};

fn stdout(out: &Output) -> Result<String> {
    Ok(String::from_utf8(out.stdout.clone())?)
}

/// keygen prints a fresh 32-byte key each time; a resource opted in with
/// `keys set` accepts the token `authority acquire --signing-key` prints and
/// refuses the same token unsigned; `keys list` names ids only.
#[test]
fn signed_grants_from_the_shell() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("authority.key");
    let first = fencecheck(&["keygen", "3"])?;
    let again = fencecheck(&["keygen", "3"])?;
    ensure!(first.status.success() && again.status.success());
    let key = stdout(&first)?;
    ensure!(key.starts_with("3:") && key.trim().len() == 2 + 64, "{key}");
    ensure!(key != stdout(&again)?, "two keygens gave the same secret");
    std::fs::write(&key_file, &key)?;

    let resource = dir.path().join("resource.db");
    let (res, kf) = (
        resource.display().to_string(),
        key_file.display().to_string(),
    );
    let set = fencecheck(&["keys", "set", "--db", &res, "report/", &kf])?;
    ensure!(set.status.success(), "{set:?}");
    let list = stdout(&fencecheck(&["keys", "list", "--db", &res])?)?;
    ensure!(list == "\"report/\" 3\n", "{list}");
    ensure!(!list.contains(&key.trim()[2..10]));

    let locks = dir.path().join("locks.db").display().to_string();
    let acquire = fencecheck(&[
        "authority",
        "acquire",
        "--db",
        &locks,
        "--signing-key",
        &kf,
        "report/july",
        "a7",
        "30000",
    ])?;
    let line = stdout(&acquire)?;
    ensure!(acquire.status.success(), "{line}");
    let text = line
        .split_whitespace()
        .skip_while(|w| *w != "token")
        .nth(1)
        .context("no token printed")?;
    let signed: SignedTokenText = text.parse()?;
    ensure!(
        signed.signature.as_ref().map(|s| s.key_id) == Some(3),
        "{text}"
    );

    let mut conn = rusqlite::Connection::open(&resource)?;
    let mut guest = Runtime::new()?.instance()?;
    let unsigned = Request::new("report/july", signed.token, Policy::Strict);
    let outcome = fenced_write(&mut conn, &mut guest, &unsigned, |_, _| {
        Ok::<_, std::io::Error>(())
    })?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::Unsigned)),
        "{outcome:?}"
    );
    let request = Request {
        signature: signed.signature,
        ..unsigned
    };
    let outcome = fenced_write(&mut conn, &mut guest, &request, |_, _| {
        Ok::<_, std::io::Error>(())
    })?;
    ensure!(outcome.is_applied(), "{outcome:?}");

    let removed = stdout(&fencecheck(&["keys", "remove", "--db", &res, "report/"])?)?;
    ensure!(removed.contains("removed"), "{removed}");
    ensure!(stdout(&fencecheck(&["keys", "list", "--db", &res])?)?.is_empty());
    Ok(())
}

/// Bad key files are refused with exit 1 and change nothing: a short
/// secret, two keys where an authority signs with one, a malformed line;
/// no secret is ever printed.
#[test]
fn bad_key_files_are_refused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let resource = dir.path().join("resource.db").display().to_string();
    let locks = dir.path().join("locks.db").display().to_string();
    let secret = "00112233445566778899aabbccddeeff";
    for (body, needle) in [
        ("1:0011", "short-secret"),
        ("1:zz", "entry 1 is not KEY-ID:SECRET-HEX"),
        ("", "no-keys"),
    ] {
        let file = dir.path().join("bad.key");
        std::fs::write(&file, body)?;
        let f = file.display().to_string();
        let out = fencecheck(&["keys", "set", "--db", &resource, "p/", &f])?;
        let err = String::from_utf8(out.stderr)?;
        ensure!(
            out.status.code() == Some(1) && err.contains(needle),
            "{body}: {err}"
        );
    }
    let two = dir.path().join("two.key");
    std::fs::write(&two, format!("1:{secret}\n2:{secret}\n"))?;
    let t = two.display().to_string();
    let out = fencecheck(&[
        "authority",
        "acquire",
        "--db",
        &locks,
        "--signing-key",
        &t,
        "report/july",
        "a7",
        "1000",
    ])?;
    let err = String::from_utf8(out.stderr)?;
    ensure!(
        out.status.code() == Some(1) && err.contains("2 keys; an authority signs with one"),
        "{err}"
    );
    ensure!(!err.contains(secret));
    let list = stdout(&fencecheck(&["keys", "list", "--db", &resource])?)?;
    if !list.is_empty() {
        bail!("a refused key file changed the resource: {list}");
    }
    Ok(())
}
