//! The fenced write both surfaces share (the `/objects` API and the S3
//! front, which spells it S3's way): what a write asks for
//! ([`Write`]), the early decision that stops a stale writer before its
//! upload ([`decide_early`]), the fenced publish of a staged object, which
//! decides again in the same transaction ([`publish_fenced`]), and
//! dropping an object that is not published ([`cleanup`]).

use fencecheck::{Policy, Request, SignedOutcome, SignedTokenText};
use fencecheck_sqlite::{Fenced, ObjectId, Rejection};

use super::conditional::WriteConditions;
use super::reply::token_text;
use super::{Core, Failure};
use crate::store::{Head, Meta};

/// What a write asks for, from its headers.
pub(crate) struct Write {
    pub(crate) request: Request,
    pub(crate) conditions: WriteConditions,
    pub(crate) fence: String,
}

impl Write {
    /// The write a front asks for, on `scope` with the token it was
    /// presented. Guarded writes (an op-id, or a precondition, which becomes
    /// the expected version) may repeat a grant's token; an unguarded one
    /// may not (design §3 rules 6 and 7).
    pub(crate) fn new(
        scope: &str,
        presented: SignedTokenText,
        op_id: Option<String>,
        guarded: bool,
        conditions: WriteConditions,
    ) -> Write {
        let policy = if op_id.is_some() || guarded {
            Policy::AllowEqual
        } else {
            Policy::Strict
        };
        let mut request = Request::new(scope, presented.token, policy);
        request.signature = presented.signature;
        if let Some(op_id) = op_id {
            request = request.with_op_id(op_id);
        }
        Write {
            fence: token_text(request.token),
            request,
            conditions,
        }
    }
}

/// Decide early, without storing anything: the verdict, the key's head,
/// and the write (with the head's version as the expected one if
/// `guarded`: a precondition holds or not against the version read here,
/// and the publish then applies only if it is still the same).
pub(crate) async fn decide_early(
    gw: &Core,
    write: Write,
    guarded: bool,
) -> Result<(SignedOutcome, Head, Write), Failure> {
    // SQLite: on this thread, without a hop (its reads never wait).
    if let Some((outcome, head, request)) = gw.store.early_here(&write.request, guarded) {
        return Ok((outcome, head, Write { request, ..write }));
    }
    let request = write.request.clone();
    let (outcome, head, request) = gw.work(true, move |s| s.early(request, guarded)).await?;
    Ok((outcome, head, Write { request, ..write }))
}

/// What a fenced publish came to. Anything but `Applied` and
/// `CommitUnknown` has already dropped the staged object.
pub(crate) enum Published {
    /// Visible now.
    Applied {
        version: u64,
        highest: fencecheck::Token,
    },
    /// A repeat of an applied write; `reused`: the Idempotency-Key was
    /// applied with another body.
    Duplicate { version: u64, reused: bool },
    /// Stale, a version conflict, refused: nothing changed.
    Rejected(Rejection),
    /// The connection failed during the commit: it may have applied (the
    /// object is kept; the collector takes it if it did not).
    CommitUnknown(crate::error::Error),
    /// Not decided.
    Failed(Failure),
}

/// The fenced publish of a staged object.
pub(crate) async fn publish_fenced(
    gw: &Core,
    write: &Write,
    object: ObjectId,
    meta: Meta,
) -> Published {
    let request = write.request.clone();
    let sha256 = meta.sha256;
    let published = gw
        .work(false, move |s| s.publish(&request, object, &meta))
        .await;
    match published {
        Ok(Fenced::Applied {
            version, highest, ..
        }) => Published::Applied { version, highest },
        Ok(Fenced::Rejected(Rejection::Duplicate { version })) => {
            cleanup(gw, object).await;
            match body_reused(gw, write, version, sha256).await {
                Ok(reused) => Published::Duplicate { version, reused },
                Err(f) => Published::Failed(f),
            }
        }
        Ok(Fenced::Rejected(r)) => {
            cleanup(gw, object).await;
            Published::Rejected(r)
        }
        Err(Failure::Store(e)) if e.is_commit_unknown() => Published::CommitUnknown(e),
        Err(f) => {
            cleanup(gw, object).await;
            Published::Failed(f)
        }
    }
}

/// Whether a duplicate Idempotency-Key was applied with another body (a
/// different hash). The same body, or one written before the gateway kept
/// body hashes (then it cannot tell), is a true repeat.
async fn body_reused(
    gw: &Core,
    write: &Write,
    version: u64,
    sha256: [u8; 32],
) -> Result<bool, Failure> {
    let (scope, op_id) = (write.request.scope.clone(), write.request.op_id.clone());
    let Some(op_id) = op_id else {
        return Ok(false);
    };
    let recorded = gw
        .work(false, move |s| s.op_hash(&scope, &op_id, version))
        .await?;
    Ok(recorded.is_some_and(|hash| hash[..] != sha256[..]))
}

/// Drop an unpublished object now; if that fails the collector will.
pub(crate) async fn cleanup(gw: &Core, object: ObjectId) {
    let result = match gw.work(false, move |s| s.discard(object)).await {
        Ok(true) => gw.blobs.remove(object).await,
        Ok(false) => Ok(()),
        Err(Failure::Store(e)) => Err(e),
        Err(Failure::Overloaded) => Ok(()),
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, object = object.get(), "discard failed; left to the collector");
    }
}
