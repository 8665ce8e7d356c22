//! fencecheck-gateway: an HTTP gateway, on Pingora, that fences writes to
//! objects with the fencecheck component.
//!
//! `PUT /objects/{key}` with `Fence-Token` streams the body to a blob named
//! by a never-reused id, then ONE SQLite transaction runs the component's
//! check and moves the key's pointer to it (the publish protocol of
//! `fencecheck-sqlite`, docs/design.md §8). `GET`/`HEAD` serve the object the
//! pointer makes visible; `DELETE` moves it to a tombstone, fenced the same
//! way. A stale writer gets 409 and changes nothing.
//!
//! Blobs live in a directory or on an HTTP file server with WebDAV PUT and
//! DELETE ([`Blobs`]); the [`Collector`] deletes unpublished ones after a
//! retention window. `POST /v1/locks/{lock}/acquire|renew|release` hands
//! out leases and their tokens from a coordinator (`fencecheck-authority`).
//! SIGHUP reloads the component once the new one passes the conformance
//! vectors ([`Reloader`]).

mod blobs;
mod collector;
mod error;
mod key;
mod locks;
mod metrics;
mod proxy;
mod reload;
mod store;

pub use blobs::{BlobReader, BlobWriter, Blobs, Upstream};
pub use collector::Collector;
pub use error::Error;
pub use key::{KeyError, validate_key};
pub use locks::{LockReply, MAX_LOCK_BODY, handle as handle_lock};
pub use metrics::Metrics;
pub use proxy::{Config, Ctx, Gateway};
pub use reload::{Reloader, VECTORS, vetted};
pub use store::{Current, Kind, Store};
