//! Where blob bytes live: files in a directory, a real HTTP file server
//! (nginx WebDAV) reached through Pingora's pooled connector, or an S3
//! bucket (`object_store`: signed requests, multipart for large blobs; a
//! PUT whose SHA-256 the client declared streamed as one request, and a
//! blob composed from others inside the bucket, in `signed`). A blob is named
//! `STORE-ID` (the store's random id, then the never-reused object id), so
//! two gateways sharing one directory or one upstream never name a blob
//! alike; a blob is created new, never over an existing one.
//!
//! Durability: in a directory, a blob is flushed and fsynced, and so is the
//! directory entry, before the publish that makes it visible. On an
//! upstream, the gateway has the server's 2xx and nothing more: nginx's
//! WebDAV PUT writes a temporary file and renames it, and does not fsync.
//! On S3, a blob is written once the PUT (or the multipart Complete) is
//! answered: the store's own durability.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as S3Path;
use object_store::{
    ClientOptions, GetOptions, GetRange, ObjectStore, PutMode, PutOptions, PutPayload,
    WriteMultipart,
};

use bytes::Bytes;
use fencecheck_sqlite::ObjectId;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::protocols::http::client::HttpSession;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::error::{Error, io};

mod signed;
pub use signed::Composed;

/// Idle upstream connections are kept this long for reuse.
const IDLE: Duration = Duration::from_secs(60);

/// The blob store: where, and the prefix of every name.
pub struct Blobs {
    store: String,
    place: Place,
}

/// Where the bytes are.
pub enum Place {
    /// Files `<dir>/<name>`.
    Dir(PathBuf),
    /// `PUT`/`GET`/`HEAD`/`DELETE <prefix><name>` on an HTTP server.
    Upstream(Box<Upstream>),
    /// Objects `fencecheck-blobs/<name>` in an S3 bucket.
    S3(Box<S3Bucket>),
}

/// An S3 bucket: `object_store` for what it does, signed requests of our
/// own for what it does not (a PUT streamed as its bytes arrive, a blob
/// composed from others inside the bucket: `blobs/signed.rs`).
pub struct S3Bucket {
    store: Arc<dyn ObjectStore>,
    signed: signed::Signed,
}

/// Where blobs go in an S3 bucket.
const S3_DIR: &str = "fencecheck-blobs";
/// Blobs up to this size are one PUT; larger ones a multipart upload of
/// parts this size (S3's least part is 5 MiB).
const S3_PART: usize = 8 << 20;
/// Parts of one blob uploaded at once.
const S3_CONCURRENCY: usize = 4;

/// An S3 bucket for blobs (`--s3-upstream URL --s3-bucket NAME`), with
/// credentials and region from the environment (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`).
pub fn s3_store(url: &str, bucket: &str, timeout: Duration) -> Result<S3Bucket, Error> {
    let bad = |why: String| Error::Config(format!("--s3-upstream {url:?}: {why}"));
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(bad("an http:// or https:// URL".into()));
    }
    let options = ClientOptions::new()
        .with_allow_http(url.starts_with("http://"))
        .with_connect_timeout(timeout)
        .with_timeout(timeout.max(Duration::from_secs(30)));
    let mut builder = AmazonS3Builder::from_env()
        .with_endpoint(url)
        .with_bucket_name(bucket)
        .with_virtual_hosted_style_request(false)
        .with_client_options(options.clone());
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        builder = builder.with_region("us-east-1");
    }
    let region = builder
        .get_config_value(&AmazonS3ConfigKey::Region)
        .unwrap_or_else(|| "us-east-1".to_owned());
    let store = builder.build().map_err(|e| bad(e.to_string()))?;
    let signed = signed::Signed::new(
        url,
        bucket,
        region,
        store.credentials().clone(),
        &options,
        timeout,
    )?;
    Ok(S3Bucket {
        store: Arc::new(store),
        signed,
    })
}

/// An HTTP file server with WebDAV PUT and DELETE.
pub struct Upstream {
    peer: HttpPeer,
    host: String,
    prefix: String,
    connector: Connector,
}

impl Upstream {
    /// `url`: `http://HOST:PORT[/prefix/]` (plain HTTP, meant for loopback);
    /// blobs go to `<prefix><name>`, default prefix `/blobs/`. `timeout`
    /// bounds connecting and each read and write.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, Error> {
        let bad = |why: &str| Error::Config(format!("--upstream {url:?}: {why}"));
        let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad("only http:// is supported"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let addr = format!("{}:{port}", authority.host());
        let resolved = std::net::ToSocketAddrs::to_socket_addrs(&addr)
            .map_err(|e| bad(&e.to_string()))?
            .next()
            .ok_or_else(|| bad("host does not resolve"))?;
        let mut prefix = match uri.path() {
            "" | "/" => "/blobs/".to_owned(),
            p => p.to_owned(),
        };
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let mut peer = HttpPeer::new(resolved, false, String::new());
        peer.options.connection_timeout = Some(timeout);
        peer.options.read_timeout = Some(timeout);
        peer.options.write_timeout = Some(timeout);
        peer.options.idle_timeout = Some(IDLE);
        Ok(Self {
            peer,
            host: addr,
            prefix,
            connector: Connector::new(None),
        })
    }

    async fn start(
        &self,
        method: &str,
        name: &str,
        headers: &[(&'static str, String)],
    ) -> Result<Box<HttpSession>, Error> {
        let path = format!("{}{name}", self.prefix);
        let mut req = RequestHeader::build(method, path.as_bytes(), Some(headers.len() + 1))
            .map_err(upstream("building a request"))?;
        req.insert_header("Host", &self.host)
            .map_err(upstream("building a request"))?;
        for (name, value) in headers {
            req.insert_header(*name, value.as_str())
                .map_err(upstream("building a request"))?;
        }
        let (mut session, _reused) = self
            .connector
            .get_http_session(&self.peer)
            .await
            .map_err(upstream("connecting"))?;
        session
            .write_request_header(Box::new(req))
            .await
            .map_err(upstream("sending a request"))?;
        Ok(Box::new(session))
    }

    /// A bodiless request, its status (and the session, response unread).
    async fn ask(
        &self,
        method: &str,
        name: &str,
        headers: &[(&'static str, String)],
    ) -> Result<(u16, Box<HttpSession>), Error> {
        let mut session = self.start(method, name, headers).await?;
        session
            .finish_request_body()
            .await
            .map_err(upstream("sending a request"))?;
        let status = self.status(&mut session).await?;
        Ok((status, session))
    }

    async fn status(&self, session: &mut HttpSession) -> Result<u16, Error> {
        session
            .read_response_header()
            .await
            .map_err(upstream("reading a response"))?;
        Ok(session.response_header().map_or(0, |h| h.status.as_u16()))
    }

    /// Read what is left of a response and pool the connection.
    async fn release(&self, mut session: Box<HttpSession>) {
        while let Ok(Some(_)) = session.read_response_body().await {}
        self.connector
            .release_http_session(*session, &self.peer, Some(IDLE))
            .await;
    }
}

fn upstream(doing: &'static str) -> impl FnOnce(Box<pingora::Error>) -> Error {
    move |e| Error::Upstream {
        doing,
        detail: e.to_string(),
    }
}

fn upstream_status(doing: &'static str, status: u16) -> Error {
    Error::Upstream {
        doing,
        detail: format!("status {status}"),
    }
}

fn header<'a>(session: &'a HttpSession, name: &str) -> Option<&'a str> {
    session
        .response_header()
        .and_then(|h| h.headers.get(name))
        .and_then(|v| v.to_str().ok())
}

/// A blob being written: its bytes are counted and hashed on the way
/// (unless the caller knows their SHA-256 and has them checked).
pub struct BlobWriter {
    sink: Sink,
    hash: Hash,
    written: u64,
}

enum Hash {
    Computed(Sha256),
    /// Declared by the client and checked by the caller as the body is
    /// read (s3s, against `x-amz-content-sha256`): not computed again.
    Declared([u8; 32]),
}

enum Sink {
    /// A local file (created new).
    File(tokio::fs::File),
    /// A PUT in progress.
    Upstream(Box<HttpSession>),
    /// An S3 blob: buffered up to one part, then a multipart upload.
    S3 {
        bucket: Arc<dyn ObjectStore>,
        path: S3Path,
        buffer: Vec<u8>,
        upload: Multipart,
    },
    /// An S3 PUT streamed as the bytes come.
    S3Put(Box<signed::PutStream>),
}

/// A written blob: how many bytes, and their SHA-256.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    /// Bytes.
    pub length: u64,
    /// SHA-256.
    pub sha256: [u8; 32],
}

/// A blob (or a range of it) being read.
pub struct BlobReader {
    source: Source,
    /// Bytes still to read.
    left: u64,
}

enum Source {
    /// A local file (still readable if the collector unlinks it).
    File(tokio::fs::File),
    /// A GET response in progress.
    Upstream(Box<HttpSession>),
    /// An S3 GET in progress.
    S3(BoxStream<'static, object_store::Result<Bytes>>),
}

/// One entry of the collector's view of the blob store.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The object id its name carries.
    pub object: ObjectId,
    /// When it was last written.
    pub modified: SystemTime,
}

impl Blobs {
    /// Blobs in `dir`, named with `store`'s prefix.
    pub fn dir(dir: PathBuf, store: &str) -> Self {
        Self {
            store: store.to_owned(),
            place: Place::Dir(dir),
        }
    }

    /// Blobs on `upstream`, named with `store`'s prefix.
    pub fn upstream(upstream: Upstream, store: &str) -> Self {
        Self {
            store: store.to_owned(),
            place: Place::Upstream(Box::new(upstream)),
        }
    }

    /// Blobs in an S3 bucket (see [`s3_store`]), named with `store`'s prefix.
    pub fn s3(bucket: S3Bucket, store: &str) -> Self {
        Self {
            store: store.to_owned(),
            place: Place::S3(Box::new(bucket)),
        }
    }

    /// Write `object`'s blob as the concatenation of the blobs `parts`
    /// (object, length), in order, inside the store without reading them
    /// through the gateway; `Ok(None)` where the store cannot (the caller
    /// copies). Every part but the last must be at least 5 MiB.
    pub async fn compose(
        &self,
        object: ObjectId,
        parts: &[(ObjectId, u64)],
    ) -> Result<Option<Composed>, Error> {
        let Place::S3(bucket) = &self.place else {
            return Ok(None);
        };
        let sources: Vec<(String, u64)> = parts
            .iter()
            .map(|(part, length)| (self.s3_path(*part).to_string(), *length))
            .collect();
        let to = self.s3_path(object).to_string();
        bucket.signed.compose(&to, &sources).await.map(Some)
    }

    fn s3_path(&self, object: ObjectId) -> S3Path {
        S3Path::from(format!("{S3_DIR}/{}", self.name(object)))
    }

    /// The blob name of `object`.
    pub fn name(&self, object: ObjectId) -> String {
        if self.store.is_empty() {
            object.get().to_string()
        } else {
            format!("{}-{}", self.store, object.get())
        }
    }

    /// The object a blob name of this store names.
    fn object_of(&self, name: &str) -> Option<ObjectId> {
        let id = if self.store.is_empty() {
            name
        } else {
            name.strip_prefix(self.store.as_str())?.strip_prefix('-')?
        };
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        id.parse::<i64>().ok().map(ObjectId::from_raw)
    }

    /// Start writing `object`'s blob; `length` if the client declared one.
    /// The blob must not exist yet.
    pub async fn create(&self, object: ObjectId, length: Option<u64>) -> Result<BlobWriter, Error> {
        let sink = match &self.place {
            Place::Dir(dir) => {
                let path = dir.join(self.name(object));
                let file = tokio::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .await
                    .map_err(io("creating a blob"))?;
                Sink::File(file)
            }
            Place::Upstream(up) => {
                let framing = match length {
                    Some(n) => ("Content-Length", n.to_string()),
                    None => ("Transfer-Encoding", "chunked".to_owned()),
                };
                // Servers that honour it refuse to replace an existing blob
                // (nginx ignores it; the unique name is what protects there).
                let headers = [framing, ("If-None-Match", "*".to_owned())];
                Sink::Upstream(up.start("PUT", &self.name(object), &headers).await?)
            }
            Place::S3(bucket) => Sink::S3 {
                bucket: bucket.store.clone(),
                path: self.s3_path(object),
                buffer: Vec::new(),
                upload: Multipart(None),
            },
        };
        Ok(BlobWriter {
            sink,
            hash: Hash::Computed(Sha256::new()),
            written: 0,
        })
    }

    /// Start writing `object`'s blob of `length` bytes whose SHA-256 is
    /// `sha256`, which the caller checks as the bytes arrive (and fails
    /// the write if they differ): the writer does not hash them again.
    /// On S3 the blob is one PUT streamed as they come (up to 5 GiB, S3's
    /// largest PUT), signed with that SHA-256, so the upstream checks it
    /// too; elsewhere as [`Blobs::create`].
    pub async fn create_declared(
        &self,
        object: ObjectId,
        length: u64,
        sha256: [u8; 32],
    ) -> Result<BlobWriter, Error> {
        let mut writer = match &self.place {
            Place::S3(bucket) if length <= 5 << 30 => {
                let key = self.s3_path(object).to_string();
                BlobWriter {
                    sink: Sink::S3Put(Box::new(
                        bucket.signed.start_put(&key, length, &sha256).await?,
                    )),
                    hash: Hash::Computed(Sha256::new()),
                    written: 0,
                }
            }
            _ => self.create(object, Some(length)).await?,
        };
        writer.hash = Hash::Declared(sha256);
        Ok(writer)
    }

    /// The length of `object`'s blob, without reading it; `None` if it does
    /// not exist.
    pub async fn size(&self, object: ObjectId) -> Result<Option<u64>, Error> {
        match &self.place {
            Place::Dir(dir) => match tokio::fs::metadata(dir.join(self.name(object))).await {
                Ok(m) => Ok(Some(m.len())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(io("reading a blob's size")(e)),
            },
            Place::Upstream(up) => {
                let (status, session) = up.ask("HEAD", &self.name(object), &[]).await?;
                let len = header(&session, "content-length").and_then(|v| v.parse().ok());
                up.release(session).await;
                match status {
                    200 => len.map(Some).ok_or(Error::Upstream {
                        doing: "sizing a blob",
                        detail: "no Content-Length".into(),
                    }),
                    404 => Ok(None),
                    s => Err(upstream_status("sizing a blob", s)),
                }
            }
            Place::S3(bucket) => match bucket.store.head(&self.s3_path(object)).await {
                Ok(meta) => Ok(Some(meta.size)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(s3("sizing a blob", e)),
            },
        }
    }

    /// Open bytes `start..=end` of `object`'s blob, or all of it (`None`);
    /// `Ok(None)` if the blob does not exist. Returns the reader and the
    /// blob's whole length.
    pub async fn open(
        &self,
        object: ObjectId,
        range: Option<(u64, u64)>,
    ) -> Result<Option<(BlobReader, u64)>, Error> {
        match &self.place {
            Place::Dir(dir) => {
                let mut file = match tokio::fs::File::open(dir.join(self.name(object))).await {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(io("opening a blob")(e)),
                };
                let len = file
                    .metadata()
                    .await
                    .map_err(io("reading a blob's size"))?
                    .len();
                let (start, left) = match range {
                    None => (0, len),
                    Some((start, end)) if start <= end && end < len => (start, end - start + 1),
                    Some(_) => {
                        return Err(Error::Io {
                            doing: "reading a blob",
                            source: std::io::Error::other("the range is outside the blob"),
                        });
                    }
                };
                if start > 0 {
                    file.seek(std::io::SeekFrom::Start(start))
                        .await
                        .map_err(io("seeking in a blob"))?;
                }
                Ok(Some((
                    BlobReader {
                        source: Source::File(file),
                        left,
                    },
                    len,
                )))
            }
            Place::Upstream(up) => {
                let headers: Vec<(&'static str, String)> = range
                    .map(|(s, e)| ("Range", format!("bytes={s}-{e}")))
                    .into_iter()
                    .collect();
                let (status, session) = up.ask("GET", &self.name(object), &headers).await?;
                let doing = "reading a blob";
                let length = header(&session, "content-length").and_then(|v| v.parse::<u64>().ok());
                let total = match (status, range) {
                    (200, None) => length,
                    (206, Some((s, e))) => header(&session, "content-range")
                        .and_then(|v| v.strip_prefix(&format!("bytes {s}-{e}/"))?.parse().ok())
                        .filter(|_| length == Some(e - s + 1)),
                    (404, _) => {
                        up.release(session).await;
                        return Ok(None);
                    }
                    (s, _) => return Err(upstream_status(doing, s)),
                };
                match (total, length) {
                    (Some(total), Some(left)) => Ok(Some((
                        BlobReader {
                            source: Source::Upstream(session),
                            left,
                        },
                        total,
                    ))),
                    _ => Err(Error::Upstream {
                        doing,
                        detail: "no usable Content-Length / Content-Range".into(),
                    }),
                }
            }
            Place::S3(bucket) => {
                let options = GetOptions {
                    range: range.map(|(s, e)| GetRange::Bounded(s..e + 1)),
                    ..GetOptions::default()
                };
                let got = match bucket.store.get_opts(&self.s3_path(object), options).await {
                    Ok(got) => got,
                    Err(object_store::Error::NotFound { .. }) => return Ok(None),
                    Err(e) => return Err(s3("reading a blob", e)),
                };
                let total = got.meta.size;
                let left = got.range.end - got.range.start;
                if range.is_some_and(|(s, e)| got.range != (s..e + 1)) {
                    return Err(Error::Upstream {
                        doing: "reading a blob",
                        detail: "S3 returned another range".into(),
                    });
                }
                Ok(Some((
                    BlobReader {
                        source: Source::S3(got.into_stream()),
                        left,
                    },
                    total,
                )))
            }
        }
    }

    /// Delete `object`'s blob; an absent one is fine.
    pub async fn remove(&self, object: ObjectId) -> Result<(), Error> {
        match &self.place {
            Place::Dir(dir) => match tokio::fs::remove_file(dir.join(self.name(object))).await {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing a blob")(e)),
                _ => Ok(()),
            },
            Place::Upstream(up) => {
                let (status, session) = up.ask("DELETE", &self.name(object), &[]).await?;
                up.release(session).await;
                match status {
                    200..=299 | 404 => Ok(()),
                    s => Err(upstream_status("deleting a blob", s)),
                }
            }
            Place::S3(bucket) => match bucket.store.delete(&self.s3_path(object)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(s3("deleting a blob", e)),
            },
        }
    }

    /// Finish writing: the bytes durable (file and directory entry synced),
    /// or the server answered 2xx. An unfinished blob is the caller's to
    /// remove.
    pub async fn finish(&self, writer: BlobWriter) -> Result<Written, Error> {
        let written = Written {
            length: writer.written,
            sha256: match writer.hash {
                Hash::Computed(hasher) => hasher.finalize().into(),
                Hash::Declared(sha256) => sha256,
            },
        };
        match (&self.place, writer.sink) {
            (Place::Dir(dir), Sink::File(mut file)) => {
                file.flush().await.map_err(io("flushing a blob"))?;
                file.sync_all().await.map_err(io("syncing a blob"))?;
                // The new name must survive a crash too, not only the bytes.
                let dir = tokio::fs::File::open(dir)
                    .await
                    .map_err(io("opening the blob directory"))?;
                dir.sync_all()
                    .await
                    .map_err(io("syncing the blob directory"))?;
            }
            (Place::Upstream(up), Sink::Upstream(mut session)) => {
                session
                    .finish_request_body()
                    .await
                    .map_err(upstream("finishing an upload"))?;
                let status = up.status(&mut session).await?;
                up.release(session).await;
                if !(200..300).contains(&status) {
                    return Err(upstream_status("uploading a blob", status));
                }
            }
            (
                Place::S3(_),
                Sink::S3 {
                    bucket,
                    path,
                    buffer,
                    mut upload,
                },
            ) => match upload.0.take() {
                // Small: one PUT, refused if the name exists (as on WebDAV).
                None => {
                    let options = PutOptions {
                        mode: PutMode::Create,
                        ..PutOptions::default()
                    };
                    bucket
                        .put_opts(&path, PutPayload::from(buffer), options)
                        .await
                        .map_err(|e| s3("uploading a blob", e))?;
                }
                Some(mut upload) => {
                    upload.write(&buffer);
                    upload
                        .finish()
                        .await
                        .map_err(|e| s3("completing a blob's upload", e))?;
                }
            },
            (Place::S3(_), Sink::S3Put(put)) => (*put).finish().await?,
            _ => {
                return Err(Error::Config("a writer of another blob store".into()));
            }
        }
        Ok(written)
    }

    /// Pool the connection of a reader read to the end.
    pub async fn done(&self, reader: BlobReader) {
        if let (Place::Upstream(up), Source::Upstream(session)) = (&self.place, reader.source) {
            up.release(session).await;
        }
    }

    /// This store's blobs as the collector sees them: a directory listing,
    /// or the upstream's JSON index (nginx `autoindex_format json`); `None`
    /// if the upstream offers no listing. Other stores' blobs are left out.
    pub async fn list(&self) -> Result<Option<Vec<Stored>>, Error> {
        let mut out = Vec::new();
        match &self.place {
            Place::Dir(dir) => {
                let mut entries = tokio::fs::read_dir(dir)
                    .await
                    .map_err(io("listing blobs"))?;
                while let Some(entry) = entries.next_entry().await.map_err(io("listing blobs"))? {
                    let Some(object) = entry.file_name().to_str().and_then(|n| self.object_of(n))
                    else {
                        continue;
                    };
                    if let Ok(modified) = entry.metadata().await.and_then(|m| m.modified()) {
                        out.push(Stored { object, modified });
                    }
                }
            }
            Place::Upstream(up) => {
                let (status, mut session) = up.ask("GET", "", &[]).await?;
                let json = header(&session, "content-type")
                    .is_some_and(|t| t.starts_with("application/json"));
                if status != 200 || !json {
                    up.release(session).await;
                    return Ok(None);
                }
                let mut body = Vec::new();
                while let Some(chunk) = session
                    .read_response_body()
                    .await
                    .map_err(upstream("listing blobs"))?
                {
                    body.extend_from_slice(&chunk);
                }
                up.release(session).await;
                #[derive(serde::Deserialize)]
                struct Entry {
                    name: String,
                    #[serde(rename = "type")]
                    kind: String,
                    mtime: String,
                }
                let entries: Vec<Entry> =
                    serde_json::from_slice(&body).map_err(|e| Error::Upstream {
                        doing: "listing blobs",
                        detail: e.to_string(),
                    })?;
                for entry in entries.into_iter().filter(|e| e.kind == "file") {
                    if let (Some(object), Ok(modified)) = (
                        self.object_of(&entry.name),
                        httpdate::parse_http_date(&entry.mtime),
                    ) {
                        out.push(Stored { object, modified });
                    }
                }
            }
            Place::S3(bucket) => {
                let dir = S3Path::from(S3_DIR);
                let mut listing = bucket.store.list(Some(&dir));
                while let Some(meta) = listing.next().await {
                    let meta = meta.map_err(|e| s3("listing blobs", e))?;
                    if let Some(object) = meta.location.filename().and_then(|n| self.object_of(n)) {
                        out.push(Stored {
                            object,
                            modified: SystemTime::from(meta.last_modified),
                        });
                    }
                }
            }
        }
        Ok(Some(out))
    }
}

/// An S3 multipart upload, aborted if dropped unfinished (else S3 keeps its
/// parts until a lifecycle rule removes them).
struct Multipart(Option<WriteMultipart>);

impl Drop for Multipart {
    fn drop(&mut self) {
        if let Some(upload) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = upload.abort().await;
            });
        }
    }
}

impl BlobWriter {
    /// Append a chunk.
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), Error> {
        // Pingora's server hands out empty chunks at times; written chunked
        // to the upstream, an empty chunk would END the body there.
        if chunk.is_empty() {
            return Ok(());
        }
        if let Hash::Computed(hasher) = &mut self.hash {
            hasher.update(&chunk);
        }
        self.written += chunk.len() as u64;
        match &mut self.sink {
            Sink::S3Put(put) => put.write(chunk).await,
            Sink::File(file) => file.write_all(&chunk).await.map_err(io("writing a blob")),
            Sink::Upstream(session) => session
                .write_request_body(chunk, false)
                .await
                .map_err(upstream("uploading a blob")),
            Sink::S3 {
                bucket,
                path,
                buffer,
                upload,
            } => {
                buffer.extend_from_slice(&chunk);
                if buffer.len() < S3_PART {
                    return Ok(());
                }
                // Over one part: a multipart upload, parts sent as they
                // fill, at most S3_CONCURRENCY at once (memory stays bounded).
                if upload.0.is_none() {
                    let started = bucket
                        .put_multipart(path)
                        .await
                        .map_err(|e| s3("starting a blob's upload", e))?;
                    upload.0 = Some(WriteMultipart::new_with_chunk_size(started, S3_PART));
                }
                if let Some(upload) = upload.0.as_mut() {
                    upload
                        .wait_for_capacity(S3_CONCURRENCY)
                        .await
                        .map_err(|e| s3("uploading a blob's part", e))?;
                    upload.write(buffer);
                    buffer.clear();
                }
                Ok(())
            }
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }
}

impl BlobReader {
    /// Bytes still to come.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// The next chunk; `None` at the end (of the blob or of the range).
    pub async fn next(&mut self, buf: &mut [u8]) -> Result<Option<Bytes>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        let chunk = match &mut self.source {
            Source::File(file) => {
                let max = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                let n = file
                    .read(&mut buf[..max])
                    .await
                    .map_err(io("reading a blob"))?;
                (n > 0).then(|| Bytes::copy_from_slice(&buf[..n]))
            }
            Source::Upstream(session) => session
                .read_response_body()
                .await
                .map_err(upstream("reading a blob"))?,
            Source::S3(stream) => stream
                .next()
                .await
                .transpose()
                .map_err(|e| s3("reading a blob", e))?,
        };
        if let Some(chunk) = &chunk {
            self.left = self.left.saturating_sub(chunk.len() as u64);
        }
        Ok(chunk)
    }
}

fn s3(doing: &'static str, e: object_store::Error) -> Error {
    Error::Upstream {
        doing,
        detail: e.to_string(),
    }
}
