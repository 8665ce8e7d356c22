//! The module fuzzed at its own interface: RESP from a client, against real
//! servers (Redis 7.0, Valkey 8). A panic inside a module aborts the whole
//! server, every client's data with it, so the rule is: every command gets
//! an answer, every error line is printable ASCII, no answer is a caught
//! panic or a trapped guest (`FENCERUNTIME`), the server stays up, and
//! `FENCE.INSPECT` decodes every state a fenced command wrote.
//! Seeded and bounded (`fencecheck_tests::fuzzing`; docs/development.md,
//! "Fuzzing the hosts").

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail, ensure};
use fencecheck_tests::fuzzing::{Fuzz, shown};

use crate::common::{Conn, Options, Value, each_server};

/// The scopes and locks the commands share, so that commands meet each
/// other's states: plain names, hash-tagged ones, non-UTF-8, reserved,
/// unkeyable (`a}b`) and one at the scope length limit.
fn names() -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = [
        "g",
        "{g}:x",
        "report/july",
        "é/ü",
        "a}b",
        "fencecheck:lineage",
        "",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    names.push(b"bin\xff\x00name".to_vec());
    names.push(vec![b's'; 1024]);
    names.push(vec![b's'; 1025]);
    names
}

/// Names that can hold a state (the module derives their key), for the
/// closing inspection.
fn inspectable(names: &[Vec<u8>]) -> Vec<Vec<u8>> {
    names
        .iter()
        .filter(|n| fencecheck_redis::fence_key(n).is_ok() && !n.starts_with(b"fencecheck:"))
        .cloned()
        .collect()
}

/// Option pairs: known names in any case, with good and bad values,
/// sometimes without a value, sometimes unknown names of random text.
fn options(f: &mut Fuzz) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..f.below(4) {
        let name: Vec<u8> = match f.below(6) {
            0 => f.binary(12),
            1 => b"policy".to_vec(),
            _ => f
                .pick(&["POLICY", "OPID", "VERSION", "NOW", "LEASE"])
                .as_bytes()
                .to_vec(),
        };
        out.push(name);
        if f.one_in(8) {
            continue; // a name without its value
        }
        out.push(match f.below(6) {
            0 => f.binary(300),
            1 => f
                .pick(&["strict", "allow-equal", "ALLOW-EQUAL", "lax"])
                .into(),
            2 => f.below(5).to_string().into_bytes(),
            3 => f
                .pick(&["18446744073709551615", "18446744073709551616", "-1"])
                .into(),
            _ => format!("op-{}", f.below(4)).into_bytes(),
        });
    }
    out
}

/// A value for FENCE.SET: small, binary, empty, or (rarely) 1 MiB.
fn value(f: &mut Fuzz) -> Vec<u8> {
    match f.below(40) {
        0 => vec![b'v'; 1 << 20],
        1..=3 => Vec::new(),
        _ => f.binary(64),
    }
}

/// A command FENCE.EXEC may be asked to run, keyed in `scope`'s slot or not.
fn inner(f: &mut Fuzz, scope: &[u8]) -> Vec<Vec<u8>> {
    let key = |f: &mut Fuzz| -> Vec<u8> {
        match f.below(4) {
            0 => f.binary(16),
            1 => b"fencecheck:{g}".to_vec(),
            _ => {
                let mut k = b"{".to_vec();
                k.extend_from_slice(scope);
                k.extend_from_slice(b"}:data");
                k
            }
        }
    };
    let mut args: Vec<Vec<u8>> = match f.below(12) {
        0 => vec![b"SET".to_vec(), key(f), value(f)],
        1 => vec![b"HSET".to_vec(), key(f), b"f".to_vec(), value(f)],
        2 => vec![b"DEL".to_vec(), key(f), key(f)],
        3 => vec![b"INCR".to_vec(), key(f)],
        4 => vec![b"LPUSH".to_vec(), key(f), value(f)],
        5 => vec![
            b"EXPIRE".to_vec(),
            key(f),
            f.below(100).to_string().into_bytes(),
        ],
        6 => vec![b"GET".to_vec(), key(f)],
        7 => vec![b"FLUSHALL".to_vec()],
        8 => vec![
            b"CONFIG".to_vec(),
            b"SET".to_vec(),
            b"maxmemory".to_vec(),
            b"1".to_vec(),
        ],
        9 => vec![
            b"fence.set".to_vec(),
            key(f),
            b"0.1".to_vec(),
            b"v".to_vec(),
        ],
        10 => vec![b"EVAL".to_vec(), b"return 1".to_vec(), b"0".to_vec()],
        _ => vec![f.binary(20), key(f)],
    };
    if f.one_in(6) {
        args.truncate(f.index(args.len() + 1));
    }
    args
}

/// One random FENCE.* command: a well-formed one for its kind, then
/// sometimes mangled (an argument replaced, dropped or added).
fn command(f: &mut Fuzz, names: &[Vec<u8>], tokens: &[String]) -> Vec<Vec<u8>> {
    let name = |f: &mut Fuzz| -> Vec<u8> {
        if f.one_in(8) {
            f.binary(40)
        } else {
            f.pick(names)
        }
    };
    let token = |f: &mut Fuzz| -> Vec<u8> {
        if !tokens.is_empty() && f.one_in(3) {
            f.pick(tokens).into_bytes()
        } else {
            f.token().into_bytes()
        }
    };
    let lease = |f: &mut Fuzz| -> Vec<u8> {
        if f.one_in(6) {
            f.binary(300)
        } else {
            format!("lease-{}", f.below(3)).into_bytes()
        }
    };
    let ttl = |f: &mut Fuzz| -> Vec<u8> {
        f.pick(&["1000", "0", "60000", "18446744073709551615", "-5", "1e3"])
            .into()
    };
    let mut args: Vec<Vec<u8>> = match f.below(14) {
        0..=2 => {
            let mut a = vec![b"FENCE.SET".to_vec(), name(f), token(f), value(f)];
            a.extend(options(f));
            a
        }
        3 => {
            let mut a = vec![b"FENCE.DEL".to_vec(), name(f), token(f)];
            a.extend(options(f));
            a
        }
        4 => {
            let scope = name(f);
            let mut a = vec![b"FENCE.EXEC".to_vec(), scope.clone(), token(f)];
            a.extend(options(f));
            if !f.one_in(10) {
                a.push(b"--".to_vec());
            }
            a.extend(inner(f, &scope));
            a
        }
        5 => {
            let mut a = vec![b"FENCE.CHECK".to_vec(), name(f), token(f)];
            a.extend(options(f));
            a
        }
        6 => {
            let mut a = vec![b"FENCE.INSPECT".to_vec(), name(f)];
            if f.one_in(2) {
                a.push(f.pick(&["LEASE", "lease", "LEASES"]).into());
            }
            a
        }
        7 | 8 => {
            let mut a = vec![b"FENCE.ACQUIRE".to_vec(), name(f), lease(f), ttl(f)];
            a.extend(options(f));
            a
        }
        9 => {
            let mut a = vec![b"FENCE.RENEW".to_vec(), name(f), lease(f), token(f), ttl(f)];
            a.extend(options(f));
            a
        }
        10 => vec![b"FENCE.RELEASE".to_vec(), name(f), lease(f), token(f)],
        11 => match f.below(4) {
            0 => vec![b"FENCE.RESTORE".to_vec()],
            1 => vec![b"FENCE.RESTORE".to_vec(), f.u64().to_string().into_bytes()],
            _ => vec![
                b"FENCE.RESTORE".to_vec(),
                f.below(1 << 20).to_string().into_bytes(),
            ],
        },
        12 => {
            // A usable key, a short one, a malformed one, or binary.
            let key = |f: &mut Fuzz| -> Vec<u8> {
                match f.below(4) {
                    0 => format!("{}:{}", f.below(5), "ab".repeat(16)).into_bytes(),
                    1 => b"1:00".to_vec(),
                    2 => b"7:zz,".to_vec(),
                    _ => f.binary(80),
                }
            };
            let prefix = |f: &mut Fuzz| -> Vec<u8> {
                if f.one_in(4) {
                    Vec::new()
                } else {
                    let n = name(f);
                    n[..f.index(n.len() + 1).min(n.len())].to_vec()
                }
            };
            match f.below(5) {
                0 => vec![
                    b"FENCE.KEYS".to_vec(),
                    b"REQUIRE".to_vec(),
                    prefix(f),
                    key(f),
                ],
                1 => vec![b"FENCE.KEYS".to_vec(), b"DROP".to_vec(), prefix(f)],
                2 => vec![b"FENCE.KEYS".to_vec(), b"GRANT".to_vec(), key(f)],
                3 => vec![b"FENCE.KEYS".to_vec(), b"GRANT".to_vec(), b"off".to_vec()],
                _ => vec![b"FENCE.KEYS".to_vec(), b"LIST".to_vec()],
            }
        }
        _ => vec![
            f.pick(&["FENCE.VERSION", "FENCE.METRICS", "fence.set", "FENCE.NOPE"])
                .into(),
        ],
    };
    // Mangle: the arity and the argument kinds the template did not try.
    match f.below(6) {
        0 if args.len() > 1 => {
            let i = 1 + f.index(args.len() - 1);
            args[i] = f.binary(80);
        }
        1 if args.len() > 1 => {
            let keep = 1 + f.index(args.len() - 1);
            args.truncate(keep);
        }
        2 => {
            for _ in 0..1 + f.below(3) {
                args.push(f.binary(40));
            }
        }
        _ => {}
    }
    args
}

/// Check one reply: an answer, never a caught panic or trapped guest, and
/// every error line printable ASCII.
fn judge(reply: &Value) -> Result<()> {
    match reply {
        Value::Error(e) => {
            ensure!(
                !e.starts_with("FENCERUNTIME"),
                "an internal failure answered: -{e}"
            );
            // Redis's own refusal of an unknown command quotes it as
            // sent; every line the module writes is printable ASCII.
            ensure!(
                e.starts_with("ERR unknown command")
                    || e.bytes().all(|b| b == b' ' || b.is_ascii_graphic()),
                "an error line with unprintable bytes: {e:?}"
            );
        }
        Value::Array(items) => {
            for item in items {
                judge(item)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn shown_args(args: &[Vec<u8>]) -> String {
    args.iter().map(|a| shown(a)).collect::<Vec<_>>().join(" ")
}

/// A token a grant returned (`["acquired", token, …]`), to present later.
fn granted(reply: &Value) -> Option<String> {
    match reply.items() {
        [Value::Simple(s), t, ..] if s == "acquired" => t.text(),
        _ => None,
    }
}

/// Random FENCE.* commands over RESP (random arity, options, binary and
/// non-UTF-8 arguments, 1 MiB values, state keys damaged by plain SET,
/// inside MULTI and Lua) on Redis 7.0 and Valkey 8: the server answers
/// every command and stays up, no answer is an internal failure, every
/// error line is printable ASCII, and FENCE.INSPECT decodes every state
/// the fenced commands wrote (a state damaged by a plain SET is refused as
/// corrupt, never an internal failure).
#[test]
fn resp_fuzz_never_crashes_the_server() -> Result<()> {
    each_server(Options::test_clock(), |server| {
        let mut f = Fuzz::from_env(&format!("redis-resp-{:?}", server.kind), 20_000)?;
        let names = names();
        let mut c: Conn = server.conn()?;
        let mut tokens: Vec<String> = Vec::new();
        // States damaged by a plain SET since the last FENCE command that
        // could have rewritten them (any, to keep it simple: the closing
        // check only asks more of the never-damaged ones).
        let mut damaged: BTreeSet<Vec<u8>> = BTreeSet::new();
        let (mut errors, mut answers, mut multis, mut scripts) = (0u64, 0u64, 0u64, 0u64);
        while f.next_input() {
            let at = f.at();
            match f.below(12) {
                // A state key overwritten by a plain SET (bytes damaged).
                0 => {
                    let scope = f.pick(&inspectable(&names));
                    let key = fencecheck_redis::fence_key(&scope)
                        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
                    let current = c.cmd(&[b"GET".as_slice(), &key])?;
                    let bytes = current.bytes().unwrap_or(b"\x01\x02").to_vec();
                    let damage = f.damage(&bytes);
                    c.ok(&[b"SET".as_slice(), &key, &damage]).context(at)?;
                    damaged.insert(scope);
                }
                // Several commands in one MULTI/EXEC.
                1 => {
                    multis += 1;
                    c.ok(&["MULTI"]).context(at.clone())?;
                    let n = 1 + f.below(4);
                    let mut sent = Vec::new();
                    for _ in 0..n {
                        let args = command(&mut f, &names, &tokens);
                        let queued = c
                            .cmd(&args)
                            .with_context(|| format!("{at}: queueing {}", shown_args(&args)))?;
                        judge(&queued).with_context(|| format!("{at}: {}", shown_args(&args)))?;
                        sent.push(args);
                    }
                    let exec = c.cmd(&["EXEC"]).context(at.clone())?;
                    judge(&exec).with_context(|| {
                        format!(
                            "{at}: MULTI {} EXEC",
                            sent.iter()
                                .map(|a| shown_args(a))
                                .collect::<Vec<_>>()
                                .join("; ")
                        )
                    })?;
                }
                // One command from a Lua script (call raises, pcall returns).
                2 => {
                    scripts += 1;
                    let args = command(&mut f, &names, &tokens);
                    let script = if f.one_in(2) {
                        "return redis.pcall(unpack(ARGV))"
                    } else {
                        "return redis.call(unpack(ARGV))"
                    };
                    let mut eval: Vec<Vec<u8>> =
                        vec![b"EVAL".to_vec(), script.into(), b"0".to_vec()];
                    eval.extend(args.iter().cloned());
                    let reply = c
                        .cmd(&eval)
                        .with_context(|| format!("{at}: EVAL {}", shown_args(&args)))?;
                    // A script's own error wraps the module's line; judge
                    // the module's part only when it is not a script error.
                    if !reply.error().is_some_and(|e| e.contains("script")) {
                        judge(&reply)
                            .with_context(|| format!("{at}: EVAL {}", shown_args(&args)))?;
                    }
                }
                _ => {
                    let args = command(&mut f, &names, &tokens);
                    let reply = c.cmd(&args).with_context(|| {
                        format!("{at}: no answer to {} (server down?)", shown_args(&args))
                    })?;
                    judge(&reply).with_context(|| format!("{at}: {}", shown_args(&args)))?;
                    match &reply {
                        Value::Error(_) => errors += 1,
                        other => {
                            answers += 1;
                            if let Some(t) = granted(other) {
                                tokens.push(t);
                            }
                        }
                    }
                }
            }
        }
        ensure!(
            c.ok(&["PING"])? == Value::Simple("PONG".into()),
            "server not answering"
        );
        // Every state decodes; only damaged ones may be refused, as corrupt.
        for scope in inspectable(&names) {
            for lease in [false, true] {
                let mut args = vec![b"FENCE.INSPECT".to_vec(), scope.clone()];
                if lease {
                    args.push(b"LEASE".to_vec());
                }
                let reply = c.cmd(&args)?;
                judge(&reply).with_context(|| shown_args(&args))?;
                match &reply {
                    Value::Bulk(json) => {
                        let text = std::str::from_utf8(json)?;
                        ensure!(text.starts_with('{'), "{}: {text}", shown_args(&args));
                    }
                    Value::Nil => {}
                    Value::Error(e) if !lease && damaged.contains(&scope) => {
                        let code = e.split(' ').next().unwrap_or_default();
                        ensure!(
                            ["CORRUPTSTATE", "UNSUPPORTEDSTATEVERSION", "SCOPEMISMATCH"]
                                .contains(&code),
                            "{}: -{e}",
                            shown_args(&args)
                        );
                    }
                    other => bail!(
                        "{}: a written state does not decode: {other:?}",
                        shown_args(&args)
                    ),
                }
            }
        }
        ensure!(
            errors > 0 && answers > 0,
            "{errors} refused, {answers} answered: the generator misses one side"
        );
        f.finish(&format!(
            "{errors} refused, {answers} answered, {multis} MULTI, {scripts} scripts; server up"
        ));
        Ok(())
    })
}

/// The command that aborted Redis 7.0.15 (an unknown option U+0200, whose
/// low byte is NUL, echoed into the error line), and then every char of
/// U+0100..U+FFFF in every text argument of every command: each gets an
/// error or an answer on the same connection, and the server stays up.
#[test]
fn every_char_in_every_argument_is_answered() -> Result<()> {
    each_server(Options::test_clock(), |server| {
        let mut c = server.conn()?;
        let crash: [&[u8]; 5] = [b"FENCE.SET", b"k", b"0.1", b"v", b"opt\xc8\x80"];
        let reply = c.cmd(&crash)?;
        ensure!(
            reply.error() == Some("ERR option \"OPT\\u{200}\" needs a value"),
            "{reply:?}"
        );
        judge(&reply)?;
        let templates: [&[&str]; 15] = [
            &[
                "FENCE.SET",
                "k",
                "0.5",
                "v",
                "OPID",
                "op",
                "POLICY",
                "strict",
            ],
            &["FENCE.SET", "k", "0.5", "v", "X", "y"],
            &["FENCE.DEL", "k", "0.5", "VERSION", "1"],
            &["FENCE.EXEC", "{k}", "0.5", "--", "SET", "{k}:d", "v"],
            &["FENCE.CHECK", "k", "0.5", "OPID", "op"],
            &["FENCE.INSPECT", "k", "LEASE"],
            &["FENCE.ACQUIRE", "k", "lease", "1000", "NOW", "5"],
            &["FENCE.RENEW", "k", "lease", "0.1", "1000"],
            &["FENCE.RELEASE", "k", "lease", "0.1"],
            &["FENCE.RESTORE", "5"],
            &[
                "FENCE.KEYS",
                "REQUIRE",
                "p/",
                "1:abababababababababababababababab",
            ],
            &["FENCE.KEYS", "GRANT", "1:abababababababababababababababab"],
            &["FENCE.KEYS", "DROP", "p/"],
            &["FENCE.VERSION", "x"],
            &["FENCE.METRICS", "x"],
        ];
        // 32 chars an argument: short enough that an echoed argument is
        // echoed whole (escaped, each at most 8 bytes), so every char
        // reaches the reply writer at least once.
        let chars: Vec<char> = (0x100u32..=0xffff).filter_map(char::from_u32).collect();
        let mut sent = 0u64;
        for template in templates {
            for position in 1..template.len() {
                for block in chars.chunks(32) {
                    let text: String = block.iter().collect();
                    let mut args: Vec<&[u8]> = template.iter().map(|a| a.as_bytes()).collect();
                    args[position] = text.as_bytes();
                    c.send(&args)?;
                    sent += 1;
                }
                // Read this position's replies (pipelined).
                for _ in 0..chars.chunks(32).len() {
                    let reply = c.read().with_context(|| {
                        format!("{}: argument {position}: no answer", template[0])
                    })?;
                    judge(&reply)
                        .with_context(|| format!("{} argument {position}", template[0]))?;
                }
            }
        }
        ensure!(c.ok(&["PING"])? == Value::Simple("PONG".into()));
        println!("{:?}: {sent} commands, each answered", server.kind);
        Ok(())
    })
}
