//! Preconditions and ranges (RFC 9110 §13, §14) as pure functions of the
//! header values and the key's current state.
//!
//! ETags are the key's version, quoted (`"3"`); they are strong. A write's
//! precondition is decided twice: against the state read before the upload
//! (so a failed one uploads nothing), then atomically, as the component's
//! expected version, at the publish.

use std::time::SystemTime;

/// An `If-Match` / `If-None-Match` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tags {
    /// `*`
    Any,
    /// Entity tags as written (`"3"`, `W/"3"`).
    List(Vec<String>),
}

impl Tags {
    /// Parse one header value; `None` if malformed.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        if value == "*" {
            return Some(Tags::Any);
        }
        let mut tags = Vec::new();
        let mut rest = value;
        loop {
            rest = rest.trim_start();
            let weak = rest.starts_with("W/");
            let body = if weak { &rest[2..] } else { rest };
            let body = body.strip_prefix('"')?;
            let end = body.find('"')?;
            let tag = &body[..end];
            if tag.bytes().any(|b| b < 0x21 || b == 0x7f) {
                return None;
            }
            tags.push(format!("{}\"{tag}\"", if weak { "W/" } else { "" }));
            rest = body[end + 1..].trim_start();
            if rest.is_empty() {
                return Some(Tags::List(tags));
            }
            rest = rest.strip_prefix(',')?;
        }
    }

    /// Strong comparison (If-Match): weak tags never match.
    fn strong(&self, current: &str) -> bool {
        match self {
            Tags::Any => true,
            Tags::List(tags) => tags.iter().any(|t| t == current),
        }
    }

    /// Weak comparison (If-None-Match): `W/"3"` matches `"3"`.
    fn weak(&self, current: &str) -> bool {
        match self {
            Tags::Any => true,
            Tags::List(tags) => tags
                .iter()
                .any(|t| t.strip_prefix("W/").unwrap_or(t) == current),
        }
    }

    /// The single version named, if this is exactly one strong tag.
    pub fn single_version(&self) -> Option<u64> {
        match self {
            Tags::List(tags) if tags.len() == 1 => {
                tags[0].strip_prefix('"')?.strip_suffix('"')?.parse().ok()
            }
            _ => None,
        }
    }
}

/// A write's preconditions.
#[derive(Clone, Debug, Default)]
pub(crate) struct WriteConditions {
    pub if_match: Option<Tags>,
    pub if_none_match: Option<Tags>,
}

impl WriteConditions {
    pub fn is_empty(&self) -> bool {
        self.if_match.is_none() && self.if_none_match.is_none()
    }

    /// Decide against the current state: `visible` is the version of the
    /// key's visible object (`None`: absent or deleted), `version` the
    /// key's version (0 if never written; a delete counts). `Ok(Some(v))`:
    /// proceed, and publish only if the version is still `v`.
    pub fn decide(&self, visible: Option<u64>, version: u64) -> Result<Option<u64>, ()> {
        if self.is_empty() {
            return Ok(None);
        }
        let current = visible.map(crate::http::reply::etag);
        if let Some(tags) = &self.if_match {
            match &current {
                Some(c) if tags.strong(c) => {}
                _ => return Err(()),
            }
        }
        if let Some(tags) = &self.if_none_match
            && current.as_deref().is_some_and(|c| tags.weak(c))
        {
            return Err(());
        }
        Ok(Some(version))
    }
}

/// What a conditional read answers.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReadCheck {
    /// Serve it.
    Proceed,
    /// 304 Not Modified.
    NotModified,
    /// 412: `If-Match` failed.
    Failed,
}

/// RFC 9110 §13.2.2, for GET and HEAD on an existing object.
pub(crate) fn read_check(
    if_match: Option<&Tags>,
    if_none_match: Option<&Tags>,
    if_modified_since: Option<SystemTime>,
    etag: &str,
    last_modified: SystemTime,
) -> ReadCheck {
    if let Some(tags) = if_match
        && !tags.strong(etag)
    {
        return ReadCheck::Failed;
    }
    if let Some(tags) = if_none_match {
        return if tags.weak(etag) {
            ReadCheck::NotModified
        } else {
            ReadCheck::Proceed
        };
    }
    // HTTP dates have whole seconds.
    let secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    if let Some(since) = if_modified_since
        && secs(last_modified) <= secs(since)
    {
        return ReadCheck::NotModified;
    }
    ReadCheck::Proceed
}

/// What to send of a body of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Span {
    /// All of it (no Range, one we ignore, or several ranges).
    Full,
    /// 206: bytes `start..=end`.
    Part { start: u64, end: u64 },
    /// 416.
    Unsatisfiable,
}

/// The `Range` header (one `bytes` range; anything else is served whole,
/// as RFC 9110 §14.2 allows).
pub(crate) fn span(range: Option<&str>, len: u64) -> Span {
    let Some(spec) = range.and_then(|r| r.trim().strip_prefix("bytes=")) else {
        return Span::Full;
    };
    if spec.contains(',') {
        return Span::Full;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Span::Full;
    };
    let number = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (first, last) {
        ("", suffix) => match number(suffix) {
            None => Span::Full,
            Some(0) => Span::Unsatisfiable,
            Some(_) if len == 0 => Span::Unsatisfiable,
            Some(n) => Span::Part {
                start: len.saturating_sub(n),
                end: len - 1,
            },
        },
        (first, last) => {
            let Some(start) = number(first) else {
                return Span::Full;
            };
            let end = if last.is_empty() {
                u64::MAX
            } else {
                match number(last) {
                    Some(end) if end >= start => end,
                    _ => return Span::Full,
                }
            };
            if start >= len {
                Span::Unsatisfiable
            } else {
                Span::Part {
                    start,
                    end: end.min(len - 1),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tags() {
        assert_eq!(Tags::parse("*"), Some(Tags::Any));
        assert_eq!(
            Tags::parse(r#""1", W/"2" ,"3""#),
            Some(Tags::List(vec![
                "\"1\"".into(),
                "W/\"2\"".into(),
                "\"3\"".into()
            ]))
        );
        for bad in ["", "1", "\"1", "\"1\" \"2\"", "\"1\",", "W/1", "\"a b\""] {
            assert_eq!(Tags::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            Tags::parse("\"7\"").and_then(|t| t.single_version()),
            Some(7)
        );
        let weak2 = Tags::parse(r#"W/"2""#).expect("parses");
        assert!(weak2.weak("\"2\"") && !weak2.strong("\"2\""));
    }

    #[test]
    fn write_conditions() {
        let c = |m: Option<&str>, n: Option<&str>| WriteConditions {
            if_match: m.and_then(Tags::parse),
            if_none_match: n.and_then(Tags::parse),
        };
        // Create-only: absent (never written, or deleted at version 4).
        assert_eq!(c(None, Some("*")).decide(None, 0), Ok(Some(0)));
        assert_eq!(c(None, Some("*")).decide(None, 4), Ok(Some(4)));
        assert_eq!(c(None, Some("*")).decide(Some(3), 3), Err(()));
        assert_eq!(c(Some("*"), None).decide(Some(3), 3), Ok(Some(3)));
        assert_eq!(c(Some("*"), None).decide(None, 4), Err(()));
        assert_eq!(c(Some(r#""2", "3""#), None).decide(Some(3), 3), Ok(Some(3)));
        assert_eq!(c(Some(r#""2", W/"3""#), None).decide(Some(3), 3), Err(()));
        assert_eq!(c(None, Some(r#""3""#)).decide(Some(3), 3), Err(()));
        assert_eq!(c(None, Some(r#""2""#)).decide(Some(3), 3), Ok(Some(3)));
        assert_eq!(c(None, None).decide(Some(3), 3), Ok(None));
    }

    #[test]
    fn reads() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(10_500);
        let later = SystemTime::UNIX_EPOCH + Duration::from_secs(11);
        let any = Tags::Any;
        let three = Tags::parse(r#"W/"3""#).expect("parses");
        let two = Tags::parse(r#""2""#).expect("parses");
        assert_eq!(
            read_check(None, Some(&three), None, "\"3\"", t),
            ReadCheck::NotModified
        );
        assert_eq!(
            read_check(None, Some(&two), None, "\"3\"", t),
            ReadCheck::Proceed
        );
        assert_eq!(
            read_check(None, Some(&any), None, "\"3\"", t),
            ReadCheck::NotModified
        );
        assert_eq!(
            read_check(Some(&two), None, None, "\"3\"", t),
            ReadCheck::Failed
        );
        assert_eq!(
            read_check(None, None, Some(t), "\"3\"", t),
            ReadCheck::NotModified
        );
        assert_eq!(
            read_check(None, None, Some(later), "\"3\"", t),
            ReadCheck::NotModified
        );
        let earlier = SystemTime::UNIX_EPOCH + Duration::from_secs(9);
        assert_eq!(
            read_check(None, None, Some(earlier), "\"3\"", t),
            ReadCheck::Proceed
        );
        // If-None-Match wins over If-Modified-Since.
        assert_eq!(
            read_check(None, Some(&two), Some(later), "\"3\"", t),
            ReadCheck::Proceed
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(span(None, 10), Span::Full);
        assert_eq!(span(Some("bytes=0-3"), 10), Span::Part { start: 0, end: 3 });
        assert_eq!(span(Some("bytes=5-"), 10), Span::Part { start: 5, end: 9 });
        assert_eq!(
            span(Some("bytes=5-100"), 10),
            Span::Part { start: 5, end: 9 }
        );
        assert_eq!(span(Some("bytes=-3"), 10), Span::Part { start: 7, end: 9 });
        assert_eq!(span(Some("bytes=-30"), 10), Span::Part { start: 0, end: 9 });
        assert_eq!(span(Some("bytes=10-"), 10), Span::Unsatisfiable);
        assert_eq!(span(Some("bytes=-0"), 10), Span::Unsatisfiable);
        assert_eq!(span(Some("bytes=0-0"), 0), Span::Unsatisfiable);
        assert_eq!(span(Some("bytes=-1"), 0), Span::Unsatisfiable);
        for ignored in [
            "bytes=3-1",
            "items=0-1",
            "bytes=0-1,3-4",
            "bytes=a-1",
            "bytes=-",
            "bytes=1",
        ] {
            assert_eq!(span(Some(ignored), 10), Span::Full, "{ignored}");
        }
    }
}
