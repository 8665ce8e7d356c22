//! Strict object keys: what `/objects/{key}` accepts, checked on the raw
//! (undecoded) path so no decoding step can smuggle in a `..`.

use fencecheck::MAX_SCOPE_BYTES;

/// Why a key was refused (the text goes into the 400 problem body).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid object key: {0}")]
pub struct KeyError(pub &'static str);

/// Validate a raw key (the path after `/objects/`).
///
/// Accepted: 1 to [`MAX_SCOPE_BYTES`] bytes of `[A-Za-z0-9._-]` in
/// `/`-separated segments, no empty segment (so no leading, trailing or
/// doubled `/`), no `.` or `..` segment. `%` is refused outright: one
/// spelling per key, and `%2e%2e` can never become `..` downstream.
pub fn validate_key(raw: &str) -> Result<&str, KeyError> {
    if raw.is_empty() {
        return Err(KeyError("empty"));
    }
    if raw.len() > MAX_SCOPE_BYTES {
        return Err(KeyError("longer than 1024 bytes"));
    }
    if let Some(bad) = raw
        .bytes()
        .find(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/')))
    {
        return Err(if bad == b'%' {
            KeyError("percent-encoding is not accepted")
        } else {
            KeyError("only A-Z a-z 0-9 . _ - and / are allowed")
        });
    }
    for segment in raw.split('/') {
        match segment {
            "" => return Err(KeyError("empty path segment")),
            "." | ".." => return Err(KeyError("dot segment")),
            _ => {}
        }
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::validate_key;

    #[test]
    fn keys() {
        assert!(validate_key("reports/july.csv").is_ok());
        assert!(validate_key("a..b").is_ok());
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
            "a\\b",
            "a b",
            "a?b",
            "é",
        ] {
            assert!(validate_key(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_key(&"a".repeat(1025)).is_err());
    }
}
