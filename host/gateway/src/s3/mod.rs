//! The S3 front: path-style S3 (`/{bucket}/{key}`) on the gateway's own
//! port, for boto3, aws-cli, rclone and every SDK. A key `K` of bucket `B`
//! is the fenced key `B/K`: the same pointer, fence state and blob as
//! `/objects/B/K`, written by the same publish.
//!
//! The protocol (routing, XML, AWS Signature V4 in headers or presigned
//! URLs, `aws-chunked` bodies with their chunk signatures and trailers) is
//! the `s3s` crate's; this module is the bridge from Pingora to it
//! ([`Front::serve`]: the request body keeps the gateway's pace, the
//! response its deadline), the secrets and rights of `--auth` ([`access`]),
//! and the operations over the store and the blobs ([`ops`]).

mod access;
mod ops;
mod upload;

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::stream::{ByteStream, DynByteStream, RemainingLength};
use s3s::{S3Error, S3ErrorCode, StdError};
use tokio::sync::mpsc;

use crate::error::Error;
use crate::http::{Core, Ctx, Gateway, Pace};

/// What an S3 operation tells the request's log line and metrics.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub op: Option<&'static str>,
    pub outcome: Option<&'static str>,
    pub epoch: Option<u64>,
    pub principal: Option<String>,
    /// A gateway operation began (it looked up the request's signer):
    /// until then every answer is s3s's own (signature, routing, reading
    /// a whole XML body).
    pub began: bool,
    /// The answer is 200 at once with whitespace until the result
    /// (a large CompleteMultipartUpload): no `--response-deadline`, and
    /// the outcome is known only at its end.
    pub keep_alive: bool,
}

/// Shared between the bridge and the operation (request extensions).
pub(crate) type Tallied = Arc<Mutex<Tally>>;

/// Paths of the gateway's own API: never bucket names.
const RESERVED: [&str; 4] = ["objects", "v1", "healthz", "metrics"];

/// S3's bucket naming rules (the ones a path-style name needs): 3 to 63 of
/// a-z 0-9 . -, starting and ending with a letter or digit.
fn valid_bucket(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'-'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && !name.contains("..")
}

/// The S3 front of one gateway.
pub(crate) struct Front {
    service: S3Service,
}

impl Front {
    /// A front for `buckets` over the gateway's store and blobs.
    pub fn new(core: Arc<Core>, buckets: &[String]) -> Result<Self, Error> {
        if buckets.is_empty() {
            return Err(Error::Config(
                "the S3 front needs at least one --bucket".into(),
            ));
        }
        for name in buckets {
            if !valid_bucket(name) {
                return Err(Error::Config(format!(
                    "--bucket {name:?}: 3 to 63 of a-z 0-9 . -, starting and ending with a letter or digit"
                )));
            }
            if RESERVED.contains(&name.as_str()) {
                return Err(Error::Config(format!(
                    "--bucket {name:?} is a path of the gateway's own API"
                )));
            }
        }
        let buckets: Arc<[String]> = buckets.into();
        let mut builder = S3ServiceBuilder::new(ops::Objects::new(core.clone(), buckets));
        builder.set_auth(access::Secrets::new(core.auth.clone()));
        let service = builder.build();
        Ok(Self { service })
    }

    /// Whether a request for `path` is the S3 front's: every path but
    /// the gateway's own API (so a bucket that is not served is S3's
    /// `NoSuchBucket`, not a bare 404).
    pub fn claims(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let first = rest.split('/').next().unwrap_or("");
        !RESERVED.contains(&first)
    }

    /// Serve one S3 request: hand it to s3s with a body that keeps the
    /// gateway's pace and size bound, then send its answer within the
    /// response deadline.
    pub async fn serve(
        &self,
        gw: &Gateway,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> pingora::Result<()> {
        let tally: Tallied = Arc::default();
        let head = session.req_header();
        let declared = head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let has_body = declared.is_some_and(|n| n > 0)
            || head.headers.contains_key(http::header::TRANSFER_ENCODING);
        let max_wire = gw.config.max_wire();
        if declared.is_some_and(|n| n > max_wire) {
            session.set_keepalive(None);
            let e = error(S3ErrorCode::EntityTooLarge, "the body is over --max-body");
            return self
                .send(gw, session, ctx, &tally, e.to_http_response())
                .await;
        }
        let (tx, rx) = mpsc::channel(4);
        let (wanted, demand) = tokio::sync::oneshot::channel();
        let expects = head
            .headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let body = if has_body {
            s3s::Body::from(Box::pin(Incoming {
                rx,
                declared,
                wanted: Some(wanted),
            }) as DynByteStream)
        } else {
            drop(rx);
            s3s::Body::empty()
        };
        let mut builder = http::Request::builder()
            .method(head.method.clone())
            .uri(head.uri.clone())
            .version(head.version);
        if let Some(headers) = builder.headers_mut() {
            *headers = head.headers.clone();
        }
        let request = match builder.extension(tally.clone()).body(body) {
            Ok(r) => r,
            Err(e) => {
                let e = error(S3ErrorCode::InvalidRequest, format!("{e}"));
                return self
                    .send(gw, session, ctx, &tally, e.to_http_response())
                    .await;
            }
        };
        let (result, pumped) = {
            let call = self.service.call(request);
            let pump = pump(
                session,
                tx,
                demand,
                expects,
                gw.config.pace,
                max_wire,
                has_body,
            );
            tokio::pin!(call);
            tokio::pin!(pump);
            let mut pumped = None;
            let result = loop {
                tokio::select! {
                    r = &mut call => break r,
                    end = &mut pump, if pumped.is_none() => pumped = Some(end),
                }
            };
            (result, pumped)
        };
        let answer = match pumped {
            // The body was taken whole (or there was none).
            Some(Pumped::Done) => result.map_err(|e| format!("{e:?}")),
            Some(Pumped::TooSlow) => {
                session.set_keepalive(None);
                error(
                    S3ErrorCode::RequestTimeout,
                    "the request body was too slow (a chunk, --body-deadline or --min-rate)",
                )
                .to_http_response()
                .map_err(|e| format!("{e:?}"))
            }
            Some(Pumped::TooLarge) => {
                session.set_keepalive(None);
                error(S3ErrorCode::EntityTooLarge, "the body is over --max-body")
                    .to_http_response()
                    .map_err(|e| format!("{e:?}"))
            }
            Some(Pumped::Malformed) => {
                session.set_keepalive(None);
                error(
                    S3ErrorCode::IncompleteBody,
                    "the request body ended before its Content-Length or last chunk, or a chunk is malformed",
                )
                .to_http_response()
                .map_err(|e| format!("{e:?}"))
            }
            Some(Pumped::Client(e)) => return Err(e),
            // Answered before the body was read: the rest stays unread.
            None | Some(Pumped::Unread) => {
                session.set_keepalive(None);
                result.map_err(|e| format!("{e:?}"))
            }
        };
        let answer = match answer {
            Ok(r) if body_refused(&r, &tally) => {
                error(
                    S3ErrorCode::InvalidRequest,
                    "the request body does not match what its headers declare (x-amz-content-sha256, the aws-chunked framing or its chunk signatures); nothing was done",
                )
                .to_http_response()
            }
            Ok(r) => Ok(r),
            Err(detail) => {
                tracing::error!(%detail, "the S3 service failed");
                error(S3ErrorCode::InternalError, "the S3 service failed").to_http_response()
            }
        };
        self.send(gw, session, ctx, &tally, answer).await
    }

    async fn send(
        &self,
        gw: &Gateway,
        session: &mut Session,
        ctx: &mut Ctx,
        tally: &Tallied,
        answer: s3s::S3Result<s3s::HttpResponse>,
    ) -> pingora::Result<()> {
        if let Ok(t) = tally.lock() {
            ctx.op = t.op.unwrap_or("s3");
            ctx.epoch = t.epoch;
            ctx.principal.clone_from(&t.principal);
        }
        let mut response = match answer {
            Ok(r) => r,
            Err(e) => {
                // Serializing an S3 error failed: a fixed document, still
                // one an SDK can read.
                tracing::error!(error = %e, "an S3 answer could not be built");
                let mut h = ResponseHeader::build(500, Some(2))?;
                h.insert_header(http::header::CONTENT_TYPE, XML)?;
                ctx.outcome = "error";
                if session.req_header().method == http::Method::HEAD {
                    return session.write_response_header(Box::new(h), true).await;
                }
                h.insert_header("Content-Length", UNBUILT.len().to_string())?;
                session.write_response_header(Box::new(h), false).await?;
                return session
                    .write_response_body(Some(Bytes::from_static(UNBUILT)), true)
                    .await;
            }
        };
        typed(&mut response);
        let status = response.status().as_u16();
        ctx.outcome = tally
            .lock()
            .ok()
            .and_then(|t| t.outcome)
            .unwrap_or(match status {
                200..=299 => "ok",
                304 => "not-modified",
                400..=499 => "client-error",
                _ => "error",
            });
        let (parts, mut body) = response.into_parts();
        // (`take_bytes` would drop a streamed body: look first.)
        let mut header = ResponseHeader::build(parts.status, Some(parts.headers.len() + 1))?;
        for (name, value) in &parts.headers {
            header.append_header(name.clone(), value.clone())?;
        }
        let head_only = session.req_header().method == http::Method::HEAD;
        if let Some(bytes) = body.bytes() {
            if !parts.headers.contains_key(http::header::CONTENT_LENGTH) && !head_only {
                header.insert_header("Content-Length", bytes.len().to_string())?;
            }
            let empty = bytes.is_empty() || head_only;
            session
                .write_response_header(Box::new(header), empty)
                .await?;
            if !empty {
                session.write_response_body(Some(bytes), true).await?;
            }
            return Ok(());
        }
        if head_only {
            return session.write_response_header(Box::new(header), true).await;
        }
        session
            .write_response_header(Box::new(header), false)
            .await?;
        let keep_alive = tally.lock().is_ok_and(|t| t.keep_alive);
        // A keep-alive answer waits on the gateway, not the client: each
        // write is still bounded (--min-rate), the whole is not.
        let deadline = (!keep_alive).then(|| Instant::now() + gw.config.response_deadline);
        let sent = send_stream(session, &mut body, deadline, keep_alive).await;
        if keep_alive && let Ok(t) = tally.lock() {
            ctx.outcome = t.outcome.unwrap_or("error");
        }
        sent
    }
}

/// Whether `response` is s3s refusing the request's body as a server
/// error. Before an operation begins, s3s reads the whole body of the
/// operations that take an XML document (DeleteObjects,
/// CompleteMultipartUpload, …) through the checks the headers ask for: the
/// body's SHA-256 against `x-amz-content-sha256`, the `aws-chunked`
/// framing and chunk signatures. A body that fails them is the client's
/// error, but s3s answers it `500 InternalError` without a message (the
/// only 500 it makes before the operation; the gateway's own have one);
/// the operation never ran, nothing was done.
fn body_refused(response: &s3s::HttpResponse, tally: &Tallied) -> bool {
    let has = |b: &[u8], part: &[u8]| b.windows(part.len()).any(|w| w == part);
    response.status() == http::StatusCode::INTERNAL_SERVER_ERROR
        && tally.lock().is_ok_and(|t| !t.began)
        && response
            .body()
            .bytes()
            .is_some_and(|b| has(&b, b"<Code>InternalError</Code>") && !has(&b, b"<Message>"))
}

/// Send a streamed body, within `deadline` if there is one.
async fn send_stream(
    session: &mut Session,
    body: &mut s3s::Body,
    deadline: Option<Instant>,
    keep_alive: bool,
) -> pingora::Result<()> {
    use futures_util::StreamExt;
    let mut first = true;
    // No deadline: one far enough never to be met.
    let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 30));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = match tokio::time::timeout(left.max(Duration::from_millis(1)), body.next()).await
        {
            Ok(next) => next,
            Err(_) => {
                return pingora::Error::e_explain(
                    pingora::ErrorType::WriteTimedout,
                    "--response-deadline",
                );
            }
        };
        match next {
            None => return session.write_response_body(None, true).await,
            Some(Err(e)) => {
                // Never pad or end a body the blob did not fill: abort.
                return pingora::Error::e_explain(
                    pingora::ErrorType::ReadError,
                    format!("reading a blob: {e}"),
                );
            }
            Some(Ok(chunk)) => {
                // s3s 0.14 sends the XML declaration first, then an error
                // document with its own declaration: a second one is not
                // XML, and SDKs then see no error code at all. Drop it.
                let chunk = if keep_alive && !first {
                    without_declaration(chunk)
                } else {
                    chunk
                };
                first = false;
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(
                    left.max(Duration::from_millis(1)),
                    session.write_response_body(Some(chunk), false),
                )
                .await
                {
                    Ok(r) => r?,
                    Err(_) => {
                        return pingora::Error::e_explain(
                            pingora::ErrorType::WriteTimedout,
                            "--response-deadline",
                        );
                    }
                }
            }
        }
    }
}

/// `chunk` without a leading `<?xml …?>`.
fn without_declaration(chunk: Bytes) -> Bytes {
    if chunk.starts_with(b"<?xml")
        && let Some(end) = chunk.windows(2).position(|w| w == b"?>")
    {
        return chunk.slice(end + 2..);
    }
    chunk
}

/// The media type of every S3 error document.
const XML: &str = "application/xml";

/// The answer when an S3 error itself could not be serialized.
const UNBUILT: &[u8] = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code><Message>the answer could not be built</Message></Error>";

/// Give an error answer its `Content-Type` and a `<Message>`. s3s
/// replaces the whole header map of an error that carries headers of its
/// own (StaleFence's `fence-token-*`), dropping the `application/xml` it
/// had set: SDKs that check the type (minio-py) then read no error code at
/// all. And s3s's own refusals (a bad signature, an invalid path) have a
/// code and no message.
pub(crate) fn typed(response: &mut s3s::HttpResponse) {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return;
    }
    if !response.headers().contains_key(http::header::CONTENT_TYPE) {
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(XML),
        );
    }
    if let Some(body) = response.body().bytes()
        && let Some(fixed) = with_message(&body, status)
    {
        *response.body_mut() = s3s::Body::from(fixed);
        response.headers_mut().remove(http::header::CONTENT_LENGTH);
    }
}

/// An error document without `<Message>`, with one after its `<Code>`.
fn with_message(body: &[u8], status: http::StatusCode) -> Option<Bytes> {
    let find = |part: &[u8]| body.windows(part.len()).position(|w| w == part);
    if find(b"<Message>").is_some() {
        return None;
    }
    let start = find(b"<Code>")? + b"<Code>".len();
    let end = find(b"</Code>")?;
    let message = match body.get(start..end)? {
        b"SignatureDoesNotMatch" => {
            "the signature does not match the one calculated for this request (check the secret key, the region and the signed headers)"
        }
        b"InvalidURI" => "the path is not a valid S3 path",
        b"InvalidBucketName" => "not a valid bucket name",
        b"KeyTooLongError" => "the key is over 1024 bytes",
        b"IncompleteBody" => "the request body is shorter than declared",
        b"MethodNotAllowed" => "this method is not allowed on this resource",
        _ => status.canonical_reason().unwrap_or("error"),
    };
    let at = end + b"</Code>".len();
    let mut out = Vec::with_capacity(body.len() + message.len() + 19);
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(b"<Message>");
    out.extend_from_slice(message.as_bytes());
    out.extend_from_slice(b"</Message>");
    out.extend_from_slice(&body[at..]);
    Some(Bytes::from(out))
}

/// An S3 error with a message.
pub(crate) fn error(code: S3ErrorCode, message: impl Into<String>) -> S3Error {
    S3Error::with_message(code, message.into())
}

/// How the request body's pump ended.
enum Pumped {
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
async fn pump(
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
struct Incoming {
    rx: mpsc::Receiver<Result<Bytes, StdError>>,
    declared: Option<u64>,
    /// Fired on the first read: the pump starts then.
    wanted: Option<tokio::sync::oneshot::Sender<()>>,
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

#[cfg(test)]
mod tests {
    use super::{valid_bucket, without_declaration};
    use bytes::Bytes;

    /// A keep-alive answer's error document loses only its own XML
    /// declaration; whitespace and other chunks pass unchanged.
    #[test]
    fn second_declaration_dropped() {
        let error = Bytes::from_static(
            b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InvalidPart</Code></Error>",
        );
        assert_eq!(
            without_declaration(error),
            Bytes::from_static(b"<Error><Code>InvalidPart</Code></Error>")
        );
        for same in [&b" "[..], b"<CompleteMultipartUploadResult/>", b"<?xml"] {
            let chunk = Bytes::copy_from_slice(same);
            assert_eq!(without_declaration(chunk.clone()), chunk);
        }
    }

    /// An error answer without a type gets `application/xml`, and one
    /// without a message gets one after its code; a typed answer with a
    /// message, and a success, are left as they are.
    #[test]
    fn error_answers_are_typed() {
        let mut e = super::error(s3s::S3ErrorCode::Custom("StaleFence".into()), "newer");
        e.set_status_code(http::StatusCode::CONFLICT);
        e.set_headers(http::HeaderMap::new());
        let mut r = e.to_http_response().expect("serializes");
        assert!(r.headers().get("content-type").is_none(), "s3s drops it");
        super::typed(&mut r);
        assert_eq!(r.headers()["content-type"], "application/xml");
        let body = r.body().bytes().expect("whole");
        assert!(body.ends_with(b"<Error><Code>StaleFence</Code><Message>newer</Message></Error>"));

        let mut r = s3s::S3Error::new(s3s::S3ErrorCode::SignatureDoesNotMatch)
            .to_http_response()
            .expect("serializes");
        super::typed(&mut r);
        let body = r.body().bytes().expect("whole");
        let text = std::str::from_utf8(&body).expect("utf-8");
        assert!(
            text.contains(
                "<Code>SignatureDoesNotMatch</Code><Message>the signature does not match"
            ),
            "{text}"
        );

        let mut ok = http::Response::new(s3s::Body::from(Bytes::from_static(b"data")));
        super::typed(&mut ok);
        assert!(ok.headers().get("content-type").is_none());
    }

    /// Bucket names follow S3's rules for path-style names.
    #[test]
    fn bucket_names() {
        for good in ["abc", "reports", "my-bucket.2026", "a1b"] {
            assert!(valid_bucket(good), "{good}");
        }
        for bad in [
            "ab",
            "Reports",
            "-abc",
            "abc-",
            "a..b",
            "a_b",
            "a/b",
            &"a".repeat(64),
        ] {
            assert!(!valid_bucket(bad), "{bad}");
        }
    }
}
