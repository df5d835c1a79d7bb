//! The last steps before the program runs, in the program's own process: new session,
//! rlimits, capabilities dropped, Landlock, seccomp, then execve. Shared by both modes.

use std::ffi::CString;
use std::os::fd::OwnedFd;

use nix::sys::resource::{Resource, setrlimit};
use seccompiler::BpfProgram;

use super::message::Msg;
use std::os::fd::AsRawFd;

use gearbox_core::Limits;

use crate::restriction::{MESSAGE_QUEUE_BYTES, PENDING_SIGNALS};
use crate::step::{AtStep, Step, StepError};

/// Apply the program's own restrictions and exec it. Returns only on failure.
pub fn exec(
    argv: &[String],
    env: &[(String, String)],
    limits: &Limits,
    filters: &[BpfProgram],
    have_cgroup: bool,
    st_w: &OwnedFd,
    job_fd: Option<&OwnedFd>,
) -> StepError {
    match prepare_and_exec(argv, env, limits, filters, have_cgroup, st_w, job_fd) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

enum Never {}

fn prepare_and_exec(
    argv_s: &[String],
    env: &[(String, String)],
    limits: &Limits,
    filters: &[BpfProgram],
    have_cgroup: bool,
    st_w: &OwnedFd,
    job_fd: Option<&OwnedFd>,
) -> Result<Never, StepError> {
    let (path, argv, envp) = command(argv_s, env.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    nix::unistd::setsid().step(Step::NewSession)?;
    super::reset_signals();
    apply_rlimits(limits, have_cgroup)?;
    nix::unistd::chdir("/work").step(Step::EnterWorkspace)?;
    drop_capabilities().step(Step::DropCapabilities)?;
    // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes integers only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error()).step(Step::SetNoNewPrivs);
    }
    let mut applied = vec!["capabilities: none".to_string(), "no_new_privs".to_string()];
    applied.push(super::landlock::restrict().step(Step::Landlock)?);
    for f in filters {
        seccompiler::apply_filter(f).step(Step::InstallSeccompFilter)?;
    }
    applied.push(format!("seccomp: {} filters (allow list)", filters.len()));
    if !have_cgroup {
        let f = super::memwatch::unaccounted_memory_filter().step(Step::CompileMemoryFilter)?;
        seccompiler::apply_filter(&f).step(Step::InstallMemoryFilter)?;
        applied.push("seccomp: memfd_create, shmget and msgget refused (no memory cgroup)".into());
    }
    Msg::Applied {
        mechanisms: applied,
    }
    .send(st_w);
    // A launcher reads its program from fd 3; every other inherited fd above stderr closes
    // at exec.
    let mut first_closed = 3u32;
    if let Some(fd) = job_fd {
        // SAFETY: dup2 onto fd 3 of this process, then clear CLOEXEC on it (dup2 onto the
        // same number is a no-op that keeps the flag).
        if unsafe { libc::dup2(fd.as_raw_fd(), 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 } {
            return Err(std::io::Error::last_os_error()).step(Step::PassJobPipe);
        }
        first_closed = 4;
    }
    close_on_exec_from(first_closed);
    Err(execve(&path, &argv, &envp))
}

/// A command to `execve`: its path (argv[0], which the caller resolved), argv and
/// environment as C strings.
pub(super) type Command = (CString, Vec<CString>, Vec<CString>);

/// `argv` and `env` as a [`Command`]; an empty argv or a NUL inside fails its step.
pub(super) fn command<'a>(
    argv: &[String],
    env: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<Command, StepError> {
    let argv = argv
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .step(Step::PrepareArgv)?;
    let envp = env
        .map(|(k, v)| CString::new(format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()
        .step(Step::PrepareEnvironment)?;
    let path = argv
        .first()
        .cloned()
        .ok_or_else(|| StepError::new(Step::PrepareArgv, "empty command"))?;
    Ok((path, argv, envp))
}

/// Mark every fd from `first` up close-on-exec.
pub(super) fn close_on_exec_from(first: u32) {
    // SAFETY: close_range with CLOEXEC only sets flags on fds of this process.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
}

/// `execve` the command; returns only if it failed, as the [`Step::Execve`] error.
pub(super) fn execve(path: &CString, argv: &[CString], envp: &[CString]) -> StepError {
    let err = nix::unistd::execve(path, argv, envp).err();
    StepError::new(
        Step::Execve,
        format!(
            "{}: {}",
            path.to_string_lossy(),
            err.map(|e| e.desc()).unwrap_or("failed")
        ),
    )
}

pub fn apply_rlimits(l: &Limits, have_cgroup: bool) -> Result<(), StepError> {
    let mib = 1024 * 1024;
    let cpu_s = l.cpu_rlimit_secs();
    let set = |r: Resource, soft: u64, hard: u64, name: &'static str| {
        setrlimit(r, soft, hard).step(Step::Rlimit(name))
    };
    set(Resource::RLIMIT_CORE, 0, 0, "core")?;
    set(
        Resource::RLIMIT_NOFILE,
        l.open_files,
        l.open_files,
        "nofile",
    )?;
    set(
        Resource::RLIMIT_FSIZE,
        l.file_size_mb * mib,
        l.file_size_mb * mib,
        "fsize",
    )?;
    set(Resource::RLIMIT_CPU, cpu_s, cpu_s + 1, "cpu")?;
    set(Resource::RLIMIT_NPROC, l.pids, l.pids, "nproc")?;
    // Per-user counters, counted in the run's own user namespace.
    let (signals, queues) = (PENDING_SIGNALS, MESSAGE_QUEUE_BYTES);
    set(Resource::RLIMIT_SIGPENDING, signals, signals, "sigpending")?;
    set(Resource::RLIMIT_MSGQUEUE, queues, queues, "msgqueue")?;
    if !have_cgroup {
        // Without a memory cgroup, cap private writable memory. RLIMIT_AS would break Node
        // and Go, which reserve large address ranges without touching them.
        set(
            Resource::RLIMIT_DATA,
            l.memory_mb * mib,
            l.memory_mb * mib,
            "data",
        )?;
    }
    Ok(())
}

/// Empty the bounding and ambient sets and every capability set of this process.
pub(super) fn drop_capabilities() -> std::io::Result<()> {
    drop_bounding_set();
    // SAFETY: integers only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    capset(0, 0)
}

/// Empty the bounding set (needs CAP_SETPCAP; EINVAL past the kernel's last cap ends it).
pub(super) fn drop_bounding_set() {
    for cap in 0..64 {
        // SAFETY: prctl(PR_CAPBSET_DROP, n) takes integers.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } != 0 {
            break;
        }
    }
}

/// Set this process's effective and permitted capability sets to `caps` and its inheritable
/// set to `inheritable` (bit n: capability n).
pub(super) fn capset(caps: u64, inheritable: u64) -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let half = |shift: u32| Data {
        effective: (caps >> shift) as u32,
        permitted: (caps >> shift) as u32,
        inheritable: (inheritable >> shift) as u32,
    };
    let data = [half(0), half(32)];
    // SAFETY: capset reads a v3 header and two data structs that live on this stack frame.
    if unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
