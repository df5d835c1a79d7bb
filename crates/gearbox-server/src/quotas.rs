//! Quotas per tenant (`[quotas]`): what one tenant may use, checked in the request pipeline.
//!
//! Runs at once and calls waiting are the [`crate::limiter::Limiter`]'s (it holds the
//! queues); this module keeps the rates: runs started in the last 60 s and CPU seconds
//! charged in the last hour, each a sliding window, and checks the session quotas against
//! counts the caller reads (live sessions open, bytes of session files). A refusal is a
//! [`Refusal::Quota`] naming the quota, its limit and when it resets.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use gearbox_engine::config::{Quota, QuotasConfig};

use crate::limiter::{Refusal, TenantLimits};

/// The window of `runs_per_minute`.
const MINUTE: Duration = Duration::from_secs(60);
/// The window of `cpu_seconds_per_hour`.
const HOUR: Duration = Duration::from_secs(3600);
/// CPU charged within this span is kept as one entry: the hour holds at most 60 of them.
const CPU_BUCKET: Duration = Duration::from_secs(60);

/// What one tenant used lately (only while a rate quota applies to it).
#[derive(Default)]
struct Usage {
    /// When each run of the last minute was admitted.
    starts: VecDeque<Instant>,
    /// CPU milliseconds charged, by the start of their bucket, over the last hour.
    cpu: VecDeque<(Instant, u64)>,
}

impl Usage {
    fn prune(&mut self, now: Instant) {
        while self
            .starts
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= MINUTE)
        {
            self.starts.pop_front();
        }
        while self
            .cpu
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= HOUR)
        {
            self.cpu.pop_front();
        }
    }

    fn is_empty(&self) -> bool {
        self.starts.is_empty() && self.cpu.is_empty()
    }
}

/// Whole seconds until `at + window`, at least 1.
fn until(at: Instant, window: Duration, now: Instant) -> u64 {
    let left = (at + window).saturating_duration_since(now);
    left.as_millis().div_ceil(1000).max(1) as u64
}

/// The quotas of every tenant and their recent usage.
pub struct Quotas {
    cfg: QuotasConfig,
    usage: Mutex<HashMap<String, Usage>>,
}

impl Quotas {
    pub fn new(cfg: QuotasConfig) -> Quotas {
        Quotas {
            cfg,
            usage: Mutex::new(HashMap::new()),
        }
    }

    /// The quotas in force for `tenant`.
    pub fn of(&self, tenant: &str) -> Quota {
        self.cfg.for_tenant(tenant)
    }

    /// The tenant's share of the run budget, for the limiter.
    pub fn limits(&self, tenant: &str) -> TenantLimits {
        let q = self.of(tenant);
        TenantLimits {
            max_running: q.max_running,
            max_queued: q.max_queued,
        }
    }

    /// The tenants `[quotas.tenants]` names.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.cfg.tenants.keys().map(String::as_str)
    }

    /// Would a run of `tenant` be admitted now? Nothing is recorded.
    pub fn check(&self, tenant: &str) -> Result<(), Refusal> {
        self.rates_at(tenant, Instant::now(), false)
    }

    /// Admit a run of `tenant` now: checked against its rates, and counted when admitted.
    pub fn admit(&self, tenant: &str) -> Result<(), Refusal> {
        self.rates_at(tenant, Instant::now(), true)
    }

    /// Take back the admission of a run of `tenant` that was refused a slot after all (its
    /// queue was full): it does not count against `runs_per_minute`.
    pub fn unadmit(&self, tenant: &str) {
        let mut all = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = all.get_mut(tenant) {
            u.starts.pop_back();
            if u.is_empty() {
                all.remove(tenant);
            }
        }
    }

    /// Charge a finished run's CPU time (the supervisor's measure) to `tenant`.
    pub fn charge_cpu(&self, tenant: &str, cpu_ms: u64) {
        self.charge_at(tenant, cpu_ms, Instant::now());
    }

    fn rates_at(&self, tenant: &str, now: Instant, record: bool) -> Result<(), Refusal> {
        let q = self.of(tenant);
        if q.runs_per_minute == 0 && q.cpu_seconds_per_hour == 0 {
            return Ok(());
        }
        let mut all = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let u = all.entry(tenant.to_string()).or_default();
        u.prune(now);
        let refusal = |quota, limit, used, retry_after_s| Refusal::Quota {
            tenant: tenant.to_string(),
            quota,
            limit,
            used,
            retry_after_s,
        };
        if q.runs_per_minute > 0
            && u.starts.len() as u64 >= q.runs_per_minute
            && let Some(oldest) = u.starts.front()
        {
            return Err(refusal(
                "runs_per_minute",
                q.runs_per_minute,
                u.starts.len() as u64,
                until(*oldest, MINUTE, now),
            ));
        }
        if q.cpu_seconds_per_hour > 0 {
            let limit_ms = q.cpu_seconds_per_hour.saturating_mul(1000);
            let mut used_ms: u64 = u.cpu.iter().map(|(_, ms)| ms).sum();
            if used_ms >= limit_ms {
                let used_s = used_ms / 1000;
                // It resets when enough of the oldest charges leave the hour.
                let mut at = now;
                for (t, ms) in &u.cpu {
                    used_ms -= ms;
                    at = *t;
                    if used_ms < limit_ms {
                        break;
                    }
                }
                return Err(refusal(
                    "cpu_seconds_per_hour",
                    q.cpu_seconds_per_hour,
                    used_s,
                    until(at, HOUR, now),
                ));
            }
        }
        if record && q.runs_per_minute > 0 {
            u.starts.push_back(now);
        }
        if u.is_empty() {
            all.remove(tenant);
        }
        Ok(())
    }

    fn charge_at(&self, tenant: &str, cpu_ms: u64, now: Instant) {
        if cpu_ms == 0 || self.of(tenant).cpu_seconds_per_hour == 0 {
            return;
        }
        let mut all = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let u = all.entry(tenant.to_string()).or_default();
        u.prune(now);
        match u.cpu.back_mut() {
            Some((t, ms)) if now.saturating_duration_since(*t) < CPU_BUCKET => *ms += cpu_ms,
            _ => u.cpu.push_back((now, cpu_ms)),
        }
    }

    /// May `tenant`, with `open` live sessions, open one more?
    pub fn live_sessions(&self, tenant: &str, open: usize) -> Result<(), Refusal> {
        let limit = self.of(tenant).live_sessions;
        if limit > 0 && open as u64 >= limit {
            return Err(Refusal::Quota {
                tenant: tenant.to_string(),
                quota: "live_sessions",
                limit,
                used: open as u64,
                retry_after_s: 0,
            });
        }
        Ok(())
    }

    /// May `tenant`, whose session files take `used` bytes, keep `more` bytes more? `Ok`
    /// when no storage quota applies.
    pub fn storage(&self, tenant: &str, used: u64, more: u64) -> Result<(), Refusal> {
        let mb = self.of(tenant).session_storage_mb;
        if mb == 0 {
            return Ok(());
        }
        let limit = mb << 20;
        let total = used.saturating_add(more);
        if total > limit || (more == 0 && used >= limit) {
            return Err(Refusal::Quota {
                tenant: tenant.to_string(),
                quota: "session_storage_mb",
                limit: mb,
                used: total,
                retry_after_s: 0,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearbox_engine::config::TenantQuotas;

    fn quotas(text: &str) -> Quotas {
        let c = gearbox_engine::Config::from_toml(std::path::Path::new("q.toml"), text)
            .expect("config");
        Quotas::new(c.quotas)
    }

    #[test]
    fn runs_per_minute_is_a_sliding_window_that_resets() {
        let q = quotas("[quotas]\nruns_per_minute = 2\n");
        let t0 = Instant::now();
        q.rates_at("a", t0, true).expect("1st");
        q.rates_at("a", t0 + Duration::from_secs(10), true)
            .expect("2nd");
        let e = q
            .rates_at("a", t0 + Duration::from_secs(20), true)
            .expect_err("3rd in the minute");
        assert_eq!(e.quota(), Some("runs_per_minute"));
        // The oldest run leaves the window at t0 + 60 s: 40 s from now.
        assert_eq!(e.retry_after_s(), 40);
        let text = e.to_string();
        assert!(
            text.contains("runs_per_minute") && text.contains("2 of 2") && text.contains("40 s"),
            "{text}"
        );
        // A run admitted then refused a slot is taken back.
        q.unadmit("a");
        q.rates_at("a", t0 + Duration::from_secs(20), true)
            .expect("2nd again");
        // Another tenant has its own window; a refused run was not counted.
        q.rates_at("b", t0 + Duration::from_secs(20), true)
            .expect("b");
        q.rates_at("a", t0 + Duration::from_secs(60), true)
            .expect("reset: the first run left the window");
        assert!(
            q.rates_at("a", t0 + Duration::from_secs(61), false)
                .is_err()
        );
    }

    #[test]
    fn cpu_seconds_per_hour_counts_what_runs_used_and_resets() {
        let q = quotas(
            "[quotas]\ncpu_seconds_per_hour = 10\n[quotas.tenants.ci]\ncpu_seconds_per_hour = 0\n",
        );
        let t0 = Instant::now();
        q.charge_at("a", 4_000, t0);
        q.charge_at("a", 3_000, t0 + Duration::from_secs(30)); // same bucket
        q.rates_at("a", t0 + Duration::from_secs(500), false)
            .expect("7 s of 10");
        q.charge_at("a", 5_000, t0 + Duration::from_secs(600));
        let e = q
            .rates_at("a", t0 + Duration::from_secs(700), true)
            .expect_err("12 s of 10");
        assert_eq!(e.quota(), Some("cpu_seconds_per_hour"));
        assert!(e.to_string().contains("12 of 10"), "{e}");
        // The first bucket (7 s) leaves the hour at t0 + 3600 s.
        assert_eq!(e.retry_after_s(), 2900);
        q.rates_at("a", t0 + Duration::from_secs(3600), true)
            .expect("5 s left in the hour");
        // A tenant without the quota is never charged or refused.
        q.charge_at("ci", 1_000_000, t0);
        q.rates_at("ci", t0, true).expect("unlimited");
        assert!(
            !q.usage.lock().expect("lock").contains_key("ci"),
            "nothing kept for an unlimited tenant"
        );
    }

    #[test]
    fn overrides_and_session_quotas() {
        let mut cfg = QuotasConfig {
            live_sessions: 1,
            session_storage_mb: 1,
            max_running: 2,
            ..Default::default()
        };
        cfg.tenants.insert(
            "big".into(),
            TenantQuotas {
                live_sessions: Some(0),
                max_queued: Some(3),
                ..Default::default()
            },
        );
        let q = Quotas::new(cfg);
        assert_eq!(
            q.limits("big"),
            TenantLimits {
                max_running: 2,
                max_queued: 3
            }
        );
        q.live_sessions("a", 0).expect("first");
        let e = q.live_sessions("a", 1).expect_err("second");
        assert!(e.to_string().contains("live_sessions"), "{e}");
        q.live_sessions("big", 100).expect("unlimited override");
        q.storage("a", 1 << 19, 1 << 19).expect("exactly 1 MiB");
        let e = q.storage("a", 1 << 19, (1 << 19) + 1).expect_err("over");
        assert_eq!(e.quota(), Some("session_storage_mb"));
        assert!(e.to_string().contains("1048577 bytes of its 1 MiB"), "{e}");
        q.storage("a", 1 << 20, 0)
            .expect_err("full: no new session");
        assert_eq!(q.named().collect::<Vec<_>>(), ["big"]);
    }
}
