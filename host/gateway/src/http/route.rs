//! The first step of a request's life: method and path to a [`Route`], or
//! the 400/404/405 answer. Nothing here touches storage or credentials.

use pingora::http::RequestHeader;
use serde_json::json;

use super::reply::Reply;
use crate::auth::Right;
use crate::key::{decode, validate_key};

/// Default and largest page of a listing.
pub(crate) const LIST_DEFAULT: usize = 100;
pub(crate) const LIST_MAX: usize = 1000;

/// What an object request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ObjectOp {
    Get,
    Head,
    Put,
    Delete,
}

/// Where a request goes.
#[derive(Debug)]
pub(crate) enum Route {
    Health,
    Metrics,
    /// `/objects/{key}` (key decoded and validated).
    Object {
        key: String,
        op: ObjectOp,
    },
    /// `GET /objects/?prefix=P&after=K&limit=N`.
    List {
        prefix: String,
        after: Option<String>,
        limit: usize,
    },
    /// `POST /v1/locks/{lock}/{action}`.
    Lock {
        lock: String,
        action: String,
    },
}

impl Route {
    /// The metrics' operation label.
    pub fn op(&self) -> &'static str {
        match self {
            Route::Health => "health",
            Route::Metrics => "metrics",
            Route::Object { op, .. } => match op {
                ObjectOp::Get | ObjectOp::Head => "get",
                ObjectOp::Put => "put",
                ObjectOp::Delete => "delete",
            },
            Route::List { .. } => "list",
            Route::Lock { .. } => "lock",
        }
    }

    /// The right the route needs, and on which key (or key prefix);
    /// `None`: any authenticated caller (metrics) or nobody (health).
    pub fn needs(&self) -> Option<(Right, &str)> {
        match self {
            Route::Health | Route::Metrics => None,
            Route::Object { key, op } => Some((
                match op {
                    ObjectOp::Get | ObjectOp::Head => Right::Read,
                    ObjectOp::Put | ObjectOp::Delete => Right::Write,
                },
                key,
            )),
            Route::List { prefix, .. } => Some((Right::Read, prefix)),
            Route::Lock { lock, .. } => Some((Right::Lock, lock)),
        }
    }

    /// Whether the route answers without credentials (health checks).
    pub fn is_public(&self) -> bool {
        matches!(self, Route::Health)
    }
}

fn method_not_allowed(allow: &'static str) -> Reply {
    Reply::problem(
        405,
        "method-not-allowed",
        &format!("use {allow}"),
        json!({}),
    )
    .header("Allow", allow)
}

/// Route `req`.
pub(crate) fn route(req: &RequestHeader) -> Result<Route, Reply> {
    let method = req.method.as_str();
    let path = req.uri.path();
    let query = req.uri.query();
    match path {
        "/healthz" => {
            return match method {
                "GET" | "HEAD" => Ok(Route::Health),
                _ => Err(method_not_allowed("GET, HEAD")),
            };
        }
        "/metrics" => {
            return match method {
                "GET" => Ok(Route::Metrics),
                _ => Err(method_not_allowed("GET")),
            };
        }
        "/objects/" | "/objects" => {
            return match method {
                "GET" => list(query.unwrap_or("")),
                _ => Err(method_not_allowed("GET")),
            };
        }
        _ => {}
    }
    if let Some(raw) = path.strip_prefix("/objects/") {
        let op = match method {
            "GET" => ObjectOp::Get,
            "HEAD" => ObjectOp::Head,
            "PUT" => ObjectOp::Put,
            "DELETE" => ObjectOp::Delete,
            _ => return Err(method_not_allowed("GET, HEAD, PUT, DELETE")),
        };
        let key = validate_key(raw).map_err(|e| Reply::bad_request(&e.to_string()))?;
        if query.is_some() {
            return Err(Reply::bad_request("object URLs take no query string"));
        }
        return Ok(Route::Object { key, op });
    }
    if let Some(rest) = path.strip_prefix("/v1/locks/") {
        if method != "POST" {
            return Err(method_not_allowed("POST"));
        }
        let Some((lock, action)) = rest.rsplit_once('/') else {
            return Err(Reply::not_found(
                "use /v1/locks/{lock}/acquire|renew|release",
            ));
        };
        if !matches!(action, "acquire" | "renew" | "release") {
            return Err(Reply::not_found("use acquire, renew or release"));
        }
        if query.is_some() {
            return Err(Reply::bad_request("lock URLs take no query string"));
        }
        let lock = validate_key(lock).map_err(|e| Reply::bad_request(&e.to_string()))?;
        return Ok(Route::Lock {
            lock,
            action: action.to_owned(),
        });
    }
    Err(Reply::not_found("no such route"))
}

/// `prefix=P&after=K&limit=N`, each at most once, percent-decoded.
fn list(query: &str) -> Result<Route, Reply> {
    let (mut prefix, mut after, mut limit) = (None, None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "prefix" => &mut prefix,
            "after" => &mut after,
            "limit" => &mut limit,
            _ => {
                return Err(Reply::bad_request(
                    "a listing takes prefix, after and limit only",
                ));
            }
        };
        if slot.is_some() {
            return Err(Reply::bad_request(&format!("{name} given twice")));
        }
        let text = decode(value, false).map_err(|e| Reply::bad_request(&format!("{name}: {e}")))?;
        if text.len() > fencecheck::MAX_SCOPE_BYTES {
            return Err(Reply::bad_request(&format!("{name} is over 1024 bytes")));
        }
        *slot = Some(text);
    }
    let limit = match limit {
        None => LIST_DEFAULT,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=LIST_MAX).contains(&n) => n,
            _ => {
                return Err(Reply::bad_request(&format!(
                    "limit must be 1 to {LIST_MAX}"
                )));
            }
        },
    };
    Ok(Route::List {
        prefix: prefix.unwrap_or_default(),
        after,
        limit,
    })
}
