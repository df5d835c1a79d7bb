//! Backends that are expensive to create are created on first use, so a one-shot
//! `gearbox run` of Python never pays for compiling the QuickJS module.

use std::sync::{Arc, OnceLock};

use gearbox_core::{BackendKind, BackendReport, Job, RunFuture, Sandbox, SandboxError};
use gearbox_wasm::{WasmConfig, WasmSandbox};

/// The `wasm` backend, built on first use (module loaded from gearbox's own cache).
#[derive(Default)]
pub struct LazyWasm {
    inner: OnceLock<Result<Arc<WasmSandbox>, String>>,
}

impl LazyWasm {
    fn get(&self) -> Result<Arc<WasmSandbox>, String> {
        self.inner
            .get_or_init(|| {
                WasmSandbox::new(WasmConfig::with_default_cache())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }
}

impl Sandbox for LazyWasm {
    fn kind(&self) -> BackendKind {
        BackendKind::Wasm
    }

    fn run(&self, job: Job) -> RunFuture<'_> {
        match self.get() {
            Ok(w) => Box::pin(async move { w.run(job).await }),
            Err(e) => Box::pin(async move { Err(SandboxError::Unavailable(e)) }),
        }
    }

    fn probe(&self) -> BackendReport {
        match self.get() {
            Ok(w) => w.probe(),
            Err(e) => BackendReport {
                backend: BackendKind::Wasm,
                available: false,
                details: vec![format!("cannot load the QuickJS module: {e}")],
            },
        }
    }
}
