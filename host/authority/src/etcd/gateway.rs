//! Transport to etcd's v3 JSON gateway: blocking HTTP or HTTPS to a list of
//! members, failing over between them, etcd authentication tokens, and the
//! gateway's proto3-JSON shapes. Knows nothing of locks or leases: `super`
//! builds the requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde_json::{Value, json};

use super::access::{self, EtcdCredentials, EtcdTls};
use crate::AuthorityError;

/// Whether a request may be sent again (to this or another member) after a
/// failure that might have happened after the member received it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    /// A read: resending is harmless.
    Repeatable,
    /// A write: resend only if it certainly never left this process.
    AtMostOnce,
}

/// One key as read: its value and `mod_revision`; `None` if absent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) value: Vec<u8>,
    pub(super) mod_revision: u64,
}

/// How to reach one cluster: its members, and the TLS settings and
/// credentials to reach them with.
pub(super) struct Access<'a> {
    pub(super) endpoints: &'a [String],
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    pub(super) tls: Option<&'a EtcdTls>,
    pub(super) credentials: Option<&'a EtcdCredentials>,
    /// The coordinator's key prefix, named in permission errors.
    pub(super) prefix: &'a str,
}

/// The members of one cluster, reached through their JSON gateways.
pub(super) struct Gateway {
    http: ureq::Agent,
    endpoints: Vec<String>,
    /// The member to try first: the last one that answered.
    preferred: AtomicUsize,
    /// The cluster's id; every response must carry it.
    cluster: u64,
    credentials: Option<EtcdCredentials>,
    /// With TLS: the same settings as the agent's, for `access::probe`.
    probe: Option<Arc<rustls::ClientConfig>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// The etcd auth token sent with every request (with credentials): got
    /// at the first request, replaced when a member reports it invalid.
    token: Mutex<Option<String>>,
    prefix: String,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("endpoints", &self.endpoints)
            .field("cluster", &self.cluster)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive() // never the token
    }
}

/// The etcd errors (gRPC status messages, stable across etcd 3.x) that the
/// gateway tells apart from other refusals.
const INVALID_TOKEN: &str = "etcdserver: invalid auth token";
const USER_EMPTY: &str = "etcdserver: user name is empty";
const AUTH_FAILED: &str = "etcdserver: authentication failed";
const AUTH_NOT_ENABLED: &str = "etcdserver: authentication is not enabled";
const PERMISSION_DENIED: &str = "etcdserver: permission denied";
/// etcd's JSON gateway refuses, when authentication is on, client
/// certificates with a CommonName (etcd would take the CN as the user over
/// gRPC, but the gateway cannot pass it on).
const GATEWAY_CN: &str = "CommonName of client sending a request against gateway";

/// gRPC's code for a request refused for its credentials (HTTP 401).
const UNAUTHENTICATED: i64 = 16;
/// gRPC's code for a request refused for its user's permissions (HTTP 403).
const PERMISSION: i64 = 7;

impl Gateway {
    /// Check the endpoints and the TLS settings, authenticate if
    /// credentials are given, and ask the first reachable member for the
    /// cluster id.
    pub(super) fn connect(access: Access<'_>) -> Result<Self, AuthorityError> {
        if access.endpoints.is_empty() {
            return Err(etcd_error("no endpoints given"));
        }
        let mut checked = Vec::with_capacity(access.endpoints.len());
        for endpoint in access.endpoints {
            let trimmed = endpoint.trim_end_matches('/');
            let https = match trimmed.split_once("://") {
                Some(("https", host)) if !host.is_empty() => true,
                Some(("http", host)) if !host.is_empty() => false,
                _ => {
                    return Err(etcd_error(format!(
                        "endpoint {endpoint:?} is not an http:// or https:// URL"
                    )));
                }
            };
            match (https, access.tls.is_some()) {
                (true, true) | (false, false) => {}
                (true, false) => {
                    return Err(AuthorityError::Tls(format!(
                        "endpoint {endpoint:?} is https:// but no CA was given \
                         (the system's roots are not used for etcd)"
                    )));
                }
                (false, true) => {
                    // Certificates given but a plain endpoint: never send
                    // credentials in the clear by mistake.
                    return Err(AuthorityError::Tls(format!(
                        "endpoint {endpoint:?} is plain http:// but TLS settings were given: \
                         use https:// endpoints"
                    )));
                }
            }
            checked.push(trimmed.to_owned());
        }
        if let Some(c) = access.credentials
            && c.user.is_empty()
        {
            return Err(AuthorityError::AuthenticationFailed(
                "the etcd user name is empty".into(),
            ));
        }
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(access.connect_timeout))
            .timeout_global(Some(access.request_timeout))
            .max_redirects(0);
        let mut probe = None;
        if let Some(tls) = access.tls {
            let (agent, checked) = tls.config()?;
            config = config.tls_config(agent);
            probe = Some(checked);
        }
        let http: ureq::Agent = config.build().into();
        let mut gateway = Self {
            http,
            endpoints: checked,
            preferred: AtomicUsize::new(0),
            cluster: 0,
            credentials: access.credentials.cloned(),
            probe,
            connect_timeout: access.connect_timeout,
            request_timeout: access.request_timeout,
            token: Mutex::new(None),
            prefix: access.prefix.to_owned(),
        };
        let status = gateway.post("/v3/maintenance/status", &json!({}), Delivery::Repeatable)?;
        let cluster = cluster_id(&status)?;
        if cluster == 0 {
            return Err(etcd_error("the cluster reports id 0"));
        }
        gateway.cluster = cluster;
        Ok(gateway)
    }

    /// The cluster's id (non-zero).
    pub(super) fn cluster(&self) -> u64 {
        self.cluster
    }

    /// POST `body` to `path` on the preferred member, moving on to the next
    /// member when one cannot be used. Returns the parsed 200 response,
    /// checked to come from this coordinator's cluster.
    ///
    /// TLS handshake failures, authentication failures and permission
    /// denials are their own errors, never "unknown outcome": etcd executes
    /// nothing on a connection whose handshake failed, checks the token
    /// before it proposes a request, and checks a transaction's permissions
    /// before it applies any of it.
    pub(super) fn post(
        &self,
        path: &str,
        body: &Value,
        delivery: Delivery,
    ) -> Result<Value, AuthorityError> {
        let body = body.to_string();
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures = Vec::new();
        let mut tls_refused = false;
        for i in (0..n).map(|k| (first + k) % n) {
            let endpoint = &self.endpoints[i];
            match self.post_authenticated(endpoint, path, &body) {
                Ok(Reply::Ok(value)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    if self.cluster != 0 {
                        let id = cluster_id(&value)?;
                        if id != self.cluster {
                            return Err(etcd_error(format!(
                                "{endpoint} answered for cluster {id}, not {}: \
                                 the endpoints name different clusters",
                                self.cluster
                            )));
                        }
                    }
                    return Ok(value);
                }
                Ok(Reply::Refused {
                    status,
                    message,
                    code,
                }) => {
                    if let Some(e) = self.access_refusal(&message, code, delivery) {
                        return Err(e);
                    }
                    // A 5xx (no leader, not ready, timed out) or an unreadable
                    // 200 is the member's trouble: a read may try another; a
                    // write may have been applied. A 4xx is a refusal.
                    let trouble = status >= 500 || status == 200;
                    if trouble && delivery == Delivery::Repeatable {
                        self.preferred.store(i + 1, Ordering::Relaxed);
                        failures.push(format!("{endpoint}: HTTP {status}: {message}"));
                        continue;
                    }
                    let unknown = if trouble {
                        " (the write's outcome is unknown)"
                    } else {
                        ""
                    };
                    return Err(etcd_error(format!(
                        "{endpoint}{path}: HTTP {status}: {message}{unknown}"
                    )));
                }
                Err(Failure::Access(e)) => return Err(e),
                Err(Failure::Tls(reason)) => {
                    self.preferred.store(i + 1, Ordering::Relaxed);
                    tls_refused = true;
                    failures.push(format!("{endpoint}: {reason}"));
                }
                Err(Failure::Unsent(why)) => {
                    self.preferred.store(i + 1, Ordering::Relaxed);
                    failures.push(format!("{endpoint}: {why}"));
                }
                Err(Failure::Http(e)) => {
                    self.preferred.store(i + 1, Ordering::Relaxed);
                    if let Some(reason) = self.tls_refusal(endpoint, &e, delivery) {
                        // Never executed: the next member may take even a
                        // write. If none does, this is the error reported.
                        tls_refused = true;
                        failures.push(format!("{endpoint}: {reason}"));
                        continue;
                    }
                    let unsent = never_sent(&e);
                    failures.push(format!("{endpoint}: {e}"));
                    if !unsent && delivery == Delivery::AtMostOnce {
                        return Err(etcd_error(format!(
                            "{endpoint}{path}: {e} (the write's outcome is unknown)"
                        )));
                    }
                }
            }
        }
        if tls_refused {
            return Err(AuthorityError::Tls(format!(
                "no member accepted the connection: {}",
                failures.join("; ")
            )));
        }
        Err(etcd_error(format!(
            "no member could answer {path}: {}",
            failures.join("; ")
        )))
    }

    /// The access error a refusal means, if it is one: authentication and
    /// permission refusals are the same on every member, so they end the
    /// request.
    fn access_refusal(
        &self,
        message: &str,
        code: Option<i64>,
        delivery: Delivery,
    ) -> Option<AuthorityError> {
        let user = || self.credentials.as_ref().map(|c| c.user.clone());
        if message.starts_with(PERMISSION_DENIED) || code == Some(PERMISSION) {
            return Some(AuthorityError::PermissionDenied {
                user: user().unwrap_or_default(),
                operation: match delivery {
                    Delivery::Repeatable => "read",
                    Delivery::AtMostOnce => "write",
                },
                prefix: self.prefix.clone(),
            });
        }
        if message.starts_with(USER_EMPTY) {
            return Some(AuthorityError::AuthenticationFailed(
                "the cluster has authentication enabled: give an etcd user and password".into(),
            ));
        }
        if message.starts_with(INVALID_TOKEN) || code == Some(UNAUTHENTICATED) {
            // Only after a fresh token was refused too (see
            // `post_authenticated`), or with no credentials at all.
            return Some(AuthorityError::AuthenticationFailed(match user() {
                Some(u) => format!("a fresh token for user {u:?} was refused: {message}"),
                None => format!("the cluster requires authentication: {message}"),
            }));
        }
        if message.starts_with(GATEWAY_CN) {
            return Some(AuthorityError::Tls(
                "etcd's JSON gateway refuses client certificates that have a CommonName \
                 while authentication is enabled: issue the coordinator a client \
                 certificate without a CN (names in subjectAltName only)"
                    .into(),
            ));
        }
        None
    }

    /// One request to one member, with the auth token if there are
    /// credentials. A token the member calls invalid (expired, issued
    /// before the member restarted) is replaced once and the request sent
    /// again: etcd checks the token before it proposes or serves a request
    /// (`AuthInfoFromCtx` in the server, ahead of the raft proposal), so the
    /// refused request was not executed and resending cannot apply it twice.
    fn post_authenticated(&self, endpoint: &str, path: &str, body: &str) -> Result<Reply, Failure> {
        let Some(credentials) = &self.credentials else {
            return self
                .post_once(endpoint, path, body, None)
                .map_err(Failure::Http);
        };
        let mut token = self.token();
        // Bounded: a token refused right after it was issued is an error.
        for _ in 0..3 {
            let (current, fresh) = match token.take() {
                Some(t) => (t, false),
                None => (self.authenticate(endpoint, credentials)?, true),
            };
            let reply = self
                .post_once(endpoint, path, body, Some(&current))
                .map_err(Failure::Http)?;
            let invalid = matches!(&reply, Reply::Refused { message, code, .. }
                if message.starts_with(INVALID_TOKEN) || *code == Some(UNAUTHENTICATED));
            if !invalid || fresh {
                return Ok(reply);
            }
            // Another thread may have replaced it meanwhile: use that one.
            let mut slot = self.token.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.as_deref() == Some(current.as_str()) {
                *slot = None;
            }
            token = slot.clone();
        }
        Err(Failure::Unsent(
            "the auth token kept being replaced by concurrent requests".into(),
        ))
    }

    /// The TLS refusal behind `e`, if the member refused the handshake, so
    /// that the request was certainly not executed. A connection broken
    /// under a read is looked into with a probe (see `access::probe`); one
    /// broken under a write is not: it may be an established connection
    /// that broke after the member executed the write.
    fn tls_refusal(&self, endpoint: &str, e: &ureq::Error, delivery: Delivery) -> Option<String> {
        if let Some(reason) = access::handshake_failure(e) {
            return Some(reason);
        }
        let config = self.probe.as_ref()?;
        if delivery != Delivery::Repeatable || !access::broken_connection(e) {
            return None;
        }
        // A refusal arrives within milliseconds of the handshake; an
        // accepting member waits for a request that never comes.
        let wait = self.request_timeout.min(Duration::from_secs(2));
        access::probe(config, endpoint, self.connect_timeout, wait)
            .map(|reason| format!("{reason} (the connection broke under the request: {e})"))
    }

    fn token(&self) -> Option<String> {
        self.token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Get a token from `endpoint` (`/v3/auth/authenticate`) and keep it.
    fn authenticate(
        &self,
        endpoint: &str,
        credentials: &EtcdCredentials,
    ) -> Result<String, Failure> {
        let request = json!({"name": credentials.user, "password": credentials.password});
        let reply = self
            .post_once(
                endpoint,
                "/v3/auth/authenticate",
                &request.to_string(),
                None,
            )
            .map_err(|e| {
                // The request this token is for has not been sent: only a
                // TLS refusal keeps its own meaning.
                match self.tls_refusal(endpoint, &e, Delivery::Repeatable) {
                    Some(reason) => Failure::Tls(reason),
                    None => Failure::Unsent(format!("authenticating: {e}")),
                }
            })?;
        let refused = |why: String| Failure::Access(AuthorityError::AuthenticationFailed(why));
        match reply {
            Reply::Ok(value) => {
                let token = value
                    .get("token")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        Failure::Access(etcd_error(format!(
                            "{endpoint}: an authentication response without a token"
                        )))
                    })?
                    .to_owned();
                *self.token.lock().unwrap_or_else(PoisonError::into_inner) = Some(token.clone());
                Ok(token)
            }
            Reply::Refused { message, .. } if message.starts_with(AUTH_FAILED) => {
                Err(refused(format!(
                    "etcd refused user {:?}: wrong user name or password",
                    credentials.user
                )))
            }
            Reply::Refused { message, .. } if message.starts_with(AUTH_NOT_ENABLED) => {
                Err(refused(
                    "credentials were given but the cluster has authentication disabled \
                     (`etcdctl auth enable`); refusing to run without it"
                        .into(),
                ))
            }
            Reply::Refused {
                status,
                message,
                code,
            } => match self.access_refusal(&message, code, Delivery::Repeatable) {
                Some(e) => Err(Failure::Access(e)),
                // Anything else (no leader yet, …) is the member's trouble:
                // authentication is repeatable, another member may answer.
                None => Err(Failure::Unsent(format!(
                    "authenticating: HTTP {status}: {message}"
                ))),
            },
        }
    }

    fn post_once(
        &self,
        endpoint: &str,
        path: &str,
        body: &str,
        token: Option<&str>,
    ) -> Result<Reply, ureq::Error> {
        let mut request = self
            .http
            .post(format!("{endpoint}{path}"))
            .header("content-type", "application/json");
        if let Some(token) = token {
            // The gateway passes `Authorization` on as the gRPC token.
            request = request.header("authorization", token);
        }
        let mut response = request.send(body)?;
        let status = response.status().as_u16();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_LIMIT)
            .read_to_vec()?;
        if status == 200 {
            return Ok(match serde_json::from_slice::<Value>(&bytes) {
                Ok(value) if value.is_object() => Reply::Ok(value),
                // A 200 that is not a JSON object: nothing to trust in it.
                _ => Reply::Refused {
                    status,
                    message: format!("unreadable body: {}", excerpt(&bytes)),
                    code: None,
                },
            });
        }
        let error = serde_json::from_slice::<GatewayError>(&bytes).ok();
        let code = error.as_ref().and_then(|e| e.code);
        let message = error
            .and_then(|e| e.message.or(e.error))
            .unwrap_or_else(|| excerpt(&bytes));
        Ok(Reply::Refused {
            status,
            message,
            code,
        })
    }
}

/// Why one member gave no reply.
enum Failure {
    /// The request failed in transport (see `never_sent`, `handshake_failure`).
    Http(ureq::Error),
    /// Authentication was refused: the same on every member.
    Access(AuthorityError),
    /// The member failed before the request was sent (while authenticating).
    Unsent(String),
    /// The member refused the TLS handshake before the request was sent.
    Tls(String),
}

/// Largest response body read (a restore reads every lock state).
pub(super) const RESPONSE_LIMIT: u64 = 64 * 1024 * 1024;

enum Reply {
    Ok(Value),
    Refused {
        status: u16,
        message: String,
        /// The gRPC status code etcd's error carried, if any.
        code: Option<i64>,
    },
}

/// True if `e` happened before the request could reach the member.
fn never_sent(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable | ErrorKind::NotConnected
        ),
        ureq::Error::Timeout(t) => {
            matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve)
        }
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound | ureq::Error::BadUri(_) => true,
        _ => false,
    }
}

pub(super) fn etcd_error(message: impl Into<String>) -> AuthorityError {
    AuthorityError::Etcd(message.into())
}

pub(super) fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

pub(super) fn parse<T: serde::de::DeserializeOwned>(
    value: Value,
    what: &str,
) -> Result<T, AuthorityError> {
    serde_json::from_value(value)
        .map_err(|e| etcd_error(format!("unexpected {what} response: {e}")))
}

pub(super) fn cluster_id(response: &Value) -> Result<u64, AuthorityError> {
    let id = response
        .pointer("/header/cluster_id")
        .ok_or_else(|| etcd_error("a response carries no cluster id"))?;
    u64_text(id).map_err(|e| etcd_error(format!("unexpected cluster id: {e}")))
}

pub(super) fn range_op(key: &[u8]) -> Value {
    json!({"request_range": {"key": B64.encode(key)}})
}

/// Every key in `[start, end)`.
pub(super) fn range_all_op(start: &[u8], end: &[u8]) -> Value {
    json!({"request_range": {"key": B64.encode(start), "range_end": B64.encode(end)}})
}

/// Delete every key in `[start, end)`.
pub(super) fn delete_range_op(start: &[u8], end: &[u8]) -> Value {
    json!({"request_delete_range": {"key": B64.encode(start), "range_end": B64.encode(end)}})
}

/// The compare that holds only if no key in `[start, end)` was put after
/// `revision` (a deletion is not seen; coordinators never delete locks).
pub(super) fn range_unchanged_since(start: &[u8], end: &[u8], revision: u64) -> Value {
    json!({
        "key": B64.encode(start),
        "range_end": B64.encode(end),
        "target": "MOD",
        "result": "LESS",
        "mod_revision": (revision + 1).to_string(),
    })
}

pub(super) fn put_op(key: &[u8], value: &[u8]) -> Value {
    json!({"request_put": {"key": B64.encode(key), "value": B64.encode(value)}})
}

/// The compare that holds only if `key` is still as read.
pub(super) fn unchanged(key: &[u8], read: Option<&Entry>) -> Value {
    match read {
        Some(e) => json!({
            "key": B64.encode(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": e.mod_revision.to_string(),
        }),
        None => json!({
            "key": B64.encode(key),
            "target": "CREATE",
            "result": "EQUAL",
            "create_revision": "0",
        }),
    }
}

/// The first key after every key starting with `prefix`.
pub(super) fn prefix_end(prefix: &[u8]) -> Result<Vec<u8>, AuthorityError> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Ok(end);
        }
    }
    Err(etcd_error("the key prefix has no upper bound"))
}

// ---- The gateway's JSON (proto3 JSON: 64-bit integers are strings, bytes
// are base64, fields at their default value are omitted). ----

#[derive(Deserialize)]
struct GatewayError {
    error: Option<String>,
    message: Option<String>,
    code: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Header {
    #[serde(default, deserialize_with = "u64_text")]
    pub(super) revision: u64,
}

#[derive(Debug, Deserialize)]
pub(super) struct TxnResponse {
    pub(super) header: Header,
    #[serde(default)]
    pub(super) succeeded: bool,
    #[serde(default)]
    pub(super) responses: Vec<OpResponse>,
}

#[derive(Debug, Deserialize)]
pub(super) enum OpResponse {
    #[serde(rename = "response_range")]
    Range(RangeResponse),
    #[serde(rename = "response_put")]
    Put {},
    #[serde(rename = "response_delete_range")]
    DeleteRange {},
}

#[derive(Debug, Deserialize)]
pub(super) struct RangeResponse {
    #[serde(default)]
    pub(super) kvs: Vec<RawKv>,
    #[serde(default, deserialize_with = "u64_text")]
    pub(super) count: u64,
    #[serde(default)]
    pub(super) more: bool,
}

#[derive(Debug, Deserialize)]
pub(super) struct RawKv {
    #[serde(default)]
    pub(super) key: String,
    #[serde(default)]
    pub(super) value: String,
    #[serde(default, deserialize_with = "u64_text")]
    pub(super) mod_revision: u64,
}

pub(super) struct Kv {
    pub(super) key: Vec<u8>,
    pub(super) value: Vec<u8>,
    pub(super) mod_revision: u64,
}

impl Kv {
    pub(super) fn decode(raw: &RawKv) -> Result<Self, AuthorityError> {
        let b64 = |s: &str| {
            B64.decode(s)
                .map_err(|e| etcd_error(format!("invalid base64 in a key-value: {e}")))
        };
        Ok(Self {
            key: b64(&raw.key)?,
            value: b64(&raw.value)?,
            mod_revision: raw.mod_revision,
        })
    }
}

/// A proto3-JSON 64-bit unsigned integer: a decimal string (or a number).
fn u64_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Str(String),
        Num(u64),
    }
    match Text::deserialize(d)? {
        Text::Num(n) => Ok(n),
        Text::Str(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a u64"))),
        Text::Str(s) => Err(serde::de::Error::custom(format!("{s:?} is not a u64"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end(b"a/lock/").ok(), Some(b"a/lock0".to_vec()));
        assert_eq!(prefix_end(b"a\xff").ok(), Some(b"b".to_vec()));
        assert!(prefix_end(b"\xff\xff").is_err());
    }

    #[test]
    fn gateway_integers_are_strings() -> Result<(), serde_json::Error> {
        let txn: TxnResponse = serde_json::from_str(
            r#"{"header":{"cluster_id":"18446744073709551615","revision":"9"},
                "responses":[{"response_range":{"header":{},"kvs":[
                  {"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"1","value":"YmFy"}],
                  "count":"1"}}]}"#,
        )?;
        assert_eq!(txn.header.revision, 9);
        let value: Value =
            serde_json::from_str(r#"{"header":{"cluster_id":"18446744073709551615"}}"#)?;
        assert_eq!(cluster_id(&value).ok(), Some(u64::MAX));
        assert!(cluster_id(&json!({"header": {}})).is_err());
        assert!(!txn.succeeded, "an omitted `succeeded` is false");
        assert!(serde_json::from_str::<Header>(r#"{"revision":"-1"}"#).is_err());
        assert!(serde_json::from_str::<Header>(r#"{"revision":"1e3"}"#).is_err());
        Ok(())
    }
}
