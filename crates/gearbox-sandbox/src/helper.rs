//! The server's side of the helper: spawn it, feed it the job, read the program's output
//! while it runs, and turn the helper's report into an outcome.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gearbox_core::{
    CollectLimits, Collected, Job, Outcome, ResourceUsage, SandboxError, Status, read_capped_until,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wire::{
    HandOver, JailReport, JailSpec, Mode, Pooled, REPORT_FD, encode_handover, encode_header,
};

/// Time the helper may take beyond the run's own timeout (set-up and teardown) before the
/// server kills it.
const HELPER_GRACE: Duration = Duration::from_secs(30);
/// How long output is still read after the program's exit was reported (an escaped
/// descendant may hold the pipes).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

/// Readers of a run's stdout and stderr, each capped at `cap` bytes, that keep reading until
/// the sender is told the program exited and [`DRAIN_AFTER_EXIT`] more (an escaped
/// descendant may hold the pipes). Shared by the helper's runs and the fork server's.
pub(crate) fn output_readers<O, E>(
    stdout: O,
    stderr: E,
    cap: u64,
) -> (
    tokio::sync::watch::Sender<bool>,
    impl std::future::Future<Output = gearbox_core::CappedOutput>,
    impl std::future::Future<Output = gearbox_core::CappedOutput>,
)
where
    O: tokio::io::AsyncRead + Unpin,
    E: tokio::io::AsyncRead + Unpin,
{
    let (exited_tx, exited_rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
        tokio::time::sleep(DRAIN_AFTER_EXIT).await;
    };
    let out = read_capped_until(stdout, cap, stop(exited_rx.clone()));
    let err = read_capped_until(stderr, cap, stop(exited_rx));
    (exited_tx, out, err)
}

/// A helper process, started with `posix_spawn` (below) and waited for through a pidfd:
/// killed when dropped (a cancelled call, a failed or abandoned run) until
/// [`HelperProcess::release`] says its run is over. Dropped unreaped, it is reaped by a
/// task of the runtime it was started on.
pub(crate) struct HelperProcess {
    pid: i32,
    pidfd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    status: Option<std::process::ExitStatus>,
    armed: bool,
}

impl HelperProcess {
    fn new(pid: i32) -> std::io::Result<HelperProcess> {
        // The pid is an unreaped child of this process: it names the helper until reaped.
        let pidfd = pidfd_open(pid)?;
        Ok(HelperProcess {
            pid,
            // SAFETY: the pidfd is open and owned by the AsyncFd for its whole life.
            pidfd: Some(unsafe { tokio::io::unix::AsyncFd::register(pidfd) }?),
            status: None,
            armed: true,
        })
    }

    /// The run is over and reported: the helper only cleans up after it now, and does so
    /// even when its caller is gone (`jail::release_caller`), so it is no longer killed;
    /// it is reaped in the background.
    pub fn release(mut self) {
        self.armed = false;
    }

    /// Its pid, until it is reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    pub fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        if self.status.is_none() {
            self.status = reap_now(self.pid)?;
        }
        Ok(self.status)
    }

    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let Some(pidfd) = &self.pidfd else {
            return Err(std::io::Error::other("the helper's pidfd is gone"));
        };
        let status = reap(self.pid, pidfd).await?;
        self.status = Some(status);
        Ok(status)
    }

    pub fn start_kill(&mut self) -> std::io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        let Some(pidfd) = &self.pidfd else {
            return Ok(());
        };
        // SAFETY: pidfd_send_signal takes a pidfd we own, a signal number and no info.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.get_ref().as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for HelperProcess {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.start_kill();
        }
        if matches!(self.try_wait(), Ok(Some(_)) | Err(_)) {
            return;
        }
        let (Ok(runtime), Some(pidfd)) = (tokio::runtime::Handle::try_current(), self.pidfd.take())
        else {
            // No runtime (the process is ending): whatever adopts it reaps it.
            return;
        };
        let pid = self.pid;
        runtime.spawn(async move {
            let _ = reap(pid, &pidfd).await;
        });
    }
}

/// Reap `pid`, an unreaped child of this process, if it has exited.
fn reap_now(pid: i32) -> std::io::Result<Option<std::process::ExitStatus>> {
    use std::os::unix::process::ExitStatusExt;
    let mut raw = 0;
    // SAFETY: waitpid on our own unreaped child, writing the status on this frame.
    match unsafe { libc::waitpid(pid, &mut raw, libc::WNOHANG) } {
        r if r < 0 => Err(std::io::Error::last_os_error()),
        0 => Ok(None),
        _ => Ok(Some(std::process::ExitStatus::from_raw(raw))),
    }
}

/// Wait for `pid` (an unreaped child of this process, `pidfd` its pidfd) to exit, and reap it.
async fn reap(
    pid: i32,
    pidfd: &tokio::io::unix::AsyncFd<OwnedFd>,
) -> std::io::Result<std::process::ExitStatus> {
    loop {
        if let Some(status) = reap_now(pid)? {
            return Ok(status);
        }
        // Readable once the process has exited.
        pidfd.readable().await?.clear_ready();
    }
}

/// A started helper: its pipes, before the program's data has been written.
pub(crate) struct Spawned {
    pub child: HelperProcess,
    pub stdin: tokio::net::unix::pipe::Sender,
    pub stdout: tokio::net::unix::pipe::Receiver,
    pub stderr: tokio::net::unix::pipe::Receiver,
    pub report: tokio::net::unix::pipe::Receiver,
}

/// The helper's spec for `job` (files listed; their bytes follow the header).
pub(crate) fn spec_for(mode: Mode, job: &Job, pooled: Option<Pooled>) -> JailSpec {
    // A fork server's own sandbox brings nothing back: its runs' outputs are read by
    // `fork_server.rs` from outside each run.
    let outputs = pooled.as_ref().is_none_or(|p| !p.fork_server);
    JailSpec {
        mode,
        argv: job.argv.clone(),
        env: job.program_vars(),
        files: if pooled.is_some() {
            vec![]
        } else {
            file_list(job)
        },
        limits: job.limits,
        mounts: job.mounts.clone(),
        egress: job.egress.clone(),
        parent_pid: std::process::id() as i32,
        pooled,
        collect: None,
        outputs,
        live: None,
    }
}

fn file_list(job: &Job) -> Vec<(String, u64)> {
    job.files
        .iter()
        .map(|f| (f.path.clone(), f.content.len() as u64))
        .collect()
}

/// Start the helper and send it `spec`.
pub(crate) async fn spawn(helper: &Path, spec: &JailSpec) -> Result<Spawned, SandboxError> {
    spawn_with(helper, spec, None).await
}

/// [`spawn`], passing `control_fd` to the helper as [`crate::wire::FORK_SERVER_FD`].
pub(crate) async fn spawn_with(
    helper: &Path,
    spec: &JailSpec,
    control_fd: Option<std::os::fd::RawFd>,
) -> Result<Spawned, SandboxError> {
    let header = encode_header(spec).map_err(|e| SandboxError::Protocol(e.to_string()))?;
    let spawn_err = |e: nix::errno::Errno| SandboxError::Spawn(e.into());
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(spawn_err);
    // Each fd the helper gets is first copied above the numbers it gets them at (0 to 4),
    // so that no `dup2` of the child overwrites one a later `dup2` reads. All are
    // close-on-exec here; `dup2` clears that on the copy the helper keeps.
    let high = |fd: std::os::fd::BorrowedFd| -> Result<OwnedFd, SandboxError> {
        let raw =
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(10)).map_err(spawn_err)?;
        // SAFETY: a fresh fd returned by the kernel, owned by nothing else.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    };
    let (stdin_r, stdin_w) = pipe()?;
    let (stdout_r, stdout_w) = pipe()?;
    let (stderr_r, stderr_w) = pipe()?;
    let (report_r, report_w) = pipe()?;
    let mut theirs = vec![
        (high(stdin_r.as_fd())?, 0),
        (high(stdout_w.as_fd())?, 1),
        (high(stderr_w.as_fd())?, 2),
        (high(report_w.as_fd())?, REPORT_FD),
    ];
    if let Some(c) = control_fd {
        // SAFETY: the caller keeps `c` open until this function returns.
        let c = unsafe { std::os::fd::BorrowedFd::borrow_raw(c) };
        theirs.push((high(c)?, crate::wire::FORK_SERVER_FD));
    }
    drop((stdin_r, stdout_w, stderr_w, report_w));
    let pid = posix_spawn(helper, &theirs).map_err(spawn_err)?;
    drop(theirs);
    let child = HelperProcess::new(pid).map_err(|e| {
        // No pidfd to hold it by: stop it now, before its pid can be anyone else's.
        // SAFETY: kill and waitpid on our own unreaped child; the status goes nowhere.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        SandboxError::Spawn(e)
    })?;
    tracing::debug!(pid, "sandbox helper started");
    let as_io = |e: std::io::Error| SandboxError::Spawn(e);
    let mut stdin = tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w).map_err(as_io)?;
    let stdout = tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(as_io)?;
    let stderr = tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(as_io)?;
    let report = tokio::net::unix::pipe::Receiver::from_owned_fd(report_r).map_err(as_io)?;
    // A helper that fails early closes its stdin; its report then says why.
    let _ = stdin.write_all(&header).await;
    Ok(Spawned {
        child,
        stdin,
        stdout,
        stderr,
        report,
    })
}

/// Start `helper __jail <build>` with `fds` at their numbers, an empty environment, no
/// signal blocked and SIGPIPE at its default. `posix_spawn` (a `vfork`-like clone in the C
/// library) does not copy the server's page tables as `fork` does: with the wasm backend's
/// instance pool and the server's heap, that copy took 1.1-1.9 ms of every spawn.
fn posix_spawn(helper: &Path, fds: &[(OwnedFd, i32)]) -> nix::Result<i32> {
    use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags};
    let mut actions = PosixSpawnFileActions::init()?;
    for (fd, at) in fds {
        actions.add_dup2(fd.as_raw_fd(), *at)?;
    }
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_sigmask(&nix::sys::signal::SigSet::empty())?;
    let mut pipe = nix::sys::signal::SigSet::empty();
    pipe.add(nix::sys::signal::Signal::SIGPIPE);
    attr.set_sigdefault(&pipe)?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
    )?;
    let path = std::ffi::CString::new(helper.as_os_str().as_encoded_bytes())
        .map_err(|_| nix::errno::Errno::EINVAL)?;
    let build =
        std::ffi::CString::new(crate::HELPER_BUILD).map_err(|_| nix::errno::Errno::EINVAL)?;
    let argv = [path.as_c_str(), c"__jail", build.as_c_str()];
    let env: [&std::ffi::CStr; 0] = [];
    Ok(nix::spawn::posix_spawn(path.as_c_str(), &actions, &attr, &argv, &env)?.as_raw())
}

/// Run `job` through a fresh helper and return its outcome plus the mechanisms it reported.
pub(crate) async fn run_helper_report(
    helper: PathBuf,
    mode: Mode,
    job: Job,
) -> Result<(Outcome, Vec<String>), SandboxError> {
    let sp = spawn(&helper, &spec_for(mode, &job, None)).await?;
    let mut job = job;
    let payload = take_payload(Vec::new(), &mut job);
    finish(sp, payload, &job, mode)
        .await
        .map(Finished::with_outputs)
}

/// Run `job` through a fresh helper that sends back the workspace's files.
pub(crate) async fn run_collecting(
    helper: PathBuf,
    mode: Mode,
    job: Job,
    limits: CollectLimits,
) -> Result<(Outcome, Option<Collected>), SandboxError> {
    let mut spec = spec_for(mode, &job, None);
    spec.collect = Some(limits);
    spec.outputs = false;
    let sp = spawn(&helper, &spec).await?;
    let mut job = job;
    let payload = take_payload(Vec::new(), &mut job);
    let f = finish(sp, payload, &job, mode).await?;
    let mut outcome = f.outcome;
    let collected = match (f.trailer, f.collect_error) {
        (_, Some(e)) => {
            note(&mut outcome, &e);
            None
        }
        (Some(bytes), None) => match gearbox_core::tree::decode_frames(&bytes, &limits) {
            Ok(c) => Some(c),
            Err(e) => {
                note(&mut outcome, &e);
                None
            }
        },
        (None, None) => None,
    };
    Ok((outcome, collected))
}

/// Add a note about the workspace to an outcome's reason.
fn note(outcome: &mut Outcome, message: &str) {
    let text = format!("workspace not saved: {message}");
    outcome.reason = Some(match outcome.reason.take() {
        Some(r) => format!("{r}; {text}"),
        None => text,
    });
}

/// What [`finish`] learned: the outcome, the mechanisms reported, and the collected
/// workspace's frames when the run collected one.
struct Finished {
    outcome: Outcome,
    enforced: Vec<String>,
    trailer: Option<Vec<u8>>,
    collect_error: Option<String>,
}

/// Hand `job` to a warm sandbox.
pub(crate) async fn run_warm(
    sp: Spawned,
    job: Job,
) -> Result<(Outcome, Vec<String>), SandboxError> {
    let handover = HandOver {
        argv: job.argv.clone(),
        program_argv: job.program_argv.clone(),
        env: job.program_vars(),
        files: file_list(&job),
        limits: None,
        cpu_s: None,
    };
    let header = encode_handover(&handover).map_err(|e| SandboxError::Protocol(e.to_string()))?;
    let mut job = job;
    let payload = take_payload(vec![header], &mut job);
    finish(sp, payload, &job, Mode::Linux)
        .await
        .map(Finished::with_outputs)
}

impl Finished {
    /// The outcome with the files of `/work/outputs/` the sandbox sent after its report (a
    /// run without a session), and the mechanisms reported.
    fn with_outputs(self) -> (Outcome, Vec<String>) {
        let mut outcome = self.outcome;
        if let Some(e) = self.collect_error {
            outcome
                .outputs_skipped
                .push(format!("outputs not brought back: {e}"));
        } else if let Some(bytes) = self.trailer {
            attach_outputs(&mut outcome, &bytes);
        }
        (outcome, self.enforced)
    }
}

/// Decode `frames` (the files of `/work/outputs/`, framed by `gearbox_core::tree`, from a
/// sandbox: untrusted, checked again against `OUTPUT_LIMITS`) into `outcome.outputs`.
pub(crate) fn attach_outputs(outcome: &mut Outcome, frames: &[u8]) {
    match gearbox_core::tree::decode_frames(frames, &gearbox_core::OUTPUT_LIMITS) {
        Ok(c) => outputs_from(outcome, c),
        Err(e) => outcome
            .outputs_skipped
            .push(format!("outputs not brought back: {e}")),
    }
}

/// Put the files of `collected` (paths relative to `/work/outputs`) into `outcome.outputs`,
/// and what was skipped into `outcome.outputs_skipped`.
pub(crate) fn outputs_from(outcome: &mut Outcome, collected: Collected) {
    let dir = gearbox_core::tree::OUTPUTS_DIR;
    outcome.outputs = collected
        .files
        .into_iter()
        .map(|f| gearbox_core::OutputFile::new(format!("{dir}/{}", f.path), f.content))
        .collect();
    outcome.outputs_skipped = collected
        .summary
        .skipped
        .iter()
        .map(|s| match s.strip_prefix('"') {
            // `"name": why`, as the walk lists it.
            Some(rest) => format!("\"{dir}/{rest}"),
            None => format!("{dir}/{s}"),
        })
        .collect();
    let unlisted = collected
        .summary
        .skipped_count
        .saturating_sub(collected.summary.skipped.len());
    if unlisted > 0 {
        outcome.outputs_skipped.push(format!("{unlisted} more"));
    }
}

/// What follows a header on the helper's stdin: each file's bytes, then the program's stdin
/// (moved out of `job`, not copied).
pub(crate) fn take_payload(mut payload: Vec<Vec<u8>>, job: &mut Job) -> Vec<Vec<u8>> {
    payload.reserve(job.files.len() + 1);
    for f in &mut job.files {
        payload.push(std::mem::take(&mut f.content));
    }
    payload.push(std::mem::take(&mut job.stdin));
    payload
}

/// Write `payload` to the helper, read the program's output while it runs, and build the
/// outcome from the helper's report.
async fn finish(
    sp: Spawned,
    payload: Vec<Vec<u8>>,
    job: &Job,
    mode: Mode,
) -> Result<Finished, SandboxError> {
    let Spawned {
        child,
        mut stdin,
        stdout,
        stderr,
        report: mut report_pipe,
    } = sp;
    let writer = async move {
        // A helper that fails early closes its stdin; the write error is then expected and
        // the helper's report says why.
        let _ = async {
            for chunk in &payload {
                stdin.write_all(chunk).await?;
            }
            stdin.shutdown().await
        }
        .await;
    };
    let (exited_tx, out_reader, err_reader) =
        output_readers(stdout, stderr, job.limits.output_bytes);
    // The helper closes the report pipe once it has written the report (or when it dies):
    // from then on the output readers only drain what is left.
    let report_reader = async move {
        let mut buf = Vec::new();
        let _ = report_pipe.read_to_end(&mut buf).await;
        let _ = exited_tx.send(true);
        buf
    };
    let backstop = Duration::from_millis(job.limits.timeout_ms) + HELPER_GRACE;
    let joined = tokio::time::timeout(backstop, async {
        tokio::join!(writer, out_reader, err_reader, report_reader)
    })
    .await;
    if joined.is_ok() {
        // The helper may still be removing the run's cgroup: it is reaped in the background
        // (or, when the runtime stops first, by whatever adopts it).
        child.release();
    }
    let Ok(((), out, err, report_bytes)) = joined else {
        return Err(SandboxError::Protocol(format!(
            "helper did not finish within {} ms; killed",
            backstop.as_millis()
        )));
    };
    // The report is one JSON value; a collecting run's workspace frames follow it.
    let mut values = serde_json::Deserializer::from_slice(&report_bytes).into_iter::<JailReport>();
    let parsed = values.next();
    let report_end = values.byte_offset();
    let report: JailReport = match parsed {
        Some(Ok(r)) => r,
        other => {
            let e = match other {
                Some(Err(e)) => e.to_string(),
                _ => "empty".into(),
            };
            return Err(SandboxError::Protocol(format!(
                "no report from the sandbox helper ({e}); stderr: {}",
                err.text.chars().take(500).collect::<String>()
            )));
        }
    };
    let trailer = report
        .collected
        .then(|| report_bytes.get(report_end..).unwrap_or_default().to_vec());
    tracing::debug!(timings = ?report.timings, setup_us = report.setup_us, "sandbox helper report");
    let collect_error = report.collect_error.clone();
    let enforced = report.enforced.clone();
    let outcome = build_outcome(report, out, err, job, mode)?;
    Ok(Finished {
        outcome,
        enforced,
        trailer,
        collect_error,
    })
}

/// Turn a report and the captured output into the run's outcome (or its set-up error).
pub(crate) fn build_outcome(
    report: JailReport,
    out: gearbox_core::CappedOutput,
    err: gearbox_core::CappedOutput,
    job: &Job,
    mode: Mode,
) -> Result<Outcome, SandboxError> {
    if let Some(e) = report.error {
        let mut message = e.message;
        let stderr = err.text.trim();
        if !stderr.is_empty() {
            message.push_str(&format!(
                "; stderr: {}",
                stderr.chars().take(500).collect::<String>()
            ));
        }
        return Err(SandboxError::Setup {
            step: e.step,
            message,
        });
    }
    let (status, reason) = classify(&report, &job.limits);
    Ok(Outcome {
        status,
        exit_code: report.exit_code,
        signal: report.signal,
        stdout: out.text,
        stderr: err.text,
        stdout_truncated: out.truncated,
        stderr_truncated: err.truncated,
        duration_ms: report.duration_us / 1000,
        usage: ResourceUsage {
            cpu_time_ms: report.cpu_time_ms,
            peak_memory_kb: report.peak_memory_kb,
            setup_us: Some(report.setup_us),
            memory_limit: Some(
                match (mode, report.memory_sampled) {
                    (Mode::Process, _) => "per_process",
                    (Mode::Linux, true) => "sampled",
                    (Mode::Linux, false) => "cgroup",
                }
                .into(),
            ),
        },
        reason,
        language: job.language.clone(),
        backend: match mode {
            Mode::Linux => "linux".into(),
            Mode::Process => "process".into(),
        },
        egress: None,
        result: None,
        pictures: Vec::new(),
        outputs: Vec::new(),
        outputs_skipped: Vec::new(),
    })
}

pub(crate) async fn run_helper(
    helper: PathBuf,
    mode: Mode,
    job: Job,
) -> Result<Outcome, SandboxError> {
    run_helper_report(helper, mode, job).await.map(|(o, _)| o)
}

/// Decide the status of a run that started.
pub(crate) fn classify(r: &JailReport, limits: &gearbox_core::Limits) -> (Status, Option<String>) {
    if r.timed_out {
        return (
            Status::Timeout,
            Some(format!(
                "wall-clock limit of {} ms exceeded",
                limits.timeout_ms
            )),
        );
    }
    let failed = r.exit_code != Some(0);
    if r.oom_killed && failed {
        let how = if r.memory_sampled {
            " (measured by sampling: this host gives the sandbox no memory cgroup)"
        } else {
            ""
        };
        return (
            Status::Killed,
            Some(format!(
                "memory limit of {} MiB exceeded{how}",
                limits.memory_mb
            )),
        );
    }
    // The CPU time the program could use: what was asked, or (no `cpu_ms`) the backstop a
    // second beyond the wall clock, which only a program on several threads reaches first.
    let cpu_limit = limits.cpu_rlimit_secs() * 1000;
    let cpu_reason = || {
        if limits.cpu_ms == 0 {
            format!(
                "CPU time limit of {cpu_limit} ms (the wall-clock limit plus a second) exceeded"
            )
        } else {
            format!("CPU time limit of {} ms exceeded", limits.cpu_ms)
        }
    };
    match r.signal {
        Some(libc::SIGXCPU) => return (Status::Killed, Some(cpu_reason())),
        Some(libc::SIGKILL) if r.cpu_time_ms.is_some_and(|c| c + 50 >= cpu_limit) => {
            return (Status::Killed, Some(cpu_reason()));
        }
        Some(libc::SIGXFSZ) => {
            return (
                Status::Killed,
                Some(format!(
                    "file size limit of {} MiB exceeded",
                    limits.file_size_mb
                )),
            );
        }
        _ => {}
    }
    if failed {
        (Status::Error, None)
    } else {
        (Status::Ok, None)
    }
}

/// A pidfd for `pid`, which must be a process this one may not lose track of (an unreaped
/// child, or one known alive): it names that process from then on, whatever the pid becomes.
pub(crate) fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers and returns a new fd we then own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd returned by the kernel, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as std::os::fd::RawFd) })
}
