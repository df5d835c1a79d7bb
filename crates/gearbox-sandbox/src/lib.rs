//! gearbox-sandbox: the `linux` and `process` backends.
//!
//! Both run the program through a helper process: the gearbox binary re-executed with the
//! hidden `__jail` subcommand ([`jail_main`]). Namespaces must be entered by a single-threaded
//! process (`unshare(CLONE_NEWUSER)` fails in a multithreaded one), and a helper that dies
//! takes its whole sandbox with it. The server side ([`LinuxSandbox`], [`ProcessSandbox`])
//! feeds the helper the job, reads stdout and stderr while the program runs, and turns the
//! helper's report into an [`gearbox_core::Outcome`]. This crate must not know about MCP,
//! gears or configuration files.

mod backend;
mod cgroup;
/// The fork server's native loop (`launchers/fork/`), linked in for the exec fork server
/// (`jail/exec_zygote.rs`); the same files build `/.gearbox/fork.so` for the interpreters'.
/// Built standalone too, it names the shared policy (`restriction.rs`) as a module of its own.
#[path = "launchers/fork/mod.rs"]
#[allow(clippy::duplicate_mod)]
mod fork_native;
mod fork_server;
mod helper;
mod jail;
pub mod live;
mod pool;
mod probe;
mod restriction;
mod step;
pub mod wire;

#[cfg(test)]
mod fork_abi;

pub use backend::{LinuxSandbox, ProcessSandbox};
pub use cgroup::{
    CgroupSupport, remove_spares as remove_spare_cgroups,
    sweep_stale_in_background as sweep_stale_cgroups,
};
pub use fork_server::ForkServerLife;
pub use pool::{MAX_PER_KEY, PoolStats, WarmPool};
pub use probe::unenforced_limits;

/// The build the helper and its server must share (`build.rs`): the server passes it after
/// `__jail`, and a helper of another build refuses the job.
pub const HELPER_BUILD: &str = env!("GEARBOX_HELPER_BUILD");

/// The lean helper's file name: a binary with only the helper's code, installed beside
/// `gearbox`, which starts in ~0.9 ms where the whole `gearbox` takes ~1.6 ms
/// (`docs/PERFORMANCE.md`).
pub const LEAN_HELPER: &str = "gearbox-jail";

/// The helper to re-execute for a server running `exe`: the lean helper beside it when
/// there is one, else `exe` itself (`gearbox __jail`).
pub fn helper_beside(exe: std::path::PathBuf) -> std::path::PathBuf {
    let lean = exe.with_file_name(LEAN_HELPER);
    if lean.is_file() { lean } else { exe }
}

/// Entry point of the `__jail` helper. Never returns.
pub fn jail_main() -> ! {
    jail::main()
}
