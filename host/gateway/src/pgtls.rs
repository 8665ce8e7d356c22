//! Connecting to PostgreSQL (`--postgres`), resolved once at startup: the
//! libpq connection string (key-value or URI) says where; the password
//! never comes from it (a string that holds one is refused: it would sit
//! on the command line) but, as libpq does, from `PGPASSWORD`, else
//! `PGPASSFILE`, else `~/.pgpass`; `sslmode=require` means TLS, with the
//! server's certificate verified against `PGSSLROOTCERT` (else the
//! system's roots) and its name checked (libpq's `verify-full`). Without
//! `sslmode=require` (`disable`, `prefer` or none) the connection is plain.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use pingora::tls::{
    CertificateDer, ClientConfig, ClientTlsStream, RootCertStore, ServerName, TlsConnector,
};
use postgres::config::{Host, SslMode};
use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::error::Error;

/// How every connection to the database is made.
#[derive(Clone)]
pub struct PgConnect {
    config: postgres::Config,
    tls: Option<Arc<ClientConfig>>,
}

impl std::fmt::Debug for PgConnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // postgres::Config's Debug redacts the password.
        f.debug_struct("PgConnect")
            .field("config", &self.config)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

fn bad(why: impl Into<String>) -> Error {
    Error::Config(format!("--postgres: {}", why.into()))
}

impl PgConnect {
    /// Resolve `url` with the process environment (see the module docs).
    pub fn resolve(url: &str) -> Result<Self, Error> {
        let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        Self::resolve_with(url, &env)
    }

    fn resolve_with(
        url: &str,
        env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Result<Self, Error> {
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e| bad(format!("not a libpq connection string: {e}")))?;
        if config.get_password().is_some() {
            return Err(bad(
                "the connection string holds a password; put it in PGPASSFILE (or PGPASSWORD) instead",
            ));
        }
        let user = config
            .get_user()
            .ok_or_else(|| bad("name the user (user=…)"))?
            .to_owned();
        if let Some(password) = env("PGPASSWORD") {
            config.password(password.as_encoded_bytes());
        } else {
            let file = env("PGPASSFILE")
                .map(PathBuf::from)
                .or_else(|| env("HOME").map(|home| PathBuf::from(home).join(".pgpass")));
            if let Some(file) = file.filter(|f| f.exists()) {
                let host = match config.get_hosts().first() {
                    Some(Host::Tcp(name)) => name.clone(),
                    _ => "localhost".to_owned(),
                };
                let port = config.get_ports().first().copied().unwrap_or(5432);
                let dbname = config.get_dbname().unwrap_or(&user).to_owned();
                if let Some(password) = pgpass(&file, &host, port, &dbname, &user)? {
                    config.password(password);
                }
            }
        }
        let tls = match config.get_ssl_mode() {
            SslMode::Require => Some(Arc::new(client_config(env("PGSSLROOTCERT"))?)),
            _ => None,
        };
        Ok(Self { config, tls })
    }

    /// Whether connections use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A new connection.
    pub fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        match &self.tls {
            None => self.config.connect(postgres::NoTls),
            Some(tls) => self.config.connect(MakeRustls(tls.clone())),
        }
    }
}

fn client_config(roots: Option<std::ffi::OsString>) -> Result<ClientConfig, Error> {
    pingora::tls::install_default_crypto_provider();
    let mut store = RootCertStore::empty();
    match roots {
        Some(path) => {
            let path = PathBuf::from(path);
            let pem = std::fs::read(&path)
                .map_err(|e| bad(format!("reading PGSSLROOTCERT {}: {e}", path.display())))?;
            for cert in pem_certificates(&pem) {
                store
                    .add(cert)
                    .map_err(|e| bad(format!("PGSSLROOTCERT {}: {e}", path.display())))?;
            }
        }
        None => {
            for cert in pingora::tls::load_native_certs().unwrap_or_default() {
                let _ = store.add(cert);
            }
        }
    }
    if store.is_empty() {
        return Err(bad(
            "sslmode=require but no root certificate to verify the server with (set PGSSLROOTCERT)",
        ));
    }
    Ok(ClientConfig::builder()
        .with_root_certificates(store)
        .with_no_client_auth())
}

/// The `CERTIFICATE` blocks of a PEM file.
fn pem_certificates(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    use base64::Engine;
    let text = String::from_utf8_lossy(pem);
    let mut out = Vec::new();
    let mut inside: Option<String> = None;
    for line in text.lines().map(str::trim) {
        match (&mut inside, line) {
            (None, "-----BEGIN CERTIFICATE-----") => inside = Some(String::new()),
            (Some(b64), "-----END CERTIFICATE-----") => {
                if let Ok(der) = base64::engine::general_purpose::STANDARD.decode(b64.as_bytes()) {
                    out.push(CertificateDer::from(der));
                }
                inside = None;
            }
            (Some(b64), line) => b64.push_str(line),
            (None, _) => {}
        }
    }
    out
}

/// libpq's password file: `host:port:database:user:password` lines, `*`
/// matching anything, `\` escaping `:` and `\`; the first match wins. Like
/// libpq, a file others may read is not used; unlike libpq (which warns
/// and ignores it), that is an error here.
fn pgpass(
    file: &Path,
    host: &str,
    port: u16,
    db: &str,
    user: &str,
) -> Result<Option<String>, Error> {
    use std::os::unix::fs::PermissionsExt;
    let meta =
        std::fs::metadata(file).map_err(|e| bad(format!("reading {}: {e}", file.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad(format!(
            "{} is readable by others: chmod 0600 it",
            file.display()
        )));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| bad(format!("reading {}: {e}", file.display())))?;
    let port = port.to_string();
    let wanted = [host, port.as_str(), db, user];
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_pgpass(line);
        if fields.len() != 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(wanted)
            .all(|(field, want)| field == "*" || field == want)
        {
            return Ok(Some(fields[4].clone()));
        }
    }
    Ok(None)
}

fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let (Some(next), Some(field)) = (chars.next(), fields.last_mut()) {
                    field.push(next);
                }
            }
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => {
                if let Some(field) = fields.last_mut() {
                    field.push(c);
                }
            }
        }
    }
    fields
}

/// tokio-postgres's TLS hooks on rustls (Pingora's, ring provider).
#[derive(Clone)]
struct MakeRustls(Arc<ClientConfig>);

struct RustlsConnect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

struct RustlsStream<S>(Box<ClientTlsStream<S>>);

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = std::io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> Result<RustlsConnect, std::io::Error> {
        let name = ServerName::try_from(domain.to_owned())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        Ok(RustlsConnect {
            config: self.0.clone(),
            name,
        })
    }
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let stream = TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(RustlsStream(Box::new(stream)))
        })
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn pgpass_lines() -> Result<(), Box<dyn std::error::Error>> {
        assert_eq!(
            split_pgpass(r"h:5432:db:u:p\:w\\d"),
            ["h", "5432", "db", "u", r"p:w\d"]
        );
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("pgpass");
        std::fs::write(
            &file,
            "# comment\nother:*:*:*:no\n127.0.0.1:5433:*:gw:s3cret\n*:*:*:*:fallback\n",
        )?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        assert_eq!(
            pgpass(&file, "127.0.0.1", 5433, "x", "gw")?.as_deref(),
            Some("s3cret")
        );
        assert_eq!(
            pgpass(&file, "127.0.0.1", 5434, "x", "gw")?.as_deref(),
            Some("fallback")
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
        assert!(pgpass(&file, "127.0.0.1", 5433, "x", "gw").is_err());
        Ok(())
    }

    #[test]
    fn passwords_stay_off_the_command_line() {
        let none = |_: &str| None;
        let err = PgConnect::resolve_with("host=h user=u password=secret", &none)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("PGPASSFILE") && !err.contains("secret"),
            "{err}"
        );
        let env = |name: &str| (name == "PGPASSWORD").then(|| "from-env".into());
        assert!(PgConnect::resolve_with("host=h user=u", &env).is_ok());
        assert!(PgConnect::resolve_with("host=h", &none).is_err());
    }
}
