//! fencecheck-gateway: an HTTP gateway, on Pingora, that fences writes to
//! objects with the fencecheck component.
//!
//! `PUT /objects/{key}` with `Fence-Token` streams the body to a new blob
//! (flushed and synced), then ONE database transaction runs the component's
//! check and moves the key's pointer to it (the publish protocol of
//! `fencecheck-sqlite`, docs/design.md §8). `GET`/`HEAD` serve the object the
//! pointer makes visible (conditional, ranges); `DELETE` moves it to a
//! tombstone, fenced the same way. A stale writer gets 409 and changes
//! nothing. Callers authenticate with a bearer secret and hold read, write
//! and lock rights per key prefix ([`Auth`]).
//!
//! With `--bucket`, the same port speaks path-style S3 (SigV4 by the
//! principals' access keys; PutObject, GetObject, multipart, ListObjectsV2,
//! …): key `K` of bucket `B` is the fenced key `B/K`, written by the same
//! publish. Blobs live in a directory, on a WebDAV server, or in an S3
//! bucket ([`s3_store`]).
//!
//! # Layout
//!
//! A request's life, one module per step: the connection bound and header
//! deadline ([`Guarded`]), the route, authentication and authorization
//! ([`Auth`]), the handler of its surface (objects, locks; the S3 front
//! checks SigV4 itself, through s3s), then the store ([`Store`]: pointers,
//! fences, the gateway's facts about blobs, multipart uploads) and the
//! blobs ([`Blobs`]: a directory, a WebDAV server or an S3 bucket). Beside it: the
//! [`Collector`] deletes unpublished blobs after a retention window, the
//! [`Reloader`] swaps the component (vetted by the conformance vectors) and
//! the auth file on SIGHUP, [`Metrics`] for Prometheus.
//!
//! ```
//! use fencecheck_gateway::{Auth, Right, validate_key};
//!
//! // Keys are percent-encoded UTF-8; `..` is refused in every spelling.
//! assert_eq!(validate_key("reports/caf%C3%A9").as_deref(), Ok("reports/café"));
//! assert!(validate_key("reports/%2e%2e/secrets").is_err());
//!
//! // Without --auth (loopback only) every caller holds every right.
//! let open = Auth::open();
//! let caller = open.authenticate(None).expect("open mode");
//! assert!(caller.may(Right::Write, "reports/july"));
//! ```

mod auth;
mod blobs;
mod collector;
mod error;
mod http;
mod key;
mod locks;
mod metrics;
mod pgtls;
mod reload;
mod s3;
mod store;

pub use auth::{
    Auth, Caller, MAX_PRINCIPAL_NAME, MIN_S3_SECRET, Principal, Principals, Right, S3Secret,
    Unauthenticated,
};
pub use blobs::{BlobReader, BlobWriter, Blobs, Stored, Upstream, Written, s3_store};
pub use collector::Collector;
pub use error::Error;
pub use http::{Config, Ctx, Drain, Gateway, Guarded, Limits, Pace};
pub use key::{KeyError, encode_key, validate_key};
pub use locks::{LeaseEvent, LockPolicy, LockReply, MAX_LOCK_BODY, handle as handle_lock};
pub use metrics::Metrics;
pub use pgtls::PgConnect;
pub use reload::{Reloader, VECTORS, vetted};
pub use store::{Current, Head, Kind, Listed, Meta, Part, PendingUpload, Store, Upload};
