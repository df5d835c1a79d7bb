//! gearbox-wasm: the `wasm` backend. JavaScript runs in QuickJS (quickjs-ng, through rquickjs)
//! compiled to `wasm32-wasip1` (`guest/quickjs`), executed by wasmtime in a fresh store per run.
//!
//! It owns the engine and the compiled module (compiled once per process or loaded from a
//! cache gearbox wrote, [`module`]), the per-run store with its limits and capped pipes
//! ([`sandbox`]) and the epoch ticker that enforces deadlines. The guest imports nothing but
//! WASI p1. It must not know about MCP, gears or the other backends; the guest's JavaScript
//! API is documented in `guest/quickjs/src/main.rs` and `docs/WASM.md`.

pub mod module;
mod pipe;
pub mod sandbox;
mod snapshot;
mod ticker;
mod workspace;

pub use module::{GUEST_WASM, INSTANCE_SLOTS, ModuleSource, default_cache_dir};
pub use sandbox::{WasmConfig, WasmSandbox};

/// The backend could not be built.
#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    #[error("creating the wasmtime engine failed: {0}")]
    Engine(String),
    #[error("compiling the QuickJS module failed: {0}")]
    Compile(String),
    #[error("linking the QuickJS module failed: {0}")]
    Link(String),
    #[error("starting the epoch ticker thread failed: {0}")]
    Ticker(#[source] std::io::Error),
}

impl From<WasmError> for gearbox_core::SandboxError {
    fn from(e: WasmError) -> Self {
        gearbox_core::SandboxError::Unavailable(e.to_string())
    }
}
