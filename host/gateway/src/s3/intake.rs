//! A request body into a blob: bounded ([`Bound`]: `--max-body`, or what
//! is left of `--max-upload` for a part), hashed on the way (MD5 for the
//! ETag, and the `x-amz-checksum-*` the client declared in headers or
//! trailers), then checked (Content-MD5, the checksums, Content-Length)
//! before anything is published; a body that fails drops its staged
//! object. s3s has checked `x-amz-content-sha256` and the chunk signatures
//! as it read.

use base64::Engine;
use bytes::Bytes;
use fencecheck_sqlite::ObjectId;
use http::HeaderMap;
use md5::{Digest, Md5};
use s3s::checksum::ChecksumHasher;
use s3s::dto::{Checksum, ChecksumAlgorithm, StreamingBlob};
use s3s::{S3Error, S3ErrorCode, S3Result};

use super::errors::{error, storage};
use crate::blobs::Written;
use crate::http::Core;
use crate::http::publish::cleanup;

/// The checksums a PutObject or UploadPart input declares.
macro_rules! declared {
    ($input:expr) => {
        $crate::s3::intake::Declared::new(
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

    pub fn refused(self) -> S3Error {
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

/// Lower-case hex, as S3 spells an MD5 ETag.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
