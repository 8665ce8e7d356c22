//! The asynchronous collector, as a Pingora background service: rows of
//! unpublished objects older than the retention window (lost races, crashed
//! uploads), then their blobs; in a blob directory also old files that no
//! row names (their row was collected while the file was still being written).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::blobs::Blobs;
use crate::error::{Error, io};
use crate::proxy::blocking;
use crate::store::Store;

/// Collects unreferenced objects every `interval`.
pub struct Collector {
    store: Arc<Store>,
    blobs: Arc<Blobs>,
    retention: Duration,
    interval: Duration,
}

impl Collector {
    /// A collector keeping unpublished blobs for `retention`.
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
            interval,
        }
    }

    /// One pass; returns the number of blobs deleted.
    pub async fn pass(&self) -> Result<usize, Error> {
        let (store, retention) = (self.store.clone(), self.retention);
        let gone = blocking(move || store.collect(retention)).await?;
        let mut removed = 0;
        for object in gone {
            self.blobs.remove(object).await?;
            removed += 1;
        }
        if let Blobs::Dir(dir) = &*self.blobs {
            let now = SystemTime::now();
            let mut entries = tokio::fs::read_dir(dir)
                .await
                .map_err(io("listing blobs"))?;
            while let Some(entry) = entries.next_entry().await.map_err(io("listing blobs"))? {
                let Some(id) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<i64>().ok())
                else {
                    continue;
                };
                let old = entry
                    .metadata()
                    .await
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|m| now.duration_since(m).ok())
                    .is_some_and(|age| age >= self.retention);
                let store = self.store.clone();
                if old && !blocking(move || store.exists(id)).await? {
                    self.blobs
                        .remove(fencecheck_sqlite::ObjectId::from_raw(id))
                        .await?;
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
