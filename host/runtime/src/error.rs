use std::path::PathBuf;

/// An infrastructure failure: the decision could not be obtained at all.
///
/// None of these is a domain outcome. In particular a stale token is never an
/// `Error`: it is `Ok(Ok(Decision::StaleFence { .. }))`, definitive and not
/// retryable, while these may be retried (with a fresh [`crate::Instance`]
/// where noted).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The component file could not be read.
    #[error("reading the component at {path}: {source}")]
    Read {
        /// The file that was asked for.
        path: PathBuf,
        /// The I/O failure.
        source: std::io::Error,
    },
    /// The component is not one this host runs: its exports carry a WIT
    /// package version that is not semver-compatible with the one this crate
    /// was built against ([`crate::WIT_VERSION`]), or it does not export
    /// `fencecheck:fence/check` at all. Refused at load; nothing was
    /// instantiated.
    #[error("component exports {found}; this host supports {supported}")]
    UnsupportedComponent {
        /// What the component exports, e.g. `fencecheck:fence/check@0.2.0`.
        found: String,
        /// What this host runs, e.g. `fencecheck:fence@0.1.x`.
        supported: String,
    },
    /// The loaded component is of a supported version but older than a
    /// feature this call needs (signed tokens need 0.1.1). Nothing was sent
    /// to the guest; load a newer component.
    #[error(
        "the loaded component (fencecheck:fence@{version}) has no {feature}: that needs {since} or later"
    )]
    Unsupported {
        /// What the call needs, e.g. `signed tokens`.
        feature: &'static str,
        /// The loaded component's version.
        version: String,
        /// The first version with it.
        since: &'static str,
    },
    /// wasmtime refused the configuration or the component bytes.
    #[error("loading the fencecheck component: {0}")]
    Load(String),
    /// The component could not be instantiated (e.g. the instance pool is full).
    #[error("instantiating the fencecheck component: {0}")]
    Instantiate(String),
    /// The guest trapped (out of fuel, out of memory, or a bug). The call had
    /// no effect; the instance has been replaced by a fresh one.
    #[error("the fencecheck guest trapped in `{call}`: {message}")]
    Trapped {
        /// The export being called.
        call: &'static str,
        /// wasmtime's description of the trap.
        message: String,
    },
    /// The guest answered with bytes that do not follow the packed format
    /// (or refused the host's encoding). A bug on one side; nothing was
    /// decided from it.
    #[error("`{call}` broke the packed format: {message}")]
    Protocol {
        /// The export being called.
        call: &'static str,
        /// What did not follow the format.
        message: String,
    },
    /// The call's inputs exceed the transport bound of [`crate::Limits`]; it was
    /// not sent to the guest.
    #[error("call to `{call}` carries {bytes} bytes, above the {limit}-byte bound")]
    TooLarge {
        /// The export that was not called.
        call: &'static str,
        /// The size of its inputs.
        bytes: usize,
        /// The configured bound.
        limit: usize,
    },
}
