//! Copies: CopyObject, and the source read every copy shares with
//! UploadPartCopy ([`Objects::copy_from`]): the read right and the
//! `x-amz-copy-source-if-*` conditions on the source, its visible blob (or
//! a range of it) copied into a new staged object, MD5 on the way. The
//! destination is a fenced write like any other ([`super::write`]).

use std::time::SystemTime;

use fencecheck_sqlite::ObjectId;
use md5::{Digest, Md5};
use s3s::dto::{
    CopyObjectInput, CopyObjectOutput, CopyObjectResult, CopySource, ETag, MetadataDirective,
    Timestamp,
};
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result};

use super::errors::{early_stop, error, failure, storage};
use super::intake::{Bound, hex};
use super::ops::Objects;
use super::read::ReadConditions;
use super::write::{answer_publish, content_type, fence_token, user_metadata, write_request};
use super::{DEFAULT_TYPE, note, with_fence};
use crate::blobs::Written;
use crate::http::Core;
use crate::http::publish::{cleanup, decide_early};
use crate::store::{Kind, Meta, Store};

/// The `x-amz-copy-source-if-*` conditions of a CopyObject or
/// UploadPartCopy input.
macro_rules! copy_conditions {
    ($input:expr) => {
        $crate::s3::read::ReadConditions {
            if_match: $input.copy_source_if_match.as_ref(),
            if_none_match: $input.copy_source_if_none_match.as_ref(),
            if_modified_since: $input.copy_source_if_modified_since.as_ref(),
            if_unmodified_since: $input.copy_source_if_unmodified_since.as_ref(),
        }
    };
}
pub(super) use copy_conditions;

/// What a copy took from its source.
pub(super) struct Copied {
    pub written: Written,
    pub md5: [u8; 16],
    pub source_version: u64,
    pub content_type: Option<String>,
    pub metadata: Option<String>,
}

impl Objects {
    /// Copy the visible object of `(bucket, key, version)` (its `range`,
    /// S3's `bytes=first-last`, if given) into a new staged object made by
    /// `stage`, within `bound`: read right on the source, its conditions
    /// (all failing with 412, as for a copy source), MD5 on the way. As in
    /// GetObject, a source replaced (and its blob collected) between
    /// reading its pointer and its blob is read again. The operation is
    /// noted as `op` (the source read notes `get`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn copy_from<T>(
        &self,
        req: &S3Request<T>,
        op: &'static str,
        (bucket, key, version_id): (&str, &str, Option<&str>),
        conditions: ReadConditions<'_>,
        range: Option<&str>,
        bound: Bound,
        stage: impl Fn(&Store) -> Result<ObjectId, crate::error::Error> + Clone + Send + 'static,
    ) -> S3Result<(ObjectId, Copied)> {
        let mut previous: Option<ObjectId> = None;
        loop {
            let source = self.read(req, bucket, key, version_id, conditions).await;
            note(req, |t| t.op = Some(op));
            let source = source.map_err(|e| {
                if *e.code() == S3ErrorCode::NotModified {
                    error(
                        S3ErrorCode::PreconditionFailed,
                        "the copy source is not modified since the date or ETag given",
                    )
                } else {
                    e
                }
            })?;
            if previous == Some(source.object) {
                return Err(error(
                    S3ErrorCode::InternalError,
                    "the copy source's visible object has no blob",
                ));
            }
            previous = Some(source.object);
            let length = match source.length {
                Some(n) => Some(n),
                None => self
                    .core
                    .blobs
                    .size(source.object)
                    .await
                    .map_err(|e| storage(&e))?,
            };
            let Some(length) = length else { continue };
            let span = match range {
                None if length == 0 => None,
                None => Some((0, length - 1)),
                Some(text) => Some(copy_range(text, length)?),
            };
            let taking = span.map_or(0, |(s, e)| e - s + 1);
            if taking > bound.bytes {
                return Err(bound.refused());
            }
            let object = self
                .core
                .work(false, stage.clone())
                .await
                .map_err(|f| failure(&f))?;
            match copy_blob(&self.core, source.object, length, span, object).await {
                Ok(Some((written, md5))) => {
                    return Ok((
                        object,
                        Copied {
                            written,
                            md5,
                            source_version: source.version,
                            content_type: source.content_type.clone(),
                            metadata: source.metadata.clone(),
                        },
                    ));
                }
                Ok(None) => cleanup(&self.core, object).await,
                Err(e) => {
                    cleanup(&self.core, object).await;
                    return Err(e);
                }
            }
        }
    }

    /// A fenced write of the destination whose bytes are the source's
    /// visible object (read right on the source, write right on the
    /// destination). The token is the copier's: `Fence-Token`, or with
    /// `MetadataDirective: REPLACE` the new `x-amz-meta-fence-token`; never
    /// the source's metadata, which holds its own writer's token.
    pub(super) async fn copy(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let scope = self.writer(&req, "put", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        let (source_bucket, source_key, version_id) = copy_source(&input.copy_source)?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if !replace && self.scope(source_bucket, source_key)? == scope {
            // S3's own rule: a copy onto itself must change something.
            return Err(error(
                S3ErrorCode::InvalidRequest,
                "copying an object onto itself needs MetadataDirective REPLACE",
            ));
        }
        let metadata = if replace {
            input.metadata.as_ref()
        } else {
            None
        };
        let presented = fence_token(&req.headers, metadata).inspect_err(|_| {
            note(&req, |t| t.outcome = Some("missing-token"));
        })?;
        let write = write_request(&scope, presented, &req.headers, false)?;
        note(&req, |t| t.epoch = Some(write.request.token.epoch));
        let (new_type, new_metadata) = if replace {
            (
                Some(content_type(input.content_type.clone())?),
                Some(user_metadata(input.metadata.as_ref())?),
            )
        } else {
            (None, None)
        };
        let (outcome, _head, write) = decide_early(&self.core, write, false)
            .await
            .map_err(|f| failure(&f))?;
        if let Some((e, outcome)) = early_stop(&outcome) {
            note(&req, |t| t.outcome = Some(outcome));
            return Err(e);
        }
        let (fence, s) = (write.fence.clone(), scope.clone());
        let (object, copied) = self
            .copy_from(
                &req,
                "put",
                (source_bucket, source_key, version_id),
                copy_conditions!(input),
                None,
                Bound {
                    bytes: self.core.config.max_upload,
                    what: "the copy source is over --max-upload",
                },
                move |store: &Store| store.stage(&s, Kind::Blob, &fence),
            )
            .await?;
        let etag = hex(&copied.md5);
        let meta = Meta {
            length: copied.written.length,
            sha256: copied.written.sha256,
            content_type: new_type.unwrap_or_else(|| {
                copied
                    .content_type
                    .clone()
                    .unwrap_or_else(|| DEFAULT_TYPE.to_owned())
            }),
            op_id: write.request.op_id.clone(),
            etag: Some(etag.clone()),
            // COPY keeps the source's metadata, REPLACE takes the request's.
            metadata: new_metadata.unwrap_or(copied.metadata),
        };
        let (version, fence) = answer_publish(&self.core, &req, &write, object, meta).await?;
        let output = CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(ETag::Strong(etag)),
                last_modified: Some(Timestamp::from(SystemTime::now())),
                ..Default::default()
            }),
            copy_source_version_id: Some(copied.source_version.to_string()),
            version_id: Some(version.to_string()),
            ..Default::default()
        };
        Ok(with_fence(output, &fence))
    }
}

/// A copy source's bucket, key and version id (access points are not
/// served).
pub(super) fn copy_source(source: &CopySource) -> S3Result<(&str, &str, Option<&str>)> {
    match source {
        CopySource::Bucket {
            bucket,
            key,
            version_id,
        } => Ok((bucket, key, version_id.as_deref())),
        _ => Err(error(
            S3ErrorCode::NotImplemented,
            "the copy source must be bucket/key (access points and outposts are not served)",
        )),
    }
}

/// S3's `x-amz-copy-source-range`: `bytes=first-last`, both given, inside
/// an object of `length` bytes.
fn copy_range(text: &str, length: u64) -> S3Result<(u64, u64)> {
    let bad = || {
        error(
            S3ErrorCode::InvalidArgument,
            format!(
                "x-amz-copy-source-range must be bytes=first-last inside the source ({length} bytes)"
            ),
        )
    };
    let (first, last) = text
        .trim()
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .ok_or_else(bad)?;
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (number(first), number(last)) {
        (Some(first), Some(last)) if first <= last && last < length => Ok((first, last)),
        _ => Err(bad()),
    }
}

/// Copy bytes `span` (inclusive; `None`: an empty blob) of `from`'s blob,
/// `length` bytes in all, into `to`'s, with their MD5. `Ok(None)`: the
/// source blob is gone (collected after a newer publish).
async fn copy_blob(
    core: &Core,
    from: ObjectId,
    length: u64,
    span: Option<(u64, u64)>,
    to: ObjectId,
) -> S3Result<Option<(Written, [u8; 16])>> {
    let Some((mut reader, found)) = core.blobs.open(from, span).await.map_err(|e| storage(&e))?
    else {
        return Ok(None);
    };
    if found != length {
        return Err(error(
            S3ErrorCode::InternalError,
            "the copy source's blob differs from its record",
        ));
    }
    let taking = span.map_or(0, |(s, e)| e - s + 1);
    let mut writer = core
        .blobs
        .create(to, Some(taking))
        .await
        .map_err(|e| storage(&e))?;
    let mut md5 = Md5::new();
    let mut buf = vec![0u8; 256 << 10];
    while reader.left() > 0 {
        let chunk = reader
            .next(&mut buf)
            .await
            .map_err(|e| storage(&e))?
            .ok_or_else(|| {
                error(
                    S3ErrorCode::InternalError,
                    "the copy source's blob is shorter than recorded",
                )
            })?;
        md5.update(&chunk);
        writer.write(chunk).await.map_err(|e| storage(&e))?;
    }
    core.blobs.done(reader).await;
    let written = core.blobs.finish(writer).await.map_err(|e| storage(&e))?;
    Ok(Some((written, md5.finalize().into())))
}
