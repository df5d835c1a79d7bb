//! The `__jail` helper: a short-lived, single-threaded process that builds one sandbox, runs
//! one program in it, and reports.
//!
//! Process tree in `linux` mode (see `docs/ARCHITECTURE.md`):
//!
//! ```text
//! server ── helper (host namespaces; maps ids, joins cgroups, enforces the deadline)
//!             └── init  (pid 1 of new user/mount/pid/net/ipc/uts/cgroup namespaces; builds
//!                        the root, reaps orphans; its death kills every process inside)
//!                   └── program (setsid, rlimits, no caps, Landlock, seccomp, execve)
//! ```
//!
//! The steps run in order, top to bottom, and the first failure stops the run with a
//! [`crate::step::StepError`] naming the step. Every process in the chain dies with its parent
//! (`PR_SET_PDEATHSIG`), so killing the helper — or the server — kills the whole sandbox.

mod exec_zygote;
mod init;
mod landlock;
mod linux;
mod memwatch;
mod message;
mod mount;
mod prestart;
mod process;
mod program;
mod relay;
mod seccomp;

use std::fs::File;
use std::io::Write;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::step::{AtStep, Step};
use crate::wire::{JailReport, Mode, REPORT_FD, SetupFailure, read_request};

/// The uid and gid the program has inside its user namespace.
pub const SANDBOX_ID: u32 = 1000;
/// Host uid/gid the sandbox maps to when the helper runs as root: never host root.
pub const NOBODY: u32 = gearbox_core::SANDBOX_HOST_ID;

/// Entry point of the helper. Writes one report to fd 3 and exits 0, or exits 1 when even
/// the report cannot be written.
pub fn main() -> ! {
    let start = Instant::now();
    let mut report = JailReport::default();
    if let Err(e) = run(start, &mut report) {
        report.error = Some(e);
    }
    let ok = send_report(&mut report, &[]) || REPORT_SENT.load(Ordering::Relaxed);
    std::process::exit(if ok { 0 } else { 1 })
}

static REPORT_SENT: AtomicBool = AtomicBool::new(false);

/// Write the report to fd 3, followed by the collected workspace (`trailer`, framed by
/// `gearbox_core::tree`) when there is one, and close it, once: the server answers as soon as
/// it has the report and the program's output, while the helper goes on cleaning up.
pub(crate) fn send_report(report: &mut JailReport, trailer: &[u8]) -> bool {
    if REPORT_SENT.swap(true, Ordering::Relaxed) {
        return false;
    }
    report.collected = !trailer.is_empty();
    // SAFETY: fd 3 is the report pipe the server installed before exec; it is owned by this
    // process, used nowhere else, and closed when `out` drops.
    let mut out = unsafe { File::from_raw_fd(REPORT_FD) };
    serde_json::to_vec(report)
        .ok()
        .and_then(|json| out.write_all(&json).ok())
        .and_then(|()| out.write_all(trailer).ok())
        .is_some()
}

fn run(start: Instant, report: &mut JailReport) -> Result<(), SetupFailure> {
    // The report fd must not leak into the sandbox.
    set_cloexec(REPORT_FD).step(Step::MarkReportFdCloseOnExec)?;
    check_build().step(Step::CheckHelperBuild)?;
    // SAFETY: fd 0 is the request pipe from the server. ManuallyDrop keeps it open: what
    // remains after the request is the program's stdin, inherited as fd 0.
    let mut stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
    let (spec, files) = read_request(&mut *stdin).step(Step::ReadRequest)?;
    die_with_parent(spec.parent_pid).step(Step::TieHelperToServer)?;
    match spec.mode {
        Mode::Linux => linux::run(&spec, files, start, report),
        Mode::Process => process::run(&spec, files, start, report),
    }
}

/// The server names its build after `__jail`; a helper of another build (a `gearbox-jail`
/// left beside a newer or older `gearbox`) refuses to serve it.
fn check_build() -> std::io::Result<()> {
    let theirs = std::env::args_os().nth(2);
    if theirs.as_deref() == Some(std::ffi::OsStr::new(crate::HELPER_BUILD)) {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "this helper ({}) is build {}, the server is build {}: install gearbox and {} \
         together, or remove {} to use `gearbox __jail`",
        std::env::current_exe().unwrap_or_default().display(),
        crate::HELPER_BUILD,
        theirs.as_deref().unwrap_or_default().to_string_lossy(),
        crate::LEAN_HELPER,
        crate::LEAN_HELPER,
    )))
}

/// The built-in warm-pool launchers, by name.
pub(crate) fn launcher_script(name: &str) -> Option<&'static str> {
    match name {
        "python" => Some(include_str!("../launchers/python.py")),
        "python-live" => Some(include_str!("../launchers/python_live.py")),
        "node" => Some(include_str!("../launchers/node.js")),
        "node-live" => Some(include_str!("../launchers/node_live.js")),
        "python-zygote" => Some(include_str!("../launchers/python_zygote.py")),
        crate::fork_server::NODE_FORK_SERVER => Some(include_str!("../launchers/node_zygote.js")),
        _ => None,
    }
}

fn set_cloexec(fd: i32) -> std::io::Result<()> {
    // SAFETY: fcntl on an fd number has no memory-safety requirements.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Called once the run is over (its init reaped and its cgroup emptied, or, in `process`
/// mode, its process group killed), before the report: all the helper has left to do is
/// clean up after the run (remove its cgroup or its directory). The helper stops dying with
/// its caller, so that the clean-up happens even if the caller, which has all it needs
/// once the report is sent, is gone by then (`gearbox run` exits at once); and it lets go
/// of its stdout and stderr, the run's output pipes (the program inherited them), so that
/// the caller reads their end now instead of at the helper's exit.
pub(crate) fn release_caller() {
    // SAFETY: prctl(PR_SET_PDEATHSIG, 0) takes integers and touches no memory.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, 0 as libc::c_ulong) };
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null");
    for fd in [1, 2] {
        // SAFETY: dup2 and close on the helper's own stdout and stderr, which it never
        // writes to (its report goes to fd 3); `null` stays open until after the loop.
        unsafe {
            match &null {
                Ok(n) => libc::dup2(std::os::fd::AsRawFd::as_raw_fd(n), fd),
                Err(_) => libc::close(fd),
            }
        };
    }
}

/// Ask for SIGKILL when the parent dies, then check the parent did not die already.
pub(crate) fn die_with_parent(expected_parent: i32) -> std::io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and touches no memory.
    let r = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if expected_parent > 0 && nix::unistd::getppid().as_raw() != expected_parent {
        return Err(std::io::Error::other(
            "parent exited before the sandbox started",
        ));
    }
    Ok(())
}

/// Every signal's disposition back to its default and none blocked, as a program started by
/// a shell would find them: an ignored signal survives `execve`, and the helper's process
/// ignores SIGPIPE (Rust's runtime does), besides whatever the server inherited from its own
/// parent. Without this a shell pipeline's writer gets EPIPE instead of dying of SIGPIPE.
/// Raw `rt_sigaction`: the C library refuses to touch the signals it reserves (32 and 33),
/// which an ignoring parent may have set too.
pub(crate) fn reset_signals() {
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads a structure on this frame; no old action is written.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &default,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
    }
    let none: u64 = 0;
    // SAFETY: rt_sigprocmask reads an 8-byte mask on this frame.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none,
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    };
}
