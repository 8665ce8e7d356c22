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
    /// The connection failed.
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
            .map_err(BodyFailure::Client)?;
        if let Some(chunk) = &chunk {
            self.received += chunk.len() as u64;
            if self.received > max {
                return Err(BodyFailure::TooLarge);
            }
        }
        Ok(chunk)
    }
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
