//! Lease endpoints for clients in any language:
//! `POST /v1/locks/{lock}/acquire|renew|release` with a small JSON body, on
//! the coordinator trait (SQLite by default). The token an acquire returns
//! is the `Fence-Token` writes carry.

use std::sync::Arc;

use fencecheck::SignedTokenText;
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
}

fn reply(status: u16, outcome: &'static str, body: Value) -> LockReply {
    LockReply {
        status,
        outcome,
        body,
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

/// Decide `action` on `lock` (already validated) with `body`. Blocks.
pub fn handle(
    coordinator: &Arc<dyn Coordinator>,
    lock: &str,
    action: &str,
    body: &[u8],
) -> LockReply {
    let parse_error = |e: serde_json::Error| problem(400, "bad-request", &e.to_string());
    let result = match action {
        "acquire" => serde_json::from_slice::<Acquire>(body)
            .map_err(parse_error)
            .map(|a| match coordinator.acquire(lock, &a.lease_id, a.ttl_ms) {
                Ok(AcquireOutcome::Acquired(g)) => reply(
                    200,
                    "acquired",
                    json!({
                        "lock": g.lock,
                        "lease_id": g.lease_id,
                        "token": g.token_text().to_string(),
                        "expires_at": g.expires_at,
                        "decided_at": g.decided_at,
                    }),
                ),
                // The holder's lease id is not disclosed: with the token it
                // is what renew and release ask for.
                Ok(AcquireOutcome::Busy { expires_at, .. }) => {
                    let mut r = problem(409, "busy", "another lease holds this lock");
                    r.body["expires_at"] = json!(expires_at);
                    r
                }
                Err(e) => failed(e),
            }),
        "renew" => serde_json::from_slice::<Renew>(body)
            .map_err(parse_error)
            .and_then(|r| Ok((token(&r.token)?, r)))
            .map(
                |(t, r)| match coordinator.renew(lock, &r.lease_id, t, r.ttl_ms) {
                    Ok(RenewOutcome::Renewed { expires_at }) => {
                        reply(200, "renewed", json!({"expires_at": expires_at}))
                    }
                    Ok(RenewOutcome::Lost) => {
                        problem(409, "lost", "not the current lease: stop working under it")
                    }
                    Err(e) => failed(e),
                },
            ),
        "release" => serde_json::from_slice::<Release>(body)
            .map_err(parse_error)
            .and_then(|r| Ok((token(&r.token)?, r)))
            .map(|(t, r)| match coordinator.release(lock, &r.lease_id, t) {
                Ok(ReleaseOutcome::Released) => reply(200, "released", json!({"released": true})),
                Ok(ReleaseOutcome::NotOwner) => {
                    problem(409, "not-owner", "not the current lease; nothing changed")
                }
                Err(e) => failed(e),
            }),
        _ => Err(problem(404, "not-found", "use acquire, renew or release")),
    };
    result.unwrap_or_else(|r| r)
}
