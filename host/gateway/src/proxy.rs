//! The Pingora service: every route is answered in `request_filter`; the
//! embedded store has no upstream to proxy to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use fencecheck::{
    CheckError, Decision, MAX_OP_ID_BYTES, Policy, Request, SignedCheckError, SignedTokenText,
    Token, TokenText,
};
use fencecheck_sqlite::{Fenced, ObjectId, Rejection};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use serde_json::json;
use tokio::sync::Semaphore;

use crate::blobs::Blobs;
use crate::error::Error;
use crate::key::validate_key;
use crate::locks::{self, MAX_LOCK_BODY};
use crate::metrics::Metrics;
use crate::store::{Kind, Store};

/// Limits and timeouts of the gateway.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest accepted request body, in bytes.
    pub max_body: u64,
    /// Longest wait for the next chunk of a request body (slow clients).
    pub body_timeout: Duration,
    /// Object requests served at once; more get 503.
    pub max_in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_body: 64 << 20,
            body_timeout: Duration::from_secs(10),
            max_in_flight: 256,
        }
    }
}

/// The fencing gateway: a [`ProxyHttp`] that answers every request itself.
pub struct Gateway {
    store: Arc<Store>,
    blobs: Arc<Blobs>,
    coordinator: Arc<dyn fencecheck_authority::Coordinator>,
    config: Config,
    metrics: Arc<Metrics>,
    in_flight: Arc<Semaphore>,
}

impl Gateway {
    /// A gateway over `store` (pointers, fences) and `blobs` (bytes), with
    /// lease endpoints on `coordinator`.
    pub fn new(
        store: Arc<Store>,
        blobs: Arc<Blobs>,
        coordinator: Arc<dyn fencecheck_authority::Coordinator>,
        config: Config,
        metrics: Arc<Metrics>,
    ) -> Self {
        let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
        Self {
            store,
            blobs,
            coordinator,
            config,
            metrics,
            in_flight,
        }
    }
}

/// Per-request facts for the log line and the metrics.
#[derive(Debug)]
pub struct Ctx {
    started: Instant,
    op: &'static str,
    outcome: &'static str,
    epoch: Option<u64>,
}

/// A complete (non-streamed) answer.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Bytes,
    /// The decision's name for logs and metrics.
    outcome: &'static str,
}

impl Reply {
    fn new(status: u16, outcome: &'static str) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
            outcome,
        }
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn text(mut self, body: &'static str) -> Self {
        self.body = Bytes::from_static(body.as_bytes());
        self.header("Content-Type", "text/plain; charset=utf-8")
    }

    /// An RFC 9457 problem document; `extra` adds members (presented, …).
    fn problem(status: u16, outcome: &'static str, detail: &str, extra: serde_json::Value) -> Self {
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

    fn bad_request(detail: &str) -> Self {
        Self::problem(400, "bad-request", detail, json!({}))
    }

    /// Infrastructure failure: retry later; never a verdict on the token.
    fn unavailable(e: &Error) -> Self {
        tracing::warn!(error = %e, "storage failure");
        Self::problem(
            503,
            "unavailable",
            "storage failed; nothing was published",
            json!({}),
        )
        .header("Retry-After", "1")
    }

    fn versioned(mut self, version: u64, fence: String) -> Self {
        self = self.header("ETag", format!("\"{version}\""));
        self.header("Fence-Token", fence)
    }
}

fn token_text(token: Token) -> String {
    TokenText(token).to_string()
}

/// The fenced request from the headers, or the 400/428 answer.
fn fence_request(req: &RequestHeader, key: &str) -> Result<Request, Reply> {
    let mut tokens = req.headers.get_all("fence-token").iter();
    let Some(raw) = tokens.next() else {
        return Err(Reply::problem(
            428,
            "missing-token",
            "a Fence-Token header is required",
            json!({}),
        ));
    };
    if tokens.next().is_some() {
        return Err(Reply::bad_request("more than one Fence-Token header"));
    }
    let presented = raw
        .to_str()
        .ok()
        .and_then(|t| t.trim().parse::<SignedTokenText>().ok())
        .ok_or_else(|| {
            Reply::bad_request(
                "Fence-Token must be EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER, signed: TOKEN~KEY-ID~LEASE~TAG",
            )
        })?;
    let token = presented.token;
    let op_id = match req.headers.get("idempotency-key") {
        None => None,
        Some(v) => match v.to_str() {
            Ok(s) if !s.is_empty() && s.len() <= MAX_OP_ID_BYTES => Some(s.to_owned()),
            _ => {
                return Err(Reply::bad_request(
                    "Idempotency-Key must be 1 to 256 bytes of visible ASCII",
                ));
            }
        },
    };
    let expected = match req.headers.get("if-match") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.strip_prefix('"')?.strip_suffix('"')?.parse::<u64>().ok())
                .ok_or_else(|| {
                    Reply::bad_request("If-Match must be one strong ETag: \"<version>\"")
                })?,
        ),
    };
    // Guarded writes (op-id or expected version) may repeat a grant's
    // token; an unguarded one may not (design §3 rules 6 and 7).
    let policy = if op_id.is_some() || expected.is_some() {
        Policy::AllowEqual
    } else {
        Policy::Strict
    };
    let mut request = Request::new(key, token, policy);
    request.signature = presented.signature;
    if let Some(op_id) = op_id {
        request = request.with_op_id(op_id);
    }
    if let Some(expected) = expected {
        request = request.with_expected_version(expected);
    }
    Ok(request)
}

/// The answer to any decision but applied.
fn rejection(r: &Rejection, fence: &str) -> Reply {
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
            "If-Match does not name the current version",
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

fn refused(e: &CheckError) -> Reply {
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

/// Decision of the early check as a rejection, if it is one worth stopping
/// the upload for: only stale (it can never become fresh again).
fn early_stop(outcome: &fencecheck::SignedOutcome) -> Option<Reply> {
    match outcome {
        Ok(Decision::StaleFence { presented, highest }) => Some(rejection(
            &Rejection::StaleFence {
                presented: *presented,
                highest: *highest,
            },
            "",
        )),
        Err(SignedCheckError::Check(e)) => Some(refused(e)),
        // An unauthenticated token never passes: refused before the upload.
        Err(SignedCheckError::Unauthenticated(f)) => {
            Some(rejection(&Rejection::Unauthenticated(*f), ""))
        }
        Err(SignedCheckError::InvalidKeys(p)) => Some(rejection(&Rejection::InvalidKeys(*p), "")),
        _ => None,
    }
}

/// Run blocking store work (SQLite, the component) off the event loop.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Task(e.to_string()))?
}

/// Why the body could not be stored.
enum BodyFailure {
    TooLarge,
    Timeout,
    Client(Box<pingora::Error>),
    Storage(Error),
}

impl Gateway {
    async fn route(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<()> {
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_owned();
        let has_query = req.uri.query().is_some();
        let reply = match (method.as_str(), path.as_str()) {
            ("GET", "/healthz") => {
                ctx.op = "health";
                let store = self.store.clone();
                match blocking(move || store.ping()).await {
                    Ok(()) => Reply::new(200, "ok").text("ok\n"),
                    Err(e) => Reply::unavailable(&e),
                }
            }
            ("GET", "/metrics") => {
                ctx.op = "metrics";
                let mut reply = Reply::new(200, "ok")
                    .header("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
                reply.body = Bytes::from(self.metrics.render());
                reply
            }
            (_, p) if p.starts_with("/objects/") => {
                let raw = &path["/objects/".len()..];
                ctx.op = match method.as_str() {
                    "PUT" => "put",
                    "DELETE" => "delete",
                    "GET" | "HEAD" => "get",
                    _ => "other",
                };
                let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
                    let reply =
                        Reply::problem(503, "overloaded", "too many requests in flight", json!({}))
                            .header("Retry-After", "1");
                    return self.send(session, ctx, reply).await;
                };
                match validate_key(raw) {
                    Err(e) => Reply::bad_request(&e.to_string()),
                    Ok(_) if has_query => Reply::bad_request("object URLs take no query string"),
                    Ok(key) => match method.as_str() {
                        "PUT" => self.put(session, ctx, key).await?,
                        "DELETE" => self.delete(session, ctx, key).await,
                        "GET" | "HEAD" => {
                            return self.get(session, ctx, key, method.as_str() == "HEAD").await;
                        }
                        _ => Reply::problem(
                            405,
                            "method-not-allowed",
                            "use GET, HEAD, PUT or DELETE",
                            json!({}),
                        )
                        .header("Allow", "GET, HEAD, PUT, DELETE"),
                    },
                }
            }
            ("POST", p) if p.starts_with("/v1/locks/") => {
                ctx.op = "lock";
                self.lock(session, &path["/v1/locks/".len()..], has_query)
                    .await?
            }
            _ => Reply::problem(404, "not-found", "no such route", json!({})),
        };
        self.send(session, ctx, reply).await
    }

    /// `POST /v1/locks/{lock}/{action}`: a bounded JSON body, one decision.
    async fn lock(
        &self,
        session: &mut Session,
        rest: &str,
        has_query: bool,
    ) -> pingora::Result<Reply> {
        let Some((lock, action)) = rest.rsplit_once('/') else {
            return Ok(Reply::problem(
                404,
                "not-found",
                "use /v1/locks/{lock}/acquire|renew|release",
                json!({}),
            ));
        };
        if has_query {
            return Ok(Reply::bad_request("lock URLs take no query string"));
        }
        let lock = match validate_key(lock) {
            Ok(lock) => lock.to_owned(),
            Err(e) => return Ok(Reply::bad_request(&e.to_string())),
        };
        let mut body = Vec::new();
        loop {
            let chunk =
                match tokio::time::timeout(self.config.body_timeout, session.read_request_body())
                    .await
                {
                    Err(_) => {
                        session.set_keepalive(None);
                        return Ok(Reply::problem(
                            408,
                            "body-timeout",
                            "the request body stalled",
                            json!({}),
                        ));
                    }
                    Ok(chunk) => chunk?,
                };
            let Some(chunk) = chunk else { break };
            if body.len() + chunk.len() > MAX_LOCK_BODY {
                session.set_keepalive(None);
                return Ok(too_large(MAX_LOCK_BODY as u64));
            }
            body.extend_from_slice(&chunk);
        }
        let (coordinator, action) = (self.coordinator.clone(), action.to_owned());
        let answer =
            tokio::task::spawn_blocking(move || locks::handle(&coordinator, &lock, &action, &body))
                .await;
        Ok(match answer {
            Ok(r) => {
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

    async fn send(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        reply: Reply,
    ) -> pingora::Result<()> {
        ctx.outcome = reply.outcome;
        // Answered before the body was read (refused early): close rather
        // than let the server drain an arbitrarily large body for reuse.
        if !session.as_downstream_mut().is_body_done() {
            session.set_keepalive(None);
        }
        let mut header = ResponseHeader::build(reply.status, Some(reply.headers.len() + 1))?;
        for (name, value) in reply.headers {
            header.insert_header(name, value)?;
        }
        header.insert_header("Content-Length", reply.body.len().to_string())?;
        let empty = reply.body.is_empty();
        session
            .write_response_header(Box::new(header), empty)
            .await?;
        if !empty {
            session.write_response_body(Some(reply.body), true).await?;
        }
        Ok(())
    }

    async fn put(&self, session: &mut Session, ctx: &mut Ctx, key: &str) -> pingora::Result<Reply> {
        let request = match fence_request(session.req_header(), key) {
            Ok(r) => r,
            Err(reply) => return Ok(reply),
        };
        ctx.epoch = Some(request.token.epoch);
        let fence = token_text(request.token);
        let declared = session
            .req_header()
            .headers
            .get("content-length")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.config.max_body) {
            // The body is left unread: close the connection after answering.
            session.set_keepalive(None);
            return Ok(too_large(self.config.max_body));
        }
        // Early check: a stale writer learns it before uploading anything.
        let store = self.store.clone();
        let r = request.clone();
        let existed = match blocking(move || store.early(&r)).await {
            Err(e) => return Ok(Reply::unavailable(&e)),
            Ok((outcome, existed)) => {
                if let Some(reply) = early_stop(&outcome) {
                    session.set_keepalive(None);
                    return Ok(reply);
                }
                existed
            }
        };
        let store = self.store.clone();
        let (scope, f) = (key.to_owned(), fence.clone());
        let object = match blocking(move || store.stage(&scope, Kind::Blob, &f)).await {
            Ok(object) => object,
            Err(e) => return Ok(Reply::unavailable(&e)),
        };
        // A client that asked (`Expect: 100-continue`, curl does for large
        // bodies) sends the body only now, after the early check passed.
        let expects = session
            .req_header()
            .headers
            .get("expect")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        if expects {
            let go = ResponseHeader::build(100, None)?;
            session
                .as_downstream_mut()
                .write_response_header(Box::new(go))
                .await?;
        }
        if let Err(failure) = self.receive(session, object, declared).await {
            self.cleanup(object).await;
            session.set_keepalive(None);
            return match failure {
                BodyFailure::TooLarge => Ok(too_large(self.config.max_body)),
                BodyFailure::Timeout => Ok(Reply::problem(
                    408,
                    "body-timeout",
                    "the request body stalled",
                    json!({}),
                )),
                BodyFailure::Client(e) => Err(e),
                BodyFailure::Storage(e) => Ok(Reply::unavailable(&e)),
            };
        }
        let store = self.store.clone();
        let published = blocking(move || store.publish(&request, object)).await;
        Ok(match published {
            Ok(Fenced::Applied {
                version, highest, ..
            }) => {
                let status = if existed { 200 } else { 201 };
                Reply::new(status, "applied").versioned(version, token_text(highest))
            }
            Ok(Fenced::Rejected(r)) => {
                self.cleanup(object).await;
                rejection(&r, &fence)
            }
            Err(e) => {
                self.cleanup(object).await;
                Reply::unavailable(&e)
            }
        })
    }

    /// Stream the request body into `object`'s blob, bounded in size and in
    /// the wait for each chunk, then make it durable.
    async fn receive(
        &self,
        session: &mut Session,
        object: ObjectId,
        declared: Option<u64>,
    ) -> Result<(), BodyFailure> {
        let mut writer = self
            .blobs
            .create(object, declared)
            .await
            .map_err(BodyFailure::Storage)?;
        let mut total: u64 = 0;
        loop {
            let chunk = tokio::time::timeout(self.config.body_timeout, session.read_request_body())
                .await
                .map_err(|_| BodyFailure::Timeout)?
                .map_err(BodyFailure::Client)?;
            let Some(chunk) = chunk else { break };
            total += chunk.len() as u64;
            if total > self.config.max_body {
                return Err(BodyFailure::TooLarge);
            }
            writer.write(chunk).await.map_err(BodyFailure::Storage)?;
        }
        self.blobs
            .finish(writer)
            .await
            .map_err(BodyFailure::Storage)
    }

    /// Drop an unpublished object now; if that fails the collector will.
    async fn cleanup(&self, object: ObjectId) {
        let store = self.store.clone();
        let result = match blocking(move || store.discard(object)).await {
            Ok(true) => self.blobs.remove(object).await,
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, object = object.get(), "discard failed; left to the collector");
        }
    }

    async fn delete(&self, session: &mut Session, ctx: &mut Ctx, key: &str) -> Reply {
        let request = match fence_request(session.req_header(), key) {
            Ok(r) => r,
            Err(reply) => return reply,
        };
        ctx.epoch = Some(request.token.epoch);
        let fence = token_text(request.token);
        let store = self.store.clone();
        let (scope, f) = (key.to_owned(), fence.clone());
        let object = match blocking(move || store.stage(&scope, Kind::Tombstone, &f)).await {
            Ok(object) => object,
            Err(e) => return Reply::unavailable(&e),
        };
        let store = self.store.clone();
        match blocking(move || store.publish(&request, object)).await {
            Ok(Fenced::Applied {
                version, highest, ..
            }) => Reply::new(204, "applied").versioned(version, token_text(highest)),
            Ok(Fenced::Rejected(r)) => {
                self.cleanup(object).await;
                let mut reply = rejection(&r, &fence);
                if reply.status == 200 {
                    reply.status = 204;
                }
                reply
            }
            Err(e) => {
                self.cleanup(object).await;
                Reply::unavailable(&e)
            }
        }
    }

    async fn get(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        key: &str,
        head: bool,
    ) -> pingora::Result<()> {
        // The collector may delete a blob just replaced after we read the
        // pointer; reading the pointer again finds the newer one.
        for _ in 0..3 {
            let store = self.store.clone();
            let scope = key.to_owned();
            let current = match blocking(move || store.current(&scope)).await {
                Ok(Some(c)) if c.kind == Kind::Blob => c,
                Ok(_) => {
                    let reply = Reply::problem(404, "not-found", "no visible object", json!({}));
                    return self.send(session, ctx, reply).await;
                }
                Err(e) => return self.send(session, ctx, Reply::unavailable(&e)).await,
            };
            let mut reader = match self.blobs.open(current.object).await {
                Ok(Some(reader)) => reader,
                Ok(None) => continue,
                Err(e) => return self.send(session, ctx, Reply::unavailable(&e)).await,
            };
            let len = reader.len();
            ctx.outcome = "ok";
            let mut header = ResponseHeader::build(200, Some(4))?;
            header.insert_header("ETag", format!("\"{}\"", current.version))?;
            header.insert_header("Fence-Token", current.fence)?;
            header.insert_header("Content-Type", "application/octet-stream")?;
            header.insert_header("Content-Length", len.to_string())?;
            if head || len == 0 {
                session
                    .write_response_header(Box::new(header), true)
                    .await?;
                self.blobs.done(reader).await;
                return Ok(());
            }
            session
                .write_response_header(Box::new(header), false)
                .await?;
            let mut sent = 0;
            let mut buf = vec![0u8; 64 << 10];
            while sent < len {
                let chunk = reader.next(&mut buf).await.map_err(|e| {
                    pingora::Error::because(pingora::ErrorType::ReadError, "reading a blob", e)
                })?;
                // Shorter than promised: abort the response, never pad it.
                let Some(chunk) = chunk else {
                    return pingora::Error::e_explain(pingora::ErrorType::ReadError, "blob shrank");
                };
                sent += chunk.len() as u64;
                session
                    .write_response_body(Some(chunk), sent >= len)
                    .await?;
            }
            self.blobs.done(reader).await;
            return Ok(());
        }
        let e = Error::Task("the visible blob kept disappearing".into());
        self.send(session, ctx, Reply::unavailable(&e)).await
    }
}

fn too_large(max: u64) -> Reply {
    Reply::problem(
        413,
        "too-large",
        &format!("the body exceeds {max} bytes"),
        json!({"max": max}),
    )
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            started: Instant::now(),
            op: "other",
            outcome: "none",
            epoch: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        self.route(session, ctx).await?;
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut Ctx,
    ) -> pingora::Result<Box<HttpPeer>> {
        // Unreachable: request_filter answers every request.
        pingora::Error::e_explain(pingora::ErrorType::InternalError, "no upstream route")
    }

    async fn logging(&self, session: &mut Session, e: Option<&pingora::Error>, ctx: &mut Ctx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let elapsed = ctx.started.elapsed();
        self.metrics
            .observe(ctx.op, ctx.outcome, ctx.epoch, status, elapsed);
        let req = session.req_header();
        tracing::info!(
            method = %req.method,
            path = %req.uri.path(),
            status,
            op = ctx.op,
            outcome = ctx.outcome,
            micros = elapsed.as_micros() as u64,
            error = e.map(|e| e.to_string()),
            "request"
        );
    }
}
