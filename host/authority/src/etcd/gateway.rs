//! Transport to etcd's v3 JSON gateway: blocking HTTP to a list of members,
//! failing over between them, and the gateway's proto3-JSON shapes. Knows
//! nothing of locks or leases: `super` builds the requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::Deserialize;
use serde_json::{Value, json};

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

/// The members of one cluster, reached through their JSON gateways.
pub(super) struct Gateway {
    http: ureq::Agent,
    endpoints: Vec<String>,
    /// The member to try first: the last one that answered.
    preferred: AtomicUsize,
    /// The cluster's id; every response must carry it.
    cluster: u64,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("endpoints", &self.endpoints)
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// Check the endpoints and ask the first reachable member for the
    /// cluster id.
    pub(super) fn connect(
        endpoints: &[String],
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self, AuthorityError> {
        if endpoints.is_empty() {
            return Err(etcd_error("no endpoints given"));
        }
        let mut checked = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let trimmed = endpoint.trim_end_matches('/');
            if !trimmed.starts_with("http://") || trimmed.len() <= "http://".len() {
                return Err(etcd_error(format!(
                    "endpoint {endpoint:?} is not an http:// URL (TLS is not supported)"
                )));
            }
            checked.push(trimmed.to_owned());
        }
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(connect_timeout))
            .timeout_global(Some(request_timeout))
            .max_redirects(0)
            .build()
            .into();
        let mut gateway = Self {
            http,
            endpoints: checked,
            preferred: AtomicUsize::new(0),
            cluster: 0,
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
        for i in (0..n).map(|k| (first + k) % n) {
            let endpoint = &self.endpoints[i];
            match self.post_once(endpoint, path, &body) {
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
                Ok(Reply::Refused { status, message }) => {
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
                Err(e) => {
                    self.preferred.store(i + 1, Ordering::Relaxed);
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
        Err(etcd_error(format!(
            "no member could answer {path}: {}",
            failures.join("; ")
        )))
    }

    fn post_once(&self, endpoint: &str, path: &str, body: &str) -> Result<Reply, ureq::Error> {
        let mut response = self
            .http
            .post(format!("{endpoint}{path}"))
            .header("content-type", "application/json")
            .send(body)?;
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
                },
            });
        }
        let message = serde_json::from_slice::<GatewayError>(&bytes)
            .ok()
            .and_then(|e| e.message.or(e.error))
            .unwrap_or_else(|| excerpt(&bytes));
        Ok(Reply::Refused { status, message })
    }
}

/// Largest response body read (a restore reads every lock state).
pub(super) const RESPONSE_LIMIT: u64 = 64 * 1024 * 1024;

enum Reply {
    Ok(Value),
    Refused { status: u16, message: String },
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
