//! The S3 requests `object_store` does not make, signed by its own SigV4
//! signer ([`AwsAuthorizer`]) with its own credentials:
//! - a blob composed from other blobs inside the bucket
//!   (CreateMultipartUpload, UploadPartCopy, CompleteMultipartUpload; Abort
//!   on any failure), through `object_store`'s pooled client, so a
//!   multipart Complete on the S3 front moves no part bytes through the
//!   gateway;
//! - a PUT streamed as the client's bytes arrive, signed with the SHA-256
//!   the client declared (and s3s checks as the body is read), through
//!   Pingora's pooled connector (`object_store` sends whole bodies only):
//!   the gateway hashes nothing again, holds no copy, and the upstream
//!   checks the bytes against that same SHA-256.
//!
//! Why not a crate: `object_store` has no UploadPartCopy, and aws-sdk-s3
//! would add the AWS SDK's ~100 crates (and aws-lc-sys's C build, which
//! the workspace left object_store 0.13 to avoid) to a 2-core CI for five
//! requests; the signer and the client are already linked through
//! `object_store`, and this is checked end to end against s3s-fs.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use object_store::ClientOptions;
use object_store::aws::{AwsAuthorizer, AwsCredentialProvider};
use object_store::client::{HttpClient, HttpConnector, HttpRequestBody, ReqwestConnector};
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::protocols::http::client::HttpSession;

use crate::error::Error;

/// S3's largest part (and largest UploadPartCopy range).
const MAX_PART: u64 = 5 << 30;
/// S3's most parts in one upload.
const MAX_PARTS: usize = 10_000;
/// Copies in flight at once while composing.
const COPIES: usize = 4;

/// Signed requests to one bucket (path style: `ENDPOINT/BUCKET/KEY`).
#[derive(Clone)]
pub(super) struct Signed {
    /// Requests the upstream answers at once.
    quick: HttpClient,
    /// Copies and Completes: the upstream moves the bytes before it answers.
    slow: HttpClient,
    credentials: AwsCredentialProvider,
    region: String,
    /// `ENDPOINT/BUCKET`.
    base: String,
    bucket: String,
    wire: Arc<Wire>,
}

/// Streamed PUTs: the upstream's address (looked up again after a
/// minute: S3 endpoints move) and Pingora's pool of connections to it.
struct Wire {
    connector: Connector,
    tls: bool,
    /// Host name (for TLS) and port.
    host: String,
    port: u16,
    /// The endpoint's own path, then `/BUCKET`.
    prefix: String,
    timeout: Duration,
    resolved: Mutex<Option<(Instant, SocketAddr)>>,
}

/// How long a looked-up address is used.
const RESOLVED_FOR: Duration = Duration::from_secs(60);
/// Idle connections to the upstream are kept this long.
const IDLE: Duration = Duration::from_secs(60);

/// What a composition came to.
pub enum Composed {
    /// The blob exists, this many bytes (checked with a HEAD).
    Done(u64),
    /// Source `i` (an index into the sources) is not in the bucket.
    Gone(usize),
    /// Too many pieces for one upload: the caller copies instead.
    TooMany,
}

impl Signed {
    pub(super) fn new(
        endpoint: &str,
        bucket: &str,
        region: String,
        credentials: AwsCredentialProvider,
        options: &ClientOptions,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let bad = |e: object_store::Error| Error::Config(format!("--s3-upstream: {e}"));
        let quick = ReqwestConnector::default().connect(options).map_err(bad)?;
        // A copy of a 5 GiB part, or a Complete of thousands, takes the
        // upstream minutes (S3 sends whitespace meanwhile).
        let slow_options = options
            .clone()
            .with_timeout(timeout.max(Duration::from_secs(900)));
        let slow = ReqwestConnector::default()
            .connect(&slow_options)
            .map_err(bad)?;
        let base = format!("{}/{}", endpoint.trim_end_matches('/'), encode(bucket));
        let uri: http::Uri = base
            .parse()
            .map_err(|_| Error::Config(format!("--s3-upstream {endpoint:?}: not a URL")))?;
        let tls = uri.scheme_str() == Some("https");
        let host = uri
            .host()
            .ok_or_else(|| Error::Config(format!("--s3-upstream {endpoint:?}: no host")))?;
        let wire = Wire {
            connector: Connector::new(None),
            tls,
            host: host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: uri.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            prefix: uri.path().to_owned(),
            timeout,
            resolved: Mutex::new(None),
        };
        Ok(Self {
            quick,
            slow,
            credentials,
            region,
            base,
            bucket: bucket.to_owned(),
            wire: Arc::new(wire),
        })
    }

    /// Start a PUT of `key`, `length` bytes whose SHA-256 is `sha256`,
    /// refused by the upstream if the key exists (`If-None-Match: *`, as
    /// `object_store`'s create-only PUT). The body follows with
    /// [`PutStream::write`]; [`PutStream::finish`] reads the answer.
    pub(super) async fn start_put(
        &self,
        key: &str,
        length: u64,
        sha256: &[u8; 32],
    ) -> Result<PutStream, Error> {
        let doing = "uploading a blob";
        let failed = |detail: String| Error::Upstream { doing, detail };
        let mut request = http::Request::builder()
            .method(Method::PUT)
            .uri(self.url(key, ""))
            .header("content-length", length)
            .header("if-none-match", "*")
            .body(HttpRequestBody::empty())
            .map_err(|e| failed(e.to_string()))?;
        let credential = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| failed(e.to_string()))?;
        AwsAuthorizer::new(&credential, "s3", &self.region).authorize(&mut request, Some(sha256));
        let path = format!("{}/{}", self.wire.prefix, encode(key));
        let mut header =
            RequestHeader::build("PUT", path.as_bytes(), Some(request.headers().len()))
                .map_err(|e| failed(e.to_string()))?;
        for (name, value) in request.headers() {
            header
                .append_header(name.clone(), value.clone())
                .map_err(|e| failed(e.to_string()))?;
        }
        let peer = self.wire.peer().await?;
        let (mut session, _reused) = self
            .wire
            .connector
            .get_http_session(&peer)
            .await
            .map_err(|e| failed(e.to_string()))?;
        session
            .write_request_header(Box::new(header))
            .await
            .map_err(|e| failed(e.to_string()))?;
        Ok(PutStream {
            session: Box::new(session),
            peer,
            wire: self.wire.clone(),
        })
    }

    /// The URL of `key`, with a query.
    fn url(&self, key: &str, query: &str) -> String {
        if query.is_empty() {
            format!("{}/{}", self.base, encode(key))
        } else {
            format!("{}/{}?{query}", self.base, encode(key))
        }
    }

    /// One signed request; its status, headers and whole body (S3's
    /// answers here are small XML documents). `slow`: the upstream moves
    /// bytes before it answers.
    async fn send(
        &self,
        slow: bool,
        (method, url): (Method, String),
        headers: &[(&'static str, String)],
        body: Bytes,
        doing: &'static str,
    ) -> Result<(StatusCode, http::HeaderMap, Bytes), Error> {
        let failed = |detail: String| Error::Upstream { doing, detail };
        let mut builder = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            builder = builder.header(*name, value.as_str());
        }
        let mut request = builder
            .body(HttpRequestBody::from(body))
            .map_err(|e| failed(e.to_string()))?;
        let credential = self
            .credentials
            .get_credential()
            .await
            .map_err(|e| failed(e.to_string()))?;
        AwsAuthorizer::new(&credential, "s3", &self.region).authorize(&mut request, None);
        let client = if slow { &self.slow } else { &self.quick };
        let response = client
            .execute(request)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let (parts, body) = response.into_parts();
        let body = body.bytes().await.map_err(|e| failed(e.to_string()))?;
        Ok((parts.status, parts.headers, body))
    }

    /// Write `to` as the concatenation of the whole objects `sources`
    /// (keys and lengths), inside the bucket: one multipart upload whose
    /// parts are UploadPartCopy of the sources (a source over 5 GiB in
    /// ranges). Every source but the last must be at least 5 MiB (S3's
    /// rule; the caller's parts are). The upload is aborted on any failure.
    pub(super) async fn compose(
        &self,
        to: &str,
        sources: &[(String, u64)],
    ) -> Result<Composed, Error> {
        // The pieces: (source index, byte range), in order.
        let mut pieces: Vec<(usize, Option<(u64, u64)>)> = Vec::new();
        for (i, (_, length)) in sources.iter().enumerate() {
            if *length <= MAX_PART {
                pieces.push((i, None));
                continue;
            }
            let count = length.div_ceil(MAX_PART);
            let each = length.div_ceil(count);
            let mut start = 0;
            while start < *length {
                let end = (start + each).min(*length) - 1;
                pieces.push((i, Some((start, end))));
                start = end + 1;
            }
        }
        if pieces.len() > MAX_PARTS {
            return Ok(Composed::TooMany);
        }
        let (status, _, body) = self
            .send(
                false,
                (Method::POST, self.url(to, "uploads=")),
                &[],
                Bytes::new(),
                "starting a blob's composition",
            )
            .await?;
        let upload_id = match (status.is_success(), element(&body, "UploadId")) {
            (true, Some(id)) if !id.is_empty() => id,
            _ => return Err(refused("starting a blob's composition", status, &body)),
        };
        let mut upload = Abort(Some((self.clone(), to.to_owned(), upload_id.clone())));
        let mut etags = Vec::with_capacity(pieces.len());
        for (batch, group) in pieces.chunks(COPIES).enumerate() {
            let mut copies = Vec::with_capacity(group.len());
            for (i, (source, range)) in group.iter().enumerate() {
                let number = batch * COPIES + i + 1;
                let key = sources.get(*source).map_or("", |(k, _)| k.as_str());
                copies.push(self.copy_part(to, &upload_id, number, key, *range));
            }
            for (copied, (source, _)) in futures_util::future::join_all(copies)
                .await
                .into_iter()
                .zip(group)
            {
                match copied? {
                    Some(etag) => etags.push(etag),
                    None => {
                        upload.now().await;
                        return Ok(Composed::Gone(*source));
                    }
                }
            }
        }
        let mut xml = String::from(
            r#"<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">"#,
        );
        for (n, etag) in etags.iter().enumerate() {
            xml.push_str(&format!(
                "<Part><PartNumber>{}</PartNumber><ETag>{}</ETag></Part>",
                n + 1,
                escape(etag)
            ));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let query = format!("uploadId={}", encode_value(&upload_id));
        let (status, _, body) = self
            .send(
                true,
                (Method::POST, self.url(to, &query)),
                &[("content-type", "application/xml".into())],
                Bytes::from(xml),
                "completing a blob's composition",
            )
            .await?;
        // S3 may answer 200 and then report the failure in the body.
        if !status.is_success() || element(&body, "Code").is_some() {
            return Err(refused("completing a blob's composition", status, &body));
        }
        upload.0 = None;
        // The composed blob must be what was asked for: a short one is
        // never published.
        let doing = "checking a composed blob";
        let total: u64 = sources.iter().map(|(_, n)| n).sum();
        let (status, headers, _) = self
            .send(
                false,
                (Method::HEAD, self.url(to, "")),
                &[],
                Bytes::new(),
                doing,
            )
            .await?;
        let length = headers
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if !status.is_success() {
            return Err(refused(doing, status, b""));
        }
        if length != Some(total) {
            return Err(Error::Upstream {
                doing,
                detail: format!("{length:?} bytes where the parts have {total}"),
            });
        }
        Ok(Composed::Done(total))
    }

    /// UploadPartCopy of `source` (or a range of it) as part `number`; its
    /// ETag, or `None` if the source is not in the bucket.
    async fn copy_part(
        &self,
        to: &str,
        upload_id: &str,
        number: usize,
        source: &str,
        range: Option<(u64, u64)>,
    ) -> Result<Option<String>, Error> {
        let doing = "copying a part inside the bucket";
        let mut headers = vec![(
            "x-amz-copy-source",
            format!("/{}/{}", encode(&self.bucket), encode(source)),
        )];
        if let Some((start, end)) = range {
            headers.push(("x-amz-copy-source-range", format!("bytes={start}-{end}")));
        }
        let query = format!("partNumber={number}&uploadId={}", encode_value(upload_id));
        let (status, _, body) = self
            .send(
                true,
                (Method::PUT, self.url(to, &query)),
                &headers,
                Bytes::new(),
                doing,
            )
            .await?;
        if status == StatusCode::NOT_FOUND
            && element(&body, "Code").is_some_and(|c| c == "NoSuchKey")
        {
            return Ok(None);
        }
        match (status.is_success(), element(&body, "ETag")) {
            (true, Some(etag)) if element(&body, "Code").is_none() => Ok(Some(etag)),
            _ => Err(refused(doing, status, &body)),
        }
    }
}

impl Wire {
    /// The upstream as a Pingora peer, its address looked up at most once
    /// a minute.
    async fn peer(&self) -> Result<HttpPeer, Error> {
        let cached = self
            .resolved
            .lock()
            .ok()
            .and_then(|r| *r)
            .filter(|(at, _)| at.elapsed() < RESOLVED_FOR)
            .map(|(_, addr)| addr);
        let addr = match cached {
            Some(addr) => addr,
            None => {
                let (host, port) = (self.host.clone(), self.port);
                let found = tokio::task::spawn_blocking(move || {
                    (host.as_str(), port)
                        .to_socket_addrs()
                        .map(|mut a| a.next())
                })
                .await;
                let addr = match found {
                    Ok(Ok(Some(addr))) => addr,
                    _ => {
                        return Err(Error::Upstream {
                            doing: "looking up the S3 upstream",
                            detail: format!("{} does not resolve", self.host),
                        });
                    }
                };
                if let Ok(mut r) = self.resolved.lock() {
                    *r = Some((Instant::now(), addr));
                }
                addr
            }
        };
        let mut peer = HttpPeer::new(addr, self.tls, self.host.clone());
        peer.options.connection_timeout = Some(self.timeout);
        peer.options.read_timeout = Some(self.timeout);
        peer.options.write_timeout = Some(self.timeout);
        peer.options.idle_timeout = Some(IDLE);
        Ok(peer)
    }
}

/// A streamed PUT in progress; dropped unfinished, its connection closes
/// and the upstream keeps nothing of it.
pub(super) struct PutStream {
    session: Box<HttpSession>,
    peer: HttpPeer,
    wire: Arc<Wire>,
}

impl PutStream {
    /// Send a chunk of the body.
    pub(super) async fn write(&mut self, chunk: Bytes) -> Result<(), Error> {
        self.session
            .write_request_body(chunk, false)
            .await
            .map_err(|e| Error::Upstream {
                doing: "uploading a blob",
                detail: e.to_string(),
            })
    }

    /// End the body; the blob is written once the upstream answers 2xx.
    pub(super) async fn finish(mut self) -> Result<(), Error> {
        let doing = "uploading a blob";
        let failed = |detail: String| Error::Upstream { doing, detail };
        self.session
            .finish_request_body()
            .await
            .map_err(|e| failed(e.to_string()))?;
        self.session
            .read_response_header()
            .await
            .map_err(|e| failed(e.to_string()))?;
        let status = self
            .session
            .response_header()
            .map_or(0, |h| h.status.as_u16());
        let mut body = Vec::new();
        while let Some(chunk) = self
            .session
            .read_response_body()
            .await
            .map_err(|e| failed(e.to_string()))?
        {
            if body.len() < 64 << 10 {
                body.extend_from_slice(&chunk);
            }
        }
        if !(200..300).contains(&status) {
            return Err(refused(
                doing,
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                &body,
            ));
        }
        self.wire
            .connector
            .release_http_session(*self.session, &self.peer, Some(IDLE))
            .await;
        Ok(())
    }
}

/// An upload in progress, aborted if left unfinished (else the upstream
/// keeps its parts until a lifecycle rule removes them).
struct Abort(Option<(Signed, String, String)>);

impl Abort {
    /// Abort now, and wait for the answer.
    async fn now(&mut self) {
        if let Some((signed, key, upload_id)) = self.0.take() {
            signed.abort(&key, &upload_id).await;
        }
    }
}

impl Drop for Abort {
    fn drop(&mut self) {
        // A failure returned early, or the request was dropped: abort in
        // the background.
        if let Some((signed, key, upload_id)) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move { signed.abort(&key, &upload_id).await });
        }
    }
}

impl Signed {
    /// AbortMultipartUpload; a failure is logged (the bucket's lifecycle
    /// rule for incomplete uploads is the backstop).
    async fn abort(&self, key: &str, upload_id: &str) {
        let doing = "aborting a blob's composition";
        let query = format!("uploadId={}", encode_value(upload_id));
        match self
            .send(
                false,
                (Method::DELETE, self.url(key, &query)),
                &[],
                Bytes::new(),
                doing,
            )
            .await
        {
            Ok((status, _, _)) if status.is_success() || status == StatusCode::NOT_FOUND => {}
            Ok((status, _, body)) => {
                tracing::warn!(key, error = %refused(doing, status, &body), "an incomplete upload is left to the bucket's lifecycle rules");
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "an incomplete upload is left to the bucket's lifecycle rules");
            }
        }
    }
}

fn refused(doing: &'static str, status: StatusCode, body: &[u8]) -> Error {
    let code = element(body, "Code").unwrap_or_default();
    let message = element(body, "Message").unwrap_or_default();
    Error::Upstream {
        doing,
        detail: format!("status {} {code} {message}", status.as_u16())
            .trim_end()
            .to_owned(),
    }
}

/// The text of the first `<name>` element of an S3 XML answer, entities
/// decoded.
fn element(xml: &[u8], name: &str) -> Option<String> {
    let xml = std::str::from_utf8(xml).ok()?;
    let open = format!("<{name}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{name}>"))?;
    Some(unescape(&xml[start..end]))
}

fn unescape(text: &str) -> String {
    text.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#34;", "\"")
        .replace("&amp;", "&")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// URI-encode a key for a path (S3's rules: unreserved characters as
/// they are, `/` kept).
fn encode(text: &str) -> String {
    encode_with(text, true)
}

/// URI-encode a query value (`/` too).
fn encode_value(text: &str) -> String {
    encode_with(text, false)
}

fn encode_with(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char);
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_read_and_decoded() {
        let xml = br#"<?xml version="1.0"?><CopyPartResult><ETag>&quot;abc&quot;</ETag></CopyPartResult>"#;
        assert_eq!(element(xml, "ETag").as_deref(), Some("\"abc\""));
        assert_eq!(element(xml, "Code"), None);
        assert_eq!(encode("a b/c+d"), "a%20b/c%2Bd");
        assert_eq!(encode_value("a/b"), "a%2Fb");
    }
}
