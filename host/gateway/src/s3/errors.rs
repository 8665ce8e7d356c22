//! Every S3 error answer of the front: [`error`] for S3's own codes; the
//! store's failures ([`failure`], [`storage`]: 503, retryable); the
//! fence's refusals, with codes of the gateway's own (a stale token is 409
//! StaleFence with `fence-token-presented` and `fence-token-highest`); and
//! [`typed`], which gives every error document s3s sends a Content-Type
//! and a message, so each SDK reads its code.

use bytes::Bytes;
use fencecheck::{CheckError, Decision, SignedCheckError, SignedOutcome};
use fencecheck_sqlite::Rejection;
use http::{HeaderMap, HeaderValue, StatusCode};
use s3s::{S3Error, S3ErrorCode};

use crate::http::Failure;
use crate::http::reply::token_text;

/// An S3 error with a message.
pub(crate) fn error(code: S3ErrorCode, message: impl Into<String>) -> S3Error {
    S3Error::with_message(code, message.into())
}

/// The media type of every S3 error document.
pub(super) const XML: &str = "application/xml";

/// The answer when an S3 error itself could not be serialized.
pub(super) const UNBUILT: &[u8] = b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>InternalError</Code><Message>the answer could not be built</Message></Error>";

/// Give an error answer its `Content-Type` and a `<Message>`. s3s
/// replaces the whole header map of an error that carries headers of its
/// own (StaleFence's `fence-token-*`), dropping the `application/xml` it
/// had set: SDKs that check the type (minio-py) then read no error code at
/// all. And s3s's own refusals (a bad signature, an invalid path) have a
/// code and no message.
pub(crate) fn typed(response: &mut s3s::HttpResponse) {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return;
    }
    if !response.headers().contains_key(http::header::CONTENT_TYPE) {
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(XML),
        );
    }
    if let Some(body) = response.body().bytes()
        && let Some(fixed) = with_message(&body, status)
    {
        *response.body_mut() = s3s::Body::from(fixed);
        response.headers_mut().remove(http::header::CONTENT_LENGTH);
    }
}

/// An error document without `<Message>`, with one after its `<Code>`.
fn with_message(body: &[u8], status: http::StatusCode) -> Option<Bytes> {
    let find = |part: &[u8]| body.windows(part.len()).position(|w| w == part);
    if find(b"<Message>").is_some() {
        return None;
    }
    let start = find(b"<Code>")? + b"<Code>".len();
    let end = find(b"</Code>")?;
    let message = match body.get(start..end)? {
        b"SignatureDoesNotMatch" => {
            "the signature does not match the one calculated for this request (check the secret key, the region and the signed headers)"
        }
        b"InvalidURI" => "the path is not a valid S3 path",
        b"InvalidBucketName" => "not a valid bucket name",
        b"KeyTooLongError" => "the key is over 1024 bytes",
        b"IncompleteBody" => "the request body is shorter than declared",
        b"MethodNotAllowed" => "this method is not allowed on this resource",
        _ => status.canonical_reason().unwrap_or("error"),
    };
    let at = end + b"</Code>".len();
    let mut out = Vec::with_capacity(body.len() + message.len() + 19);
    out.extend_from_slice(&body[..at]);
    out.extend_from_slice(b"<Message>");
    out.extend_from_slice(message.as_bytes());
    out.extend_from_slice(b"</Message>");
    out.extend_from_slice(&body[at..]);
    Some(Bytes::from(out))
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
pub(super) fn fence_error(code: &'static str, status: StatusCode, message: String) -> S3Error {
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    /// An error answer without a type gets `application/xml`, and one
    /// without a message gets one after its code; a typed answer with a
    /// message, and a success, are left as they are.
    #[test]
    fn error_answers_are_typed() {
        let mut e = super::error(s3s::S3ErrorCode::Custom("StaleFence".into()), "newer");
        e.set_status_code(http::StatusCode::CONFLICT);
        e.set_headers(http::HeaderMap::new());
        let mut r = e.to_http_response().expect("serializes");
        assert!(r.headers().get("content-type").is_none(), "s3s drops it");
        super::typed(&mut r);
        assert_eq!(r.headers()["content-type"], "application/xml");
        let body = r.body().bytes().expect("whole");
        assert!(body.ends_with(b"<Error><Code>StaleFence</Code><Message>newer</Message></Error>"));

        let mut r = s3s::S3Error::new(s3s::S3ErrorCode::SignatureDoesNotMatch)
            .to_http_response()
            .expect("serializes");
        super::typed(&mut r);
        let body = r.body().bytes().expect("whole");
        let text = std::str::from_utf8(&body).expect("utf-8");
        assert!(
            text.contains(
                "<Code>SignatureDoesNotMatch</Code><Message>the signature does not match"
            ),
            "{text}"
        );

        let mut ok = http::Response::new(s3s::Body::from(Bytes::from_static(b"data")));
        super::typed(&mut ok);
        assert!(ok.headers().get("content-type").is_none());
    }
}
