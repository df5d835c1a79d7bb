//! The helper's side of a `linux` sandbox: clone init into new namespaces, give it an id
//! map and a cgroup, release it, enforce the deadline, collect what happened.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::{Gid, Pid, Uid, pipe2};

use super::memwatch::{self, MemoryWatch};
use super::message::{GO_BUILD, GO_RUN_CGROUP, GO_RUN_RLIMITS, Msg};
use super::{NOBODY, SANDBOX_ID, init, seccomp};
use crate::cgroup::Cgroup;
use crate::step::{AtStep, Step, StepError};
use crate::wire::{JailReport, JailSpec, SetupFailure};

/// How long building the sandbox may take before the helper gives up.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long init may take to send the workspace after the program exited.
const COLLECT_TIMEOUT: Duration = Duration::from_secs(20);

pub fn run(
    spec: &JailSpec,
    files: Vec<Vec<u8>>,
    start: Instant,
    report: &mut JailReport,
) -> Result<(), SetupFailure> {
    let root = Uid::current().is_root();
    let (outer_uid, outer_gid) = if root {
        (NOBODY, NOBODY)
    } else {
        (Uid::current().as_raw(), Gid::current().as_raw())
    };
    if root {
        // Supplementary groups would follow the program into the sandbox.
        nix::unistd::setgroups(&[]).step(Step::DropSupplementaryGroups)?;
    }
    let mark = |report: &mut JailReport, what: &str| {
        report
            .timings
            .push((what.to_string(), start.elapsed().as_micros() as u64));
    };
    mark(report, "request read");
    let filters = seccomp::compile().step(Step::LoadSeccompFilters)?;
    mark(report, "seccomp filters loaded");
    let env = crate::wire::with_display_env(crate::wire::program_env(&spec.env, "/work", "/tmp"));
    // The go messages travel on a socket: the second carries the cgroup's `tasks` files.
    let (go_init, go) = UnixStream::pair().step(Step::CreateSyncPipe)?;
    let (st_r, st_w) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).step(Step::CreateStatusPipe)?;

    // A network namespace of its own for every run, granted or not: the host's stack, its
    // loopback services and abstract sockets are never in reach. A granted run reaches out
    // only through the egress proxy relayed onto its own loopback (`relay.rs`).
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWNET;
    // SAFETY: the helper is single-threaded, so a clone without CLONE_VM is a fork: the child
    // gets a copy of this address space and may allocate. A null stack means "same stack
    // pointer, copied", exactly as fork(2).
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        return Err(StepError::new(Step::CloneIntoNewNamespaces, e.to_string()).into());
    }
    if pid == 0 {
        drop(go);
        drop(st_r);
        init::main(spec, &env, files, OwnedFd::from(go_init), st_w, &filters);
    }
    let init_pid = Pid::from_raw(pid as i32);
    mark(report, "cloned");
    drop(go_init);
    drop(st_w);

    // Init builds the mounts of its root while we create its cgroup; it waits for the second
    // go before it writes anything a request brings (`init::main`). On v1 the go carries the
    // open `tasks` files and init moves itself in (`Cgroup::open_tasks`: no RCU wait, no
    // host-wide stall of forks); elsewhere we move it, which may wait for an RCU grace
    // period (milliseconds) and so overlaps the mounts too.
    let mut cgroup = None;
    let released = (|| -> Result<(), StepError> {
        write_id_maps(init_pid, outer_uid, outer_gid)?;
        (&go).write_all(GO_BUILD).step(Step::ReleaseInit)?;
        mark(report, "released");
        let mut tasks = Vec::new();
        if root {
            let made = Cgroup::create(&spec.limits).and_then(|cg| {
                match cg.open_tasks() {
                    Some(Ok(files)) => tasks = files,
                    // A `tasks` file that cannot be opened: we move init instead.
                    _ => cg.attach(init_pid.as_raw())?,
                }
                Ok(cg)
            });
            match made {
                Ok(cg) => {
                    report.enforced.extend(cg.describe());
                    cgroup = Some(cg);
                }
                Err(e) => report.enforced.push(format!("cgroup: unavailable ({e})")),
            }
        }
        mark(report, "cgroup joined");
        let go_run = if cgroup.is_some() {
            GO_RUN_CGROUP
        } else {
            GO_RUN_RLIMITS
        };
        send_go(&go, go_run, &tasks).step(Step::StartProgram)
    })();
    if let Err(e) = released {
        let _ = kill(init_pid, Signal::SIGKILL);
        let _ = waitpid(init_pid, None);
        return Err(e.into());
    }
    report.enforced.push(format!(
        "namespaces: user (uid {SANDBOX_ID} -> host {outer_uid}), mount, pid, ipc, uts, cgroup, net{}",
        if spec.egress.is_some() {
            " (loopback, egress proxy at 127.0.0.1:3128)"
        } else {
            " (loopback only)"
        }
    ));

    let max_trailer = spec.collect.map(|l| l.max_stream_bytes()).or(spec
        .outputs
        .then(|| gearbox_core::OUTPUT_LIMITS.max_stream_bytes()));
    // Without a memory cgroup the helper measures the whole run itself (`memwatch.rs`).
    let mut memory = cgroup
        .is_none()
        .then(|| MemoryWatch::new(init_pid.as_raw(), spec.limits.memory_mb));
    let mut watch = watch(
        &st_r,
        spec.limits.timeout_ms,
        start,
        report,
        max_trailer,
        memory.as_mut(),
    );
    if spec.collect.is_some()
        && watch.exited
        && watch.trailer.is_empty()
        && report.collect_error.is_none()
    {
        report.collect_error = Some("the sandbox sent no workspace".into());
    }
    if watch.timed_out
        || watch.over_memory
        || watch.failed.is_some()
        || !watch.exited
        || report.collect_error.is_some()
    {
        // Killing init makes the kernel kill every process of its pid namespace.
        let _ = kill(init_pid, Signal::SIGKILL);
    }
    let init_status = waitpid(init_pid, None);
    if let Some(cg) = &cgroup {
        cg.kill_all();
        report.oom_killed = cg.oom_killed();
        if let Some(kb) = cg.peak_memory_kb() {
            report.peak_memory_kb = Some(kb);
        }
        if let Some(ms) = cg.cpu_time_ms() {
            report.cpu_time_ms = Some(ms);
        }
    }
    if let Some(m) = &memory {
        report.memory_sampled = true;
        report.oom_killed = watch.over_memory;
        // The sampled peak of the whole run (never below the largest single process).
        report.peak_memory_kb = m
            .measured
            .then(|| m.peak_kb.max(report.peak_memory_kb.unwrap_or(0)));
    }
    mark(report, "reaped");
    if let Some(e) = watch.failed {
        return Err(e);
    }
    if !watch.exited && !watch.timed_out && !watch.over_memory {
        return Err(StepError::new(
            Step::WaitForProgram,
            format!("init ended without a report ({init_status:?})"),
        )
        .into());
    }
    // The caller has all it needs: answer first, then remove the cgroup (rmdir of a memory
    // cgroup can take milliseconds), which no longer holds the caller up.
    let trailer = std::mem::take(&mut watch.trailer);
    super::release_caller();
    super::send_report(report, &trailer);
    drop(cgroup);
    Ok(())
}

/// Send init a go byte, with `fds` (the cgroup's `tasks` files) attached.
fn send_go(go: &UnixStream, byte: &[u8], fds: &[OwnedFd]) -> std::io::Result<()> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let raw: Vec<std::os::fd::RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &rights };
    sendmsg::<()>(
        go.as_raw_fd(),
        &[std::io::IoSlice::new(byte)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    Ok(())
}

/// Write setgroups, gid_map and uid_map of the new user namespace.
fn write_id_maps(pid: Pid, outer_uid: u32, outer_gid: u32) -> Result<(), StepError> {
    let base = format!("/proc/{}", pid.as_raw());
    let write = |file: &'static str, content: String| -> Result<(), StepError> {
        File::options()
            .write(true)
            .open(format!("{base}/{file}"))
            .and_then(|mut f| f.write_all(content.as_bytes()))
            .step(Step::WriteIdMap(file))
    };
    write("setgroups", "deny".into())?;
    write("gid_map", format!("{SANDBOX_ID} {outer_gid} 1\n"))?;
    write("uid_map", format!("{SANDBOX_ID} {outer_uid} 1\n"))?;
    Ok(())
}

#[derive(Default)]
struct Watch {
    exited: bool,
    timed_out: bool,
    /// The sampled memory of the run passed its limit (no cgroup).
    over_memory: bool,
    /// A step that failed: the helper's own, or one init or the program reported.
    failed: Option<SetupFailure>,
    /// The collected workspace: every byte init sent after its `Exited` line.
    trailer: Vec<u8>,
}

/// Read init's messages until it closes the pipe or the deadline passes. With `max_trailer`
/// (a collecting run) the bytes after `Exited` are the workspace, at most that many. With
/// `memory`, the running program is measured every [`memwatch::INTERVAL`] and stopped past
/// its limit.
fn watch(
    st_r: &OwnedFd,
    timeout_ms: u64,
    start: Instant,
    report: &mut JailReport,
    max_trailer: Option<u64>,
    mut memory: Option<&mut MemoryWatch>,
) -> Watch {
    let mut w = Watch::default();
    // A duplicate fd for reading; the original stays with the caller for poll.
    let mut file = match st_r.try_clone() {
        Ok(fd) => File::from(fd),
        Err(e) => {
            w.failed = Some(StepError::new(Step::Watch, e.to_string()).into());
            return w;
        }
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut started: Option<Instant> = None;
    let mut ready = false;
    let mut collecting: Option<Instant> = None;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut next_sample = Instant::now();
    loop {
        let sampling = started.is_some() && !w.exited;
        if let Some(m) = memory.as_deref_mut().filter(|_| sampling)
            && Instant::now() >= next_sample
        {
            next_sample = Instant::now() + memwatch::INTERVAL;
            if m.sample() {
                w.over_memory = true;
                report.duration_us = duration_us(started);
                return w;
            }
        }
        let deadline = match (collecting, started) {
            (Some(c), _) => c + COLLECT_TIMEOUT,
            (None, Some(s)) => s + Duration::from_millis(timeout_ms),
            // A warm sandbox waits for its program as long as the pool keeps it.
            (None, None) if ready => Instant::now() + Duration::from_secs(3600),
            (None, None) => start + SETUP_TIMEOUT,
        };
        let now = Instant::now();
        if now >= deadline {
            if collecting.is_some() {
                w.trailer.clear();
                report.collect_error = Some(format!(
                    "sending the workspace took longer than {COLLECT_TIMEOUT:?}"
                ));
            } else if started.is_some() {
                w.timed_out = true;
                report.timed_out = true;
                report.duration_us = duration_us(started);
            } else {
                w.failed = Some(
                    StepError::new(
                        Step::BuildSandbox,
                        format!("took longer than {SETUP_TIMEOUT:?}"),
                    )
                    .into(),
                );
            }
            return w;
        }
        let mut left = deadline - now;
        if memory.is_some() && sampling {
            left = left.min(next_sample.saturating_duration_since(now));
        }
        let ms = u16::try_from(left.as_millis().min(60_000)).unwrap_or(60_000);
        let mut fds = [PollFd::new(st_r.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms.max(1))) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                w.failed = Some(StepError::new(Step::Watch, e.to_string()).into());
                return w;
            }
        }
        let n = match file.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => 0,
        };
        if n == 0 {
            return w;
        }
        if collecting.is_some() {
            w.trailer.extend_from_slice(&chunk[..n]);
            if w.trailer.len() as u64 > max_trailer.unwrap_or(0) {
                w.trailer.clear();
                report.collect_error =
                    Some("the workspace stream is larger than its limits allow".into());
                return w;
            }
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
        while collecting.is_none()
            && let Some(pos) = buf.iter().position(|&b| b == b'\n')
        {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let Ok(msg) = serde_json::from_slice::<Msg>(&line) else {
                continue;
            };
            match msg {
                Msg::Ready { root_us } => {
                    report
                        .timings
                        .push(("init: warm and waiting".into(), root_us));
                    ready = true;
                }
                Msg::Started { init_us } => {
                    let now = Instant::now();
                    started = Some(now);
                    if ready {
                        // Hand-over to start: what a warm run waits for.
                        report.setup_us = init_us;
                    } else {
                        report.timings.push(("init: root built".into(), init_us));
                        report.setup_us = now.duration_since(start).as_micros() as u64;
                    }
                }
                Msg::Applied { mechanisms } => report.enforced.extend(mechanisms),
                Msg::Failed { step, message } => {
                    w.failed = Some(SetupFailure { step, message });
                }
                Msg::Exited {
                    code,
                    signal,
                    cpu_time_ms,
                    max_rss_kb,
                } => {
                    report.duration_us = duration_us(started);
                    report.exit_code = code;
                    report.signal = signal;
                    report.cpu_time_ms = Some(cpu_time_ms);
                    report.peak_memory_kb = Some(max_rss_kb);
                    w.exited = true;
                    if max_trailer.is_some() {
                        collecting = Some(Instant::now());
                        w.trailer = std::mem::take(&mut buf);
                    }
                }
            }
        }
    }
}

fn duration_us(started: Option<Instant>) -> u64 {
    started.map(|s| s.elapsed().as_micros() as u64).unwrap_or(0)
}
