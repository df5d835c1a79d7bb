//! Pid 1 of the sandbox: wait for the helper's go, build the root, start the program, reap
//! every orphan, report the program's exit. When init exits the kernel kills whatever is
//! left in the pid namespace, so nothing the program started outlives it.

use std::os::fd::OwnedFd;

use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork};

use nix::sys::wait::WaitStatus;
use seccompiler::BpfProgram;

use super::message::{GO_BUILD, GO_RUN_CGROUP, GO_RUN_RLIMITS, Msg};
use super::prestart::Prestart;
use super::{SANDBOX_ID, mount, program};
use crate::step::{AtStep, Step, StepError};
use crate::wire::{JailSpec, Pooled, read_handover};

/// The nice value a fork server and the sandboxes it builds run at until a run is handed
/// over: building the pool's next sandbox, and a finished run's teardown, yield the CPU to
/// requests (set before the fork server's exec; the server gives a run's program the normal
/// priority at hand-over, see `fork_server.rs`).
const BUILD_NICE: i32 = 10;

pub fn main(
    spec: &JailSpec,
    env: &[(String, String)],
    files: Vec<Vec<u8>>,
    go: OwnedFd,
    st_w: OwnedFd,
    filters: &[BpfProgram],
) -> ! {
    // Our copy of the report fd must not stay open in the sandbox.
    // SAFETY: closing an fd number we do not otherwise use in this process.
    unsafe { libc::close(crate::wire::REPORT_FD) };
    if super::die_with_parent(0).is_err() {
        exit(1);
    }
    // Wait for the helper: id maps written. EOF means it died.
    let mut byte = [0u8; 1];
    if !matches!(nix::unistd::read(&go, &mut byte), Ok(1)) || byte[..] != *GO_BUILD {
        exit(1);
    }
    let t0 = std::time::Instant::now();
    // The mounts first, while the helper creates the run's cgroup; then into the cgroup
    // (v1: through the `tasks` files that come with the go, see `Cgroup::open_tasks`)
    // before anything a request brings is written, so that its files are charged to the run.
    let have_cgroup = match setup(spec, &go, files) {
        Ok(have_cgroup) => have_cgroup,
        Err(e) => fail(&st_w, e),
    };
    drop(go);
    // A cgroup namespace rooted at the run's own cgroup (joined just now), so the program
    // sees "/" and nothing of the host's cgroup tree.
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP) {
        fail(
            &st_w,
            StepError::new(Step::NewCgroupNamespace, e.to_string()),
        );
    }
    if let Some(socket) = &spec.egress
        && let Err(e) = super::relay::start(socket, filters)
    {
        fail(&st_w, e);
    }
    let run = match &spec.pooled {
        None => start_cold(spec, env, filters, have_cgroup, &st_w, t0),
        Some(pool) if pool.fork_server => start_fork_server(spec, pool, env, &st_w, t0),
        Some(pool) => start_pooled(spec, pool, env, filters, have_cgroup, &st_w, t0),
    };
    let child = match run {
        Ok(child) => child,
        Err(e) => fail(&st_w, e),
    };
    let status = loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(s) if s.pid() == Some(child) => break s,
            Ok(_) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => exit(1),
        }
    };
    let (code, signal) = split_status(status);
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
    let (cpu_time_ms, max_rss_kb) = usage
        .map(|u| {
            let tv = |t: nix::sys::time::TimeVal| {
                (t.tv_sec() as u64) * 1000 + (t.tv_usec() as u64) / 1000
            };
            (tv(u.user_time()) + tv(u.system_time()), u.max_rss() as u64)
        })
        .unwrap_or((0, 0));
    Msg::Exited {
        code,
        signal,
        cpu_time_ms,
        max_rss_kb,
    }
    .send(&st_w);
    if let Some(limits) = &spec.collect {
        collect_workspace(limits, &st_w);
    } else if spec.outputs && gearbox_core::tree::dir_has_entries(std::path::Path::new(OUTPUTS)) {
        collect_outputs(&st_w);
    }
    exit(0);
}

/// The directory of a run's outputs.
const OUTPUTS: &str = "/work/outputs";

/// Stop every other process of the pid namespace and reap it: nothing may change the tree
/// while it is read.
fn stop_the_rest() {
    let _ = nix::sys::signal::kill(Pid::from_raw(-1), nix::sys::signal::Signal::SIGKILL);
    while let Ok(_) | Err(nix::errno::Errno::EINTR) = waitpid(None, Some(WaitPidFlag::__WALL)) {}
}

/// After the program of a run without a session, when `/work/outputs` holds anything: stop
/// the rest, then send its regular files as frames after the `Exited` line, within
/// `OUTPUT_LIMITS` (a file past them is skipped with a note). Never follows a symlink.
fn collect_outputs(st_w: &OwnedFd) {
    use std::io::Write;
    use std::os::fd::AsFd;
    stop_the_rest();
    let Ok(fd) = st_w.try_clone() else { exit(1) };
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::fs::File::from(fd));
    let sent = gearbox_core::tree::open_dir(std::path::Path::new(OUTPUTS))
        .and_then(|root| gearbox_core::tree::collect_outputs_into(root.as_fd(), &mut out))
        .and_then(|_| out.flush());
    if sent.is_err() {
        exit(1);
    }
}

/// After the program: stop every process left in the namespace (nothing may change the tree
/// while it is read), then send the helper `/work`'s regular files as frames after the
/// `Exited` line. The walk never follows a symlink (see `gearbox_core::tree`). On an error
/// the stream stays incomplete, which the server reports.
fn collect_workspace(limits: &gearbox_core::CollectLimits, st_w: &OwnedFd) {
    use std::io::Write;
    use std::os::fd::AsFd;
    stop_the_rest();
    let Ok(fd) = st_w.try_clone() else { exit(1) };
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, std::fs::File::from(fd));
    let sent = gearbox_core::tree::open_dir(std::path::Path::new("/work"))
        .and_then(|root| gearbox_core::tree::collect_into(root.as_fd(), limits, &mut out))
        .and_then(|_| out.flush());
    if sent.is_err() {
        exit(1);
    }
}

/// Fork the program and exec it; in the child this never returns.
fn fork_program(
    argv: &[String],
    env: &[(String, String)],
    limits: &gearbox_core::Limits,
    filters: &[BpfProgram],
    have_cgroup: bool,
    st_w: &OwnedFd,
    job_fd: Option<&OwnedFd>,
) -> Result<Pid, StepError> {
    // SAFETY: init is single-threaded (a fork of the single-threaded helper).
    match unsafe { fork() } {
        Err(e) => Err(StepError::new(Step::ForkProgram, e.to_string())),
        Ok(ForkResult::Child) => {
            let err = program::exec(argv, env, limits, filters, have_cgroup, st_w, job_fd);
            Msg::failed(err).send(st_w);
            exit(127);
        }
        Ok(ForkResult::Parent { child }) => Ok(child),
    }
}

fn start_cold(
    spec: &JailSpec,
    env: &[(String, String)],
    filters: &[BpfProgram],
    have_cgroup: bool,
    st_w: &OwnedFd,
    t0: std::time::Instant,
) -> Result<Pid, StepError> {
    let child = fork_program(
        &spec.argv,
        env,
        &spec.limits,
        filters,
        have_cgroup,
        st_w,
        None,
    )?;
    Msg::Started {
        init_us: t0.elapsed().as_micros() as u64,
    }
    .send(st_w);
    Ok(child)
}

/// A warm sandbox: everything is built (and the launcher, if the language has one, is
/// started) before the request exists. Init then waits on fd 0 for the hand-over, writes the
/// program's files, and hands the program over; the program's time starts there.
fn start_pooled(
    spec: &JailSpec,
    pool: &Pooled,
    env: &[(String, String)],
    filters: &[BpfProgram],
    have_cgroup: bool,
    st_w: &OwnedFd,
    t0: std::time::Instant,
) -> Result<Pid, StepError> {
    let launcher = match &pool.launcher {
        Some((_, argv)) => {
            let (job_r, job_w) =
                nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).step(Step::CreateJobPipe)?;
            let child = fork_program(
                argv,
                env,
                &spec.limits,
                filters,
                have_cgroup,
                st_w,
                Some(&job_r),
            )?;
            Some((child, job_w))
        }
        None => None,
    };
    // Bash started before its run (`prestart.rs`), reading its start-up from fd 3. Not for
    // granted runs: their proxy's variables differ per run.
    let prestarted = match (&pool.launcher, &spec.egress) {
        (None, None) => Prestart::for_runs(&spec.argv, env, &spec.limits)
            .map(|p| {
                let (start_r, start_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                    .step(Step::CreateStartUpPipe)?;
                let (argv, env) = p.command(3);
                let child = fork_program(
                    argv,
                    &env,
                    &spec.limits,
                    filters,
                    have_cgroup,
                    st_w,
                    Some(&start_r),
                )?;
                Ok::<_, StepError>((p, child, start_w))
            })
            .transpose()?,
        _ => None,
    };
    Msg::Ready {
        root_us: t0.elapsed().as_micros() as u64,
    }
    .send(st_w);
    // SAFETY: fd 0 is the request pipe; ManuallyDrop keeps it open for the program.
    let mut stdin = std::mem::ManuallyDrop::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(0)
    });
    let (handover, files) = read_handover(&mut *stdin).step(Step::ReadHandOver)?;
    let handed = std::time::Instant::now();
    mount::write_files(std::path::Path::new("/work"), &handover.files, &files)?;
    let env =
        crate::wire::with_display_env(crate::wire::program_env(&handover.env, "/work", "/tmp"));
    match launcher {
        Some((child, job_w)) => {
            // `command`: what the interpreter would have been started with (Python's
            // `sys.orig_argv`); the launcher's own command line is what the process keeps.
            let job = serde_json::json!({
                "argv": handover.program_argv,
                "command": handover.argv,
                "env": env.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
            });
            Msg::Started {
                init_us: handed.elapsed().as_micros() as u64,
            }
            .send(st_w);
            let bytes = serde_json::to_vec(&job).step(Step::EncodeJob)?;
            let mut f = std::fs::File::from(job_w);
            std::io::Write::write_all(&mut f, &bytes).step(Step::HandOverToLauncher)?;
            Ok(child)
        }
        None => {
            if let Some((p, child, start_w)) = prestarted {
                let vars = env.iter().cloned().collect();
                let alive = matches!(
                    waitpid(child, Some(WaitPidFlag::WNOHANG)),
                    Ok(WaitStatus::StillAlive)
                );
                if let Some(args) = p.args_of(&handover, &vars).filter(|_| alive) {
                    Msg::Started {
                        init_us: handed.elapsed().as_micros() as u64,
                    }
                    .send(st_w);
                    // A bash that died since fails the write (this process ignores
                    // SIGPIPE: the helper is a Rust program), and its exit is reported.
                    let mut pipe = std::fs::File::from(start_w);
                    let _ = std::io::Write::write_all(&mut pipe, p.start_up(args, 3).as_bytes());
                    return Ok(child);
                }
                // Not the run bash was started for, or bash is gone: a fresh program takes it.
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(child, None);
            }
            let child = fork_program(
                &handover.argv,
                &env,
                &spec.limits,
                filters,
                have_cgroup,
                st_w,
                None,
            )?;
            Msg::Started {
                init_us: handed.elapsed().as_micros() as u64,
            }
            .send(st_w);
            Ok(child)
        }
    }
}

/// A fork server: the launcher, started with the server's control socket on fd 4 and only
/// the capabilities it needs to build per-run namespaces
/// (ambient, so they survive exec; all inside this sandbox's user namespace). It runs no
/// program itself; each run it forks drops every capability and applies the same rlimits,
/// Landlock rules and seccomp filters as [`program::exec`] before reading its program.
/// The exec fork server ([`super::exec_zygote`]) is the same loop without the exec.
fn start_fork_server(
    spec: &JailSpec,
    pool: &Pooled,
    env: &[(String, String)],
    st_w: &OwnedFd,
    t0: std::time::Instant,
) -> Result<Pid, StepError> {
    let Some((name, argv)) = &pool.launcher else {
        return Err(StepError::new(
            Step::StartForkServer,
            "a fork server needs a launcher",
        ));
    };
    // The exec fork server runs this binary's own code: no interpreter to exec.
    let command = (name != crate::fork_server::EXEC_FORK_SERVER)
        .then(|| program::command(argv, env.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
        .transpose()?;
    // SAFETY: init is single-threaded (a fork of the single-threaded helper).
    match unsafe { fork() }.step(Step::ForkForkServer)? {
        ForkResult::Child => {
            let err = match &command {
                None => {
                    let prestart = Prestart::for_runs(&spec.argv, env, &spec.limits);
                    super::exec_zygote::serve(&spec.limits, BUILD_NICE, prestart)
                }
                Some((path, argv, envp)) => exec_fork_server(path, argv, envp),
            };
            fail(st_w, StepError::new(Step::StartForkServer, err.to_string()));
        }
        ForkResult::Parent { child } => {
            Msg::Ready {
                root_us: t0.elapsed().as_micros() as u64,
            }
            .send(st_w);
            Ok(child)
        }
    }
}

fn exec_fork_server(
    path: &std::ffi::CString,
    argv: &[std::ffi::CString],
    envp: &[std::ffi::CString],
) -> std::io::Error {
    // SAFETY: fcntl/close_range on fd numbers of this process: everything above stderr but
    // the control socket closes at exec.
    unsafe {
        if libc::fcntl(crate::wire::FORK_SERVER_FD, libc::F_SETFD, 0) < 0 {
            return std::io::Error::last_os_error();
        }
        libc::syscall(libc::SYS_close_range, 3u32, 3u32, libc::CLOSE_RANGE_CLOEXEC);
    }
    program::close_on_exec_from(crate::wire::FORK_SERVER_FD as u32 + 1);
    if let Err(e) = super::exec_zygote::keep_fork_server_caps(true) {
        return e;
    }
    // SAFETY: setpriority takes integers.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, BUILD_NICE) } != 0 {
        return std::io::Error::last_os_error();
    }
    // The interpreter starts as a cold run's does, every signal at its default: an ignored
    // one survives `execve` and every fork, and the helper's process ignores some (SIGPIPE,
    // and, as measured in the static helper, the C library's reserved 32 and 33).
    super::reset_signals();
    match nix::unistd::execve(path, argv, envp) {
        Err(e) => e.into(),
        Ok(never) => match never {},
    }
}

/// Become the sandbox user (keeping capabilities inside the namespace), then build the root:
/// its mounts, then (once the helper's second go says whether there is a cgroup, and init
/// has joined it) the request's files and the switch to the new root. Returns whether the
/// program's memory is capped by a cgroup.
fn setup(spec: &JailSpec, go: &OwnedFd, files: Vec<Vec<u8>>) -> Result<bool, StepError> {
    let id = SANDBOX_ID;
    nix::unistd::setresgid(Gid::from_raw(id), Gid::from_raw(id), Gid::from_raw(id))
        .step(Step::BecomeSandboxGroup)?;
    nix::unistd::setresuid(Uid::from_raw(id), Uid::from_raw(id), Uid::from_raw(id))
        .step(Step::BecomeSandboxUser)?;
    // Changing credentials clears the parent-death signal: set it again, so that a helper
    // killed from now on still takes init (and with it the whole pid namespace) along.
    super::die_with_parent(0).step(Step::TieInitToHelper)?;
    let mounts = mount::build_mounts(spec)?;
    let (byte, tasks) = recv_go(go).step(Step::JoinCgroup)?;
    let have_cgroup = match &byte[..] {
        b if b == GO_RUN_CGROUP => true,
        b if b == GO_RUN_RLIMITS => false,
        // EOF or anything else: the helper died or failed.
        _ => exit(1),
    };
    // The helper opened the `tasks` files: the kernel checks its credentials, not ours.
    crate::cgroup::join_self(&tasks).map_err(|e| StepError::new(Step::JoinCgroup, e))?;
    drop(tasks);
    mount::finish_root(spec, mounts, &files)?;
    nix::unistd::sethostname(crate::restriction::HOSTNAME).step(Step::SetHostname)?;
    loopback_up().step(Step::BringUpLoopback)?;
    Ok(have_cgroup)
}

/// The helper's second go byte and the descriptors sent with it (none at EOF).
fn recv_go(go: &OwnedFd) -> std::io::Result<([u8; 1], Vec<OwnedFd>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut byte = [0u8; 1];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 8]);
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let msg = recvmsg::<()>(
        go.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel just installed these descriptors in this process for us.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    Ok((byte, fds))
}

fn fail(st_w: &OwnedFd, e: StepError) -> ! {
    Msg::failed(e).send(st_w);
    exit(1)
}

fn exit(code: i32) -> ! {
    // SAFETY: _exit ends the process without running atexit handlers or destructors that
    // belong to the helper we were forked from.
    unsafe { libc::_exit(code) }
}

/// `ip link set lo up` in the new network namespace.
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket(2) call; the fd is closed below.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own.
    let res = unsafe {
        if libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req) < 0 {
            -1
        } else {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(sock, libc::SIOCSIFFLAGS, &req)
        }
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: closing the socket we opened.
    unsafe { libc::close(sock) };
    if res < 0 { Err(err) } else { Ok(()) }
}

/// Turn a wait status into (exit code, signal).
pub fn split_status(status: WaitStatus) -> (Option<i32>, Option<i32>) {
    match status {
        WaitStatus::Exited(_, code) => (Some(code), None),
        WaitStatus::Signaled(_, sig, _) => (None, Some(sig as i32)),
        _ => (None, None),
    }
}
