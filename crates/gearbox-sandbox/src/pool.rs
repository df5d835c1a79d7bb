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
//! Where the host gives per-run cgroups, every language has a fork server (`fork_server.rs`:
//! Python's, Node's, and the exec fork server for the others), and
//! a warm sandbox is a slot forked from the key's fork server instead of a whole
//! helper: a few forks instead of two process starts and an interpreter start. A fork server
//! that fails three times in a row is given up for helper-built sandboxes. A fork server
//! serves at most [`ForkServerLife::max_runs`] runs and lives at most
//! [`ForkServerLife::max_age`]: then a fresh one takes over for the next slot, and the old one
//! is stopped once no slot or run of its own is left (what a fork cannot renew, such as the
//! interpreter's hash seed, is thus shared by a bounded number of runs).
//!
//! Elastic: a key keeps `min` warm sandboxes and grows by one per miss up to `max`. A key
//! none of whose runs came for the idle time ([`WarmPool::set_idle`]) shrinks back to `min`:
//! what misses added is dropped (each removing its cgroup). A key whose `min` is 0 is then
//! put at rest: it keeps nothing and its fork server is stopped until a run comes again.
//! That run starts cold (it is not a miss that raises the target), and once it is over the
//! key refills to one, off the request path. All keys together hold at most
//! [`WarmPool::set_max_total`] warm sandboxes, ready or being built.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

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
    /// The same, built for granted runs: its relay runs, and this directory (empty until a
    /// run takes it) is bound in where the relay looks for the proxy's socket.
    Granted(Spawned, EgressDir),
    /// A slot of a fork server.
    Forked(fork_server::Slot),
}

impl Warm {
    /// Still built and waiting (not killed, not failed).
    fn waiting(&mut self) -> bool {
        match self {
            Warm::Helper(sp) | Warm::Granted(sp, _) => matches!(sp.child.try_wait(), Ok(None)),
            Warm::Forked(slot) => slot.waiting(),
        }
    }
}

/// A directory of the egress proxy's runtime root bound into a warm sandbox built for
/// granted runs. When a run takes the sandbox, its proxy socket and trust store (made by the
/// engine in the run's own directory) are hard-linked in ([`EgressDir::adopt`]); the relay
/// connects by path, so it reaches that run's proxy and no other. Removed when dropped.
pub(crate) struct EgressDir(PathBuf);

impl EgressDir {
    /// A fresh directory under `root`, which the sandbox user can reach and nobody else.
    fn create(root: &std::path::Path) -> Result<EgressDir, String> {
        use std::os::unix::fs::DirBuilderExt;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(root)
            .map_err(|e| format!("creating {}: {e}", root.display()))?;
        gearbox_core::rundir::reachable_by_sandbox(root, "the egress proxy's socket")?;
        // Directories of servers that died without stopping their pool.
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            let Ok(entries) = std::fs::read_dir(root) else {
                return;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let pid = name.strip_prefix("warm-").and_then(|r| r.split('-').next());
                if let Some(pid) = pid
                    && pid.parse::<u32>().is_ok()
                    && !std::path::Path::new(&format!("/proc/{pid}")).exists()
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        });
        let dir = root.join(format!(
            "warm-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let made = EgressDir(dir);
        gearbox_core::rundir::RunAccess::of_server()
            .restrict(&made.0, 0o700)
            .map_err(|e| format!("restricting {}: {e}", made.0.display()))?;
        Ok(made)
    }

    /// Make `job` (whose proxy the engine opened in a directory of its own) this sandbox's:
    /// link its socket and trust store in, and point its mounts and variables here. On an
    /// error `job` is as it was.
    pub(crate) fn adopt(&self, job: &mut Job) -> Result<(), String> {
        let Some(from) = job
            .egress
            .as_ref()
            .and_then(|s| s.parent())
            .map(PathBuf::from)
        else {
            return Ok(());
        };
        for name in ["proxy.sock", "ca.pem", "trust.pem"] {
            let src = from.join(name);
            if name != "proxy.sock" && !src.exists() {
                continue;
            }
            std::fs::hard_link(&src, self.0.join(name))
                .map_err(|e| format!("linking {} into {}: {e}", src.display(), self.0.display()))?;
        }
        job.mounts.retain(|m| *m != from);
        job.mounts.push(self.0.clone());
        job.egress = Some(self.0.join("proxy.sock"));
        let (old, new) = (from.display().to_string(), self.0.display().to_string());
        for value in job.egress_env.values_mut() {
            if let Some(rest) = value.strip_prefix(old.as_str()) {
                *value = format!("{new}{rest}");
            }
        }
        Ok(())
    }
}

impl Drop for EgressDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
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
    if let Some(socket) = &job.egress {
        // Node reads `NODE_EXTRA_CA_CERTS` once, at start: a run whose trust store holds a
        // CA of its own (secrets) cannot have it in an interpreter started before it.
        let node = job
            .launcher
            .as_ref()
            .is_some_and(|(name, _)| name == "node");
        if node && job.egress_env.contains_key("NODE_EXTRA_CA_CERTS") {
            return None;
        }
        let own = socket.parent()?;
        let mounts: Vec<&PathBuf> = job.mounts.iter().filter(|m| m.as_path() != own).collect();
        return granted_key(job, &mounts);
    }
    let forked = fork_server::serves(job);
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

/// The key of warm sandboxes built for granted runs like `job` (helper-built, whatever
/// the language: a fork server's slots have no relay).
fn granted_key(job: &Job, mounts: &[&PathBuf]) -> Option<String> {
    serde_json::to_string(&(
        "network",
        &job.language,
        &job.env,
        &job.limits,
        mounts,
        &job.launcher,
    ))
    .ok()
}

/// The warm sandboxes of one key.
struct KeyPool {
    template: Job,
    min: usize,
    /// What misses may grow the target to.
    max: usize,
    target: usize,
    ready: VecDeque<Warm>,
    filling: usize,
    /// The fork-server launcher serving this key, if any.
    fork_server: Option<&'static str>,
    /// Sandboxes for granted runs: each gets a directory of this root ([`EgressDir`]).
    egress_root: Option<PathBuf>,
    hits: u64,
    misses: u64,
    last_refill_ms: f64,
    last_miss: Option<Instant>,
    /// Builds that failed in a row (reset by one that succeeds), and the last one's error.
    failed_in_row: u32,
    last_error: Option<String>,
    /// When a run last came for this key (took a sandbox, missed, or ended).
    last_used: Instant,
    /// Nothing kept: no run came for the idle time. The next run wakes it.
    resting: bool,
}

impl KeyPool {
    /// A key's pool keeping `min` sandboxes like `template`, none built yet.
    fn new(
        template: Job,
        min: usize,
        max: usize,
        fork_server: Option<&'static str>,
        egress_root: Option<PathBuf>,
    ) -> KeyPool {
        KeyPool {
            template,
            min,
            max: max.max(min),
            target: min,
            ready: VecDeque::new(),
            filling: 0,
            fork_server,
            egress_root,
            hits: 0,
            misses: 0,
            last_refill_ms: 0.0,
            last_miss: None,
            failed_in_row: 0,
            last_error: None,
            last_used: Instant::now(),
            resting: false,
        }
    }
}

/// Counters per language, for `doctor` and metrics.
#[derive(Debug, Clone, Serialize)]
pub struct PoolStats {
    pub language: String,
    pub ready: usize,
    pub target: usize,
    /// Being built.
    pub filling: usize,
    /// The configured minimum (`[pool]`): what the pool keeps at rest.
    pub min: usize,
    /// The configured maximum: what misses may grow the target to.
    pub max: usize,
    /// Fork servers of this key alive now (a replaced one counts until it has stopped).
    pub fork_servers: usize,
    /// At rest: no run came for the idle time, so nothing is kept until one does.
    pub resting: bool,
    pub hits: u64,
    pub misses: u64,
    /// Time to build the last replacement sandbox, in ms.
    pub last_refill_ms: f64,
    /// Served by a fork server (false: each warm sandbox is built by its own helper).
    pub fork_server: bool,
    /// Built for runs granted network (with their relay), on demand: none are kept until a
    /// granted run misses.
    pub network: bool,
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
    /// Every fork server started, by key, while it lives (for [`PoolStats::fork_servers`]).
    started_servers: Mutex<Vec<(String, Weak<ForkServer>)>>,
    /// How long a key may go without a run before it rests, in ms (0: never).
    idle_ms: AtomicU64,
    /// The task that puts idle keys at rest was started.
    sweeping: AtomicBool,
    /// Most warm sandboxes, ready or being built, of all keys together.
    max_total: AtomicU64,
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
            started_servers: Mutex::new(Vec::new()),
            idle_ms: AtomicU64::new(0),
            sweeping: AtomicBool::new(false),
            max_total: AtomicU64::new(u64::MAX),
        })
    }

    /// Hold at most `n` warm sandboxes, ready or being built, over all keys (the memory
    /// budget and the concurrency limit): a top-up past it builds fewer.
    pub fn set_max_total(&self, n: usize) {
        self.max_total.store(n as u64, Ordering::Relaxed);
    }

    /// Put a key at rest once no run came for it for `idle` (`None`: never): its warm
    /// sandboxes are dropped and its fork server stopped. Checked every `idle / 2` (at least
    /// 100 ms, at most 30 s). Must run inside a tokio runtime to take effect.
    pub fn set_idle(self: &Arc<Self>, idle: Option<Duration>) {
        let ms = idle.map_or(0, |d| (d.as_millis() as u64).max(1));
        self.idle_ms.store(ms, Ordering::Relaxed);
        if ms == 0 {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.sweeping.swap(true, Ordering::Relaxed) {
            return;
        }
        let pool = Arc::downgrade(self);
        rt.spawn(async move {
            loop {
                let tick = {
                    let Some(pool) = pool.upgrade() else { return };
                    let ms = pool.idle_ms.load(Ordering::Relaxed);
                    if pool.stopped.load(Ordering::Relaxed) {
                        return;
                    }
                    Duration::from_millis(ms / 2)
                        .clamp(Duration::from_millis(100), Duration::from_secs(30))
                };
                tokio::time::sleep(tick).await;
                let Some(pool) = pool.upgrade() else { return };
                pool.rest_idle().await;
            }
        });
    }

    /// Shrink every key idle for the idle time to its minimum: drop its warm sandboxes above
    /// it (each removing its cgroup); a key whose minimum is 0 is put at rest, and its fork
    /// server stopped.
    async fn rest_idle(&self) {
        let ms = self.idle_ms.load(Ordering::Relaxed);
        if ms == 0 || self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let idle = Duration::from_millis(ms);
        let mut dropped = Vec::new();
        let mut rested = Vec::new();
        for (k, pool) in self.keys().iter_mut() {
            if pool.resting || pool.last_used.elapsed() < idle {
                continue;
            }
            pool.target = pool.min;
            let extra = pool.ready.len().saturating_sub(pool.min);
            // A key that never held anything (a granted-run key nobody used) rests quietly.
            if extra > 0
                || (pool.min == 0 && (pool.fork_server.is_some() || !pool.ready.is_empty()))
            {
                tracing::info!(
                    language = %pool.template.language,
                    network = pool.egress_root.is_some(),
                    dropped = extra,
                    kept = pool.ready.len() - extra,
                    "warm pool idle: shrunk to its minimum{}",
                    if pool.min == 0 { ", at rest" } else { "" }
                );
            }
            dropped.extend(pool.ready.drain(pool.ready.len() - extra..));
            if pool.min == 0 {
                pool.resting = true;
                rested.push(k.clone());
            }
        }
        // Slots first: a fork server is stopped once nothing of it is left.
        let helpers = close(dropped);
        if !helpers.is_empty() {
            tokio::spawn(wait_for(helpers, Instant::now() + Duration::from_secs(5)));
        }
        if rested.is_empty() {
            return;
        }
        let mut old = Vec::new();
        {
            let mut servers = self.fork_servers.lock().await;
            let keys = self.keys();
            for k in &rested {
                // A run may have woken the key meanwhile: its server is wanted again.
                if keys.get(k).is_some_and(|p| p.resting)
                    && let Some(z) = servers.get_mut(k).and_then(|s| s.server.take())
                {
                    old.push(z);
                }
            }
        }
        for z in old {
            tokio::spawn(ForkServer::retire(z));
        }
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

    /// Keep at least `min` warm sandboxes like `template`, growing to `max` while runs miss.
    /// Must run inside a tokio runtime.
    pub fn keep(self: &Arc<Self>, template: Job, min: usize, max: usize) {
        let Some(k) = key(&template) else { return };
        let min = min.min(MAX_PER_KEY);
        let max = max.min(MAX_PER_KEY);
        let fork_server = fork_server::serves(&template);
        self.keys().insert(
            k.clone(),
            KeyPool::new(template, min, max, fork_server, None),
        );
        self.top_up(&k);
    }

    /// Keep warm sandboxes like `template` for runs granted network, each with its relay and
    /// a directory of `egress_root` (the egress proxy's runtime root). None are built until
    /// a granted run misses (each miss raises the target, up to [`MAX_PER_KEY`]).
    pub fn keep_for_network(self: &Arc<Self>, template: Job, egress_root: PathBuf) {
        let mounts: Vec<&PathBuf> = template.mounts.iter().collect();
        let Some(k) = granted_key(&template, &mounts) else {
            return;
        };
        self.keys().insert(
            k,
            KeyPool::new(template, 0, MAX_PER_KEY, None, Some(egress_root)),
        );
    }

    /// A warm sandbox for `job`: one that is ready, or, when the key's fork server is
    /// building one, that one if it is ready within [`FORK_WAIT`].
    pub(crate) async fn take_or_wait(self: &Arc<Self>, job: &Job) -> Option<Warm> {
        if let Some(w) = self.take(job, true) {
            return Some(w);
        }
        let k = self.key_of(job)?;
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
            // A fork server that has not built a slot yet is still starting its interpreter
            // (tens of ms, more than a cold run): the run starts cold beside it.
            if !self.fork_server_serving(&k).await {
                return None;
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
        let k = self.key_of(job)?;
        let taken = {
            let mut keys = self.keys();
            let pool = keys.get_mut(&k)?;
            // Helper-built sandboxes carry every limit of their template.
            if pool.fork_server.is_none() && pool.template.limits != job.limits {
                return None;
            }
            pool.last_used = Instant::now();
            if pool.resting {
                // Woken: nothing is ready or being built, so this run starts cold; once it
                // is over its refill builds the key's sandbox again (its fork server first),
                // not competing with the run.
                pool.resting = false;
                pool.target = pool.min.max(1).min(pool.max);
                if count_miss {
                    pool.misses += 1;
                }
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
                    pool.target = (pool.target + 1).min(pool.max);
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

    /// The pool key serving `job`, for [`WarmPool::refill`]; none when the pool keeps
    /// nothing (`gearbox run`, `pool = {}`), without computing it (whether a fork server
    /// serves the job reads the host's cgroup mounts).
    pub(crate) fn key_of(&self, job: &Job) -> Option<String> {
        if self.keys().is_empty() {
            return None;
        }
        key(job)
    }

    /// Top up the pool of a run (served warm or cold), once the run is over.
    pub(crate) fn refill(self: &Arc<Self>, key: Option<String>) {
        if let Some(k) = key {
            if let Some(pool) = self.keys().get_mut(&k) {
                pool.last_used = Instant::now();
            }
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
        let (template, n, fork_server, egress_root) = {
            let mut keys = self.keys();
            let total: usize = keys.values().map(|p| p.ready.len() + p.filling).sum();
            let room = usize::try_from(self.max_total.load(Ordering::Relaxed))
                .unwrap_or(usize::MAX)
                .saturating_sub(total);
            let Some(pool) = keys.get_mut(k) else { return };
            let have = pool.ready.len() + pool.filling;
            let n = pool.target.saturating_sub(have).min(room);
            pool.filling += n;
            (
                pool.template.clone(),
                n,
                pool.fork_server,
                pool.egress_root.clone(),
            )
        };
        for _ in 0..n {
            let pool = Arc::clone(self);
            let k = k.to_string();
            let template = template.clone();
            let egress_root = egress_root.clone();
            rt.spawn(async move {
                let t = Instant::now();
                let built = match (fork_server, egress_root) {
                    (_, Some(root)) => pool.build_granted(&template, &root).await,
                    (Some(launcher), None) => pool.fork(&k, &template, launcher).await,
                    (None, None) => {
                        let pooled = Pooled {
                            launcher: template.launcher.clone(),
                            fork_server: false,
                        };
                        let spec = spec_for(Mode::Linux, &template, Some(pooled));
                        spawn(&pool.helper, &spec).await.map(Warm::Helper)
                    }
                };
                pool.spawned.fetch_add(1, Ordering::Relaxed);
                let mut unwanted = None;
                let retry = {
                    let mut keys = pool.keys();
                    let Some(key_pool) = keys.get_mut(&k) else {
                        return;
                    };
                    key_pool.filling = key_pool.filling.saturating_sub(1);
                    key_pool.last_refill_ms = t.elapsed().as_secs_f64() * 1000.0;
                    let wanted = !key_pool.resting && !pool.stopped.load(Ordering::Relaxed);
                    match built {
                        // Stopped, or at rest: what was being built is not wanted, nor its
                        // failure news (dropped below, once the lock is released).
                        Ok(sp) if !wanted => {
                            unwanted = Some(sp);
                            None
                        }
                        Err(_) if !wanted => None,
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
                if let Some(warm) = unwanted {
                    let helpers = close(vec![warm]);
                    wait_for(helpers, Instant::now() + Duration::from_secs(5)).await;
                }
                // A failed build is retried on its own, later and later while it keeps
                // failing, instead of leaving the pool empty until the next run misses it.
                if let Some(delay) = retry {
                    tokio::time::sleep(delay).await;
                    pool.top_up(&k);
                }
            });
        }
    }

    /// A helper-built warm sandbox for granted runs: its relay waits for a socket in a
    /// directory of its own.
    async fn build_granted(
        &self,
        template: &Job,
        root: &std::path::Path,
    ) -> Result<Warm, gearbox_core::SandboxError> {
        let dir = EgressDir::create(root).map_err(gearbox_core::SandboxError::Protocol)?;
        let mut job = template.clone();
        job.mounts.push(dir.0.clone());
        job.egress = Some(dir.0.join("proxy.sock"));
        let pooled = Pooled {
            launcher: job.launcher.clone(),
            fork_server: false,
        };
        let spec = spec_for(Mode::Linux, &job, Some(pooled));
        let sp = spawn(&self.helper, &spec).await?;
        Ok(Warm::Granted(sp, dir))
    }

    /// Whether `k`'s fork server runs and has built a slot (so the next is milliseconds away).
    async fn fork_server_serving(&self, k: &str) -> bool {
        let servers = self.fork_servers.lock().await;
        servers
            .get(k)
            .and_then(|s| s.server.as_ref())
            .is_some_and(|z| z.alive() && z.has_built())
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
                _ if self.keys().get(k).is_some_and(|p| p.resting) => {
                    return Err(gearbox_core::SandboxError::Protocol(
                        "the warm pool is at rest".into(),
                    ));
                }
                _ => {
                    let z = ForkServer::start(&self.helper, template, launcher).await?;
                    server.server = Some(Arc::clone(&z));
                    let mut started = self
                        .started_servers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    // Bounded whether or not anyone reads the stats: forget the gone ones.
                    started.retain(|(_, z)| z.strong_count() > 0);
                    started.push((k.to_string(), Arc::downgrade(&z)));
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
        let helpers = close(ready);
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
        wait_for(helpers, deadline).await;
    }

    pub fn stats(&self) -> Vec<PoolStats> {
        let mut alive: HashMap<String, usize> = HashMap::new();
        {
            let mut started = self
                .started_servers
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            started.retain(|(k, z)| match z.upgrade() {
                Some(z) if z.alive() => {
                    *alive.entry(k.clone()).or_default() += 1;
                    true
                }
                Some(_) => true,
                None => false,
            });
        }
        let mut v: Vec<PoolStats> = self
            .keys()
            .iter()
            .map(|(k, s)| PoolStats {
                language: s.template.language.clone(),
                ready: s.ready.len(),
                target: s.target,
                filling: s.filling,
                min: s.min,
                max: s.max,
                fork_servers: alive.get(k).copied().unwrap_or(0),
                resting: s.resting,
                hits: s.hits,
                misses: s.misses,
                last_refill_ms: s.last_refill_ms,
                fork_server: s.fork_server.is_some(),
                network: s.egress_root.is_some(),
                failed_in_row: s.failed_in_row,
                last_error: s.last_error.clone(),
            })
            .collect();
        v.sort_by(|a, b| (&a.language, a.network).cmp(&(&b.language, b.network)));
        v
    }
}

/// The helpers of helper-built sandboxes being dropped, with what must outlive their end.
type Closing = Vec<(crate::helper::HelperProcess, Box<dyn Send>)>;

/// Drop warm sandboxes cleanly. A fork server's slot is killed, and its cgroup released,
/// when dropped. A helper-built sandbox ends once its hand-over pipe closes, and its helper
/// removes its cgroup; a helper killed instead (as dropping it does) could not: those are
/// returned, to wait for with [`wait_for`].
fn close(warm: Vec<Warm>) -> Closing {
    let mut helpers: Closing = Vec::new();
    for w in warm {
        let (sp, dir) = match w {
            Warm::Forked(slot) => {
                drop(slot);
                continue;
            }
            Warm::Helper(sp) => (sp, None),
            Warm::Granted(sp, dir) => (sp, Some(dir)),
        };
        let Spawned {
            child,
            stdin,
            stdout,
            stderr,
            report,
        } = sp;
        drop(stdin);
        helpers.push((child, Box::new((stdout, stderr, report, dir))));
    }
    helpers
}

/// Wait for closed helpers to end until `deadline`; one still running then is killed.
async fn wait_for(helpers: Closing, deadline: Instant) {
    for (mut child, pipes) in helpers {
        let until = tokio::time::Instant::from_std(deadline);
        let _ = tokio::time::timeout_at(until, child.wait()).await;
        drop(pipes);
    }
}
