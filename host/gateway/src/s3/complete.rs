//! CompleteMultipartUpload. Everything that can be checked before the
//! copy is, each with its own status: the upload, the token (the one the
//! upload began under unless the request sends one), the parts named
//! ([`choose_parts`]: S3's order, ETag and size rules), `--max-upload`.
//! Then the parts are joined into a new blob (composed inside an S3
//! bucket, else copied) and published fenced: a stale Complete makes
//! nothing visible. A large one answers 200 at once and sends whitespace
//! until its result, as S3 does. A Complete retried after its answer was
//! lost gets the answer it had.

use md5::{Digest, Md5};
use s3s::dto::{CompleteMultipartUploadInput, CompleteMultipartUploadOutput, ETag};
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result};

use super::errors::{early_stop, error, failure, storage};
use super::intake::hex;
use super::ops::Objects;
use super::write::{answer_publish, fence_token, write_request};
use super::{DEFAULT_TYPE, note};
use crate::blobs::Composed;
use crate::http::publish::{cleanup, decide_early};
use crate::store::{Kind, Meta, Part};
use fencecheck_sqlite::ObjectId;

/// S3's least part size (all but the last part).
const MIN_PART: u64 = 5 << 20;

impl Objects {
    /// What upload `id` of `scope` was published as, if a Complete
    /// published it within `--retention`.
    async fn completed_before(&self, id: &str, scope: &str) -> S3Result<Option<(u64, String)>> {
        let Some(id) = id
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .map(ObjectId::from_raw)
        else {
            return Ok(None);
        };
        let scope = scope.to_owned();
        self.core
            .work(true, move |s| s.completed(id, &scope))
            .await
            .map_err(|f| failure(&f))
    }

    pub(super) async fn complete_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let scope = self.writer(&req, "put", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        if input.if_match.is_some() || input.if_none_match.is_some() {
            // Refused rather than ignored: a condition nobody checks is a
            // promise broken.
            return Err(error(
                S3ErrorCode::NotImplemented,
                "If-Match / If-None-Match on CompleteMultipartUpload is not supported",
            ));
        }
        let (upload, begun) = match self.upload_of(&input.upload_id, &scope).await {
            Ok(found) => found,
            Err(e) => {
                // A Complete retried after its answer was lost (SDKs retry
                // on a cut connection): the answer it had, not NoSuchUpload
                // for an object that was published.
                return match self.completed_before(&input.upload_id, &scope).await? {
                    Some((version, etag)) => {
                        note(&req, |t| t.outcome = Some("duplicate"));
                        Ok(S3Response::new(CompleteMultipartUploadOutput {
                            bucket: Some(input.bucket.clone()),
                            key: Some(input.key.clone()),
                            e_tag: Some(ETag::Strong(etag)),
                            version_id: Some(version.to_string()),
                            ..Default::default()
                        }))
                    }
                    None => Err(e),
                };
            }
        };
        // The token: Fence-Token on Complete, else the one the upload began
        // under (checked again now: a newer writer may have come since).
        let presented = match fence_token(&req.headers, None) {
            Ok(t) => t,
            Err(_) => begun.fence.parse().map_err(|_| {
                error(
                    S3ErrorCode::InternalError,
                    "the upload's recorded token is unreadable",
                )
            })?,
        };
        let mut write = write_request(&scope, presented, &req.headers, false)?;
        if write.request.op_id.is_none()
            && let Some(op_id) = begun.op_id.clone()
        {
            // A repeated Complete of one upload is then a duplicate, not
            // a stale write (the token may repeat under an op-id).
            write.request.op_id = Some(op_id);
            write.request.policy = fencecheck::Policy::AllowEqual;
        }
        note(&req, |t| t.epoch = Some(write.request.token.epoch));
        let (outcome, _head, write) = decide_early(&self.core, write, false)
            .await
            .map_err(|f| failure(&f))?;
        if let Some((e, outcome)) = early_stop(&outcome) {
            note(&req, |t| t.outcome = Some(outcome));
            return Err(e);
        }
        let stored = self
            .core
            .work(true, move |s| s.parts(upload))
            .await
            .map_err(|f| failure(&f))?;
        let chosen = choose_parts(input, &stored)?;
        let total: u64 = chosen.iter().map(|p| p.length).sum();
        if total > self.core.config.max_upload {
            return Err(error(
                S3ErrorCode::EntityTooLarge,
                "the upload's parts together are over --max-upload",
            ));
        }
        let mut md5s = Md5::new();
        for part in &chosen {
            let digest = decode_hex(&part.etag).ok_or_else(|| {
                error(
                    S3ErrorCode::InternalError,
                    "a part's recorded MD5 is unreadable",
                )
            })?;
            md5s.update(digest);
        }
        let etag = format!("{}-{}", hex(&md5s.finalize()), chosen.len());
        let (bucket, key) = (input.bucket.clone(), input.key.clone());
        let finish = Finish {
            objects: self.clone(),
            scope,
            write,
            content_type: begun.content_type.clone(),
            metadata: begun.metadata.clone(),
            upload,
            chosen,
            etag,
        };
        if total >= self.core.config.complete_keepalive {
            // Copying the parts may outlast a client's read timeout (60 s
            // in boto3 and aws-cli): answer 200 now and send whitespace
            // until the result, as S3 does. Every check above still
            // answered with its own status; what the publish decides
            // (a newer writer came during the copy) is an error document
            // in the 200, which SDKs read as an error and retry, and the
            // retry is refused at once with its own status.
            note(&req, |t| t.keep_alive = true);
            let future = async move {
                let done = finish.run(&req).await?;
                Ok(CompleteMultipartUploadOutput {
                    bucket: Some(bucket),
                    key: Some(key),
                    e_tag: Some(ETag::Strong(done.etag)),
                    version_id: Some(done.version.to_string()),
                    ..Default::default()
                })
            };
            return Ok(S3Response::new(CompleteMultipartUploadOutput {
                future: Some(Box::pin(future)),
                ..Default::default()
            }));
        }
        let done = finish.run(&req).await?;
        let mut response = S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(bucket),
            key: Some(key),
            e_tag: Some(ETag::Strong(done.etag)),
            version_id: Some(done.version.to_string()),
            ..Default::default()
        });
        if let Ok(v) = http::HeaderValue::from_str(&done.fence) {
            response.headers.insert("fence-token", v);
        }
        Ok(response)
    }
}

/// The rest of a Complete, once everything that can be checked before
/// the copy has been: concatenate the parts, publish fenced, drop the
/// upload.
struct Finish {
    objects: Objects,
    scope: String,
    write: crate::http::publish::Write,
    content_type: Option<String>,
    metadata: Option<String>,
    upload: ObjectId,
    chosen: Vec<Part>,
    etag: String,
}

/// What a Complete published.
struct Done {
    etag: String,
    version: u64,
    fence: String,
}

impl Finish {
    async fn run(self, req: &S3Request<CompleteMultipartUploadInput>) -> S3Result<Done> {
        let core = &self.objects.core;
        let (fence, s) = (self.write.fence.clone(), self.scope.clone());
        let object = core
            .work(false, move |store| store.stage(&s, Kind::Blob, &fence))
            .await
            .map_err(|f| failure(&f))?;
        let written = match assemble(core, object, &self.chosen).await {
            Ok(w) => w,
            Err(e) => {
                cleanup(core, object).await;
                return Err(e);
            }
        };
        let meta = Meta {
            length: written.length,
            sha256: written.sha256,
            content_type: self.content_type.unwrap_or_else(|| DEFAULT_TYPE.to_owned()),
            op_id: self.write.request.op_id.clone(),
            etag: Some(self.etag.clone()),
            metadata: self.metadata,
        };
        let (version, fence) = answer_publish(core, req, &self.write, object, meta).await?;
        // Published: remember the answer (for a retry whose first answer
        // was lost), then the upload and its parts are done. The record
        // comes first: there is never a moment with neither.
        let (upload, scope, etag) = (self.upload, self.scope.clone(), self.etag.clone());
        if let Err(f) = core
            .work(false, move |s| {
                s.record_completed(upload, &scope, version, &etag)
            })
            .await
        {
            tracing::warn!(upload = upload.get(), error = %failure(&f), "recording a completed upload failed; a retried Complete will be NoSuchUpload");
        }
        self.objects.drop_upload(self.upload).await;
        Ok(Done {
            etag: self.etag,
            version,
            fence,
        })
    }
}

/// The parts Complete names, checked against the stored ones: ascending
/// numbers, each stored with the ETag given, all but the last at least
/// 5 MiB (S3's rules).
fn choose_parts(input: &CompleteMultipartUploadInput, stored: &[Part]) -> S3Result<Vec<Part>> {
    let listed = input
        .multipart_upload
        .as_ref()
        .and_then(|m| m.parts.as_ref())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| error(S3ErrorCode::MalformedXML, "name at least one part"))?;
    let mut chosen: Vec<Part> = Vec::with_capacity(listed.len());
    for given in listed {
        let number = given
            .part_number
            .ok_or_else(|| error(S3ErrorCode::InvalidPart, "a part without a number"))?;
        if chosen.last().is_some_and(|p| p.number >= number) {
            return Err(error(
                S3ErrorCode::InvalidPartOrder,
                "parts must be listed in ascending order",
            ));
        }
        let part = stored.iter().find(|p| p.number == number).ok_or_else(|| {
            error(
                S3ErrorCode::InvalidPart,
                format!("part {number} was not uploaded"),
            )
        })?;
        if given.e_tag.as_ref().is_some_and(|e| e.value() != part.etag) {
            return Err(error(
                S3ErrorCode::InvalidPart,
                format!("part {number}'s ETag is not the uploaded one"),
            ));
        }
        chosen.push(part.clone());
    }
    if let Some(small) = chosen[..chosen.len() - 1]
        .iter()
        .find(|p| p.length < MIN_PART)
    {
        return Err(error(
            S3ErrorCode::EntityTooSmall,
            format!("part {} is under 5 MiB and not the last", small.number),
        ));
    }
    Ok(chosen)
}

/// The parts' blobs, in order, as `object`'s blob: composed inside an S3
/// bucket (no part byte passes through the gateway), else copied.
async fn assemble(
    core: &crate::http::Core,
    object: ObjectId,
    parts: &[Part],
) -> S3Result<crate::blobs::Written> {
    if let [one] = parts
        && one.length < MIN_PART
    {
        // One small part (perhaps empty): copied through, in fewer
        // requests than composing it.
        return concatenate(core, object, parts).await;
    }
    let sources: Vec<(ObjectId, u64)> = parts.iter().map(|p| (p.object, p.length)).collect();
    match core
        .blobs
        .compose(object, &sources)
        .await
        .map_err(|e| storage(&e))?
    {
        None | Some(Composed::TooMany) => concatenate(core, object, parts).await,
        Some(Composed::Gone(i)) => Err(error(
            S3ErrorCode::InvalidPart,
            format!(
                "part {}'s blob is gone (expired?)",
                parts.get(i).map_or(0, |p| p.number)
            ),
        )),
        Some(Composed::Done(length)) => Ok(crate::blobs::Written {
            length,
            sha256: composite_sha256(parts),
        }),
    }
}

/// What stands for a composed object's SHA-256 (which nobody read): the
/// SHA-256 of its parts' MD5s and lengths, in order. It serves what the
/// body hash is for, telling a repeated Idempotency-Key's body from
/// another: the same parts give the same value. (The same bytes cut into
/// other parts, or sent as one PUT, do not: such a repeat is refused as
/// IdempotencyKeyReused, and nothing changes.)
fn composite_sha256(parts: &[Part]) -> [u8; 32] {
    use sha2::Digest as _;
    let mut hash = sha2::Sha256::new();
    hash.update(b"fencecheck composed\n");
    for part in parts {
        hash.update(format!("{} {}\n", part.etag, part.length).as_bytes());
    }
    hash.finalize().into()
}

/// Copy the parts' blobs, in order, into `object`'s blob.
async fn concatenate(
    core: &crate::http::Core,
    object: ObjectId,
    parts: &[Part],
) -> S3Result<crate::blobs::Written> {
    let total: u64 = parts.iter().map(|p| p.length).sum();
    let mut writer = core
        .blobs
        .create(object, Some(total))
        .await
        .map_err(|e| storage(&e))?;
    let mut buf = vec![0u8; 256 << 10];
    for part in parts {
        let Some((mut reader, length)) = core
            .blobs
            .open(part.object, None)
            .await
            .map_err(|e| storage(&e))?
        else {
            return Err(error(
                S3ErrorCode::InvalidPart,
                format!("part {}'s blob is gone (expired?)", part.number),
            ));
        };
        if length != part.length {
            return Err(error(
                S3ErrorCode::InternalError,
                format!("part {}'s blob differs from its record", part.number),
            ));
        }
        while reader.left() > 0 {
            let chunk = reader
                .next(&mut buf)
                .await
                .map_err(|e| storage(&e))?
                .ok_or_else(|| {
                    error(
                        S3ErrorCode::InternalError,
                        format!("part {}'s blob is shorter than recorded", part.number),
                    )
                })?;
            writer.write(chunk).await.map_err(|e| storage(&e))?;
        }
        core.blobs.done(reader).await;
    }
    core.blobs.finish(writer).await.map_err(|e| storage(&e))
}

fn decode_hex(text: &str) -> Option<[u8; 16]> {
    if text.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}
