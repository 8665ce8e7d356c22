//! Where blob bytes live: files in a directory, or a real HTTP file server
//! (nginx WebDAV) reached through Pingora's pooled connector. Either way a
//! blob is named by its never-reused object id.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use fencecheck_sqlite::ObjectId;
use pingora::connectors::http::Connector;
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::protocols::http::client::HttpSession;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, io};

/// Idle upstream connections are kept this long for reuse.
const IDLE: Duration = Duration::from_secs(60);

/// The blob store.
pub enum Blobs {
    /// Files `<dir>/<id>`.
    Dir(PathBuf),
    /// `PUT`/`GET`/`DELETE <prefix><id>` on an HTTP server.
    Upstream(Box<Upstream>),
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
    /// blobs go to `<prefix><id>`, default prefix `/blobs/`. `timeout` bounds
    /// connecting and each read and write.
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
        object: ObjectId,
        headers: &[(&'static str, String)],
    ) -> Result<Box<HttpSession>, Error> {
        let path = format!("{}{}", self.prefix, object.get());
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

/// A blob being written.
pub enum BlobWriter {
    /// A local file.
    File(tokio::fs::File),
    /// A PUT in progress.
    Upstream(Box<HttpSession>),
}

/// A blob being read, with its length.
pub enum BlobReader {
    /// A local file (still readable if the collector unlinks it).
    File(tokio::fs::File, u64),
    /// A GET response in progress.
    Upstream(Box<HttpSession>, u64),
}

impl Blobs {
    /// Start writing `object`'s blob; `length` if the client declared one.
    pub async fn create(&self, object: ObjectId, length: Option<u64>) -> Result<BlobWriter, Error> {
        match self {
            Blobs::Dir(dir) => tokio::fs::File::create(dir.join(object.get().to_string()))
                .await
                .map(BlobWriter::File)
                .map_err(io("creating a blob")),
            Blobs::Upstream(up) => {
                let framing = match length {
                    Some(n) => ("Content-Length", n.to_string()),
                    None => ("Transfer-Encoding", "chunked".to_owned()),
                };
                up.start("PUT", object, &[framing])
                    .await
                    .map(BlobWriter::Upstream)
            }
        }
    }

    /// Open `object`'s blob; `None` if it does not exist (collected).
    pub async fn open(&self, object: ObjectId) -> Result<Option<BlobReader>, Error> {
        match self {
            Blobs::Dir(dir) => {
                let file = match tokio::fs::File::open(dir.join(object.get().to_string())).await {
                    Ok(file) => file,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(io("opening a blob")(e)),
                };
                let len = file
                    .metadata()
                    .await
                    .map_err(io("reading a blob's size"))?
                    .len();
                Ok(Some(BlobReader::File(file, len)))
            }
            Blobs::Upstream(up) => {
                let mut session = up.start("GET", object, &[]).await?;
                session
                    .finish_request_body()
                    .await
                    .map_err(upstream("sending a request"))?;
                match up.status(&mut session).await? {
                    200 => {}
                    404 => {
                        up.release(session).await;
                        return Ok(None);
                    }
                    s => {
                        return Err(Error::Upstream {
                            doing: "reading a blob",
                            detail: format!("status {s}"),
                        });
                    }
                }
                let len = session
                    .response_header()
                    .and_then(|h| h.headers.get("content-length"))
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                    .ok_or_else(|| Error::Upstream {
                        doing: "reading a blob",
                        detail: "no Content-Length".into(),
                    })?;
                Ok(Some(BlobReader::Upstream(session, len)))
            }
        }
    }

    /// Delete `object`'s blob; an absent one is fine.
    pub async fn remove(&self, object: ObjectId) -> Result<(), Error> {
        match self {
            Blobs::Dir(dir) => match tokio::fs::remove_file(dir.join(object.get().to_string()))
                .await
            {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing a blob")(e)),
                _ => Ok(()),
            },
            Blobs::Upstream(up) => {
                let mut session = up.start("DELETE", object, &[]).await?;
                session
                    .finish_request_body()
                    .await
                    .map_err(upstream("sending a request"))?;
                let status = up.status(&mut session).await?;
                up.release(session).await;
                match status {
                    200..=299 | 404 => Ok(()),
                    s => Err(Error::Upstream {
                        doing: "deleting a blob",
                        detail: format!("status {s}"),
                    }),
                }
            }
        }
    }

    /// Finish writing: durable (file synced, or the server answered 2xx).
    pub async fn finish(&self, writer: BlobWriter) -> Result<(), Error> {
        match (self, writer) {
            (_, BlobWriter::File(file)) => file.sync_data().await.map_err(io("syncing a blob")),
            (Blobs::Upstream(up), BlobWriter::Upstream(mut session)) => {
                session
                    .finish_request_body()
                    .await
                    .map_err(upstream("finishing an upload"))?;
                let status = up.status(&mut session).await?;
                up.release(session).await;
                if (200..300).contains(&status) {
                    Ok(())
                } else {
                    Err(Error::Upstream {
                        doing: "uploading a blob",
                        detail: format!("status {status}"),
                    })
                }
            }
            (Blobs::Dir(_), BlobWriter::Upstream(_)) => Err(Error::Config(
                "an upstream writer on a directory store".into(),
            )),
        }
    }

    /// Pool the connection of a reader read to the end.
    pub async fn done(&self, reader: BlobReader) {
        if let (Blobs::Upstream(up), BlobReader::Upstream(session, _)) = (self, reader) {
            up.release(session).await;
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
        match self {
            BlobWriter::File(file) => file.write_all(&chunk).await.map_err(io("writing a blob")),
            BlobWriter::Upstream(session) => session
                .write_request_body(chunk, false)
                .await
                .map_err(upstream("uploading a blob")),
        }
    }
}

impl BlobReader {
    /// The blob's length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            BlobReader::File(_, n) | BlobReader::Upstream(_, n) => *n,
        }
    }

    /// Whether the blob is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next chunk; `None` at the end.
    pub async fn next(&mut self, buf: &mut [u8]) -> Result<Option<Bytes>, Error> {
        match self {
            BlobReader::File(file, _) => {
                let n = file.read(buf).await.map_err(io("reading a blob"))?;
                Ok((n > 0).then(|| Bytes::copy_from_slice(&buf[..n])))
            }
            BlobReader::Upstream(session, _) => session
                .read_response_body()
                .await
                .map_err(upstream("reading a blob")),
        }
    }
}
