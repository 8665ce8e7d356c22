//! Random requests to the S3 front: shaped like its operations, then
//! perturbed, and signed with AWS Signature V4 (validly, damaged after
//! signing, with a skewed clock, as a broken presigned URL, or not at all).

use std::collections::BTreeMap;

use anyhow::Result;
use base64::Engine as _;

use super::parts::POOL;
use super::sigv4::{self, Signer, sha256_hex, uri_encode};
use super::wire::Answer;
use super::{B64, BUCKET, KEY, READER_KEY, READER_SECRET, ROOT_SECRET, Req, Run, SECRET, Upload};
use super::{md5_b64, md5_hex, now};

impl Run {
    pub(super) fn bucket(&mut self) -> String {
        match self.f.below(20) {
            0..=8 => BUCKET.into(),
            9..=11 => "reports".into(),
            12 => "other".into(),
            13 => "nosuch".into(),
            14 => "Bad_Bucket".into(),
            15 => self
                .ascii(10)
                .to_ascii_lowercase()
                .replace(['/', '?', '#', '%'], ""),
            _ => BUCKET.into(),
        }
    }

    /// An S3 key as in the URL (may be empty: a bucket request).
    pub(super) fn s3_key(&mut self) -> String {
        self.key_path()
    }

    /// `pairs` as a query string (each name and value S3-encoded; a pair
    /// without a value as a bare name).
    pub(super) fn query(&mut self, pairs: &[(String, Option<String>)]) -> String {
        pairs
            .iter()
            .map(|(n, v)| match v {
                None => uri_encode(n.as_bytes(), true),
                Some(v) => format!(
                    "{}={}",
                    uri_encode(n.as_bytes(), true),
                    uri_encode(v.as_bytes(), true)
                ),
            })
            .collect::<Vec<_>>()
            .join("&")
    }

    pub(super) fn number(&mut self) -> String {
        match self.f.below(8) {
            0 => "0".into(),
            1 => "-1".into(),
            2 => "10001".into(),
            3 => "99999999999999999999".into(),
            4 => self.ascii(5),
            _ => format!("{}", 1 + self.f.below(12)),
        }
    }

    /// An upload id: one the gateway gave (if any), or made up.
    pub(super) fn upload_id(&mut self) -> (Option<usize>, String) {
        if !self.uploads.is_empty() && self.f.below(4) > 0 {
            let i = self.f.index(self.uploads.len());
            let id = self.uploads[i].id.clone();
            if self.f.one_in(10) {
                let damaged = String::from_utf8_lossy(&self.f.damage(id.as_bytes())).into_owned();
                return (None, damaged);
            }
            return (Some(i), id);
        }
        (None, self.ascii(40))
    }

    /// The fence token of an S3 write: the header, the metadata, both
    /// (agreeing or not), or none.
    pub(super) fn s3_token(&mut self, req: &mut Req) {
        match self.f.below(10) {
            0..=4 => {
                let v = self.token_value(req);
                req.header("fence-token", v);
            }
            5..=6 => {
                let v = self.token_value(req);
                req.header("x-amz-meta-fence-token", v);
            }
            7 => {
                let t = self.f.token();
                let v = self.header_safe(req, t);
                req.header("fence-token", v.clone());
                let other = if self.f.one_in(2) {
                    v
                } else {
                    let t = self.f.token();
                    self.header_safe(req, t)
                };
                req.header("x-amz-meta-fence-token", other);
            }
            _ => {}
        }
    }

    /// A CompleteMultipartUpload document: the parts uploaded (if the id
    /// is one of ours), or made up; sometimes damaged.
    pub(super) fn complete_xml(&mut self, upload: Option<usize>) -> Vec<u8> {
        let mut parts: Vec<(String, String)> = match upload.and_then(|i| self.uploads.get(i)) {
            Some(u) if self.f.below(4) > 0 => u
                .parts
                .iter()
                .map(|(n, e)| (n.to_string(), e.clone()))
                .collect(),
            _ => (0..self.f.below(4))
                .map(|_| (self.number(), format!("\"{}\"", md5_hex(&self.f.bytes(4)))))
                .collect(),
        };
        if self.f.one_in(6) {
            parts.reverse();
        }
        if self.f.one_in(8) && !parts.is_empty() {
            let i = self.f.index(parts.len());
            parts[i].1 = format!("\"{}\"", self.ascii(20));
        }
        let mut xml = String::from(
            "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">",
        );
        for (n, e) in parts {
            xml.push_str(&format!(
                "<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>"
            ));
        }
        xml.push_str("</CompleteMultipartUpload>");
        self.maybe_damage(xml.into_bytes())
    }

    /// A DeleteObjects document over random keys.
    pub(super) fn delete_xml(&mut self) -> Vec<u8> {
        let mut xml = String::from("<Delete>");
        if self.f.one_in(3) {
            xml.push_str("<Quiet>true</Quiet>");
        }
        let n = match self.f.below(10) {
            0 => 0,
            1 => 1001,
            _ => 1 + self.f.below(5),
        };
        for _ in 0..n {
            let key = self.segment();
            let key = key
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;");
            xml.push_str(&format!("<Object><Key>{key}</Key>"));
            if self.f.one_in(10) {
                xml.push_str("<VersionId>1</VersionId>");
            }
            xml.push_str("</Object>");
        }
        xml.push_str("</Delete>");
        self.maybe_damage(xml.into_bytes())
    }

    pub(super) fn maybe_damage(&mut self, bytes: Vec<u8>) -> Vec<u8> {
        match self.f.below(10) {
            0 => self.f.damage(&bytes),
            1 => self.f.binary(200),
            _ => bytes,
        }
    }

    /// A random S3 request, mostly shaped like one of the operations, then
    /// signed (or mis-signed) and sent.
    pub(super) fn random_s3(&mut self) -> Result<()> {
        let (bucket, key) = match self.f.pick(&POOL).split_once('/') {
            Some((b, k)) if self.f.one_in(2) => (b.to_owned(), uri_encode(k.as_bytes(), false)),
            _ => (self.bucket(), self.s3_key()),
        };
        let object = format!("/{bucket}/{key}");
        let bucket_path = if self.f.one_in(2) {
            format!("/{bucket}")
        } else {
            format!("/{bucket}/")
        };
        let mut q: Vec<(String, Option<String>)> = Vec::new();
        let mut upload = None;
        let op = self.f.below(20);
        let (method, path) = match op {
            0..=2 => ("PUT", object.clone()),
            3..=4 => (self.f.pick(&["GET", "HEAD"]), object.clone()),
            5 => ("DELETE", object.clone()),
            6 => {
                q.push((
                    "list-type".into(),
                    Some(self.f.pick(&["2", "2", "1", "3", ""]).into()),
                ));
                for name in [
                    "prefix",
                    "delimiter",
                    "continuation-token",
                    "start-after",
                    "max-keys",
                    "encoding-type",
                    "fetch-owner",
                ] {
                    if self.f.one_in(3) {
                        let v = match name {
                            "max-keys" => self.number(),
                            "delimiter" => self.f.pick(&["/", "", "a", "//", "\u{e9}"]).to_owned(),
                            "continuation-token" if self.f.one_in(2) => {
                                base64::engine::general_purpose::URL_SAFE_NO_PAD
                                    .encode(self.segment())
                            }
                            _ => self.segment(),
                        };
                        q.push((name.into(), Some(v)));
                    }
                }
                ("GET", bucket_path.clone())
            }
            7 => {
                for name in ["prefix", "delimiter", "marker", "max-keys"] {
                    if self.f.one_in(2) {
                        let v = if name == "max-keys" {
                            self.number()
                        } else {
                            self.segment()
                        };
                        q.push((name.into(), Some(v)));
                    }
                }
                ("GET", bucket_path.clone())
            }
            8 => {
                q.push(("uploads".into(), None));
                ("POST", object.clone())
            }
            9..=10 => {
                let (i, id) = self.upload_id();
                upload = i;
                let n = self.number();
                q.push(("partNumber".into(), Some(n)));
                q.push(("uploadId".into(), Some(id)));
                let path = match i.and_then(|i| self.uploads.get(i)) {
                    Some(u) if self.f.below(4) > 0 => format!("/{}/{}", u.bucket, u.key),
                    _ => object.clone(),
                };
                ("PUT", path)
            }
            11 => {
                let (i, id) = self.upload_id();
                upload = i;
                q.push(("uploadId".into(), Some(id)));
                let path = match i.and_then(|i| self.uploads.get(i)) {
                    Some(u) if self.f.below(4) > 0 => format!("/{}/{}", u.bucket, u.key),
                    _ => object.clone(),
                };
                (self.f.pick(&["POST", "POST", "DELETE", "GET"]), path)
            }
            12 => {
                q.push(("uploads".into(), None));
                for name in [
                    "prefix",
                    "delimiter",
                    "key-marker",
                    "upload-id-marker",
                    "max-uploads",
                ] {
                    if self.f.one_in(3) {
                        let v = if name == "max-uploads" {
                            self.number()
                        } else {
                            self.segment()
                        };
                        q.push((name.into(), Some(v)));
                    }
                }
                ("GET", bucket_path.clone())
            }
            13 => {
                q.push(("delete".into(), None));
                ("POST", bucket_path.clone())
            }
            14 => ("PUT", object.clone()), // CopyObject (x-amz-copy-source below)
            15 => {
                let (m, p) = self.f.pick(&[
                    ("HEAD", 0),
                    ("GET", 0),
                    ("GET", 1),
                    ("PUT", 0),
                    ("DELETE", 0),
                ]);
                if p == 1 {
                    q.push(("location".into(), None));
                }
                (m, bucket_path.clone())
            }
            16 => (self.f.pick(&["GET", "GET", "PUT", "POST"]), "/".to_owned()),
            17 => {
                let sub = self.f.pick(&[
                    "tagging",
                    "acl",
                    "versioning",
                    "policy",
                    "cors",
                    "lifecycle",
                    "website",
                    "object-lock",
                    "retention",
                    "legal-hold",
                    "torrent",
                    "restore",
                    "select",
                    "attributes",
                    "versions",
                    "encryption",
                    "notification",
                ]);
                q.push((
                    sub.into(),
                    if sub == "select" {
                        Some("".into())
                    } else {
                        None
                    },
                ));
                (
                    self.f.pick(&["GET", "PUT", "POST", "DELETE"]),
                    if self.f.one_in(2) {
                        object.clone()
                    } else {
                        bucket_path.clone()
                    },
                )
            }
            _ => {
                let (m, _) = self.method();
                for _ in 0..self.f.below(4) {
                    let name = self.f.pick(&[
                        "uploads",
                        "uploadId",
                        "partNumber",
                        "list-type",
                        "versionId",
                        "delete",
                        "x-id",
                        "max-keys",
                        "prefix",
                        "response-content-type",
                        "X-Amz-Expires",
                        "",
                    ]);
                    let v = if self.f.one_in(3) {
                        None
                    } else {
                        Some(self.segment())
                    };
                    q.push((name.into(), v));
                }
                let m: &'static str = match m.as_str() {
                    "GET" => "GET",
                    "PUT" => "PUT",
                    "POST" => "POST",
                    "DELETE" => "DELETE",
                    "HEAD" => "HEAD",
                    "PATCH" => "PATCH",
                    _ => "OPTIONS",
                };
                (m, object.clone())
            }
        };
        // A few stray parameters.
        if self.f.one_in(6) {
            let name = self.f.pick(&[
                "versionId",
                "partNumber",
                "x-id",
                "response-content-disposition",
                "uploadId",
            ]);
            let v = self.segment();
            q.push((name.into(), Some(v)));
        }
        let mut query = self.query(&q);
        if self.f.one_in(25) {
            // Escapes that do not decode to UTF-8, bare `%`, `+`.
            query = format!(
                "{query}&{}",
                self.f
                    .pick(&["prefix=%ff", "x=%", "a+b=c+d", "=", "&&", "k=%c3%28"])
            );
        }
        let mut req = Req::new(method, path.clone());
        req.label = format!(
            "s3 {}",
            match op {
                0..=2 => "PutObject",
                3..=4 => "GetObject/HeadObject",
                5 => "DeleteObject",
                6 => "ListObjectsV2",
                7 => "ListObjects",
                8 => "CreateMultipartUpload",
                9..=10 => "UploadPart(Copy)",
                11 => "Complete/Abort/ListParts",
                12 => "ListMultipartUploads",
                13 => "DeleteObjects",
                14 => "CopyObject",
                15 => "bucket",
                16 => "service",
                17 => "not served",
                _ => "any",
            }
        );
        // The operation's own headers and body.
        match op {
            0..=2 | 9..=10 => {
                if op <= 2 {
                    self.s3_token(&mut req);
                }
                req.body = self.body();
                if self.f.one_in(3) {
                    // The right digest, so the write can go through.
                    let md5 = md5_b64(&req.body);
                    req.header("Content-MD5", md5);
                }
            }
            5 | 8 => self.s3_token(&mut req),
            11 if method == "POST" => {
                if self.f.one_in(2) {
                    self.s3_token(&mut req);
                }
                req.body = self.complete_xml(upload);
            }
            13 => {
                self.s3_token(&mut req);
                req.body = self.delete_xml();
                if self.f.below(3) > 0 {
                    let md5 = md5_b64(&req.body);
                    req.header("Content-MD5", md5);
                }
            }
            14 => {
                self.s3_token(&mut req);
                let source = format!("{}/{}", self.bucket(), self.s3_key());
                let source = match self.f.below(6) {
                    0 => format!("/{source}"),
                    1 => format!("{source}?versionId={}", self.number()),
                    2 => self.ascii(30),
                    _ => source,
                };
                req.header("x-amz-copy-source", source);
                if self.f.one_in(3) {
                    req.header(
                        "x-amz-metadata-directive",
                        self.f.pick(&["REPLACE", "COPY", "replace", "MOVE"]),
                    );
                }
                if self.f.one_in(6) {
                    let name = self.f.pick(&[
                        "x-amz-copy-source-if-match",
                        "x-amz-copy-source-if-none-match",
                        "x-amz-copy-source-if-modified-since",
                        "x-amz-copy-source-if-unmodified-since",
                    ]);
                    let v = self.etag_list();
                    req.header(name, v);
                }
            }
            _ => {}
        }
        if matches!(op, 9 | 10) && self.f.one_in(4) {
            // UploadPartCopy.
            let source = format!("/{}/{}", self.bucket(), self.s3_key());
            req.header("x-amz-copy-source", source);
            if self.f.one_in(2) {
                let r = self.range();
                req.header("x-amz-copy-source-range", r);
            }
        }
        if op == 17 && self.f.one_in(2) {
            req.body = self.maybe_damage(
                b"<Tagging><TagSet><Tag><Key>a</Key><Value>b</Value></Tag></TagSet></Tagging>"
                    .to_vec(),
            );
        }
        let clean = self.f.one_in(3);
        req.plain = clean;
        if clean {
            self.light_headers(&mut req);
        } else {
            self.common_headers(&mut req);
        }
        let query = self.sign(&mut req, &path, &query, clean);
        if !query.is_empty() || self.f.one_in(30) {
            req.target.push(b'?');
            req.target.extend_from_slice(query.as_bytes());
        }
        let answer = self.exchange(req)?;
        if let Some(a) = answer {
            self.learn(op, method, &path, &q, a);
        }
        Ok(())
    }

    /// Remember upload ids and part ETags the gateway handed out.
    pub(super) fn learn(
        &mut self,
        op: u64,
        method: &str,
        path: &str,
        q: &[(String, Option<String>)],
        a: Answer,
    ) {
        if a.status != 200 {
            return;
        }
        let text = String::from_utf8_lossy(&a.body);
        if op == 8 && method == "POST" {
            let id = text
                .split_once("<UploadId>")
                .and_then(|(_, rest)| rest.split_once("</UploadId>"))
                .map(|(id, _)| id.to_owned());
            let mut parts = path.trim_start_matches('/').splitn(2, '/');
            if let (Some(id), Some(bucket), Some(key)) = (id, parts.next(), parts.next()) {
                self.uploads.push(Upload {
                    bucket: bucket.to_owned(),
                    key: key.to_owned(),
                    id,
                    parts: BTreeMap::new(),
                });
                if self.uploads.len() > 32 {
                    self.uploads.remove(0);
                }
            }
        }
        if matches!(op, 9 | 10) && method == "PUT" {
            let get = |name: &str| {
                q.iter()
                    .find(|(n, _)| n == name)
                    .and_then(|(_, v)| v.clone())
            };
            let etag = a.header("etag").map(str::to_owned).or_else(|| {
                text.split_once("<ETag>")
                    .and_then(|(_, rest)| rest.split_once("</ETag>"))
                    .map(|(e, _)| e.replace("&quot;", "\""))
            });
            if let (Some(id), Some(n), Some(etag)) = (get("uploadId"), get("partNumber"), etag)
                && let Ok(n) = n.parse::<u32>()
                && let Some(u) = self.uploads.iter_mut().find(|u| u.id == id)
            {
                u.parts.insert(n, etag);
            }
        }
    }

    /// Sign `req` for the S3 front, well or badly; `aws-chunked` bodies
    /// are framed here (they are signed chunk by chunk). The query string
    /// to send (presigned parameters are added to it).
    pub(super) fn sign(&mut self, req: &mut Req, path: &str, query: &str, clean: bool) -> String {
        let mode = self.f.below(if clean { 65 } else { 100 });
        let (key, secret) = if (65..70).contains(&mode) {
            (READER_KEY, READER_SECRET)
        } else {
            (KEY, SECRET)
        };
        let skew: i64 = if (80..85).contains(&mode) {
            let s = 1_000 + i64::try_from(self.f.below(100_000_000)).unwrap_or(0);
            if self.f.one_in(2) { s } else { -s }
        } else {
            0
        };
        let signer = Signer::at(key, secret, now() + skew);
        match mode {
            85..=89 => {
                let v = match self.f.below(6) {
                    0 => format!("AWS4-HMAC-SHA256 {}", self.ascii(120)),
                    1 => format!("AWS {KEY}:{}", B64.encode(self.f.bytes(20))),
                    2 => format!("Bearer {ROOT_SECRET}"),
                    3 => format!(
                        "AWS4-HMAC-SHA256 Credential={KEY}/20200101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature={}",
                        "0".repeat(64)
                    ),
                    4 => format!(
                        "AWS4-HMAC-SHA256 Credential=NOSUCHKEY/{}/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature={}",
                        signer.amz_date.get(..8).unwrap_or(""),
                        "ab".repeat(32)
                    ),
                    _ => {
                        let v = self.value(req);
                        req.header("Authorization", v);
                        return query.to_owned();
                    }
                };
                req.header("Authorization", v);
                if self.f.one_in(2) {
                    req.header("x-amz-date", signer.amz_date.clone());
                    req.header("x-amz-content-sha256", "UNSIGNED-PAYLOAD");
                }
                return query.to_owned();
            }
            90..=94 => {
                // Presigned-URL parameters, mostly wrong.
                let extra = format!(
                    "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={}&X-Amz-Date={}&X-Amz-Expires={}&X-Amz-SignedHeaders=host&X-Amz-Signature={}",
                    uri_encode(
                        format!(
                            "{KEY}/{}/us-east-1/s3/aws4_request",
                            signer.amz_date.get(..8).unwrap_or("")
                        )
                        .as_bytes(),
                        true
                    ),
                    signer.amz_date,
                    self.number(),
                    if self.f.one_in(2) {
                        "0".repeat(64)
                    } else {
                        self.ascii(64)
                    }
                );
                return if query.is_empty() {
                    extra
                } else {
                    format!("{query}&{extra}")
                };
            }
            95..=99 => return query.to_owned(),
            _ => {}
        }
        // A real signature over the request as it will be sent.
        let body = std::mem::take(&mut req.body);
        let chunked = !body.is_empty() && req.method == "PUT" && self.f.one_in(8);
        let payload = if chunked {
            if self.f.one_in(2) {
                "STREAMING-AWS4-HMAC-SHA256-PAYLOAD".to_owned()
            } else {
                "STREAMING-UNSIGNED-PAYLOAD-TRAILER".to_owned()
            }
        } else {
            match self.f.below(10) {
                0..=1 => "UNSIGNED-PAYLOAD".to_owned(),
                2 if (70..80).contains(&mode) => sha256_hex(&self.f.bytes(8)),
                3 if (70..80).contains(&mode) => self.ascii(70),
                _ => sha256_hex(&body),
            }
        };
        req.header("x-amz-date", signer.amz_date.clone());
        req.header("x-amz-content-sha256", payload.clone());
        if chunked {
            req.header("content-encoding", "aws-chunked");
            req.header("x-amz-decoded-content-length", body.len().to_string());
            if payload.ends_with("TRAILER") {
                req.header("x-amz-trailer", "x-amz-checksum-crc32");
            }
        }
        let host = self.gw.addr.clone();
        let mut signed_values: Vec<(String, String)> = vec![("host".into(), host)];
        for (n, v) in &req.headers {
            signed_values.push((
                n.to_ascii_lowercase(),
                String::from_utf8_lossy(v).into_owned(),
            ));
        }
        let mut names = vec!["host", "x-amz-content-sha256", "x-amz-date"];
        if self.f.one_in(4) {
            for (n, v) in &req.headers {
                let n = n.as_str();
                if (n.starts_with("x-amz-") || n == "fence-token" || n == "content-md5")
                    && v.iter().all(|b| b.is_ascii_graphic() || *b == b' ')
                    && !names.contains(&n)
                {
                    names.push(n);
                }
            }
        }
        let (authorization, signature) =
            signer.sign(&req.method, path, query, &signed_values, &names, &payload);
        let authorization = if (70..80).contains(&mode) {
            // Damaged after signing: the signature, or what it covers.
            match self.f.below(4) {
                0 => String::from_utf8_lossy(&self.f.damage(authorization.as_bytes())).into_owned(),
                1 => authorization.replace(KEY, "AKIAFENCECHECKNONE"),
                2 => {
                    if let Some((_, v)) = req.headers.iter_mut().find(|(n, _)| n == "x-amz-date") {
                        *v = self
                            .f
                            .pick(&["20200101T000000Z", "garbage", "", "99999999T999999Z"])
                            .into();
                    }
                    authorization
                }
                _ => {
                    let t = self.f.token();
                    req.header("fence-token", t.replace(|c: char| c.is_control(), ""));
                    authorization
                }
            }
        } else {
            authorization
        };
        req.header("Authorization", authorization);
        req.body = if chunked {
            let size = 1 + self.f.index(70_000);
            let wire = if payload.ends_with("TRAILER") {
                let crc = if self.f.one_in(3) {
                    self.f.u64() as u32
                } else {
                    sigv4::crc32(&body)
                };
                sigv4::unsigned_chunks(
                    &body,
                    size,
                    ("x-amz-checksum-crc32", &B64.encode(crc.to_be_bytes())),
                )
            } else {
                signer.signed_chunks(&body, size, &signature)
            };
            if self.f.one_in(5) {
                self.f.damage(&wire)
            } else {
                wire
            }
        } else {
            body
        };
        query.to_owned()
    }
}
