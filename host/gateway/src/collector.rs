//! The asynchronous collector, as a Pingora background service, in bounded
//! batches: rows of unpublished objects older than the retention window
//! (lost races, crashed uploads) and then their blobs; and blobs of this
//! store that no row names (a crash between deleting a row and its blob,
//! or an upload that outlived the retention window), found by listing the
//! directory or the upstream's JSON index. A row is always staged before
//! its blob is created, so a blob being written has a row.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::blobs::Blobs;
use crate::error::Error;
use crate::http::blocking;
use crate::store::Store;

/// Rows (and blobs) handled per database call.
const BATCH: usize = 256;

/// Collects unreferenced objects every `interval`.
pub struct Collector {
    store: Arc<Store>,
    blobs: Arc<Blobs>,
    retention: Duration,
    upload_retention: Duration,
    interval: Duration,
}

impl Collector {
    /// A collector keeping unpublished blobs (and S3 uploads, unless
    /// [`Collector::with_upload_retention`] says otherwise) for `retention`.
    pub fn new(
        store: Arc<Store>,
        blobs: Arc<Blobs>,
        retention: Duration,
        interval: Duration,
    ) -> Self {
        Self {
            store,
            blobs,
            retention,
            upload_retention: retention,
            interval,
        }
    }

    /// Keep the S3 front's multipart uploads and their parts for
    /// `retention` from their staging instead (`--upload-retention`).
    #[must_use]
    pub fn with_upload_retention(mut self, retention: Duration) -> Self {
        self.upload_retention = retention;
        self
    }

    /// One pass; returns the number of blobs deleted.
    pub async fn pass(&self) -> Result<usize, Error> {
        let mut removed = 0;
        loop {
            let (store, retention, uploads) =
                (self.store.clone(), self.retention, self.upload_retention);
            let gone = blocking(move || store.collect(retention, uploads, BATCH)).await?;
            let full = gone.len() == BATCH;
            for object in gone {
                self.blobs.remove(object).await?;
                removed += 1;
            }
            if !full {
                break;
            }
        }
        // Blobs without a row, old enough that no upload can still be
        // writing one (its row would exist then).
        let Some(stored) = self.blobs.list().await? else {
            return Ok(removed);
        };
        let now = SystemTime::now();
        let old: Vec<_> = stored
            .into_iter()
            .filter(|s| {
                now.duration_since(s.modified)
                    .is_ok_and(|age| age >= self.retention)
            })
            .map(|s| s.object)
            .collect();
        for batch in old.chunks(BATCH) {
            let ids: Vec<i64> = batch.iter().map(|o| o.get()).collect();
            let store = self.store.clone();
            let existing = blocking(move || store.existing(&ids)).await?;
            for object in batch {
                if !existing.contains(&object.get()) {
                    self.blobs.remove(*object).await?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

#[async_trait]
impl BackgroundService for Collector {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            match self.pass().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(blobs = n, "collected"),
                Err(e) => tracing::warn!(error = %e, "collection failed; retrying next pass"),
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}
