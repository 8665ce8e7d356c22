//! Multipart uploads: CreateMultipartUpload, UploadPart, UploadPartCopy,
//! AbortMultipartUpload, ListParts. Create checks the token early (a
//! stale writer learns it before uploading anything) and stages the
//! upload; each part is a staged blob, bounded so the parts together stay
//! within `--max-upload`. Complete ([`super::complete`]) joins them and
//! publishes; Abort (or the collector, after `--upload-retention`) drops
//! them all. ListMultipartUploads is a listing ([`super::list`]).

use s3s::dto::{
    self, AbortMultipartUploadInput, AbortMultipartUploadOutput, CopyPartResult,
    CreateMultipartUploadInput, CreateMultipartUploadOutput, ETag, ListPartsInput, ListPartsOutput,
    StorageClass, Timestamp, UploadPartCopyInput, UploadPartCopyOutput, UploadPartInput,
    UploadPartOutput,
};
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result};

use super::copy::{copy_conditions, copy_source};
use super::errors::{early_stop, error, failure};
use super::intake::{Bound, declared, declared_sha256, hex, receive_staged};
use super::list::LIST_MAX;
use super::note;
use super::ops::Objects;
use super::write::{content_type, fence_token, user_metadata, write_request};
use crate::http::publish::{cleanup, decide_early};
use crate::store::{Meta, Part, Store, Upload};
use fencecheck_sqlite::ObjectId;

/// S3's part numbers.
const MAX_PART_NUMBER: i32 = 10_000;

impl Objects {
    /// The upload `id` names, if it is one of `scope`'s.
    pub(super) async fn upload_of(&self, id: &str, scope: &str) -> S3Result<(ObjectId, Upload)> {
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
    pub(super) async fn copy_part(
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
    pub(super) async fn drop_upload(&self, upload: ObjectId) {
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

    pub(super) async fn put_part(
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

    /// ListParts: the parts stored so far (the last upload of each part
    /// number), a page of at most `max-parts` after `part-number-marker`.
    /// An upload in progress is its writer's business: this takes the
    /// write right on the key, as the upload's other calls do.
    pub(super) async fn parts_page(
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
