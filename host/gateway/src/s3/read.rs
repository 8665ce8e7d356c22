//! Reads: GetObject and HeadObject. A read takes the read right on the
//! key, its visible object (only the visible version is kept), S3's
//! preconditions ([`ReadConditions`], shared with the copy source's) and a
//! range; the blob is the body, streamed by a task unless it is small. A
//! blob collected between reading its pointer and opening it is read
//! again from the newer pointer.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use bytes::Bytes;
use fencecheck_sqlite::ObjectId;
use s3s::dto::{
    ETag, ETagCondition, GetObjectInput, GetObjectOutput, HeadObjectInput, HeadObjectOutput,
    Metadata, StreamingBlob, Timestamp,
};
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use tokio::sync::mpsc;

use super::errors::{error, failure, storage};
use super::ops::Objects;
use super::{DEFAULT_TYPE, note, with_fence};
use crate::auth::Right;
use crate::http::Core;
use crate::store::{Current, Kind};

impl Objects {
    /// The key's visible body, or NoSuchKey.
    pub(super) async fn visible(&self, scope: &str) -> S3Result<Current> {
        let head = match self.core.store.head_here(scope) {
            Some(head) => head,
            None => {
                let s = scope.to_owned();
                self.core
                    .work(true, move |store| store.head(&s))
                    .await
                    .map_err(|f| failure(&f))?
            }
        };
        match head.visible {
            Some(c) if c.kind == Kind::Blob => Ok(c),
            _ => Err(error(S3ErrorCode::NoSuchKey, "no visible object")),
        }
    }

    /// A read: authorized, visible, the version asked for, preconditions.
    pub(super) async fn read<T>(
        &self,
        req: &S3Request<T>,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        conditions: ReadConditions<'_>,
    ) -> S3Result<Current> {
        note(req, |t| t.op = Some("get"));
        let principal = self.principal(req)?;
        let scope = self.scope(bucket, key)?;
        Self::authorize(&principal, Right::Read, &scope)?;
        let current = self.visible(&scope).await?;
        if version_id.is_some_and(|v| v != current.version.to_string()) {
            return Err(error(
                S3ErrorCode::NoSuchVersion,
                "only the visible version is kept",
            ));
        }
        conditions.check(&s3_etag(&current), current.published_at)?;
        Ok(current)
    }

    /// GetObject.
    pub(super) async fn get(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = &req.input;
        // The collector may delete a blob just replaced after the pointer
        // was read; reading the pointer again finds the newer one. The same
        // object twice with no blob is a missing blob.
        let mut previous: Option<ObjectId> = None;
        loop {
            let current = self
                .read(
                    &req,
                    &input.bucket,
                    &input.key,
                    input.version_id.as_deref(),
                    ReadConditions {
                        if_match: input.if_match.as_ref(),
                        if_none_match: input.if_none_match.as_ref(),
                        if_modified_since: input.if_modified_since.as_ref(),
                        if_unmodified_since: input.if_unmodified_since.as_ref(),
                    },
                )
                .await?;
            if previous == Some(current.object) {
                tracing::error!(key = %input.key, object = current.object.get(), "the visible object's blob is missing");
                return Err(error(
                    S3ErrorCode::InternalError,
                    "the key's visible object has no blob (lost in a crash, or removed outside the gateway)",
                ));
            }
            previous = Some(current.object);
            let length = match current.length {
                Some(n) => Some(n),
                None => self
                    .core
                    .blobs
                    .size(current.object)
                    .await
                    .map_err(|e| storage(&e))?,
            };
            let Some(length) = length else { continue };
            let range = match &input.range {
                None => None,
                Some(r) => match r.check(length) {
                    Ok(span) if span.end > span.start => Some((span.start, span.end - 1)),
                    _ => {
                        return Err(error(
                            S3ErrorCode::InvalidRange,
                            format!("the range is outside the object ({length} bytes)"),
                        ));
                    }
                },
            };
            let sending = range.map_or(length, |(s, e)| e - s + 1);
            let body = if sending == 0 {
                Some(StreamingBlob::wrap(futures_util::stream::empty::<
                    Result<Bytes, std::io::Error>,
                >()))
            } else {
                match blob_body(&self.core, &current, range, length).await? {
                    Some(body) => Some(body),
                    None => continue,
                }
            };
            note(&req, |t| t.outcome = Some("ok"));
            let output = GetObjectOutput {
                body,
                accept_ranges: Some("bytes".to_owned()),
                content_length: i64::try_from(sending).ok(),
                content_range: range.map(|(s, e)| format!("bytes {s}-{e}/{length}")),
                content_type: Some(
                    current
                        .content_type
                        .clone()
                        .unwrap_or_else(|| DEFAULT_TYPE.to_owned()),
                ),
                e_tag: Some(ETag::Strong(s3_etag(&current))),
                last_modified: Some(Timestamp::from(current.published_at)),
                version_id: Some(current.version.to_string()),
                metadata: Some(fence_metadata(&current)),
                ..Default::default()
            };
            return Ok(with_fence(output, &current.fence));
        }
    }

    /// HeadObject: GetObject's answer without the body.
    pub(super) async fn head(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = &req.input;
        let current = self
            .read(
                &req,
                &input.bucket,
                &input.key,
                input.version_id.as_deref(),
                ReadConditions {
                    if_match: input.if_match.as_ref(),
                    if_none_match: input.if_none_match.as_ref(),
                    if_modified_since: input.if_modified_since.as_ref(),
                    if_unmodified_since: input.if_unmodified_since.as_ref(),
                },
            )
            .await?;
        let length = match current.length {
            Some(n) => Some(n),
            None => self
                .core
                .blobs
                .size(current.object)
                .await
                .map_err(|e| storage(&e))?,
        };
        note(&req, |t| t.outcome = Some("ok"));
        let output = HeadObjectOutput {
            accept_ranges: Some("bytes".to_owned()),
            content_length: length.and_then(|n| i64::try_from(n).ok()),
            content_type: Some(
                current
                    .content_type
                    .clone()
                    .unwrap_or_else(|| DEFAULT_TYPE.to_owned()),
            ),
            e_tag: Some(ETag::Strong(s3_etag(&current))),
            last_modified: Some(Timestamp::from(current.published_at)),
            version_id: Some(current.version.to_string()),
            metadata: Some(fence_metadata(&current)),
            ..Default::default()
        };
        Ok(with_fence(output, &current.fence))
    }
}

/// A GET's or HEAD's preconditions, decided as S3 (and RFC 9110 §13.2.2)
/// does: the date conditions count only where the ETag condition of the
/// same kind is absent, so `If-Match` true with `If-Unmodified-Since`
/// false serves the object, and `If-None-Match` false with
/// `If-Modified-Since` true serves it too.
#[derive(Clone, Copy)]
pub(super) struct ReadConditions<'a> {
    pub if_match: Option<&'a ETagCondition>,
    pub if_none_match: Option<&'a ETagCondition>,
    pub if_modified_since: Option<&'a Timestamp>,
    pub if_unmodified_since: Option<&'a Timestamp>,
}

impl ReadConditions<'_> {
    fn check(&self, tag: &str, published_at: SystemTime) -> S3Result<()> {
        // HTTP dates have whole seconds: compare whole seconds, or an object
        // written at 12:00:00.4 would count as modified since 12:00:00.
        let modified = published_at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let seconds = |t: &Timestamp| time::OffsetDateTime::from(t.clone()).unix_timestamp();
        match self.if_match {
            Some(c) if !matches(c, tag) => {
                return Err(error(
                    S3ErrorCode::PreconditionFailed,
                    "If-Match does not name the current ETag",
                ));
            }
            Some(_) => {}
            None => {
                if self
                    .if_unmodified_since
                    .is_some_and(|t| modified > seconds(t))
                {
                    return Err(error(
                        S3ErrorCode::PreconditionFailed,
                        "the object was modified after If-Unmodified-Since",
                    ));
                }
            }
        }
        let unchanged = match self.if_none_match {
            Some(c) => matches(c, tag),
            None => self
                .if_modified_since
                .is_some_and(|t| modified <= seconds(t)),
        };
        if unchanged {
            return Err(S3Error::new(S3ErrorCode::NotModified));
        }
        Ok(())
    }
}

/// The S3 ETag of a visible object: its MD5 (or multipart form) if written
/// through the S3 front, else its `/objects` ETag (the version).
pub(super) fn s3_etag(current: &Current) -> String {
    current
        .etag
        .clone()
        .unwrap_or_else(|| current.version.to_string())
}

/// Whether `tag` meets an If-Match or If-None-Match condition.
pub(super) fn matches(condition: &ETagCondition, tag: &str) -> bool {
    match condition.as_etag() {
        None => true,
        Some(etag) => etag.value() == tag,
    }
}

/// Bodies up to this size are read whole before the answer starts.
const SMALL_BODY: u64 = 64 << 10;

/// The blob's bytes `[start, end]` as a body: a task reads, a channel
/// carries (the blob reader is not `Sync`; s3s bodies must be).
async fn blob_body(
    core: &Core,
    current: &Current,
    wanted: Option<(u64, u64)>,
    length: u64,
) -> S3Result<Option<StreamingBlob>> {
    let mut reader = match core.blobs.open(current.object, wanted).await {
        Ok(Some((reader, total))) if total == length => reader,
        Ok(Some(_)) => {
            return Err(storage(&crate::error::Error::Upstream {
                doing: "reading a blob",
                detail: "its length differs from the recorded one".into(),
            }));
        }
        Ok(None) => return Ok(None),
        Err(e) => return Err(storage(&e)),
    };
    if reader.left() <= SMALL_BODY {
        // A small body is read here, in one piece: no task, no channel
        // (and a failed read is still an S3 error, not a cut body).
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut buf = vec![0u8; usize::try_from(reader.left()).unwrap_or(0)];
        while reader.left() > 0 {
            match reader.next(&mut buf).await {
                Ok(Some(chunk)) => chunks.push(chunk),
                Ok(None) => {
                    return Err(storage(&crate::error::Error::Upstream {
                        doing: "reading a blob",
                        detail: "it is shorter than recorded".into(),
                    }));
                }
                Err(e) => return Err(storage(&e)),
            }
        }
        core.blobs.done(reader).await;
        let body = match chunks.len() {
            1 => chunks.pop().unwrap_or_default(),
            _ => Bytes::from(chunks.concat()),
        };
        return Ok(Some(StreamingBlob::wrap(futures_util::stream::iter([
            Ok::<_, std::io::Error>(body),
        ]))));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(2);
    let blobs = core.blobs.clone();
    tokio::spawn(async move {
        let mut reader = reader;
        let mut buf = vec![0u8; 64 << 10];
        while reader.left() > 0 {
            let next = match reader.next(&mut buf).await {
                Ok(Some(chunk)) => Ok(chunk),
                Ok(None) => Err(std::io::Error::other("the blob is shorter than recorded")),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            };
            let failed = next.is_err();
            if tx.send(next).await.is_err() || failed {
                return;
            }
        }
        blobs.done(reader).await;
    });
    Ok(Some(StreamingBlob::wrap(Channel(rx))))
}

/// A channel's receiving end as a stream.
pub(super) struct Channel<T>(pub mpsc::Receiver<T>);

impl<T> futures_util::Stream for Channel<T> {
    type Item = T;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

fn fence_metadata(current: &Current) -> Metadata {
    let mut m = Metadata::new();
    // Written by user_metadata (a JSON object of strings); anything else
    // was not, and is left out rather than guessed at.
    if let Some(kept) = current
        .metadata
        .as_deref()
        .and_then(|j| serde_json::from_str::<BTreeMap<String, String>>(j).ok())
    {
        m.extend(kept);
    }
    m.insert("fence-token".to_owned(), current.fence.clone());
    m
}
