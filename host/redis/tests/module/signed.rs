//! Signed tokens for scopes that opt in, with the keys in the module's
//! namespace where an ACL hides them: an application user limited to its
//! own keys writes through the fence with the tokens the server signed,
//! cannot present a forged or unsigned one, and cannot read or change the
//! keys or the marks.

use crate::common::{Conn, Kind, Options, Value, applied, each_server, err};
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

/// FENCE.KEYS writes what the commands read: REQUIRE makes a prefix's
/// scopes refuse unsigned tokens, GRANT makes FENCE.ACQUIRE sign, LIST
/// shows key ids and never a secret, DROP and GRANT OFF undo them. A key
/// the component cannot use (short, malformed, none), a reserved prefix or
/// a bad subcommand is refused and changes nothing, and a user without
/// @admin cannot run it.
#[test]
fn fence_keys_sets_the_keys() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut admin = server.conn()?;
        let updated = admin.ok(&["FENCE.KEYS", "REQUIRE", "report/", SECRET])?;
        let expected = Value::Array(vec![Value::Simple("updated".into()), Value::Int(1)]);
        ensure!(updated == expected, "{updated:?} != {expected:?}");
        admin.ok(&["FENCE.KEYS", "GRANT", SECRET])?;
        ensure!(
            admin
                .ok(&["HGET", "fencecheck:signing-keys", "report/"])?
                .text()
                .as_deref()
                == Some(SECRET)
        );

        let unsigned = admin.cmd(&["FENCE.SET", "report/july", "1:0.9", "x"])?;
        ensure!(err(&unsigned) == "UNAUTHENTICATED unsigned", "{unsigned:?}");
        ensure!(applied(&admin.ok(&["FENCE.SET", "other/x", "0.9", "x"])?)? == 1);
        let grant = admin.ok(&["FENCE.ACQUIRE", "report/july", "a7", "60000"])?;
        let text = grant
            .items()
            .get(1)
            .and_then(Value::text)
            .context("token")?;
        ensure!(text.split('~').count() == 4, "not signed: {text}");
        ensure!(applied(&admin.ok(&["FENCE.SET", "report/july", &text, "v"])?)? == 1);

        let list = admin.ok(&["FENCE.KEYS", "LIST"])?;
        let expected = Value::Array(vec![
            Value::Simple("grant".into()),
            Value::Int(3),
            Value::Simple("require".into()),
            Value::Array(vec![Value::Array(vec![
                Value::Bulk(b"report/".to_vec()),
                Value::Array(vec![Value::Int(3)]),
            ])]),
            Value::Simple("slots".into()),
            Value::Int(1),
            Value::Simple("unlike".into()),
            Value::Int(0),
        ]);
        ensure!(list == expected, "{list:?}");

        // Refused, and nothing changed: the set, the grant key, the prefixes.
        let before = admin.ok(&["HGETALL", "fencecheck:signing-keys"])?;
        for (args, code) in [
            (
                &["FENCE.KEYS", "REQUIRE", "report/", "3:00"][..],
                "INVALIDKEYS",
            ),
            (&["FENCE.KEYS", "REQUIRE", "x/", "3:zz"], "INVALIDKEYS"),
            (&["FENCE.KEYS", "REQUIRE", "x/", " , "], "INVALIDKEYS"),
            (&["FENCE.KEYS", "REQUIRE", "fencecheck:x", SECRET], "ERR"),
            (&["FENCE.KEYS", "GRANT", "3:00"], "INVALIDKEYS"),
            (
                &["FENCE.KEYS", "GRANT", &format!("{SECRET},{SECRET}")],
                "INVALIDKEYS",
            ),
            (&["FENCE.KEYS", "REQUIRE", "x/"], "ERR"),
            (&["FENCE.KEYS", "FORGET"], "ERR"),
            (&["FENCE.KEYS"], "ERR"),
        ] {
            let r = admin.cmd(args)?;
            ensure!(err(&r).starts_with(code), "{args:?}: {r:?}");
        }
        ensure!(admin.ok(&["HGETALL", "fencecheck:signing-keys"])? == before);
        ensure!(
            admin
                .ok(&["GET", "fencecheck:grant-key"])?
                .text()
                .as_deref()
                == Some(SECRET)
        );

        // An application user granted the commands it uses by name.
        admin.ok(&[
            "ACL",
            "SETUSER",
            "app",
            "on",
            ">pw",
            "~report/*",
            "-@all",
            "+fence.set",
            "+fence.acquire",
        ])?;
        // One granted every command but @admin: Redis 7.0 gives module
        // commands no ACL category, so there an ACL must name FENCE.KEYS.
        admin.ok(&[
            "ACL",
            "SETUSER",
            "ops",
            "on",
            ">pw",
            "~report/*",
            "+@all",
            "-@admin",
        ])?;
        let mut app = Conn::connect(server.port)?;
        app.ok(&["AUTH", "app", "pw"])?;
        let r = app.cmd(&["FENCE.KEYS", "DROP", "report/"])?;
        ensure!(err(&r).starts_with("NOPERM"), "{r:?}");
        let mut ops = Conn::connect(server.port)?;
        ops.ok(&["AUTH", "ops", "pw"])?;
        let r = ops.cmd(&["FENCE.KEYS", "LIST"])?;
        // Module commands have ACL categories from Redis 7.2 and on Valkey.
        let info = admin.ok(&["INFO", "server"])?.text().unwrap_or_default();
        let version: Vec<u32> = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or_default()
            .trim()
            .split('.')
            .filter_map(|n| n.parse().ok())
            .collect();
        let categories = server.kind == Kind::Valkey || version.as_slice() >= [7, 2].as_slice();
        if categories {
            ensure!(err(&r).starts_with("NOPERM"), "{r:?}");
        } else {
            ensure!(r.error().is_none(), "{r:?}");
        }

        admin.ok(&["FENCE.KEYS", "DROP", "report/"])?;
        admin.ok(&["FENCE.KEYS", "GRANT", "OFF"])?;
        ensure!(admin.ok(&["EXISTS", "fencecheck:grant-key"])? == Value::Int(0));
        // The user may write through the fence, not change who signs.
        ensure!(applied(&app.ok(&["FENCE.SET", "report/august", "0.9", "x"])?)? == 1);
        let unsigned = admin.ok(&["FENCE.ACQUIRE", "report/august", "b1", "60000"])?;
        let text = unsigned
            .items()
            .get(1)
            .and_then(Value::text)
            .context("token")?;
        ensure!(!text.contains('~'), "signed after GRANT OFF: {text}");
        Ok(())
    })
}
