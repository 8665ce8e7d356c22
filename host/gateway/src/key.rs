//! Object keys: what `/objects/{key}` accepts. A key is UTF-8, written in
//! the path percent-encoded (spaces, non-ASCII…); it is decoded once, here,
//! and every rule is checked on the decoded text, so no spelling of `..`
//! (`%2e%2e`, `%2E.`) gets past them.

use fencecheck::MAX_SCOPE_BYTES;

/// Why a key was refused (the text goes into the 400 problem body).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid object key: {0}")]
pub struct KeyError(pub &'static str);

/// Bytes a path may carry unencoded (RFC 3986 `pchar` and `/`).
fn raw_allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'@'
                | b'/'
        )
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decode `raw` (no `+` for space: encode spaces as `%20`) into UTF-8
/// text without control characters. `segments`: a raw `/` separates
/// segments, so `%2F` is refused (one spelling per key); otherwise (query
/// values) both spellings are a `/`.
pub(crate) fn decode(raw: &str, segments: bool) -> Result<String, KeyError> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'%' {
            let value = bytes
                .get(i + 1)
                .and_then(|h| hex(*h))
                .zip(bytes.get(i + 2).and_then(|l| hex(*l)))
                .map(|(h, l)| h << 4 | l)
                .ok_or(KeyError("a % must start a two-digit hex escape"))?;
            if value == b'/' && segments {
                return Err(KeyError(
                    "%2F is refused: segments are separated by a literal /",
                ));
            }
            out.push(value);
            i += 3;
        } else if raw_allowed(b) || (!segments && b == b'?') {
            out.push(b);
            i += 1;
        } else {
            return Err(KeyError(
                "percent-encode everything but A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , ; = : @ /",
            ));
        }
    }
    let text = String::from_utf8(out).map_err(|_| KeyError("not UTF-8 once decoded"))?;
    if text.chars().any(char::is_control) {
        return Err(KeyError("control characters are refused"));
    }
    Ok(text)
}

/// Validate and decode a raw key (the path after `/objects/`).
///
/// Accepted: 1 to [`MAX_SCOPE_BYTES`] bytes of UTF-8 once decoded, in
/// `/`-separated segments, no empty segment (so no leading, trailing or
/// doubled `/`), no `.` or `..` segment, no control characters. `%2F` is
/// refused (one spelling of the segment structure).
pub fn validate_key(raw: &str) -> Result<String, KeyError> {
    if raw.is_empty() {
        return Err(KeyError("empty"));
    }
    // Decoding only shrinks: a raw form 3x over the bound cannot fit.
    if raw.len() > 3 * MAX_SCOPE_BYTES {
        return Err(KeyError("longer than 1024 bytes"));
    }
    let key = decode(raw, true)?;
    check_decoded(&key)?;
    Ok(key)
}

/// The rules of [`validate_key`] on a key already decoded (the S3 front's:
/// s3s decodes the path): 1 to [`MAX_SCOPE_BYTES`] bytes, no empty, `.` or
/// `..` segment, no control characters.
pub(crate) fn check_decoded(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError("empty"));
    }
    if key.len() > MAX_SCOPE_BYTES {
        return Err(KeyError("longer than 1024 bytes"));
    }
    if key.chars().any(char::is_control) {
        return Err(KeyError("control characters are refused"));
    }
    for segment in key.split('/') {
        match segment {
            "" => return Err(KeyError("empty path segment")),
            "." | ".." => return Err(KeyError("dot segment")),
            _ => {}
        }
    }
    Ok(())
}

/// Percent-encode `key` for a path (the inverse of [`validate_key`]):
/// everything but unreserved characters and `/` is escaped.
pub fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{encode_key, validate_key};

    #[test]
    fn keys() {
        assert_eq!(
            validate_key("reports/july.csv").as_deref(),
            Ok("reports/july.csv")
        );
        assert_eq!(validate_key("a..b").as_deref(), Ok("a..b"));
        assert_eq!(validate_key("a%20b").as_deref(), Ok("a b"));
        assert_eq!(validate_key("k=v:w~x").as_deref(), Ok("k=v:w~x"));
        assert_eq!(validate_key("caf%C3%A9/%E2%82%AC").as_deref(), Ok("café/€"));
        assert_eq!(validate_key("%61").as_deref(), Ok("a"));
        for bad in [
            "",
            "..",
            "a/../b",
            "./a",
            "a//b",
            "/a",
            "a/",
            "%2e%2e",
            "a/%2E%2E/b",
            "a/%2e/b",
            "a%2fb",
            "a%2Fb",
            "a\\b",
            "a b",
            "a?b",
            "a#b",
            "é",
            "%",
            "%4",
            "%zz",
            "%00",
            "a%0Ab",
            "%C3",
            "%FF",
        ] {
            assert!(validate_key(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_key(&"a".repeat(1025)).is_err());
        assert!(validate_key(&"%61".repeat(1025)).is_err());
        assert!(validate_key(&"%61".repeat(1024)).is_ok());
    }

    #[test]
    fn encoding_round_trips() {
        for key in ["a b/c", "café/€", "k=v:w~x", "100%", "a+b"] {
            assert_eq!(validate_key(&encode_key(key)).as_deref(), Ok(key));
        }
    }
}
