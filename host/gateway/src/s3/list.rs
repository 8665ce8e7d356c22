//! Listings: ListObjectsV2, ListObjects (version 1, as a version 2
//! listing) and ListMultipartUploads, with S3's prefix, delimiter (the
//! keys under a common prefix skipped with one new query) and pages of at
//! most 1,000. A listing takes the signer's right on its whole prefix
//! ([`Objects::listing`]): read for objects, write for uploads in
//! progress. (ListParts, one upload's own, is with the uploads.)

use base64::Engine;
use fencecheck::MAX_SCOPE_BYTES;
use s3s::dto::{
    CommonPrefix, ETag, ListMultipartUploadsInput, ListMultipartUploadsOutput, ListObjectsInput,
    ListObjectsOutput, ListObjectsV2Input, ListObjectsV2Output, MultipartUpload, Object,
    ObjectStorageClass, StorageClass, Timestamp,
};
use s3s::{S3ErrorCode, S3Request, S3Response, S3Result};

use super::errors::{error, failure};
use super::note;
use super::ops::Objects;
use crate::auth::Right;

/// Largest page of a listing (S3's own bound).
pub(super) const LIST_MAX: usize = 1000;

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

    /// ListObjectsV2.
    pub(super) async fn list_v2(
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
    pub(super) async fn list_v1(
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
        let page = self.list_v2(v2).await?.output;
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

/// The continuation token of a listing: where the next page starts.
fn continuation(after: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(after.as_bytes())
}
