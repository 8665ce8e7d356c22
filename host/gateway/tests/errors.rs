//! Every error answer says what its body is: the S3 front's are
//! `application/xml` S3 error documents, `/objects`' and the other plain
//! routes' `application/problem+json` (RFC 9457). The codes are read from
//! the gateway's source, so a code added there and not provoked here fails
//! the walk; each is provoked by a real request to a real gateway, and its
//! body is parsed as its header says (XML by Python's parser, JSON by
//! serde_json) and must name that code.

use crate::common;
use crate::s3::fuzz::sigv4;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use common::{Gateway, ROOT_SECRET, Response, sha256_hex};
use serde_json::json;
use sigv4::Signer;

const KEY: &str = "AKIAFENCECHECKROOT";
const SECRET: &str = "rootSecretAccessKey/0123456789abcdefABCDEF";
const READER_KEY: &str = "AKIAFENCECHECKREAD";
const READER_SECRET: &str = "readerSecretAccessKey/0123456789abcdefAB";
const READER_BEARER: &str = "reader-bearer-5e2b";
const MAX_BODY: usize = 65_536;

/// Codes in the source that are not error answers, or that no request can
/// provoke here; each with why (and where it is covered, if anywhere).
const S3_NOT_WALKED: &[(&str, &str)] = &[
    ("NotModified", "304: not an error; no body"),
    (
        "SlowDown",
        "--max-in-flight exhausted: no request holds a slot long enough to be deterministic",
    ),
    (
        "CommitUnknown",
        "PostgreSQL only: a connection lost during COMMIT",
    ),
    (
        "FenceStateRefused",
        "a stored fence state the component refuses: not reachable through the API",
    ),
    (
        "InvalidFenceKeys",
        "signing keys the store accepted but the component refuses: not reachable through the API",
    ),
];
const PROBLEMS_NOT_WALKED: &[(&str, &str)] = &[
    (
        "overloaded",
        "--max-in-flight exhausted (tests/slow.rs: --max-connections' 503 is the same document)",
    ),
    (
        "commit-unknown",
        "PostgreSQL only: a connection lost during COMMIT",
    ),
    (
        "insufficient-storage",
        "a full filesystem (tests/durable.rs, on a tmpfs, checks its type)",
    ),
    (
        "refused",
        "500: a stored fence state the component refuses; 400 (locks): the coordinator's own refusal, after the gateway's checks",
    ),
    (
        "invalid-keys",
        "signing keys the store accepted but the component refuses: not reachable through the API",
    ),
    (
        "invalid-request",
        "the component's InvalidRequest: the gateway validates tokens and keys before it",
    ),
];

/// Auth: `root` (bearer and S3, every right), `reader` (bearer and S3,
/// read on `reports/`, lock on `held/`).
fn auth_file(data: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(data)?;
    let file = data.join("auth.toml");
    std::fs::write(
        &file,
        format!(
            r#"[[principal]]
name = "root"
secret_sha256 = "{}"
access_key_id = "{KEY}"
secret_access_key = "{SECRET}"
read = [""]
write = [""]
lock = [""]

[[principal]]
name = "reader"
secret_sha256 = "{}"
access_key_id = "{READER_KEY}"
secret_access_key = "{READER_SECRET}"
read = ["reports/"]
lock = ["held/"]
"#,
            sha256_hex(ROOT_SECRET),
            sha256_hex(READER_BEARER)
        ),
    )?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

fn start(data: &Path) -> anyhow::Result<Gateway> {
    let auth = auth_file(data)?.display().to_string();
    let max = MAX_BODY.to_string();
    let mut gw = Gateway::spawn_logged(
        data,
        &[
            "--auth",
            &auth,
            "--bucket",
            "reports",
            "--max-body",
            &max,
            "--body-timeout",
            "1",
        ],
        Some(ROOT_SECRET.to_owned()),
        None,
        &[],
    )?;
    gw.wait_healthy()?;
    Ok(gw)
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0))
}

/// One S3 request to `gw`, signed by `(key, secret)` over `headers`
/// (lower-case names) and a payload hash of `signed_body`; `body` is what
/// is sent (`declared` its Content-Length, cut short if it is more).
struct S3Req<'a> {
    method: &'a str,
    path: &'a str,
    query: &'a str,
    headers: Vec<(&'a str, String)>,
    body: Vec<u8>,
    signer: Signer,
}

impl<'a> S3Req<'a> {
    fn new(method: &'a str, path: &'a str) -> Self {
        Self {
            method,
            path,
            query: "",
            headers: Vec::new(),
            body: Vec::new(),
            signer: Signer::at(KEY, SECRET, now()),
        }
    }

    fn query(mut self, query: &'a str) -> Self {
        self.query = query;
        self
    }

    fn header(mut self, name: &'a str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    fn by(mut self, key: &str, secret: &str) -> Self {
        self.signer = Signer::at(key, secret, now());
        self
    }

    /// The head's headers, signed.
    fn signed(&self, gw: &Gateway) -> Vec<(String, String)> {
        let payload = sigv4::sha256_hex(&self.body);
        let mut headers: Vec<(String, String)> = vec![
            ("host".into(), gw.addr.clone()),
            ("x-amz-date".into(), self.signer.amz_date.clone()),
            ("x-amz-content-sha256".into(), payload.clone()),
        ];
        headers.extend(
            self.headers
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v.clone())),
        );
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        let (authorization, _) = self.signer.sign(
            self.method,
            self.path,
            self.query,
            &headers,
            &names,
            &payload,
        );
        // `host` is sent by the client helper.
        headers.retain(|(n, _)| n != "host");
        headers.push(("authorization".into(), authorization));
        headers
    }

    fn target(&self) -> String {
        if self.query.is_empty() {
            self.path.to_owned()
        } else {
            format!("{}?{}", self.path, self.query)
        }
    }

    fn send(self, gw: &Gateway) -> anyhow::Result<Response> {
        let headers = self.signed(gw);
        let list: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        common::request_to(&gw.addr, self.method, &self.target(), &list, &self.body)
    }

    /// Declare the whole body, send only `sent` bytes, then half-close.
    fn send_cut(self, gw: &Gateway, sent: usize) -> anyhow::Result<Response> {
        let headers = self.signed(gw);
        let list: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let mut open = common::open_to(
            &gw.addr,
            self.method,
            &self.target(),
            &list,
            Some(self.body.len()),
        )?;
        open.send(&self.body[..sent])?;
        open.cut()
    }

    /// Declare the whole body, send `sent` bytes and wait: the gateway's
    /// body timeout answers.
    fn send_stalled(self, gw: &Gateway, sent: usize) -> anyhow::Result<Response> {
        let headers = self.signed(gw);
        let list: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let mut open = common::open_to(
            &gw.addr,
            self.method,
            &self.target(),
            &list,
            Some(self.body.len()),
        )?;
        open.send(&self.body[..sent])?;
        open.response()
    }
}

/// What the walk saw: per code, its answers.
#[derive(Default)]
struct Walk {
    s3: BTreeMap<String, u16>,
    problems: BTreeMap<String, u16>,
    /// (expected code, XML body) for the parser.
    xml: Vec<(String, Vec<u8>)>,
}

impl Walk {
    /// An S3 error answer with `code`: typed `application/xml`, a body
    /// (parsed later) unless HEAD.
    fn s3(&mut self, code: &str, status: u16, r: &Response, head: bool) -> anyhow::Result<()> {
        ensure!(
            r.status == status,
            "{code}: status {} not {status}: {r:?}",
            r.status
        );
        ensure!(
            r.header("content-type") == Some("application/xml"),
            "{code}: Content-Type {:?}: {r:?}",
            r.header("content-type")
        );
        if head {
            ensure!(r.body.is_empty(), "{code}: a HEAD answer with a body");
        } else {
            self.xml.push((code.to_owned(), r.body.clone()));
        }
        self.s3.insert(code.to_owned(), status);
        Ok(())
    }

    /// A problem answer with `title`: typed `application/problem+json`, an
    /// RFC 9457 body (type, title, status, detail) unless HEAD.
    fn problem(
        &mut self,
        title: &str,
        status: u16,
        r: &Response,
        head: bool,
    ) -> anyhow::Result<()> {
        ensure!(
            r.status == status,
            "{title}: status {} not {status}: {r:?}",
            r.status
        );
        ensure!(
            r.header("content-type") == Some("application/problem+json"),
            "{title}: Content-Type {:?}: {r:?}",
            r.header("content-type")
        );
        if head {
            ensure!(r.body.is_empty(), "{title}: a HEAD answer with a body");
        } else {
            let doc: serde_json::Value =
                serde_json::from_slice(&r.body).with_context(|| format!("{title}: {r:?}"))?;
            ensure!(
                doc["type"] == format!("https://fencecheck.invalid/problems/{title}")
                    && doc["title"] == title
                    && doc["status"] == status
                    && doc["detail"].as_str().is_some_and(|d| !d.is_empty()),
                "{title}: {doc}"
            );
        }
        self.problems.insert(title.to_owned(), status);
        Ok(())
    }

    /// Parse every XML body with Python's XML parser: one `<Error>` root
    /// whose `<Code>` is the expected one and with a `<Message>`.
    fn parse_xml(&self, dir: &Path) -> anyhow::Result<()> {
        let docs = dir.join("xml");
        std::fs::create_dir_all(&docs)?;
        for (i, (_, body)) in self.xml.iter().enumerate() {
            std::fs::write(docs.join(format!("{i:03}.xml")), body)?;
        }
        let script = r#"
import os, sys, xml.etree.ElementTree as ET
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    root = ET.parse(os.path.join(d, name)).getroot()
    assert root.tag == "Error", (name, root.tag)
    assert (root.findtext("Message") or "").strip(), (name, "no Message")
    print(name, root.findtext("Code"))
"#;
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(&docs)
            .output()
            .context("running python3")?;
        ensure!(
            out.status.success(),
            "an S3 error body is not well-formed XML: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout)?;
        let codes: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(_, c)| c))
            .collect();
        let expected: Vec<&str> = self.xml.iter().map(|(c, _)| c.as_str()).collect();
        ensure!(codes == expected, "parsed {codes:?}, expected {expected:?}");
        Ok(())
    }
}

/// The identifiers (or quoted names) that follow each `marker` in `text`.
fn names_after(text: &str, marker: &str, quoted: bool) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices(marker) {
        let rest = text[at + marker.len()..].trim_start();
        let rest = if quoted {
            match rest.strip_prefix('"') {
                Some(r) => r,
                None => continue,
            }
        } else {
            rest
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        if !name.is_empty() {
            found.push(name);
        }
    }
    found
}

fn sources(dir: &str) -> anyhow::Result<String> {
    let mut text = String::new();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&std::fs::read_to_string(&path)?);
        }
    }
    Ok(text)
}

/// The S3 codes the gateway's source answers with.
fn s3_codes() -> anyhow::Result<BTreeSet<String>> {
    let text = sources("src/s3")?;
    let mut codes: BTreeSet<String> = names_after(&text, "S3ErrorCode::", false)
        .into_iter()
        .filter(|c| c != "Custom")
        .collect();
    codes.extend(names_after(&text, "fence_error(", true));
    codes.extend(names_after(&text, "s3_error!(", false));
    Ok(codes)
}

/// The problem types of the plain routes: `problem(STATUS, "title"` in
/// src/http and src/locks.rs.
fn problem_titles() -> anyhow::Result<BTreeSet<String>> {
    let mut text = sources("src/http")?;
    text.push_str(&std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/locks.rs"),
    )?);
    let mut titles = BTreeSet::new();
    for (at, _) in text.match_indices("problem(") {
        let rest = text[at + "problem(".len()..].trim_start();
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits != 3 {
            continue;
        }
        let rest = rest[digits..].trim_start();
        let Some(rest) = rest.strip_prefix(',') else {
            continue;
        };
        if let Some(name) = names_after(rest, "", true).first() {
            titles.insert(name.clone());
        }
    }
    Ok(titles)
}

fn lock(
    gw: &Gateway,
    bearer: &str,
    lock: &str,
    action: &str,
    body: serde_json::Value,
) -> anyhow::Result<Response> {
    let auth = format!("Bearer {bearer}");
    gw.request(
        "POST",
        &format!("/v1/locks/{lock}/{action}"),
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &auth),
        ],
        body.to_string().as_bytes(),
    )
}

fn between<'a>(text: &'a str, open: &str, close: &str) -> Option<&'a str> {
    let start = text.find(open)? + open.len();
    let end = text[start..].find(close)? + start;
    Some(&text[start..end])
}

/// The one blob file holding exactly `body` (by content: modification
/// times tie within the clock's granularity when writes come fast).
fn blob_holding(data: &Path, body: &[u8]) -> anyhow::Result<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(data.join("blobs"))? {
        let path = entry?.path();
        if std::fs::read(&path)? == body {
            found.push(path);
        }
    }
    ensure!(found.len() == 1, "blobs holding {body:?}: {found:?}");
    Ok(found.remove(0))
}

/// The S3 front's error codes, each provoked.
fn walk_s3(gw: &Gateway, walk: &mut Walk) -> anyhow::Result<()> {
    let put = |path: &'static str, token: &str, body: &[u8]| {
        S3Req::new("PUT", path)
            .header("fence-token", token)
            .body(body.to_vec())
    };
    ensure!(put("/reports/a", "0.2", b"first").send(gw)?.status == 200);

    walk.s3(
        "StaleFence",
        409,
        &put("/reports/a", "0.1", b"old").send(gw)?,
        false,
    )?;
    let r = S3Req::new("PUT", "/reports/a").body("x").send(gw)?;
    walk.s3("MissingFenceToken", 428, &r, false)?;
    let r = put("/reports/a", "0.2", b"x")
        .by(READER_KEY, READER_SECRET)
        .send(gw)?;
    walk.s3("AccessDenied", 403, &r, false)?;
    let r = S3Req::new("GET", "/reports/a")
        .by("AKIAUNKNOWNKEY000000", SECRET)
        .send(gw)?;
    walk.s3("InvalidAccessKeyId", 403, &r, false)?;
    let r = S3Req::new("GET", "/reports/a")
        .by(KEY, "wrongSecretAccessKey/0123456789abcdefABCDE")
        .send(gw)?;
    walk.s3("SignatureDoesNotMatch", 403, &r, false)?;
    let r = put("/reports/a", "0.3", b"x")
        .header("content-md5", "XrY7u+Ae7tCTyyK7j1rNww==")
        .send(gw)?;
    walk.s3("BadDigest", 400, &r, false)?;
    let r = put("/reports/a", "0.3", b"x")
        .header("content-md5", "not base64!")
        .send(gw)?;
    walk.s3("InvalidDigest", 400, &r, false)?;
    walk.s3(
        "InvalidArgument",
        400,
        &put("/reports/a", "x.y", b"x").send(gw)?,
        false,
    )?;
    let r = put("/reports/a", "0.3", &vec![b'b'; MAX_BODY + 1]).send(gw)?;
    walk.s3("EntityTooLarge", 400, &r, false)?;
    let r = put("/reports/a", "0.3", b"x")
        .header("x-amz-meta-big", "m".repeat(4096))
        .send(gw)?;
    walk.s3("MetadataTooLarge", 400, &r, false)?;
    let long = format!("/reports/{}", "k".repeat(1100));
    let r = S3Req::new("GET", &long).send(gw)?;
    walk.s3("KeyTooLongError", 400, &r, false)?;
    walk.s3(
        "NoSuchBucket",
        404,
        &S3Req::new("GET", "/nosuch/a").send(gw)?,
        false,
    )?;
    walk.s3(
        "NoSuchKey",
        404,
        &S3Req::new("GET", "/reports/absent").send(gw)?,
        false,
    )?;
    // HEAD: the type, no body.
    walk.s3(
        "NoSuchKey",
        404,
        &S3Req::new("HEAD", "/reports/absent").send(gw)?,
        true,
    )?;
    let r = S3Req::new("GET", "/reports/a")
        .query("versionId=999")
        .send(gw)?;
    walk.s3("NoSuchVersion", 404, &r, false)?;
    let r = S3Req::new("GET", "/reports/a")
        .header("if-match", "\"nope\"")
        .send(gw)?;
    walk.s3("PreconditionFailed", 412, &r, false)?;
    let r = S3Req::new("GET", "/reports/a")
        .header("range", "bytes=100-200")
        .send(gw)?;
    walk.s3("InvalidRange", 416, &r, false)?;
    let r = S3Req::new("GET", "/reports/a").query("acl").send(gw)?;
    walk.s3("NotImplemented", 501, &r, false)?;
    let r = S3Req::new("POST", "/reports")
        .query("delete")
        .header("fence-token", "0.3")
        .body("<Delete><Object><Key>a</Key></Object>")
        .send(gw)?;
    walk.s3("MalformedXML", 400, &r, false)?;
    let r = put("/reports/cut", "0.1", &[b'c'; 100]).send_cut(gw, 10)?;
    walk.s3("IncompleteBody", 400, &r, false)?;
    let r = put("/reports/slow", "0.1", &[b's'; 100]).send_stalled(gw, 10)?;
    walk.s3("RequestTimeout", 400, &r, false)?;
    let r = S3Req::new("PUT", "/reports/a")
        .query("partNumber=1&uploadId=bogus")
        .header("fence-token", "0.3")
        .body("x")
        .send(gw)?;
    walk.s3("NoSuchUpload", 404, &r, false)?;

    // Idempotency-Key reused with another body.
    let keyed = |body: &[u8]| {
        put("/reports/idem", "0.1", body)
            .header("idempotency-key", "op-1")
            .send(gw)
    };
    ensure!(keyed(b"one")?.status == 200);
    walk.s3("IdempotencyKeyReused", 422, &keyed(b"two")?, false)?;

    // A body refused by s3s's own checks (the payload hash): nothing done.
    let mut refused = S3Req::new("POST", "/reports")
        .query("delete")
        .header("fence-token", "0.3")
        .body("<Delete><Object><Key>a</Key></Object></Delete>");
    let headers = refused.signed(gw);
    refused.body = b"<Delete><Object><Key>b</Key></Object></Delete>".to_vec();
    let list: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let r = common::request_to(&gw.addr, "POST", "/reports?delete", &list, &refused.body)?;
    walk.s3("InvalidRequest", 400, &r, false)?;

    // Multipart: parts too small, out of order, or not uploaded.
    let created = S3Req::new("POST", "/reports/mp")
        .query("uploads")
        .header("fence-token", "0.1")
        .send(gw)?;
    ensure!(created.status == 200, "{created:?}");
    let text = String::from_utf8(created.body)?;
    let id = between(&text, "<UploadId>", "</UploadId>")
        .context("no UploadId")?
        .to_owned();
    let mut etags = Vec::new();
    for n in 1..=2 {
        let query = format!("partNumber={n}&uploadId={id}");
        let r = S3Req::new("PUT", "/reports/mp")
            .query(&query)
            .body(vec![b'p'; 10])
            .send(gw)?;
        ensure!(r.status == 200, "{r:?}");
        etags.push(r.header("etag").context("no ETag")?.to_owned());
    }
    let complete = |parts: &[(u32, &str)]| {
        let mut xml = String::from("<CompleteMultipartUpload>");
        for (n, tag) in parts {
            xml.push_str(&format!(
                "<Part><PartNumber>{n}</PartNumber><ETag>{tag}</ETag></Part>"
            ));
        }
        xml.push_str("</CompleteMultipartUpload>");
        let query = format!("uploadId={id}");
        S3Req::new("POST", "/reports/mp")
            .query(&query)
            .header("fence-token", "0.1")
            .body(xml)
            .send(gw)
    };
    let r = complete(&[(2, &etags[1]), (1, &etags[0])])?;
    walk.s3("InvalidPartOrder", 400, &r, false)?;
    let r = complete(&[(1, "\"00000000000000000000000000000000\"")])?;
    walk.s3("InvalidPart", 400, &r, false)?;
    let r = complete(&[(1, &etags[0]), (2, &etags[1])])?;
    walk.s3("EntityTooSmall", 400, &r, false)?;

    // The visible object's blob removed behind the gateway's back.
    ensure!(put("/reports/lost", "0.1", b"lost").send(gw)?.status == 200);
    std::fs::remove_file(blob_holding(&gw.data, b"lost")?)?;
    let r = S3Req::new("GET", "/reports/lost").send(gw)?;
    walk.s3("InternalError", 500, &r, false)?;

    // A signed key prefix refuses an unsigned token.
    let conn = rusqlite::Connection::open(gw.data.join("fencecheck.db"))?;
    let secret = (0u8..32).collect();
    fencecheck_sqlite::set_keys(
        &conn,
        "reports/signed/",
        &[fencecheck::GrantKey { key_id: 7, secret }],
    )?;
    let r = put("/reports/signed/a", "0.1", b"x").send(gw)?;
    walk.s3("FenceUnauthenticated", 403, &r, false)?;
    Ok(())
}

/// The plain routes' problem types, each provoked.
fn walk_problems(gw: &Gateway, walk: &mut Walk) -> anyhow::Result<()> {
    let put = |path: &str, token: &str, body: &[u8]| {
        gw.request("PUT", path, &[("Fence-Token", token)], body)
    };
    ensure!(put("/objects/o/a", "0.2", b"first")?.status == 201);
    walk.problem(
        "stale-fence",
        409,
        &put("/objects/o/a", "0.1", b"x")?,
        false,
    )?;
    let r = gw.request("PUT", "/objects/o/a", &[], b"x")?;
    walk.problem("missing-token", 428, &r, false)?;
    let r = gw.request(
        "PUT",
        "/objects/o/a",
        &[("Fence-Token", "0.3"), ("If-Match", "\"99\"")],
        b"x",
    )?;
    walk.problem("version-conflict", 412, &r, false)?;
    walk.problem(
        "bad-request",
        400,
        &put("/objects/o/a", "x.y", b"x")?,
        false,
    )?;
    walk.problem(
        "not-found",
        404,
        &gw.request("GET", "/objects/absent", &[], b"")?,
        false,
    )?;
    walk.problem(
        "not-found",
        404,
        &gw.request("HEAD", "/objects/absent", &[], b"")?,
        true,
    )?;
    walk.problem(
        "not-found",
        404,
        &gw.request("GET", "/v1/nowhere", &[], b"")?,
        false,
    )?;
    let r = gw.request("POST", "/objects/o/a", &[], b"")?;
    walk.problem("method-not-allowed", 405, &r, false)?;
    let r = gw.request("POST", "/metrics", &[], b"")?;
    walk.problem("method-not-allowed", 405, &r, false)?;
    let r = gw.request("DELETE", "/healthz", &[], b"")?;
    walk.problem("method-not-allowed", 405, &r, false)?;
    let r = gw.request(
        "GET",
        "/metrics",
        &[("Authorization", "Bearer nobody")],
        b"",
    )?;
    walk.problem("unauthorized", 401, &r, false)?;
    let r = gw.request(
        "GET",
        "/objects/o/a",
        &[("Authorization", "Basic eA==")],
        b"",
    )?;
    walk.problem("unauthorized", 401, &r, false)?;
    let reader = format!("Bearer {READER_BEARER}");
    let r = gw.request(
        "PUT",
        "/objects/reports/x",
        &[("Fence-Token", "0.1"), ("Authorization", &reader)],
        b"x",
    )?;
    walk.problem("forbidden", 403, &r, false)?;
    let r = put("/objects/o/big", "0.1", &vec![b'b'; MAX_BODY + 1])?;
    walk.problem("too-large", 413, &r, false)?;
    let r = gw.request("GET", "/objects/o/a", &[("If-Match", "\"99\"")], b"")?;
    walk.problem("precondition-failed", 412, &r, false)?;
    let r = gw.request("GET", "/objects/o/a", &[("Range", "bytes=100-")], b"")?;
    walk.problem("range-not-satisfiable", 416, &r, false)?;
    let keyed = |body: &[u8]| {
        gw.request(
            "PUT",
            "/objects/o/idem",
            &[("Fence-Token", "0.1"), ("Idempotency-Key", "op-1")],
            body,
        )
    };
    ensure!(keyed(b"one")?.status == 201);
    walk.problem("idempotency-key-reused", 422, &keyed(b"two")?, false)?;
    let mut open = gw.open(
        "PUT",
        "/objects/o/cut",
        &[("Fence-Token", "0.1")],
        Some(100),
    )?;
    open.send(&[b'c'; 10])?;
    walk.problem("incomplete-body", 400, &open.cut()?, false)?;
    let mut open = gw.open(
        "PUT",
        "/objects/o/slow",
        &[("Fence-Token", "0.1")],
        Some(100),
    )?;
    open.send(&[b's'; 10])?;
    walk.problem("body-timeout", 408, &open.response()?, false)?;

    // Tokens of a foreign authority: the key's state names another.
    ensure!(put("/objects/o/auth", "5:0.1", b"x")?.status == 201);
    let r = put("/objects/o/auth", "6:0.2", b"x")?;
    walk.problem("foreign-authority", 400, &r, false)?;

    // The visible object's blob removed behind the gateway's back.
    ensure!(put("/objects/o/lost", "0.1", b"lost")?.status == 201);
    std::fs::remove_file(blob_holding(&gw.data, b"lost")?)?;
    let r = gw.request("GET", "/objects/o/lost", &[], b"")?;
    walk.problem("blob-missing", 500, &r, false)?;

    // A signed key prefix refuses an unsigned token.
    let conn = rusqlite::Connection::open(gw.data.join("fencecheck.db"))?;
    let secret = (0u8..32).collect();
    fencecheck_sqlite::set_keys(
        &conn,
        "o/signed/",
        &[fencecheck::GrantKey { key_id: 7, secret }],
    )?;
    let r = put("/objects/o/signed/a", "0.1", b"x")?;
    walk.problem("unauthenticated", 403, &r, false)?;

    // The lock endpoints.
    let r = lock(
        gw,
        ROOT_SECRET,
        "held/a",
        "acquire",
        json!({"lease_id": "a", "ttl_ms": 999_999_999}),
    )?;
    walk.problem("ttl-too-long", 400, &r, false)?;
    let r = lock(gw, ROOT_SECRET, "held/a", "acquire", json!({"lease": 1}))?;
    walk.problem("bad-request", 400, &r, false)?;
    let held = lock(
        gw,
        READER_BEARER,
        "held/a",
        "acquire",
        json!({"lease_id": "a", "ttl_ms": 60_000}),
    )?;
    ensure!(held.status == 200, "{held:?}");
    let token = held.json()?["token"]
        .as_str()
        .context("no token")?
        .to_owned();
    let r = lock(
        gw,
        ROOT_SECRET,
        "held/a",
        "acquire",
        json!({"lease_id": "b", "ttl_ms": 60_000}),
    )?;
    walk.problem("busy", 409, &r, false)?;
    let r = lock(
        gw,
        ROOT_SECRET,
        "held/a",
        "release",
        json!({"lease_id": "a", "token": token}),
    )?;
    walk.problem("not-owner", 409, &r, false)?;
    let r = lock(
        gw,
        READER_BEARER,
        "held/a",
        "renew",
        json!({"lease_id": "z", "token": token, "ttl_ms": 60_000}),
    )?;
    walk.problem("lost", 409, &r, false)?;
    let r = lock(gw, ROOT_SECRET, "held/a", "steal", json!({}))?;
    walk.problem("not-found", 404, &r, false)?;
    Ok(())
}

/// Storage failing under both surfaces (the blob directory replaced by a
/// file): 503, typed, never a verdict on the token. Last: it breaks the
/// gateway's blob store.
fn walk_unavailable(gw: &Gateway, walk: &mut Walk) -> anyhow::Result<()> {
    let blobs = gw.data.join("blobs");
    std::fs::rename(&blobs, gw.data.join("blobs.away"))?;
    std::fs::write(&blobs, b"not a directory")?;
    let r = gw.request("PUT", "/objects/o/down", &[("Fence-Token", "0.1")], b"x")?;
    walk.problem("unavailable", 503, &r, false)?;
    let r = S3Req::new("PUT", "/reports/down")
        .header("fence-token", "0.1")
        .body("x")
        .send(gw)?;
    walk.s3("ServiceUnavailable", 503, &r, false)?;
    Ok(())
}

/// Every error code of the S3 front and every problem type of the plain
/// routes, read from the source, is provoked by a real request and
/// answered with its Content-Type and a body that parses as that type and
/// names the code (HEAD: the type, no body); the codes not walked are
/// listed with why, and must still be in the source.
#[test]
fn every_error_answer_is_typed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let gw = start(&data)?;
    let mut walk = Walk::default();
    walk_s3(&gw, &mut walk)?;
    walk_problems(&gw, &mut walk)?;
    walk_unavailable(&gw, &mut walk)?;
    walk.parse_xml(dir.path())?;

    let compare = |surface: &str,
                   source: BTreeSet<String>,
                   walked: BTreeSet<String>,
                   skipped: &[(&str, &str)]|
     -> anyhow::Result<()> {
        let skipped: BTreeSet<String> = skipped.iter().map(|(c, _)| (*c).to_owned()).collect();
        let stale: Vec<_> = skipped.difference(&source).collect();
        ensure!(
            stale.is_empty(),
            "{surface}: listed as not walked, not in the source: {stale:?}"
        );
        let covered: BTreeSet<String> = walked.union(&skipped).cloned().collect();
        let missing: Vec<_> = source.difference(&covered).collect();
        let extra: Vec<_> = walked.difference(&source).collect();
        if !missing.is_empty() || !extra.is_empty() {
            bail!(
                "{surface}: in the source, not walked: {missing:?}; walked, not in the source: {extra:?}"
            );
        }
        Ok(())
    };
    let s3 = s3_codes()?;
    ensure!(s3.len() > 25 && s3.contains("StaleFence"), "{s3:?}");
    // s3s's own refusals (signature…) are walked too, beyond the source's.
    let walked_s3: BTreeSet<String> = walk
        .s3
        .keys()
        .filter(|c| s3.contains(*c))
        .cloned()
        .collect();
    compare("S3", s3, walked_s3, S3_NOT_WALKED)?;
    let problems = problem_titles()?;
    ensure!(
        problems.len() > 20 && problems.contains("stale-fence"),
        "{problems:?}"
    );
    compare(
        "problems",
        problems,
        walk.problems.keys().cloned().collect(),
        PROBLEMS_NOT_WALKED,
    )?;
    Ok(())
}
