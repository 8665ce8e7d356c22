//! Grants as a coordinator's store committed them, read back from the lease
//! states it stored, in commit order (a SQLite trigger's log, or an etcd
//! key's revisions), for the shared checker's `check_issued`.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::{Result, anyhow, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use fencecheck::{Checker, Native, Token};

/// One grant the store committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The lock.
    pub lock: String,
    /// The lease id it was granted to.
    pub lease_id: String,
    /// The token it carries.
    pub token: Token,
}

/// The grants among `states` ((lock, stored lease state) in commit order):
/// every state whose holder is a lease id the lock's previous state did not
/// hold. Renewals and releases keep or drop the holder and are not grants.
pub fn grants(states: &[(String, Vec<u8>)]) -> Result<Vec<Stored>> {
    let mut holder: HashMap<&str, String> = HashMap::new();
    let mut out = Vec::new();
    for (i, (lock, state)) in states.iter().enumerate() {
        let info = Native
            .inspect_lease(state)?
            .map_err(|e| anyhow!("stored state {i} of {lock}: {e:?}"))?;
        ensure!(&info.lock == lock, "state {i} of {lock} is {}'s", info.lock);
        let now = info.holder.map(|h| (h.lease_id, h.token));
        match now {
            Some((lease_id, token)) => {
                if holder.get(lock.as_str()) != Some(&lease_id) {
                    out.push(Stored {
                        lock: lock.clone(),
                        lease_id: lease_id.clone(),
                        token,
                    });
                }
                holder.insert(lock, lease_id);
            }
            None => {
                holder.remove(lock.as_str());
            }
        }
    }
    Ok(out)
}

/// `stored` as `check_issued` takes it: (lock, token) in decision order.
pub fn issued(stored: &[Stored]) -> Vec<(String, Token)> {
    stored.iter().map(|s| (s.lock.clone(), s.token)).collect()
}

/// Every acknowledged grant (lock, lease id, token) was committed with the
/// token its client was told; every committed grant was acknowledged or
/// its acquire's outcome is `unknown` to its client (lease ids).
pub fn account(
    acked: &[(String, String, Token)],
    unknown: &[String],
    stored: &[Stored],
) -> Result<()> {
    let committed: HashMap<(&str, &str), Token> = stored
        .iter()
        .map(|s| ((s.lock.as_str(), s.lease_id.as_str()), s.token))
        .collect();
    ensure!(
        committed.len() == stored.len(),
        "a lease id was granted twice"
    );
    for (lock, lease_id, token) in acked {
        ensure!(
            committed.get(&(lock.as_str(), lease_id.as_str())) == Some(token),
            "acknowledged grant {lease_id} {token:?} on {lock} is not committed as told"
        );
    }
    let told: HashSet<(&str, &str)> = acked
        .iter()
        .map(|(l, id, _)| (l.as_str(), id.as_str()))
        .collect();
    let unknown: HashSet<&str> = unknown.iter().map(String::as_str).collect();
    for s in stored {
        ensure!(
            told.contains(&(s.lock.as_str(), s.lease_id.as_str()))
                || unknown.contains(s.lease_id.as_str()),
            "committed grant {s:?} was neither acknowledged nor unknown to its client"
        );
    }
    Ok(())
}

/// Every state `lock`'s etcd key (default prefix) held, oldest first:
/// walked back from the current value through each `mod_revision` (the
/// test clusters never compact).
/// One range read. A member just healed from a partition (or back from a
/// pause) answers 503 to linearizable reads until it has caught up with
/// the leader, after the cluster already agrees on one: wait for it
/// (bounded), as any client would. Only the read of the history waits; the
/// history itself is checked as read.
fn read(http: &ureq::Agent, url: &str, body: &str) -> Result<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match http.post(url).send(body) {
            Ok(mut response) => {
                return Ok(serde_json::from_slice(&response.body_mut().read_to_vec()?)?);
            }
            Err(ureq::Error::StatusCode(503)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("POST {url}"))),
        }
    }
}

pub fn etcd_states(endpoint: &str, lock: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let http: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let key = B64.encode(format!("fencecheck/lock/{lock}"));
    let url = format!("{endpoint}/v3/kv/range");
    let number = |v: &serde_json::Value, what: &str| -> Result<u64> {
        v.as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("{what} is not a u64 string: {v}"))
    };
    let mut states = Vec::new();
    let mut revision = 0; // 0: the current revision
    let mut versions = None;
    loop {
        let body = serde_json::json!({"key": key, "revision": revision.to_string()});
        let r = read(&http, &url, &body.to_string())?;
        let Some(kv) = r.pointer("/kvs/0") else {
            ensure!(revision != 0, "the lock was never stored: {r}");
            break;
        };
        let value = B64.decode(kv["value"].as_str().unwrap_or_default())?;
        states.push((lock.to_owned(), value));
        versions.get_or_insert(number(&kv["version"], "version")?);
        let modified = number(&kv["mod_revision"], "mod_revision")?;
        if modified <= 1 {
            break;
        }
        revision = modified - 1;
    }
    ensure!(
        versions == Some(states.len() as u64),
        "read {} states of the key, etcd counts {versions:?}",
        states.len()
    );
    states.reverse();
    Ok(states)
}
