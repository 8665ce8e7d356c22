//! Request bodies from clients that may be slow on purpose: every chunk
//! within `--body-timeout`, the whole body within `--body-deadline`, and, after
//! the first `--body-timeout`, at least `--min-rate` bytes per second on
//! average. A client that falls behind is answered 408 and its connection
//! closed; it never holds storage work (see `Gateway::work`) while it dawdles.

use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::proxy::Session;

use crate::error::Error;

/// The pace every request body must keep.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Longest wait for the next chunk.
    pub chunk: Duration,
    /// Longest time for the whole body.
    pub total: Duration,
    /// Least average rate after the first `chunk` of grace (0: none).
    pub min_rate: u64,
}

/// Why a request body could not be taken.
pub(crate) enum BodyFailure {
    /// Over the size bound.
    TooLarge,
    /// A chunk, the deadline or the rate was missed.
    TooSlow,
    /// Fewer or more bytes than `Content-Length` said.
    Length { declared: u64, received: u64 },
    /// The body ended before its `Content-Length` or its last chunk: the
    /// client closed its side (it may still read the answer).
    Cut(String),
    /// A chunk of a chunked body does not parse.
    Malformed(String),
    /// The connection failed (marked as the client's: nothing can be
    /// answered on it).
    Client(Box<pingora::Error>),
    /// The blob store failed.
    Storage(Error),
}

/// The clock of one body.
pub(crate) struct Reading {
    pace: Pace,
    started: Instant,
    received: u64,
}

impl Reading {
    pub fn new(pace: Pace) -> Self {
        Self {
            pace,
            started: Instant::now(),
            received: 0,
        }
    }

    /// Bytes taken so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// How long the next chunk may take: the chunk timeout, cut by the
    /// deadline and by the moment the average would fall under the rate.
    fn wait(&self) -> Option<Duration> {
        let now = self.started.elapsed();
        let mut until = (now + self.pace.chunk).min(self.pace.total);
        if self.pace.min_rate > 0 {
            // received >= rate * (t - grace) holds until t = grace + received / rate.
            let behind = self.pace.chunk
                + Duration::from_secs_f64(self.received as f64 / self.pace.min_rate as f64);
            until = until.min(behind);
        }
        until.checked_sub(now).filter(|d| !d.is_zero())
    }

    /// The next chunk (`None` at the end), bounded by `max` bytes in all.
    pub async fn next(
        &mut self,
        session: &mut Session,
        max: u64,
    ) -> Result<Option<Bytes>, BodyFailure> {
        let wait = self.wait().ok_or(BodyFailure::TooSlow)?;
        let chunk = tokio::time::timeout(wait, session.read_request_body())
            .await
            .map_err(|_| BodyFailure::TooSlow)?
            .map_err(read_failure)?;
        if let Some(chunk) = &chunk {
            self.received += chunk.len() as u64;
            if self.received > max {
                return Err(BodyFailure::TooLarge);
            }
        }
        Ok(chunk)
    }
}

/// A failed read of the body: the client's own error (cut short, a
/// malformed chunk), answered 400; else the connection is gone. Pingora
/// answers an error returned from a handler with a 500 unless it is marked
/// as the client's, and then with nothing (a broken connection) or 400.
fn read_failure(mut e: Box<pingora::Error>) -> BodyFailure {
    use pingora::ErrorType;
    match e.etype() {
        ErrorType::ConnectionClosed => BodyFailure::Cut(e.to_string().trim().to_owned()),
        ErrorType::Custom("InvalidChunk" | "InvalidTrailerEnd" | "PrematureBodyEnd") => {
            BodyFailure::Malformed(e.to_string().trim().to_owned())
        }
        _ => {
            e.as_down();
            BodyFailure::Client(e)
        }
    }
}

/// The longest wait for each chunk of a body read only to be dropped.
const LINGER_CHUNK: Duration = Duration::from_secs(2);
/// The longest time spent reading a body only to drop it (nginx's
/// `lingering_time` default).
const LINGER_TOTAL: Duration = Duration::from_secs(30);

/// After an answer given before the request body was read (a refusal, a
/// read that carried a body): read what the client still sends and drop
/// it, at the body pace (each chunk within 2 s at most) and up to `max`
/// bytes, before the connection closes. Closing a connection with unread
/// bytes resets it, and the reset throws away whatever of the answer the
/// kernel has not sent yet: a large answer arrived cut short. A client
/// that sends more or slower is closed on anyway (nginx's lingering
/// close, bounded likewise); one that asked `Expect: 100-continue` and got
/// no `100` sends nothing more.
pub(crate) async fn linger(session: &mut Session, pace: Pace, max: u64) {
    let expects = session
        .req_header()
        .headers
        .get("expect")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let downstream = session.as_downstream_mut();
    if expects || downstream.is_body_done() || downstream.body_bytes_read() > 0 {
        return;
    }
    let pace = Pace {
        chunk: pace.chunk.min(LINGER_CHUNK),
        ..pace
    };
    let mut reading = Reading::new(pace);
    let drain = async { while let Ok(Some(_)) = reading.next(session, max).await {} };
    // A stale writer's large upload is not read to its end: after
    // LINGER_TOTAL the connection closes anyway (nginx's lingering_time).
    let _ = tokio::time::timeout(LINGER_TOTAL, drain).await;
}

/// A whole small body (lock requests), bounded by `max`.
pub(crate) async fn read_all(
    session: &mut Session,
    pace: Pace,
    max: u64,
) -> Result<Vec<u8>, BodyFailure> {
    let mut reading = Reading::new(pace);
    let mut body = Vec::new();
    while let Some(chunk) = reading.next(session, max).await? {
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
