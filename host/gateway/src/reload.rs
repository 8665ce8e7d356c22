//! Reload on SIGHUP: the component (the `--component` file, or the embedded
//! one) is loaded again and swapped into the store only if it passes every
//! conformance vector; requests in flight finish on the instance they hold,
//! new ones get instances of the new component. The `--auth` file is read
//! again and swapped whole only if it parses. Either refusal keeps the old.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use fencecheck::{Limits, Runtime, vectors};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{SignalKind, signal};

use crate::auth::Auth;
use crate::metrics::Metrics;
use crate::store::Store;

include!(concat!(env!("OUT_DIR"), "/vectors.rs"));

/// Load a component (`None`: the embedded one) and return it only if it
/// passes every conformance vector shipped with the gateway. A component of
/// a WIT package version this build does not support (`fencecheck:fence@0.1.x`)
/// is refused by the load itself (`fencecheck::Error::UnsupportedComponent`),
/// before anything runs.
pub fn vetted(path: Option<&Path>) -> Result<Runtime, String> {
    let runtime = match path {
        Some(path) => Runtime::from_file(path, Limits::default()),
        None => Runtime::new(),
    }
    .map_err(|e| format!("loading: {e}"))?;
    let mut guest = runtime
        .instance()
        .map_err(|e| format!("instantiating: {e}"))?;
    for (name, text) in VECTORS {
        let file = vectors::parse(text).map_err(|e| format!("{name}: {e}"))?;
        let report = vectors::run(&file, &mut guest);
        if let Some(failure) = report.failures.first() {
            return Err(format!("conformance vector {name}: {failure}"));
        }
    }
    Ok(runtime)
}

/// Waits for SIGHUP and reloads.
pub struct Reloader {
    store: Arc<Store>,
    path: Option<PathBuf>,
    auth: Arc<Auth>,
    metrics: Arc<Metrics>,
}

impl Reloader {
    /// Reload `store`'s component from `path` (`None`: embedded), and
    /// `auth`'s file, on SIGHUP.
    pub fn new(
        store: Arc<Store>,
        path: Option<PathBuf>,
        auth: Arc<Auth>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            store,
            path,
            auth,
            metrics,
        }
    }

    /// One reload attempt; the old component stays unless the new one passes.
    pub async fn reload(&self) -> Result<(), String> {
        let path = self.path.clone();
        let runtime = tokio::task::spawn_blocking(move || vetted(path.as_deref()))
            .await
            .map_err(|e| e.to_string())??;
        let version = runtime.component_version().to_string();
        self.store.swap(runtime);
        self.metrics.component(&version);
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for Reloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP; reload disabled");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                got = hangups.recv() => {
                    if got.is_none() {
                        return;
                    }
                    let auth = self.auth.clone();
                    match tokio::task::spawn_blocking(move || auth.reload()).await {
                        Ok(Ok(false)) => {}
                        Ok(Ok(true)) => {
                            tracing::info!(principals = self.auth.principals(), "auth file reloaded");
                            self.metrics.auth_reloaded("ok");
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(error = %e, "auth reload refused; keeping the current principals");
                            self.metrics.auth_reloaded("refused");
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "auth reload failed; keeping the current principals");
                            self.metrics.auth_reloaded("refused");
                        }
                    }
                    match self.reload().await {
                        Ok(()) => {
                            tracing::info!("component reloaded");
                            self.metrics.reloaded("ok");
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "reload refused; keeping the current component");
                            self.metrics.reloaded("refused");
                        }
                    }
                }
            }
        }
    }
}
