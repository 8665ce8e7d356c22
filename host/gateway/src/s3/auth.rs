//! Who may do what. SigV4 needs each access key's secret: s3s asks for it
//! here ([`Secrets`]), from the principals of `--auth` (reloaded with them
//! on SIGHUP), and checks the signature itself. An operation then names
//! its signer ([`Objects::principal`]), the bucket and fenced key it
//! touches ([`Objects::scope`]: key `K` of bucket `B` is `B/K`, under the
//! rules of `/objects` keys) and checks the signer's right on that key
//! ([`Objects::authorize`]), as the `/objects` API checks a bearer's.

use std::sync::Arc;

use fencecheck::MAX_SCOPE_BYTES;
use s3s::auth::{S3Auth, SecretKey};
use s3s::{S3ErrorCode, S3Request, S3Result};

use super::errors::error;
use super::note;
use super::ops::Objects;
use crate::auth::{Auth, Principal, Right};
use crate::key::check_decoded;

/// The secret access keys of the current principals.
pub(crate) struct Secrets {
    auth: Arc<Auth>,
}

impl Secrets {
    pub fn new(auth: Arc<Auth>) -> Self {
        Self { auth }
    }
}

#[async_trait::async_trait]
impl S3Auth for Secrets {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.auth.s3_key(access_key) {
            Some((_, secret)) => Ok(SecretKey::from(secret.expose())),
            None => Err(s3s::s3_error!(
                InvalidAccessKeyId,
                "the access key id is not known"
            )),
        }
    }
}

impl Objects {
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
}
