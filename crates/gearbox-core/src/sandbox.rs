//! The contract between the engine and an isolation backend.

use std::future::Future;
use std::pin::Pin;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::outcome::Outcome;
use crate::request::Job;
use crate::tree::{CollectLimits, Collected};

/// The isolation backends gearbox knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Namespaces, pivot_root, seccomp, Landlock, cgroups: the default on Linux.
    Linux,
    /// A plain child process with rlimits: no isolation.
    Process,
    /// QuickJS compiled to WebAssembly, run by wasmtime.
    Wasm,
    /// A container per run through the Docker Engine API.
    Docker,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Linux => "linux",
            BackendKind::Process => "process",
            BackendKind::Wasm => "wasm",
            BackendKind::Docker => "docker",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "linux" => Ok(BackendKind::Linux),
            "process" => Ok(BackendKind::Process),
            "wasm" => Ok(BackendKind::Wasm),
            "docker" => Ok(BackendKind::Docker),
            other => Err(format!(
                "unknown backend {other:?} (expected linux, process, wasm or docker)"
            )),
        }
    }
}

/// A backend could not run the job at all. Program failures are outcomes, not errors.
#[derive(Debug, Error)]
pub enum SandboxError {
    #[error("spawning the sandbox helper failed: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("sandbox set-up failed at step {step}: {message}")]
    Setup { step: String, message: String },
    #[error("sandbox helper protocol error: {0}")]
    Protocol(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// What `doctor` learns about a backend on this host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BackendReport {
    pub backend: BackendKind,
    pub available: bool,
    /// One line per mechanism: what is enforced here and what is not.
    pub details: Vec<String>,
}

/// A boxed future returned by [`Sandbox::run`].
pub type RunFuture<'a> = Pin<Box<dyn Future<Output = Result<Outcome, SandboxError>> + Send + 'a>>;

/// A boxed future returned by [`Sandbox::run_collecting`]: the outcome, and the files the
/// program left in its workspace when it ran to its end (`None` when it was stopped: timeout,
/// a limit, a sandbox failure).
pub type CollectFuture<'a> =
    Pin<Box<dyn Future<Output = Result<(Outcome, Option<Collected>), SandboxError>> + Send + 'a>>;

/// An isolation backend. Every run gets a sandbox no other run has touched. Dropping the
/// future returned by `run` kills the run and everything it started.
pub trait Sandbox: Send + Sync {
    fn kind(&self) -> BackendKind;
    fn run(&self, job: Job) -> RunFuture<'_>;
    /// Run `job` and bring back the regular files of its workspace, within `limits` (session
    /// runs). Backends that cannot refuse the run.
    fn run_collecting(&self, job: Job, limits: CollectLimits) -> CollectFuture<'_> {
        let _ = (job, limits);
        let kind = self.kind();
        Box::pin(async move {
            Err(SandboxError::Unavailable(format!(
                "the {kind} backend cannot keep a session workspace; use the linux or process backend"
            )))
        })
    }
    /// Check what works on this host (may run a tiny sandbox).
    fn probe(&self) -> BackendReport;
}
