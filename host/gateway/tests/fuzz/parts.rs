//! The fuzzer's generators of request parts (methods, keys, header values,
//! tokens, conditions, ranges, bodies) and its `/objects`, listing, lock
//! and odd-target requests.

use anyhow::Result;
use base64::Engine as _;
use fencecheck_tests::fuzzing::Fuzz;

use super::sigv4::uri_encode;
use super::{B64, ROOT_SECRET, Req, Run, md5_b64, md5_hex};

/// The random keys' segments (decoded); none contains `hist`.
pub(super) const SEGMENTS: [&str; 22] = [
    "a",
    "b",
    "c.txt",
    "reports",
    "x",
    "dir",
    "caf\u{e9}",
    "\u{65e5}\u{672c}",
    "sp ace",
    "q?x",
    "h#",
    "plus+",
    "pct%",
    "~t",
    "-",
    "_",
    "a.b",
    "\u{1f600}",
    "k=v",
    "semi;colon",
    "back\\slash",
    "v1",
];

/// Raw segments that are not an encoding of a decoded one.
pub(super) const RAW_SEGMENTS: [&str; 20] = [
    "..",
    ".",
    "",
    "%2e%2e",
    "%2E.",
    ".%2e",
    "%2F",
    "a%2fb",
    "%00",
    "%0a",
    "%0D%0A",
    "%7f",
    "%ff",
    "%c3%28",
    "%ed%a0%80",
    "%",
    "%zz",
    "%%",
    "%2",
    "%u0041",
];

/// Keys (decoded, `BUCKET/KEY`) that random requests of both surfaces
/// return to, so that reads, conditions, ranges, copies and deletes meet
/// objects that exist.
pub(super) const POOL: [&str; 6] = [
    "fuzz/a",
    "fuzz/b/c.txt",
    "fuzz/caf\u{e9}",
    "fuzz/sp ace",
    "reports/x",
    "other/k",
];

pub(super) const METHODS: [&str; 7] = ["GET", "PUT", "POST", "DELETE", "HEAD", "PATCH", "OPTIONS"];

impl Run {
    /// A method: mostly the usual seven, sometimes another token, rarely
    /// something that is not a method at all.
    pub(super) fn method(&mut self) -> (String, Option<&'static str>) {
        match self.f.below(40) {
            0 => {
                let m = self.f.pick(&[
                    "get", "TRACE", "PROPFIND", "MKCOL", "BREW", "M-SEARCH", "CONNECT",
                ]);
                (m.to_owned(), None)
            }
            1 => {
                let m = self.f.pick(&["G ET", "", "GET\0", "\u{e9}T\u{e9}"]);
                (m.to_owned(), Some("a malformed method"))
            }
            _ => (self.f.pick(&METHODS).to_owned(), None),
        }
    }

    /// One decoded segment of a random key.
    pub(super) fn segment(&mut self) -> String {
        match self.f.below(12) {
            0 => self.f.text(12).replace("hist", "h1st"),
            1 => "a".repeat(990 + self.f.index(80)),
            _ => self.f.pick(&SEGMENTS).to_owned(),
        }
    }

    /// A segment as it appears in a path: encoded one of several ways, or
    /// one of the raw spellings.
    pub(super) fn spelled_segment(&mut self) -> String {
        if self.f.one_in(10) {
            return self.f.pick(&RAW_SEGMENTS).to_owned();
        }
        let decoded = self.segment();
        match self.f.below(6) {
            // Every byte escaped, even unreserved ones.
            0 => decoded.bytes().map(|b| format!("%{b:02x}")).collect(),
            // As typed, where that is still a valid target (no space, #, ?).
            1 if decoded
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'#' | b'?' | b'%')) =>
            {
                decoded
            }
            _ => uri_encode(decoded.as_bytes(), true),
        }
    }

    /// A key path (as in the URL), 1 to 4 segments.
    pub(super) fn key_path(&mut self) -> String {
        let n = 1 + self.f.below(4);
        let mut parts = Vec::new();
        for _ in 0..n {
            parts.push(self.spelled_segment());
        }
        let mut path = parts.join(if self.f.one_in(15) { "//" } else { "/" });
        if self.f.one_in(20) {
            path.push('/');
        }
        path
    }

    /// A key under one of the gateway's buckets (or none), as in the URL.
    pub(super) fn object_key(&mut self) -> String {
        if self.f.one_in(2) {
            let key = self.f.pick(&POOL);
            return uri_encode(key.as_bytes(), false);
        }
        let prefix = match self.f.below(10) {
            0..=3 => "fuzz/",
            4..=5 => "reports/",
            6 => "other/",
            _ => "",
        };
        format!("{prefix}{}", self.key_path())
    }

    /// A visible-ASCII string of up to `max` chars.
    pub(super) fn ascii(&mut self, max: usize) -> String {
        let n = self.f.size(max);
        (0..n)
            .map(|_| char::from(0x21 + self.f.below(0x5e) as u8))
            .collect()
    }

    /// A header value: usually visible ASCII, sometimes obs-text (bytes
    /// 0x80-0xFF, allowed), huge or empty, rarely with control bytes
    /// (malformed).
    pub(super) fn value(&mut self, req: &mut Req) -> Vec<u8> {
        match self.f.below(12) {
            0 => {
                let mut v = self.ascii(8).into_bytes();
                for _ in 0..1 + self.f.below(4) {
                    v.push(0x80 + self.f.below(0x80) as u8);
                }
                v
            }
            1 => {
                let v = self.f.binary(40);
                if v.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                    req.may_close = Some("control bytes in a header");
                }
                v
            }
            2 => "x".repeat(4096 + self.f.index(60_000)).into_bytes(),
            3 => Vec::new(),
            _ => self.ascii(40).into_bytes(),
        }
    }

    /// A token text for a header: mostly well-formed, sometimes not at all.
    pub(super) fn token_value(&mut self, req: &mut Req) -> Vec<u8> {
        match self.f.below(10) {
            0 => self.value(req),
            1 => "9".repeat(1 + self.f.index(20_000)).into_bytes(),
            2..=4 => self.fresh_token().into_bytes(),
            _ => {
                let t = self.f.token();
                self.header_safe(req, t)
            }
        }
    }

    /// A rising token: random writes of the pool's keys keep applying.
    pub(super) fn fresh_token(&mut self) -> String {
        self.fresh += 1;
        format!("5.{}", self.fresh)
    }

    /// At most a condition or a range, well-formed (for clean requests).
    pub(super) fn light_headers(&mut self, req: &mut Req) {
        match self.f.below(8) {
            0 => {
                let v = self.range();
                req.header("Range", v);
            }
            1 => {
                let v = self.etag_list();
                req.header("If-None-Match", v);
            }
            2 => {
                let v = self.etag_list();
                req.header("If-Match", v);
            }
            3 => {
                let v = self.http_date();
                req.header("If-Modified-Since", v);
            }
            _ => {}
        }
    }

    /// `text` as header bytes; a value with control characters marks the
    /// request malformed.
    pub(super) fn header_safe(&mut self, req: &mut Req, text: String) -> Vec<u8> {
        if text
            .chars()
            .any(|c| (c < ' ' && c != '\t') || c == '\u{7f}')
        {
            req.may_close = Some("control bytes in a header");
        }
        text.into_bytes()
    }

    pub(super) fn etag_list(&mut self) -> String {
        if !self.etags.is_empty() && self.f.one_in(3) {
            let tag = self.f.pick(&self.etags);
            return match self.f.below(4) {
                0 => format!("W/{tag}"),
                1 => format!("\"0\", {tag}"),
                _ => tag,
            };
        }
        match self.f.below(8) {
            0 => "*".into(),
            1 => format!("\"{}\"", self.f.below(50)),
            2 => format!("W/\"{}\"", self.f.below(50)),
            3 => format!("\"{}\", \"{}\"", self.f.below(50), self.f.below(50)),
            4 => format!("\"{}\"", md5_hex(&self.f.bytes(4))),
            5 => "\"unterminated".into(),
            6 => ",,".into(),
            _ => self.ascii(30),
        }
    }

    pub(super) fn http_date(&mut self) -> String {
        match self.f.below(5) {
            0 => "Sun, 06 Nov 1994 08:49:37 GMT".into(),
            1 => "Sunday, 06-Nov-94 08:49:37 GMT".into(),
            2 => self.ascii(30),
            _ => {
                let t = self.f.below(4_000_000_000);
                httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
            }
        }
    }

    pub(super) fn range(&mut self) -> String {
        let n = |f: &mut Fuzz| -> String {
            match f.below(8) {
                0 => "18446744073709551616".into(),
                1 => format!("{}", f.u64()),
                2..=3 => format!("{}", f.below(2_000)),
                _ => format!("{}", f.below(40)),
            }
        };
        match self.f.below(10) {
            0 => format!("bytes={}-", n(&mut self.f)),
            1 => format!("bytes=-{}", n(&mut self.f)),
            2 => format!(
                "bytes={}-{},{}-{}",
                n(&mut self.f),
                n(&mut self.f),
                n(&mut self.f),
                n(&mut self.f)
            ),
            3 => self
                .f
                .pick(&[
                    "bytes=",
                    "bytes=-",
                    "bytes=--",
                    "bytes=5-2",
                    "items=0-1",
                    "bytes = 0-1",
                    "bytes=0-1,",
                ])
                .into(),
            4 => self.ascii(20),
            _ => format!("bytes={}-{}", n(&mut self.f), n(&mut self.f)),
        }
    }

    /// A body: empty, random bytes, text; up to 1 MiB.
    pub(super) fn body(&mut self) -> Vec<u8> {
        if self.f.one_in(40) {
            let n = self.f.index(1 << 20);
            return self.f.bytes(n);
        }
        self.f.binary(70_000)
    }

    /// Random headers common to both surfaces.
    pub(super) fn common_headers(&mut self, req: &mut Req) {
        if self.f.one_in(6) {
            let v = self.etag_list();
            req.header("If-Match", v);
        }
        if self.f.one_in(6) {
            let v = self.etag_list();
            req.header("If-None-Match", v);
        }
        if self.f.one_in(8) {
            let v = self.http_date();
            req.header(
                self.f.pick(&["If-Modified-Since", "If-Unmodified-Since"]),
                v,
            );
        }
        if self.f.one_in(req_reads(&req.method)) {
            let v = self.range();
            req.header("Range", v);
        }
        if self.f.one_in(15) {
            let v = self.etag_list();
            req.header("If-Range", v);
        }
        if self.f.one_in(10) {
            let v = self.value(req);
            req.header("Content-Type", v);
        }
        if self.f.one_in(10) {
            let v = if self.f.one_in(2) {
                md5_b64(&self.f.bytes(8))
            } else {
                self.ascii(30)
            };
            req.header("Content-MD5", v);
        }
        if self.f.one_in(10) {
            let name = self.f.pick(&[
                "x-amz-checksum-crc32",
                "x-amz-checksum-crc32c",
                "x-amz-checksum-sha1",
                "x-amz-checksum-sha256",
                "x-amz-checksum-crc64nvme",
            ]);
            let v = if self.f.one_in(2) {
                {
                    let n = 4 + self.f.index(30);
                    B64.encode(self.f.bytes(n))
                }
            } else {
                self.ascii(50)
            };
            req.header(name, v);
        }
        if self.f.one_in(12) {
            for _ in 0..1 + self.f.below(3) {
                let name = format!("x-amz-meta-{}", self.ascii(12).to_ascii_lowercase());
                let v = if self.f.one_in(3) {
                    "m".repeat(2000 + self.f.index(8000)).into_bytes()
                } else {
                    self.value(req)
                };
                req.header(&name, v);
            }
        }
        if self.f.one_in(12) {
            let v = self.token_value(req);
            req.header("Idempotency-Key", v);
        }
        if self.f.one_in(25) {
            req.header("Expect", "100-continue");
        }
        if self.f.one_in(10) {
            for _ in 0..1 + self.f.below(3) {
                let name = match self.f.below(8) {
                    0 => {
                        req.may_close = Some("a malformed header name");
                        self.f
                            .pick(&["bad name", "", "n\u{e9}", "x:y", "(x)"])
                            .to_owned()
                    }
                    1 => "X-".to_owned() + &"n".repeat(5000),
                    _ => format!(
                        "X-{}",
                        self.ascii(12)
                            .replace(':', "-")
                            .replace(|c: char| "()<>@,;\\\"/[]?={}".contains(c), "-",)
                    ),
                };
                let v = self.value(req);
                req.header(&name, v);
            }
        }
        if self.f.one_in(200) {
            // More headers than a server keeps.
            for i in 0..300 {
                req.header(&format!("X-Many-{i}"), "1");
            }
            req.may_close = Some("too many headers");
        }
    }

    // ---- the /objects surface ---------------------------------------

    /// An `/objects`, listing, lock or other non-S3 request.
    pub(super) fn random_objects(&mut self) -> Result<()> {
        let (method, malformed) = self.method();
        let kind = self.f.below(20);
        let target = match kind {
            0..=11 => format!("/objects/{}", self.object_key()),
            12..=13 => {
                let mut q = Vec::new();
                for _ in 0..self.f.below(4) {
                    let name = self.f.pick(&["prefix", "after", "limit", "limit", "x", ""]);
                    let value = match name {
                        "limit" => self
                            .f
                            .pick(&[
                                "0",
                                "1",
                                "2",
                                "1000",
                                "1001",
                                "-1",
                                "99999999999999999999",
                                "a",
                            ])
                            .to_owned(),
                        _ => self.key_path(),
                    };
                    q.push(format!("{name}={value}"));
                }
                format!(
                    "{}?{}",
                    self.f.pick(&["/objects/", "/objects"]),
                    q.join("&")
                )
            }
            14..=15 => format!(
                "/v1/locks/{}/{}",
                self.object_key(),
                self.f.pick(&["acquire", "renew", "release", "steal", ""])
            ),
            16 => self
                .f
                .pick(&[
                    "/healthz",
                    "/metrics",
                    "/objects",
                    "/objects/",
                    "/v1/locks/",
                    "/v1/locks/a",
                    "/objects/a?x=1",
                    "/objects/a?",
                    "/objects/%2e%2e/%2e%2e/etc/passwd",
                    "/./objects/a",
                    "/objects/../healthz",
                    "/healthz?x",
                    "/metrics/",
                ])
                .to_owned(),
            _ => return self.wild(method),
        };
        let mut req = Req::new(&method, target);
        let shown_method = if METHODS.contains(&method.as_str()) {
            method.as_str()
        } else {
            "other method"
        };
        req.label = format!(
            "{} {shown_method}",
            match kind {
                0..=11 => "objects",
                12..=13 => "listing",
                14..=15 => "locks",
                _ => "other paths",
            }
        );
        req.may_close = malformed;
        // A third are well-formed apart from their target and method (so
        // they get past the checks more often), the rest noisy.
        let clean = malformed.is_none() && self.f.one_in(3);
        req.plain = clean;
        let writes = matches!(method.as_str(), "PUT" | "DELETE" | "POST" | "PATCH");
        if clean {
            req.header("Authorization", format!("Bearer {ROOT_SECRET}"));
            if writes {
                let t = self.fresh_token();
                req.header("Fence-Token", t);
            }
            self.light_headers(&mut req);
        } else {
            self.bearer(&mut req);
            if self.f.one_in(if writes { 2 } else { 12 }) {
                let v = self.token_value(&mut req);
                req.header("Fence-Token", v);
                if self.f.one_in(15) {
                    let v = self.token_value(&mut req);
                    req.header("Fence-Token", v);
                }
            }
            self.common_headers(&mut req);
        }
        if writes || self.f.one_in(10) {
            req.body = if String::from_utf8_lossy(&req.target).starts_with("/v1/locks/")
                && self.f.below(3) > 0
            {
                self.lock_body()
            } else {
                self.body()
            };
        }
        self.exchange(req).map(|_| ())
    }

    /// A lock request's JSON body, sometimes broken.
    pub(super) fn lock_body(&mut self) -> Vec<u8> {
        let lease = match self.f.below(4) {
            0 => serde_json::json!(self.f.text(40)),
            1 => serde_json::json!(self.f.u64()),
            _ => serde_json::json!(format!("lease-{}", self.f.below(5))),
        };
        let ttl = match self.f.below(5) {
            0 => serde_json::json!(-1),
            1 => serde_json::json!(self.f.u64()),
            2 => serde_json::json!("1000"),
            _ => serde_json::json!(self.f.below(120_000)),
        };
        let token = serde_json::json!(self.f.token());
        let body = serde_json::json!({"lease_id": lease, "ttl_ms": ttl, "token": token});
        let text = body.to_string().into_bytes();
        if self.f.one_in(4) {
            self.f.damage(&text)
        } else {
            text
        }
    }

    /// `Authorization` for the bearer surface: mostly the root secret.
    pub(super) fn bearer(&mut self, req: &mut Req) {
        match self.f.below(20) {
            0 => {}
            1 => req.header("Authorization", format!("Bearer {}", self.ascii(40))),
            2 => {
                req.header("Authorization", format!("Bearer {ROOT_SECRET}"));
                req.header("Authorization", format!("Bearer {ROOT_SECRET}"));
            }
            3 => {
                let v = self.value(req);
                req.header("Authorization", v);
            }
            4 => req.header(
                "Authorization",
                self.f.pick(&[
                    "Bearer",
                    "Bearer ",
                    "bearer s3cret-root-7f1d9a",
                    "Basic cm9vdDpyb290",
                ]),
            ),
            _ => req.header("Authorization", format!("Bearer {ROOT_SECRET}")),
        }
    }

    /// A request whose target is odd: huge, raw bytes, other forms.
    pub(super) fn wild(&mut self, method: String) -> Result<()> {
        let mut malformed = None;
        let target: Vec<u8> = match self.f.below(8) {
            0 => {
                let n = 2_000 + self.f.index(120_000);
                format!("/objects/{}", "a/".repeat(n / 2)).into_bytes()
            }
            1 => {
                malformed = Some("raw bytes in the target");
                let mut t = b"/objects/".to_vec();
                let n = 1 + self.f.size(40);
                t.extend(self.f.bytes(n));
                t
            }
            2 => {
                malformed = Some("a space in the target");
                b"/objects/a b".to_vec()
            }
            3 => self
                .f
                .pick(&[
                    "*",
                    "http://127.0.0.1/objects/a",
                    "http://example.invalid/healthz",
                    "//objects/a",
                    "objects/a",
                    "/%2e%2e/objects/a",
                    "/objects/a#frag",
                    "/fuzz/../objects/a",
                ])
                .as_bytes()
                .to_vec(),
            4 => {
                malformed = Some("an empty target");
                Vec::new()
            }
            _ => format!("/{}", self.key_path()).into_bytes(),
        };
        let mut req = Req::new(&method, target);
        req.label = "odd targets".into();
        req.may_close = malformed;
        self.bearer(&mut req);
        self.common_headers(&mut req);
        if self.f.one_in(3) {
            req.body = self.body();
        }
        self.exchange(req).map(|_| ())
    }
}

/// How often a request carries a `Range` (1 in n).
pub(super) fn req_reads(method: &str) -> u64 {
    if matches!(method, "GET" | "HEAD") {
        3
    } else {
        15
    }
}
