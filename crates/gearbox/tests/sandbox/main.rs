//! The sandbox test binary: real interpreters in real sandboxes, driven through the engine
//! with the real `gearbox` binary as the helper. One module per topic; `escape` holds the
//! hostile programs, each with the containment it must meet.
//!
//! Run it as root (cgroups in use) and as an unprivileged user (rlimits instead):
//! `scripts/test-unprivileged.sh` re-runs this binary as `nobody`.

// Shared with other test binaries, which use other parts of it.
#[allow(dead_code)]
#[path = "../common/cgroups.rs"]
mod cgroups;
mod display;
mod escape;
mod exec;
mod exec_fork_server;
mod fork_server;
mod helper;
mod integrity;
mod network;
mod outputs;
mod sessions;
mod support;
