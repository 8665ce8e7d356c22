//! Certificates for the TLS tests, made fresh by each test with `rcgen` and
//! written as PEM files to a private temp dir: a CA, a member (server)
//! certificate for 127.0.0.1 and localhost, the coordinator's client
//! certificate, and a second, unrelated CA with a client certificate of its
//! own (which the members must refuse).
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// One certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Pair {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (PKCS#8).
    pub key: PathBuf,
}

/// The test PKI (see the module docs). The files live as long as this.
pub struct Pki {
    /// The CA the members trust and the coordinator checks members against.
    pub ca: PathBuf,
    /// The member's certificate (SAN 127.0.0.1, localhost), signed by `ca`.
    pub server: Pair,
    /// The coordinator's client certificate, signed by `ca`. Its subject
    /// is empty (names only in subjectAltName): etcd's JSON gateway refuses
    /// a client certificate with a CommonName once authentication is on.
    pub client: Pair,
    /// An unrelated CA.
    pub other_ca: PathBuf,
    /// A client certificate signed by `other_ca`.
    pub foreign_client: Pair,
    /// A client certificate signed by `ca` that has a CommonName.
    pub named_client: Pair,
    dir: tempfile::TempDir,
}

impl Pki {
    /// Make and write every certificate.
    pub fn new() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("fencecheck-pki-")
            .tempdir()?;
        let (ca_pem, issuer) = authority("fencecheck test CA")?;
        let (other_pem, other_issuer) = authority("an unrelated CA")?;
        let ca = write(dir.path(), "ca.pem", &ca_pem)?;
        let other_ca = write(dir.path(), "other-ca.pem", &other_pem)?;
        let server = leaf(
            dir.path(),
            "server",
            &issuer,
            Some("etcd member"),
            &[
                SanType::IpAddress([127, 0, 0, 1].into()),
                SanType::DnsName("localhost".try_into()?),
            ],
            // Members also present it as clients of each other.
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        let client_san = [SanType::DnsName("coordinator.fencecheck.test".try_into()?)];
        let client_eku = [ExtendedKeyUsagePurpose::ClientAuth];
        let client = leaf(
            dir.path(),
            "client",
            &issuer,
            None,
            &client_san,
            &client_eku,
        )?;
        let foreign_client = leaf(
            dir.path(),
            "foreign-client",
            &other_issuer,
            None,
            &client_san,
            &client_eku,
        )?;
        let named_client = leaf(
            dir.path(),
            "named-client",
            &issuer,
            Some("fencer"),
            &client_san,
            &client_eku,
        )?;
        Ok(Self {
            ca,
            server,
            client,
            other_ca,
            foreign_client,
            named_client,
            dir,
        })
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// etcd's flags for serving clients over TLS with these certificates,
    /// requiring a client certificate signed by `ca`.
    pub fn etcd_args(&self) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        vec![
            "--cert-file".into(),
            path(&self.server.cert),
            "--key-file".into(),
            path(&self.server.key),
            "--trusted-ca-file".into(),
            path(&self.ca),
            "--client-cert-auth".into(),
        ]
    }
}

fn authority(name: &str) -> Result<(String, Issuer<'static, KeyPair>)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().context("generating a CA key")?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

fn leaf(
    dir: &Path,
    name: &str,
    issuer: &Issuer<'static, KeyPair>,
    common_name: Option<&str>,
    names: &[SanType],
    usages: &[ExtendedKeyUsagePurpose],
) -> Result<Pair> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.subject_alt_names = names.to_vec();
    params.distinguished_name = DistinguishedName::new();
    if let Some(cn) = common_name {
        params.distinguished_name.push(DnType::CommonName, cn);
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages.to_vec();
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().with_context(|| format!("generating the {name} key"))?;
    let cert = params.signed_by(&key, issuer)?;
    Ok(Pair {
        cert: write(dir, &format!("{name}.pem"), &cert.pem())?,
        key: write(dir, &format!("{name}-key.pem"), &key.serialize_pem())?,
    })
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}
