//! The request body, from the client to s3s. It is read at the gateway's
//! pace (`--body-deadline`, `--min-rate`), bounded on the wire, and only
//! once the operation asks for it: a request refused first (a bad
//! signature, a stale token) is answered without its upload, and a client
//! that sent `Expect: 100-continue` gets its `100 Continue` then. How the
//! pump ended ([`Pumped`]) decides the answer when the body failed.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use s3s::StdError;
use s3s::stream::{ByteStream, RemainingLength};
use tokio::sync::mpsc;

use crate::http::Pace;

/// How the request body's pump ended.
pub(super) enum Pumped {
    Done,
    /// The body was never asked for: it is still on the connection.
    Unread,
    TooSlow,
    TooLarge,
    /// The body ended before its length or last chunk, or a chunk did not
    /// parse.
    Malformed,
    Client(Box<pingora::Error>),
}

/// Why the body stream ended early (what s3s and the operation see).
#[derive(Debug, thiserror::Error)]
#[error("the request body ended early: {0}")]
struct BodyCut(&'static str);

/// Move the request body from the client to the channel, at the gateway's
/// pace (`Reading`), bounded by `max` bytes on the wire. Nothing is read
/// before the operation asks for the body (`demand`): a request refused
/// first (a bad signature, a stale token) is answered without its upload,
/// and a client that sent `Expect: 100-continue` (boto3, aws-cli do) gets
/// its `100 Continue` only then.
pub(super) async fn pump(
    session: &mut Session,
    tx: mpsc::Sender<Result<Bytes, StdError>>,
    demand: tokio::sync::oneshot::Receiver<()>,
    expects: bool,
    pace: Pace,
    max: u64,
    has_body: bool,
) -> Pumped {
    use crate::http::body::{BodyFailure, Reading};
    if !has_body {
        return Pumped::Done;
    }
    if demand.await.is_err() {
        // The operation ended without asking for the body.
        return Pumped::Unread;
    }
    if expects {
        let go = match ResponseHeader::build(100, None) {
            Ok(go) => go,
            Err(e) => return Pumped::Client(e),
        };
        if let Err(e) = session
            .as_downstream_mut()
            .write_response_header(Box::new(go))
            .await
        {
            return Pumped::Client(e);
        }
    }
    let mut reading = Reading::new(pace);
    loop {
        // A slot first: s3s pulls at its own speed, and nothing is read
        // from the client that has nowhere to go.
        let Ok(slot) = tx.reserve().await else {
            return Pumped::Done;
        };
        match reading.next(session, max).await {
            Ok(Some(chunk)) => slot.send(Ok(chunk)),
            Ok(None) => return Pumped::Done,
            Err(failure) => {
                let (why, end) = match failure {
                    BodyFailure::TooSlow => ("too slow", Pumped::TooSlow),
                    BodyFailure::TooLarge => ("too large", Pumped::TooLarge),
                    BodyFailure::Client(e) => ("the client failed", Pumped::Client(e)),
                    BodyFailure::Cut(_) | BodyFailure::Malformed(_) => {
                        ("cut short or malformed", Pumped::Malformed)
                    }
                    BodyFailure::Length { .. } | BodyFailure::Storage(_) => {
                        ("incomplete", Pumped::TooSlow)
                    }
                };
                slot.send(Err(Box::new(BodyCut(why))));
                return end;
            }
        }
    }
}

/// The request body as s3s reads it.
pub(super) struct Incoming {
    pub rx: mpsc::Receiver<Result<Bytes, StdError>>,
    pub declared: Option<u64>,
    /// Fired on the first read: the pump starts then.
    pub wanted: Option<tokio::sync::oneshot::Sender<()>>,
}

impl futures_util::Stream for Incoming {
    type Item = Result<Bytes, StdError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(wanted) = self.wanted.take() {
            let _ = wanted.send(());
        }
        let polled = self.rx.poll_recv(cx);
        if let (Poll::Ready(Some(Ok(chunk))), Some(left)) = (&polled, self.declared.as_mut()) {
            *left = left.saturating_sub(chunk.len() as u64);
        }
        polled
    }
}

impl ByteStream for Incoming {
    fn remaining_length(&self) -> RemainingLength {
        match self.declared.and_then(|n| usize::try_from(n).ok()) {
            Some(n) => RemainingLength::new_exact(n),
            None => RemainingLength::unknown(),
        }
    }
}
