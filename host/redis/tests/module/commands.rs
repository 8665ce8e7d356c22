//! The commands against real servers (Redis 7.0, Valkey 8): replies,
//! refusals that change nothing, FENCE.EXEC with several command kinds,
//! MULTI and scripts, and random garbage that must neither crash the server
//! nor change a key.

use crate::common::{Conn, Options, Value, applied, each_server, err};
use anyhow::{Result, ensure};

/// Applied and duplicate are replies with the version; stale, version
/// conflict, foreign authority, bad token and corrupt state are errors
/// named by their first word, and none of them changes a key.
#[test]
fn replies_and_refusals() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        ensure!(applied(&c.ok(&["FENCE.SET", "report/july", "0.42", "b9.tmp"])?)? == 1);
        let before = c.snapshot()?;
        let cases: [(&[&str], &str); 9] = [
            (
                &["FENCE.SET", "report/july", "0.41", "a7.tmp"],
                "STALEFENCE presented 0.41 highest 0.42",
            ),
            (
                &["FENCE.SET", "report/july", "0.42", "a7.tmp"],
                "STALEFENCE presented 0.42 highest 0.42",
            ),
            (
                &["FENCE.SET", "report/july", "7:0.43", "x"],
                "FOREIGNAUTHORITY stored 0 presented 7",
            ),
            (
                &["FENCE.SET", "report/july", "0.4x", "x"],
                "BADTOKEN invalid token \"0.4x\": expected EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER (decimal u64), signed: TOKEN~KEY-ID~LEASE~TAG (base64url)",
            ),
            (
                &["FENCE.SET", "report/july", "0.0", "x"],
                "INVALIDREQUEST missing-token",
            ),
            (
                &["FENCE.SET", "report/july", "0.43", "x", "VERSION", "7"],
                "VERSIONCONFLICT expected 7 actual 1",
            ),
            (
                &[
                    "FENCE.SET",
                    "report/july",
                    "0.42",
                    "x",
                    "POLICY",
                    "allow-equal",
                ],
                "INVALIDREQUEST equal-token-unguarded",
            ),
            (
                &["FENCE.SET", "report/july", "0.43"],
                "ERR wrong number of arguments for 'fence.set' command",
            ),
            (
                &["FENCE.SET", "report/july", "0.43", "x", "POLICY"],
                "ERR option \"POLICY\" needs a value",
            ),
        ];
        for (args, want) in cases {
            let got = c.cmd(args)?;
            ensure!(err(&got) == want, "{args:?}: got {got:?}, want -{want}");
        }
        ensure!(c.snapshot()? == before, "a refusal changed a key");
        ensure!(c.ok(&["GET", "report/july"])?.text().as_deref() == Some("b9.tmp"));

        // allow-equal with an op-id: applied once, then duplicate with the
        // original version.
        let op = [
            "FENCE.SET",
            "report/july",
            "0.43",
            "v2",
            "POLICY",
            "allow-equal",
            "OPID",
            "op-1",
        ];
        ensure!(applied(&c.ok(&op)?)? == 2);
        let dup = c.ok(&op)?;
        ensure!(
            dup == Value::Array(vec![Value::Simple("duplicate".into()), Value::Int(2)]),
            "{dup:?}"
        );
        let op2 = [
            "FENCE.SET",
            "report/july",
            "0.43",
            "v3",
            "POLICY",
            "allow-equal",
            "VERSION",
            "2",
        ];
        ensure!(applied(&c.ok(&op2)?)? == 3);

        // A damaged state blocks its scope, and stays as it was.
        let key = "fencecheck:{report/july}";
        let mut state = c.ok(&["GET", key])?.bytes().unwrap_or_default().to_vec();
        state[20] ^= 1;
        c.ok(&[b"SET".as_slice(), key.as_bytes(), &state])?;
        let before = c.snapshot()?;
        ensure!(
            err(&c.cmd(&["FENCE.SET", "report/july", "0.99", "x"])?)
                == "CORRUPTSTATE checksum-mismatch"
        );
        c.ok(&["DEL", key])?;
        c.ok(&["LPUSH", key, "x"])?;
        let wrong = c.cmd(&["FENCE.SET", "report/july", "0.99", "x"])?;
        ensure!(err(&wrong).starts_with("WRONGTYPE "), "{wrong:?}");
        c.ok(&["DEL", key])?;
        c.ok(&[b"SET".as_slice(), key.as_bytes(), &state])?;
        ensure!(c.snapshot()? == before);

        // The module's own keys are never data.
        let own = c.cmd(&["FENCE.SET", "fencecheck:{x}", "0.1", "x"])?;
        ensure!(err(&own).starts_with("ERR "), "{own:?}");
        let untagged = c.cmd(&["FENCE.SET", "a}b", "0.1", "x"])?;
        ensure!(err(&untagged).contains("hash tag"), "{untagged:?}");
        Ok(())
    })
}

/// FENCE.VERSION is the WIT package version of the component built in.
#[test]
fn version_is_the_components() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        let got = c.ok(&["FENCE.VERSION"])?;
        ensure!(
            got.text().as_deref() == Some(fencecheck::WIT_VERSION),
            "{got:?}"
        );
        ensure!(c.cmd(&["FENCE.VERSION", "x"])?.error().is_some());
        Ok(())
    })
}

/// FENCE.DEL deletes the key and keeps the mark, so the key cannot come
/// back under an older token; FENCE.CHECK decides without writing;
/// FENCE.INSPECT decodes the state as the other hosts do.
#[test]
fn del_check_inspect() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        c.ok(&["FENCE.SET", "doc", "1.5", "v1"])?;
        let check = c.ok(&["FENCE.CHECK", "doc", "1.6"])?;
        ensure!(applied(&check)? == 2);
        ensure!(
            err(&c.cmd(&["FENCE.CHECK", "doc", "1.4"])?) == "STALEFENCE presented 1.4 highest 1.5"
        );
        ensure!(applied(&c.ok(&["FENCE.DEL", "doc", "1.6"])?)? == 2);
        ensure!(c.ok(&["EXISTS", "doc"])? == Value::Int(0));
        ensure!(
            err(&c.cmd(&["FENCE.SET", "doc", "1.5", "old"])?)
                == "STALEFENCE presented 1.5 highest 1.6"
        );
        ensure!(c.ok(&["EXISTS", "doc"])? == Value::Int(0));
        let json = c.ok(&["FENCE.INSPECT", "doc"])?.text().unwrap_or_default();
        let info: serde_json::Value = serde_json::from_str(&json)?;
        ensure!(info["scope"] == "doc" && info["version"] == 2, "{info}");
        ensure!(
            info["highest"]["epoch"] == 1 && info["highest"]["counter"] == 6,
            "{info}"
        );
        ensure!(c.ok(&["FENCE.INSPECT", "never"])? == Value::Nil);
        Ok(())
    })
}

/// FENCE.EXEC runs HSET, XADD, LPUSH, INCRBY, SADD, ZADD, EXPIRE and
/// SET … GET only when the fence applies, atomically with the state;
/// an error of the command itself leaves the state as it was; read-only,
/// admin, keyless, script-only and FENCE commands are refused.
#[test]
fn exec_runs_write_commands() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        let kinds: [&[&str]; 8] = [
            &["HSET", "{acct}:h", "owner", "b"],
            &["XADD", "{acct}:log", "*", "event", "publish"],
            &["LPUSH", "{acct}:l", "x", "y"],
            &["INCRBY", "{acct}:n", "5"],
            &["SADD", "{acct}:s", "m"],
            &["ZADD", "{acct}:z", "1", "m"],
            &["EXPIRE", "{acct}:h", "1000"],
            &["SET", "{acct}:str", "new\r\nline", "GET"],
        ];
        for (i, inner) in kinds.iter().enumerate() {
            let token = format!("0.{}", i + 1);
            let mut args = vec!["FENCE.EXEC", "{acct}", &token, "--"];
            args.extend_from_slice(inner);
            let reply = c.ok(&args)?;
            ensure!(applied(&reply)? == i as i64 + 1, "{inner:?}: {reply:?}");
            ensure!(reply.items().len() == 3, "{reply:?}");
        }
        ensure!(c.ok(&["HGET", "{acct}:h", "owner"])?.text().as_deref() == Some("b"));
        ensure!(c.ok(&["XLEN", "{acct}:log"])? == Value::Int(1));
        ensure!(c.ok(&["GET", "{acct}:n"])?.text().as_deref() == Some("5"));
        ensure!(c.ok(&["GET", "{acct}:str"])?.text().as_deref() == Some("new\r\nline"));
        // The relayed reply of SET … GET: the old value (nil), as a bulk.
        let again = c.ok(&[
            "FENCE.EXEC",
            "{acct}",
            "0.9",
            "--",
            "SET",
            "{acct}:str",
            "v",
            "GET",
        ])?;
        ensure!(
            again.items().get(2) == Some(&Value::Bulk(b"new\r\nline".to_vec())),
            "{again:?}"
        );

        let before = c.snapshot()?;
        let refused: [(&[&str], &str); 9] = [
            (
                &[
                    "FENCE.EXEC",
                    "{acct}",
                    "0.8",
                    "--",
                    "HSET",
                    "{acct}:h",
                    "a",
                    "b",
                ],
                "STALEFENCE ",
            ),
            (
                &[
                    "FENCE.EXEC",
                    "{acct}",
                    "0.10",
                    "--",
                    "HSET",
                    "{acct}:str",
                    "a",
                    "b",
                ],
                "WRONGTYPE ",
            ),
            (
                &["FENCE.EXEC", "{acct}", "0.10", "--", "GET", "{acct}:n"],
                "ERR FENCE.EXEC runs write commands only",
            ),
            (
                &["FENCE.EXEC", "{acct}", "0.10", "--", "FLUSHALL"],
                "ERR FENCE.EXEC",
            ),
            (
                &[
                    "FENCE.EXEC",
                    "{acct}",
                    "0.10",
                    "--",
                    "SET",
                    "fencecheck:{acct}",
                    "x",
                ],
                "ERR keys starting with fencecheck:",
            ),
            (
                &[
                    "FENCE.EXEC",
                    "{acct}",
                    "0.10",
                    "--",
                    "EVAL",
                    "return 1",
                    "0",
                ],
                "ERR FENCE.EXEC",
            ),
            (
                &[
                    "FENCE.EXEC",
                    "{acct}",
                    "0.10",
                    "--",
                    "FENCE.SET",
                    "{acct}:x",
                    "0.1",
                    "v",
                ],
                "ERR FENCE.EXEC cannot run FENCE commands",
            ),
            (
                &["FENCE.EXEC", "{acct}", "0.10", "--", "NOSUCHCMD", "k"],
                "ERR unknown command",
            ),
            (
                &["FENCE.EXEC", "{acct}", "0.10", "HSET", "{acct}:h", "a", "b"],
                "ERR FENCE.EXEC needs --",
            ),
        ];
        for (args, want) in refused {
            let got = c.cmd(args)?;
            ensure!(
                err(&got).starts_with(want),
                "{args:?}: got {got:?}, want -{want}…"
            );
        }
        ensure!(
            c.snapshot()? == before,
            "a refused FENCE.EXEC changed a key"
        );
        Ok(())
    })
}

/// Inside MULTI/EXEC and a Lua script the fence decides on the state the
/// transaction sees, and a stale write inside is refused alone; a fenced
/// write aborts another client's transaction that WATCHes the key.
#[test]
fn inside_multi_and_scripts() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        c.ok(&["MULTI"])?;
        c.ok(&["FENCE.SET", "k", "0.1", "a"])?;
        c.ok(&["FENCE.SET", "k", "0.2", "b"])?;
        c.ok(&["FENCE.SET", "k", "0.1", "c"])?;
        let exec = c.ok(&["EXEC"])?;
        let items = exec.items();
        ensure!(items.len() == 3, "{exec:?}");
        ensure!(applied(&items[0])? == 1 && applied(&items[1])? == 2);
        ensure!(err(&items[2]) == "STALEFENCE presented 0.1 highest 0.2");
        let script = "local a = redis.pcall('FENCE.SET', KEYS[1], ARGV[1], 'lua') \
                      if type(a) == 'table' and a.err then return a.err end return a[2]";
        let got = c.ok(&["EVAL", script, "1", "k", "0.3"])?;
        ensure!(got == Value::Int(3), "{got:?}");
        let got = c.cmd(&["EVAL", script, "1", "k", "0.3"])?;
        ensure!(
            got.text().as_deref() == Some("STALEFENCE presented 0.3 highest 0.3"),
            "{got:?}"
        );
        ensure!(c.ok(&["GET", "k"])?.text().as_deref() == Some("lua"));
        // A fenced write touches WATCHed keys like any write: the
        // watcher's transaction aborts.
        let mut watcher = server.conn()?;
        watcher.ok(&["WATCH", "k"])?;
        c.ok(&["FENCE.SET", "k", "0.4", "fenced"])?;
        watcher.ok(&["MULTI"])?;
        watcher.ok(&["SET", "k", "unfenced"])?;
        ensure!(
            watcher.ok(&["EXEC"])? == Value::Nil,
            "EXEC ran over a fenced write"
        );
        ensure!(c.ok(&["GET", "k"])?.text().as_deref() == Some("fenced"));
        Ok(())
    })
}

/// FENCE.SET sends the keyspace event SET sends, so listeners (and client
/// caches) see fenced writes like any other; a refused one sends nothing.
#[test]
fn fenced_writes_notify_like_set() -> Result<()> {
    each_server(
        Options::module().with("notify-keyspace-events", "K$"),
        |server| {
            let mut sub = server.conn()?;
            sub.ok(&["SUBSCRIBE", "__keyspace@0__:doc"])?;
            let mut c = server.conn()?;
            c.ok(&["FENCE.SET", "doc", "0.1", "v1"])?;
            let stale = c.cmd(&["FENCE.SET", "doc", "0.1", "v2"])?;
            ensure!(stale.error().is_some());
            c.ok(&["SET", "doc", "plain"])?;
            // In order: the fenced write's event, then the plain SET's (the
            // refused write sent none between them).
            for _ in 0..2 {
                let msg = sub.read()?;
                let items = msg.items();
                ensure!(
                    items.first().and_then(Value::text).as_deref() == Some("message")
                        && items.get(2).and_then(Value::text).as_deref() == Some("set"),
                    "{msg:?}"
                );
            }
            Ok(())
        },
    )
}

/// FENCE.SET leaves its data key and the state key as SET would, whether
/// the new bytes have the old length (rewritten in place) or not (the value
/// replaced): exactly the new bytes, no TTL left, any other type replaced,
/// and a client WATCHing either key sees its transaction aborted.
#[test]
fn fenced_writes_replace_like_set() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        let state = "fencecheck:{doc}";
        c.ok(&["FENCE.SET", "doc", "0.1", "aaaa"])?;
        for (version, (token, value)) in [("0.2", "bbbb"), ("0.3", "cc"), ("0.4", "dddddddd")]
            .into_iter()
            .enumerate()
        {
            for key in ["doc", state] {
                c.ok(&["PEXPIRE", key, "100000"])?;
            }
            let mut watchers = Vec::new();
            for key in ["doc", state] {
                let mut w = server.conn()?;
                w.ok(&["WATCH", key])?;
                watchers.push(w);
            }
            let got = applied(&c.ok(&["FENCE.SET", "doc", token, value])?)?;
            ensure!(
                usize::try_from(got)? == version + 2,
                "{token}: version {got}"
            );
            ensure!(c.ok(&["GET", "doc"])?.text().as_deref() == Some(value));
            for key in ["doc", state] {
                let ttl = c.ok(&["PTTL", key])?;
                ensure!(ttl == Value::Int(-1), "{key} kept a TTL: {ttl:?}");
            }
            for mut w in watchers {
                w.ok(&["MULTI"])?;
                w.ok(&["PING"])?;
                ensure!(w.ok(&["EXEC"])? == Value::Nil, "a WATCH missed {token}");
            }
        }
        c.ok(&["RPUSH", "list", "x"])?;
        applied(&c.ok(&["FENCE.SET", "list", "0.1", "now a string"])?)?;
        ensure!(c.ok(&["GET", "list"])?.text().as_deref() == Some("now a string"));
        Ok(())
    })
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

fn garbage_arg(rng: &mut Rng, state: &[u8]) -> Vec<u8> {
    match rng.below(13) {
        12 => ["g\0", "\0", "a\r\nb", "é/ü", " ", "{g}\0x"][rng.below(6) as usize]
            .as_bytes()
            .to_vec(),
        0 => Vec::new(),
        1 => b"--".to_vec(),
        2 => format!("{}.{}", rng.below(5), rng.below(5)).into_bytes(),
        3 => format!("{}:{}.{}", rng.below(3), rng.below(3), rng.below(5)).into_bytes(),
        4 => [
            "POLICY",
            "OPID",
            "VERSION",
            "NOW",
            "LEASE",
            "allow-equal",
            "strict",
        ][rng.below(7) as usize]
            .as_bytes()
            .to_vec(),
        5 => vec![b'x'; 1 << 20],
        6 => (0..rng.below(40)).map(|_| rng.below(256) as u8).collect(),
        7 => ["18446744073709551615", "18446744073709551616", "-1", "0"][rng.below(4) as usize]
            .as_bytes()
            .to_vec(),
        8 => {
            let mut s = state.to_vec();
            if !s.is_empty() {
                let i = rng.below(s.len() as u64) as usize;
                s[i] ^= 1 << rng.below(8);
            }
            s
        }
        9 => [
            "HSET",
            "SET",
            "GET",
            "FLUSHALL",
            "DEL",
            "EVAL",
            "MULTI",
            "fence.set",
        ][rng.below(8) as usize]
            .as_bytes()
            .to_vec(),
        10 => ["g", "{g}", "a}b", "fencecheck:{g}", "{}x"][rng.below(5) as usize]
            .as_bytes()
            .to_vec(),
        _ => rng.below(1000).to_string().into_bytes(),
    }
}

/// Random commands and arguments (arity, types, huge values, flipped
/// state bytes, the module's own keys) never crash the server, and every
/// refused command leaves every key as it was.
#[test]
fn garbage_never_crashes_and_refusals_change_nothing() -> Result<()> {
    let commands = [
        "FENCE.SET",
        "FENCE.DEL",
        "FENCE.EXEC",
        "FENCE.CHECK",
        "FENCE.INSPECT",
        "FENCE.ACQUIRE",
        "FENCE.RENEW",
        "FENCE.RELEASE",
    ];
    let templates: [&[&str]; 8] = [
        &["FENCE.SET", "g", "0.6", "v"],
        &["FENCE.DEL", "g", "0.6"],
        &["FENCE.EXEC", "{g}", "0.6", "--", "HSET", "{g}:h", "f", "v"],
        &["FENCE.CHECK", "g", "0.6"],
        &["FENCE.INSPECT", "g"],
        &["FENCE.ACQUIRE", "g", "lease-2", "1000"],
        &["FENCE.RENEW", "g", "lease-1", "0.1", "1000"],
        &["FENCE.RELEASE", "g", "lease-1", "0.1"],
    ];
    each_server(Options::module(), |server| {
        let mut c: Conn = server.conn()?;
        c.ok(&["FENCE.SET", "g", "0.5", "v"])?;
        c.ok(&["FENCE.ACQUIRE", "g", "lease-1", "60000"])?;
        let state = c
            .ok(&["GET", "fencecheck:{g}"])?
            .bytes()
            .unwrap_or_default()
            .to_vec();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut refused, mut accepted) = (0, 0);
        for _ in 0..800 {
            let pick = rng.below(commands.len() as u64) as usize;
            // Half the time a well-formed command with one argument
            // replaced (so the garbage reaches the deeper paths), else
            // any number of garbage arguments.
            let mut args: Vec<Vec<u8>> = if rng.below(2) == 0 {
                let mut args: Vec<Vec<u8>> = templates[pick]
                    .iter()
                    .map(|a| a.as_bytes().to_vec())
                    .collect();
                let i = 1 + rng.below(args.len() as u64 - 1) as usize;
                args[i] = garbage_arg(&mut rng, &state);
                args
            } else {
                let n = rng.below(9);
                (0..n).map(|_| garbage_arg(&mut rng, &state)).collect()
            };
            if args.first().is_none_or(|a| !a.starts_with(b"FENCE.")) {
                args.insert(0, commands[pick].as_bytes().to_vec());
            }
            // Sometimes a flipped state is planted first.
            if rng.below(10) == 0 {
                let flipped = garbage_arg(&mut Rng(rng.below(u64::MAX) | 1), &state);
                c.ok(&[b"SET".as_slice(), b"fencecheck:{g}", &flipped])?;
            }
            let before = c.snapshot()?;
            let reply = c.cmd(&args)?;
            if let Some(e) = reply.error() {
                // A panic caught in the module, or a trapped guest, is a bug.
                ensure!(
                    !e.starts_with("FENCERUNTIME"),
                    "{}: -{e}",
                    String::from_utf8_lossy(&args[0])
                );
                refused += 1;
                let after = c.snapshot()?;
                ensure!(
                    after == before,
                    "refused {:?} changed keys: {reply:?}",
                    &args[..1]
                );
            } else {
                accepted += 1;
            }
        }
        ensure!(c.ok(&["PING"])? == Value::Simple("PONG".into()));
        ensure!(
            refused > 300 && accepted > 20,
            "{refused} refused, {accepted} accepted: the generator misses one side"
        );
        println!("{:?}: {refused} refused, {accepted} accepted", server.kind);
        Ok(())
    })
}
