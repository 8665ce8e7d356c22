//! Complete (non-streamed) answers and RFC 9457 problem documents.

use bytes::Bytes;
use fencecheck::{CheckError, Token, TokenText};
use fencecheck_sqlite::Rejection;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde_json::json;

use crate::error::Error;

/// A complete answer.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
    /// The decision's name for logs and metrics.
    pub outcome: &'static str,
}

impl Reply {
    pub fn new(status: u16, outcome: &'static str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
            outcome,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub fn text(mut self, body: &'static str) -> Self {
        self.body = Bytes::from_static(body.as_bytes());
        self.header("Content-Type", "text/plain; charset=utf-8")
    }

    pub fn json(mut self, body: &serde_json::Value) -> Self {
        self.body = Bytes::from(body.to_string());
        self.header("Content-Type", "application/json")
    }

    /// An RFC 9457 problem document; `extra` adds members (presented, …).
    pub fn problem(
        status: u16,
        outcome: &'static str,
        detail: &str,
        extra: serde_json::Value,
    ) -> Self {
        let mut body = json!({
            "type": format!("https://fencecheck.invalid/problems/{outcome}"),
            "title": outcome,
            "status": status,
            "detail": detail,
        });
        if let (Some(map), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
            map.extend(extra);
        }
        let mut reply =
            Self::new(status, outcome).header("Content-Type", "application/problem+json");
        reply.body = Bytes::from(body.to_string());
        reply
    }

    pub fn bad_request(detail: &str) -> Self {
        Self::problem(400, "bad-request", detail, json!({}))
    }

    pub fn not_found(detail: &str) -> Self {
        Self::problem(404, "not-found", detail, json!({}))
    }

    /// 401: who is asking is not known (no, a malformed or an unknown
    /// `Authorization`). The reason never says which secrets exist.
    pub fn unauthenticated(error: &'static str, detail: &str) -> Self {
        Self::problem(401, "unauthorized", detail, json!({})).header(
            "WWW-Authenticate",
            format!("Bearer realm=\"fencecheck\", error=\"{error}\""),
        )
    }

    /// 403: the principal lacks `right` on the key.
    pub fn forbidden(principal: &str, right: &'static str) -> Self {
        Self::problem(
            403,
            "forbidden",
            &format!("principal {principal:?} has no {right} right on this key"),
            json!({"right": right}),
        )
    }

    /// Infrastructure failure: retry later; never a verdict on the token.
    /// A full disk is 507 (retrying soon will not help), the rest 503.
    pub fn unavailable(e: &Error) -> Self {
        tracing::warn!(error = %e, "storage failure");
        if e.is_full() {
            return Self::problem(
                507,
                "insufficient-storage",
                "the blob store or the database is full; nothing was published",
                json!({}),
            );
        }
        Self::problem(
            503,
            "unavailable",
            "storage failed; nothing was published",
            json!({}),
        )
        .header("Retry-After", "1")
    }

    pub fn overloaded() -> Self {
        Self::problem(503, "overloaded", "too many requests in flight", json!({}))
            .header("Retry-After", "1")
    }

    pub fn too_large(max: u64) -> Self {
        Self::problem(
            413,
            "too-large",
            &format!("the body exceeds {max} bytes"),
            json!({"max": max}),
        )
    }

    pub fn versioned(self, version: u64, fence: String) -> Self {
        self.header("ETag", etag(version))
            .header("Fence-Token", fence)
    }

    /// Write the answer. An answer sent before the request body was read
    /// (refused early) closes the connection rather than let the server
    /// drain an arbitrarily large body for reuse.
    pub async fn send(self, session: &mut Session) -> pingora::Result<()> {
        if !session.as_downstream_mut().is_body_done() {
            session.set_keepalive(None);
        }
        let mut header = ResponseHeader::build(self.status, Some(self.headers.len() + 1))?;
        for (name, value) in self.headers {
            header.insert_header(name, value)?;
        }
        // RFC 9110 §8.6: no Content-Length on 1xx and 204 (and 304 keeps
        // whatever the handler set: the selected representation's).
        if !matches!(self.status, 100..=199 | 204 | 304) {
            header.insert_header("Content-Length", self.body.len().to_string())?;
        }
        let empty = self.body.is_empty();
        session
            .write_response_header(Box::new(header), empty)
            .await?;
        if !empty {
            session.write_response_body(Some(self.body), true).await?;
        }
        Ok(())
    }
}

pub(crate) fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

pub(crate) fn token_text(token: Token) -> String {
    TokenText(token).to_string()
}

/// The answer to any decision but applied.
pub(crate) fn rejection(r: &Rejection, fence: &str) -> Reply {
    match r {
        Rejection::Duplicate { version } => {
            Reply::new(200, "duplicate").versioned(*version, fence.to_owned())
        }
        Rejection::StaleFence { presented, highest } => Reply::problem(
            409,
            "stale-fence",
            "a newer fencing token has written this key; stop, do not retry under this token",
            json!({"presented": token_text(*presented), "highest": token_text(*highest)}),
        ),
        Rejection::VersionConflict { expected, actual } => Reply::problem(
            412,
            "version-conflict",
            "the precondition (If-Match / If-None-Match) does not hold for the current version",
            json!({"expected": expected, "actual": actual}),
        ),
        Rejection::Refused(e) => refused(e),
        // Definitive for this token: a forged, tampered, replayed or
        // unsigned token never passes, so not 409 (which invites a new
        // grant) nor 503 (which invites a retry).
        Rejection::Unauthenticated(failure) => Reply::problem(
            403,
            "unauthenticated",
            "this key requires a Fence-Token signed by its authority",
            json!({"reason": failure.name()}),
        ),
        // The gateway's own key configuration is unusable: fail closed.
        Rejection::InvalidKeys(problem) => Reply::problem(
            500,
            "invalid-keys",
            "the signing keys configured for this key are unusable",
            json!({"reason": problem.name()}),
        ),
    }
}

pub(crate) fn refused(e: &CheckError) -> Reply {
    let detail = format!("{e:?}");
    match e {
        CheckError::InvalidRequest(_) => Reply::problem(400, "invalid-request", &detail, json!({})),
        CheckError::ForeignAuthority { .. } => {
            Reply::problem(400, "foreign-authority", &detail, json!({}))
        }
        // The stored state is unusable: fail closed, and not retryable.
        _ => Reply::problem(500, "refused", &detail, json!({})),
    }
}
