//! Fenced writes: PutObject, DeleteObject and DeleteObjects, and what
//! every write of the front shares (CopyObject and multipart uploads too):
//! the token from `Fence-Token` or `x-amz-meta-fence-token`, the fenced
//! request, the Content-Type and user metadata kept with the object, and
//! the publish's outcome as S3 answers it. The pipeline is the `/objects`
//! API's (early check, stage, stream the body into a new blob, the fenced
//! publish, which decides again), with S3's spelling: MD5 ETags, the
//! scope's version as `x-amz-version-id`, S3 XML errors.

use std::collections::BTreeMap;

use fencecheck::{Decision, MAX_OP_ID_BYTES, SignedTokenText};
use fencecheck_sqlite::ObjectId;
use http::{HeaderMap, StatusCode};
use s3s::dto::{
    DeleteObjectInput, DeleteObjectOutput, DeleteObjectsInput, DeleteObjectsOutput, DeletedObject,
    ETag, Metadata, PutObjectInput, PutObjectOutput,
};
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result};

use super::errors::{early_stop, error, failure, fence_error, missing_token, rejected};
use super::intake::{Bound, declared, declared_sha256, hex, receive_staged};
use super::list::LIST_MAX;
use super::ops::Objects;
use super::read::{matches, s3_etag};
use super::{DEFAULT_TYPE, note, with_fence};
use crate::auth::Right;
use crate::http::Core;
use crate::http::conditional::WriteConditions;
use crate::http::publish::{Published, Write, decide_early, publish_fenced};
use crate::http::reply::token_text;
use crate::store::{Kind, Meta};

const MAX_CONTENT_TYPE: usize = 256;

impl Objects {
    /// PutObject: a fenced write of the request body.
    pub(super) async fn put(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let scope = self.writer(&req, "put", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        let presented = match fence_token(&req.headers, input.metadata.as_ref()) {
            Ok(t) => t,
            Err(e) => {
                note(&req, |t| t.outcome = Some("missing-token"));
                return Err(e);
            }
        };
        let guarded = input.if_match.is_some() || input.if_none_match.is_some();
        let write = write_request(&scope, presented, &req.headers, guarded)?;
        note(&req, |t| t.epoch = Some(write.request.token.epoch));
        let content_type = content_type(input.content_type.clone())?;
        let metadata = user_metadata(input.metadata.as_ref())?;
        let (outcome, head, write) = decide_early(&self.core, write, guarded)
            .await
            .map_err(|f| failure(&f))?;
        if let Some((e, outcome)) = early_stop(&outcome) {
            note(&req, |t| t.outcome = Some(outcome));
            return Err(e);
        }
        let visible = head.visible.as_ref().filter(|c| c.kind == Kind::Blob);
        let precondition = match (&input.if_match, &input.if_none_match, visible) {
            (_, Some(c), Some(v)) if matches(c, &s3_etag(v)) => false,
            (Some(_), _, None) => false,
            (Some(c), _, Some(v)) => matches(c, &s3_etag(v)),
            _ => true,
        };
        if !precondition && !matches!(outcome, Ok(Decision::Duplicate { .. })) {
            note(&req, |t| t.outcome = Some("version-conflict"));
            return Err(error(
                S3ErrorCode::PreconditionFailed,
                "If-Match / If-None-Match does not hold for the current object",
            ));
        }
        let fence = write.fence.clone();
        let s = scope.clone();
        let object = self
            .core
            .work(false, move |store| store.stage(&s, Kind::Blob, &fence))
            .await
            .map_err(|f| failure(&f))?;
        let mut req = req;
        let body = req.input.body.take();
        let input = &req.input;
        let declared = declared!(input);
        let received = receive_staged(
            &self.core,
            object,
            body,
            (
                input.content_length,
                input.content_md5.as_deref(),
                declared_sha256(&req.headers),
            ),
            Bound::body(&self.core),
            declared,
            req.trailing_headers.as_ref(),
        )
        .await?;
        let etag = hex(&received.md5);
        let meta = Meta {
            length: received.written.length,
            sha256: received.written.sha256,
            content_type,
            op_id: write.request.op_id.clone(),
            etag: Some(etag.clone()),
            metadata,
        };
        let (version, fence) = answer_publish(&self.core, &req, &write, object, meta).await?;
        let c = received.checksum;
        let output = PutObjectOutput {
            e_tag: Some(ETag::Strong(etag)),
            version_id: Some(version.to_string()),
            checksum_crc32: c.checksum_crc32,
            checksum_crc32c: c.checksum_crc32c,
            checksum_sha1: c.checksum_sha1,
            checksum_sha256: c.checksum_sha256,
            checksum_crc64nvme: c.checksum_crc64nvme,
            size: i64::try_from(received.written.length).ok(),
            ..Default::default()
        };
        Ok(with_fence(output, &fence))
    }

    /// DeleteObject: a fenced tombstone.
    pub(super) async fn delete(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let scope = self.writer(&req, "delete", &req.input.bucket, &req.input.key)?;
        let presented = match fence_token(&req.headers, None) {
            Ok(t) => t,
            Err(e) => {
                note(&req, |t| t.outcome = Some("missing-token"));
                return Err(e);
            }
        };
        let (version, fence) = self.delete_fenced(&req, scope, presented).await?;
        let output = DeleteObjectOutput {
            version_id: Some(version.to_string()),
            ..Default::default()
        };
        Ok(with_fence(output, &fence))
    }

    /// Each key a DeleteObject of its own under the request's one
    /// `Fence-Token` (each key's high-water mark decides for that key);
    /// a key refused (stale, no right) is an `<Error>` entry and the
    /// others go on, as S3 answers a batch. Nothing is atomic across keys.
    pub(super) async fn delete_many(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        note(&req, |t| t.op = Some("delete"));
        let principal = self.principal(&req)?;
        let input = &req.input;
        self.bucket(&input.bucket)?;
        let objects = &input.delete.objects;
        if objects.is_empty() || objects.len() > LIST_MAX {
            return Err(error(
                S3ErrorCode::MalformedXML,
                "name 1 to 1000 keys to delete",
            ));
        }
        let presented = fence_token(&req.headers, None).inspect_err(|_| {
            note(&req, |t| t.outcome = Some("missing-token"));
        })?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        let mut first_refusal = None;
        for object in objects {
            let key = object.key.clone();
            note(&req, |t| t.outcome = None);
            let done = if object.version_id.is_some()
                || object.e_tag.is_some()
                || object.last_modified_time.is_some()
                || object.size.is_some()
            {
                Err(error(
                    S3ErrorCode::NotImplemented,
                    "only the visible version is deleted: no VersionId, ETag, LastModifiedTime or Size",
                ))
            } else {
                match self.scope(&input.bucket, &key).and_then(|scope| {
                    Self::authorize(&principal, Right::Write, &scope).map(|()| scope)
                }) {
                    Ok(scope) => self.delete_fenced(&req, scope, presented.clone()).await,
                    Err(e) => Err(e),
                }
            };
            match done {
                Ok((version, _)) => {
                    if !quiet {
                        deleted.push(DeletedObject {
                            key: Some(key),
                            delete_marker: Some(true),
                            delete_marker_version_id: Some(version.to_string()),
                            ..Default::default()
                        });
                    }
                }
                Err(e) => {
                    // The decision's own outcome (stale, …) if it came to one.
                    let mut outcome = None;
                    note(&req, |t| outcome = t.outcome);
                    first_refusal.get_or_insert(outcome.unwrap_or("client-error"));
                    errors.push(s3s::dto::Error {
                        code: Some(e.code().as_str().to_owned()),
                        key: Some(key),
                        message: e.message().map(str::to_owned),
                        ..Default::default()
                    });
                }
            }
        }
        // The request's log line and metrics: applied only if every key was.
        let outcome = first_refusal.unwrap_or("applied");
        note(&req, |t| t.outcome = Some(outcome));
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: (!deleted.is_empty()).then_some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    /// A fenced tombstone for `scope` under `presented`: its version and
    /// the token text the answer carries.
    async fn delete_fenced<T>(
        &self,
        req: &S3Request<T>,
        scope: String,
        presented: SignedTokenText,
    ) -> S3Result<(u64, String)> {
        let write = write_request(&scope, presented, &req.headers, false)?;
        note(req, |t| t.epoch = Some(write.request.token.epoch));
        let (outcome, _head, write) = decide_early(&self.core, write, false)
            .await
            .map_err(|f| failure(&f))?;
        if let Some((e, outcome)) = early_stop(&outcome) {
            note(req, |t| t.outcome = Some(outcome));
            return Err(e);
        }
        let fence = write.fence.clone();
        let object = self
            .core
            .work(false, move |store| {
                store.stage(&scope, Kind::Tombstone, &fence)
            })
            .await
            .map_err(|f| failure(&f))?;
        let meta = Meta::tombstone(write.request.op_id.clone());
        answer_publish(&self.core, req, &write, object, meta).await
    }
}

/// One header's value, if sent once.
fn one_header<'a>(headers: &'a HeaderMap, name: &str) -> S3Result<Option<&'a str>> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(error(
            S3ErrorCode::InvalidArgument,
            format!("more than one {name} header"),
        ));
    }
    value.to_str().map(Some).map_err(|_| {
        error(
            S3ErrorCode::InvalidArgument,
            format!("{name} must be visible ASCII"),
        )
    })
}

/// The fencing token: the `Fence-Token` header, or `x-amz-meta-fence-token`
/// (what every SDK can set without hooks); both must agree if both are sent.
pub(super) fn fence_token(
    headers: &HeaderMap,
    metadata: Option<&Metadata>,
) -> S3Result<SignedTokenText> {
    let header = one_header(headers, "fence-token")?;
    let meta = metadata
        .and_then(|m| m.get("fence-token"))
        .map(String::as_str);
    let text = match (header, meta) {
        (Some(h), Some(m)) if h.trim() != m.trim() => {
            return Err(error(
                S3ErrorCode::InvalidArgument,
                "Fence-Token and x-amz-meta-fence-token differ",
            ));
        }
        (Some(t), _) | (None, Some(t)) => t,
        (None, None) => return Err(missing_token()),
    };
    text.trim().parse::<SignedTokenText>().map_err(|_| {
        error(
            S3ErrorCode::InvalidArgument,
            "Fence-Token must be EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER, signed: TOKEN~KEY-ID~LEASE~TAG",
        )
    })
}

/// The fenced request of a write. Guarded writes (an Idempotency-Key or a
/// precondition) may repeat a grant's token; others may not (design §3).
pub(super) fn write_request(
    scope: &str,
    presented: SignedTokenText,
    headers: &HeaderMap,
    guarded: bool,
) -> S3Result<Write> {
    let op_id = match one_header(headers, "idempotency-key")? {
        None => None,
        Some(s) if !s.is_empty() && s.len() <= MAX_OP_ID_BYTES => Some(s.to_owned()),
        Some(_) => {
            return Err(error(
                S3ErrorCode::InvalidArgument,
                "Idempotency-Key must be 1 to 256 bytes of visible ASCII",
            ));
        }
    };
    Ok(Write::new(
        scope,
        presented,
        op_id,
        guarded,
        WriteConditions::default(),
    ))
}

pub(super) fn content_type(value: Option<String>) -> S3Result<String> {
    match value {
        None => Ok(DEFAULT_TYPE.to_owned()),
        Some(t) if !t.is_empty() && t.len() <= MAX_CONTENT_TYPE => Ok(t),
        Some(_) => Err(error(
            S3ErrorCode::InvalidArgument,
            "Content-Type must be 1 to 256 bytes",
        )),
    }
}

/// S3's bound on user metadata: keys and values together.
const MAX_METADATA: usize = 2048;

/// The `x-amz-meta-*` a writer sent, but its token (the token is the
/// object's own fact, served from its name), as the JSON object kept with
/// the object; `None` if there are none. Over 2 KiB is `MetadataTooLarge`,
/// as in S3.
pub(super) fn user_metadata(metadata: Option<&Metadata>) -> S3Result<Option<String>> {
    let kept: BTreeMap<&str, &str> = metadata
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != "fence-token")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if kept.is_empty() {
        return Ok(None);
    }
    let size: usize = kept.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_METADATA {
        return Err(error(
            S3ErrorCode::MetadataTooLarge,
            "user metadata (x-amz-meta-*) is over 2 KiB",
        ));
    }
    serde_json::to_string(&kept)
        .map(Some)
        .map_err(|e| error(S3ErrorCode::InternalError, format!("{e}")))
}

/// What a publish came to, as S3 answers it: the version and token, or
/// the error (with the metrics' outcome recorded).
pub(super) async fn answer_publish<T>(
    core: &Core,
    req: &S3Request<T>,
    write: &Write,
    object: ObjectId,
    meta: Meta,
) -> S3Result<(u64, String)> {
    match publish_fenced(core, write, object, meta).await {
        Published::Applied { version, highest } => {
            note(req, |t| t.outcome = Some("applied"));
            Ok((version, token_text(highest)))
        }
        Published::Duplicate { version, reused } => {
            if reused {
                note(req, |t| t.outcome = Some("duplicate"));
                return Err(fence_error(
                    "IdempotencyKeyReused",
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!(
                        "this Idempotency-Key was applied (version {version}) with a different body; nothing was changed"
                    ),
                ));
            }
            note(req, |t| t.outcome = Some("duplicate"));
            Ok((version, write.fence.clone()))
        }
        Published::Rejected(r) => {
            let (e, outcome) = rejected(&r);
            note(req, |t| t.outcome = Some(outcome));
            Err(e)
        }
        Published::CommitUnknown(e) => {
            tracing::warn!(error = %e, key = %write.request.scope, "S3 commit outcome unknown");
            Err(fence_error(
                "CommitUnknown",
                StatusCode::SERVICE_UNAVAILABLE,
                "the database connection failed while the publish was committing: it may or may not have been published; retry with the same Fence-Token and Idempotency-Key, or read the key before deciding".into(),
            ))
        }
        Published::Failed(f) => Err(failure(&f)),
    }
}
