//! [`WasmSandbox`]: one run = one fresh wasmtime `Store` + instance of the QuickJS guest.
//!
//! Per run: in-memory stdin and capped stdout/stderr pipes, a [`Limiter`] for linear memory,
//! an epoch deadline for the wall clock (and a cancel flag set when the caller drops the run's
//! future), no preopened directory unless the job brings files besides the entrypoint, no
//! sockets. The run executes on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gearbox_core::{
    BackendKind, BackendReport, Job, Outcome, ResourceUsage, RunFuture, Sandbox, SandboxError,
    Status,
};
use wasmtime::{Engine, InstancePre, Linker, Module, Store, Trap, UpdateDeadline};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, I32Exit, WasiCtxBuilder};

use crate::WasmError;
use crate::module::{self, ModuleSource};
use crate::pipe::CappedPipe;
use crate::snapshot;
use crate::ticker::Ticker;
use crate::workspace::Workspace;

/// Table elements the guest may grow to (QuickJS uses a fixed function table).
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// How the sandbox is built.
#[derive(Debug, Clone, Default)]
pub struct WasmConfig {
    /// Where to keep the compiled module between processes (see [`crate::module`]); `None`
    /// compiles at start-up every time.
    pub cache_dir: Option<PathBuf>,
}

impl WasmConfig {
    /// Cache the compiled module in [`module::default_cache_dir`].
    pub fn with_default_cache() -> Self {
        WasmConfig {
            cache_dir: module::default_cache_dir(),
        }
    }
}

/// The `wasm` backend: JavaScript in QuickJS (quickjs-ng) compiled to wasm32-wasip1.
pub struct WasmSandbox {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    pre: InstancePre<RunState>,
    start: Start,
    source: ModuleSource,
    ticker: Ticker,
    slots: Slots,
}

/// How a run finds QuickJS.
enum Start {
    /// Set up, in the snapshot's memory (`snapshot.rs`).
    Snapshot,
    /// Not set up: no snapshot could be made (`why`), so every run sets QuickJS up. `prelude`:
    /// prelude.js compiled by the guest itself (hex), passed to every run; `None` if that
    /// failed too (runs then parse the prelude, ~0.8 ms slower).
    Fresh {
        why: String,
        prelude: Option<String>,
    },
}

/// What one store owns.
pub(crate) struct RunState {
    wasi: WasiP1Ctx,
    limiter: Limiter,
    deadline: Instant,
    cancel: Arc<AtomicBool>,
    expired: Option<Expired>,
}

#[derive(Debug, Clone, Copy)]
enum Expired {
    Deadline,
    Cancelled,
}

/// Linear-memory limit of one run. Refusing a `memory.grow` traps (rather than letting
/// `malloc` fail) so a memory bomb ends as `killed` even when the program would catch the
/// engine's "out of memory" error.
struct Limiter {
    max_bytes: usize,
    peak_bytes: usize,
    hit: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("memory limit exceeded")]
struct MemoryLimitHit;

#[derive(Debug, thiserror::Error)]
#[error("run interrupted")]
struct Interrupted;

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = true;
            return Err(wasmtime::Error::new(MemoryLimitHit));
        }
        self.peak_bytes = self.peak_bytes.max(desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

impl WasmSandbox {
    /// Build the backend with the embedded guest, compiling it (a few seconds) or loading it
    /// from the cache named in `config`.
    pub fn new(config: WasmConfig) -> Result<WasmSandbox, WasmError> {
        Self::with_module_bytes(config, module::GUEST_WASM)
    }

    /// Like [`WasmSandbox::new`] with another guest build (tests, benchmarks).
    pub fn with_module_bytes(config: WasmConfig, wasm: &[u8]) -> Result<WasmSandbox, WasmError> {
        let engine = module::engine()?;
        let (module, source, snapshot) = prepare(&engine, wasm, config.cache_dir.as_deref())?;
        let pre = instance_pre(&engine, &module)?;
        let ticker = Ticker::start(engine.clone()).map_err(WasmError::Ticker)?;
        let start = match snapshot {
            Ok(()) => Start::Snapshot,
            Err(why) => {
                tracing::warn!("the wasm guest runs without a snapshot: {why}");
                let prelude = match on_own_thread(|| emit_prelude(&engine, &pre)) {
                    Ok(hex) => Some(hex),
                    Err(e) => {
                        tracing::warn!(
                            "precompiling the guest's prelude failed, runs parse it: {e}"
                        );
                        None
                    }
                };
                Start::Fresh { why, prelude }
            }
        };
        let snapshot = matches!(start, Start::Snapshot);
        tracing::debug!(?source, snapshot, "wasm backend ready");
        Ok(WasmSandbox {
            inner: Arc::new(Inner {
                engine,
                pre,
                start,
                source,
                ticker,
                slots: Slots::new(crate::module::INSTANCE_SLOTS),
            }),
        })
    }

    /// Whether runs start from a snapshot of the set-up engine; why not otherwise.
    pub fn snapshot(&self) -> Result<(), &str> {
        match &self.inner.start {
            Start::Snapshot => Ok(()),
            Start::Fresh { why, .. } => Err(why),
        }
    }

    /// How the module was obtained (compiled, or loaded from the cache) and how long it took.
    pub fn module_source(&self) -> &ModuleSource {
        &self.inner.source
    }

    /// Run `job` on the calling thread. Blocks until the program ends; prefer
    /// [`Sandbox::run`] from async code. `cancel` stops the run within one epoch tick.
    pub fn run_blocking(&self, job: &Job, cancel: Arc<AtomicBool>) -> Outcome {
        self.inner.run(job, cancel).outcome
    }
}

/// The module runs are made of: the snapshot of `wasm` (from the cache, or taken now and
/// cached), or `wasm` itself when no snapshot can be made (the error says why).
fn prepare(
    engine: &Engine,
    wasm: &[u8],
    cache_dir: Option<&Path>,
) -> Result<(Module, ModuleSource, Result<(), String>), WasmError> {
    let names = module::CacheNames::new(engine, wasm);
    let name = names.file(&format!("-snapshot{}", snapshot::FORMAT));
    if let Some((m, source)) = cache_dir.and_then(|dir| module::cached(engine, dir, &name)) {
        return Ok((m, source, Ok(())));
    }
    let start = Instant::now();
    let (original, source) = module::load(engine, wasm, cache_dir, &names.file(""))?;
    let taken = snapshot::check(wasm).and_then(|()| {
        let pre = instance_pre(engine, &original).map_err(|e| e.to_string())?;
        let memory = on_own_thread(|| take_snapshot(engine, &pre))?;
        snapshot::rewrite(wasm, &memory)
    });
    let made = taken.and_then(|bytes| {
        module::compile_and_cache(engine, &bytes, cache_dir, &name, start)
            .map_err(|e| format!("compiling the snapshot: {e}"))
    });
    Ok(match made {
        Ok((m, source)) => (m, source, Ok(())),
        Err(why) => (original, source, Err(why)),
    })
}

/// Run `f` on a thread of its own: wasmtime-wasi's synchronous calls must not run on a tokio
/// worker, and the backend may well be built from async code.
fn on_own_thread<T: Send>(f: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|_| Err("the thread panicked".into()))
    })
}

/// A store for the backend's own calls into the guest (not a run): generous limits, output
/// into `stdout` and `stderr`.
fn service_store(
    engine: &Engine,
    args: &[&str],
    stdout: &CappedPipe,
    stderr: &CappedPipe,
) -> Store<RunState> {
    let wasi = WasiCtxBuilder::new()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .args(args)
        .build_p1();
    let state = RunState {
        wasi,
        limiter: Limiter {
            max_bytes: 256 * 1024 * 1024,
            peak_bytes: 0,
            hit: false,
        },
        deadline: Instant::now() + Duration::from_secs(60),
        cancel: Arc::new(AtomicBool::new(false)),
        expired: None,
    };
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limiter);
    // The ticker is idle (no active run), so the epoch does not move: no deadline needed.
    store.set_epoch_deadline(1 << 40);
    store
}

/// Call the guest's `gearbox_snapshot` in a fresh instance and return its linear memory.
fn take_snapshot(engine: &Engine, pre: &InstancePre<RunState>) -> Result<Vec<u8>, String> {
    let stdout = CappedPipe::new(64 * 1024);
    let stderr = CappedPipe::new(64 * 1024);
    let mut store = service_store(engine, &["quickjs"], &stdout, &stderr);
    let failed =
        |what: &str, e: wasmtime::Error| format!("{what}: {e} {}", stderr.finish().text.trim());
    let instance = pre
        .instantiate(&mut store)
        .map_err(|e| failed("instantiating the guest", e))?;
    let sp = instance
        .get_global(&mut store, snapshot::STACK_POINTER_EXPORT)
        .ok_or("the guest does not export its stack pointer")?;
    let sp_before = sp.get(&mut store).i32();
    let init = instance
        .get_typed_func::<(), ()>(&mut store, snapshot::INIT_EXPORT)
        .map_err(|_| format!("the guest has no `{}` export", snapshot::INIT_EXPORT))?;
    init.call(&mut store, ())
        .map_err(|e| failed("preparing the snapshot", e))?;
    if sp.get(&mut store).i32() != sp_before {
        return Err("the guest's stack pointer moved while it prepared the snapshot".into());
    }
    let memory = instance
        .get_memory(&mut store, "memory")
        .ok_or("the guest does not export its memory")?;
    Ok(memory.data(&store).to_vec())
}

fn instance_pre(engine: &Engine, module: &Module) -> Result<InstancePre<RunState>, WasmError> {
    let mut linker: Linker<RunState> = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut RunState| &mut s.wasi)
        .map_err(|e| WasmError::Link(e.to_string()))?;
    linker
        .instantiate_pre(module)
        .map_err(|e| WasmError::Link(e.to_string()))
}

/// Run the guest once with `--emit-prelude`: QuickJS bytecode of its prelude, in hex.
fn emit_prelude(engine: &Engine, pre: &InstancePre<RunState>) -> Result<String, String> {
    let stdout = CappedPipe::new(PRELUDE_MAX_BYTES);
    let stderr = CappedPipe::new(64 * 1024);
    let mut store = service_store(engine, &["quickjs", "--emit-prelude"], &stdout, &stderr);
    let result = pre.instantiate(&mut store).and_then(|instance| {
        instance
            .get_typed_func::<(), ()>(&mut store, "_start")
            .and_then(|start| start.call(&mut store, ()))
    });
    let ok = match &result {
        Ok(()) => true,
        Err(e) => e.downcast_ref::<I32Exit>().is_some_and(|x| x.0 == 0),
    };
    let hex = String::from_utf8(stdout.take_bytes()).unwrap_or_default();
    if !ok || hex.is_empty() {
        return Err(format!(
            "{} {}",
            result.err().map(|e| e.to_string()).unwrap_or_default(),
            stderr.finish().text.trim()
        ));
    }
    Ok(hex)
}

/// Most bytes of hex the prelude's bytecode may take.
const PRELUDE_MAX_BYTES: u64 = 4 * 1024 * 1024;

/// The pooling allocator's instance slots, counted: a run takes one before it instantiates
/// and gives it back when its store is gone, so no run meets a full pool (wasmtime would
/// refuse the instance).
struct Slots {
    free: std::sync::Mutex<u32>,
    freed: std::sync::Condvar,
}

/// A slot taken from [`Slots`]; given back on drop, which comes after the run's store is
/// gone (`Store::into_data`).
struct Slot<'a>(&'a Slots);

impl Slots {
    fn new(n: u32) -> Self {
        Slots {
            free: std::sync::Mutex::new(n),
            freed: std::sync::Condvar::new(),
        }
    }

    /// Take a slot, waiting for one until `until` or until `cancel` is set.
    fn acquire(&self, until: Instant, cancel: &AtomicBool) -> Option<Slot<'_>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if *free > 0 {
                *free -= 1;
                return Some(Slot(self));
            }
            let now = Instant::now();
            if now >= until || cancel.load(Ordering::Acquire) {
                return None;
            }
            // Wake now and then to notice a cancelled run.
            let wait = (until - now).min(Duration::from_millis(20));
            free = self
                .freed
                .wait_timeout(free, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// Sets the cancel flag when the run's future is dropped before the run ended.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Sandbox for WasmSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Wasm
    }

    fn run(&self, job: Job) -> RunFuture<'_> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let cancel = Arc::new(AtomicBool::new(false));
            let _guard = CancelOnDrop(cancel.clone());
            let (tx, rx) = tokio::sync::oneshot::channel();
            // The answer leaves before the run's store is dropped: resetting the instance's
            // memory slot (tens of µs) happens beside the reply, not before it.
            let task = tokio::task::spawn_blocking(move || {
                let Ran { outcome, leftover } = inner.run(&job, cancel);
                let _ = tx.send(outcome);
                drop(leftover);
            });
            match rx.await {
                Ok(outcome) => Ok(outcome),
                Err(_) => Err(SandboxError::Setup {
                    step: "wasm run task".into(),
                    message: match task.await {
                        Err(e) => e.to_string(),
                        Ok(()) => "the run ended without an outcome".into(),
                    },
                }),
            }
        })
    }

    fn probe(&self) -> BackendReport {
        let source = match &self.inner.source {
            ModuleSource::Compiled { ms } => format!("module compiled at start-up in {ms} ms"),
            ModuleSource::Cache { path, ms } => {
                format!("module loaded from {} in {ms} ms", path.display())
            }
            ModuleSource::CompiledAndCached { path, ms } => {
                format!(
                    "module compiled in {ms} ms and cached at {}",
                    path.display()
                )
            }
        };
        let mut job = probe_job();
        job.files[0].content = b"console.log(6 * 7)".to_vec();
        let out = self
            .inner
            .run(&job, Arc::new(AtomicBool::new(false)))
            .outcome;
        let available = out.status == Status::Ok && out.stdout == "42\n";
        let mut details = vec![
            "javascript only: QuickJS (quickjs-ng, rquickjs 0.14) compiled to wasm32-wasip1, run by wasmtime 48".to_string(),
            source,
            match &self.inner.start {
                Start::Snapshot => "runs start from a snapshot of the guest with QuickJS and the prelude set up".into(),
                Start::Fresh { why, .. } => format!("no snapshot, every run sets QuickJS up: {why}"),
            },
            "memory: linear-memory limit per run (memory_mb); wall clock: epoch deadline (timeout_ms)".into(),
            "no filesystem (a read-only private workspace only when the call brings files), no network, no processes".into(),
        ];
        if !available {
            details.push(format!(
                "probe run failed: {} {}",
                out.summary(),
                out.stderr.trim()
            ));
        }
        BackendReport {
            backend: BackendKind::Wasm,
            available,
            details,
        }
    }
}

fn probe_job() -> Job {
    Job {
        language: "javascript".into(),
        argv: vec!["main.js".into()],
        program_argv: vec!["main.js".into()],
        files: vec![gearbox_core::JobFile {
            path: "main.js".into(),
            content: Vec::new(),
        }],
        limits: gearbox_core::Limits {
            timeout_ms: 5_000,
            memory_mb: 64,
            ..Default::default()
        },
        ..Job::default()
    }
}

/// What the guest is told: its argv, and whether a workspace is preopened.
fn guest_argv(job: &Job, code: &str, workspace: bool, prelude: Option<&str>) -> Vec<String> {
    let entry = job
        .files
        .first()
        .map(|f| f.path.clone())
        .unwrap_or_else(|| "main.js".into());
    let mut argv = vec!["quickjs".to_string()];
    if let Some(hex) = prelude {
        argv.push("--prelude-bytecode".into());
        argv.push(hex.to_string());
    }
    if !workspace {
        argv.push("--eval".into());
        argv.push(code.to_string());
    }
    argv.push(entry.clone());
    // The call's arguments follow the entrypoint in `program_argv` (older jobs: in `argv`).
    if job.program_argv.len() > 1 {
        argv.extend(job.program_argv[1..].iter().cloned());
    } else if let Some(i) = job.argv.iter().position(|a| a == &entry) {
        argv.extend(job.argv[i + 1..].iter().cloned());
    }
    argv
}

/// What a finished run still holds once its outcome is made: dropped after the outcome is
/// on its way. The store goes first (its instance's memory slot is reset then), the
/// workspace next, and the slot is given back last.
struct Leftover<'a> {
    _store: Store<RunState>,
    _workspace: Option<Workspace>,
    _slot: Slot<'a>,
}

/// A run's outcome, and what to drop once it has been handed on (none when the run never
/// started: an outcome made before the instance converts into one).
struct Ran<'a> {
    outcome: Outcome,
    leftover: Option<Leftover<'a>>,
}

impl From<Outcome> for Ran<'_> {
    fn from(outcome: Outcome) -> Self {
        Ran {
            outcome,
            leftover: None,
        }
    }
}

impl Inner {
    /// Run `job`.
    fn run(&self, job: &Job, cancel: Arc<AtomicBool>) -> Ran<'_> {
        let setup = Instant::now();
        let lang = job.language.as_str();
        let backend = BackendKind::Wasm.as_str();
        if lang != "javascript" {
            return Outcome::denied(
                lang,
                backend,
                format!("the wasm backend runs javascript only, not {lang}; use the linux backend"),
            )
            .into();
        }
        let Some(entry) = job.files.first() else {
            return Outcome::failed_to_start(lang, backend, "no program given").into();
        };
        let code = match std::str::from_utf8(&entry.content) {
            Ok(c) => c,
            Err(e) => {
                return Outcome::failed_to_start(
                    lang,
                    backend,
                    format!("the program is not valid UTF-8: {e}"),
                )
                .into();
            }
        };
        // Code travels in argv unless there are files to read (or a NUL, which argv cannot hold).
        let needs_workspace = job.files.len() > 1 || code.contains('\0');
        let workspace = if needs_workspace {
            match Workspace::create(&job.files) {
                Ok(w) => Some(w),
                Err(e) => {
                    return Outcome::failed_to_start(
                        lang,
                        backend,
                        format!("writing the workspace failed: {e}"),
                    )
                    .into();
                }
            }
        } else {
            None
        };

        let stdout = CappedPipe::new(job.limits.output_bytes);
        let stderr = CappedPipe::new(job.limits.output_bytes);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdin(MemoryInputPipe::new(job.stdin.clone()))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .args(&guest_argv(
                job,
                code,
                workspace.is_some(),
                match &self.start {
                    Start::Fresh { prelude, .. } => prelude.as_deref(),
                    Start::Snapshot => None,
                },
            ))
            .allow_blocking_current_thread(true)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        for (k, v) in &job.env {
            wasi.env(k, v);
        }
        if let Some(w) = &workspace
            && let Err(e) = wasi.preopened_dir(w.path(), ".", FsPerms::ReadOnly)
        {
            return Outcome::failed_to_start(
                lang,
                backend,
                format!("preopening the workspace failed: {e}"),
            )
            .into();
        }

        let timeout = Duration::from_millis(job.limits.timeout_ms);
        let max_bytes =
            usize::try_from(job.limits.memory_mb.saturating_mul(1024 * 1024)).unwrap_or(usize::MAX);
        let state = RunState {
            wasi: wasi.build_p1(),
            limiter: Limiter {
                max_bytes,
                peak_bytes: 0,
                hit: false,
            },
            deadline: Instant::now() + timeout,
            cancel,
            expired: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let s = ctx.data_mut();
            if s.cancel.load(Ordering::Acquire) {
                s.expired = Some(Expired::Cancelled);
            } else if Instant::now() >= s.deadline {
                s.expired = Some(Expired::Deadline);
            } else {
                return Ok(UpdateDeadline::Continue(1));
            }
            Err(wasmtime::Error::new(Interrupted))
        });

        let Some(slot) = self
            .slots
            .acquire(Instant::now() + timeout, &store.data().cancel)
        else {
            return Outcome::failed_to_start(
                lang,
                backend,
                format!(
                    "all {} wasm instance slots stayed busy for the run's wall-clock limit, or \
                     the run was cancelled while it waited",
                    crate::module::INSTANCE_SLOTS
                ),
            )
            .into();
        };
        let active = self.ticker.active();
        let setup_us = setup.elapsed().as_micros() as u64;
        let started = Instant::now();
        store.data_mut().deadline = started + timeout;
        let cpu_start = thread_cpu_time();
        let result = self.pre.instantiate(&mut store).and_then(|instance| {
            instance
                .get_typed_func::<(), ()>(&mut store, "_start")
                .and_then(|start| start.call(&mut store, ()))
        });
        let duration_ms = started.elapsed().as_millis() as u64;
        let cpu_time_ms = match (cpu_start, thread_cpu_time()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a).as_millis() as u64),
            _ => None,
        };
        drop(active);
        let state = store.data();

        let out = stdout.finish();
        let err = stderr.finish();
        let mut outcome = Outcome {
            status: Status::Ok,
            exit_code: None,
            signal: None,
            stdout: out.text,
            stderr: err.text,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            duration_ms,
            usage: ResourceUsage {
                cpu_time_ms,
                peak_memory_kb: Some(state.limiter.peak_bytes as u64 / 1024),
                setup_us: Some(setup_us),
                memory_limit: Some("wasm".into()),
            },
            reason: None,
            language: lang.to_string(),
            backend: backend.to_string(),
            egress: None,
            result: None,
            pictures: Vec::new(),
            outputs: Vec::new(),
            outputs_skipped: Vec::new(),
        };
        match result {
            Ok(()) => outcome.exit_code = Some(0),
            Err(e) => classify(&mut outcome, &e, state, job),
        }
        Ran {
            outcome,
            leftover: Some(Leftover {
                _store: store,
                _workspace: workspace,
                _slot: slot,
            }),
        }
    }
}

/// Map a failed `_start` to an outcome: exit, deadline, memory limit or trap.
fn classify(outcome: &mut Outcome, e: &wasmtime::Error, state: &RunState, job: &Job) {
    if let Some(exit) = e.downcast_ref::<I32Exit>() {
        outcome.exit_code = Some(exit.0);
        if exit.0 != 0 {
            outcome.status = Status::Error;
        }
        return;
    }
    if let Some(expired) = state.expired {
        outcome.status = Status::Timeout;
        outcome.reason = Some(match expired {
            Expired::Deadline => {
                format!("wall-clock limit of {} ms exceeded", job.limits.timeout_ms)
            }
            Expired::Cancelled => "the run was cancelled".into(),
        });
        return;
    }
    if state.limiter.hit || e.downcast_ref::<MemoryLimitHit>().is_some() {
        outcome.status = Status::Killed;
        outcome.reason = Some(format!(
            "memory limit of {} MiB exceeded",
            job.limits.memory_mb
        ));
        return;
    }
    outcome.status = Status::Error;
    outcome.reason = Some(match e.downcast_ref::<Trap>() {
        Some(Trap::StackOverflow) => {
            "the JavaScript engine ran out of stack (RangeError: too much recursion?)".into()
        }
        Some(Trap::MemoryOutOfBounds) => "the JavaScript engine crashed with an out-of-bounds \
             memory access (most likely too much recursion exhausted its stack)"
            .into(),
        Some(trap) => format!("the JavaScript engine trapped: {trap}"),
        None => format!("the JavaScript engine failed: {e}"),
    });
}

/// CPU time of the calling thread (the run is single-threaded and runs on it).
fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID needs nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}
