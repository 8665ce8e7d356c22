//! Pingora to s3s and back. [`Front`] is the gateway's [`Surface`] for
//! every path that is not the gateway's own API: a request is handed to
//! s3s as it came (its body through [`super::pump`], at the gateway's
//! pace and size bound), and the answer s3s makes is sent back within
//! `--response-deadline`, with what the operation noted
//! ([`super::Tally`]) on the request's log line and metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use s3s::S3ErrorCode;
use s3s::stream::DynByteStream;
use tokio::sync::mpsc;

use super::errors::{UNBUILT, XML, error, typed};
use super::pump::{Incoming, Pumped, pump};
use super::{Front, RESERVED, Tallied};
use crate::http::{Ctx, Gateway, Surface};

#[async_trait::async_trait]
impl Surface for Front {
    /// Whether a request for `path` is the S3 front's: every path but
    /// the gateway's own API (so a bucket that is not served is S3's
    /// `NoSuchBucket`, not a bare 404).
    fn claims(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let first = rest.split('/').next().unwrap_or("");
        !RESERVED.contains(&first)
    }

    /// Serve one S3 request: hand it to s3s with a body that keeps the
    /// gateway's pace and size bound, then send its answer within the
    /// response deadline.
    async fn serve(
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
}

impl Front {
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

#[cfg(test)]
mod tests {
    use super::without_declaration;
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
}
