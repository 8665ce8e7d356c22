//! SigV4 needs each access key's secret: s3s asks for it here, from the
//! principals of `--auth` (reloaded with them on SIGHUP). Rights are
//! checked per operation, on the fenced key ([`super::ops`]).

use std::sync::Arc;

use s3s::S3Result;
use s3s::auth::{S3Auth, SecretKey};

use crate::auth::Auth;

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
