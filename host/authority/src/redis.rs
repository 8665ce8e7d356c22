//! A lease coordinator on Redis or Valkey running the fencecheck module
//! (host/redis): every decision is one module command (`FENCE.ACQUIRE`,
//! `FENCE.RENEW`, `FENCE.RELEASE`, `FENCE.RESTORE`), which runs the
//! component's lease rules on the server's main thread, so the token is
//! minted atomically with the acquire and is the one `FENCE.SET` checks.
//! The server's clock is the lease clock. Spoken over plain RESP2 on TCP.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fencecheck::{Corruption, LeaseError, LeaseInvalidReason, Token, TokenText};

use crate::{AcquireOutcome, AuthorityError, Coordinator, Grant, ReleaseOutcome, RenewOutcome};

/// A RESP2 reply.
#[derive(Debug)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Reply {
    fn text(&self) -> Option<String> {
        match self {
            Reply::Status(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => String::from_utf8(b.clone()).ok(),
            _ => None,
        }
    }
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn redis_err(what: impl std::fmt::Display) -> AuthorityError {
    AuthorityError::Redis(what.to_string())
}

impl Conn {
    fn open(address: &str, auth: Option<(&str, &str)>) -> Result<Conn, AuthorityError> {
        let stream =
            TcpStream::connect(address).map_err(|e| redis_err(format!("{address}: {e}")))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(10))))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(redis_err)?;
        let reader = BufReader::new(stream.try_clone().map_err(redis_err)?);
        let mut conn = Conn {
            reader,
            writer: stream,
        };
        if let Some((user, password)) = auth
            && let Reply::Error(e) = conn.call(&["AUTH", user, password])?
        {
            return Err(AuthorityError::AuthenticationFailed(e));
        }
        Ok(conn)
    }

    fn call(&mut self, args: &[&str]) -> Result<Reply, AuthorityError> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a.as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf).map_err(redis_err)?;
        self.read(0)
    }

    fn read(&mut self, depth: u32) -> Result<Reply, AuthorityError> {
        if depth > 8 {
            return Err(redis_err("reply nested too deeply"));
        }
        let mut line = Vec::new();
        self.reader
            .read_until(b'\n', &mut line)
            .map_err(redis_err)?;
        if !line.ends_with(b"\r\n") {
            return Err(redis_err("connection closed"));
        }
        line.truncate(line.len() - 2);
        let (kind, rest) = line.split_first().ok_or_else(|| redis_err("empty reply"))?;
        let rest = String::from_utf8_lossy(rest).into_owned();
        let number = |s: &str| s.parse::<i64>().map_err(|_| redis_err("bad length"));
        Ok(match kind {
            b'+' => Reply::Status(rest),
            b'-' => Reply::Error(rest),
            b':' => Reply::Int(number(&rest)?),
            b'$' => match usize::try_from(number(&rest)?) {
                Err(_) => Reply::Bulk(None),
                Ok(n) if n > 1 << 20 => return Err(redis_err("reply too large")),
                Ok(n) => {
                    let mut data = vec![0; n + 2];
                    self.reader.read_exact(&mut data).map_err(redis_err)?;
                    data.truncate(n);
                    Reply::Bulk(Some(data))
                }
            },
            b'*' => match usize::try_from(number(&rest)?) {
                Err(_) => Reply::Bulk(None),
                Ok(n) if n > 64 => return Err(redis_err("reply too large")),
                Ok(n) => {
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.read(depth + 1)?);
                    }
                    Reply::Array(items)
                }
            },
            _ => return Err(redis_err("not RESP2")),
        })
    }
}

/// Where and as whom to connect: `redis://[[user]:password@]host:port`.
struct Target {
    address: String,
    user: String,
    password: Option<String>,
}

fn parse_url(url: &str) -> Result<Target, AuthorityError> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| redis_err(format!("{url:?} is not redis://HOST:PORT")))?;
    let rest = rest.trim_end_matches('/');
    let (auth, address) = match rest.rsplit_once('@') {
        Some((auth, address)) => (Some(auth), address),
        None => (None, rest),
    };
    if address.is_empty() || address.contains('/') {
        return Err(redis_err(format!(
            "{url:?} is not redis://HOST:PORT (no database number)"
        )));
    }
    let address = if address.contains(':') {
        address.to_string()
    } else {
        format!("{address}:6379")
    };
    let (user, password) = match auth.map(|a| a.split_once(':').unwrap_or(("", a))) {
        None => ("default".to_string(), None),
        Some(("", p)) => ("default".to_string(), Some(p.to_string())),
        Some((u, p)) => (u.to_string(), Some(p.to_string())),
    };
    Ok(Target {
        address,
        user,
        password,
    })
}

/// A coordinator whose store is a Redis or Valkey server loading the
/// fencecheck module. One connection, used by one call at a time; a broken
/// connection is reopened at the next call (the call that broke is an
/// error: its outcome is unknown).
pub struct RedisCoordinator {
    target: Target,
    authority: u64,
    conn: Mutex<Option<Conn>>,
}

const LINEAGE_KEY: &str = "fencecheck:lineage";

impl RedisCoordinator {
    /// Connect to `redis://[[user]:password@]host:port`, check that the
    /// server loads the module, and read its lineage (made now if the
    /// server never granted).
    pub fn connect(url: &str) -> Result<RedisCoordinator, AuthorityError> {
        let target = parse_url(url)?;
        let mut conn = Self::open(&target)?;
        match conn.call(&["COMMAND", "INFO", "fence.acquire"])? {
            Reply::Array(items) if matches!(items.first(), Some(Reply::Array(_))) => {}
            _ => {
                return Err(redis_err(
                    "the server does not load the fencecheck module (FENCE.ACQUIRE is unknown)",
                ));
            }
        }
        let fresh = crate::sqlite::fresh_authority().to_string();
        if let Reply::Error(e) = conn.call(&["SET", LINEAGE_KEY, &fresh, "NX"])? {
            return Err(redis_err(e));
        }
        let authority = match conn.call(&["GET", LINEAGE_KEY])? {
            Reply::Bulk(Some(b)) => std::str::from_utf8(&b)
                .ok()
                .filter(|s| !s.starts_with('0') || *s == "0")
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| redis_err(format!("{LINEAGE_KEY} is not a canonical u64")))?,
            other => return Err(redis_err(format!("reading {LINEAGE_KEY}: {other:?}"))),
        };
        Ok(RedisCoordinator {
            target,
            authority,
            conn: Mutex::new(Some(conn)),
        })
    }

    fn open(target: &Target) -> Result<Conn, AuthorityError> {
        let auth = target
            .password
            .as_deref()
            .map(|p| (target.user.as_str(), p));
        Conn::open(&target.address, auth)
    }

    /// One command; the connection is dropped when it broke mid-call.
    fn call(&self, args: &[&str]) -> Result<Reply, AuthorityError> {
        let mut slot = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let conn = match slot.as_mut() {
            Some(conn) => conn,
            None => slot.insert(Self::open(&self.target)?),
        };
        match conn.call(args) {
            Ok(reply) => Ok(reply),
            Err(e) => {
                *slot = None;
                Err(e)
            }
        }
    }

    fn token(&self, text: &str) -> Result<Token, AuthorityError> {
        // A signed grant's text carries its signature after the token; the
        // coordinator reports the token (SigningCoordinator signs on its own).
        let plain = text.split('~').next().unwrap_or_default();
        let token = plain
            .parse::<TokenText>()
            .map_err(|e| redis_err(format!("the module answered a bad token: {e}")))?
            .0;
        if token.authority != self.authority {
            return Err(redis_err(format!(
                "the server's lineage changed: granted under {}, connected under {}",
                token.authority, self.authority
            )));
        }
        Ok(token)
    }
}

fn int(r: &Reply) -> Result<u64, AuthorityError> {
    match r {
        Reply::Int(i) => u64::try_from(*i).map_err(redis_err),
        Reply::Bulk(Some(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| redis_err("not a number")),
        other => Err(redis_err(format!("not a number: {other:?}"))),
    }
}

/// The module's error line for a refusal of the lease rules, as the
/// component's [`LeaseError`]; any other error line is infrastructure.
fn refusal(line: &str) -> AuthorityError {
    let (code, detail) = line.split_once(' ').unwrap_or((line, ""));
    let words: Vec<&str> = detail.split(' ').collect();
    let number = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
    let reason = |name: &str| {
        use LeaseInvalidReason::*;
        [
            EmptyLock,
            LockTooLong,
            EmptyLeaseId,
            LeaseIdTooLong,
            ZeroTtl,
            ExpiryOverflow,
            MissingToken,
            NoState,
        ]
        .into_iter()
        .find(|r| r.name() == name)
    };
    let corruption = |name: &str| {
        use Corruption::*;
        [Truncated, LengthMismatch, ChecksumMismatch, Malformed]
            .into_iter()
            .find(|c| c.name() == name)
    };
    let error = match code {
        "INVALIDREQUEST" => reason(detail).map(LeaseError::InvalidRequest),
        "CORRUPTSTATE" => corruption(detail).map(LeaseError::CorruptState),
        "UNSUPPORTEDSTATEVERSION" => number(1)
            .and_then(|v| u8::try_from(v).ok())
            .map(LeaseError::UnsupportedStateVersion),
        "LOCKMISMATCH" => Some(LeaseError::LockMismatch(detail.to_string())),
        "FOREIGNAUTHORITY" => number(1)
            .zip(number(3))
            .map(|(stored, presented)| LeaseError::ForeignAuthority { stored, presented }),
        "EXHAUSTED" => Some(LeaseError::Exhausted),
        _ => None,
    };
    match error {
        Some(error) => AuthorityError::Refused { error },
        None => redis_err(line),
    }
}

fn unexpected(reply: &Reply) -> AuthorityError {
    match reply {
        Reply::Error(line) => refusal(line),
        other => redis_err(format!("unexpected reply {other:?}")),
    }
}

impl Coordinator for RedisCoordinator {
    fn authority(&self) -> u64 {
        self.authority
    }

    fn acquire(
        &self,
        lock: &str,
        lease_id: &str,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, AuthorityError> {
        let reply = self.call(&["FENCE.ACQUIRE", lock, lease_id, &ttl_ms.to_string()])?;
        match &reply {
            Reply::Array(items) => match (
                items.first().and_then(Reply::text).as_deref(),
                items.as_slice(),
            ) {
                (Some("acquired"), [_, token, expires, decided]) => {
                    let text = token.text().ok_or_else(|| redis_err("no token text"))?;
                    Ok(AcquireOutcome::Acquired(Grant {
                        lock: lock.to_string(),
                        lease_id: lease_id.to_string(),
                        token: self.token(&text)?,
                        expires_at: int(expires)?,
                        decided_at: int(decided)?,
                        signature: None,
                    }))
                }
                (Some("busy"), [_, holder, expires]) => Ok(AcquireOutcome::Busy {
                    holder: holder.text().unwrap_or_default(),
                    expires_at: int(expires)?,
                }),
                _ => Err(unexpected(&reply)),
            },
            _ => Err(unexpected(&reply)),
        }
    }

    fn renew(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
        ttl_ms: u64,
    ) -> Result<RenewOutcome, AuthorityError> {
        let text = TokenText(token).to_string();
        let reply = self.call(&["FENCE.RENEW", lock, lease_id, &text, &ttl_ms.to_string()])?;
        match &reply {
            Reply::Array(items) => match (
                items.first().and_then(Reply::text).as_deref(),
                items.as_slice(),
            ) {
                (Some("renewed"), [_, expires]) => Ok(RenewOutcome::Renewed {
                    expires_at: int(expires)?,
                }),
                (Some("lost"), [_]) => Ok(RenewOutcome::Lost),
                _ => Err(unexpected(&reply)),
            },
            _ => Err(unexpected(&reply)),
        }
    }

    fn release(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, AuthorityError> {
        let text = TokenText(token).to_string();
        let reply = self.call(&["FENCE.RELEASE", lock, lease_id, &text])?;
        match &reply {
            Reply::Array(items) => match items.first().and_then(Reply::text).as_deref() {
                Some("released") => Ok(ReleaseOutcome::Released),
                Some("not-owner") => Ok(ReleaseOutcome::NotOwner),
                _ => Err(unexpected(&reply)),
            },
            _ => Err(unexpected(&reply)),
        }
    }

    fn restore(&self, at_least: u64) -> Result<u64, AuthorityError> {
        let reply = self.call(&["FENCE.RESTORE", &at_least.to_string()])?;
        match &reply {
            Reply::Array(items) => match (
                items.first().and_then(Reply::text).as_deref(),
                items.as_slice(),
            ) {
                (Some("restored"), [_, floor]) => int(floor),
                _ => Err(unexpected(&reply)),
            },
            _ => Err(unexpected(&reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// URLs name a host and port, optionally a user and password; nothing else.
    #[test]
    fn urls() {
        let t = parse_url("redis://u:p@127.0.0.1:7000").ok();
        assert_eq!(
            t.map(|t| (t.address, t.user, t.password)),
            Some(("127.0.0.1:7000".into(), "u".into(), Some("p".into())))
        );
        let t = parse_url("redis://:secret@h").ok();
        assert_eq!(
            t.map(|t| (t.address, t.user, t.password)),
            Some(("h:6379".into(), "default".into(), Some("secret".into())))
        );
        assert!(parse_url("http://h:1").is_err());
        assert!(parse_url("redis://h:1/2").is_err());
    }

    /// The module's lease error lines come back as the component's errors;
    /// anything else is an infrastructure error.
    #[test]
    fn refusals() {
        assert!(matches!(
            refusal("INVALIDREQUEST zero-ttl"),
            AuthorityError::Refused {
                error: LeaseError::InvalidRequest(LeaseInvalidReason::ZeroTtl)
            }
        ));
        assert!(matches!(
            refusal("FOREIGNAUTHORITY stored 1 presented 2"),
            AuthorityError::Refused {
                error: LeaseError::ForeignAuthority {
                    stored: 1,
                    presented: 2
                }
            }
        ));
        assert!(matches!(
            refusal("LOADING Redis is loading"),
            AuthorityError::Redis(_)
        ));
    }
}
