//! The exec fork server: warm sandboxes for languages whose program is an `execve` (Bash, Go,
//! any language without an in-process launcher), built by the same native loop as Python's
//! and Node's fork servers (`launchers/fork/`, linked into this binary as `fork_native`).
//!
//! Without it, each such warm sandbox is a helper of its own: an exec of the gearbox binary,
//! a set of namespaces and a root built from scratch (~20 ms of CPU per sandbox, more than a
//! Bash run itself). Here the helper's init forks one process that keeps what a fork server
//! keeps (CAP_SYS_ADMIN and CAP_NET_ADMIN inside the sandbox's user namespace, an empty
//! bounding set, nice 10) and enters the native loop, never exec'ing: each slot is a clone
//! into fresh namespaces, its init and its program restricted exactly as an interpreter's
//! fork server restricts them. The program then reads its hand-over on fd 0, writes the
//! run's files into its fresh `/work`, lowers its rlimits to the run's, says `started` and
//! `execve`s the run's command, which replaces everything this process held: no memory of
//! the fork server, the helper or another run survives the exec, and every fd above stderr
//! closes with it. Nothing is shared between runs but the read-only root.
//!
//! Bash is started before its run (`prestart.rs`): the slot's program execs bash at once
//! ([`prestarted`]), and the run's init takes the hand-over instead of the program ([`feed`]):
//! it writes the run's files, lowers bash's rlimits to the run's, says `started`, writes the
//! start-up and closes the pipe. A run bash was not started for gets a fresh program from
//! init, which reads nothing more and execs the run's command as above.

use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

use gearbox_core::Limits;

use super::message::Msg;
use super::prestart::Prestart;
use super::program;

use crate::fork_native::config::gb_config;
use crate::fork_native::serve::{Fed, Feed, Feeder, Handed, gb_serve_exec};
use crate::step::{AtStep, Step, StepError};
use crate::wire::{FORK_SERVER_FD, HandOver, read_handover};

/// This fork server's [`Prestart`], set before it serves.
static PRESTART: OnceLock<Prestart> = OnceLock::new();

/// In a run's init, the hand-over of a run its pre-started program was not started for, for
/// the program forked to replace it ([`Fed::Replace`]); the files are written already.
static HANDED_OVER: OnceLock<HandOver> = OnceLock::new();

/// Serve slots on the control socket (fd 4) until it closes, in a fresh fork of init.
/// Returns only if it could not start (init's status pipe is still open to say so); in a
/// program, never returns (it execs or exits). With `prestart`, each slot's program starts
/// it before its run.
pub(super) fn serve(limits: &Limits, nice: i32, prestart: Option<Prestart>) -> std::io::Error {
    let last = std::io::Error::last_os_error;
    if let Err(e) = keep_fork_server_caps(false) {
        return e;
    }
    // Every program inherits these through its forks and keeps them past its exec: each
    // disposition at its default and nothing blocked, as on the cold path (each run's init
    // sets SIGCHLD, ignored below, back to its default).
    super::reset_signals();
    // SAFETY: setpriority, signal and prctl take integers.
    unsafe {
        if libc::setpriority(libc::PRIO_PROCESS, 0, nice) != 0 {
            return last();
        }
        // The runs' inits are children of the fork server until they end: the kernel reaps
        // them.
        libc::signal(libc::SIGCHLD, libc::SIG_IGN);
        // Init changed its ids (root to the sandbox user), which left it not dumpable: its
        // /proc files belong to root, and each run's init could not write its own id maps.
        // An exec'd fork server is dumpable again after its exec; this one says so.
        if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
            return last();
        }
    }
    // SAFETY: one thread (a fork of the single-threaded init); the config lives as long as
    // this process.
    let config = unsafe {
        gb_config(
            FORK_SERVER_FD,
            limits.disk_mb,
            limits.open_files,
            limits.cpu_rlimit_secs(),
        )
    };
    if config.is_null() {
        return std::io::Error::other("read the seccomp filters");
    }
    // SAFETY: a static string; then close_range on fd numbers of this process. Only stdio
    // and the control socket stay open (the exec of an interpreter's fork server keeps the
    // same): from here on a failure is told on stderr, which the server logs.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"gb-zygote".as_ptr(), 0, 0, 0);
        let control = FORK_SERVER_FD as u32;
        libc::syscall(libc::SYS_close_range, 3u32, control - 1, 0u32);
        libc::syscall(libc::SYS_close_range, control + 1, u32::MAX, 0u32);
    }
    let feeder = prestart.map(|p| {
        let _ = PRESTART.set(p);
        feed as Feeder
    });
    let mut handed = Handed { chan: -1 };
    let mut start = -1;
    // SAFETY: a valid config and out pointers; this process has one thread.
    match unsafe { gb_serve_exec(config, &mut handed, feeder, &mut start) } {
        0 if start >= 0 => prestarted(handed.chan, start),
        0 => program(handed.chan, limits),
        1 => {
            // SAFETY: the control socket closed: the server is done with this fork server.
            unsafe { libc::_exit(0) }
        }
        _ => {
            eprintln!("gearbox: exec fork server: install the fork server's seccomp filters");
            // SAFETY: ends this process.
            unsafe { libc::_exit(1) }
        }
    }
}

/// A slot's program, restricted by the native loop, its stdio on 0, 1 and 2 and its control
/// socket `chan` (close-on-exec): read the run, then become it.
fn program(chan: RawFd, slot: &Limits) -> ! {
    let (path, argv, envp) = match prepare(slot) {
        Ok(p) => p,
        Err(e) => {
            failed(chan, e);
            // SAFETY: ends this process.
            unsafe { libc::_exit(127) }
        }
    };
    send(chan, br#"{"t":"started"}"#);
    // Everything above stderr, the control socket included, closes at exec.
    program::close_on_exec_from(3);
    // Still here: the exec failed, and the control socket is still open to say so.
    failed(chan, program::execve(&path, &argv, &envp));
    // SAFETY: ends this process.
    unsafe { libc::_exit(127) }
}

/// A slot's program started before its run: exec the [`Prestart`] command, which waits for
/// its start-up on `start` (the read end of the pipe its init feeds, [`feed`]).
fn prestarted(chan: RawFd, start: RawFd) -> ! {
    let Some(p) = PRESTART.get() else {
        // SAFETY: ends this process.
        unsafe { libc::_exit(127) }
    };
    let (argv, env) = p.command(start);
    let env = env.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let (path, argv, envp) = match program::command(argv, env) {
        Ok(c) => c,
        Err(e) => {
            failed(chan, e);
            // SAFETY: ends this process.
            unsafe { libc::_exit(127) }
        }
    };
    // Everything above stderr closes at exec but the start-up pipe, which the start-up
    // closes in bash.
    program::close_on_exec_from(3);
    // SAFETY: fcntl on an fd of this process.
    if unsafe { libc::fcntl(start, libc::F_SETFD, 0) } != 0 {
        failed(
            chan,
            StepError::new(Step::Execve, std::io::Error::last_os_error().to_string()),
        );
        // SAFETY: ends this process.
        unsafe { libc::_exit(127) }
    }
    failed(chan, program::execve(&path, &argv, &envp));
    // SAFETY: ends this process.
    unsafe { libc::_exit(127) }
}

/// In a run's init: take the hand-over for the program started before it ([`prestarted`]),
/// which waits on the start-up pipe. Writes the run's files, and, for a run the program was
/// started for, lowers its rlimits, says `started` and writes its start-up. A run it was not
/// started for (another entrypoint, an argument bash could not take) is kept for the
/// program init forks in its place ([`Fed::Replace`]), as is a run whose program is gone.
fn feed(f: &Feed) -> Fed {
    let Some(p) = PRESTART.get() else {
        return Fed::Failed;
    };
    let fail = |e: StepError| {
        failed(f.chan, e);
        Fed::Failed
    };
    // SAFETY: the run's stdin pipe, which init keeps open (ManuallyDrop) for the program.
    let mut stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(f.stdin) });
    let (handover, files) = match read_handover(&mut *stdin).step(Step::ReadHandOver) {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    if let Err(e) = super::mount::write_files(Path::new("/work"), &handover.files, &files) {
        return fail(e);
    }
    drop(files);
    // SAFETY: waits for this init's child without blocking, writing the status on this frame.
    let gone = unsafe { libc::waitpid(f.program, &mut 0, libc::WNOHANG) } == f.program;
    let args = match p.args_of(&handover, &handover.env) {
        Some(args) if !gone => args.to_vec(),
        _ => {
            let _ = HANDED_OVER.set(handover);
            return Fed::Replace;
        }
    };
    if let Err(e) = lower_rlimits(f.program, &p.slot, &handover) {
        return fail(e);
    }
    let script = p.start_up(&args, f.start_fd);
    send(f.chan, br#"{"t":"started"}"#);
    // A program that died since does not kill its init by the write (SIGPIPE): the write
    // fails, and init reports how the program ended.
    // SAFETY: signal dispositions of this process, set back at once.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    // SAFETY: the write end of the start-up pipe, open in init until it returns.
    let mut pipe = ManuallyDrop::new(unsafe { File::from_raw_fd(f.start) });
    let _ = std::io::Write::write_all(&mut *pipe, script.as_bytes());
    // SAFETY: as above.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    Fed::Started
}

/// Read the hand-over (or take the one init read, [`HANDED_OVER`]), write the run's files,
/// lower the rlimits to the run's (never above the slot's), and build the command to exec.
fn prepare(slot: &Limits) -> Result<program::Command, StepError> {
    let read;
    let handover = match HANDED_OVER.get() {
        Some(h) => h,
        None => {
            // SAFETY: fd 0 is the run's stdin pipe; ManuallyDrop keeps it open for the
            // program.
            let mut stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
            let files;
            (read, files) = read_handover(&mut *stdin).step(Step::ReadHandOver)?;
            super::mount::write_files(Path::new("/work"), &read.files, &files)?;
            &read
        }
    };
    lower_rlimits(0, slot, handover)?;
    program::command(
        &handover.argv,
        handover.env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
    )
}

/// Lower the rlimits of `pid` (0: this process; else a child, which init may change) to the
/// run's, never above the slot's: file size, open files, CPU time.
fn lower_rlimits(pid: libc::pid_t, slot: &Limits, handover: &HandOver) -> Result<(), StepError> {
    let run = handover.limits.unwrap_or(*slot);
    let mib = 1024 * 1024;
    let fsize = slot.file_size_mb.min(run.file_size_mb) * mib;
    let nofile = slot.open_files.min(run.open_files);
    let cpu_s = slot
        .cpu_rlimit_secs()
        .min(handover.cpu_s.unwrap_or(u64::MAX));
    for (resource, name, soft, hard) in [
        (libc::RLIMIT_FSIZE, "fsize", fsize, fsize),
        (libc::RLIMIT_NOFILE, "nofile", nofile, nofile),
        (libc::RLIMIT_CPU, "cpu", cpu_s, cpu_s + 1),
    ] {
        let limit = libc::rlimit64 {
            rlim_cur: soft,
            rlim_max: hard,
        };
        // SAFETY: sets a limit of `pid` from a structure on this frame.
        if unsafe { libc::prlimit64(pid, resource, &limit, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error()).step(Step::Rlimit(name));
        }
    }
    Ok(())
}

/// Tell the server a step failed (the message the cold path's program sends, shortened to
/// fit one packet).
fn failed(chan: RawFd, e: StepError) {
    if let Some(msg) = Msg::failed(e).encode() {
        send(chan, &msg);
    }
}

/// One message on the slot's control socket (`SOCK_SEQPACKET`: one write, one packet).
fn send(chan: RawFd, msg: &[u8]) {
    // SAFETY: sends a buffer that lives on this frame on a socket of this process.
    unsafe { libc::send(chan, msg.as_ptr().cast(), msg.len(), libc::MSG_NOSIGNAL) };
}

/// Capabilities a fork server keeps: new namespaces and mounts, and the loopback interface.
/// (`linux/capability.h`: CAP_NET_ADMIN 12, CAP_SYS_ADMIN 21.) Its bounding set is emptied
/// before serving (with CAP_SETPCAP 8, which it does not keep), so every process it forks
/// starts with an empty bounding set.
const FORK_SERVER_CAPS: [u32; 2] = [12, 21];
const CAP_SETPCAP: u32 = 8;

/// Keep only [`FORK_SERVER_CAPS`] (effective and permitted; also ambient when `for_exec`, so
/// that they survive the exec of an interpreter) and empty the bounding set, so that every
/// process the fork server forks starts with an empty one.
pub(super) fn keep_fork_server_caps(for_exec: bool) -> std::io::Result<()> {
    let kept = FORK_SERVER_CAPS
        .iter()
        .fold(0u64, |bits, cap| bits | 1 << cap);
    // CAP_SETPCAP is kept until the bounding set is empty; dropped below (or by the exec: it
    // is not ambient).
    program::capset(kept | 1 << CAP_SETPCAP, kept)?;
    if for_exec {
        for cap in FORK_SERVER_CAPS {
            // SAFETY: prctl takes integers only.
            if unsafe {
                libc::prctl(
                    libc::PR_CAP_AMBIENT,
                    libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
                    cap as libc::c_ulong,
                    0,
                    0,
                )
            } != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    // The ambient set survives this.
    program::drop_bounding_set();
    if !for_exec {
        program::capset(kept, kept)?;
    }
    Ok(())
}
