//! The fenced history: PUTs and DELETEs of four keys through both
//! surfaces with tokens around each key's highest, each outcome checked
//! against the fence rules as it comes, and reads of the keys through both
//! surfaces.

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{SignedTokenText, Token, TokenText};
use fencecheck_tests::fuzzing::shown;
use fencecheck_tests::history::{Attempt, Audited, Seen};

use super::sigv4::{Signer, sha256_hex};
use super::wire::{Answer, Conn, Got};
use super::{BUCKET, HISTORY_KEYS, KEY, ROOT_SECRET, Req, Run, SECRET, md5_hex, now};

/// What the fuzzer knows of one fenced key.
#[derive(Default)]
pub(super) struct KeyState {
    /// The highest token accepted.
    pub(super) highest: Option<Token>,
    /// The version of the last applied write (0: none).
    pub(super) version: u64,
    /// The payload id of the visible object (`None`: none, or deleted).
    pub(super) visible: Option<String>,
}

impl Run {
    /// A token for a fenced write of `scope`: mostly around its highest
    /// (below, equal, above; sometimes with an authority), sometimes any.
    pub(super) fn history_token(&mut self, scope: &str) -> String {
        let highest = self.keys.get(scope).and_then(|k| k.highest);
        if self.f.one_in(12) {
            let t: String = self
                .f
                .token()
                .chars()
                .filter(|c| (' '..='~').contains(c))
                .collect();
            // A huge epoch locks the key for good: rarely.
            let locks = t.trim().parse::<TokenText>().is_ok_and(|t| t.0.epoch > 100);
            if !locks || self.f.one_in(30) {
                return t;
            }
        }
        let (e, c) = highest.map_or((1, 1), |h| (h.epoch, h.counter));
        let (e, c) = match self.f.below(8) {
            0 => (e, c),
            1 => (e, c.saturating_sub(1 + self.f.below(3))),
            2 => (e.saturating_sub(1).max(1), self.f.below(20)),
            3 => (e.saturating_add(1), self.f.below(5)),
            _ => (e, c.saturating_add(1 + self.f.below(2))),
        };
        match self.f.below(20) {
            0 => format!("0:{e}.{c}"),
            1 => format!("7:{e}.{c}"),
            _ => format!("{e}.{c}"),
        }
    }

    /// One fenced PUT or DELETE of a history key, through either surface;
    /// its outcome checked against the rules and recorded.
    pub(super) fn fenced_write(&mut self) -> Result<()> {
        let key = self.f.pick(&HISTORY_KEYS);
        let scope = format!("{BUCKET}/{key}");
        let s3 = self.f.one_in(2);
        let delete = self.f.one_in(4);
        let text = self.history_token(&scope);
        let guarded = self.f.one_in(4);
        self.seq += 1;
        let payload = format!("{}-{}", if delete { "del" } else { "put" }, self.seq);
        let op_id = guarded.then(|| format!("op-{}", self.seq));
        let body: Vec<u8> = if delete {
            Vec::new()
        } else {
            let n = self.f.size(64 << 10);
            let mut b = format!("{payload}\n").into_bytes();
            b.extend(self.f.bytes(n));
            b
        };
        let method = if delete { "DELETE" } else { "PUT" };
        let path = if s3 {
            format!("/{scope}")
        } else {
            format!("/objects/{scope}")
        };
        let mut req = Req::new(method, path.clone());
        req.plain = true;
        req.label = format!("fenced {method} {}", if s3 { "s3" } else { "objects" });
        if let Some(op) = &op_id {
            req.header("Idempotency-Key", op.as_str());
        }
        if s3 {
            match self.f.below(10) {
                0..=2 if !delete => req.header("x-amz-meta-fence-token", text.as_str()),
                3 if !delete => {
                    req.header("x-amz-meta-fence-token", text.as_str());
                    req.header("fence-token", text.as_str());
                }
                _ => req.header("fence-token", text.as_str()),
            }
            req.body = body.clone();
            self.sign_valid(&mut req, &path);
        } else {
            req.header("Authorization", format!("Bearer {ROOT_SECRET}"));
            req.header("Fence-Token", text.as_str());
            req.body = body.clone();
        }
        let what = req.what();
        let a = self.plain_exchange(req)?;
        ensure!(
            a.status < 500,
            "a fenced write got {} {}: {what}",
            a.status,
            shown(&a.body)
        );
        let state = self.keys.entry(scope.clone()).or_default();
        let (expect, token) = predict(state, &text, guarded);
        let applied = (200..300).contains(&a.status);
        match expect {
            Expect::Applied => ensure!(
                applied,
                "expected applied, got {} {}: {what}",
                a.status,
                shown(&a.body)
            ),
            Expect::Stale => ensure!(
                a.status == 409,
                "expected 409 stale, got {} {}: {what}",
                a.status,
                shown(&a.body)
            ),
            Expect::Refused => ensure!(!applied, "expected a refusal, got {}: {what}", a.status),
            Expect::Unknown => {}
        }
        let token = if applied {
            // What the gateway reports is the canonical form of the token.
            let reported = a
                .header("fence-token")
                .with_context(|| format!("no Fence-Token on an applied write: {what}"))?;
            let parsed = reported
                .parse::<TokenText>()
                .with_context(|| format!("Fence-Token {reported:?} of an applied write"))?
                .0;
            if let Some(t) = token {
                ensure!(parsed == t, "applied {t:?} but reported {reported}: {what}");
            }
            parsed
        } else {
            token.unwrap_or_default()
        };
        let seen = if applied {
            let version: u64 = if s3 {
                a.header("x-amz-version-id")
                    .and_then(|v| v.parse().ok())
                    .with_context(|| format!("no x-amz-version-id: {what}"))?
            } else {
                a.header("etag")
                    .and_then(|v| v.trim_matches('"').parse().ok())
                    .with_context(|| format!("no version ETag: {what}"))?
            };
            ensure!(
                version == state.version + 1,
                "applied at version {version}, after version {}: {what}",
                state.version
            );
            let status = match (s3, delete, state.visible.is_some()) {
                (_, true, _) => 204,
                (true, false, _) | (false, false, true) => 200,
                (false, false, false) => 201,
            };
            ensure!(
                a.status == status,
                "applied with {} (not {status}): {what}",
                a.status
            );
            if s3 && !delete {
                let etag = format!("\"{}\"", md5_hex(&body));
                ensure!(
                    a.header("etag") == Some(etag.as_str()),
                    "PutObject ETag {:?}, not the MD5: {what}",
                    a.header("etag")
                );
            }
            if let Some(h) = state.highest {
                ensure!(
                    token.grant_order(&h).is_ge(),
                    "{token:?} applied below the highest {h:?}: {what}"
                );
            }
            state.highest = Some(token);
            state.version = version;
            state.visible = (!delete).then(|| payload.clone());
            self.audit.entry(scope.clone()).or_default().insert(
                version,
                Audited {
                    payload: payload.clone(),
                    token,
                },
            );
            Seen::Applied(version)
        } else {
            Seen::Refused(format!("{} {}", a.status, a.code().unwrap_or_default()))
        };
        if !delete {
            self.bodies.insert(payload.clone(), body);
        }
        self.attempts.push(Attempt {
            client: usize::from(s3),
            scope,
            token,
            op_id,
            expected_version: None,
            payload,
            seen,
        });
        Ok(())
    }

    /// A validly signed S3 request (root credentials, the body's hash).
    pub(super) fn sign_valid(&mut self, req: &mut Req, path: &str) {
        let signer = Signer::at(KEY, SECRET, now());
        let payload = sha256_hex(&req.body);
        req.header("x-amz-date", signer.amz_date.clone());
        req.header("x-amz-content-sha256", payload.clone());
        let values: Vec<(String, String)> = vec![
            ("host".into(), self.gw.addr.clone()),
            ("x-amz-date".into(), signer.amz_date.clone()),
            ("x-amz-content-sha256".into(), payload.clone()),
        ];
        let (authorization, _) = signer.sign(
            &req.method,
            path,
            "",
            &values,
            &["host", "x-amz-content-sha256", "x-amz-date"],
            &payload,
        );
        req.header("Authorization", authorization);
    }

    /// A well-formed request that must be answered.
    pub(super) fn plain_exchange(&mut self, mut req: Req) -> Result<Answer> {
        req.plain = true;
        let what = req.what();
        let raw = self.build(req);
        let mut conn = Conn::open(&self.gw.addr)?;
        conn.send(&raw)?;
        match conn.response(raw.head_only) {
            Got::Answer(a) => {
                *self.tally.statuses.entry(a.status).or_default() += 1;
                *self
                    .tally
                    .coverage
                    .entry(raw.label)
                    .or_default()
                    .entry(a.status)
                    .or_default() += 1;
                Ok(a)
            }
            other => bail!("no answer ({other:?}) to {what}"),
        }
    }

    /// Read a history key back through one surface: the last applied
    /// write's body, version and token, or 404.
    pub(super) fn read_back(&mut self, scope: &str, s3: bool, head: bool) -> Result<()> {
        self.tally.reads += 1;
        let method = if head { "HEAD" } else { "GET" };
        let path = if s3 {
            format!("/{scope}")
        } else {
            format!("/objects/{scope}")
        };
        let mut req = Req::new(method, path.clone());
        req.label = format!("read back {}", if s3 { "s3" } else { "objects" });
        if s3 {
            self.sign_valid(&mut req, &path);
        } else {
            req.header("Authorization", format!("Bearer {ROOT_SECRET}"));
        }
        let what = req.what();
        let a = self.plain_exchange(req)?;
        let state = self.keys.get(scope);
        let visible = state.and_then(|s| s.visible.as_ref());
        let Some(payload) = visible else {
            ensure!(
                a.status == 404,
                "{what}: expected 404, got {} {}",
                a.status,
                shown(&a.body)
            );
            return Ok(());
        };
        let state = state.context("a visible key has a state")?;
        ensure!(
            a.status == 200,
            "{what}: expected 200, got {} {}",
            a.status,
            shown(&a.body)
        );
        if !head {
            let body = self.bodies.get(payload).context("the visible body")?;
            ensure!(
                &a.body == body,
                "{what}: served {} (not {payload})",
                shown(&a.body)
            );
        }
        let version = if s3 {
            a.header("x-amz-version-id").map(str::to_owned)
        } else {
            a.header("etag").map(|e| e.trim_matches('"').to_owned())
        };
        ensure!(
            version == Some(state.version.to_string()),
            "{what}: version {version:?}, expected {}",
            state.version
        );
        let token = state.highest.map(|t| TokenText(t).to_string());
        ensure!(
            a.header("fence-token").map(str::to_owned) == token,
            "{what}: Fence-Token {:?}, expected {token:?}",
            a.header("fence-token")
        );
        if s3 {
            ensure!(
                a.header("x-amz-meta-fence-token").map(str::to_owned) == token,
                "{what}: x-amz-meta-fence-token {:?}, expected {token:?}",
                a.header("x-amz-meta-fence-token")
            );
        }
        Ok(())
    }
}

/// What the fence rules say of a write presenting `text` to a key in
/// `state` (docs/design.md §3).
pub(super) enum Expect {
    Applied,
    /// 409: not above the highest (or equal without a guard).
    Stale,
    /// Any refusal (malformed, no token, another authority).
    Refused,
    /// A signed token on a key that does not require them: the component
    /// decides; the outcome is learned, not predicted.
    Unknown,
}

pub(super) fn predict(state: &KeyState, text: &str, guarded: bool) -> (Expect, Option<Token>) {
    let text = text.trim();
    let t = match text.parse::<TokenText>() {
        Ok(t) => t.0,
        Err(_) => {
            return match text.parse::<SignedTokenText>() {
                Ok(s) => (Expect::Unknown, Some(s.token)),
                Err(_) => (Expect::Refused, None),
            };
        }
    };
    if t.is_missing() {
        return (Expect::Refused, Some(t));
    }
    let Some(h) = state.highest else {
        return (Expect::Applied, Some(t));
    };
    if h.authority != t.authority {
        return (Expect::Refused, Some(t));
    }
    match t.grant_order(&h) {
        std::cmp::Ordering::Greater => (Expect::Applied, Some(t)),
        std::cmp::Ordering::Equal if guarded => (Expect::Applied, Some(t)),
        _ => (Expect::Stale, Some(t)),
    }
}
