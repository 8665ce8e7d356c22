//! How a coordinator is let into a secured etcd cluster: TLS (the operator's
//! CA, a client certificate) and etcd's own authentication (a user and
//! password). Checks every input before anything is sent, and recognises the
//! TLS failures that certainly happened before a request was executed.

use std::io::Read as _;
use std::net::{TcpStream, ToSocketAddrs as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::{AlertDescription, CertificateError, ClientConfig};
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

use crate::AuthorityError;

/// TLS to the members: the CA their certificates must chain to and, for
/// members started with `--client-cert-auth`, the coordinator's client
/// certificate. Needed for `https://` endpoints; the system's and Mozilla's
/// roots are never used.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM: one or more CA certificates (etcd's `--trusted-ca-file` side:
    /// whatever signed the members' `--cert-file`).
    pub ca_pem: Vec<u8>,
    /// PEM: the client certificate (chain, leaf first) presented to the
    /// members; `None` presents none.
    pub cert_pem: Option<Vec<u8>>,
    /// PEM: the client certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("client_cert", &self.cert_pem.is_some())
            .finish_non_exhaustive() // never the key
    }
}

impl EtcdTls {
    /// Read the CA and, if given, the client certificate and key from PEM
    /// files (`--etcd-cacert`, `--etcd-cert`, `--etcd-key`).
    pub fn from_files(
        ca: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, AuthorityError> {
        let read = |path: &Path, what: &str| {
            std::fs::read(path).map_err(|e| {
                AuthorityError::Tls(format!("reading the {what} {}: {e}", path.display()))
            })
        };
        Ok(Self {
            ca_pem: read(ca, "etcd CA certificate")?,
            cert_pem: cert
                .map(|p| read(p, "etcd client certificate"))
                .transpose()?,
            key_pem: key.map(|p| read(p, "etcd client key")).transpose()?,
        })
    }

    /// The agent's TLS settings, after checking that every certificate
    /// parses, the key fits the certificate and rustls accepts the whole
    /// configuration (ureq would panic on a key it cannot use).
    pub(super) fn config(&self) -> Result<(TlsConfig, Arc<ClientConfig>), AuthorityError> {
        let bad = |what: String| AuthorityError::Tls(what);
        let roots = certificates(&self.ca_pem, "the etcd CA")?;
        let mut store = rustls::RootCertStore::empty();
        for root in &roots {
            store
                .add(root.der().to_vec().into())
                .map_err(|e| bad(format!("the etcd CA certificate is unusable: {e}")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(rustls::ALL_VERSIONS)
            .map_err(|e| bad(format!("TLS setup: {e}")))?
            .with_root_certificates(store);
        let (client, probe) = match (&self.cert_pem, &self.key_pem) {
            (None, None) => (None, builder.with_no_client_auth()),
            (Some(cert), Some(key)) => {
                let chain = certificates(cert, "the etcd client certificate")?;
                let key = private_key(key)?;
                // The same key as rustls reads it (ureq does not say which
                // kind it found).
                let der = rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem(&self.key_pem))
                    .map_err(|e| bad(format!("the etcd client key is not usable: {e}")))?;
                let probe = builder
                    .with_client_auth_cert(
                        chain.iter().map(|c| c.der().to_vec().into()).collect(),
                        der,
                    )
                    .map_err(|e| {
                        bad(format!(
                            "the etcd client certificate and key do not work together: {e}"
                        ))
                    })?;
                (Some(ClientCert::new_with_certs(&chain, key)), probe)
            }
            (Some(_), None) => return Err(bad("an etcd client certificate needs its key".into())),
            (None, Some(_)) => {
                return Err(bad(
                    "an etcd client key was given without its certificate".into()
                ));
            }
        };
        let config = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(RootCerts::new_with_certs(&roots))
            .client_cert(client)
            .unversioned_rustls_crypto_provider(provider)
            .build();
        Ok((config, Arc::new(probe)))
    }
}

/// An etcd user and its password (etcd's `auth enable` mode): the
/// coordinator authenticates once, sends the token with every request, and
/// authenticates again when a member reports the token invalid (simple
/// tokens expire after `--auth-token-ttl` unused and die with a member's
/// restart).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdCredentials {
    /// The etcd user; its role must grant read-write on the coordinator's
    /// key prefix (`[prefix, prefix_end)`).
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for EtcdCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCredentials")
            .field("user", &self.user)
            .finish_non_exhaustive() // never the password
    }
}

fn key_pem(key: &Option<Vec<u8>>) -> &[u8] {
    key.as_deref().unwrap_or_default()
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<Certificate<'static>>, AuthorityError> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(AuthorityError::Tls(format!("{what} is not valid PEM: {e}"))),
        }
    }
    if certs.is_empty() {
        return Err(AuthorityError::Tls(format!(
            "{what} holds no PEM certificate"
        )));
    }
    Ok(certs)
}

fn private_key(pem: &[u8]) -> Result<PrivateKey<'static>, AuthorityError> {
    let mut keys = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::PrivateKey(k)) => keys.push(k),
            Ok(_) => {}
            Err(e) => {
                return Err(AuthorityError::Tls(format!(
                    "the etcd client key is not valid PEM: {e}"
                )));
            }
        }
    }
    match <[PrivateKey<'static>; 1]>::try_from(keys) {
        Ok([key]) => Ok(key),
        Err(keys) => Err(AuthorityError::Tls(format!(
            "the etcd client key file holds {} private keys, not one",
            keys.len()
        ))),
    }
}

/// The TLS failure in `e`, if it is one that can only happen while the
/// connection is being set up: a certificate the coordinator does not trust,
/// or the member refusing the coordinator's certificate (or its lack of
/// one). A member executes nothing before the handshake has completed on its
/// side, so such a request was certainly not executed. Other TLS errors
/// (a damaged record in the middle of a response) are not recognised here:
/// they may come after the member executed the request.
pub(super) fn handshake_failure(e: &ureq::Error) -> Option<String> {
    match e {
        // Raised before a connection is used: the name cannot be checked
        // against a certificate, or the configuration was refused.
        ureq::Error::Tls(reason) => Some((*reason).to_owned()),
        ureq::Error::Rustls(inner) => Some(inner.to_string()),
        ureq::Error::Io(io) => {
            let inner = io.get_ref()?.downcast_ref::<rustls::Error>()?;
            handshake_only(inner).then(|| explain(inner))
        }
        _ => None,
    }
}

/// True if `e` is the connection breaking under the request (the member
/// closed or reset it) rather than a timeout or a refused connection.
pub(super) fn broken_connection(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    matches!(e, ureq::Error::Io(io) if matches!(
        io.kind(),
        ErrorKind::BrokenPipe
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::UnexpectedEof
    ))
}

/// Find out whether `endpoint`'s member refuses this configuration's
/// handshake, on a fresh connection that sends no request.
///
/// Why: with TLS 1.3 the member checks the client certificate only after
/// the client has finished its side of the handshake, and the client sends
/// its request at once. A member that refuses the certificate sends an alert
/// and closes; the request it never read makes the kernel reset the
/// connection, and the client often sees a broken pipe or reset instead of
/// the alert. On a connection that sends nothing there is nothing unread:
/// the alert arrives. `Some(reason)` if the member refused; `None` if it
/// accepted (TLS 1.2: the handshake completed; TLS 1.3: no alert within
/// `wait`) or could not be asked.
pub(super) fn probe(
    config: &Arc<ClientConfig>,
    endpoint: &str,
    connect_timeout: Duration,
    wait: Duration,
) -> Option<String> {
    let authority = endpoint.strip_prefix("https://")?.split('/').next()?;
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => {
            (host, port.parse::<u16>().ok()?)
        }
        _ => (authority, 443),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let address = (host, port).to_socket_addrs().ok()?.next()?;
    let mut tcp = TcpStream::connect_timeout(&address, connect_timeout).ok()?;
    tcp.set_read_timeout(Some(wait)).ok()?;
    tcp.set_write_timeout(Some(wait)).ok()?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).ok()?;
    let mut conn = rustls::ClientConnection::new(config.clone(), name).ok()?;
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut tcp) {
            return refusal(&e);
        }
    }
    if conn.protocol_version() == Some(rustls::ProtocolVersion::TLSv1_2) {
        return None; // the member's Finished came after it checked us
    }
    let mut byte = [0u8; 1];
    match rustls::Stream::new(&mut conn, &mut tcp).read(&mut byte) {
        Err(e) => refusal(&e),
        // Data, or the end (0): the member let the connection stand.
        Ok(0 | 1..) => None,
    }
}

fn refusal(e: &std::io::Error) -> Option<String> {
    let inner = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    handshake_only(inner).then(|| explain(inner))
}

/// True for the rustls errors that only a handshake produces.
fn handshake_only(e: &rustls::Error) -> bool {
    match e {
        rustls::Error::InvalidCertificate(_)
        | rustls::Error::NoCertificatesPresented
        | rustls::Error::UnsupportedNameType
        | rustls::Error::PeerIncompatible(_)
        | rustls::Error::InvalidCertRevocationList(_) => true,
        rustls::Error::AlertReceived(alert) => matches!(
            alert,
            AlertDescription::BadCertificate
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::CertificateRevoked
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateUnknown
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateRequired
                | AlertDescription::AccessDenied
                | AlertDescription::HandshakeFailure
                | AlertDescription::ProtocolVersion
                | AlertDescription::InsufficientSecurity
        ),
        _ => false,
    }
}

/// What an operator should check for `e`.
fn explain(e: &rustls::Error) -> String {
    let hint = match e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            " (the member's certificate is not signed by the CA given)"
        }
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
        ) => " (the member's certificate does not name the endpoint's host)",
        rustls::Error::AlertReceived(
            AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::CertificateRequired
            | AlertDescription::CertificateUnknown,
        ) => {
            " (the member refused the client certificate: none was given, or it is \
             not signed by the member's --trusted-ca-file)"
        }
        _ => "",
    };
    format!("{e}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(e: rustls::Error) -> ureq::Error {
        ureq::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    #[test]
    fn only_handshake_errors_count_as_refusals() {
        let refused = handshake_failure(&io(rustls::Error::AlertReceived(
            AlertDescription::BadCertificate,
        )));
        assert!(refused.is_some_and(|r| r.contains("refused the client certificate")));
        let untrusted = handshake_failure(&io(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        )));
        assert!(untrusted.is_some_and(|r| r.contains("not signed by the CA given")));
        // A damaged record may come after the member executed the request.
        assert!(handshake_failure(&io(rustls::Error::DecryptError)).is_none());
        let reset = ureq::Error::Io(std::io::ErrorKind::ConnectionReset.into());
        assert!(handshake_failure(&reset).is_none());
        assert!(broken_connection(&reset));
        let refused_tcp = ureq::Error::Io(std::io::ErrorKind::ConnectionRefused.into());
        assert!(!broken_connection(&refused_tcp));
    }

    #[test]
    fn a_client_key_needs_its_certificate() {
        let tls = EtcdTls {
            ca_pem: Vec::new(),
            cert_pem: None,
            key_pem: Some(b"x".to_vec()),
        };
        assert!(matches!(tls.config(), Err(AuthorityError::Tls(_))));
        assert!(!format!("{tls:?}").contains('x'), "the key is never shown");
        let credentials = EtcdCredentials {
            user: "fencer".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{credentials:?}").contains("s3cret"));
    }
}
