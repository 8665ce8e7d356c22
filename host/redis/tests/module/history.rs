//! Many clients, random tokens, one history checked with the project's
//! checker (tests/support/history.rs): each write is `FENCE.EXEC scope
//! token [guards] -- RPUSH <scope>:audit "<payload> <token>"`, so the audit
//! list is written in the same atomic step as the state, and entry i is
//! version i + 1.

#[path = "../../../../tests/support/history.rs"]
#[allow(dead_code, missing_docs)]
mod checker;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};

use crate::common::{Conn, Options, Server, Value, kinds};
use anyhow::{Context, Result, bail, ensure};
use checker::{Attempt, Audited, Kept, Rng, Seen};
use fencecheck::{Token, TokenText};

const CLIENTS: usize = 8;
const WRITES: usize = 150;
const SCOPES: [&str; 3] = ["{h1}", "{h2}", "{h3}"];

fn client(port: u16, id: usize, start: &Barrier) -> Result<Vec<Attempt>> {
    let mut c = Conn::connect(port)?;
    let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ ((id as u64 + 1) * 0x9E37_79B9));
    let mut out = Vec::new();
    start.wait();
    for n in 0..WRITES {
        let scope = SCOPES[rng.below(SCOPES.len() as u64) as usize];
        // Tokens drift upward with the attempt number, so old and new
        // grants interleave across clients.
        let token = Token::new(0, 0, (n as u64 / 10) + rng.below(6) + 1);
        let payload = format!("c{id}-n{n}");
        let (op_id, expected_version) = match rng.below(4) {
            0 => (Some(format!("op-{}", rng.below(8))), None),
            1 => (None, Some(rng.below(60))),
            _ => (None, None),
        };
        let text = TokenText(token).to_string();
        let mut args: Vec<String> = vec!["FENCE.EXEC".into(), scope.into(), text.clone()];
        if op_id.is_some() || expected_version.is_some() {
            args.extend(["POLICY".into(), "allow-equal".into()]);
        }
        if let Some(op) = &op_id {
            args.extend(["OPID".into(), op.clone()]);
        }
        if let Some(v) = expected_version {
            args.extend(["VERSION".into(), v.to_string()]);
        }
        args.extend([
            "--".into(),
            "RPUSH".into(),
            format!("{scope}:audit"),
            format!("{payload} {text}"),
        ]);
        let reply = c.cmd(&args)?;
        let seen = match &reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Simple(s), Value::Int(v), Value::Int(len)] if s == "applied" => {
                    // The list's new length is the version: state and data moved together.
                    ensure!(v == len, "version {v} but the audit list has {len}");
                    Seen::Applied(u64::try_from(*v)?)
                }
                [Value::Simple(s), Value::Int(_)] if s == "duplicate" => {
                    Seen::Refused("duplicate".into())
                }
                _ => bail!("unexpected reply {reply:?}"),
            },
            Value::Error(e) => {
                let first = e.split(' ').next().unwrap_or_default().to_string();
                ensure!(
                    ["STALEFENCE", "VERSIONCONFLICT", "INVALIDREQUEST"].contains(&first.as_str()),
                    "unexpected error -{e}"
                );
                Seen::Refused(first)
            }
            other => bail!("unexpected reply {other:?}"),
        };
        out.push(Attempt {
            client: id,
            scope: scope.to_string(),
            token,
            op_id,
            expected_version,
            payload,
            seen,
        });
    }
    Ok(out)
}

/// 8 clients × 150 random writes on 3 scopes, on each server: versions
/// contiguous, tokens never decrease, every acknowledged write kept at its
/// version, no refused write visible; the state's version is the audit
/// list's length.
#[test]
fn concurrent_clients_keep_a_valid_history() -> Result<()> {
    for kind in kinds() {
        let server = Server::start(kind, Options::module())?;
        let start = Arc::new(Barrier::new(CLIENTS));
        let handles: Vec<_> = (0..CLIENTS)
            .map(|id| {
                let start = Arc::clone(&start);
                let port = server.port;
                std::thread::spawn(move || client(port, id, &start))
            })
            .collect();
        let mut attempts = Vec::new();
        for h in handles {
            attempts.extend(h.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
        }
        let mut c = server.conn()?;
        let mut kept = Kept::default();
        for scope in SCOPES {
            let list = c.ok(&["LRANGE", &format!("{scope}:audit"), "0", "-1"])?;
            let mut log = BTreeMap::new();
            for (i, entry) in list.items().iter().enumerate() {
                let text = entry.text().context("audit entry")?;
                let (payload, token) = text.split_once(' ').context("payload token")?;
                let token = token.parse::<TokenText>()?.0;
                log.insert(
                    i as u64 + 1,
                    Audited {
                        payload: payload.into(),
                        token,
                    },
                );
            }
            if let Some((v, last)) = log.iter().next_back() {
                kept.finals
                    .insert(scope.to_string(), (*v, last.payload.clone()));
                let json = c.ok(&["FENCE.INSPECT", scope])?.text().context("a state")?;
                let info: serde_json::Value = serde_json::from_str(&json)?;
                ensure!(
                    info["version"] == *v,
                    "{kind:?} {scope}: state {info} vs {v} audited"
                );
            }
            kept.audit.insert(scope.to_string(), log);
        }
        let summary = checker::check(&attempts, &kept).with_context(|| format!("{kind:?}"))?;
        ensure!(
            summary.applied > 20 && summary.refused > 20,
            "{kind:?}: {summary:?}"
        );
        println!("{kind:?}: {summary:?}");
    }
    Ok(())
}
