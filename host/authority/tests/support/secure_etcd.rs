//! A secured etcd for the tests: one member serving clients over TLS with
//! the test PKI's certificates and requiring a client certificate, and its
//! root user through the JSON gateway to turn authentication on, make
//! users and roles, and look at what was written.
#![allow(dead_code)] // each test binary uses a different subset

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use crate::etcd::{Cluster, Secure};
use crate::pki::Pki;

/// etcd's root password in the tests.
pub const ROOT_PASSWORD: &str = "root-secret";
/// Every test user's password.
pub const PASSWORD: &str = "fencer-secret";

/// The test's own client: trusts the test CA, presents the client
/// certificate.
pub fn agent(pki: &Pki) -> Result<ureq::Agent> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let ca = Certificate::from_pem(&std::fs::read(&pki.ca)?)?;
    let cert = Certificate::from_pem(&std::fs::read(&pki.client.cert)?)?;
    let key = PrivateKey::from_pem(&std::fs::read(&pki.client.key)?)?;
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&[ca]))
        .client_cert(Some(ClientCert::new_with_certs(&[cert], key)))
        .build();
    Ok(ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_millis(500)))
        .timeout_global(Some(Duration::from_secs(5)))
        .tls_config(tls)
        .build()
        .into())
}

/// A one-member cluster serving clients over TLS, requiring a client
/// certificate signed by the test CA; `extra` etcd flags added.
pub fn secure_cluster(pki: &Pki, extra: &[&str]) -> Result<Cluster> {
    let mut args = pki.etcd_args();
    args.extend(extra.iter().map(|s| s.to_string()));
    Cluster::start_secure(
        1,
        Secure {
            args,
            agent: agent(pki)?,
        },
    )
}

/// etcd's root user through the JSON gateway, beside the coordinator: sets
/// up users and roles and inspects what was written.
pub struct Admin {
    http: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

impl Admin {
    pub fn new(pki: &Pki, cluster: &Cluster) -> Result<Self> {
        Ok(Self {
            http: agent(pki)?,
            endpoint: cluster.endpoint(0),
            token: None,
        })
    }

    /// POST as root; the HTTP status and the body.
    pub fn send(&self, path: &str, body: &Value, token: Option<&str>) -> Result<(u16, Value)> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.endpoint))
            .header("content-type", "application/json");
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        let mut response = request
            .send(body.to_string())
            .with_context(|| format!("POST {path}"))?;
        let status = response.status().as_u16();
        let bytes = response.body_mut().read_to_vec()?;
        let value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{path}: {}", String::from_utf8_lossy(&bytes)))?;
        Ok((status, value))
    }

    /// POST as root (once authentication is on, with a fresh token).
    pub fn call(&mut self, path: &str, body: Value) -> Result<Value> {
        if self.token.is_some() {
            self.token = Some(self.authenticate("root", ROOT_PASSWORD)?);
        }
        let (status, value) = self.send(path, &body, self.token.as_deref())?;
        ensure!(status == 200, "{path}: HTTP {status}: {value}");
        Ok(value)
    }

    pub fn authenticate(&self, user: &str, password: &str) -> Result<String> {
        let body = json!({"name": user, "password": password});
        let (status, value) = self.send("/v3/auth/authenticate", &body, None)?;
        ensure!(status == 200, "authenticate {user}: HTTP {status}: {value}");
        Ok(value["token"]
            .as_str()
            .context("no token in the answer")?
            .to_owned())
    }

    /// A user with one role granting `perm` on each `(key, range_end)`.
    pub fn user(&mut self, name: &str, perm: &str, ranges: &[(&str, Option<&str>)]) -> Result<()> {
        let role = format!("{name}-role");
        self.call(
            "/v3/auth/user/add",
            json!({"name": name, "password": PASSWORD}),
        )?;
        self.call("/v3/auth/role/add", json!({"name": role}))?;
        for (key, end) in ranges {
            let mut grant = json!({"permType": perm, "key": B64.encode(key)});
            if let Some(end) = end {
                grant["range_end"] = json!(B64.encode(end));
            }
            self.call("/v3/auth/role/grant", json!({"name": role, "perm": grant}))?;
        }
        self.call("/v3/auth/user/grant", json!({"user": name, "role": role}))?;
        Ok(())
    }

    /// Create root and the test users, then turn authentication on:
    /// - `fencer`: read-write on `fencecheck/` (the coordinator's user);
    /// - `stranger`: read-write on `other/` only;
    /// - `reader`: read-only on `fencecheck/`;
    /// - `partial`: read-write on the lineage and floor keys, not the locks.
    pub fn enable_auth(&mut self) -> Result<()> {
        self.call(
            "/v3/auth/user/add",
            json!({"name": "root", "password": ROOT_PASSWORD}),
        )?;
        self.call(
            "/v3/auth/user/grant",
            json!({"user": "root", "role": "root"}),
        )?;
        self.user(
            "fencer",
            "READWRITE",
            &[("fencecheck/", Some("fencecheck0"))],
        )?;
        self.user("stranger", "READWRITE", &[("other/", Some("other0"))])?;
        self.user("reader", "READ", &[("fencecheck/", Some("fencecheck0"))])?;
        self.user(
            "partial",
            "READWRITE",
            &[
                ("fencecheck/lineage", None),
                ("fencecheck/epoch-floor", None),
            ],
        )?;
        self.call("/v3/auth/enable", json!({}))?;
        self.token = Some(self.authenticate("root", ROOT_PASSWORD)?);
        Ok(())
    }

    /// Every key under `prefix`, as root.
    pub fn keys(&mut self, prefix: &str) -> Result<Vec<String>> {
        let end = format!("{}0", prefix.trim_end_matches('/'));
        let value = self.call(
            "/v3/kv/range",
            json!({"key": B64.encode(prefix), "range_end": B64.encode(end), "keys_only": true}),
        )?;
        let kvs = value["kvs"].as_array().cloned().unwrap_or_default();
        kvs.iter()
            .map(|kv| {
                let key = B64.decode(kv["key"].as_str().unwrap_or_default())?;
                Ok(String::from_utf8(key)?)
            })
            .collect()
    }
}
