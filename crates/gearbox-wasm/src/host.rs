//! The seam for host functions the guest may import (module name `gearbox`).
//!
//! Nothing is exported yet. The broker SDK ("code mode": JavaScript calling other MCP servers'
//! tools) will land here as, e.g., `gearbox.call_tool(req_ptr, req_len) -> handle` plus a
//! `gearbox.result_read(handle, buf_ptr, buf_len)` pair: the guest passes a JSON request,
//! the host validates it against the run's allowlist and quotas in [`HostState`] and answers
//! with JSON. Since runs are synchronous, the call blocks the run's thread (on the blocking
//! pool) while the broker works; the epoch deadline still bounds the run because the host call
//! must itself honour `RunState::deadline`. The guest side is a `gearbox` global defined in
//! `guest/quickjs/src/prelude.js` on top of a native function in `guest/quickjs/src/main.rs`.

use wasmtime::Linker;

use crate::sandbox::RunState;

/// Per-run state of host functions: the broker channel, call counters, quotas.
#[derive(Debug, Default)]
pub(crate) struct HostState {}

/// Add gearbox's host functions to `linker`. Today: none.
pub(crate) fn add_to_linker(_linker: &mut Linker<RunState>) -> wasmtime::Result<()> {
    Ok(())
}
