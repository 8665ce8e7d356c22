//! Connections before any request handling: at most `--max-connections` at
//! once (more are answered 503 and closed at once), and a header deadline.
//! Pingora only bounds each read of a request header (by its keep-alive
//! timeout), so a client trickling a byte at a time could hold a connection
//! forever; here every connection's stream is wrapped in [`Tracked`], whose
//! reads fail once the header deadline passes. The deadline is armed when
//! the connection opens and again when a request ends (keep-alive), and
//! disarmed when a request's header has arrived ([`header_arrived`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::{ALPN, tls::SslDigest};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType,
};
use pingora::server::ShutdownWatch;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

use crate::metrics::Metrics;

/// Connection-level limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// Longest wait for a whole request header (also the keep-alive idle
    /// time between requests).
    pub header_timeout: Duration,
}

/// The service's application: bounds and wraps each connection, then hands
/// it to `inner` (Pingora's HTTP proxy app running the gateway).
pub struct Guarded<A> {
    inner: Arc<A>,
    limits: Limits,
    connections: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    drain: Arc<Drain>,
}

impl<A> Guarded<A> {
    /// Guard `inner` with `limits`.
    pub fn new(inner: A, limits: Limits, metrics: Arc<Metrics>) -> Self {
        Self {
            inner: Arc::new(inner),
            connections: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            metrics,
            drain: Arc::new(Drain::default()),
        }
    }

    /// What a shutdown waits for: the listeners closed and every
    /// connection served to its end.
    pub fn drain(&self) -> Arc<Drain> {
        self.drain.clone()
    }
}

/// The connections still open and whether the listeners have closed.
/// Pingora's graceful shutdown closes the listeners, lets each request in
/// flight finish (without keep-alive) and wakes idle keep-alive
/// connections to close, but then sleeps its whole grace period even when
/// nothing is left; [`Drain::wait`] is how `main` ends it as soon as the
/// last connection is done.
#[derive(Debug, Default)]
pub struct Drain {
    state: std::sync::Mutex<DrainState>,
    changed: std::sync::Condvar,
}

#[derive(Debug, Default)]
struct DrainState {
    open: usize,
    closed: bool,
    /// Connections dropped before their end: their task was cancelled,
    /// which only the runtimes' shutdown does (the grace period is over).
    cut: usize,
}

impl Drain {
    fn update(&self, f: impl FnOnce(&mut DrainState)) {
        // A poisoned lock only means a panic elsewhere mid-update; the
        // counts themselves are plain integers, still usable.
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut state);
        drop(state);
        self.changed.notify_all();
    }

    /// After the runtimes have stopped: how many connections were not
    /// served to their end.
    pub fn unfinished(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.cut + state.open
    }

    /// Wait until the listeners have closed and no connection is open, or
    /// until `deadline`. `Ok(())`: drained, every connection served to its
    /// end; `Err(n)`: `n` connections were still open at the deadline, or
    /// were cut by the runtimes' shutdown (Pingora's own grace period can
    /// end a moment before `deadline`, which a thread woken later set).
    pub fn wait(&self, deadline: Instant) -> Result<(), usize> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if state.cut > 0 {
                return Err(state.cut + state.open);
            }
            if state.closed && state.open == 0 {
                return Ok(());
            }
            let Some(left) = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
            else {
                return Err(state.open);
            };
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// One open connection, counted until dropped; dropped before
/// [`Open::ended`] (its task cancelled), it counts as cut.
struct Open {
    drain: Arc<Drain>,
    ended: bool,
}

impl Open {
    fn new(drain: &Arc<Drain>) -> Self {
        drain.update(|s| s.open += 1);
        Self {
            drain: drain.clone(),
            ended: false,
        }
    }

    /// The connection was served to its end.
    fn ended(mut self) {
        self.ended = true;
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let ended = self.ended;
        self.drain.update(|s| {
            s.open = s.open.saturating_sub(1);
            if !ended {
                s.cut += 1;
            }
        });
    }
}

const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/problem+json\r\nContent-Length: 127\r\nConnection: close\r\n\r\n{\"type\":\"https://fencecheck.invalid/problems/overloaded\",\"title\":\"overloaded\",\"status\":503,\"detail\":\"too many connections\"}";

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Guarded<A> {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let Ok(permit) = self.connections.clone().try_acquire_owned() else {
            self.metrics.connection_refused();
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                let _ = stream.write_all(BUSY).await;
                let _ = stream.flush().await;
            })
            .await;
            return None;
        };
        self.metrics.connections(1);
        let open = Open::new(&self.drain);
        let tracked = Tracked {
            inner: stream,
            header_timeout: self.limits.header_timeout,
            deadline: Arc::new(AtomicU64::new(0)),
            origin: Instant::now(),
            sleep: None,
            armed_for: 0,
        };
        tracked.arm();
        // Pingora's HTTP/1 app serves every keep-alive request of the
        // connection inside this call.
        let reused = self.inner.process_new(Box::new(tracked), shutdown).await;
        drop(reused);
        drop(permit);
        self.metrics.connections(-1);
        open.ended();
        None
    }

    /// Called once the service's listeners have closed (shutdown).
    async fn cleanup(&self) {
        // The inner cleanup wakes idle keep-alive connections to close.
        self.inner.cleanup().await;
        self.drain.update(|s| s.closed = true);
        // Pingora calls this once every accept loop has ended: from here a
        // new connection is refused.
        tracing::info!("listeners closed");
    }
}

/// A connection's stream with a header deadline on its reads.
#[derive(Debug)]
pub struct Tracked {
    inner: Stream,
    header_timeout: Duration,
    /// Nanoseconds after `origin` when reads start failing; 0: disarmed.
    deadline: Arc<AtomicU64>,
    origin: Instant,
    sleep: Option<Pin<Box<Sleep>>>,
    /// The deadline `sleep` was made for.
    armed_for: u64,
}

impl Tracked {
    fn arm(&self) {
        let at = self.origin.elapsed() + self.header_timeout;
        let nanos = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.deadline.store(nanos, Ordering::Relaxed);
    }

    fn disarm(&self) {
        self.deadline.store(0, Ordering::Relaxed);
    }
}

fn tracked(session: &pingora::proxy::Session) -> Option<&Tracked> {
    session.stream()?.as_any().downcast_ref::<Tracked>()
}

/// A request's header is in: reads are no longer under the header deadline
/// (the body has its own pace, see `body`).
pub fn header_arrived(session: &pingora::proxy::Session) {
    if let Some(t) = tracked(session) {
        t.disarm();
    }
}

/// A request ended: the next header (keep-alive) must arrive in time.
pub fn request_ended(session: &pingora::proxy::Session) {
    if let Some(t) = tracked(session) {
        t.arm();
    }
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let deadline = self.deadline.load(Ordering::Relaxed);
        if deadline == 0 {
            self.sleep = None;
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let at = self.origin + Duration::from_nanos(deadline);
        if Instant::now() >= at {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "request header deadline",
            )));
        }
        if let Poll::Ready(r) = Pin::new(&mut self.inner).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        if self.sleep.is_none() || self.armed_for != deadline {
            self.sleep = Some(Box::pin(tokio::time::sleep_until(at.into())));
            self.armed_for = deadline;
        }
        match self.sleep.as_mut().map(|s| s.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "request header deadline",
            ))),
            _ => Poll::Pending,
        }
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for Tracked {
    async fn shutdown(&mut self) {
        Shutdown::shutdown(self.inner.as_mut()).await;
    }
}

impl UniqueID for Tracked {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for Tracked {
    fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
        self.inner.get_ssl()
    }

    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }

    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for Tracked {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }

    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }

    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for Tracked {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }

    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest);
    }
}

impl GetSocketDigest for Tracked {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }

    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest);
    }
}

#[async_trait]
impl Peek for Tracked {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection dropped unfinished (its task cancelled when the
    /// runtimes stop) is a cut, never a drain, even once none is open.
    #[test]
    fn a_cancelled_connection_is_cut_not_drained() {
        let drain = Arc::new(Drain::default());
        let (served, cancelled) = (Open::new(&drain), Open::new(&drain));
        drain.update(|s| s.closed = true);
        served.ended();
        let now = Instant::now();
        assert_eq!(drain.wait(now), Err(1), "one still open at the deadline");
        drop(cancelled);
        assert_eq!(drain.wait(now + Duration::from_secs(3600)), Err(1));
    }

    /// Every connection served to its end: drained, without waiting for
    /// the deadline.
    #[test]
    fn served_connections_drain() {
        let drain = Arc::new(Drain::default());
        let open = Open::new(&drain);
        drain.update(|s| s.closed = true);
        open.ended();
        assert_eq!(
            drain.wait(Instant::now() + Duration::from_secs(3600)),
            Ok(())
        );
    }
}
