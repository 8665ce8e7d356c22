//! The S3 front: path-style S3 (`/{bucket}/{key}`) on the gateway's own
//! port, for boto3, aws-cli, rclone and every SDK. A key `K` of bucket `B`
//! is the fenced key `B/K`: the same pointer, fence state and blob as
//! `/objects/B/K`, written by the same publish.
//!
//! The protocol (routing, XML, AWS Signature V4 in headers or presigned
//! URLs, `aws-chunked` bodies with their chunk signatures and trailers) is
//! the `s3s` crate's; this module is the bridge from Pingora to it, the
//! secrets and rights of `--auth`, and the operations over the store and
//! the blobs.
//!
//! # Where things live
//!
//! | File | What lives there |
//! |---|---|
//! | `mod.rs` | this map; [`Front`] (the buckets served), [`Gateway::with_s3`]; what every operation shares: [`Tally`] (what it tells the log line), the token on its answer |
//! | `bridge.rs` | Pingora to s3s and back: the paths the front claims, a request handed over, its answer sent within `--response-deadline` |
//! | `pump.rs` | the request body, client to s3s, at the gateway's pace, read only once an operation asks for it |
//! | `auth.rs` | the SigV4 secrets s3s asks for; an operation's signer, its bucket and fenced key, the right it needs |
//! | `errors.rs` | every S3 error answer: S3's codes, the store's failures, the fence's refusals, error documents SDKs can read |
//! | `ops.rs` | the `s3s::S3` trait: the operations served, each handed to the file of its concern |
//! | `read.rs` | GetObject, HeadObject: preconditions, ranges, the blob as a body |
//! | `write.rs` | PutObject, DeleteObject(s), and what every write shares: the token, the fenced request, the publish's answer |
//! | `intake.rs` | a body into a blob: size bounds, MD5, Content-MD5 and the `x-amz-checksum-*` checked |
//! | `copy.rs` | CopyObject, and the source read every copy shares (UploadPartCopy too) |
//! | `upload.rs` | multipart uploads: create, parts, abort, ListParts |
//! | `complete.rs` | CompleteMultipartUpload: the parts checked, joined into one blob, published |
//! | `list.rs` | ListObjectsV2, ListObjects, ListMultipartUploads: prefixes, delimiters, pages |
//!
//! The write pipeline itself (early check, stage, fenced publish) is the
//! `/objects` API's ([`crate::http::publish`]): the S3 front only spells
//! it S3's way. The dependency is one way: `s3` uses `http`; `http` serves
//! the front as a [`Surface`](crate::http::Surface) it does not otherwise
//! know.

mod auth;
mod bridge;
mod complete;
mod copy;
mod errors;
mod intake;
mod list;
mod ops;
mod pump;
mod read;
mod upload;
mod write;

use std::sync::{Arc, Mutex};

use http::HeaderValue;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{S3Request, S3Response};

use crate::error::Error;
use crate::http::{Core, Gateway};

/// What an S3 operation tells the request's log line and metrics.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub op: Option<&'static str>,
    pub outcome: Option<&'static str>,
    pub epoch: Option<u64>,
    pub principal: Option<String>,
    /// A gateway operation began (it looked up the request's signer):
    /// until then every answer is s3s's own (signature, routing, reading
    /// a whole XML body).
    pub began: bool,
    /// The answer is 200 at once with whitespace until the result
    /// (a large CompleteMultipartUpload): no `--response-deadline`, and
    /// the outcome is known only at its end.
    pub keep_alive: bool,
}

/// Shared between the bridge and the operation (request extensions).
pub(crate) type Tallied = Arc<Mutex<Tally>>;

/// Paths of the gateway's own API: never bucket names.
const RESERVED: [&str; 4] = ["objects", "v1", "healthz", "metrics"];

/// S3's bucket naming rules (the ones a path-style name needs): 3 to 63 of
/// a-z 0-9 . -, starting and ending with a letter or digit.
fn valid_bucket(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'-'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && !name.contains("..")
}

/// Record facts for the log line and the metrics.
fn note<T>(req: &S3Request<T>, f: impl FnOnce(&mut Tally)) {
    if let Some(mut t) = req.extensions.get::<Tallied>().and_then(|t| t.lock().ok()) {
        f(&mut t);
    }
}

/// The Content-Type of an object written without one.
const DEFAULT_TYPE: &str = "application/octet-stream";

/// An answer that carries the fencing token it was written under.
fn with_fence<T>(output: T, fence: &str) -> S3Response<T> {
    let mut response = S3Response::new(output);
    if let Ok(v) = HeaderValue::from_str(fence) {
        response.headers.insert("fence-token", v);
    }
    response
}

/// The S3 front of one gateway.
pub(crate) struct Front {
    service: S3Service,
}

impl Front {
    /// A front for `buckets` over the gateway's store and blobs.
    pub fn new(core: Arc<Core>, buckets: &[String]) -> Result<Self, Error> {
        if buckets.is_empty() {
            return Err(Error::Config(
                "the S3 front needs at least one --bucket".into(),
            ));
        }
        for name in buckets {
            if !valid_bucket(name) {
                return Err(Error::Config(format!(
                    "--bucket {name:?}: 3 to 63 of a-z 0-9 . -, starting and ending with a letter or digit"
                )));
            }
            if RESERVED.contains(&name.as_str()) {
                return Err(Error::Config(format!(
                    "--bucket {name:?} is a path of the gateway's own API"
                )));
            }
        }
        let buckets: Arc<[String]> = buckets.into();
        let mut builder = S3ServiceBuilder::new(ops::Objects::new(core.clone(), buckets));
        builder.set_auth(auth::Secrets::new(core.auth.clone()));
        let service = builder.build();
        Ok(Self { service })
    }
}

impl Gateway {
    /// Serve the S3 front for `buckets` too (path-style `/{bucket}/{key}`;
    /// key `K` of bucket `B` is the fenced key `B/K`). Refused: a bucket
    /// name S3 would refuse, or one that is a path of the gateway's own API.
    pub fn with_s3(self, buckets: &[String]) -> Result<Self, Error> {
        let front = Front::new(self.core().clone(), buckets)?;
        Ok(self.with_surface(Box::new(front)))
    }
}

#[cfg(test)]
mod tests {
    use super::valid_bucket;

    /// Bucket names follow S3's rules for path-style names.
    #[test]
    fn bucket_names() {
        for good in ["abc", "reports", "my-bucket.2026", "a1b"] {
            assert!(valid_bucket(good), "{good}");
        }
        for bad in [
            "ab",
            "Reports",
            "-abc",
            "abc-",
            "a..b",
            "a_b",
            "a/b",
            &"a".repeat(64),
        ] {
            assert!(!valid_bucket(bad), "{bad}");
        }
    }
}
