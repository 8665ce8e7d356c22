//! Signed tokens for scopes that opt in, with the keys in the module's
//! namespace where an ACL hides them: an application user limited to its
//! own keys writes through the fence with the tokens the server signed,
//! cannot present a forged or unsigned one, and cannot read or change the
//! keys or the marks.

use crate::common::{Conn, Options, Value, applied, each_server, err};
use anyhow::{Context, Result, ensure};

const SECRET: &str = "3:8a1f0c5e9d7b3a2c4e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5";

/// The lock-out attack (a made-up u64::MAX token) applies on a scope that
/// did not opt in and is refused on one that did; grants are signed by the
/// server and accepted; the application user cannot see or touch the keys.
#[test]
fn acl_user_needs_signed_tokens_and_cannot_see_the_keys() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut admin = server.conn()?;
        admin.ok(&["HSET", "fencecheck:signing-keys", "report/", SECRET])?;
        admin.ok(&["SET", "fencecheck:grant-key", SECRET])?;
        admin.ok(&[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">app-password",
            "resetkeys",
            "~report/*",
            "~other/*",
            "-@all",
            "+fence.set",
            "+fence.exec",
            "+fence.acquire",
            "+fence.check",
            "+get",
            "+set",
            "+hgetall",
        ])?;
        let mut app = Conn::connect(server.port)?;
        app.ok(&["AUTH", "app", "app-password"])?;

        let forged = "18446744073709551615.18446744073709551615";
        ensure!(applied(&app.ok(&["FENCE.SET", "other/x", forged, "locked out"])?)? == 1);
        let lineage_forged = format!("{}:{forged}", 1);
        let refused = app.cmd(&["FENCE.SET", "report/july", &lineage_forged, "x"])?;
        ensure!(err(&refused) == "UNAUTHENTICATED unsigned", "{refused:?}");

        let grant = app.ok(&["FENCE.ACQUIRE", "report/july", "a7", "60000"])?;
        let text = grant
            .items()
            .get(1)
            .and_then(Value::text)
            .context("token")?;
        ensure!(text.split('~').count() == 4, "not signed: {text}");
        ensure!(applied(&app.ok(&["FENCE.SET", "report/july", &text, "b9.tmp"])?)? == 1);
        // A tampered signature, and the signature replayed onto another scope.
        // (a character inside the tag: the last one also carries padding bits)
        let mut chars: Vec<char> = text.chars().collect();
        let i = chars.len() - 5;
        chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
        let tampered: String = chars.into_iter().collect();
        let bad = app.cmd(&["FENCE.SET", "report/july", &tampered, "x"])?;
        ensure!(err(&bad).starts_with("UNAUTHENTICATED "), "{bad:?}");
        let replayed = app.cmd(&["FENCE.SET", "report/august", &text, "x"])?;
        ensure!(
            err(&replayed) == "UNAUTHENTICATED bad-signature",
            "{replayed:?}"
        );

        // The keys and the marks are out of the user's reach.
        for args in [
            &["GET", "fencecheck:grant-key"][..],
            &["HGETALL", "fencecheck:signing-keys"],
            &["SET", "fencecheck:{report/july}", "x"],
            &[
                "FENCE.EXEC",
                "report/x",
                "0.1",
                "--",
                "SET",
                "fencecheck:grant-key",
                "x",
            ],
            &[
                "FENCE.EXEC",
                "report/x",
                "0.1",
                "--",
                "SET",
                "elsewhere",
                "x",
            ],
            &["FENCE.SET", "elsewhere", "0.1", "x"],
        ] {
            let got = app.cmd(args)?;
            ensure!(got.error().is_some(), "{args:?} was allowed: {got:?}");
        }
        ensure!(
            admin
                .ok(&["GET", "fencecheck:grant-key"])?
                .text()
                .as_deref()
                == Some(SECRET)
        );
        ensure!(admin.ok(&["GET", "report/july"])?.text().as_deref() == Some("b9.tmp"));
        ensure!(admin.ok(&["EXISTS", "elsewhere"])? == Value::Int(0));

        // Unusable keys refuse everything on the scope until fixed.
        admin.ok(&["HSET", "fencecheck:signing-keys", "report/", "3:00"])?;
        let invalid = app.cmd(&["FENCE.SET", "report/july", &text, "x"])?;
        ensure!(err(&invalid) == "INVALIDKEYS short-secret", "{invalid:?}");
        Ok(())
    })
}
