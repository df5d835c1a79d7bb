//! A granted run's only way out: a relay from `127.0.0.1:3128` on the run's own loopback to
//! the egress proxy's socket, bound into the sandbox by the server. The run's network
//! namespace has no other interface and no route, so a program that ignores the proxy
//! settings reaches nothing; every decision (which host, which address) is the proxy's, on
//! the host side. The relay only moves bytes, so it holds nothing worth taking: it runs with
//! no capabilities, not dumpable (the program, same uid, cannot read or write its memory),
//! under the program's own seccomp filter, and with no descriptor but its listener.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use gearbox_core::EGRESS_PROXY_PORT;
use nix::unistd::{ForkResult, fork};
use seccompiler::BpfProgram;

use crate::step::{AtStep, Step, StepError};

/// Connections relayed at once; more wait in the listener's backlog.
const MAX_CONNECTIONS: usize = 64;

/// Bind the relay's port (before the program starts, so the program cannot take it) and
/// fork the relay. Call from init, single-threaded, inside the run's namespaces.
pub(super) fn start(socket: &Path, filters: &[BpfProgram]) -> Result<(), StepError> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, EGRESS_PROXY_PORT)).step(Step::BindRelay)?;
    // SAFETY: init is single-threaded (a fork of the single-threaded helper).
    match unsafe { fork() }.step(Step::ForkRelay)? {
        ForkResult::Child => {
            serve(listener, socket, filters);
            // SAFETY: leave without running the helper's destructors or atexit handlers.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { .. } => Ok(()),
    }
}

fn serve(listener: TcpListener, socket: &Path, filters: &[BpfProgram]) {
    if confine(&listener, filters).is_err() {
        return;
    }
    let live = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            continue;
        }
        let Ok(up) = UnixStream::connect(socket) else {
            continue;
        };
        live.fetch_add(1, Ordering::Relaxed);
        let live = live.clone();
        let spawned = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                pipe_both(tcp, up);
                live.fetch_sub(1, Ordering::Relaxed);
            });
        if spawned.is_err() {
            // The connection was moved into the closure and dropped with it.
            continue;
        }
    }
}

/// Everything the relay gives up before it serves: init's descriptors (the status pipe
/// among them), stdio, capabilities, dumpability; then the program's filter.
fn confine(listener: &TcpListener, filters: &[BpfProgram]) -> Result<(), StepError> {
    super::die_with_parent(0).step(Step::TieRelayToInit)?;
    let keep = listener.as_raw_fd() as libc::c_uint;
    // SAFETY: close_range(2) on descriptor numbers this process owns; the listener is kept.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32);
        libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .step(Step::OpenDevNull)?;
    for fd in 0..3 {
        // SAFETY: dup2 onto stdio numbers; the relay writes nothing to them.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } < 0 {
            return Err(std::io::Error::last_os_error()).step(Step::RelayStdio);
        }
    }
    drop(null);
    super::program::drop_capabilities().step(Step::DropRelayCapabilities)?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0
        // SAFETY: as above.
        || unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0
    {
        return Err(std::io::Error::last_os_error()).step(Step::MakeRelayUndumpable);
    }
    for f in filters {
        seccompiler::apply_filter(f).step(Step::InstallRelaySeccompFilter)?;
    }
    Ok(())
}

/// Copy both ways until both sides are done; a half-close is passed on.
fn pipe_both(tcp: TcpStream, up: UnixStream) {
    let (Ok(tcp_r), Ok(up_w)) = (tcp.try_clone(), up.try_clone()) else {
        return;
    };
    let upward = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || {
            copy(tcp_r, &up_w);
            let _ = up_w.shutdown(Shutdown::Write);
        });
    copy(&up, &tcp);
    let _ = tcp.shutdown(Shutdown::Write);
    match upward {
        Ok(t) => {
            let _ = t.join();
        }
        Err(_) => {
            let _ = tcp.shutdown(Shutdown::Both);
        }
    }
}

fn copy(mut from: impl Read, mut to: impl Write) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
