//! Multipart uploads. Create checks the token early (a stale writer learns
//! it before uploading anything) and stages the upload; each part is a
//! staged blob; Complete concatenates the parts into a new blob and runs
//! the fenced publish, which decides again: a stale Complete makes nothing
//! visible. Abort (or the collector, after `--upload-retention`) drops
//! them all.

use md5::{Digest, Md5};
use s3s::dto::{
    self, AbortMultipartUploadInput, AbortMultipartUploadOutput, CommonPrefix,
    CompleteMultipartUploadInput, CompleteMultipartUploadOutput, CopyPartResult,
    CreateMultipartUploadInput, CreateMultipartUploadOutput, ETag, ListMultipartUploadsInput,
    ListMultipartUploadsOutput, ListPartsInput, ListPartsOutput, MultipartUpload, StorageClass,
    Timestamp, UploadPartCopyInput, UploadPartCopyOutput, UploadPartInput, UploadPartOutput,
};
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result};

use super::error;
use super::ops::{
    Bound, LIST_MAX, Listing, Objects, answer_publish, common_prefix, content_type,
    copy_conditions, copy_source, declared, declared_sha256, early_stop, failure, fence_token, hex,
    note, receive_staged, storage, user_metadata, write_request,
};
use crate::auth::Right;
use crate::blobs::Composed;
use crate::http::objects::{cleanup, decide_early};
use crate::store::{Kind, Meta, Part, Store, Upload};
use fencecheck_sqlite::ObjectId;

/// S3's least part size (all but the last part).
const MIN_PART: u64 = 5 << 20;
/// S3's part numbers.
const MAX_PART_NUMBER: i32 = 10_000;

impl Objects {
    /// The upload `id` names, if it is one of `scope`'s.
    async fn upload_of(&self, id: &str, scope: &str) -> S3Result<(ObjectId, Upload)> {
        let no_such = || {
            error(
                S3ErrorCode::NoSuchUpload,
                "no such upload (completed, aborted or expired)",
            )
        };
        let id = id
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .map(ObjectId::from_raw)
            .ok_or_else(no_such)?;
        let upload = self
            .core
            .work(true, move |s| s.upload(id))
            .await
            .map_err(|f| failure(&f))?
            .filter(|u| u.scope == scope)
            .ok_or_else(no_such)?;
        Ok((id, upload))
    }

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

    /// What part `number` of `upload` may hold: `--max-body`, or what is
    /// left of `--max-upload` once the other part numbers are counted
    /// (this number's earlier upload is replaced, so it does not count).
    /// Parts sent at once may each fit and together not: Complete checks
    /// the sum again.
    async fn part_bound(&self, upload: ObjectId, number: i32) -> S3Result<Bound> {
        let stored = self
            .core
            .work(true, move |s| s.parts(upload))
            .await
            .map_err(|f| failure(&f))?;
        let others: u64 = stored
            .iter()
            .filter(|p| p.number != number)
            .map(|p| p.length)
            .sum();
        let left = self.core.config.max_upload.saturating_sub(others);
        Ok(if left < self.core.config.max_body {
            Bound {
                bytes: left,
                what: "the upload's parts together would be over --max-upload",
            }
        } else {
            Bound::body(&self.core)
        })
    }

    /// Record a stored part (its staged `object` is dropped if that
    /// fails); a part number uploaded again replaces its blob, which goes
    /// now rather than at the end of the upload (a client retrying one
    /// part must not fill the disk).
    async fn add_part(
        &self,
        upload: ObjectId,
        number: i32,
        object: ObjectId,
        meta: Meta,
    ) -> S3Result<()> {
        let replaced = match self
            .core
            .work(false, move |store| {
                store.add_part(upload, number, object, &meta)
            })
            .await
        {
            Ok(replaced) => replaced,
            Err(f) => {
                cleanup(&self.core, object).await;
                return Err(failure(&f));
            }
        };
        for earlier in replaced {
            cleanup(&self.core, earlier).await;
        }
        Ok(())
    }

    /// UploadPartCopy: a part whose bytes are (a range of) another key's
    /// visible object; read right on the source, its conditions 412.
    pub(super) async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let scope = self.writer(&req, "put-part", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        let number = part_number(input.part_number)?;
        let (source_bucket, source_key, version_id) = copy_source(&input.copy_source)?;
        let (upload, _) = self.upload_of(&input.upload_id, &scope).await?;
        let bound = self.part_bound(upload, number).await?;
        let (object, copied) = self
            .copy_from(
                &req,
                "put-part",
                (source_bucket, source_key, version_id),
                copy_conditions!(input),
                input.copy_source_range.as_deref(),
                bound,
                move |store: &Store| store.stage_part(&scope, upload),
            )
            .await?;
        let etag = hex(&copied.md5);
        let meta = Meta::part(copied.written.length, copied.written.sha256, etag.clone());
        self.add_part(upload, number, object, meta).await?;
        note(&req, |t| t.outcome = Some("part-stored"));
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(etag)),
                last_modified: Some(Timestamp::from(std::time::SystemTime::now())),
                ..Default::default()
            }),
            copy_source_version_id: Some(copied.source_version.to_string()),
            ..Default::default()
        }))
    }

    /// Drop every object of an upload, and their blobs.
    async fn drop_upload(&self, upload: ObjectId) {
        match self
            .core
            .work(false, move |s| s.upload_objects(upload))
            .await
        {
            Ok(objects) => {
                for object in objects {
                    cleanup(&self.core, object).await;
                }
            }
            Err(f) => {
                tracing::warn!(upload = upload.get(), error = %failure(&f), "dropping an upload failed; left to the collector");
            }
        }
    }

    pub(super) async fn create_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let scope = self.writer(&req, "put", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        let presented = fence_token(&req.headers, input.metadata.as_ref()).inspect_err(|_| {
            note(&req, |t| t.outcome = Some("missing-token"));
        })?;
        let write = write_request(&scope, presented, &req.headers, false)?;
        note(&req, |t| t.epoch = Some(write.request.token.epoch));
        let (outcome, _head, write) = decide_early(&self.core, write, false)
            .await
            .map_err(|f| failure(&f))?;
        if let Some((e, outcome)) = early_stop(&outcome) {
            note(&req, |t| t.outcome = Some(outcome));
            return Err(e);
        }
        let metadata = user_metadata(input.metadata.as_ref())?;
        let content_type = content_type(input.content_type.clone())?;
        let meta = Meta {
            length: 0,
            sha256: [0; 32],
            content_type,
            op_id: write.request.op_id.clone(),
            etag: None,
            metadata,
        };
        let (s, fence) = (scope.clone(), write.fence.clone());
        let upload = self
            .core
            .work(false, move |store| store.begin_upload(&s, &fence, &meta))
            .await
            .map_err(|f| failure(&f))?;
        note(&req, |t| t.outcome = Some("upload-started"));
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            upload_id: Some(upload.get().to_string()),
            ..Default::default()
        }))
    }

    pub(super) async fn upload_part(
        &self,
        mut req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let scope = self.writer(&req, "put-part", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        let number = part_number(input.part_number)?;
        let (upload, _) = self.upload_of(&input.upload_id, &scope).await?;
        let bound = self.part_bound(upload, number).await?;
        let s = scope.clone();
        let object = self
            .core
            .work(false, move |store| store.stage_part(&s, upload))
            .await
            .map_err(|f| failure(&f))?;
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
            bound,
            declared,
            req.trailing_headers.as_ref(),
        )
        .await?;
        let etag = hex(&received.md5);
        let meta = Meta::part(
            received.written.length,
            received.written.sha256,
            etag.clone(),
        );
        self.add_part(upload, number, object, meta).await?;
        note(&req, |t| t.outcome = Some("part-stored"));
        let c = received.checksum;
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(etag)),
            checksum_crc32: c.checksum_crc32,
            checksum_crc32c: c.checksum_crc32c,
            checksum_sha1: c.checksum_sha1,
            checksum_sha256: c.checksum_sha256,
            checksum_crc64nvme: c.checksum_crc64nvme,
            ..Default::default()
        }))
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

    pub(super) async fn abort_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let scope = self.writer(&req, "put", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        let (upload, _) = self.upload_of(&input.upload_id, &scope).await?;
        self.drop_upload(upload).await;
        note(&req, |t| t.outcome = Some("upload-aborted"));
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}

impl Objects {
    /// ListParts: the parts stored so far (the last upload of each part
    /// number), a page of at most `max-parts` after `part-number-marker`.
    /// An upload in progress is its writer's business: this takes the
    /// write right on the key, as the upload's other calls do.
    pub(super) async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let scope = self.writer(&req, "list", &req.input.bucket, &req.input.key)?;
        let input = &req.input;
        let (upload, _) = self.upload_of(&input.upload_id, &scope).await?;
        let max = usize::try_from(input.max_parts.unwrap_or(1000).max(0))
            .unwrap_or(0)
            .min(LIST_MAX);
        let marker = input.part_number_marker.unwrap_or(0);
        let stored = self
            .core
            .work(true, move |s| s.parts(upload))
            .await
            .map_err(|f| failure(&f))?;
        let after: Vec<&Part> = stored.iter().filter(|p| p.number > marker).collect();
        let page = &after[..after.len().min(max)];
        note(&req, |t| t.outcome = Some("ok"));
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket.clone()),
            key: Some(input.key.clone()),
            upload_id: Some(input.upload_id.clone()),
            max_parts: Some(i32::try_from(max).unwrap_or(1000)),
            part_number_marker: input.part_number_marker,
            next_part_number_marker: Some(page.last().map_or(marker, |p| p.number)),
            is_truncated: Some(after.len() > page.len()),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            parts: Some(
                page.iter()
                    .map(|p| dto::Part {
                        part_number: Some(p.number),
                        e_tag: Some(ETag::Strong(p.etag.clone())),
                        size: i64::try_from(p.length).ok(),
                        last_modified: Some(Timestamp::from(p.staged_at)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    /// ListMultipartUploads: the uploads in progress begun within
    /// `--upload-retention` (older ones are the collector's), by key and then by
    /// start, with S3's prefix, delimiter, key and UploadId markers. Write
    /// right on the whole prefix: a reader sees only published objects.
    pub(super) async fn list_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let input = &req.input;
        let Listing {
            base,
            prefix,
            full_prefix,
            max,
            delimiter,
        } = self.listing(
            &req,
            Right::Write,
            &input.bucket,
            input.prefix.as_deref(),
            input.max_uploads,
            input.delimiter.as_deref(),
        )?;
        // Where to start: after the UploadId marker's upload of the key
        // marker, else after every upload of the key marker (and of every
        // key under it when it is a common prefix); S3 ignores an UploadId
        // marker without a key marker.
        let mut after: Option<(String, i64)> = match input.key_marker.as_deref() {
            None | Some("") => None,
            Some(key) => {
                let rolled_up = delimiter.as_deref().is_some_and(|d| key.ends_with(d));
                let id = match input.upload_id_marker.as_deref() {
                    Some(id) if !id.is_empty() && !rolled_up => {
                        id.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                            error(
                                S3ErrorCode::InvalidArgument,
                                "the upload-id-marker is not an UploadId",
                            )
                        })?
                    }
                    _ => i64::MAX,
                };
                Some(if rolled_up {
                    (format!("{base}{key}\u{10FFFF}"), i64::MAX)
                } else {
                    (format!("{base}{key}"), id)
                })
            }
        };
        let since = self.core.config.upload_retention;
        let mut uploads: Vec<MultipartUpload> = Vec::new();
        let mut prefixes: Vec<CommonPrefix> = Vec::new();
        // The page's last entry: the next page's markers.
        let mut last: Option<(String, Option<String>)> = None;
        let mut truncated = false;
        'pages: loop {
            if max == 0 {
                break;
            }
            let (p, a) = (full_prefix.clone(), after.clone());
            let rows = self
                .core
                .work(true, move |s| {
                    s.uploads(
                        &p,
                        a.as_ref().map(|(k, i)| (k.as_str(), *i)),
                        since,
                        LIST_MAX,
                    )
                })
                .await
                .map_err(|f| failure(&f))?;
            let full = rows.len() == LIST_MAX;
            for row in rows {
                if uploads.len() + prefixes.len() == max {
                    truncated = true;
                    break 'pages;
                }
                let key = row.scope.get(base.len()..).unwrap_or_default().to_owned();
                match common_prefix(&key, prefix.len(), delimiter.as_deref()) {
                    Some(cp) => {
                        // Every upload under the common prefix sorts
                        // before this: skip them all with one new query.
                        after = Some((format!("{base}{cp}\u{10FFFF}"), i64::MAX));
                        prefixes.push(CommonPrefix {
                            prefix: Some(cp.clone()),
                        });
                        last = Some((cp, None));
                        continue 'pages;
                    }
                    None => {
                        after = Some((row.scope.clone(), row.id.get()));
                        let id = row.id.get().to_string();
                        uploads.push(MultipartUpload {
                            key: Some(key.clone()),
                            upload_id: Some(id.clone()),
                            initiated: Some(Timestamp::from(row.initiated)),
                            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                            ..Default::default()
                        });
                        last = Some((key, Some(id)));
                    }
                }
            }
            if !full {
                break;
            }
        }
        note(&req, |t| t.outcome = Some("ok"));
        let (next_key_marker, next_upload_id_marker) = match last.filter(|_| truncated) {
            Some((key, id)) => (Some(key), id),
            None => (None, None),
        };
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket.clone()),
            prefix: Some(prefix),
            delimiter,
            key_marker: input.key_marker.clone(),
            upload_id_marker: input.upload_id_marker.clone(),
            max_uploads: Some(i32::try_from(max).unwrap_or(1000)),
            is_truncated: Some(truncated),
            next_key_marker,
            next_upload_id_marker,
            uploads: Some(uploads),
            common_prefixes: (!prefixes.is_empty()).then_some(prefixes),
            ..Default::default()
        }))
    }
}

/// A part number S3 allows.
fn part_number(number: i32) -> S3Result<i32> {
    if (1..=MAX_PART_NUMBER).contains(&number) {
        Ok(number)
    } else {
        Err(error(
            S3ErrorCode::InvalidArgument,
            "part numbers are 1 to 10000",
        ))
    }
}

/// The rest of a Complete, once everything that can be checked before
/// the copy has been: concatenate the parts, publish fenced, drop the
/// upload.
struct Finish {
    objects: Objects,
    scope: String,
    write: crate::http::objects::Write,
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
            content_type: self
                .content_type
                .unwrap_or_else(|| super::ops::DEFAULT_TYPE.to_owned()),
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
