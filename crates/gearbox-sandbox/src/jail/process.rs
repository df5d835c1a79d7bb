//! `process` mode: the program runs as a plain child of the helper, in its own process group,
//! with rlimits, in a temporary host directory. No isolation: it sees the host filesystem and
//! network as the server's user. Only for operators who chose it.

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{ForkResult, Pid, fork};

use super::program::apply_rlimits;
use crate::step::{AtStep, Step, StepError};
use crate::wire::{JailReport, JailSpec, SetupFailure};

pub fn run(
    spec: &JailSpec,
    files: Vec<Vec<u8>>,
    start: Instant,
    report: &mut JailReport,
) -> Result<(), SetupFailure> {
    let dir = nix::unistd::mkdtemp("/tmp/gearbox-run-XXXXXX").step(Step::CreateWorkspace)?;
    let result = run_in(spec, &files, &dir, start, report);
    if let Ok(trailer) = &result {
        // The program's group is killed: what is left is removing the directory.
        super::release_caller();
        super::send_report(report, trailer);
    }
    let _ = fs::remove_dir_all(&dir);
    result.map(|_| ()).map_err(SetupFailure::from)
}

/// The workspace's files as frames, when the spec asks for them and the program was not
/// stopped by the deadline. The group is dead; a descendant that left it may still write,
/// but the walk never follows a symlink and stays within the limits.
fn collect(spec: &JailSpec, work: &Path, report: &JailReport) -> Result<Vec<u8>, StepError> {
    if report.timed_out {
        return Ok(Vec::new());
    }
    let Some(limits) = &spec.collect else {
        let outputs = work.join(gearbox_core::tree::OUTPUTS_DIR);
        if !spec.outputs || !gearbox_core::tree::dir_has_entries(&outputs) {
            return Ok(Vec::new());
        }
        // Outputs that cannot be read are not brought back; the run's outcome stays its own.
        let mut out = Vec::new();
        let sent = gearbox_core::tree::open_dir(&outputs)
            .and_then(|root| gearbox_core::tree::collect_outputs_into(root.as_fd(), &mut out));
        return Ok(if sent.is_ok() { out } else { Vec::new() });
    };
    let root = gearbox_core::tree::open_dir(work).step(Step::CollectWorkspace)?;
    let mut out = Vec::new();
    gearbox_core::tree::collect_into(root.as_fd(), limits, &mut out)
        .step(Step::CollectWorkspace)?;
    Ok(out)
}

fn run_in(
    spec: &JailSpec,
    files: &[Vec<u8>],
    dir: &Path,
    start: Instant,
    report: &mut JailReport,
) -> Result<Vec<u8>, StepError> {
    let work = dir.join("work");
    let tmp = dir.join("tmp");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&work)
        .step(Step::CreateWorkspace)?;
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&tmp)
        .step(Step::CreateTmp)?;
    super::mount::write_files(&work, &spec.files, files)?;
    let env = crate::wire::program_env(&spec.env, &work.to_string_lossy(), &tmp.to_string_lossy());
    let (path, argv, envp) = super::program::command(
        &spec.argv,
        env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )?;
    report
        .enforced
        .push("process: no isolation; rlimits and process-group kill only".into());
    // SAFETY: the helper is single-threaded, so fork is safe and the child may allocate.
    match unsafe { fork() }.step(Step::ForkProgram)? {
        ForkResult::Child => {
            let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
            let _ = super::die_with_parent(0);
            if apply_rlimits(&spec.limits, false).is_ok() && nix::unistd::chdir(&work).is_ok() {
                super::program::close_on_exec_from(3);
                let _ = nix::unistd::execve(&path, &argv, &envp);
            }
            // SAFETY: leave the forked child without running the helper's destructors.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            let started = Instant::now();
            report.setup_us = started.duration_since(start).as_micros() as u64;
            let deadline = started + Duration::from_millis(spec.limits.timeout_ms);
            let pidfd = crate::helper::pidfd_open(child.as_raw()).step(Step::OpenPidfd)?;
            loop {
                let now = Instant::now();
                if now >= deadline {
                    report.timed_out = true;
                    let _ = killpg(child, Signal::SIGKILL);
                    break;
                }
                let ms = u16::try_from((deadline - now).as_millis().min(60_000)).unwrap_or(60_000);
                let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(ms.max(1))) {
                    Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                    _ => break,
                }
            }
            let (status, usage) = wait4(child);
            report.duration_us = started.elapsed().as_micros() as u64;
            // Nothing of the group outlives the program.
            let _ = killpg(child, Signal::SIGKILL);
            if libc::WIFEXITED(status) {
                report.exit_code = Some(libc::WEXITSTATUS(status));
            } else if libc::WIFSIGNALED(status) {
                report.signal = Some(libc::WTERMSIG(status));
            }
            let ms = |t: libc::timeval| (t.tv_sec as u64) * 1000 + (t.tv_usec as u64) / 1000;
            report.cpu_time_ms = Some(ms(usage.ru_utime) + ms(usage.ru_stime));
            report.peak_memory_kb = Some(usage.ru_maxrss as u64);
            collect(spec, &work, report)
        }
    }
}

fn wait4(pid: Pid) -> (i32, libc::rusage) {
    let mut status = 0;
    // SAFETY: rusage is plain old data; zero is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 writes into the two locals we pass.
        let r = unsafe { libc::wait4(pid.as_raw(), &mut status, 0, &mut usage) };
        if r >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return (status, usage);
        }
    }
}
