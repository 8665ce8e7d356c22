//! The object surface: `PUT`, `DELETE`, `GET`, `HEAD` on `/objects/{key}`,
//! and the listing `GET /objects/?prefix=&after=&limit=`.
//!
//! A PUT: early check (a stale writer or a failed precondition learns it
//! before uploading) → stage an object row → stream the body into a new
//! blob, counted, hashed, flushed and synced → record its length, hash,
//! Content-Type and Idempotency-Key → the fenced publish, which decides
//! again. Anything but applied deletes the row and the blob at once.

use std::time::{Duration, Instant, SystemTime};

use fencecheck::{Decision, MAX_OP_ID_BYTES, SignedCheckError, SignedOutcome, SignedTokenText};
use fencecheck_sqlite::{ObjectId, Rejection};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::Session;
use serde_json::json;

use super::body::{BodyFailure, Reading};
use super::conditional::{ReadCheck, Span, Tags, WriteConditions, read_check, span};
use super::publish::{Published, Write, cleanup, decide_early, publish_fenced};
use super::reply::{Reply, etag, refused, rejection, token_text};
use super::route::ObjectOp;
use super::{Ctx, Gateway};
use crate::blobs::Written;
use crate::key::encode_key;
use crate::store::{Current, Head, Kind, Meta};

/// Longest Content-Type kept.
const MAX_CONTENT_TYPE: usize = 256;
const DEFAULT_TYPE: &str = "application/octet-stream";

pub(crate) async fn serve(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut Ctx,
    key: &str,
    op: ObjectOp,
) -> pingora::Result<()> {
    let reply = match op {
        ObjectOp::Put => put(gw, session, ctx, key).await?,
        ObjectOp::Delete => delete(gw, session, ctx, key).await,
        ObjectOp::Get | ObjectOp::Head => {
            return get(gw, session, ctx, key, op == ObjectOp::Head).await;
        }
    };
    gw.answer(session, ctx, reply).await
}

pub(crate) fn header<'a>(req: &'a RequestHeader, name: &str) -> Result<Option<&'a str>, Reply> {
    let mut values = req.headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Reply::bad_request(&format!("more than one {name} header")));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| Reply::bad_request(&format!("{name} must be visible ASCII")))
}

/// The fenced request from the headers, or the 400/428 answer.
fn write_request(req: &RequestHeader, key: &str) -> Result<Write, Reply> {
    let Some(raw) = header(req, "fence-token")? else {
        return Err(Reply::problem(
            428,
            "missing-token",
            "a Fence-Token header is required",
            json!({}),
        ));
    };
    let presented = raw.trim().parse::<SignedTokenText>().map_err(|_| {
        Reply::bad_request(
            "Fence-Token must be EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER, signed: TOKEN~KEY-ID~LEASE~TAG",
        )
    })?;
    let op_id = match header(req, "idempotency-key")? {
        None => None,
        Some(s) if !s.is_empty() && s.len() <= MAX_OP_ID_BYTES => Some(s.to_owned()),
        Some(_) => {
            return Err(Reply::bad_request(
                "Idempotency-Key must be 1 to 256 bytes of visible ASCII",
            ));
        }
    };
    let tags = |name: &str| -> Result<Option<Tags>, Reply> {
        header(req, name)?
            .map(|v| {
                Tags::parse(v).ok_or_else(|| {
                    Reply::bad_request(&format!(
                        "{name} must be * or a list of quoted ETags (\"<version>\")"
                    ))
                })
            })
            .transpose()
    };
    let conditions = WriteConditions {
        if_match: tags("if-match")?,
        if_none_match: tags("if-none-match")?,
    };
    let guarded = !conditions.is_empty();
    Ok(Write::new(key, presented, op_id, guarded, conditions))
}

/// The early check's verdict, if it stops the write: stale (it can never
/// become fresh again), refused, unauthenticated, or a failed precondition
/// (unless the request is a duplicate, which the publish answers).
fn early_stop(outcome: &SignedOutcome, write: &Write, head: &Head) -> Option<Reply> {
    let stop = match outcome {
        Ok(Decision::StaleFence { presented, highest }) => Some(rejection(
            &Rejection::StaleFence {
                presented: *presented,
                highest: *highest,
            },
            "",
        )),
        Err(SignedCheckError::Check(e)) => Some(refused(e)),
        Err(SignedCheckError::Unauthenticated(f)) => {
            Some(rejection(&Rejection::Unauthenticated(*f), ""))
        }
        Err(SignedCheckError::InvalidKeys(p)) => Some(rejection(&Rejection::InvalidKeys(*p), "")),
        _ => None,
    };
    if stop.is_some() || matches!(outcome, Ok(Decision::Duplicate { .. })) {
        return stop;
    }
    write
        .conditions
        .decide(head.body_version(), head.version)
        .is_err()
        .then(|| precondition_failed(&write.conditions, head))
}

fn precondition_failed(conditions: &WriteConditions, head: &Head) -> Reply {
    let expected = match (&conditions.if_match, &conditions.if_none_match) {
        (Some(tags), _) => tags
            .single_version()
            .map_or_else(|| json!(format!("{tags:?}")), |v| json!(v)),
        (None, Some(Tags::Any)) => json!("absent"),
        (None, Some(tags)) => json!(format!("not {tags:?}")),
        (None, None) => json!(null),
    };
    Reply::problem(
        412,
        "version-conflict",
        "the precondition (If-Match / If-None-Match) does not hold for the current version",
        json!({"expected": expected, "actual": head.body_version()}),
    )
}

fn content_type(req: &RequestHeader) -> Result<String, Reply> {
    match header(req, "content-type")? {
        None => Ok(DEFAULT_TYPE.to_owned()),
        Some(t) if !t.is_empty() && t.len() <= MAX_CONTENT_TYPE => Ok(t.to_owned()),
        Some(_) => Err(Reply::bad_request(
            "Content-Type must be 1 to 256 bytes of visible ASCII",
        )),
    }
}

async fn put(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut Ctx,
    key: &str,
) -> pingora::Result<Reply> {
    let (write, content_type) = match write_request(session.req_header(), key)
        .and_then(|w| Ok((w, content_type(session.req_header())?)))
    {
        Ok(w) => w,
        Err(reply) => return Ok(reply),
    };
    ctx.epoch = Some(write.request.token.epoch);
    let declared = match header(session.req_header(), "content-length") {
        Ok(None) => None,
        Ok(Some(v)) => match v.trim().parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => return Ok(Reply::bad_request("Content-Length must be a number")),
        },
        Err(reply) => return Ok(reply),
    };
    if declared.is_some_and(|n| n > gw.config.max_body) {
        // The body is left unread: close the connection after answering.
        session.set_keepalive(None);
        return Ok(Reply::too_large(gw.config.max_body));
    }
    let (write, head) = match early(gw, write).await {
        Ok(done) => done,
        Err(reply) => {
            session.set_keepalive(None);
            return Ok(reply);
        }
    };
    let (scope, fence) = (key.to_owned(), write.fence.clone());
    let object = match gw
        // Admission (nothing accepted yet; with SQLite the early check
        // took no permit): waits at most --queue-timeout-ms.
        .work(true, move |s| s.stage(&scope, Kind::Blob, &fence))
        .await
    {
        Ok(object) => object,
        Err(f) => return Ok(f.reply()),
    };
    // A client that asked (`Expect: 100-continue`, curl does for large
    // bodies) sends the body only now, after the early check passed.
    let expects = session
        .req_header()
        .headers
        .get("expect")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if expects {
        let go = ResponseHeader::build(100, None)?;
        session
            .as_downstream_mut()
            .write_response_header(Box::new(go))
            .await?;
    }
    let written = match receive(gw, session, object, declared).await {
        Ok(written) => written,
        Err(failure) => {
            cleanup(gw, object).await;
            session.set_keepalive(None);
            return match failure {
                BodyFailure::TooLarge => Ok(Reply::too_large(gw.config.max_body)),
                BodyFailure::TooSlow => Ok(Reply::problem(
                    408,
                    "body-timeout",
                    "the request body was too slow (a chunk, --body-deadline or --min-rate)",
                    json!({}),
                )),
                BodyFailure::Length { declared, received } => Ok(Reply::problem(
                    400,
                    "incomplete-body",
                    "the body's length differs from Content-Length",
                    json!({"declared": declared, "received": received}),
                )),
                BodyFailure::Cut(why) => Ok(Reply::problem(
                    400,
                    "incomplete-body",
                    &format!("the body ended before its Content-Length or last chunk: {why}"),
                    json!({"declared": declared}),
                )),
                BodyFailure::Malformed(why) => Ok(Reply::bad_request(&format!(
                    "the chunked body is malformed: {why}"
                ))),
                BodyFailure::Client(e) => Err(e),
                BodyFailure::Storage(e) => Ok(Reply::unavailable(&e)),
            };
        }
    };
    let meta = Meta {
        length: written.length,
        sha256: written.sha256,
        content_type,
        op_id: write.request.op_id.clone(),
        etag: None,
        metadata: None,
    };
    let existed = head.body_version().is_some();
    Ok(publish(gw, write, object, meta, if existed { 200 } else { 201 }).await)
}

/// Decide early; on a verdict that stops the write, the answer.
async fn early(gw: &Gateway, write: Write) -> Result<(Write, Head), Reply> {
    let guarded = !write.conditions.is_empty();
    let (outcome, head, write) = decide_early(gw, write, guarded)
        .await
        .map_err(|f| f.reply())?;
    match early_stop(&outcome, &write, &head) {
        Some(reply) => Err(reply),
        None => Ok((write, head)),
    }
}

/// Stream the request body into `object`'s blob at the body pace, bounded
/// in size, then make it durable; the length must be the declared one.
async fn receive(
    gw: &Gateway,
    session: &mut Session,
    object: ObjectId,
    declared: Option<u64>,
) -> Result<Written, BodyFailure> {
    let mut writer = gw
        .blobs
        .create(object, declared)
        .await
        .map_err(BodyFailure::Storage)?;
    let mut reading = Reading::new(gw.config.pace);
    while let Some(chunk) = reading.next(session, gw.config.max_body).await? {
        if let Err(e) = writer.write(chunk).await {
            // Take (and drop) the rest of the body, at the same pace and
            // bound, so the client reads the answer instead of a reset.
            while let Ok(Some(_)) = reading.next(session, gw.config.max_body).await {}
            return Err(BodyFailure::Storage(e));
        }
    }
    if let Some(declared) = declared
        && declared != reading.received()
    {
        return Err(BodyFailure::Length {
            declared,
            received: reading.received(),
        });
    }
    gw.blobs.finish(writer).await.map_err(BodyFailure::Storage)
}

/// The fenced publish of a staged object and its answer.
async fn publish(gw: &Gateway, write: Write, object: ObjectId, meta: Meta, status: u16) -> Reply {
    match publish_fenced(gw, &write, object, meta).await {
        Published::Applied { version, highest } => {
            Reply::new(status, "applied").versioned(version, token_text(highest))
        }
        Published::Duplicate { version, reused } => {
            if reused {
                Reply::problem(
                    422,
                    "idempotency-key-reused",
                    "this Idempotency-Key was applied with a different body (or method); nothing was changed",
                    json!({"version": version}),
                )
            } else {
                rejection(&Rejection::Duplicate { version }, &write.fence)
            }
        }
        Published::Rejected(r) => rejection(&r, &write.fence),
        Published::CommitUnknown(e) => {
            // It may have been published: keep the object (the collector
            // takes it if it was not), and tell the client how to find out.
            tracing::warn!(error = %e, key = %write.request.scope, "commit outcome unknown");
            Reply::problem(
                503,
                "commit-unknown",
                "the database connection failed while the publish was committing: it may or may not have been published. Retry with the same Fence-Token and the same Idempotency-Key: a duplicate answer means it was; without an Idempotency-Key, read the key (ETag, Fence-Token) before deciding",
                json!({"key": write.request.scope, "object": object.get()}),
            )
            .header("Retry-After", "1")
        }
        Published::Failed(f) => f.reply(),
    }
}

async fn delete(gw: &Gateway, session: &mut Session, ctx: &mut Ctx, key: &str) -> Reply {
    let write = match write_request(session.req_header(), key) {
        Ok(w) => w,
        Err(reply) => return reply,
    };
    ctx.epoch = Some(write.request.token.epoch);
    let (write, _head) = match early(gw, write).await {
        Ok(done) => done,
        Err(reply) => return reply,
    };
    let (scope, fence) = (key.to_owned(), write.fence.clone());
    let object = match gw
        // Admission (nothing accepted yet; with SQLite the early check
        // took no permit): waits at most --queue-timeout-ms.
        .work(true, move |s| s.stage(&scope, Kind::Tombstone, &fence))
        .await
    {
        Ok(object) => object,
        Err(f) => return f.reply(),
    };
    let meta = Meta::tombstone(write.request.op_id.clone());
    let mut reply = publish(gw, write, object, meta, 204).await;
    if reply.status == 200 {
        reply.status = 204;
    }
    reply
}

/// The blob a pointer names is gone (lost in a crash, removed by hand):
/// never 200, never a guess.
fn blob_missing(gw: &Gateway, key: &str, current: &Current) -> Reply {
    tracing::error!(
        key,
        object = current.object.get(),
        "the visible object's blob is missing"
    );
    Reply::problem(
        500,
        "blob-missing",
        "the key's visible object has no blob (lost in a crash, or removed outside the gateway)",
        json!({
            "key": key,
            "object": current.object.get(),
            "blob": gw.blobs.name(current.object),
        }),
    )
}

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

async fn get(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut Ctx,
    key: &str,
    head_only: bool,
) -> pingora::Result<()> {
    let req = session.req_header();
    let parsed = (|| -> Result<_, Reply> {
        let tags = |name: &str| -> Result<Option<Tags>, Reply> {
            header(req, name)?
                .map(|v| {
                    Tags::parse(v)
                        .ok_or_else(|| Reply::bad_request(&format!("{name} is not an ETag list")))
                })
                .transpose()
        };
        let since =
            header(req, "if-modified-since")?.and_then(|v| httpdate::parse_http_date(v).ok());
        let range = header(req, "range")?.map(str::to_owned);
        let if_range = header(req, "if-range")?.map(str::to_owned);
        Ok((
            tags("if-match")?,
            tags("if-none-match")?,
            since,
            range,
            if_range,
        ))
    })();
    let (if_match, if_none_match, since, range, if_range) = match parsed {
        Ok(p) => p,
        Err(reply) => return gw.answer(session, ctx, reply).await,
    };
    // The collector may delete a blob just replaced after we read the
    // pointer; reading the pointer again finds the newer one. The same
    // object twice with no blob is a missing blob.
    let mut previous: Option<ObjectId> = None;
    let mut first = true;
    loop {
        let scope = key.to_owned();
        // The cheap read path (SQLite: this thread's reader), else the pool.
        let head = match gw.store.head_here(key) {
            Some(head) => Ok(head),
            None => gw.work(first, move |s| s.head(&scope)).await,
        };
        let current = match head {
            Ok(head) => match head.visible {
                Some(c) if c.kind == Kind::Blob => c,
                _ => {
                    let reply = Reply::not_found("no visible object");
                    return gw.answer(session, ctx, reply).await;
                }
            },
            Err(f) => return gw.answer(session, ctx, f.reply()).await,
        };
        first = false;
        if previous == Some(current.object) {
            let reply = blob_missing(gw, key, &current);
            return gw.answer(session, ctx, reply).await;
        }
        previous = Some(current.object);
        let tag = etag(current.version);
        let modified = http_date(current.published_at);
        let common = |status: u16| -> pingora::Result<ResponseHeader> {
            let mut h = ResponseHeader::build(status, Some(8))?;
            h.insert_header("ETag", &tag)?;
            h.insert_header("Last-Modified", &modified)?;
            h.insert_header("Fence-Token", &current.fence)?;
            Ok(h)
        };
        match read_check(
            if_match.as_ref(),
            if_none_match.as_ref(),
            since,
            &tag,
            current.published_at,
        ) {
            ReadCheck::Proceed => {}
            ReadCheck::NotModified => {
                ctx.outcome = "not-modified";
                session
                    .write_response_header(Box::new(common(304)?), true)
                    .await?;
                return Ok(());
            }
            ReadCheck::Failed => {
                let reply = Reply::problem(
                    412,
                    "precondition-failed",
                    "If-Match does not name the current version",
                    json!({"actual": current.version}),
                );
                return gw.answer(session, ctx, reply).await;
            }
        }
        // The length, without reading the body: recorded, or asked of the
        // blob store (objects of older gateways).
        let length = match current.length {
            Some(n) if !head_only => Some(n),
            _ => match gw.blobs.size(current.object).await {
                Ok(size) => size,
                Err(e) => return gw.answer(session, ctx, Reply::unavailable(&e)).await,
            },
        };
        let Some(length) = length else { continue };
        let content_type = current.content_type.as_deref().unwrap_or(DEFAULT_TYPE);
        let honour_range = if_range
            .as_deref()
            .is_none_or(|v| v == tag || v == modified);
        let part = match (head_only, honour_range) {
            (false, true) => span(range.as_deref(), length),
            _ => Span::Full,
        };
        let (status, wanted) = match part {
            Span::Full => (200, None),
            Span::Part { start, end } => (206, Some((start, end))),
            Span::Unsatisfiable => {
                let reply = Reply::problem(
                    416,
                    "range-not-satisfiable",
                    "the range is outside the object",
                    json!({"length": length}),
                )
                .header("Content-Range", format!("bytes */{length}"))
                .header("Accept-Ranges", "bytes");
                return gw.answer(session, ctx, reply).await;
            }
        };
        let mut header = common(status)?;
        header.insert_header("Content-Type", content_type)?;
        header.insert_header("Accept-Ranges", "bytes")?;
        let sending = wanted.map_or(length, |(s, e)| e - s + 1);
        header.insert_header("Content-Length", sending.to_string())?;
        if let Some((s, e)) = wanted {
            header.insert_header("Content-Range", format!("bytes {s}-{e}/{length}"))?;
        }
        if head_only || sending == 0 {
            ctx.outcome = "ok";
            session
                .write_response_header(Box::new(header), true)
                .await?;
            return Ok(());
        }
        let mut reader = match gw.blobs.open(current.object, wanted).await {
            Ok(Some((reader, total))) if total == length => reader,
            Ok(Some(_)) => {
                let e = crate::error::Error::Upstream {
                    doing: "reading a blob",
                    detail: "its length differs from the recorded one".into(),
                };
                return gw.answer(session, ctx, Reply::unavailable(&e)).await;
            }
            Ok(None) => continue,
            Err(e) => return gw.answer(session, ctx, Reply::unavailable(&e)).await,
        };
        ctx.outcome = "ok";
        session
            .write_response_header(Box::new(header), false)
            .await?;
        stream(gw, session, &mut reader).await?;
        gw.blobs.done(reader).await;
        return Ok(());
    }
}

/// Send the reader's bytes within `--response-deadline`; a blob shorter
/// than announced aborts the response (never padded).
async fn stream(
    gw: &Gateway,
    session: &mut Session,
    reader: &mut crate::blobs::BlobReader,
) -> pingora::Result<()> {
    let deadline = Instant::now() + gw.config.response_deadline;
    // Sized to the blob: a small GET neither zeroes nor frees 64 KiB.
    let mut buf = vec![0u8; usize::try_from(reader.left()).map_or(64 << 10, |n| n.min(64 << 10))];
    while reader.left() > 0 {
        let chunk = reader.next(&mut buf).await.map_err(|e| {
            pingora::Error::because(pingora::ErrorType::ReadError, "reading a blob", e)
        })?;
        let Some(chunk) = chunk else {
            return pingora::Error::e_explain(pingora::ErrorType::ReadError, "blob shrank");
        };
        let end = reader.left() == 0;
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.max(Duration::from_millis(1)), async {
            session.write_response_body(Some(chunk), end).await
        })
        .await
        {
            Ok(result) => result?,
            Err(_) => {
                return pingora::Error::e_explain(
                    pingora::ErrorType::WriteTimedout,
                    "--response-deadline",
                );
            }
        }
    }
    Ok(())
}

/// `GET /objects/?prefix=&after=&limit=`: one page, ordered by key.
pub(crate) async fn list(gw: &Gateway, prefix: &str, after: Option<String>, limit: usize) -> Reply {
    let p = prefix.to_owned();
    let rows = match gw
        .work(true, move |s| s.list(&p, after.as_deref(), limit + 1))
        .await
    {
        Ok(rows) => rows,
        Err(f) => return f.reply(),
    };
    let more = rows.len() > limit;
    let page = &rows[..rows.len().min(limit)];
    let objects: Vec<_> = page
        .iter()
        .map(|o| {
            json!({
                "key": o.key,
                "path": format!("/objects/{}", encode_key(&o.key)),
                "etag": etag(o.version),
                "version": o.version,
                "fence_token": o.fence,
                "size": o.length,
                "content_type": o.content_type.as_deref().unwrap_or(DEFAULT_TYPE),
                "last_modified": http_date(o.published_at),
            })
        })
        .collect();
    let next = if more {
        page.last().map(|o| json!(o.key)).unwrap_or(json!(null))
    } else {
        json!(null)
    };
    Reply::new(200, "ok").json(&json!({
        "prefix": prefix,
        "objects": objects,
        "next": next,
    }))
}
