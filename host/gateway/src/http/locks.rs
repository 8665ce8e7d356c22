//! The lock surface over HTTP: a small JSON body read at the body pace,
//! then one coordinator decision under an in-flight permit, bound to the
//! calling principal and to `--max-ttl` ([`crate::locks`]).

use bytes::Bytes;
use pingora::proxy::Session;

use super::body::{BodyFailure, read_all};
use super::reply::Reply;
use super::{Gateway, blocking};
use crate::auth::Caller;
use crate::error::Error;
use crate::locks::{self, LockPolicy, MAX_LOCK_BODY};

pub(crate) async fn serve(
    gw: &Gateway,
    session: &mut Session,
    caller: &Caller,
    lock: String,
    action: String,
) -> pingora::Result<Reply> {
    let body = match read_all(session, gw.config.pace, MAX_LOCK_BODY as u64).await {
        Ok(body) => body,
        Err(failure) => {
            session.set_keepalive(None);
            return match failure {
                BodyFailure::TooLarge => Ok(Reply::too_large(MAX_LOCK_BODY as u64)),
                BodyFailure::Client(e) => Err(e),
                BodyFailure::Cut(why) | BodyFailure::Malformed(why) => Ok(Reply::bad_request(
                    &format!("the body is incomplete: {why}"),
                )),
                _ => Ok(Reply::problem(
                    408,
                    "body-timeout",
                    "the request body was too slow",
                    serde_json::json!({}),
                )),
            };
        }
    };
    let permit = match gw.permit(true).await {
        Ok(permit) => permit,
        Err(f) => return Ok(f.reply()),
    };
    let coordinator = gw.coordinator.clone();
    let owner = caller.name().map(str::to_owned);
    let max_ttl_ms = u64::try_from(gw.config.max_ttl.as_millis()).unwrap_or(u64::MAX);
    let answer = blocking(move || {
        let policy = LockPolicy {
            owner: owner.as_deref(),
            max_ttl_ms,
        };
        Ok(locks::handle(&coordinator, &lock, &action, &body, policy))
    })
    .await;
    drop(permit);
    Ok(match answer {
        Ok(r) => {
            if let Some(event) = r.lease {
                gw.metrics.lease(*event);
            }
            let kind = if r.status >= 400 {
                "application/problem+json"
            } else {
                "application/json"
            };
            let mut reply = Reply::new(r.status, r.outcome).header("Content-Type", kind);
            if r.status == 503 {
                reply = reply.header("Retry-After", "1");
            }
            reply.body = Bytes::from(r.body.to_string());
            reply
        }
        Err(e) => Reply::unavailable(&Error::Task(e.to_string())),
    })
}
