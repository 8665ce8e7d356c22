//! Prometheus metrics with bounded labels: operation, outcome, a capped
//! epoch, status class. Never the key (one series per object would grow
//! without bound).

use std::time::Duration;

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::locks::LeaseEvent;

/// The lease rows of the cross-host table (docs/design.md §12), as the
/// coordinator behind the lock endpoints sees them.
struct Leases {
    acquire: HistogramVec,
    renewals: IntCounterVec,
    holder_lost: IntCounter,
    epoch: Gauge,
    headroom: Gauge,
    coordinator_errors: IntCounterVec,
}

impl Leases {
    fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let leases = Self {
            acquire: HistogramVec::new(
                HistogramOpts::new(
                    "fencecheck_lease_acquire_duration_seconds",
                    "Lease acquisitions at the lock endpoints by result (acquired, busy, error), coordinator call to answer",
                )
                .buckets(prometheus::exponential_buckets(0.0001, 2.0, 18)?),
                &["result"],
            )?,
            renewals: IntCounterVec::new(
                Opts::new(
                    "fencecheck_lease_renewals_total",
                    "Renewals at the lock endpoints by result (renewed, lost, error)",
                ),
                &["result"],
            )?,
            holder_lost: IntCounter::new(
                "fencecheck_lease_holder_lost_total",
                "Renewals answered lost: a holder learned it no longer holds its lease",
            )?,
            epoch: Gauge::new(
                "fencecheck_lease_epoch",
                "The lease service's epoch in the last grant",
            )?,
            headroom: Gauge::new(
                "fencecheck_token_headroom",
                "Grants left in the current epoch before the counter is exhausted, as of the last grant",
            )?,
            coordinator_errors: IntCounterVec::new(
                Opts::new(
                    "fencecheck_coordinator_errors_total",
                    "Coordinator calls of the lock endpoints that got no answer, by kind (quorum-lost, unreachable, timeout, other)",
                ),
                &["kind"],
            )?,
        };
        registry.register(Box::new(leases.acquire.clone()))?;
        registry.register(Box::new(leases.renewals.clone()))?;
        registry.register(Box::new(leases.holder_lost.clone()))?;
        registry.register(Box::new(leases.epoch.clone()))?;
        registry.register(Box::new(leases.headroom.clone()))?;
        registry.register(Box::new(leases.coordinator_errors.clone()))?;
        Ok(leases)
    }
}

/// The gateway's registry and series.
pub struct Metrics {
    registry: Registry,
    decisions: IntCounterVec,
    latency: HistogramVec,
    reloads: IntCounterVec,
    auth_reloads: IntCounterVec,
    component: IntGaugeVec,
    connections: IntGauge,
    refused: IntCounter,
    /// The cross-host table's `fencecheck_decisions_total` (fenced writes only).
    fenced: IntCounterVec,
    in_flight: IntGauge,
    leases: Leases,
}

impl Metrics {
    /// A fresh registry with the gateway's series.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let decisions = IntCounterVec::new(
            Opts::new(
                "fencecheck_gateway_requests_total",
                "Requests by operation, outcome (applied, duplicate, stale-fence, version-conflict, bad-request, unavailable, …) and token epoch",
            ),
            &["op", "outcome", "epoch"],
        )?;
        let fenced = IntCounterVec::new(
            Opts::new(
                "fencecheck_decisions_total",
                "Fence decisions by operation, outcome (applied, duplicate, stale-fence, version-conflict, refused, unauthenticated) and token epoch: the name every fencecheck host exports (docs/design.md §12)",
            ),
            &["operation", "outcome", "epoch"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "fencecheck_gateway_request_duration_seconds",
                "Request latency by operation and status class",
            )
            .buckets(prometheus::exponential_buckets(0.0001, 2.0, 18)?),
            &["op", "status"],
        )?;
        let reloads = IntCounterVec::new(
            Opts::new(
                "fencecheck_gateway_reloads_total",
                "Component reloads by result (ok, refused)",
            ),
            &["result"],
        )?;
        let component = IntGaugeVec::new(
            Opts::new(
                "fencecheck_gateway_component_info",
                "1 for the WIT package version of the component serving requests",
            ),
            &["version"],
        )?;
        let auth_reloads = IntCounterVec::new(
            Opts::new(
                "fencecheck_gateway_auth_reloads_total",
                "Reloads of the --auth file by result (ok, refused)",
            ),
            &["result"],
        )?;
        let connections = IntGauge::new(
            "fencecheck_gateway_connections",
            "Client connections open now",
        )?;
        let refused = IntCounter::new(
            "fencecheck_gateway_connections_refused_total",
            "Connections answered 503 at once: over --max-connections",
        )?;
        let in_flight = IntGauge::new(
            "fencecheck_gateway_in_flight",
            "Storage operations running now (bounded by --max-in-flight)",
        )?;
        registry.register(Box::new(auth_reloads.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(component.clone()))?;
        registry.register(Box::new(reloads.clone()))?;
        registry.register(Box::new(decisions.clone()))?;
        registry.register(Box::new(fenced.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        let leases = Leases::new(&registry)?;
        Ok(Self {
            leases,
            registry,
            decisions,
            fenced,
            latency,
            reloads,
            auth_reloads,
            component,
            connections,
            refused,
            in_flight,
        })
    }

    /// Record one finished request.
    pub fn observe(
        &self,
        op: &str,
        outcome: &str,
        epoch: Option<u64>,
        status: u16,
        elapsed: Duration,
    ) {
        let epoch = fencecheck::epoch_label(epoch);
        self.decisions
            .with_label_values(&[op, outcome, epoch])
            .inc();
        if let Some(decision) = decision(op, outcome) {
            self.fenced.with_label_values(&[op, decision, epoch]).inc();
        }
        let class = match status {
            100..=599 => ["1xx", "2xx", "3xx", "4xx", "5xx"][usize::from(status / 100 - 1)],
            _ => "none",
        };
        self.latency
            .with_label_values(&[op, class])
            .observe(elapsed.as_secs_f64());
    }

    /// Record one coordinator decision of the lock endpoints.
    pub fn lease(&self, event: LeaseEvent) {
        let l = &self.leases;
        let error = match event {
            LeaseEvent::Acquire {
                result,
                took,
                token,
                error,
            } => {
                l.acquire
                    .with_label_values(&[result])
                    .observe(took.as_secs_f64());
                if let Some(token) = token {
                    // As floats, as Prometheus keeps every value (exact to 2^53).
                    l.epoch.set(token.epoch as f64);
                    l.headroom
                        .set(u64::MAX.saturating_sub(token.counter) as f64);
                }
                error
            }
            LeaseEvent::Renew { result, error } => {
                l.renewals.with_label_values(&[result]).inc();
                if result == "lost" {
                    l.holder_lost.inc();
                }
                error
            }
            LeaseEvent::Release { error } => error,
        };
        if let Some(kind) = error {
            l.coordinator_errors.with_label_values(&[kind]).inc();
        }
    }

    /// Count one reload attempt.
    pub fn reloaded(&self, result: &str) {
        self.reloads.with_label_values(&[result]).inc();
    }

    /// Count one reload of the auth file.
    pub fn auth_reloaded(&self, result: &str) {
        self.auth_reloads.with_label_values(&[result]).inc();
    }

    /// A connection opened (`1`) or closed (`-1`).
    pub fn connections(&self, delta: i64) {
        self.connections.add(delta);
    }

    /// A connection was refused (over the bound).
    pub fn connection_refused(&self) {
        self.refused.inc();
    }

    /// Storage operations running now.
    pub fn in_flight(&self, n: i64) {
        self.in_flight.set(n);
    }

    /// The component now serving is at WIT package `version` (one series:
    /// the previous component's is removed).
    pub fn component(&self, version: &str) {
        self.component.reset();
        self.component.with_label_values(&[version]).set(1);
    }

    /// The text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed families.
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        out
    }
}

/// The outcome of a fenced write (`put`, `delete`) in the cross-host metric
/// table's terms (docs/design.md §12), or `None` for a request that reached
/// no fence decision (not found, bad request, unavailable, a read, …).
fn decision(op: &str, outcome: &str) -> Option<&'static str> {
    if !matches!(op, "put" | "delete") {
        return None;
    }
    Some(match outcome {
        "applied" => "applied",
        "duplicate" => "duplicate",
        "stale-fence" => "stale-fence",
        "version-conflict" => "version-conflict",
        "unauthenticated" => "unauthenticated",
        // The request or the stored state could not be decided on: no
        // token, an invalid one, a foreign authority, a corrupt state,
        // unusable keys.
        "missing-token" | "invalid-request" | "foreign-authority" | "refused" | "invalid-keys" => {
            "refused"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::decision;

    /// Fenced writes map onto the table's outcomes; reads and requests that
    /// reached no decision are not decisions.
    #[test]
    fn decisions_map_onto_the_table() {
        assert_eq!(decision("put", "stale-fence"), Some("stale-fence"));
        assert_eq!(decision("delete", "applied"), Some("applied"));
        assert_eq!(decision("put", "missing-token"), Some("refused"));
        assert_eq!(decision("put", "not-found"), None);
        assert_eq!(decision("put", "unavailable"), None);
        assert_eq!(decision("get", "ok"), None);
        assert_eq!(decision("lock", "busy"), None);
    }
}
