//! Prometheus metrics (the `prometheus-client` crate), served in text format at `/metrics`.
//!
//! Executions are counted by [`crate::GearboxServer`] whatever the transport; the HTTP layer
//! only exposes them, plus its own request counter.
//!
//! Per-tenant series (`gearbox_tenant_*`) carry a `tenant` label whose values are bounded:
//! the tenants named in `[quotas.tenants]`, then the first [`MAX_TENANT_LABELS`] other
//! tenants seen by this process; any further tenant is counted under `_other`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use gearbox_engine::config::QUOTA_OTHER_TENANTS;

use crate::limiter::Limiter;

/// Tenants, beyond those `[quotas.tenants]` names, that get a label of their own.
pub const MAX_TENANT_LABELS: usize = 32;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantQuotaLabels {
    tenant: String,
    quota: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    language: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// Egress through the proxy, by the gear that granted it (four values at most) and what
/// happened (`allowed`, `refused`, `bytes_up`, `bytes_down`): bounded cardinality, no hosts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EgressLabels {
    gear: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    route: String,
    code: String,
}

/// Every metric gearbox exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    errors: Family<ReasonLabels, Counter>,
    duration: Histogram,
    setup: Histogram,
    queue_depth: Gauge,
    in_flight: Gauge,
    max_running: Gauge,
    http: Family<HttpLabels, Counter>,
    egress: Family<EgressLabels, Counter>,
    tenant_runs: Family<TenantLabels, Counter>,
    tenant_cpu: Family<TenantLabels, Counter<f64, AtomicU64>>,
    tenant_refusals: Family<TenantQuotaLabels, Counter>,
    /// Tenants named in `[quotas.tenants]`.
    named: HashSet<String>,
    /// Other tenants given a label, at most [`MAX_TENANT_LABELS`].
    seen: Mutex<HashSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Self::with_tenants(std::iter::empty::<&str>())
    }

    /// Metrics whose tenant labels always include `named` (the `[quotas.tenants]`).
    pub fn with_tenants<'a>(named: impl IntoIterator<Item = &'a str>) -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let errors = Family::<ReasonLabels, Counter>::default();
        // 5 ms .. ~80 s
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 15));
        // 100 us .. ~1.6 s
        let setup = Histogram::new(exponential_buckets(0.0001, 2.0, 15));
        let queue_depth = Gauge::default();
        let in_flight = Gauge::default();
        let max_running = Gauge::default();
        let http = Family::<HttpLabels, Counter>::default();
        let egress = Family::<EgressLabels, Counter>::default();
        registry.register(
            "gearbox_egress",
            "Egress of granted runs through the proxy, by gear: connections and requests \
             allowed and refused, bytes up and down",
            egress.clone(),
        );
        registry.register(
            "mcp_execution_requests",
            "Tool calls that asked for a run, by language and outcome status",
            requests.clone(),
        );
        registry.register(
            "mcp_execution_duration_seconds",
            "Wall-clock time of a call that ran, from slot to outcome, in seconds",
            duration.clone(),
        );
        registry.register(
            "mcp_execution_errors",
            "Calls that did not end ok, by reason (busy, quota, audit, cancelled, denied, timeout, \
             killed, sandbox, program)",
            errors.clone(),
        );
        registry.register(
            "mcp_sandbox_setup_seconds",
            "Time to build a sandbox before the program started, in seconds",
            setup.clone(),
        );
        registry.register(
            "mcp_execution_queue_depth",
            "Calls waiting for a free run slot",
            queue_depth.clone(),
        );
        registry.register(
            "mcp_execution_in_flight",
            "Runs executing now",
            in_flight.clone(),
        );
        registry.register(
            "mcp_execution_slots",
            "Runs that may execute at once",
            max_running.clone(),
        );
        let tenant_runs = Family::<TenantLabels, Counter>::default();
        let tenant_cpu = Family::<TenantLabels, Counter<f64, AtomicU64>>::default();
        let tenant_refusals = Family::<TenantQuotaLabels, Counter>::default();
        registry.register(
            "gearbox_tenant_runs",
            "Runs that got a slot, by tenant",
            tenant_runs.clone(),
        );
        registry.register(
            "gearbox_tenant_cpu_seconds",
            "CPU seconds of finished runs (the supervisor's measure), by tenant",
            tenant_cpu.clone(),
        );
        registry.register(
            "gearbox_tenant_refusals",
            "Calls refused by a tenant quota, by tenant and quota",
            tenant_refusals.clone(),
        );
        registry.register(
            "gearbox_http_requests",
            "HTTP requests answered, by route and status code",
            http.clone(),
        );
        Metrics {
            registry,
            requests,
            errors,
            duration,
            setup,
            queue_depth,
            in_flight,
            max_running,
            http,
            egress,
            tenant_runs,
            tenant_cpu,
            tenant_refusals,
            named: named.into_iter().map(str::to_string).collect(),
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// The `tenant` label of `tenant` (bounded: see the module's documentation).
    pub fn tenant_label(&self, tenant: &str) -> String {
        if self.named.contains(tenant) {
            return tenant.to_string();
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(tenant) {
            return tenant.to_string();
        }
        if seen.len() < MAX_TENANT_LABELS && tenant != QUOTA_OTHER_TENANTS {
            seen.insert(tenant.to_string());
            return tenant.to_string();
        }
        QUOTA_OTHER_TENANTS.to_string()
    }

    /// A run of `tenant` got its slot.
    pub fn tenant_run(&self, tenant: &str) {
        self.tenant_runs
            .get_or_create(&TenantLabels {
                tenant: self.tenant_label(tenant),
            })
            .inc();
    }

    /// A run of `tenant` ended having used `seconds` of CPU.
    pub fn tenant_cpu(&self, tenant: &str, seconds: f64) {
        self.tenant_cpu
            .get_or_create(&TenantLabels {
                tenant: self.tenant_label(tenant),
            })
            .inc_by(seconds);
    }

    /// A call of `tenant` was refused by its `quota`.
    pub fn tenant_refusal(&self, tenant: &str, quota: &str) {
        self.tenant_refusals
            .get_or_create(&TenantQuotaLabels {
                tenant: self.tenant_label(tenant),
                quota: quota.to_string(),
            })
            .inc();
    }

    /// `gearbox_tenant_running` and `gearbox_tenant_queued` from the limiter now (tenants
    /// with nothing running or waiting are left out).
    fn encode_tenants(&self, limiter: &Limiter) -> String {
        let mut by: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for t in limiter.tenants() {
            let e = by.entry(self.tenant_label(&t.tenant)).or_default();
            e.0 += t.running;
            e.1 += t.queued;
        }
        let mut out = String::new();
        for (name, help, pick) in [
            (
                "gearbox_tenant_running",
                "Runs executing now, by tenant.",
                0,
            ),
            (
                "gearbox_tenant_queued",
                "Calls waiting for a run slot now, by tenant.",
                1,
            ),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
            for (tenant, (running, queued)) in &by {
                let v = if pick == 0 { running } else { queued };
                out.push_str(&format!("{name}{{tenant=\"{tenant}\"}} {v}\n"));
            }
        }
        out
    }

    /// What a granted run's proxy let through and refused.
    pub fn egress(&self, gear: &str, ledger: &gearbox_core::EgressLedger) {
        let add = |kind: &str, n: u64| {
            if n > 0 {
                self.egress
                    .get_or_create(&EgressLabels {
                        gear: gear.to_string(),
                        kind: kind.to_string(),
                    })
                    .inc_by(n);
            }
        };
        add("allowed", ledger.hosts.iter().map(|h| h.requests).sum());
        add("refused", ledger.refused_total);
        add("bytes_up", ledger.hosts.iter().map(|h| h.bytes_up).sum());
        add(
            "bytes_down",
            ledger.hosts.iter().map(|h| h.bytes_down).sum(),
        );
    }

    /// A call that asked for a run ended with `status` (`ok`, `error`, `busy`, ...).
    pub fn request(&self, language: &str, status: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                language: language.to_string(),
                status: status.to_string(),
            })
            .inc();
    }

    pub fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn duration(&self, seconds: f64) {
        self.duration.observe(seconds);
    }

    pub fn setup(&self, seconds: f64) {
        self.setup.observe(seconds);
    }

    pub fn http(&self, route: &str, code: u16) {
        self.http
            .get_or_create(&HttpLabels {
                route: route.to_string(),
                code: code.to_string(),
            })
            .inc();
    }

    /// The text exposition, with the gauges read from `limiter` and the warm pool now.
    pub fn encode(&self, limiter: &Limiter, pool: &[gearbox_engine::PoolStats]) -> String {
        self.queue_depth.set(limiter.queued() as i64);
        self.in_flight.set(limiter.running() as i64);
        self.max_running.set(limiter.max_running() as i64);
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        out.push_str(&encode_pool(pool));
        out.push_str(&self.encode_tenants(limiter));
        out
    }
}

/// Name, type, help and value of one warm-pool series.
type PoolSeries = (
    &'static str,
    &'static str,
    &'static str,
    fn(&gearbox_engine::PoolStats) -> f64,
);

/// Warm-pool series, read from the pool's own counters at scrape time.
fn encode_pool(pool: &[gearbox_engine::PoolStats]) -> String {
    if pool.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let series: [PoolSeries; 11] = [
        (
            "gearbox_pool_ready",
            "gauge",
            "Warm sandboxes ready to take.",
            |s| s.ready as f64,
        ),
        (
            "gearbox_pool_target",
            "gauge",
            "Warm sandboxes the pool aims to keep.",
            |s| s.target as f64,
        ),
        (
            "gearbox_pool_building",
            "gauge",
            "Warm sandboxes being built.",
            |s| s.filling as f64,
        ),
        (
            "gearbox_pool_min",
            "gauge",
            "Warm sandboxes kept at rest ([pool] min).",
            |s| s.min as f64,
        ),
        (
            "gearbox_pool_max",
            "gauge",
            "Warm sandboxes the pool may grow to under demand ([pool] max).",
            |s| s.max as f64,
        ),
        (
            "gearbox_pool_resting",
            "gauge",
            "1 while the language is at rest: idle with a minimum of 0, nothing kept.",
            |s| f64::from(u8::from(s.resting)),
        ),
        (
            "gearbox_pool_fork_servers",
            "gauge",
            "Fork servers alive.",
            |s| s.fork_servers as f64,
        ),
        (
            "gearbox_pool_hits_total",
            "counter",
            "Runs served by a warm sandbox.",
            |s| s.hits as f64,
        ),
        (
            "gearbox_pool_misses_total",
            "counter",
            "Runs that found no warm sandbox and started cold.",
            |s| s.misses as f64,
        ),
        (
            "gearbox_pool_refill_seconds",
            "gauge",
            "Time to build the last replacement sandbox.",
            |s| s.last_refill_ms / 1000.0,
        ),
        (
            "gearbox_pool_build_failures_in_row",
            "gauge",
            "Warm builds that failed in a row (0 once one succeeds; the pool retries).",
            |s| f64::from(s.failed_in_row),
        ),
    ];
    for (name, kind, help, value) in series {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for s in pool {
            out.push_str(&format!(
                "{name}{{language=\"{}\",network=\"{}\"}} {}\n",
                s.language,
                s.network,
                value(s)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_is_counted_by_gear_without_hosts() {
        let m = Metrics::new();
        let ledger = gearbox_core::EgressLedger {
            granted: vec!["data.example.org".into()],
            hosts: vec![gearbox_core::EgressHost {
                host: "data.example.org:443".into(),
                requests: 2,
                bytes_up: 100,
                bytes_down: 5000,
            }],
            refused: vec![],
            refused_total: 3,
        };
        m.egress("full_trust", &ledger);
        m.egress("full_trust", &ledger);
        let text = m.encode(&Limiter::new(1, 1), &[]);
        for line in [
            "gearbox_egress_total{gear=\"full_trust\",kind=\"allowed\"} 4",
            "gearbox_egress_total{gear=\"full_trust\",kind=\"refused\"} 6",
            "gearbox_egress_total{gear=\"full_trust\",kind=\"bytes_down\"} 10000",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
        assert!(!text.contains("data.example.org"), "{text}");
    }

    #[test]
    fn tenant_labels_are_bounded() {
        let m = Metrics::with_tenants(["ci"]);
        for i in 0..MAX_TENANT_LABELS + 5 {
            m.tenant_run(&format!("t{i}"));
        }
        m.tenant_run("ci");
        m.tenant_refusal("ci", "runs_per_minute");
        m.tenant_cpu("t0", 1.5);
        let text = m.encode(&Limiter::new(1, 1), &[]);
        for needle in [
            "gearbox_tenant_runs_total{tenant=\"ci\"} 1",
            "gearbox_tenant_runs_total{tenant=\"t0\"} 1",
            "gearbox_tenant_runs_total{tenant=\"_other\"} 5",
            "gearbox_tenant_refusals_total{tenant=\"ci\",quota=\"runs_per_minute\"} 1",
            "gearbox_tenant_cpu_seconds_total{tenant=\"t0\"} 1.5",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
        let labels = text
            .lines()
            .filter(|l| l.starts_with("gearbox_tenant_runs_total{"))
            .count();
        assert_eq!(labels, MAX_TENANT_LABELS + 2, "{text}");
    }

    #[tokio::test]
    async fn tenant_gauges_follow_the_limiter() {
        let m = Metrics::new();
        let l = Limiter::new(2, 4);
        let none = crate::limiter::TenantLimits::default();
        let _a = l.acquire("alice", none).await.expect("slot");
        let text = m.encode(&l, &[]);
        assert!(
            text.contains("gearbox_tenant_running{tenant=\"alice\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("gearbox_tenant_queued{tenant=\"alice\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn names_follow_the_spec() {
        let m = Metrics::new();
        m.request("python", "ok");
        m.error("busy");
        m.duration(0.05);
        m.setup(0.002);
        let pool = [gearbox_engine::PoolStats {
            language: "python".into(),
            ready: 2,
            target: 3,
            filling: 1,
            min: 1,
            max: 4,
            fork_servers: 1,
            resting: false,
            hits: 5,
            misses: 1,
            last_refill_ms: 12.5,
            fork_server: true,
            network: false,
            failed_in_row: 0,
            last_error: None,
        }];
        let text = m.encode(&Limiter::new(2, 3), &pool);
        for needle in [
            "gearbox_pool_ready{language=\"python\",network=\"false\"} 2",
            "gearbox_pool_building{language=\"python\",network=\"false\"} 1",
            "gearbox_pool_min{language=\"python\",network=\"false\"} 1",
            "gearbox_pool_max{language=\"python\",network=\"false\"} 4",
            "gearbox_pool_fork_servers{language=\"python\",network=\"false\"} 1",
            "gearbox_pool_resting{language=\"python\",network=\"false\"} 0",
            "gearbox_pool_hits_total{language=\"python\",network=\"false\"} 5",
            "gearbox_pool_misses_total{language=\"python\",network=\"false\"} 1",
            "gearbox_pool_refill_seconds{language=\"python\",network=\"false\"} 0.0125",
            "gearbox_pool_build_failures_in_row{language=\"python\",network=\"false\"} 0",
        ] {
            assert!(text.contains(needle), "{needle} missing from {text}");
        }
        for needle in [
            "mcp_execution_requests_total{language=\"python\",status=\"ok\"} 1",
            "mcp_execution_errors_total{reason=\"busy\"} 1",
            "mcp_execution_duration_seconds_count 1",
            "mcp_sandbox_setup_seconds_count 1",
            "mcp_execution_queue_depth 0",
            "mcp_execution_in_flight 0",
            "mcp_execution_slots 2",
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
