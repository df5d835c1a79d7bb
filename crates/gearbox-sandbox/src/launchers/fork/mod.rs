//! The fork server's native loop (`/.gearbox/fork.so`, loaded by `python_zygote.py`, and by
//! `node_zygote.js` as a Node-API module: `napi.rs`).
//!
//! The Python fork server calls `gb_serve` (`serve.rs`) once, holding the GIL, after it has
//! imported what a run needs. The loop never goes back to Python in the fork server: it
//! receives slot requests, clones each run's init (pid 1) into new namespaces, and that init,
//! also native, builds the run's scratch space, /proc and loopback and forks the program.
//! Only the program returns to Python, already restricted, with its stdio in place.
//!
//! Why native: every page a process writes after a fork is copied (or at least faulted) once
//! per fork. A Python loop and a Python init write hundreds of pages (reference counts,
//! frames, the allocator) for every run; this code writes a few stack pages.
//!
//! Built by `build.rs` with `rustc --crate-type cdylib` and no dependencies (a build script
//! cannot use a cdylib of the workspace as an artifact on stable Cargo), so the few libc
//! functions and kernel structures it needs are declared in `sys.rs`. Linux x86_64 and
//! aarch64. What it restricts — the writable areas, the read-only /proc entries, the device
//! nodes, the Landlock rights, the per-user counters — is the cold path's policy, from the one
//! file both compile (`restriction.rs`).

#![allow(non_camel_case_types, clippy::missing_safety_doc)]

// One crate root in three builds of these files: `build.rs` compiles this file with rustc as
// the shared object, the crate's `fork` example (`Cargo.toml`) compiles it again as a cdylib
// so that `cargo clippy --all-targets` lints it, and the crate itself links it as a module
// (`fork_native`) for the exec fork server (`jail/exec_zygote.rs`), which serves languages
// that run by `execve` from the gearbox binary itself. Every module is named by `#[path]`,
// which resolves the same in all three.

#[path = "config.rs"]
pub(crate) mod config;
#[path = "entropy.rs"]
mod entropy;
#[path = "message.rs"]
mod message;
#[path = "napi.rs"]
mod napi;
#[path = "restrict.rs"]
mod restrict;
/// The restriction policy the helper applies on the cold path, the same file.
#[path = "../../restriction.rs"]
mod restriction;
#[path = "serve.rs"]
pub(crate) mod serve;
#[path = "sys.rs"]
mod sys;
