//! The engine: one per process, shared by every transport.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use gearbox_core::{
    BackendKind, BackendReport, CollectLimits, Collected, ExecRequest, Job, JobFile, LanguageTable,
    Outcome, ResolvedLanguage, Sandbox,
};
use gearbox_sandbox::{LinuxSandbox, PoolStats, ProcessSandbox, WarmPool};
use serde::Serialize;

use crate::config::{Config, POOL_START_LATEST_MS};
use gearbox_packages::{Ecosystem, Layer, LayerInfo, Package, Target};

/// A run ready for its sandbox: what [`Engine::prepare`] settled.
struct PreparedRun {
    sandbox: Arc<dyn Sandbox>,
    kind: BackendKind,
    job: Job,
    layer: Option<Layer>,
    /// A granted run's egress proxy; its ledger becomes the outcome's `egress`.
    egress: Option<gearbox_egress::RunEgress>,
}

/// Put the proxy's ledger on the outcome of a run that had one.
fn account_egress(outcome: &mut Outcome, egress: Option<gearbox_egress::RunEgress>) {
    if let Some(e) = egress {
        outcome.egress = Some(e.finish());
    }
}

/// A configured language as this host sees it.
#[derive(Debug, Clone, Serialize)]
pub struct LanguageInfo {
    pub name: String,
    pub extensions: Vec<String>,
    pub entrypoint: String,
    /// Real interpreter path, when one was found.
    pub interpreter: Option<String>,
    pub version: Option<String>,
    /// Why the language cannot run here, when it cannot.
    pub unavailable: Option<String>,
}

/// How long the other languages' pools wait at start for the first one's first sandbox.
const STAGGER_MAX: std::time::Duration = std::time::Duration::from_secs(2);

pub struct Engine {
    config: Config,
    /// The helper binary (live sessions spawn it themselves).
    helper: PathBuf,
    pool: Arc<WarmPool>,
    pool_started: std::sync::Once,
    languages: LanguageTable,
    resolved: Mutex<HashMap<String, Result<ResolvedLanguage, String>>>,
    backends: HashMap<BackendKind, Arc<dyn Sandbox>>,
    packages: crate::packages::Packages,
    /// The egress proxy of granted runs; `Err` says why there is none (a bad `[network]`).
    egress: Result<gearbox_egress::Egress, String>,
    /// The server's runs, which the pool's start waits for.
    runs: Arc<Runs>,
}

/// The server's runs as the warm pool's start sees them ([`Engine::execute`],
/// [`Engine::execute_collecting`], a live session while it opens): it waits until the first run
/// is over, or, once `[pool] start_delay_ms` has passed, for a moment before any run began, at
/// the latest [`POOL_START_LATEST_MS`] after the delay. (Before the first run ends, "no run in
/// flight" is "no run begun": two flags say all there is to say.)
#[derive(Default)]
struct Runs {
    /// A run has begun since the server started.
    begun: std::sync::atomic::AtomicBool,
    /// A run has ended since the server started.
    ended: std::sync::atomic::AtomicBool,
    /// Woken when the first run ends.
    first_ended: tokio::sync::Notify,
}

/// One run, from its start until dropped (also when its future is cancelled).
struct RunInFlight<'a>(&'a Runs);

impl Runs {
    fn begin(&self) -> RunInFlight<'_> {
        self.begun.store(true, Ordering::SeqCst);
        RunInFlight(self)
    }

    /// Returns once the pool may start filling (see [`Runs`]); at once for a zero delay.
    async fn quiet_start(&self, delay: std::time::Duration) {
        if delay.is_zero() {
            return;
        }
        let quiet_from = tokio::time::Instant::now() + delay;
        let latest = quiet_from + std::time::Duration::from_millis(POOL_START_LATEST_MS);
        loop {
            let first_ended = self.first_ended.notified();
            tokio::pin!(first_ended);
            first_ended.as_mut().enable();
            let now = tokio::time::Instant::now();
            if self.ended.load(Ordering::SeqCst)
                || (now >= quiet_from && !self.begun.load(Ordering::SeqCst))
                || now >= latest
            {
                return;
            }
            let until = if now < quiet_from { quiet_from } else { latest };
            let _ = tokio::time::timeout_at(until, first_ended).await;
        }
    }
}

impl Drop for RunInFlight<'_> {
    fn drop(&mut self) {
        // Only the first end wakes anyone: the pool's start then returns for good.
        if !self.0.ended.swap(true, Ordering::SeqCst) {
            self.0.first_ended.notify_waiters();
        }
    }
}

impl Engine {
    /// Build an engine. `helper` is the gearbox binary the Linux and process backends
    /// re-execute as their sandbox helper (normally `std::env::current_exe()`); the lean
    /// helper `gearbox-jail` beside it is run instead when it is there.
    pub fn new(config: Config, helper: PathBuf) -> Engine {
        let helper = gearbox_sandbox::helper_beside(helper);
        let mut languages = LanguageTable::builtin();
        languages.merge(config.languages.clone());
        let mut backends: HashMap<BackendKind, Arc<dyn Sandbox>> = HashMap::new();
        let helper_path = helper.clone();
        let linux = LinuxSandbox::new(helper.clone());
        let pool = linux.pool();
        backends.insert(BackendKind::Linux, Arc::new(linux));
        backends.insert(BackendKind::Process, Arc::new(ProcessSandbox::new(helper)));
        backends.insert(
            BackendKind::Wasm,
            Arc::new(crate::lazy::LazyWasm::default()),
        );
        let packages = crate::packages::Packages::new(config.packages.clone());
        // Connects to the engine on first use only, so registering it costs nothing.
        backends.insert(
            BackendKind::Docker,
            Arc::new(gearbox_docker::DockerSandbox::new(config.docker.clone())),
        );
        let egress = gearbox_egress::Egress::new(config.network.clone(), &config.secrets)
            .map_err(|e| format!("no egress proxy: {e}"));
        let engine = Engine {
            helper: helper_path,
            egress,
            packages,
            config,
            pool,
            pool_started: std::sync::Once::new(),
            languages,
            resolved: Mutex::new(HashMap::new()),
            backends,
            runs: Arc::default(),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            engine.start_pool();
        }
        engine
    }

    /// The sandbox helper this engine starts: `gearbox-jail` beside the binary, or the
    /// binary itself (`gearbox __jail`).
    pub fn helper(&self) -> &std::path::Path {
        &self.helper
    }

    /// Fill the warm pool as configured (once; needs a tokio runtime, so it also happens on
    /// the first execution of an engine built outside one). A server calls it as it starts,
    /// so that its first call finds a warm sandbox.
    pub fn start_pool(&self) {
        self.pool_started.call_once(|| {
            if self.config.backend != BackendKind::Linux {
                return;
            }
            // The first language fills first, the others once it has a sandbox ready (or
            // after `STAGGER_MAX`): on two cores, three fork servers starting together made
            // a call that came right after launch wait for all of them (bench/cold_start.py).
            // And the first waits for the server's first run to end, or for a quiet moment
            // after `start_delay_ms`: a fork server starting beside a call made right after
            // launch (which runs cold either way) slowed it by a third.
            let first = self.first_pooled_language();
            let (mut now, mut later) = (Vec::new(), Vec::new());
            for (language, &size) in &self.config.pool.languages {
                if size.max == 0 {
                    continue;
                }
                let template = ExecRequest {
                    language: language.clone(),
                    ..Default::default()
                };
                match self
                    .resolve(language)
                    .and_then(|r| Job::build(&template, &r, &self.config.limits))
                {
                    Ok(job) => {
                        // Granted runs are served by sandboxes of their own (with their
                        // relay), built once granted runs come.
                        if let Ok(egress) = &self.egress {
                            self.pool
                                .keep_for_network(job.clone(), egress.runtime_root().to_path_buf());
                        }
                        if first.is_none() || Some(language) == first.as_ref() {
                            now.push((job, size.min, size.max));
                        } else {
                            later.push((job, size.min, size.max));
                        }
                    }
                    Err(e) => tracing::warn!(%language, error = %e, "no warm pool"),
                }
            }
            if now.is_empty() && later.is_empty() {
                // No language to keep (`gearbox run`, `pool = {}`): nothing to wait for, and
                // nothing to size (the total reads the host's CPU quota).
                return;
            }
            self.pool
                .set_fork_server_life(gearbox_sandbox::ForkServerLife {
                    max_runs: self.config.pool.fork_server_max_runs.max(1),
                    max_age: std::time::Duration::from_secs(
                        self.config.pool.fork_server_max_age_secs.max(1),
                    ),
                });
            self.pool.set_idle(self.config.pool.idle());
            self.pool
                .set_max_total(self.config.pool.max_total(&self.config.concurrency));
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                // Nothing can be built outside a runtime anyway: keep them all now.
                for (job, min, max) in now.into_iter().chain(later) {
                    self.pool.keep(job, min, max);
                }
                return;
            };
            let pool = Arc::clone(&self.pool);
            let runs = Arc::clone(&self.runs);
            let delay = std::time::Duration::from_millis(self.config.pool.start_delay_ms);
            rt.spawn(async move {
                runs.quiet_start(delay).await;
                for (job, min, max) in now {
                    pool.keep(job, min, max);
                }
                if later.is_empty() {
                    return;
                }
                let until = tokio::time::Instant::now() + STAGGER_MAX;
                while tokio::time::Instant::now() < until
                    && !pool
                        .stats()
                        .iter()
                        .any(|s| !s.network && Some(&s.language) == first.as_ref() && s.ready > 0)
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                for (job, min, max) in later {
                    pool.keep(job, min, max);
                }
            });
        });
    }

    /// The language whose pool fills first at start: of those that keep a sandbox at rest
    /// (`min` > 0; the others build nothing until a call comes), Python when it is one, else
    /// the first configured.
    fn first_pooled_language(&self) -> Option<String> {
        let pooled: Vec<&String> = self
            .config
            .pool
            .languages
            .iter()
            .filter(|(_, size)| size.min > 0 && size.max > 0)
            .map(|(l, _)| l)
            .collect();
        pooled
            .iter()
            .find(|l| l.as_str() == "python")
            .or(pooled.first())
            .map(|l| l.to_string())
    }

    /// The server is leaving: drop the warm sandboxes and stop the fork servers, which
    /// remove their cgroups (waits up to two seconds).
    pub async fn stop(&self) {
        self.pool.stop(std::time::Duration::from_secs(2)).await;
    }

    /// Why a run on `kind` must be refused under `[sandbox] require_limits`: the host cannot
    /// bound a run as a whole there. `None` when it can, or when the setting is off.
    pub fn unenforced_limits(&self, kind: BackendKind) -> Option<String> {
        if !self.config.sandbox.require_limits {
            return None;
        }
        let why = match kind {
            BackendKind::Linux => gearbox_sandbox::unenforced_limits()
                .map(|w| format!("no cgroup per run on this host: cgroups {w}"))?,
            BackendKind::Process => "the process backend bounds no run as a whole".into(),
            _ => return None,
        };
        Some(format!(
            "[sandbox] require_limits: {why}; runs here would have sampled or per-process \
             limits only (gearbox doctor)"
        ))
    }

    /// Warm pool counters per language.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pool.stats()
    }

    /// Fork servers replaced by fresh ones after `[pool] fork_server_max_runs` runs or
    /// `fork_server_max_age_secs`.
    pub fn fork_servers_retired(&self) -> u64 {
        self.pool.fork_servers_retired()
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Package layers (`ExecRequest.packages`).
    pub fn packages(&self) -> &crate::packages::Packages {
        &self.packages
    }

    pub fn language_table(&self) -> &LanguageTable {
        &self.languages
    }

    pub fn backend_kinds(&self) -> Vec<BackendKind> {
        let mut v: Vec<_> = self.backends.keys().copied().collect();
        v.sort_by_key(|k| k.as_str());
        v
    }

    fn resolve(&self, language: &str) -> Result<ResolvedLanguage, String> {
        let mut cache = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .entry(language.to_string())
            .or_insert_with(|| self.languages.resolve(language))
            .clone()
    }

    /// What every run does before its sandbox starts, whichever entry point: pick the
    /// backend, refuse where limits cannot hold, resolve the language (the docker backend runs
    /// the image's interpreter, so the host needs none), install packages, build the job.
    /// Every failure is an outcome.
    async fn prepare(
        &self,
        req: &mut ExecRequest,
        backend: Option<BackendKind>,
    ) -> Result<PreparedRun, Outcome> {
        self.start_pool();
        let kind = backend.unwrap_or(self.config.backend);
        let lang = req.language.clone();
        let Some(sandbox) = self.backends.get(&kind).cloned() else {
            return Err(Outcome::failed_to_start(
                &lang,
                kind.as_str(),
                format!("backend {kind} is not available in this build"),
            ));
        };
        if let Some(why) = self.unenforced_limits(kind) {
            return Err(Outcome::denied(&lang, kind.as_str(), why));
        }
        let resolved = match self.resolve(&lang) {
            Ok(r) => r,
            Err(e) => match (kind, self.languages.get(&lang)) {
                (BackendKind::Docker, Some(spec)) => ResolvedLanguage {
                    name: lang.clone(),
                    interpreter: PathBuf::from(
                        spec.interpreters.first().cloned().unwrap_or_default(),
                    ),
                    spec: spec.clone(),
                    mounts: Vec::new(),
                },
                _ => return Err(Outcome::failed_to_start(&lang, kind.as_str(), e)),
            },
        };
        let layer = self.packages.attach(req, &resolved, kind.as_str()).await?;
        let mut job = Job::build(req, &resolved, &self.config.limits)
            .map_err(|e| Outcome::denied(&lang, kind.as_str(), e))?;
        let egress = self.attach_egress(req, kind, &mut job).map_err(|o| *o)?;
        Ok(PreparedRun {
            sandbox,
            kind,
            job,
            layer,
            egress,
        })
    }

    /// A granted run (`req.network` as the gear left it) gets a proxy of its own: its socket's
    /// directory is mounted, the sandbox relays `127.0.0.1:3128` to it, and the program's
    /// environment points there. Only the `linux` backend can confine a run to the proxy;
    /// the `process` backend isolates nothing (it has the host's network whatever the grant).
    fn attach_egress(
        &self,
        req: &ExecRequest,
        kind: BackendKind,
        job: &mut Job,
    ) -> Result<Option<gearbox_egress::RunEgress>, Box<Outcome>> {
        if !req.network.is_on() || kind == BackendKind::Process {
            return Ok(None);
        }
        if kind != BackendKind::Linux {
            return Err(Box::new(Outcome::denied(
                &req.language,
                kind.as_str(),
                format!(
                    "the {kind} backend cannot confine a run to the egress proxy, so it grants \
                     no network; runs with network use the linux backend"
                ),
            )));
        }
        let proxy = self
            .egress
            .as_ref()
            .map_err(|e| Outcome::failed_to_start(&req.language, kind.as_str(), e.clone()))
            .map_err(Box::new)?;
        let run = proxy.open(req.network.clone()).map_err(|e| {
            Box::new(Outcome::failed_to_start(
                &req.language,
                kind.as_str(),
                format!("egress proxy: {e}"),
            ))
        })?;
        job.mounts.push(run.dir().to_path_buf());
        job.egress = Some(run.socket().to_path_buf());
        // The caller's own settings (a `NO_PROXY` of its choosing) win (`Job::program_vars`):
        // whatever they say, the proxy is the only way out.
        job.egress_env = run.env().iter().cloned().collect();
        Ok(Some(run))
    }

    /// The canonical name of a language (`py` → `python`), as runs are matched on it.
    pub fn normalize_language(&self, raw: &str) -> Result<String, String> {
        self.languages.normalize(raw)
    }

    /// Open a live session's interpreter: `language`'s live launcher in a sandbox of its own
    /// with the configured limits, the wall clock being `[sessions] live_max_age_secs`. Only
    /// on the linux backend (a live session needs the helper's sandbox). `template` gives
    /// the language, the packages and what the server adds (the tool channel's mount and
    /// variables); its code and files are not used.
    pub async fn open_live(
        &self,
        mut template: ExecRequest,
    ) -> Result<gearbox_sandbox::live::Live, String> {
        // Until the session has started (not for its life: its cells are the caller's).
        let _in_flight = self.runs.begin();
        if self.config.backend != BackendKind::Linux {
            return Err(format!(
                "live sessions run on the linux backend; this server's is {}",
                self.config.backend
            ));
        }
        let name = self.languages.normalize(&template.language)?;
        let resolved = self.resolve(&name)?;
        template.language = name;
        template.code.clear();
        template.files.clear();
        // The layer stays on disk (cached, its last use recorded); its mounts and variables
        // are now the job's.
        let _layer = self
            .packages
            .attach(&mut template, &resolved, "linux")
            .await
            .map_err(|o| {
                o.reason
                    .unwrap_or_else(|| "packages could not be installed".into())
            })?;
        let mut job = Job::build(&template, &resolved, &self.config.limits)?;
        job.files.clear();
        let age_ms = self
            .config
            .sessions
            .live_max_age_secs
            .max(1)
            .saturating_mul(1000);
        job.limits.timeout_ms = age_ms;
        job.limits.cpu_ms = 0;
        gearbox_sandbox::live::Live::open(&self.helper, job)
            .await
            .map_err(|e| e.to_string())
    }

    /// Run a request to completion. Every failure is an outcome: refusals are `denied`,
    /// a sandbox that could not start is `error` with the reason.
    pub async fn execute(&self, mut req: ExecRequest, backend: Option<BackendKind>) -> Outcome {
        let _in_flight = self.runs.begin();
        let run = match self.prepare(&mut req, backend).await {
            Ok(run) => run,
            Err(o) => return o,
        };
        match run.sandbox.run(run.job).await {
            Ok(mut outcome) => {
                outcome.take_pictures();
                crate::packages::account(&mut outcome, run.layer.as_ref());
                account_egress(&mut outcome, run.egress);
                outcome
            }
            Err(e) => {
                tracing::warn!(backend = %run.kind, error = %e, "sandbox failed");
                Outcome::failed_to_start(&req.language, run.kind.as_str(), e.to_string())
            }
        }
    }

    /// Run a request over a session's workspace: `workspace` (the session's files) is
    /// written into `/work` under the call's own files (a file the call brings, or the
    /// entrypoint, replaces the session's file of the same path), the workspace's tmpfs is
    /// capped at the session's quota, and the files the program leaves come back within
    /// `limits`. The collection is `None` when the program did not run to its end (refused,
    /// timed out, sandbox failure): the session then stays as it was.
    pub async fn execute_collecting(
        &self,
        mut req: ExecRequest,
        backend: Option<BackendKind>,
        workspace: Vec<JobFile>,
        limits: CollectLimits,
    ) -> (Outcome, Option<Collected>) {
        let _in_flight = self.runs.begin();
        let PreparedRun {
            sandbox,
            kind,
            mut job,
            layer,
            egress,
        } = match self.prepare(&mut req, backend).await {
            Ok(run) => run,
            Err(o) => return (o, None),
        };
        let lang = req.language.as_str();
        let given: std::collections::HashSet<String> =
            job.files.iter().map(|f| f.path.clone()).collect();
        job.files
            .extend(workspace.into_iter().filter(|f| !given.contains(&f.path)));
        let bytes: u64 = job.files.iter().map(|f| f.content.len() as u64).sum();
        if job.files.len() > limits.max_files || bytes > limits.max_bytes {
            let reason = format!(
                "the session's files with this call's come to {} files and {bytes} bytes, over \
                 the session's limits of {} files and {} bytes",
                job.files.len(),
                limits.max_files,
                limits.max_bytes
            );
            return (Outcome::denied(lang, kind.as_str(), reason), None);
        }
        let quota_mb = limits.max_bytes.div_ceil(1024 * 1024).max(1);
        job.limits.disk_mb = job.limits.disk_mb.min(quota_mb);
        match sandbox.run_collecting(job, limits).await {
            Ok(mut done) => {
                done.0.take_pictures();
                crate::packages::account(&mut done.0, layer.as_ref());
                account_egress(&mut done.0, egress);
                done
            }
            Err(e) => {
                tracing::warn!(backend = %kind, error = %e, "sandbox failed");
                (
                    Outcome::failed_to_start(lang, kind.as_str(), e.to_string()),
                    None,
                )
            }
        }
    }

    /// Every configured language and whether it runs here.
    pub fn languages(&self, with_versions: bool) -> Vec<LanguageInfo> {
        let names: Vec<String> = self.languages.names().map(str::to_string).collect();
        let infos: Vec<LanguageInfo> = std::thread::scope(|s| {
            let handles: Vec<_> = names
                .iter()
                .map(|name| {
                    s.spawn(move || {
                        let spec = self.languages.get(name).cloned();
                        let resolved = self.resolve(name);
                        let (interpreter, version, unavailable) = match &resolved {
                            Ok(r) => (
                                Some(r.interpreter.display().to_string()),
                                if with_versions { r.version() } else { None },
                                None,
                            ),
                            Err(e) => (None, None, Some(e.clone())),
                        };
                        LanguageInfo {
                            name: name.clone(),
                            extensions: spec
                                .as_ref()
                                .map(|s| s.extensions.clone())
                                .unwrap_or_default(),
                            entrypoint: spec.map(|s| s.entrypoint).unwrap_or_default(),
                            interpreter,
                            version,
                            unavailable,
                        }
                    })
                })
                .collect();
            handles.into_iter().filter_map(|h| h.join().ok()).collect()
        });
        infos
    }

    /// What each backend enforces on this host.
    pub fn probe(&self) -> Vec<BackendReport> {
        self.backend_kinds()
            .into_iter()
            .filter_map(|k| self.backends.get(&k).map(|b| b.probe()))
            .collect()
    }
}

// Package layers on behalf of the server: what would be installed, what is cached.
impl Engine {
    fn package_target(&self, language: &str) -> Result<Target, String> {
        let resolved = self.language_table().resolve(language)?;
        self.packages().target(&resolved)
    }

    /// What installing `reqs` for `language` would install, names and versions with
    /// dependencies, without installing (for a human to approve). Cached sets answer
    /// without the network.
    pub async fn resolve_packages(
        &self,
        language: &str,
        reqs: &[String],
    ) -> Result<Vec<Package>, String> {
        let target = self.package_target(language)?;
        let store = self.packages().store()?;
        store
            .resolve(&target, reqs)
            .await
            .map_err(|e| e.to_string())
    }

    /// Whether `reqs` for `language` are already installed (no installer would run).
    pub fn packages_cached(&self, language: &str, reqs: &[String]) -> bool {
        match (self.package_target(language), self.packages().store()) {
            (Ok(t), Ok(s)) => s.is_cached(&t, reqs),
            _ => false,
        }
    }

    /// Cached layers, most recently used first; `language` filters by its ecosystem.
    pub fn package_layers(&self, language: Option<&str>) -> Vec<LayerInfo> {
        let eco = match language {
            Some(l) => match Ecosystem::for_language(l) {
                Some(e) => Some(e),
                None => return Vec::new(),
            },
            None => None,
        };
        self.packages()
            .store()
            .map(|s| s.layers(eco))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    /// Start [`Runs::quiet_start`] with `delay_ms` on a task; the task yields how long it
    /// waited (in paused, so exact, time).
    async fn waiting(runs: &Arc<Runs>, delay_ms: u64) -> tokio::task::JoinHandle<Duration> {
        let runs = Arc::clone(runs);
        let t = Instant::now();
        let task = tokio::spawn(async move {
            runs.quiet_start(Duration::from_millis(delay_ms)).await;
            t.elapsed()
        });
        tokio::task::yield_now().await;
        task
    }

    async fn waited(task: tokio::task::JoinHandle<Duration>) -> Duration {
        task.await.expect("the waiting task")
    }

    /// How long the start waits with `delay_ms` when a run begins at once and lasts `run_ms`.
    async fn with_a_run(runs: &Arc<Runs>, delay_ms: u64, run_ms: u64) -> Duration {
        let task = waiting(runs, delay_ms).await;
        let run = runs.begin();
        tokio::time::sleep(Duration::from_millis(run_ms)).await;
        drop(run);
        waited(task).await
    }

    #[tokio::test(start_paused = true)]
    async fn the_pool_starts_after_the_first_run_or_at_a_quiet_moment() {
        let ms = Duration::from_millis;
        // No delay: at once. No run: at the delay.
        let runs = Arc::new(Runs::default());
        assert_eq!(waited(waiting(&runs, 0).await).await, ms(0));
        assert_eq!(waited(waiting(&runs, 100).await).await, ms(100));
        // The first run over before the delay: then.
        assert_eq!(with_a_run(&runs, 100, 30).await, ms(30));
        // A run in flight at the delay holds it back until it is over.
        let runs = Arc::new(Runs::default());
        assert_eq!(with_a_run(&runs, 100, 250).await, ms(250));
        // ... but a run that lasts does so for POOL_START_LATEST_MS at most.
        let runs = Arc::new(Runs::default());
        let task = waiting(&runs, 100).await;
        let _live = runs.begin();
        assert_eq!(waited(task).await, ms(100 + POOL_START_LATEST_MS));
    }
}
