//! The Pingora service. A request's life, one module per step:
//! [`conn`] (connection bound, header deadline) → [`route`] (method and path
//! to a route, or 400/404/405) → authenticate and authorize ([`crate::auth`]:
//! 401/403) → the handler of its surface ([`objects`], [`locks`]; a write
//! through the fenced [`publish`], which the S3 front shares) → the
//! store ([`crate::store`], [`crate::blobs`]). A path the S3 front claims
//! goes to it instead, as a [`Surface`] (it routes and authenticates
//! itself). Every route is answered in `request_filter`: there is no
//! upstream to proxy to.

pub(crate) mod body;
pub(crate) mod conditional;
pub(crate) mod conn;
mod locks;
mod objects;
pub(crate) mod publish;
pub(crate) mod reply;
mod route;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::prelude::HttpPeer;
use pingora::proxy::{ProxyHttp, Session};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use body::Pace;
pub use conn::{Drain, Guarded, Limits};

use crate::auth::{Auth, Caller, Unauthenticated};
use crate::blobs::Blobs;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::store::Store;
use reply::Reply;
use route::Route;

/// Limits and timeouts of the gateway.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest accepted object body, in bytes.
    pub max_body: u64,
    /// Largest multipart upload of the S3 front (its parts together), in
    /// bytes: bounds the disk one upload can take, as `max_body` bounds
    /// one request.
    pub max_upload: u64,
    /// An S3 CompleteMultipartUpload of at least this many bytes answers
    /// 200 at once and sends whitespace until its result (as S3 does), so
    /// a long copy of the parts does not outlast the client's read timeout.
    pub complete_keepalive: u64,
    /// The pace request bodies must keep.
    pub pace: Pace,
    /// Longest time to send one response body.
    pub response_deadline: Duration,
    /// Least rate of response writes, bytes per second (each write must
    /// finish within its size at this rate, and at least a second).
    pub min_send_rate: u64,
    /// Storage operations run at once. Slow clients never hold one while
    /// they are being waited for.
    pub max_in_flight: usize,
    /// How long a request waits for a free storage slot before it gets 503.
    pub queue_wait: Duration,
    /// The longest lease (`ttl_ms` over it is 400).
    pub max_ttl: Duration,
    /// How long an S3 multipart upload is kept from its start
    /// (`--upload-retention`; the collector runs with the same): it must
    /// complete within it, and ListMultipartUploads shows the uploads
    /// begun within it.
    pub upload_retention: Duration,
}

impl Config {
    /// The most bytes of a request body the gateway reads: `max_body`, and
    /// room for the `aws-chunked` framing of the S3 front, which adds ~90
    /// bytes per chunk (64 KiB by default) to the decoded body that the
    /// operations bound by `max_body`.
    pub(crate) fn max_wire(&self) -> u64 {
        self.max_body + self.max_body / 16 + (1 << 20)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_body: 64 << 20,
            max_upload: 16 << 30,
            complete_keepalive: 256 << 20,
            pace: Pace {
                chunk: Duration::from_secs(10),
                total: Duration::from_secs(300),
                min_rate: 1024,
            },
            response_deadline: Duration::from_secs(300),
            min_send_rate: 1024,
            max_in_flight: 256,
            queue_wait: Duration::from_secs(1),
            max_ttl: Duration::from_secs(60),
            upload_retention: Duration::from_secs(86_400),
        }
    }
}

/// The fencing gateway: a [`ProxyHttp`] that answers every request itself.
pub struct Gateway {
    core: Arc<Core>,
    /// The S3 front, if buckets were configured.
    s3: Option<Box<dyn Surface>>,
}

/// A surface that answers whole the requests it claims: the S3 front
/// (added by `Gateway::with_s3`). `http` serves it through this trait
/// without naming it, so the dependency runs one way: the S3 front uses
/// `http`'s pieces (the core, the fenced publish), never the reverse.
#[async_trait]
pub(crate) trait Surface: Send + Sync {
    /// Whether a request for `path` is this surface's.
    fn claims(&self, path: &str) -> bool;

    /// Answer one request this surface claimed.
    async fn serve(
        &self,
        gw: &Gateway,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora::Result<()>;
}

/// What every surface of the gateway shares (the `/objects` API and the S3
/// front run the same publish over the same store).
pub struct Core {
    pub(crate) store: Arc<Store>,
    pub(crate) blobs: Arc<Blobs>,
    pub(crate) coordinator: Arc<dyn fencecheck_authority::Coordinator>,
    pub(crate) auth: Arc<Auth>,
    pub(crate) config: Config,
    pub(crate) metrics: Arc<Metrics>,
    in_flight: Arc<Semaphore>,
}

impl std::ops::Deref for Gateway {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl Gateway {
    /// A gateway over `store` (pointers, fences) and `blobs` (bytes), with
    /// lease endpoints on `coordinator`, callers checked by `auth`.
    pub fn new(
        store: Arc<Store>,
        blobs: Arc<Blobs>,
        coordinator: Arc<dyn fencecheck_authority::Coordinator>,
        auth: Arc<Auth>,
        config: Config,
        metrics: Arc<Metrics>,
    ) -> Self {
        let in_flight = Arc::new(Semaphore::new(config.max_in_flight));
        let core = Arc::new(Core {
            store,
            blobs,
            coordinator,
            auth,
            config,
            metrics,
            in_flight,
        });
        Self { core, s3: None }
    }

    /// Serve `surface` too, before the gateway's own routes (the S3 front:
    /// `with_s3`).
    pub(crate) fn with_surface(mut self, surface: Box<dyn Surface>) -> Self {
        self.s3 = Some(surface);
        self
    }

    /// What every surface shares.
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }
}

/// Per-request facts for the log line and the metrics.
#[derive(Debug)]
pub struct Ctx {
    pub(crate) started: Instant,
    /// How long the answer took (set before lingering over an unread
    /// body, which is not the request's latency).
    pub(crate) answered: Option<Duration>,
    pub(crate) op: &'static str,
    pub(crate) outcome: &'static str,
    pub(crate) epoch: Option<u64>,
    pub(crate) principal: Option<String>,
}

/// Why storage work did not run or did not finish.
pub(crate) enum Failure {
    /// No in-flight permit.
    Overloaded,
    /// The store failed.
    Store(Error),
}

impl Failure {
    pub fn reply(&self) -> Reply {
        match self {
            Failure::Overloaded => Reply::overloaded(),
            Failure::Store(e) => Reply::unavailable(e),
        }
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

impl Core {
    /// Run blocking store work under an in-flight permit. The first step of
    /// a request (`first`) waits for one at most `queue_wait`, then is
    /// refused (503); a later step of an admitted request waits longer (a
    /// body chunk's timeout), so an accepted upload is not thrown away
    /// lightly.
    pub(crate) async fn work<T: Send + 'static>(
        &self,
        first: bool,
        f: impl FnOnce(&Store) -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Failure> {
        let permit = self.permit(first).await?;
        let store = self.store.clone();
        let result = blocking(move || f(&store)).await;
        drop(permit);
        result.map_err(Failure::Store)
    }

    /// An in-flight permit (see [`Gateway::work`]).
    pub(crate) async fn permit(&self, first: bool) -> Result<OwnedSemaphorePermit, Failure> {
        if let Ok(permit) = self.in_flight.clone().try_acquire_owned() {
            return Ok(permit);
        }
        let wait = if first {
            self.config.queue_wait
        } else {
            self.config.pace.chunk
        };
        tokio::time::timeout(wait, self.in_flight.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or(Failure::Overloaded)
    }
}

impl Gateway {
    fn caller(&self, session: &Session) -> Result<Caller, Reply> {
        let mut values = session.req_header().headers.get_all("authorization").iter();
        let first = values.next();
        let result = if values.next().is_some() {
            Err(Unauthenticated::Malformed)
        } else {
            self.auth.authenticate(first.map(|v| v.as_bytes()))
        };
        result.map_err(|why| match why {
            Unauthenticated::Missing => {
                Reply::unauthenticated("invalid_request", "send Authorization: Bearer <secret>")
            }
            Unauthenticated::Malformed => Reply::unauthenticated(
                "invalid_request",
                "Authorization must be one Bearer credential",
            ),
            Unauthenticated::Unknown => {
                Reply::unauthenticated("invalid_token", "the bearer secret is not known")
            }
        })
    }

    async fn serve(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<()> {
        conn::header_arrived(session);
        session.set_write_timeout(Some(self.config.pace.chunk));
        if self.config.min_send_rate > 0 {
            session.set_min_send_rate(usize::try_from(self.config.min_send_rate).ok());
        }
        if let Some(front) = &self.s3
            && front.claims(session.req_header().uri.path())
        {
            ctx.op = "s3";
            return front.serve(self, session, ctx).await;
        }
        let route = match route::route(session.req_header()) {
            Ok(route) => route,
            Err(reply) => return self.answer(session, ctx, reply).await,
        };
        ctx.op = route.op();
        if !route.is_public() {
            let caller = match self.caller(session) {
                Ok(caller) => caller,
                Err(reply) => return self.answer(session, ctx, reply).await,
            };
            ctx.principal = caller.name().map(str::to_owned);
            if let Some((right, key)) = route.needs()
                && !caller.may(right, key)
            {
                let reply = Reply::forbidden(caller.name().unwrap_or(""), right.name());
                return self.answer(session, ctx, reply).await;
            }
            return self.dispatch(session, ctx, route, caller).await;
        }
        self.dispatch(session, ctx, route, Caller::Anyone).await
    }

    async fn dispatch(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        route: Route,
        caller: Caller,
    ) -> pingora::Result<()> {
        // A body over --max-body is never read whole, not even to be
        // dropped after an early answer (`body::linger`): refuse it first.
        let declared = objects::header(session.req_header(), "content-length")
            .ok()
            .flatten()
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.config.max_body) {
            session.set_keepalive(None);
            let reply = Reply::too_large(self.config.max_body);
            return self.answer(session, ctx, reply).await;
        }
        let reply = match route {
            Route::Health => match self.work(true, |s| s.ping()).await {
                Ok(()) => Reply::new(200, "ok").text("ok\n"),
                Err(f) => f.reply(),
            },
            Route::Metrics => {
                let busy = self.config.max_in_flight - self.in_flight.available_permits();
                self.metrics
                    .in_flight(i64::try_from(busy).unwrap_or(i64::MAX));
                let mut reply = Reply::new(200, "ok")
                    .header("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
                reply.body = Bytes::from(self.metrics.render());
                reply
            }
            Route::Object { key, op } => {
                return objects::serve(self, session, ctx, &key, op).await;
            }
            Route::List {
                prefix,
                after,
                limit,
            } => objects::list(self, &prefix, after, limit).await,
            Route::Lock { lock, action } => {
                locks::serve(self, session, &caller, lock, action).await?
            }
        };
        self.answer(session, ctx, reply).await
    }

    pub(crate) async fn answer(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        reply: Reply,
    ) -> pingora::Result<()> {
        ctx.outcome = reply.outcome;
        reply.send(session).await
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            started: Instant::now(),
            answered: None,
            op: "other",
            outcome: "none",
            epoch: None,
            principal: None,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> pingora::Result<bool> {
        self.serve(session, ctx).await?;
        ctx.answered = Some(ctx.started.elapsed());
        body::linger(session, self.config.pace, self.config.max_wire()).await;
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
        conn::request_ended(session);
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let elapsed = ctx.answered.unwrap_or_else(|| ctx.started.elapsed());
        self.metrics
            .observe(ctx.op, ctx.outcome, ctx.epoch, status, elapsed);
        let req = session.req_header();
        // The path, never headers: Authorization stays out of the log.
        tracing::info!(
            method = %req.method,
            path = %req.uri.path(),
            status,
            op = ctx.op,
            outcome = ctx.outcome,
            principal = ctx.principal.as_deref(),
            micros = elapsed.as_micros() as u64,
            error = e.map(|e| e.to_string()),
            "request"
        );
    }
}
