//! The server's side of the `linux` and `process` backends: spawn the helper, feed it the
//! job, read the program's output while it runs, and turn the helper's report into an
//! outcome.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use gearbox_core::{
    BackendKind, BackendReport, Job, Outcome, ResourceUsage, RunFuture, Sandbox, SandboxError,
    Status, read_capped_until,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wire::{JailReport, JailSpec, Mode, REPORT_FD, encode_header};

/// Time the helper may take beyond the run's own timeout (set-up and teardown) before the
/// server kills it.
const HELPER_GRACE: Duration = Duration::from_secs(30);
/// How long output is still read after the helper exited (process mode: an escaped
/// descendant may hold the pipes).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);

/// The default backend: namespaces, a minimal root, seccomp, Landlock, cgroups.
pub struct LinuxSandbox {
    helper: PathBuf,
}

impl LinuxSandbox {
    /// `helper` is a binary whose `__jail` subcommand calls [`crate::jail_main`].
    pub fn new(helper: PathBuf) -> Self {
        LinuxSandbox { helper }
    }
}

impl Sandbox for LinuxSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Linux
    }
    fn run(&self, job: Job) -> RunFuture<'_> {
        Box::pin(run_helper(self.helper.clone(), Mode::Linux, job))
    }
    fn probe(&self) -> BackendReport {
        crate::probe::probe(&self.helper, Mode::Linux)
    }
}

/// No isolation: a child process with rlimits and a process-group kill.
pub struct ProcessSandbox {
    helper: PathBuf,
}

impl ProcessSandbox {
    pub fn new(helper: PathBuf) -> Self {
        ProcessSandbox { helper }
    }
}

impl Sandbox for ProcessSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Process
    }
    fn run(&self, job: Job) -> RunFuture<'_> {
        Box::pin(run_helper(self.helper.clone(), Mode::Process, job))
    }
    fn probe(&self) -> BackendReport {
        crate::probe::probe(&self.helper, Mode::Process)
    }
}

/// Run `job` through the helper and return its outcome plus the mechanisms it reported.
pub(crate) async fn run_helper_report(
    helper: PathBuf,
    mode: Mode,
    job: Job,
) -> Result<(Outcome, Vec<String>), SandboxError> {
    let spec = JailSpec {
        mode,
        argv: job.argv.clone(),
        env: job.env.clone(),
        files: job
            .files
            .iter()
            .map(|f| (f.path.clone(), f.content.len() as u64))
            .collect(),
        limits: job.limits,
        mounts: job.mounts.clone(),
        network: job.network,
        parent_pid: std::process::id() as i32,
    };
    let header = encode_header(&spec).map_err(|e| SandboxError::Protocol(e.to_string()))?;
    let (report_r, report_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| SandboxError::Spawn(e.into()))?;
    let mut cmd = tokio::process::Command::new(&helper);
    cmd.arg("__jail")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let w = report_w.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only dup2, which is
    // async-signal-safe; `w` stays open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(w, REPORT_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(SandboxError::Spawn)?;
    drop(report_w);
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(SandboxError::Protocol("helper pipes missing".into()));
    };
    let mut report_pipe =
        tokio::net::unix::pipe::Receiver::from_owned_fd(report_r).map_err(SandboxError::Spawn)?;

    let files = job.files;
    let program_stdin = job.stdin;
    let writer = async move {
        // A helper that fails early closes its stdin; the write error is then expected and
        // the helper's report says why.
        let _ = async {
            stdin.write_all(&header).await?;
            for f in &files {
                stdin.write_all(&f.content).await?;
            }
            stdin.write_all(&program_stdin).await?;
            stdin.shutdown().await
        }
        .await;
    };
    let (exited_tx, exited_rx) = tokio::sync::watch::channel(false);
    let stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
        tokio::time::sleep(DRAIN_AFTER_EXIT).await;
    };
    let cap = job.limits.output_bytes;
    let out_reader = read_capped_until(stdout, cap, stop(exited_rx.clone()));
    let err_reader = read_capped_until(stderr, cap, stop(exited_rx));
    let report_reader = async move {
        let mut buf = Vec::new();
        let _ = report_pipe.read_to_end(&mut buf).await;
        buf
    };
    let waiter = async {
        let status = child.wait().await;
        let _ = exited_tx.send(true);
        status
    };
    let backstop = Duration::from_millis(job.limits.timeout_ms) + HELPER_GRACE;
    let joined = tokio::time::timeout(backstop, async {
        tokio::join!(writer, out_reader, err_reader, report_reader, waiter)
    })
    .await;
    let Ok(((), out, err, report_bytes, _status)) = joined else {
        return Err(SandboxError::Protocol(format!(
            "helper did not finish within {} ms; killed",
            backstop.as_millis()
        )));
    };
    let report: JailReport = serde_json::from_slice(&report_bytes).map_err(|e| {
        SandboxError::Protocol(format!(
            "no report from the sandbox helper ({e}); stderr: {}",
            err.text.chars().take(500).collect::<String>()
        ))
    })?;
    tracing::debug!(timings = ?report.timings, setup_us = report.setup_us, "sandbox helper report");
    if let Some(e) = report.error {
        return Err(SandboxError::Setup {
            step: e.step,
            message: e.message,
        });
    }
    let (status, reason) = classify(&report, &job.limits);
    let outcome = Outcome {
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
        },
        reason,
        language: job.language,
        backend: match mode {
            Mode::Linux => "linux".into(),
            Mode::Process => "process".into(),
        },
    };
    Ok((outcome, report.enforced))
}

async fn run_helper(helper: PathBuf, mode: Mode, job: Job) -> Result<Outcome, SandboxError> {
    run_helper_report(helper, mode, job).await.map(|(o, _)| o)
}

/// Decide the status of a run that started.
fn classify(r: &JailReport, limits: &gearbox_core::Limits) -> (Status, Option<String>) {
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
        return (
            Status::Killed,
            Some(format!("memory limit of {} MiB exceeded", limits.memory_mb)),
        );
    }
    let cpu_limit = limits.effective_cpu_ms();
    match r.signal {
        Some(libc::SIGXCPU) => {
            return (
                Status::Killed,
                Some(format!("CPU time limit of {cpu_limit} ms exceeded")),
            );
        }
        Some(libc::SIGKILL) if r.cpu_time_ms.is_some_and(|c| c + 50 >= cpu_limit) => {
            return (
                Status::Killed,
                Some(format!("CPU time limit of {cpu_limit} ms exceeded")),
            );
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
