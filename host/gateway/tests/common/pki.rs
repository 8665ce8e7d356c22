//! Certificates made fresh per test with rcgen, as PEM files in a temp dir:
//! a CA and a server certificate for 127.0.0.1 and localhost; an unrelated
//! CA to show that verification is real.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// The files; they live as long as this.
pub struct Pki {
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub dir: tempfile::TempDir,
}

fn authority(name: &str) -> anyhow::Result<(String, Issuer<'static, KeyPair>)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().context("generating a CA key")?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

fn write(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

impl Pki {
    pub fn new() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let (ca_pem, issuer) = authority("fencecheck gateway test CA")?;
        let (other_pem, _) = authority("an unrelated CA")?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = vec![
            SanType::IpAddress([127, 0, 0, 1].into()),
            SanType::DnsName("localhost".try_into()?),
        ];
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Self {
            ca: write(dir.path(), "ca.pem", &ca_pem)?,
            other_ca: write(dir.path(), "other-ca.pem", &other_pem)?,
            cert: write(dir.path(), "server.pem", &cert.pem())?,
            key: write(dir.path(), "server-key.pem", &key.serialize_pem())?,
            dir,
        })
    }
}

/// An HTTPS client trusting only `ca` (no HTTP status is an error).
pub fn client(ca: &Path) -> anyhow::Result<ureq::Agent> {
    use ureq::tls::{PemItem, RootCerts, TlsConfig, TlsProvider};
    let pem = std::fs::read(ca)?;
    let mut roots = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        if let PemItem::Certificate(c) = item? {
            roots.push(c);
        }
    }
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(RootCerts::new_with_certs(&roots))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(30)))
        .build()
        .into())
}
