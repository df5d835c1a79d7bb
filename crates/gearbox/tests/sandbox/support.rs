//! Test support: an engine whose helper is the built `gearbox` binary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use gearbox_core::{BackendKind, ExecRequest, FileInput, LanguageSpec, LimitOverrides, Outcome};
use gearbox_engine::{Config, Engine, PoolConfig};

/// The gearbox binary under test (`GEARBOX_BIN` overrides, for running as another user).
pub fn gearbox_bin() -> PathBuf {
    std::env::var_os("GEARBOX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gearbox")))
}

/// One runtime for every sandbox run of this binary: warm sandboxes hold pipes registered
/// with the runtime that started them, which must outlive the individual tests.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("test runtime")
    })
}

/// The engine under test. With `GEARBOX_TEST_POOL=1` it keeps warm sandboxes (the default
/// pool), so every run with default limits goes through a pooled sandbox: the suite's
/// second dimension.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut config = Config::default();
        if std::env::var_os("GEARBOX_TEST_POOL").is_none() {
            config.pool.languages.clear();
        }
        let _guard = runtime().enter();
        Engine::new(config, gearbox_bin())
    })
}

/// An engine whose language `name` is `spec` (beside the built-in ones, or in place of one),
/// keeping `min` warm sandboxes of it.
pub fn engine_with_language(name: &str, spec: LanguageSpec, min: usize) -> std::sync::Arc<Engine> {
    let _g = runtime().enter();
    let config = Config {
        pool: PoolConfig::only([(name.to_string(), min)]),
        languages: [(name.to_string(), spec)].into(),
        ..Config::default()
    };
    std::sync::Arc::new(Engine::new(config, gearbox_bin()))
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A request builder.
#[derive(Clone)]
pub struct Run {
    pub req: ExecRequest,
    pub backend: Option<BackendKind>,
}

pub fn run(language: &str, code: &str) -> Run {
    Run {
        req: ExecRequest {
            language: language.into(),
            code: code.into(),
            ..Default::default()
        },
        backend: None,
    }
}

impl Run {
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.req.limits.timeout_ms = Some(ms);
        self
    }
    pub fn limits(mut self, l: LimitOverrides) -> Self {
        self.req.limits = l;
        self
    }
    pub fn stdin(mut self, s: &str) -> Self {
        self.req.stdin = s.as_bytes().to_vec();
        self
    }
    pub fn file(mut self, name: &str, content: &str) -> Self {
        self.req.files.push(FileInput {
            filename: name.into(),
            content: content.into(),
            encoding: Default::default(),
        });
        self
    }
    pub fn args(mut self, args: &[&str]) -> Self {
        self.req.args = args.iter().map(|s| s.to_string()).collect();
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        let mut env = BTreeMap::new();
        env.insert(k.to_string(), v.to_string());
        self.req.env.extend(env);
        self
    }
    /// A host path mounted read-only at the same place (as the server mounts package layers
    /// and the broker's run directory).
    pub fn mount(mut self, path: &std::path::Path) -> Self {
        self.req.mounts.push(path.to_path_buf());
        self
    }
    pub fn backend(mut self, b: BackendKind) -> Self {
        self.backend = Some(b);
        self
    }
    pub async fn go(self) -> Outcome {
        runtime()
            .spawn(engine().execute(self.req, self.backend))
            .await
            .expect("run task")
    }
}

/// Host processes whose command line contains `needle`.
pub fn host_processes_with(needle: &str) -> Vec<String> {
    let mut found = vec![];
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{}: {cmd}", name.to_string_lossy()));
            }
        }
    }
    found
}

/// Wait until a host process matching `needle` runs (a run's program has started), however
/// long a loaded machine takes, failing if `task` (the run) ends first or after 30 s.
pub async fn until_running<T>(needle: &str, task: &tokio::task::JoinHandle<T>) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while host_processes_with(needle).is_empty() {
        assert!(
            !task.is_finished(),
            "the run ended before {needle} was seen"
        );
        assert!(std::time::Instant::now() < until, "no {needle} after 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Host processes matching `needle` still alive after `grace` (teardown of a killed pid
/// namespace takes a moment).
pub async fn survivors_after(needle: &str, grace: std::time::Duration) -> Vec<String> {
    let until = std::time::Instant::now() + grace;
    loop {
        let found = host_processes_with(needle);
        if found.is_empty() || std::time::Instant::now() >= until {
            return found;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Whether this host offers cgroup controllers the helper can use (as root).
pub fn cgroups_writable() -> bool {
    !matches!(
        gearbox_sandbox::CgroupSupport::detect(),
        gearbox_sandbox::CgroupSupport::None { .. }
    )
}

pub use crate::cgroups::root_and_cgroups;
