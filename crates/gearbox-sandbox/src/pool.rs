//! The warm pool: sandboxes built before the request arrives, each used once.
//!
//! A warm sandbox is a helper whose init has built the whole sandbox — namespaces, root,
//! cgroup, seccomp, Landlock, rlimits — and, for languages with a launcher, already started
//! the interpreter, which waits on a pipe for its program. A run takes one, hands the program
//! over, and the pool starts a replacement in the background. Nothing is ever reused: a
//! sandbox serves exactly one run and is destroyed with it.
//!
//! Only jobs whose sandbox is identical to the pool's template are served warm (same
//! language, environment, limits, mounts, no network); any other job starts cold.
//!
//! Where the language has a fork server (`fork_server.rs`: Python, Node) and the host gives per-run
//! cgroups, a warm sandbox is a slot forked from the key's fork server instead of a whole
//! helper: a few forks instead of two process starts and an interpreter start. A fork server
//! that fails three times in a row is given up for helper-built sandboxes. A fork server
//! serves at most [`ForkServerLife::max_runs`] runs and lives at most
//! [`ForkServerLife::max_age`]: then a fresh one takes over for the next slot, and the old one
//! is stopped once no slot or run of its own is left (what a fork cannot renew, such as the
//! interpreter's hash seed, is thus shared by a bounded number of runs).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gearbox_core::Job;
use serde::Serialize;

use crate::fork_server::{self, ForkServer, ForkServerLife};
use crate::helper::{Spawned, spawn, spec_for};
use crate::wire::{Mode, Pooled};

/// Consecutive failures after which a key's fork server is given up.
const FORK_SERVER_FAILURES: u32 = 3;
/// How long a run waits for a fork-server slot being built before it starts cold: a slot
/// takes a few milliseconds, a cold sandbox tens.
const FORK_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// One warm sandbox.
pub(crate) enum Warm {
    /// A helper whose init built the sandbox and waits for the hand-over.
    Helper(Spawned),
    /// A slot of a fork server.
    Forked(fork_server::Slot),
}

impl Warm {
    /// Still built and waiting (not killed, not failed).
    fn waiting(&mut self) -> bool {
        match self {
            Warm::Helper(sp) => matches!(sp.child.try_wait(), Ok(None)),
            Warm::Forked(slot) => slot.waiting(),
        }
    }
}

/// The fork server of one key, and its failures in a row.
#[derive(Default)]
struct KeyServer {
    server: Option<Arc<ForkServer>>,
    failures: u32,
}

/// How long the pool waits before building again after `failed` builds failed in a row:
/// 250 ms, doubling, at most 30 s.
fn retry_delay(failed: u32) -> std::time::Duration {
    let ms = 250u64.saturating_mul(1u64 << failed.saturating_sub(1).min(7));
    std::time::Duration::from_millis(ms.min(30_000))
}

/// Most warm sandboxes one key may hold, whatever the demand.
pub const MAX_PER_KEY: usize = 8;
/// A pool grown by misses shrinks back by one per hit once no miss happened for this long.
pub const IDLE_SHRINK: std::time::Duration = std::time::Duration::from_secs(60);

/// What identifies interchangeable sandboxes. A fork server's slots differ only in the
/// limits baked in when they are built (memory, pids, disk); the others a run lowers at
/// hand-over, and the slot is built with the configured defaults, the most a run may have.
fn key(job: &Job) -> Option<String> {
    if job.egress.is_some() {
        return None;
    }
    let forked = job
        .launcher
        .as_ref()
        .and_then(|(name, _)| fork_server::serves(name));
    match forked {
        Some(_) => serde_json::to_string(&(
            &job.language,
            &job.env,
            fork_server::built_limits(&job.limits),
            &job.mounts,
            &job.launcher,
        )),
        None => serde_json::to_string(&(
            &job.language,
            &job.env,
            &job.limits,
            &job.mounts,
            &job.launcher,
        )),
    }
    .ok()
}

/// The warm sandboxes of one key.
struct KeyPool {
    template: Job,
    min: usize,
    target: usize,
    ready: VecDeque<Warm>,
    filling: usize,
    /// The fork-server launcher serving this key, if any.
    fork_server: Option<&'static str>,
    hits: u64,
    misses: u64,
    last_refill_ms: f64,
    last_miss: Option<Instant>,
    /// Builds that failed in a row (reset by one that succeeds), and the last one's error.
    failed_in_row: u32,
    last_error: Option<String>,
}

/// Counters per language, for `doctor` and metrics.
#[derive(Debug, Clone, Serialize)]
pub struct PoolStats {
    pub language: String,
    pub ready: usize,
    pub target: usize,
    pub hits: u64,
    pub misses: u64,
    /// Time to build the last replacement sandbox, in ms.
    pub last_refill_ms: f64,
    /// Served by a fork server (false: each warm sandbox is built by its own helper).
    pub fork_server: bool,
    /// Builds that failed in a row; the pool retries after a delay that doubles each time.
    pub failed_in_row: u32,
    /// Why the last build failed, while builds are failing.
    pub last_error: Option<String>,
}

pub struct WarmPool {
    helper: PathBuf,
    keys: Mutex<HashMap<String, KeyPool>>,
    fork_servers: tokio::sync::Mutex<HashMap<String, KeyServer>>,
    /// Woken whenever a warm sandbox becomes ready.
    filled: tokio::sync::Notify,
    spawned: AtomicU64,
    /// [`WarmPool::stop`] was called: nothing more is built.
    stopped: AtomicBool,
    life: Mutex<ForkServerLife>,
    /// Fork servers replaced by fresh ones: each is stopped once its last slot is gone.
    retired: AtomicU64,
}

impl WarmPool {
    pub fn new(helper: PathBuf) -> Arc<WarmPool> {
        Arc::new(WarmPool {
            helper,
            keys: Mutex::new(HashMap::new()),
            fork_servers: tokio::sync::Mutex::new(HashMap::new()),
            filled: tokio::sync::Notify::new(),
            spawned: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            life: Mutex::new(ForkServerLife::default()),
            retired: AtomicU64::new(0),
        })
    }

    /// How long each fork server serves (applies to fork servers started from now on).
    pub fn set_fork_server_life(&self, life: ForkServerLife) {
        *self.life.lock().unwrap_or_else(|p| p.into_inner()) = life;
    }

    /// Fork servers replaced so far because they reached their [`ForkServerLife`].
    pub fn fork_servers_retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeyPool>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keep at least `min` warm sandboxes like `template`. Must run inside a tokio runtime.
    pub fn keep(self: &Arc<Self>, template: Job, min: usize) {
        let Some(k) = key(&template) else { return };
        let min = min.min(MAX_PER_KEY);
        let fork_server = template
            .launcher
            .as_ref()
            .and_then(|(name, _)| fork_server::serves(name));
        self.keys().insert(
            k.clone(),
            KeyPool {
                template,
                min,
                target: min,
                ready: VecDeque::new(),
                filling: 0,
                fork_server,
                hits: 0,
                misses: 0,
                last_refill_ms: 0.0,
                last_miss: None,
                failed_in_row: 0,
                last_error: None,
            },
        );
        self.top_up(&k);
    }

    /// A warm sandbox for `job`: one that is ready, or, when the key's fork server is
    /// building one, that one if it is ready within [`FORK_WAIT`].
    pub(crate) async fn take_or_wait(self: &Arc<Self>, job: &Job) -> Option<Warm> {
        if let Some(w) = self.take(job, true) {
            return Some(w);
        }
        let k = key(job)?;
        let deadline = tokio::time::Instant::now() + FORK_WAIT;
        loop {
            let notified = self.filled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let keys = self.keys();
                let pool = keys.get(&k)?;
                if pool.fork_server.is_none() || (pool.filling == 0 && pool.ready.is_empty()) {
                    return None;
                }
            }
            if let Some(w) = self.take(job, false) {
                return Some(w);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// A warm sandbox for `job`, if one is ready. `count_miss`: a miss raises the target.
    fn take(self: &Arc<Self>, job: &Job, count_miss: bool) -> Option<Warm> {
        let k = key(job)?;
        let taken = {
            let mut keys = self.keys();
            let pool = keys.get_mut(&k)?;
            // Helper-built sandboxes carry every limit of their template.
            if pool.fork_server.is_none() && pool.template.limits != job.limits {
                return None;
            }
            let mut taken = None;
            while let Some(mut sp) = pool.ready.pop_front() {
                // A sandbox that died (killed, or failed to build) is dropped.
                if sp.waiting() {
                    taken = Some(sp);
                    break;
                }
            }
            match &taken {
                Some(_) => {
                    pool.hits += 1;
                    // Demand fell: drift back towards the configured minimum.
                    if pool.target > pool.min
                        && pool.last_miss.is_none_or(|t| t.elapsed() > IDLE_SHRINK)
                    {
                        pool.target -= 1;
                    }
                }
                None if !count_miss => {}
                None => {
                    // Demand outran the pool: keep one more next time, up to the cap.
                    pool.misses += 1;
                    pool.last_miss = Some(Instant::now());
                    pool.target = (pool.target + 1).min(MAX_PER_KEY);
                }
            }
            // With a sandbox still ready, the replacement waits until this run is over
            // ([`WarmPool::refill`]): on a small machine building it now would compete with
            // the run for the CPU. An empty pool refills at once.
            let urgent = pool.ready.is_empty();
            (taken, urgent)
        };
        let (taken, urgent) = taken;
        if urgent || taken.is_none() {
            self.top_up(&k);
        }
        taken
    }

    /// The pool key serving `job`, for [`WarmPool::refill`].
    pub(crate) fn key_of(&self, job: &Job) -> Option<String> {
        key(job)
    }

    /// Top up the pool a run was served from, once the run is over.
    pub(crate) fn refill(self: &Arc<Self>, key: Option<String>) {
        if let Some(k) = key {
            self.top_up(&k);
        }
    }

    /// Start replacements until ready + filling reaches the target.
    fn top_up(self: &Arc<Self>, k: &str) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let (template, n, fork_server) = {
            let mut keys = self.keys();
            let Some(pool) = keys.get_mut(k) else { return };
            let have = pool.ready.len() + pool.filling;
            let n = pool.target.saturating_sub(have);
            pool.filling += n;
            (pool.template.clone(), n, pool.fork_server)
        };
        for _ in 0..n {
            let pool = Arc::clone(self);
            let k = k.to_string();
            let template = template.clone();
            rt.spawn(async move {
                let t = Instant::now();
                let built = match fork_server {
                    Some(launcher) => pool.fork(&k, &template, launcher).await,
                    None => {
                        let pooled = Pooled {
                            launcher: template.launcher.clone(),
                            fork_server: false,
                        };
                        let spec = spec_for(Mode::Linux, &template, Some(pooled));
                        spawn(&pool.helper, &spec).await.map(Warm::Helper)
                    }
                };
                pool.spawned.fetch_add(1, Ordering::Relaxed);
                let retry = {
                    let mut keys = pool.keys();
                    let Some(key_pool) = keys.get_mut(&k) else {
                        return;
                    };
                    key_pool.filling = key_pool.filling.saturating_sub(1);
                    key_pool.last_refill_ms = t.elapsed().as_secs_f64() * 1000.0;
                    match built {
                        // Stopped: what was being built is not wanted, nor its failure news.
                        _ if pool.stopped.load(Ordering::Relaxed) => None,
                        Ok(sp) => {
                            key_pool.ready.push_back(sp);
                            key_pool.failed_in_row = 0;
                            key_pool.last_error = None;
                            pool.filled.notify_waiters();
                            None
                        }
                        Err(e) => {
                            key_pool.failed_in_row = key_pool.failed_in_row.saturating_add(1);
                            key_pool.last_error = Some(e.to_string());
                            tracing::warn!(error = %e, failed_in_row = key_pool.failed_in_row, "warm sandbox failed to start");
                            Some(retry_delay(key_pool.failed_in_row))
                        }
                    }
                };
                // A failed build is retried on its own, later and later while it keeps
                // failing, instead of leaving the pool empty until the next run misses it.
                if let Some(delay) = retry {
                    tokio::time::sleep(delay).await;
                    pool.top_up(&k);
                }
            });
        }
    }

    /// A slot of `k`'s fork server, starting the server when it is not running.
    async fn fork(
        &self,
        k: &str,
        template: &Job,
        launcher: &'static str,
    ) -> Result<Warm, gearbox_core::SandboxError> {
        let fork_server = {
            let mut servers = self.fork_servers.lock().await;
            let server = servers.entry(k.to_string()).or_default();
            let life = *self.life.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(z) = &server.server
                && z.alive()
                && z.exhausted(life)
            {
                // Taken out of service now; stopped once its slots and runs are over.
                let old = server.server.take().expect("checked above");
                self.retired.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(ForkServer::retire(old));
            }
            match &server.server {
                Some(z) if z.alive() => Arc::clone(z),
                _ if self.stopped.load(Ordering::Relaxed) => {
                    return Err(gearbox_core::SandboxError::Protocol(
                        "the warm pool was stopped".into(),
                    ));
                }
                _ => {
                    let z = ForkServer::start(&self.helper, template, launcher).await?;
                    server.server = Some(Arc::clone(&z));
                    z
                }
            }
        };
        let built = fork_server.slot().await;
        let mut servers = self.fork_servers.lock().await;
        let server = servers.entry(k.to_string()).or_default();
        match built {
            Ok(slot) => {
                server.failures = 0;
                Ok(Warm::Forked(slot))
            }
            Err(e) => {
                server.failures += 1;
                if !fork_server.alive() {
                    server.server = None;
                }
                if server.failures >= FORK_SERVER_FAILURES {
                    tracing::warn!(error = %e, "fork server failed {FORK_SERVER_FAILURES} times in a row; warm sandboxes of this key are built by helpers from now on");
                    server.server = None;
                    if let Some(pool) = self.keys().get_mut(k) {
                        pool.fork_server = None;
                    }
                }
                Err(e)
            }
        }
    }

    /// Stop for good (the server is leaving): drop every warm sandbox, build no more, and
    /// stop the fork servers, waiting up to `grace` for the helpers to end, each removing its
    /// cgroup on the way out (one still running then is killed).
    pub async fn stop(&self, grace: std::time::Duration) {
        self.stopped.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + grace;
        let ready: Vec<Warm> = self
            .keys()
            .values_mut()
            .flat_map(|pool| pool.ready.drain(..))
            .collect();
        // A fork server's slot is killed, and its cgroup released, when dropped. A helper-built
        // sandbox ends once its hand-over pipe closes, and its helper removes its cgroup; a
        // helper killed instead (as dropping it does) could not.
        let mut helpers = Vec::new();
        for warm in ready {
            match warm {
                Warm::Forked(slot) => drop(slot),
                Warm::Helper(Spawned {
                    child,
                    stdin,
                    stdout,
                    stderr,
                    report,
                }) => {
                    drop(stdin);
                    helpers.push((child, (stdout, stderr, report)));
                }
            }
        }
        let fork_servers: Vec<Arc<ForkServer>> = self
            .fork_servers
            .lock()
            .await
            .drain()
            .filter_map(|(_, server)| server.server)
            .collect();
        for z in &fork_servers {
            z.stop();
        }
        for z in &fork_servers {
            z.wait_until(deadline).await;
        }
        for (mut child, pipes) in helpers {
            let until = tokio::time::Instant::from_std(deadline);
            let _ = tokio::time::timeout_at(until, child.wait()).await;
            drop(pipes);
        }
    }

    pub fn stats(&self) -> Vec<PoolStats> {
        let mut v: Vec<PoolStats> = self
            .keys()
            .values()
            .map(|s| PoolStats {
                language: s.template.language.clone(),
                ready: s.ready.len(),
                target: s.target,
                hits: s.hits,
                misses: s.misses,
                last_refill_ms: s.last_refill_ms,
                fork_server: s.fork_server.is_some(),
                failed_in_row: s.failed_in_row,
                last_error: s.last_error.clone(),
            })
            .collect();
        v.sort_by(|a, b| a.language.cmp(&b.language));
        v
    }
}
