//! Lease endpoints for clients in any language:
//! `POST /v1/locks/{lock}/acquire|renew|release` with a small JSON body, on
//! the coordinator trait (SQLite by default). The token an acquire returns
//! is the `Fence-Token` writes carry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencecheck::{SignedTokenText, Token};
use fencecheck_authority::{
    AcquireOutcome, AuthorityError, Coordinator, ReleaseOutcome, RenewOutcome,
};
use serde::Deserialize;
use serde_json::{Value, json};

/// Largest accepted JSON body.
pub const MAX_LOCK_BODY: usize = 4096;

/// What a lock endpoint answers: status and JSON body.
pub struct LockReply {
    /// HTTP status.
    pub status: u16,
    /// Outcome name for logs and metrics.
    pub outcome: &'static str,
    /// The JSON body (problem documents for errors).
    pub body: Value,
    /// What the answer tells the lease rows of the metric table (`None`
    /// for a request the coordinator never saw).
    pub lease: Option<Box<LeaseEvent>>,
}

/// A coordinator decision in the metric table's terms (docs/design.md §12).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LeaseEvent {
    /// An acquisition answered `acquired` (with the grant's token) or
    /// `busy`, or failed (`error`, with the coordinator error's kind).
    Acquire {
        /// `acquired`, `busy` or `error`.
        result: &'static str,
        /// From the coordinator call to its answer.
        took: Duration,
        /// The grant's token, when acquired.
        token: Option<Token>,
        /// The table's `kind` when the coordinator gave no answer.
        error: Option<&'static str>,
    },
    /// A renewal answered `renewed` or `lost`, or failed (`error`).
    Renew {
        /// `renewed`, `lost` or `error`.
        result: &'static str,
        /// The table's `kind` when the coordinator gave no answer.
        error: Option<&'static str>,
    },
    /// A release (answered or not).
    Release {
        /// The table's `kind` when the coordinator gave no answer.
        error: Option<&'static str>,
    },
}

fn reply(status: u16, outcome: &'static str, body: Value) -> LockReply {
    LockReply {
        status,
        outcome,
        body,
        lease: None,
    }
}

fn problem(status: u16, outcome: &'static str, detail: &str) -> LockReply {
    reply(
        status,
        outcome,
        json!({
            "type": format!("https://fencecheck.invalid/problems/{outcome}"),
            "title": outcome,
            "status": status,
            "detail": detail,
        }),
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Acquire {
    lease_id: String,
    ttl_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Renew {
    lease_id: String,
    token: String,
    ttl_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Release {
    lease_id: String,
    token: String,
}

/// The token of renew and release: as acquire returned it (signed or not;
/// the coordinator matches the token, the signature has no say here).
fn token(text: &str) -> Result<fencecheck::Token, LockReply> {
    text.parse::<SignedTokenText>()
        .map(|t| t.token)
        .map_err(|_| {
            problem(
                400,
                "bad-request",
                "token must be AUTHORITY:EPOCH.COUNTER (optionally ~KEY-ID~LEASE~TAG)",
            )
        })
}

fn failed(e: AuthorityError) -> LockReply {
    match e {
        AuthorityError::Refused { error } => problem(400, "refused", &error.to_string()),
        e => {
            tracing::warn!(error = %e, "lease store failure");
            let mut r = problem(
                503,
                "unavailable",
                "the lease store failed; nothing changed",
            );
            r.outcome = "unavailable";
            r
        }
    }
}

/// Who asks, and the bound on every lease.
#[derive(Clone, Copy, Debug)]
pub struct LockPolicy<'a> {
    /// The principal asking (`None`: open mode). Its leases are stored under
    /// `NAME/LEASE-ID`, so a lease id another principal chose (or guessed)
    /// names a different lease: renewing or releasing it is `lost` /
    /// `not-owner`, and acquiring it is `busy`.
    pub owner: Option<&'a str>,
    /// The longest `ttl_ms` accepted; more is 400.
    pub max_ttl_ms: u64,
}

impl LockPolicy<'_> {
    /// The lease id the coordinator stores for `lease_id`.
    fn stored(&self, lease_id: &str) -> Result<String, LockReply> {
        if lease_id.is_empty() {
            return Err(problem(400, "bad-request", "lease_id must not be empty"));
        }
        let stored = match self.owner {
            None => lease_id.to_owned(),
            Some(owner) => format!("{owner}/{lease_id}"),
        };
        if stored.len() > fencecheck::MAX_LEASE_ID_BYTES {
            let room = fencecheck::MAX_LEASE_ID_BYTES - (stored.len() - lease_id.len());
            return Err(problem(
                400,
                "bad-request",
                &format!("lease_id must be at most {room} bytes"),
            ));
        }
        Ok(stored)
    }

    fn ttl(&self, ttl_ms: u64) -> Result<u64, LockReply> {
        if ttl_ms > self.max_ttl_ms {
            let mut r = problem(
                400,
                "ttl-too-long",
                &format!(
                    "ttl_ms is over this gateway's --max-ttl ({} ms)",
                    self.max_ttl_ms
                ),
            );
            r.body["max_ttl_ms"] = json!(self.max_ttl_ms);
            return Err(r);
        }
        Ok(ttl_ms)
    }
}

/// Decide `action` on `lock` (already validated) with `body`. Blocks.
pub fn handle(
    coordinator: &Arc<dyn Coordinator>,
    lock: &str,
    action: &str,
    body: &[u8],
    policy: LockPolicy<'_>,
) -> LockReply {
    let parse_error = |e: serde_json::Error| problem(400, "bad-request", &e.to_string());
    let result = match action {
        "acquire" => serde_json::from_slice::<Acquire>(body)
            .map_err(parse_error)
            .and_then(|a| Ok((policy.stored(&a.lease_id)?, policy.ttl(a.ttl_ms)?, a)))
            .map(|(stored, ttl, a)| {
                let started = Instant::now();
                let answer = coordinator.acquire(lock, &stored, ttl);
                let took = started.elapsed();
                let event = |result, token, error| LeaseEvent::Acquire {
                    result,
                    took,
                    token,
                    error,
                };
                let (mut r, event) = match answer {
                    Ok(AcquireOutcome::Acquired(g)) => (
                        reply(
                            200,
                            "acquired",
                            json!({
                                "lock": g.lock,
                                "lease_id": a.lease_id,
                                "token": g.token_text().to_string(),
                                "expires_at": g.expires_at,
                                "decided_at": g.decided_at,
                            }),
                        ),
                        event("acquired", Some(g.token), None),
                    ),
                    // The holder's lease id is not disclosed: with the token it
                    // is what renew and release ask for.
                    Ok(AcquireOutcome::Busy { expires_at, .. }) => {
                        let mut r = problem(409, "busy", "another lease holds this lock");
                        r.body["expires_at"] = json!(expires_at);
                        (r, event("busy", None, None))
                    }
                    Err(e) => {
                        let kind = e.signal_kind();
                        (failed(e), event("error", None, kind))
                    }
                };
                r.lease = Some(Box::new(event));
                r
            }),
        "renew" => serde_json::from_slice::<Renew>(body)
            .map_err(parse_error)
            .and_then(|r| {
                Ok((
                    token(&r.token)?,
                    policy.stored(&r.lease_id)?,
                    policy.ttl(r.ttl_ms)?,
                ))
            })
            .map(|(t, stored, ttl)| {
                let (mut r, result, error) = match coordinator.renew(lock, &stored, t, ttl) {
                    Ok(RenewOutcome::Renewed { expires_at }) => (
                        reply(200, "renewed", json!({"expires_at": expires_at})),
                        "renewed",
                        None,
                    ),
                    Ok(RenewOutcome::Lost) => (
                        problem(409, "lost", "not the current lease: stop working under it"),
                        "lost",
                        None,
                    ),
                    Err(e) => {
                        let kind = e.signal_kind();
                        (failed(e), "error", kind)
                    }
                };
                r.lease = Some(Box::new(LeaseEvent::Renew { result, error }));
                r
            }),
        "release" => serde_json::from_slice::<Release>(body)
            .map_err(parse_error)
            .and_then(|r| Ok((token(&r.token)?, policy.stored(&r.lease_id)?)))
            .map(|(t, stored)| {
                let (mut r, error) = match coordinator.release(lock, &stored, t) {
                    Ok(ReleaseOutcome::Released) => {
                        (reply(200, "released", json!({"released": true})), None)
                    }
                    Ok(ReleaseOutcome::NotOwner) => (
                        problem(409, "not-owner", "not the current lease; nothing changed"),
                        None,
                    ),
                    Err(e) => {
                        let kind = e.signal_kind();
                        (failed(e), kind)
                    }
                };
                r.lease = Some(Box::new(LeaseEvent::Release { error }));
                r
            }),
        _ => Err(problem(404, "not-found", "use acquire, renew or release")),
    };
    result.unwrap_or_else(|r| r)
}
