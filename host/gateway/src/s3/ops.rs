//! The S3 operations, over the gateway's store and blobs. A write is the
//! `/objects` pipeline (early check → stage → stream the body into a new
//! blob → the fenced publish, which decides again), with S3's spelling:
//! the token from `Fence-Token` or `x-amz-meta-fence-token`, MD5 ETags,
//! the scope's version as `x-amz-version-id`, S3 XML errors.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::SystemTime;

use base64::Engine;
use bytes::Bytes;
use fencecheck::{
    CheckError, Decision, MAX_OP_ID_BYTES, MAX_SCOPE_BYTES, Policy, Request, SignedCheckError,
    SignedOutcome, SignedTokenText,
};
use fencecheck_sqlite::{ObjectId, Rejection};
use http::{HeaderMap, HeaderValue, StatusCode};
use md5::{Digest, Md5};
use s3s::checksum::ChecksumHasher;
use s3s::dto::{
    AbortMultipartUploadInput, AbortMultipartUploadOutput, CompleteMultipartUploadInput,
    CompleteMultipartUploadOutput, CreateMultipartUploadInput, CreateMultipartUploadOutput,
    ListMultipartUploadsInput, ListMultipartUploadsOutput, ListPartsInput, ListPartsOutput,
    UploadPartInput, UploadPartOutput,
};
use s3s::dto::{
    Bucket, Checksum, ChecksumAlgorithm, CommonPrefix, DeleteObjectInput, DeleteObjectOutput, ETag,
    ETagCondition, GetBucketLocationInput, GetBucketLocationOutput, GetObjectInput,
    GetObjectOutput, HeadBucketInput, HeadBucketOutput, HeadObjectInput, HeadObjectOutput,
    ListBucketsInput, ListBucketsOutput, ListObjectsInput, ListObjectsOutput, ListObjectsV2Input,
    ListObjectsV2Output, Metadata, Object, ObjectStorageClass, PutObjectInput, PutObjectOutput,
    StreamingBlob, Timestamp,
};
use s3s::dto::{
    CopyObjectInput, CopyObjectOutput, CopyObjectResult, CopySource, DeleteObjectsInput,
    DeleteObjectsOutput, DeletedObject, MetadataDirective, UploadPartCopyInput,
    UploadPartCopyOutput,
};
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use tokio::sync::mpsc;

use super::{Tallied, error};
use crate::auth::{Principal, Right};
use crate::blobs::Written;
use crate::http::conditional::WriteConditions;
use crate::http::objects::{Published, Write, cleanup, decide_early, publish_fenced};
use crate::http::reply::token_text;
use crate::http::{Core, Failure};
use crate::key::check_decoded;
use crate::store::{Current, Kind, Meta, Store};

pub(super) const DEFAULT_TYPE: &str = "application/octet-stream";
const MAX_CONTENT_TYPE: usize = 256;
/// Largest page of a listing (S3's own bound).
pub(super) const LIST_MAX: usize = 1000;

/// The S3 operations of one gateway.
#[derive(Clone)]
pub(crate) struct Objects {
    pub(super) core: Arc<Core>,
    pub(super) buckets: Arc<[String]>,
}

impl Objects {
    pub fn new(core: Arc<Core>, buckets: Arc<[String]>) -> Self {
        Self { core, buckets }
    }

    /// The principal that signed `req` (s3s verified the signature).
    pub(super) fn principal<T>(&self, req: &S3Request<T>) -> S3Result<Arc<Principal>> {
        // Every operation starts here.
        note(req, |t| t.began = true);
        let Some(credentials) = req.credentials.as_ref() else {
            return Err(error(
                S3ErrorCode::AccessDenied,
                "sign the request (AWS Signature V4)",
            ));
        };
        let principal = self
            .core
            .auth
            .s3_key(&credentials.access_key)
            .map(|(p, _)| p)
            // Reloaded away between the signature check and now.
            .ok_or_else(|| {
                error(
                    S3ErrorCode::InvalidAccessKeyId,
                    "the access key id is not known",
                )
            })?;
        note(req, |t| t.principal = Some(principal.name.clone()));
        Ok(principal)
    }

    /// A write's fenced key, once its signer holds `write` on it (`op`:
    /// the metrics' operation label).
    pub(super) fn writer<T>(
        &self,
        req: &S3Request<T>,
        op: &'static str,
        bucket: &str,
        key: &str,
    ) -> S3Result<String> {
        note(req, |t| t.op = Some(op));
        let principal = self.principal(req)?;
        let scope = self.scope(bucket, key)?;
        Self::authorize(&principal, Right::Write, &scope)?;
        Ok(scope)
    }

    /// Refuse unless `principal` holds `right` on `scope`.
    pub(super) fn authorize(principal: &Principal, right: Right, scope: &str) -> S3Result<()> {
        if principal.may(right, scope) {
            return Ok(());
        }
        Err(error(
            S3ErrorCode::AccessDenied,
            format!(
                "principal {:?} has no {} right on this key",
                principal.name,
                right.name()
            ),
        ))
    }

    pub(super) fn bucket(&self, bucket: &str) -> S3Result<()> {
        if self.buckets.iter().any(|b| b == bucket) {
            Ok(())
        } else {
            Err(error(
                S3ErrorCode::NoSuchBucket,
                "not a bucket of this gateway (--bucket)",
            ))
        }
    }

    /// The fenced key of `bucket`/`key`: the rules of `/objects` keys.
    pub(super) fn scope(&self, bucket: &str, key: &str) -> S3Result<String> {
        self.bucket(bucket)?;
        check_decoded(key).map_err(|e| {
            let code = if key.len() > MAX_SCOPE_BYTES {
                S3ErrorCode::KeyTooLongError
            } else {
                S3ErrorCode::InvalidArgument
            };
            error(code, e.to_string())
        })?;
        let scope = format!("{bucket}/{key}");
        if scope.len() > MAX_SCOPE_BYTES {
            return Err(error(
                S3ErrorCode::KeyTooLongError,
                "bucket/key is over 1024 bytes",
            ));
        }
        Ok(scope)
    }

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
    async fn read<T>(
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
}

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

/// Record facts for the log line and the metrics.
pub(super) fn note<T>(req: &S3Request<T>, f: impl FnOnce(&mut super::Tally)) {
    if let Some(mut t) = req.extensions.get::<Tallied>().and_then(|t| t.lock().ok()) {
        f(&mut t);
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

fn matches(condition: &ETagCondition, tag: &str) -> bool {
    match condition.as_etag() {
        None => true,
        Some(etag) => etag.value() == tag,
    }
}

pub(super) fn failure(f: &Failure) -> S3Error {
    match f {
        Failure::Overloaded => {
            let mut e = error(
                S3ErrorCode::SlowDown,
                "no storage slot free (--max-in-flight); retry",
            );
            e.set_status_code(StatusCode::SERVICE_UNAVAILABLE);
            e
        }
        Failure::Store(e) => storage(e),
    }
}

pub(super) fn storage(e: &crate::error::Error) -> S3Error {
    tracing::warn!(error = %e, "S3 request: storage failed");
    let mut out = error(
        S3ErrorCode::ServiceUnavailable,
        format!("storage is unavailable: {e}"),
    );
    out.set_status_code(StatusCode::SERVICE_UNAVAILABLE);
    out
}

/// An S3 error of the fence's own, with its status.
fn fence_error(code: &'static str, status: StatusCode, message: String) -> S3Error {
    let mut e = S3Error::with_message(S3ErrorCode::Custom(code.into()), message);
    e.set_status_code(status);
    e
}

pub(super) fn missing_token() -> S3Error {
    fence_error(
        "MissingFenceToken",
        StatusCode::PRECONDITION_REQUIRED,
        "a Fence-Token (or x-amz-meta-fence-token) header is required".into(),
    )
}

fn stale(presented: fencecheck::Token, highest: fencecheck::Token) -> S3Error {
    let (presented, highest) = (token_text(presented), token_text(highest));
    let mut e = fence_error(
        "StaleFence",
        StatusCode::CONFLICT,
        format!(
            "a newer fencing token has written this key (presented {presented}, highest {highest}); stop, do not retry under this token"
        ),
    );
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("fence-token-presented", presented),
        ("fence-token-highest", highest),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    }
    e.set_headers(headers);
    e
}

fn refused(e: &CheckError) -> S3Error {
    match e {
        CheckError::InvalidRequest(_) | CheckError::ForeignAuthority { .. } => {
            error(S3ErrorCode::InvalidArgument, format!("{e:?}"))
        }
        // The stored state is unusable: fail closed, not retryable.
        _ => fence_error(
            "FenceStateRefused",
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{e:?}"),
        ),
    }
}

/// The answer to a decision that did not apply (never a duplicate).
pub(super) fn rejected(r: &Rejection) -> (S3Error, &'static str) {
    match r {
        Rejection::StaleFence { presented, highest } => {
            (stale(*presented, *highest), "stale-fence")
        }
        Rejection::VersionConflict { .. } | Rejection::Duplicate { .. } => (
            error(
                S3ErrorCode::PreconditionFailed,
                "the precondition (If-Match / If-None-Match) no longer holds",
            ),
            "version-conflict",
        ),
        Rejection::Refused(e) => (refused(e), "refused"),
        Rejection::Unauthenticated(f) => (
            fence_error(
                "FenceUnauthenticated",
                StatusCode::FORBIDDEN,
                format!(
                    "this key requires a Fence-Token signed by its authority ({})",
                    f.name()
                ),
            ),
            "unauthenticated",
        ),
        Rejection::InvalidKeys(p) => (
            fence_error(
                "InvalidFenceKeys",
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the key's signing keys are unusable: {p:?}"),
            ),
            "invalid-keys",
        ),
    }
}

/// The early check's verdict, if it stops the write.
pub(super) fn early_stop(outcome: &SignedOutcome) -> Option<(S3Error, &'static str)> {
    match outcome {
        Ok(Decision::StaleFence { presented, highest }) => {
            Some((stale(*presented, *highest), "stale-fence"))
        }
        Err(SignedCheckError::Check(e)) => Some((refused(e), "refused")),
        Err(SignedCheckError::Unauthenticated(f)) => {
            Some(rejected(&Rejection::Unauthenticated(*f)))
        }
        Err(SignedCheckError::InvalidKeys(p)) => Some(rejected(&Rejection::InvalidKeys(*p))),
        _ => None,
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
    let policy = if op_id.is_some() || guarded {
        Policy::AllowEqual
    } else {
        Policy::Strict
    };
    let mut request = Request::new(scope, presented.token, policy);
    request.signature = presented.signature;
    if let Some(op_id) = op_id {
        request = request.with_op_id(op_id);
    }
    Ok(Write {
        fence: token_text(request.token),
        request,
        conditions: WriteConditions::default(),
    })
}

/// The checksums a PutObject or UploadPart input declares.
macro_rules! declared {
    ($input:expr) => {
        $crate::s3::ops::Declared::new(
            $input.checksum_algorithm.clone(),
            [
                &$input.checksum_crc32,
                &$input.checksum_crc32c,
                &$input.checksum_sha1,
                &$input.checksum_sha256,
                &$input.checksum_crc64nvme,
            ],
        )
    };
}
pub(super) use declared;

/// The `x-amz-copy-source-if-*` conditions of a CopyObject or
/// UploadPartCopy input.
macro_rules! copy_conditions {
    ($input:expr) => {
        $crate::s3::ops::ReadConditions {
            if_match: $input.copy_source_if_match.as_ref(),
            if_none_match: $input.copy_source_if_none_match.as_ref(),
            if_modified_since: $input.copy_source_if_modified_since.as_ref(),
            if_unmodified_since: $input.copy_source_if_unmodified_since.as_ref(),
        }
    };
}
pub(super) use copy_conditions;

/// A body taken into a blob: its length and SHA-256, MD5, checksums.
pub(super) struct Received {
    pub written: Written,
    pub md5: [u8; 16],
    pub checksum: Checksum,
}

/// The checksums a request declares (headers, or trailers after the body).
#[derive(Default)]
pub(super) struct Declared {
    pub algorithm: Option<ChecksumAlgorithm>,
    pub checksum: Checksum,
}

impl Declared {
    /// From a request's algorithm and its CRC32, CRC32C, SHA1, SHA256 and
    /// CRC64NVME header values.
    pub fn new(algorithm: Option<ChecksumAlgorithm>, values: [&Option<String>; 5]) -> Self {
        let [crc32, crc32c, sha1, sha256, crc64nvme] = values.map(Clone::clone);
        Self {
            algorithm,
            checksum: Checksum {
                checksum_crc32: crc32,
                checksum_crc32c: crc32c,
                checksum_sha1: sha1,
                checksum_sha256: sha256,
                checksum_crc64nvme: crc64nvme,
                ..Default::default()
            },
        }
    }

    fn hasher(&self) -> S3Result<ChecksumHasher> {
        let mut h = ChecksumHasher::default();
        let c = &self.checksum;
        if c.checksum_crc32.is_some() {
            h.crc32 = Some(Default::default());
        }
        if c.checksum_crc32c.is_some() {
            h.crc32c = Some(Default::default());
        }
        if c.checksum_sha1.is_some() {
            h.sha1 = Some(Default::default());
        }
        if c.checksum_sha256.is_some() {
            h.sha256 = Some(Default::default());
        }
        if c.checksum_crc64nvme.is_some() {
            h.crc64nvme = Some(Default::default());
        }
        if let Some(alg) = &self.algorithm {
            match alg.as_str() {
                ChecksumAlgorithm::CRC32 => h.crc32 = Some(Default::default()),
                ChecksumAlgorithm::CRC32C => h.crc32c = Some(Default::default()),
                ChecksumAlgorithm::SHA1 => h.sha1 = Some(Default::default()),
                ChecksumAlgorithm::SHA256 => h.sha256 = Some(Default::default()),
                ChecksumAlgorithm::CRC64NVME => h.crc64nvme = Some(Default::default()),
                other => {
                    return Err(error(
                        S3ErrorCode::InvalidArgument,
                        format!("checksum algorithm {other} is not supported"),
                    ));
                }
            }
        }
        Ok(h)
    }

    /// Values that came as trailers of an aws-chunked body.
    fn add_trailers(&mut self, trailers: Option<&s3s::TrailingHeaders>) -> S3Result<()> {
        let Some(trailers) = trailers.and_then(|t| t.take()) else {
            return Ok(());
        };
        let c = &mut self.checksum;
        for (name, slot) in [
            ("x-amz-checksum-crc32", &mut c.checksum_crc32),
            ("x-amz-checksum-crc32c", &mut c.checksum_crc32c),
            ("x-amz-checksum-sha1", &mut c.checksum_sha1),
            ("x-amz-checksum-sha256", &mut c.checksum_sha256),
            ("x-amz-checksum-crc64nvme", &mut c.checksum_crc64nvme),
        ] {
            if let Some(v) = trailers.get(name) {
                let v = v.to_str().map_err(|_| {
                    error(
                        S3ErrorCode::InvalidArgument,
                        format!("trailer {name} is not ASCII"),
                    )
                })?;
                *slot = Some(v.to_owned());
            }
        }
        Ok(())
    }

    /// Every declared value must be the computed one.
    fn verify(&self, computed: &Checksum) -> S3Result<()> {
        let d = &self.checksum;
        for (name, declared, got) in [
            ("CRC32", &d.checksum_crc32, &computed.checksum_crc32),
            ("CRC32C", &d.checksum_crc32c, &computed.checksum_crc32c),
            ("SHA1", &d.checksum_sha1, &computed.checksum_sha1),
            ("SHA256", &d.checksum_sha256, &computed.checksum_sha256),
            (
                "CRC64NVME",
                &d.checksum_crc64nvme,
                &computed.checksum_crc64nvme,
            ),
        ] {
            if let Some(declared) = declared
                && got.as_ref() != Some(declared)
            {
                return Err(error(
                    S3ErrorCode::BadDigest,
                    format!("the {name} checksum of the body differs from the one sent"),
                ));
            }
        }
        Ok(())
    }
}

/// The most bytes a body may have, and the limit that says so (named in
/// the refusal, so the client's operator knows which flag to raise).
#[derive(Clone, Copy, Debug)]
pub(super) struct Bound {
    pub bytes: u64,
    pub what: &'static str,
}

impl Bound {
    /// `--max-body`: every PutObject and every part.
    pub fn body(core: &Core) -> Self {
        Bound {
            bytes: core.config.max_body,
            what: "the body is over --max-body",
        }
    }

    fn refused(self) -> S3Error {
        error(S3ErrorCode::EntityTooLarge, self.what)
    }
}

/// The SHA-256 a request's `x-amz-content-sha256` declares for its body,
/// if it is one (not `UNSIGNED-PAYLOAD` or a `STREAMING-…` mode): s3s
/// checks the body against it as it is read, and fails the read if it
/// differs.
pub(super) fn declared_sha256(headers: &HeaderMap) -> Option<[u8; 32]> {
    let text = headers.get("x-amz-content-sha256")?.to_str().ok()?;
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Stream `body` into `object`'s blob, bounded by `bound`, hashing on
/// the way (MD5; SHA-256 only where the client declared none); then check
/// Content-MD5, the checksums and the length. On any failure the caller
/// drops the object.
async fn receive(
    core: &Core,
    object: ObjectId,
    body: StreamingBlob,
    (declared_length, content_md5, content_sha256): (Option<i64>, Option<&str>, Option<[u8; 32]>),
    bound: Bound,
    mut declared: Declared,
    trailers: Option<&s3s::TrailingHeaders>,
) -> S3Result<Received> {
    use futures_util::StreamExt;
    let max = bound.bytes;
    let length = declared_length.and_then(|n| u64::try_from(n).ok());
    if length.is_some_and(|n| n > max) {
        return Err(bound.refused());
    }
    let mut hasher = declared.hasher()?;
    let mut md5 = Md5::new();
    let writer = match (length, content_sha256) {
        (Some(length), Some(sha256)) => core.blobs.create_declared(object, length, sha256).await,
        _ => core.blobs.create(object, length).await,
    };
    let mut writer = writer.map_err(|e| storage(&e))?;
    let mut body = body;
    let mut taken = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk: Bytes = chunk.map_err(|e| {
            error(
                S3ErrorCode::IncompleteBody,
                format!("the request body could not be read: {e}"),
            )
        })?;
        taken += chunk.len() as u64;
        if taken > max {
            return Err(bound.refused());
        }
        md5.update(&chunk);
        hasher.update(&chunk);
        writer.write(chunk).await.map_err(|e| storage(&e))?;
    }
    if length.is_some_and(|n| n != taken) {
        return Err(error(
            S3ErrorCode::IncompleteBody,
            "the body's length differs from Content-Length",
        ));
    }
    let md5: [u8; 16] = md5.finalize().into();
    if let Some(sent) = content_md5 {
        let sent = base64::engine::general_purpose::STANDARD
            .decode(sent.trim())
            .map_err(|_| error(S3ErrorCode::InvalidDigest, "Content-MD5 is not base64"))?;
        if sent[..] != md5[..] {
            return Err(error(
                S3ErrorCode::BadDigest,
                "the Content-MD5 you specified did not match what we received",
            ));
        }
    }
    declared.add_trailers(trailers)?;
    let checksum = hasher.finalize();
    declared.verify(&checksum)?;
    let written = core.blobs.finish(writer).await.map_err(|e| storage(&e))?;
    Ok(Received {
        written,
        md5,
        checksum,
    })
}

/// [`receive`] into a staged object, which is dropped if anything fails
/// (no body included). `declared`: Content-Length and Content-MD5.
pub(super) async fn receive_staged(
    core: &Core,
    object: ObjectId,
    body: Option<StreamingBlob>,
    declared_facts: (Option<i64>, Option<&str>, Option<[u8; 32]>),
    bound: Bound,
    checksums: Declared,
    trailers: Option<&s3s::TrailingHeaders>,
) -> S3Result<Received> {
    let result = match body {
        Some(body) => {
            receive(
                core,
                object,
                body,
                declared_facts,
                bound,
                checksums,
                trailers,
            )
            .await
        }
        None => Err(error(S3ErrorCode::IncompleteBody, "no body")),
    };
    if result.is_err() {
        cleanup(core, object).await;
    }
    result
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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

fn with_fence<T>(output: T, fence: &str) -> S3Response<T> {
    let mut response = S3Response::new(output);
    if let Ok(v) = HeaderValue::from_str(fence) {
        response.headers.insert("fence-token", v);
    }
    response
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

/// The continuation token of a listing: where the next page starts.
/// A listing's request, checked: a served bucket, a prefix that fits in
/// a key, the signer's `right` on every key under it.
pub(super) struct Listing {
    /// `bucket/`: every scope of the bucket starts with it.
    pub base: String,
    /// The request's prefix (within the bucket).
    pub prefix: String,
    /// `base` + `prefix`: the scopes listed start with it.
    pub full_prefix: String,
    /// Entries per page (`max-keys`, `max-uploads`; at most 1,000).
    pub max: usize,
    /// The delimiter, if not empty.
    pub delimiter: Option<String>,
}

impl Objects {
    pub(super) fn listing<T>(
        &self,
        req: &S3Request<T>,
        right: Right,
        bucket: &str,
        prefix: Option<&str>,
        max: Option<i32>,
        delimiter: Option<&str>,
    ) -> S3Result<Listing> {
        note(req, |t| t.op = Some("list"));
        let principal = self.principal(req)?;
        self.bucket(bucket)?;
        let prefix = prefix.unwrap_or_default().to_owned();
        let base = format!("{bucket}/");
        let full_prefix = format!("{base}{prefix}");
        if full_prefix.len() > MAX_SCOPE_BYTES {
            return Err(error(
                S3ErrorCode::InvalidArgument,
                "prefix is over 1024 bytes",
            ));
        }
        Self::authorize(&principal, right, &full_prefix)?;
        Ok(Listing {
            base,
            prefix,
            full_prefix,
            max: usize::try_from(max.unwrap_or(1000).max(0))
                .unwrap_or(0)
                .min(LIST_MAX),
            delimiter: delimiter.filter(|d| !d.is_empty()).map(str::to_owned),
        })
    }
}

/// The common prefix `key` rolls up into: up to and including the first
/// `delimiter` after the listing's prefix (`prefix_len` bytes), if any.
pub(super) fn common_prefix(
    key: &str,
    prefix_len: usize,
    delimiter: Option<&str>,
) -> Option<String> {
    let d = delimiter?;
    let rest = key.get(prefix_len..)?;
    rest.find(d)
        .and_then(|i| key.get(..prefix_len + i + d.len()))
        .map(str::to_owned)
}

fn continuation(after: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(after.as_bytes())
}

#[async_trait::async_trait]
impl S3 for Objects {
    async fn put_object(
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

    async fn get_object(
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

    async fn head_object(
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

    /// A fenced write of the destination whose bytes are the source's
    /// visible object (read right on the source, write right on the
    /// destination). The token is the copier's: `Fence-Token`, or with
    /// `MetadataDirective: REPLACE` the new `x-amz-meta-fence-token`; never
    /// the source's metadata, which holds its own writer's token.
    async fn copy_object(
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

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        Objects::upload_part_copy(self, req).await
    }

    async fn delete_object(
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
    async fn delete_objects(
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

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = &req.input;
        let Listing {
            base,
            prefix,
            full_prefix,
            max: max_keys,
            delimiter,
        } = self.listing(
            &req,
            Right::Read,
            &input.bucket,
            input.prefix.as_deref(),
            input.max_keys,
            input.delimiter.as_deref(),
        )?;
        // Where to start: the continuation token (a scope, base64), else
        // start-after, else the prefix.
        let mut after = match (&input.continuation_token, &input.start_after) {
            (Some(token), _) => {
                let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .decode(token)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .filter(|s| s.starts_with(&base))
                    .ok_or_else(|| {
                        error(
                            S3ErrorCode::InvalidArgument,
                            "the continuation token is not valid",
                        )
                    })?;
                Some(bytes)
            }
            (None, Some(start)) => Some(format!("{base}{start}")),
            (None, None) => None,
        };
        let mut contents = Vec::new();
        let mut prefixes: Vec<CommonPrefix> = Vec::new();
        let mut truncated = false;
        // (max-keys 0: an empty, untruncated page.)
        'pages: loop {
            if max_keys == 0 {
                break;
            }
            let (p, a) = (full_prefix.clone(), after.clone());
            let rows = self
                .core
                .work(true, move |s| s.list(&p, a.as_deref(), LIST_MAX))
                .await
                .map_err(|f| failure(&f))?;
            let full = rows.len() == LIST_MAX;
            for row in rows {
                let key = row.key.get(base.len()..).unwrap_or_default().to_owned();
                let common = common_prefix(&key, prefix.len(), delimiter.as_deref());
                if contents.len() + prefixes.len() == max_keys {
                    truncated = true;
                    break 'pages;
                }
                match common {
                    Some(cp) => {
                        // Every key under the common prefix sorts before
                        // this: skip them all with one new query.
                        after = Some(format!("{base}{cp}\u{10FFFF}"));
                        prefixes.push(CommonPrefix { prefix: Some(cp) });
                        continue 'pages;
                    }
                    None => {
                        after = Some(row.key.clone());
                        contents.push(Object {
                            key: Some(key),
                            e_tag: Some(ETag::Strong(
                                row.etag.clone().unwrap_or_else(|| row.version.to_string()),
                            )),
                            last_modified: Some(Timestamp::from(row.published_at)),
                            size: row.length.and_then(|n| i64::try_from(n).ok()),
                            storage_class: Some(ObjectStorageClass::from_static(
                                ObjectStorageClass::STANDARD,
                            )),
                            ..Default::default()
                        });
                    }
                }
            }
            if !full {
                break;
            }
        }
        note(&req, |t| t.outcome = Some("ok"));
        let count = contents.len() + prefixes.len();
        let output = ListObjectsV2Output {
            name: Some(input.bucket.clone()),
            prefix: Some(prefix),
            delimiter,
            max_keys: Some(i32::try_from(max_keys).unwrap_or(1000)),
            key_count: Some(i32::try_from(count).unwrap_or(i32::MAX)),
            is_truncated: Some(truncated),
            next_continuation_token: if truncated {
                after.as_deref().map(continuation)
            } else {
                None
            },
            continuation_token: input.continuation_token.clone(),
            start_after: input.start_after.clone(),
            contents: Some(contents),
            common_prefixes: if prefixes.is_empty() {
                None
            } else {
                Some(prefixes)
            },
            ..Default::default()
        };
        Ok(S3Response::new(output))
    }

    /// ListObjects, version 1 (boto3's resource collections and older
    /// tools use it): the version 2 listing with `marker` as its
    /// start-after; `NextMarker` (sent, as S3 does, when there is a
    /// delimiter) is the page's last key or common prefix, and a marker
    /// that is a common prefix skips every key under it.
    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let marker = req.input.marker.clone();
        let v2 = req.map_input(|i| {
            let start_after = i.marker.map(|m| match i.delimiter.as_deref() {
                Some(d) if !d.is_empty() && m.ends_with(d) => format!("{m}\u{10FFFF}"),
                _ => m,
            });
            ListObjectsV2Input {
                bucket: i.bucket,
                delimiter: i.delimiter,
                max_keys: i.max_keys,
                prefix: i.prefix,
                start_after,
                ..Default::default()
            }
        });
        let page = self.list_objects_v2(v2).await?.output;
        let last_key = page
            .contents
            .as_ref()
            .and_then(|c| c.last())
            .and_then(|o| o.key.clone());
        let last_prefix = page
            .common_prefixes
            .as_ref()
            .and_then(|p| p.last())
            .and_then(|p| p.prefix.clone());
        let next_marker = (page.is_truncated == Some(true) && page.delimiter.is_some())
            .then(|| last_key.into_iter().chain(last_prefix).max())
            .flatten();
        Ok(S3Response::new(ListObjectsOutput {
            name: page.name,
            prefix: page.prefix,
            marker,
            max_keys: page.max_keys,
            is_truncated: page.is_truncated,
            contents: page.contents,
            common_prefixes: page.common_prefixes,
            delimiter: page.delimiter,
            next_marker,
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        self.create_upload(req).await
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        Objects::upload_part(self, req).await
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        self.complete_upload(req).await
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        self.abort_upload(req).await
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        Objects::list_parts(self, req).await
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        self.list_uploads(req).await
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.principal(&req)?;
        self.bucket(&req.input.bucket)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.principal(&req)?;
        let buckets = self
            .buckets
            .iter()
            .map(|name| Bucket {
                name: Some(name.clone()),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.principal(&req)?;
        self.bucket(&req.input.bucket)?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }
}
