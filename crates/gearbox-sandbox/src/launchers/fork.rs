//! The fork server's native loop (`/.gearbox/fork.so`, loaded by `python_zygote.py`, and by
//! `node_zygote.js` as a Node-API module: see the Node-API entry at the end).
//!
//! The Python fork server calls [`gb_serve`] once, holding the GIL, after it has imported
//! what a run needs. The loop never goes back to Python in the fork server: it receives slot
//! requests, clones each run's init (pid 1) into new namespaces, and that init, also native,
//! builds the run's scratch space, /proc and loopback and forks the program. Only the
//! program returns to Python, already restricted, with its stdio in place.
//!
//! Why native: every page a process writes after a fork is copied (or at least faulted) once
//! per fork. A Python loop and a Python init write hundreds of pages (reference counts,
//! frames, the allocator) for every run; this code writes a few stack pages.
//!
//! Built by `build.rs` with `rustc --crate-type cdylib` and no dependencies (a build script
//! cannot use a cdylib of the workspace as an artifact on stable Cargo), so the few libc
//! functions and kernel structures it needs are declared here. Linux x86_64 and aarch64.

#![allow(non_camel_case_types, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::fmt::Write as _;

unsafe extern "C" {
    fn syscall(n: c_long, ...) -> c_long;
    fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    fn dlopen(name: *const c_char, flags: c_int) -> *mut c_void;
    fn getrandom(buf: *mut c_void, len: usize, flags: c_uint) -> isize;
    fn write(fd: c_int, buf: *const c_void, len: usize) -> isize;
    fn getuid() -> c_uint;
    fn getgid() -> c_uint;
    fn recvmsg(fd: c_int, msg: *mut MsgHdr, flags: c_int) -> isize;
    fn send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize;
    fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    fn close(fd: c_int) -> c_int;
    fn fork() -> c_int;
    fn unshare(flags: c_int) -> c_int;
    fn mount(
        src: *const c_char,
        target: *const c_char,
        fstype: *const c_char,
        flags: c_ulong,
        data: *const c_void,
    ) -> c_int;
    fn umount2(target: *const c_char, flags: c_int) -> c_int;
    fn mkdir(path: *const c_char, mode: c_uint) -> c_int;
    fn chmod(path: *const c_char, mode: c_uint) -> c_int;
    fn access(path: *const c_char, mode: c_int) -> c_int;
    fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    fn sethostname(name: *const c_char, len: usize) -> c_int;
    fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    fn ioctl(fd: c_int, request: c_ulong, ...) -> c_int;
    fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    fn getrusage(who: c_int, usage: *mut RUsage) -> c_int;
    fn kill(pid: c_int, sig: c_int) -> c_int;
    fn _exit(code: c_int) -> !;
    fn prctl(option: c_int, ...) -> c_int;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn setsid() -> c_int;
    fn setrlimit(resource: c_int, limit: *const RLimit) -> c_int;
    fn chdir(path: *const c_char) -> c_int;
    fn signal(sig: c_int, handler: usize) -> usize;
    fn __errno_location() -> *mut c_int;
    fn strerror(errnum: c_int) -> *const c_char;
}

#[cfg(target_arch = "x86_64")]
const SYS_CLONE: c_long = 56;
#[cfg(target_arch = "x86_64")]
const SYS_CAPSET: c_long = 126;
#[cfg(target_arch = "aarch64")]
const SYS_CLONE: c_long = 220;
#[cfg(target_arch = "aarch64")]
const SYS_CAPSET: c_long = 91;
const SYS_LANDLOCK_CREATE_RULESET: c_long = 444;
const SYS_LANDLOCK_ADD_RULE: c_long = 445;
const SYS_LANDLOCK_RESTRICT_SELF: c_long = 446;

const CLONE_NEWNS: c_int = 0x0002_0000;
const CLONE_NEWUSER: c_int = 0x1000_0000;
const CLONE_NEWCGROUP: c_int = 0x0200_0000;
const CLONE_NEWUTS: c_int = 0x0400_0000;
const CLONE_NEWIPC: c_int = 0x0800_0000;
const CLONE_NEWPID: c_int = 0x2000_0000;
const CLONE_NEWNET: c_int = 0x4000_0000;
const SIGCHLD: c_int = 17;
const SIGKILL: c_int = 9;
const SIG_DFL: usize = 0;
const EINTR: c_int = 4;
const ECHILD: c_int = 10;
const ENOENT: c_int = 2;
const EINVAL: c_int = 22;
const MSG_NOSIGNAL: c_int = 0x4000;
const MSG_CMSG_CLOEXEC: c_int = 0x4000_0000;
const SOL_SOCKET: c_int = 1;
const SCM_RIGHTS: c_int = 1;
const MS_NOSUID: c_ulong = 2;
const MS_NODEV: c_ulong = 4;
const MS_NOEXEC: c_ulong = 8;
const MS_RDONLY: c_ulong = 1;
const MS_REMOUNT: c_ulong = 32;
const MS_BIND: c_ulong = 4096;
const MS_MOVE: c_ulong = 8192;
const MS_REC: c_ulong = 16384;
const MNT_DETACH: c_int = 2;
const O_PATH: c_int = 0o1000_0000;
const O_CLOEXEC: c_int = 0o200_0000;
const O_WRONLY: c_int = 1;
const AF_INET: c_int = 2;
const SOCK_DGRAM: c_int = 2;
const SIOCGIFFLAGS: c_ulong = 0x8913;
const SIOCSIFFLAGS: c_ulong = 0x8914;
const IFF_UP: i16 = 1;
const RLIMIT_CPU: c_int = 0;
const RLIMIT_CORE: c_int = 4;
const RLIMIT_NOFILE: c_int = 7;
const RLIMIT_SIGPENDING: c_int = 11;
const RLIMIT_MSGQUEUE: c_int = 12;
/// Per-user counters a program may hold in its user namespace (as `jail/program.rs`
/// sets them on the cold path): pending signals, and bytes in POSIX message queues.
const COUNTER_RLIMITS: [(c_int, u64); 2] = [(RLIMIT_SIGPENDING, 1024), (RLIMIT_MSGQUEUE, 65536)];
const RUSAGE_CHILDREN: c_int = -1;
const PR_SET_NAME: c_int = 15;
const PR_CAPBSET_DROP: c_int = 24;
const PR_SET_SECCOMP: c_int = 22;
const PR_SET_NO_NEW_PRIVS: c_int = 38;
const PR_CAP_AMBIENT: c_int = 47;
const PR_CAP_AMBIENT_CLEAR_ALL: c_ulong = 4;
const SECCOMP_MODE_FILTER: c_ulong = 2;

// Landlock (linux/landlock.h): access rights by the ABI that introduced them.
const LL_EXECUTE: u64 = 1;
const LL_WRITE_FILE: u64 = 2;
const LL_READ_FILE: u64 = 4;
const LL_READ_DIR: u64 = 8;
const LL_ABI1: u64 = 0x1FFF;
const LL_REFER: u64 = 0x2000;
const LL_TRUNCATE: u64 = 0x4000;
const LL_IOCTL_DEV: u64 = 0x8000;
const LL_SCOPE_ALL: u64 = 0x3;
const LL_TARGET_ABI: c_long = 6;
const LL_RULE_PATH_BENEATH: c_int = 1;
const LL_CREATE_RULESET_VERSION: c_uint = 1;

/// Limits of a run's user namespace (`/proc/sys/user`, written through the run's /proc
/// while it is staged): how much of the host user's inotify budget one run may hold (as
/// `jail/mount.rs` sets them on the cold path).
const USER_LIMITS: [(&std::ffi::CStr, &[u8]); 2] = [
    (c"/.gearbox/proc/sys/user/max_inotify_instances", b"16"),
    (c"/.gearbox/proc/sys/user/max_inotify_watches", b"4096"),
];
/// /proc entries a run sees read-only (as the cold path's `jail/mount.rs` makes them).
const PROC_READONLY: [&[u8]; 5] = [b"sys\0", b"sysrq-trigger\0", b"irq\0", b"bus\0", b"fs\0"];
const WRITABLE: [&[u8]; 3] = [b"/work\0", b"/tmp\0", b"/dev/shm\0"];
const DEVICES: [&[u8]; 5] = [
    b"/dev/null\0",
    b"/dev/zero\0",
    b"/dev/full\0",
    b"/dev/random\0",
    b"/dev/urandom\0",
];

#[repr(C)]
struct IoVec {
    base: *mut c_void,
    len: usize,
}

#[repr(C)]
struct MsgHdr {
    name: *mut c_void,
    namelen: c_uint,
    iov: *mut IoVec,
    iovlen: usize,
    control: *mut c_void,
    controllen: usize,
    flags: c_int,
}

#[repr(C)]
struct CmsgHdr {
    len: usize,
    level: c_int,
    ty: c_int,
}

#[repr(C)]
struct TimeVal {
    sec: i64,
    usec: i64,
}

#[repr(C)]
struct RUsage {
    utime: TimeVal,
    stime: TimeVal,
    maxrss: c_long,
    rest: [c_long; 13],
}

#[repr(C)]
struct RLimit {
    cur: u64,
    max: u64,
}

#[repr(C, packed)]
struct PathBeneath {
    allowed: u64,
    parent_fd: i32,
}

/// The kernel's `struct sock_fprog`: a compiled seccomp filter.
#[repr(C)]
pub struct SockFprog {
    len: u16,
    filter: *const c_void,
}

/// What the fork server serves with, built by [`gb_config`].
#[repr(C)]
pub struct Config {
    control_fd: c_int,
    disk_mb: u64,
    open_files: u64,
    cpu_s: u64,
    nfilters: u32,
    filters: *const *const SockFprog,
    /// The interpreter's own process name, NUL-terminated, which each program takes back.
    program_name: *const c_char,
    /// How many seccomp filters the fork server installs in itself (every program inherits
    /// them; `filters` are the rest of the policy), and they.
    inherited: u32,
    server_filters: *const *const SockFprog,
}

/// What a program gets back: its control socket (stdio is on 0, 1, 2), which it closes
/// before any of the run's code runs. How the program ended is never its to say: the run's
/// init reports it from the wait status.
#[repr(C)]
pub struct Handed {
    chan: c_int,
}

fn errno() -> c_int {
    // SAFETY: glibc's per-thread errno location.
    unsafe { *__errno_location() }
}

/// A step that failed: its name and the errno it failed with.
struct Fail(&'static str, c_int);

fn check(r: c_int, step: &'static str) -> Result<c_int, Fail> {
    if r < 0 {
        Err(Fail(step, errno()))
    } else {
        Ok(r)
    }
}

/// A JSON message built on the stack (no allocation: the heap is the interpreter's, and a
/// write to it would copy a page).
struct Buf {
    data: [u8; 512],
    len: usize,
}

impl Buf {
    fn new() -> Buf {
        Buf {
            data: [0; 512],
            len: 0,
        }
    }
}

impl std::fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let b = s.as_bytes();
        if self.len + b.len() > self.data.len() {
            return Err(std::fmt::Error);
        }
        self.data[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        Ok(())
    }
}

fn send_buf(chan: c_int, buf: &Buf) {
    // SAFETY: sends bytes from a buffer on this stack frame.
    unsafe { send(chan, buf.data.as_ptr().cast(), buf.len, MSG_NOSIGNAL) };
}

fn send_str(chan: c_int, msg: &str) {
    // SAFETY: sends bytes from a static string.
    unsafe { send(chan, msg.as_ptr().cast(), msg.len(), MSG_NOSIGNAL) };
}

fn send_failed(chan: c_int, fail: &Fail) {
    // SAFETY: strerror returns a NUL-terminated string that stays valid until the next call.
    let text = unsafe { std::ffi::CStr::from_ptr(strerror(fail.1)) };
    let text = text.to_str().unwrap_or("error");
    let mut buf = Buf::new();
    // Steps are this file's constants and strerror's texts carry no quotes or backslashes.
    let _ = write!(
        buf,
        "{{\"t\":\"failed\",\"step\":\"{}\",\"message\":\"{}\"}}",
        fail.0,
        text.replace(['"', '\\'], "'")
    );
    send_buf(chan, &buf);
}

fn set_name(name: *const c_char) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string (the kernel keeps 15 bytes).
    unsafe { prctl(PR_SET_NAME, name) };
}

/// The fork server's config: the limits given, the interpreter's own name (read now, before
/// the fork server renames itself; each program takes it back), and the seccomp policy in
/// two parts from `/.gearbox` (`jail/seccomp.rs`, `compile_split`): `seccomp-server-N.bpf`,
/// which [`gb_serve`] installs in the fork server, and `seccomp-N.bpf`, which each program
/// adds. Lives as long as the process; null if the filters cannot be read.
///
/// # Safety
/// Reads files and allocates: call before serving, from one thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gb_config(
    control_fd: c_int,
    disk_mb: u64,
    open_files: u64,
    cpu_s: u64,
) -> *const Config {
    let name = std::fs::read("/proc/self/comm").unwrap_or_default();
    let name = std::ffi::CString::new(name.trim_ascii()).unwrap_or_default();
    let mut names: Vec<String> = std::fs::read_dir("/.gearbox")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("seccomp-") && n.ends_with(".bpf"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let (mut server, mut filters) = (Vec::new(), Vec::new());
    for file in names {
        let Ok(program) = std::fs::read(format!("/.gearbox/{file}")) else {
            return std::ptr::null();
        };
        let program: &'static [u8] = Box::leak(program.into_boxed_slice());
        let prog: *const SockFprog = Box::leak(Box::new(SockFprog {
            len: (program.len() / 8) as u16,
            filter: program.as_ptr().cast(),
        }));
        if file.starts_with("seccomp-server-") {
            server.push(prog);
        } else {
            filters.push(prog);
        }
    }
    if server.is_empty() || filters.is_empty() {
        return std::ptr::null();
    }
    let server: &'static [*const SockFprog] = Box::leak(server.into_boxed_slice());
    let filters: &'static [*const SockFprog] = Box::leak(filters.into_boxed_slice());
    Box::leak(Box::new(Config {
        control_fd,
        disk_mb,
        open_files,
        cpu_s,
        nfilters: filters.len() as u32,
        filters: filters.as_ptr(),
        program_name: Box::leak(name.into_boxed_c_str()).as_ptr(),
        inherited: server.len() as u32,
        server_filters: server.as_ptr(),
    }))
}

/// Install the fork server's part of the seccomp policy, then serve slot requests on
/// `config.control_fd` until it closes (returns 1 in the fork server; -1 if it cannot), or
/// return 0 in a program, restricted and waiting for its hand-over on fd 0,
/// with its control socket in `out`. Call with SIGCHLD ignored (the runs'
/// inits are reaped by the kernel).
///
/// # Safety
/// `config` and `out` point to valid structures; the caller holds the GIL and the process
/// has one thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gb_serve(config: *const Config, out: *mut Handed) -> c_int {
    // SAFETY: the caller passes a valid config.
    let config = unsafe { &*config };
    // The part of the seccomp policy that neither this loop nor a run's init calls: installed
    // here once, inherited by every program.
    for i in 0..config.inherited as usize {
        // SAFETY: the config's filters live as long as this process.
        if unsafe {
            prctl(
                PR_SET_SECCOMP,
                SECCOMP_MODE_FILTER,
                *config.server_filters.add(i),
            )
        } != 0
        {
            return -1;
        }
    }
    loop {
        let mut fds = [-1 as c_int; 8];
        let n = receive(config.control_fd, &mut fds);
        if n < 0 {
            if errno() == EINTR {
                continue;
            }
            return -1;
        }
        if n == 0 {
            return 1;
        }
        let count = fds.iter().filter(|&&fd| fd >= 0).count();
        if count != 4 {
            close_all(&fds);
            continue;
        }
        // A user namespace of its own too: the run's kernel counters (processes, pending
        // signals, inotify, message queues) are its own, not shared with the other runs of
        // this fork server, and it owns its other namespaces.
        let flags =
            CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID;
        // The ids the run keeps, read here: in the new user namespace they read as unmapped
        // until init maps them.
        // SAFETY: getuid and getgid take nothing.
        let ids = unsafe { (getuid(), getgid()) };
        // SAFETY: a fork into new namespaces (no new stack, no shared memory); this process
        // has one thread.
        let pid = unsafe {
            syscall(
                SYS_CLONE,
                (flags | SIGCHLD) as c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid == 0 {
            // SAFETY: `out` is valid; init returns only in the program.
            unsafe { *out = init(config, [fds[0], fds[1], fds[2], fds[3]], ids) };
            return 0;
        }
        if pid < 0 {
            send_failed(fds[0], &Fail("new namespaces", errno()));
        }
        close_all(&fds);
    }
}

/// One slot request: a packet with its fds (up to 8 kept); the byte count, 0 at EOF.
fn receive(control: c_int, fds: &mut [c_int; 8]) -> isize {
    let mut byte = [0u8; 64];
    let mut iov = IoVec {
        base: byte.as_mut_ptr().cast(),
        len: byte.len(),
    };
    // CMSG_SPACE(8 * 4): the header (16 bytes) and the fds.
    let mut control_buf = [0u64; 8];
    let mut msg = MsgHdr {
        name: std::ptr::null_mut(),
        namelen: 0,
        iov: &mut iov,
        iovlen: 1,
        control: control_buf.as_mut_ptr().cast(),
        controllen: std::mem::size_of_val(&control_buf),
        flags: 0,
    };
    // SAFETY: every pointer in `msg` points to a buffer on this stack frame.
    let n = unsafe { recvmsg(control, &mut msg, MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return n;
    }
    let hdr_len = std::mem::size_of::<CmsgHdr>();
    if msg.controllen >= hdr_len {
        // SAFETY: the kernel wrote one control message at the start of the buffer.
        let hdr = unsafe { &*(control_buf.as_ptr() as *const CmsgHdr) };
        if hdr.level == SOL_SOCKET && hdr.ty == SCM_RIGHTS && hdr.len >= hdr_len {
            let count = ((hdr.len - hdr_len) / 4).min(8);
            // SAFETY: `count` fds follow the header inside the buffer.
            let data = unsafe { (control_buf.as_ptr() as *const u8).add(hdr_len) as *const c_int };
            for (i, fd) in fds.iter_mut().enumerate().take(count) {
                // SAFETY: within the `count` fds the kernel wrote.
                *fd = unsafe { data.add(i).read_unaligned() };
            }
        }
    }
    n
}

fn close_all(fds: &[c_int]) {
    for &fd in fds {
        if fd >= 0 {
            // SAFETY: an fd this process received and owns.
            unsafe { close(fd) };
        }
    }
}

/// Pid 1 of a run. Returns only in the program.
fn init(config: &Config, fds: [c_int; 4], (uid, gid): (u32, u32)) -> Handed {
    let [chan, stdin, stdout, stderr] = fds;
    set_name(c"gb-init".as_ptr());
    // SAFETY: plain fd and signal calls on this process.
    unsafe {
        signal(SIGCHLD, SIG_DFL);
        close(config.control_fd);
    }
    if let Err(fail) = map_ids(uid, gid) {
        send_failed(chan, &fail);
        // SAFETY: ends this process.
        unsafe { _exit(1) };
    }
    send_str(chan, "{\"t\":\"hello\"}");
    let mut go = [0u8; 64];
    // SAFETY: reads into a buffer on this stack frame.
    if unsafe { recv(chan, go.as_mut_ptr().cast(), go.len(), 0) } <= 0 {
        // SAFETY: ends this process.
        unsafe { _exit(0) };
    }
    if let Err(fail) = build(config) {
        send_failed(chan, &fail);
        // SAFETY: ends this process.
        unsafe { _exit(1) };
    }
    // SAFETY: this process has one thread; glibc's fork sets the child's thread id.
    let child = unsafe { fork() };
    if child == 0 {
        return program(config, chan, stdin, stdout, stderr);
    }
    if child < 0 {
        send_failed(chan, &Fail("fork program", errno()));
        // SAFETY: ends this process.
        unsafe { _exit(1) };
    }
    close_all(&[stdin, stdout, stderr]);
    send_str(chan, "{\"t\":\"ready\"}");
    let mut buf = Buf::new();
    let _ = write!(buf, "{{\"t\":\"exited\",");
    let mut status: c_int = 0;
    loop {
        // SAFETY: waits for this process's children, writing the status on this frame.
        let pid = unsafe { waitpid(-1, &mut status, 0) };
        if pid == child {
            let code = status & 0x7f;
            if code == 0 {
                let _ = write!(buf, "\"code\":{},\"signal\":null,", (status >> 8) & 0xff);
            } else {
                let _ = write!(buf, "\"code\":null,\"signal\":{code},");
            }
            break;
        }
        if pid < 0 && errno() == ECHILD {
            let _ = write!(buf, "\"code\":null,\"signal\":null,");
            break;
        }
    }
    let (cpu_us, maxrss) = rusage(RUSAGE_CHILDREN);
    let _ = write!(
        buf,
        "\"cpu_time_ms\":{},\"max_rss_kb\":{}}}",
        cpu_us / 1000,
        maxrss
    );
    send_buf(chan, &buf);
    // Whatever the program left behind dies with this pid namespace.
    // SAFETY: signals every process of this pid namespace, then ends this one.
    unsafe {
        kill(-1, SIGKILL);
        _exit(0)
    }
}

/// CPU time (user and system, µs) and peak RSS (KiB) of `who` (RUSAGE_CHILDREN).
fn rusage(who: c_int) -> (i64, c_long) {
    let mut u = RUsage {
        utime: TimeVal { sec: 0, usec: 0 },
        stime: TimeVal { sec: 0, usec: 0 },
        maxrss: 0,
        rest: [0; 13],
    };
    // SAFETY: getrusage writes the structure on this frame.
    unsafe { getrusage(who, &mut u) };
    let us = (u.utime.sec + u.stime.sec) * 1_000_000 + u.utime.usec + u.stime.usec;
    (us, u.maxrss)
}

/// Map the sandbox user (the fork server's uid and gid, 1000) to itself in the run's new
/// user namespace, as an unprivileged process may for its own ids (setgroups denied first).
fn map_ids(uid: u32, gid: u32) -> Result<(), Fail> {
    let mut uid_map = Buf::new();
    let _ = write!(uid_map, "{uid} {uid} 1");
    let mut gid_map = Buf::new();
    let _ = write!(gid_map, "{gid} {gid} 1");
    write_file(c"/proc/self/setgroups", b"deny", "map ids")?;
    write_file(
        c"/proc/self/gid_map",
        &gid_map.data[..gid_map.len],
        "map ids",
    )?;
    write_file(
        c"/proc/self/uid_map",
        &uid_map.data[..uid_map.len],
        "map ids",
    )
}

/// Write `content` to the existing file at `path` in one write.
fn write_file(path: &std::ffi::CStr, content: &[u8], step: &'static str) -> Result<(), Fail> {
    // SAFETY: open, write and close with a NUL-terminated path and a buffer of `content`.
    unsafe {
        let fd = check(open(path.as_ptr(), O_WRONLY | O_CLOEXEC), step)?;
        let n = write(fd, content.as_ptr().cast(), content.len());
        let e = errno();
        close(fd);
        if n != content.len() as isize {
            return Err(Fail(step, e));
        }
    }
    Ok(())
}

/// The run's own namespaces' contents: once the server has put init in the run's cgroup,
/// a cgroup namespace, scratch tmpfs for /work, /tmp and /dev/shm, the hostname, a /proc of
/// this pid namespace, and loopback.
fn build(config: &Config) -> Result<(), Fail> {
    // SAFETY: every call below passes NUL-terminated strings from this frame or statics.
    unsafe {
        // After the move into the run's cgroup, so that the namespace's root is that cgroup.
        check(unshare(CLONE_NEWCGROUP), "new cgroup namespace")?;
        let inodes = (config.disk_mb * 64).clamp(1024, 1 << 20);
        let mut data = Buf::new();
        let _ = write!(
            data,
            "size={}m,nr_inodes={},mode=0755\0",
            config.disk_mb, inodes
        );
        let stage = c"/.gearbox/stage".as_ptr();
        check(
            mount(
                c"tmpfs".as_ptr(),
                stage,
                c"tmpfs".as_ptr(),
                MS_NOSUID | MS_NODEV,
                data.data.as_ptr().cast(),
            ),
            "mount scratch tmpfs",
        )?;
        let subs: [(&std::ffi::CStr, c_uint, &std::ffi::CStr, &'static str); 3] = [
            (c"/.gearbox/stage/work", 0o755, c"/work", "bind /work"),
            (c"/.gearbox/stage/tmp", 0o1777, c"/tmp", "bind /tmp"),
            (c"/.gearbox/stage/shm", 0o1777, c"/dev/shm", "bind /dev/shm"),
        ];
        for (src, mode, target, step) in subs {
            check(mkdir(src.as_ptr(), 0o700), "create scratch directory")?;
            check(chmod(src.as_ptr(), mode), "create scratch directory")?;
            check(
                mount(
                    src.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    MS_BIND,
                    std::ptr::null(),
                ),
                step,
            )?;
        }
        check(umount2(stage, MNT_DETACH), "detach scratch stage")?;
        check(sethostname(c"gearbox".as_ptr(), 7), "set hostname")?;
        let staged = c"/.gearbox/proc".as_ptr();
        check(
            mount(
                c"proc".as_ptr(),
                staged,
                c"proc".as_ptr(),
                MS_NOSUID | MS_NODEV | MS_NOEXEC,
                std::ptr::null(),
            ),
            "mount /proc",
        )?;
        // The run's share of the host user's kernel counters, set in its own user namespace
        // before /proc/sys turns read-only.
        for (path, value) in USER_LIMITS {
            write_file(path, value, "limit the run's kernel counters")?;
        }
        for sub in PROC_READONLY {
            let mut path = [0u8; 64];
            let prefix = b"/.gearbox/proc/";
            path[..prefix.len()].copy_from_slice(prefix);
            path[prefix.len()..prefix.len() + sub.len()].copy_from_slice(sub);
            let p = path.as_ptr().cast::<c_char>();
            if access(p, 0) != 0 {
                continue;
            }
            check(
                mount(p, p, std::ptr::null(), MS_BIND | MS_REC, std::ptr::null()),
                "bind /proc entry",
            )?;
            check(
                mount(
                    std::ptr::null(),
                    p,
                    std::ptr::null(),
                    MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                    std::ptr::null(),
                ),
                "make /proc entry read-only",
            )?;
        }
        // The fork server's /proc (which shows every run of this fork server) leaves the
        // tree where it can; in the run's user namespace it is locked to its place (mounts
        // inherited from a more privileged namespace cannot be taken away), so the run's own
        // covers it.
        if umount2(c"/proc".as_ptr(), MNT_DETACH) != 0 && errno() != EINVAL {
            return Err(Fail("detach fork server /proc", errno()));
        }
        check(
            mount(
                staged,
                c"/proc".as_ptr(),
                std::ptr::null(),
                MS_MOVE,
                std::ptr::null(),
            ),
            "move /proc",
        )?;
        let s = check(socket(AF_INET, SOCK_DGRAM, 0), "bring up loopback")?;
        let mut ifreq = [0u8; 40];
        ifreq[..2].copy_from_slice(b"lo");
        let r = ioctl(s, SIOCGIFFLAGS, ifreq.as_mut_ptr());
        if r == 0 {
            let flags = i16::from_ne_bytes([ifreq[16], ifreq[17]]) | IFF_UP;
            ifreq[16..18].copy_from_slice(&flags.to_ne_bytes());
        }
        let r = if r == 0 {
            ioctl(s, SIOCSIFFLAGS, ifreq.as_mut_ptr())
        } else {
            r
        };
        let e = errno();
        close(s);
        if r != 0 {
            return Err(Fail("bring up loopback", e));
        }
    }
    Ok(())
}

/// The program: restricted exactly as the cold path restricts a program before exec
/// (`jail/program.rs`), then back to Python. A failed step is reported and ends it.
fn program(config: &Config, chan: c_int, stdin: c_int, stdout: c_int, stderr: c_int) -> Handed {
    set_name(config.program_name);
    if let Err(fail) = renew_openssl() {
        send_failed(chan, &fail);
        // SAFETY: ends this process.
        unsafe { _exit(127) }
    }
    match restrict(config, [stdin, stdout, stderr]) {
        Ok(landlock) => {
            let mut buf = Buf::new();
            let _ = write!(
                buf,
                "{{\"t\":\"applied\",\"mechanisms\":[\"capabilities: none\",\"no_new_privs\",\"{landlock}\",\"seccomp: {} filters (allow list; {} set in the fork server)\"]}}",
                config.nfilters + config.inherited,
                config.inherited
            );
            send_buf(chan, &buf);
            Handed { chan }
        }
        Err(fail) => {
            send_failed(chan, &fail);
            // SAFETY: ends this process.
            unsafe { _exit(127) }
        }
    }
}

fn restrict(config: &Config, stdio: [c_int; 3]) -> Result<&'static str, Fail> {
    // SAFETY: fd, rlimit, capability and prctl calls with structures on this frame; the
    // seccomp filters are the fork server's, valid for its whole life.
    unsafe {
        for (target, fd) in stdio.into_iter().enumerate() {
            check(dup2(fd, target as c_int), "set up stdio")?;
            close(fd);
        }
        check(setsid(), "new session")?;
        let limit = |cur: u64, max: u64| RLimit { cur, max };
        check(setrlimit(RLIMIT_CORE, &limit(0, 0)), "set rlimits")?;
        check(
            setrlimit(RLIMIT_NOFILE, &limit(config.open_files, config.open_files)),
            "set rlimits",
        )?;
        check(
            setrlimit(RLIMIT_CPU, &limit(config.cpu_s, config.cpu_s + 1)),
            "set rlimits",
        )?;
        for (resource, value) in COUNTER_RLIMITS {
            check(setrlimit(resource, &limit(value, value)), "set rlimits")?;
        }
        check(chdir(c"/work".as_ptr()), "enter /work")?;
        // A new user namespace starts with a full bounding set: empty it (CAP_SETPCAP is
        // still held here; EINVAL past the kernel's last capability ends the loop).
        for cap in 0..64 as c_ulong {
            if prctl(
                PR_CAPBSET_DROP,
                cap,
                0 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
            ) != 0
            {
                break;
            }
        }
        prctl(
            PR_CAP_AMBIENT,
            PR_CAP_AMBIENT_CLEAR_ALL,
            0 as c_ulong,
            0 as c_ulong,
            0 as c_ulong,
        );
        let header: [u32; 2] = [0x2008_0522, 0];
        let data = [0u32; 6];
        check(
            syscall(SYS_CAPSET, header.as_ptr(), data.as_ptr()) as c_int,
            "drop capabilities",
        )?;
        check(
            prctl(
                PR_SET_NO_NEW_PRIVS,
                1 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
                0 as c_ulong,
            ),
            "set no_new_privs",
        )?;
        let landlock = landlock()?;
        for i in 0..config.nfilters as usize {
            let f = *config.filters.add(i);
            check(
                prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, f),
                "install seccomp filter",
            )?;
        }
        Ok(landlock)
    }
}

/// The rules of `jail/landlock.rs`: everything readable and executable, the writable areas
/// fully usable, the device nodes readable and writable, signals and abstract unix sockets
/// scoped to the sandbox (ABI 6); best effort on older kernels.
unsafe fn landlock() -> Result<&'static str, Fail> {
    // SAFETY: Landlock system calls with structures on this frame and static paths.
    unsafe {
        let abi = syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            std::ptr::null::<c_void>(),
            0usize,
            LL_CREATE_RULESET_VERSION,
        );
        if abi < 1 {
            return Ok("landlock: not enforced (kernel lacks it)");
        }
        let abi = abi.min(LL_TARGET_ABI);
        let mut handled = LL_ABI1;
        if abi >= 2 {
            handled |= LL_REFER;
        }
        if abi >= 3 {
            handled |= LL_TRUNCATE;
        }
        if abi >= 5 {
            handled |= LL_IOCTL_DEV;
        }
        let scoped = if abi >= 6 { LL_SCOPE_ALL } else { 0 };
        let attr: [u64; 3] = [handled, 0, scoped];
        let fd = check(
            syscall(
                SYS_LANDLOCK_CREATE_RULESET,
                attr.as_ptr(),
                24usize,
                0 as c_uint,
            ) as c_int,
            "landlock: create ruleset",
        )?;
        let read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR;
        let device =
            (LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV) & handled;
        let rules = std::iter::once((&b"/\0"[..], read))
            .chain(WRITABLE.iter().map(|w| (*w, handled)))
            .chain(DEVICES.iter().map(|d| (*d, device)));
        let mut result = Ok(());
        for (path, access) in rules {
            let parent = open(path.as_ptr().cast(), O_PATH | O_CLOEXEC);
            if parent < 0 {
                continue;
            }
            let rule = PathBeneath {
                allowed: access,
                parent_fd: parent,
            };
            let r = syscall(
                SYS_LANDLOCK_ADD_RULE,
                fd,
                LL_RULE_PATH_BENEATH,
                &rule as *const PathBeneath,
                0 as c_uint,
            );
            let e = errno();
            close(parent);
            if r < 0 {
                result = Err(Fail("landlock: add rule", e));
                break;
            }
        }
        if result.is_ok() && syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0 as c_uint) < 0 {
            result = Err(Fail("landlock: restrict", errno()));
        }
        close(fd);
        result?;
        Ok(if abi >= LL_TARGET_ABI {
            "landlock: fully enforced"
        } else {
            "landlock: partially enforced (older kernel ABI)"
        })
    }
}

// Fresh entropy. A program is a fork of the fork server: every random generator the
// interpreter keeps in memory holds the same state in every program unless it is renewed
// after the fork. Python reseeds `random` itself (its at-fork hook, run by
// `PyOS_AfterFork_Child`), and `os.urandom`, `secrets` and `uuid` ask the kernel each time.
// OpenSSL's generators (behind Node's `crypto`, and Python's `ssl` and `hashlib` when the
// fork server has them loaded) detect a fork by a change of pid, which never happens here:
// each program is pid 2 of its own pid namespace, as the fork server is of its own. So each
// program reseeds them, and a program whose generators cannot be renewed does not run.
// V8's generators are Node's part (`renew_v8`).

type RandGet0 = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type RandReseed =
    unsafe extern "C" fn(*mut c_void, c_int, *const u8, usize, *const u8, usize) -> c_int;
const RTLD_LAZY: c_int = 1;
const RTLD_NOLOAD: c_int = 4;
const EIO: c_int = 5;

/// `N` bytes from the kernel's random pool.
fn fresh<const N: usize>() -> Result<[u8; N], Fail> {
    let mut buf = [0u8; N];
    // SAFETY: getrandom writes at most N bytes into the buffer on this frame.
    let n = unsafe { getrandom(buf.as_mut_ptr().cast(), N, 0) };
    if n != N as isize {
        return Err(Fail("read fresh entropy", errno()));
    }
    Ok(buf)
}

/// A symbol of OpenSSL's libcrypto if this process has it: exported by the executable (Node
/// links OpenSSL in) or in a libcrypto already loaded (Python loads it privately with `ssl`
/// or `hashlib`). Never loads one.
fn openssl_symbol(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT (null) and a NUL-terminated name.
    let p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
    if !p.is_null() {
        return p;
    }
    for lib in [c"libcrypto.so.3", c"libcrypto.so"] {
        // SAFETY: RTLD_NOLOAD returns a handle only to a library already loaded.
        let handle = unsafe { dlopen(lib.as_ptr(), RTLD_LAZY | RTLD_NOLOAD) };
        if !handle.is_null() {
            // SAFETY: dlsym on a valid handle with a NUL-terminated name.
            return unsafe { dlsym(handle, name.as_ptr()) };
        }
    }
    std::ptr::null_mut()
}

/// Reseed OpenSSL's primary, public and private generators (OpenSSL 3), each with fresh
/// entropy from its parent and fresh additional input from the kernel. Nothing to do where
/// no OpenSSL is loaded; an OpenSSL that is loaded but cannot be reseeded is an error.
fn renew_openssl() -> Result<(), Fail> {
    let reseed = openssl_symbol(c"EVP_RAND_reseed");
    let getters = [
        openssl_symbol(c"RAND_get0_primary"),
        openssl_symbol(c"RAND_get0_public"),
        openssl_symbol(c"RAND_get0_private"),
    ];
    if reseed.is_null() && getters.iter().all(|g| g.is_null()) {
        if !openssl_symbol(c"RAND_bytes").is_null() {
            // An OpenSSL without these (1.1) keeps generators we cannot renew.
            return Err(Fail("renew OpenSSL's random generators", EIO));
        }
        return Ok(());
    }
    if reseed.is_null() || getters.iter().any(|g| g.is_null()) {
        return Err(Fail("renew OpenSSL's random generators", EIO));
    }
    // SAFETY: the symbols are OpenSSL 3's functions of these names and C signatures.
    let reseed: RandReseed = unsafe { std::mem::transmute(reseed) };
    for getter in getters {
        // SAFETY: as above.
        let get: RandGet0 = unsafe { std::mem::transmute(getter) };
        let input = fresh::<32>()?;
        // SAFETY: the default library context (null); OpenSSL copies the input.
        let ok = unsafe {
            let ctx = get(std::ptr::null_mut());
            !ctx.is_null() && reseed(ctx, 0, std::ptr::null(), 0, input.as_ptr(), input.len()) == 1
        };
        if !ok {
            return Err(Fail("renew OpenSSL's random generators", EIO));
        }
    }
    Ok(())
}

// The Node-API entry: `node_zygote.js` loads this file with `process.dlopen` and calls the
// functions below. Node-API's functions are looked up in the running process (dlsym), so the
// same file also loads in Python, where they do not exist.

type NapiEnv = *mut c_void;
type NapiValue = *mut c_void;
type NapiInfo = *mut c_void;
type NapiCallback = unsafe extern "C" fn(NapiEnv, NapiInfo) -> NapiValue;

unsafe extern "C" {
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    fn getpid() -> c_int;
    fn getppid() -> c_int;
    fn eventfd(initval: c_uint, flags: c_int) -> c_int;
    fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
}

const F_GETFD: c_int = 1;
const F_SETFD: c_int = 2;
const FD_CLOEXEC: c_int = 1;
const RLIMIT_FSIZE: c_int = 1;
const SIG_IGN: usize = 1;
const MADV_DOFORK: c_int = 11;
const EFD_CLOEXEC: c_int = O_CLOEXEC;

/// The Node-API functions used here (`js_native_api.h`, `node_api.h`) and libuv's
/// `uv_loop_fork`, all exported by the node binary.
struct Napi {
    create_function: unsafe extern "C" fn(
        NapiEnv,
        *const c_char,
        usize,
        NapiCallback,
        *mut c_void,
        *mut NapiValue,
    ) -> c_int,
    set_named_property: unsafe extern "C" fn(NapiEnv, NapiValue, *const c_char, NapiValue) -> c_int,
    get_cb_info: unsafe extern "C" fn(
        NapiEnv,
        NapiInfo,
        *mut usize,
        *mut NapiValue,
        *mut NapiValue,
        *mut *mut c_void,
    ) -> c_int,
    get_value_int64: unsafe extern "C" fn(NapiEnv, NapiValue, *mut i64) -> c_int,
    create_int64: unsafe extern "C" fn(NapiEnv, i64, *mut NapiValue) -> c_int,
    create_array_with_length: unsafe extern "C" fn(NapiEnv, usize, *mut NapiValue) -> c_int,
    set_element: unsafe extern "C" fn(NapiEnv, NapiValue, u32, NapiValue) -> c_int,
    get_null: unsafe extern "C" fn(NapiEnv, *mut NapiValue) -> c_int,
    throw_error: unsafe extern "C" fn(NapiEnv, *const c_char, *const c_char) -> c_int,
    get_uv_event_loop: unsafe extern "C" fn(NapiEnv, *mut *mut c_void) -> c_int,
    uv_loop_fork: unsafe extern "C" fn(*mut c_void) -> c_int,
    /// `v8::Isolate::GetCurrent()`, `v8::Isolate::GetCurrentContext()` (a `Local` is one
    /// pointer), `node::GetCurrentEnvironment(Local<Context>)` and
    /// `node::AtExit(Environment*, void (*)(void*), void*)`: Node's C++ API, the only way to
    /// run code after Node has printed an uncaught exception and before it tears down its
    /// platform (whose threads a fork does not have).
    isolate_current: unsafe extern "C" fn() -> *mut c_void,
    isolate_context: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    current_environment: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    at_exit: unsafe extern "C" fn(*mut c_void, unsafe extern "C" fn(*mut c_void), *mut c_void),
    /// `node::GetMultiIsolatePlatform(Environment*)` and the two `NodePlatform` methods through which V8 hands work to the platform's
    /// worker threads (found in its vtable by address, see [`adopt_worker_tasks`]).
    platform_of: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    /// V8's generators, renewed in each program (see [`renew_v8`]):
    /// `v8::internal::Isolate::random_number_generator()`,
    /// `v8::base::RandomNumberGenerator::SetSeed(int64_t)`,
    /// `v8::base::OS::SetRandomMmapSeed(int64_t)` and
    /// `v8::internal::MathRandom::ResetContext(Context)` (a `Context` is one tagged pointer).
    isolate_rng: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    rng_set_seed: unsafe extern "C" fn(*mut c_void, i64),
    mmap_set_seed: unsafe extern "C" fn(i64),
    math_random_reset: unsafe extern "C" fn(usize),
    call_on_worker: *const c_void,
    call_delayed_on_worker: *const c_void,
}

// SAFETY: function addresses, read-only after they are found.
unsafe impl Sync for Napi {}
unsafe impl Send for Napi {}

static NAPI: std::sync::OnceLock<Option<Napi>> = std::sync::OnceLock::new();

fn napi() -> Option<&'static Napi> {
    NAPI.get_or_init(|| {
        let find = |name: &std::ffi::CStr| {
            // SAFETY: dlsym with RTLD_DEFAULT (null) and a NUL-terminated name.
            let p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        // SAFETY: each symbol is the Node-API (or libuv) function of that name, whose C
        // signature is the field's type.
        unsafe {
            Some(Napi {
                create_function: std::mem::transmute(find(c"napi_create_function")?),
                set_named_property: std::mem::transmute(find(c"napi_set_named_property")?),
                get_cb_info: std::mem::transmute(find(c"napi_get_cb_info")?),
                get_value_int64: std::mem::transmute(find(c"napi_get_value_int64")?),
                create_int64: std::mem::transmute(find(c"napi_create_int64")?),
                create_array_with_length: std::mem::transmute(find(
                    c"napi_create_array_with_length",
                )?),
                set_element: std::mem::transmute(find(c"napi_set_element")?),
                get_null: std::mem::transmute(find(c"napi_get_null")?),
                throw_error: std::mem::transmute(find(c"napi_throw_error")?),
                get_uv_event_loop: std::mem::transmute(find(c"napi_get_uv_event_loop")?),
                uv_loop_fork: std::mem::transmute(find(c"uv_loop_fork")?),
                isolate_current: std::mem::transmute(find(c"_ZN2v87Isolate10GetCurrentEv")?),
                isolate_context: std::mem::transmute(find(c"_ZN2v87Isolate17GetCurrentContextEv")?),
                current_environment: std::mem::transmute(find(
                    c"_ZN4node21GetCurrentEnvironmentEN2v85LocalINS0_7ContextEEE",
                )?),
                at_exit: std::mem::transmute(find(c"_ZN4node6AtExitEPNS_11EnvironmentEPFvPvES2_")?),
                platform_of: std::mem::transmute(find(
                    c"_ZN4node23GetMultiIsolatePlatformEPNS_11EnvironmentE",
                )?),
                isolate_rng: std::mem::transmute(find(
                    c"_ZN2v88internal7Isolate23random_number_generatorEv",
                )?),
                rng_set_seed: std::mem::transmute(find(
                    c"_ZN2v84base21RandomNumberGenerator7SetSeedEl",
                )?),
                mmap_set_seed: std::mem::transmute(find(c"_ZN2v84base2OS17SetRandomMmapSeedEl")?),
                math_random_reset: std::mem::transmute(find(
                    c"_ZN2v88internal10MathRandom12ResetContextENS0_7ContextE",
                )?),
                call_on_worker: find(
                    c"_ZN4node12NodePlatform18CallOnWorkerThreadESt10unique_ptrIN2v84TaskESt14default_deleteIS3_EE",
                )?,
                call_delayed_on_worker: find(
                    c"_ZN4node12NodePlatform25CallDelayedOnWorkerThreadESt10unique_ptrIN2v84TaskESt14default_deleteIS3_EEd",
                )?,
            })
        }
    })
    .as_ref()
}

/// The module's exports: `serve`, `limits` and `usage`.
///
/// # Safety
/// Called by Node with a valid environment and exports object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn napi_register_module_v1(env: NapiEnv, exports: NapiValue) -> NapiValue {
    let Some(n) = napi() else {
        return exports;
    };
    let functions: [(&std::ffi::CStr, NapiCallback); 5] = [
        (c"adopt", node_adopt),
        (c"serve", node_serve),
        (c"limits", node_limits),
        (c"exitCode", node_exit_code),
        (c"exit", node_exit),
    ];
    for (name, f) in functions {
        let mut value = std::ptr::null_mut();
        // SAFETY: Node-API calls on the environment Node passed in.
        unsafe {
            if (n.create_function)(
                env,
                name.as_ptr(),
                usize::MAX,
                f,
                std::ptr::null_mut(),
                &mut value,
            ) == 0
            {
                (n.set_named_property)(env, exports, name.as_ptr(), value);
            }
        }
    }
    exports
}

/// Up to four integer arguments of a call (missing or non-numbers are errors).
unsafe fn int_args<const N: usize>(env: NapiEnv, info: NapiInfo) -> Option<[i64; N]> {
    let n = napi()?;
    let mut argc = N;
    let mut argv = [std::ptr::null_mut(); N];
    let mut out = [0i64; N];
    // SAFETY: Node-API calls with buffers of N values on this frame.
    unsafe {
        if (n.get_cb_info)(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ) != 0
            || argc < N
        {
            return None;
        }
        for (v, o) in argv.iter().zip(out.iter_mut()) {
            if (n.get_value_int64)(env, *v, o) != 0 {
                return None;
            }
        }
    }
    Some(out)
}

unsafe fn throw(env: NapiEnv, message: &str) -> NapiValue {
    if let Some(n) = napi() {
        let text = std::ffi::CString::new(message.replace('\0', "")).unwrap_or_default();
        // SAFETY: throws a new Error in the calling environment.
        unsafe { (n.throw_error)(env, std::ptr::null(), text.as_ptr()) };
    }
    std::ptr::null_mut()
}

unsafe fn int_array(env: NapiEnv, values: &[i64]) -> NapiValue {
    let Some(n) = napi() else {
        return std::ptr::null_mut();
    };
    let mut array = std::ptr::null_mut();
    // SAFETY: Node-API calls on the calling environment.
    unsafe {
        (n.create_array_with_length)(env, values.len(), &mut array);
        for (i, v) in values.iter().enumerate() {
            let mut value = std::ptr::null_mut();
            (n.create_int64)(env, *v, &mut value);
            (n.set_element)(env, array, i as u32, value);
        }
    }
    array
}

/// This process's open fds (from /proc/self/fd), 3 and above.
fn open_fds() -> Vec<c_int> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd: &c_int| fd > 2)
        .collect()
}

/// Node's `Environment` of the calling thread (inside a Node-API call).
unsafe fn environment(n: &Napi) -> *mut c_void {
    // SAFETY: Node's C++ API on the calling thread, inside a call's handle scope.
    unsafe {
        let isolate = (n.isolate_current)();
        let context = (n.isolate_context)(isolate);
        (n.current_environment)(context)
    }
}

/// `adopt()`: from now on V8's worker tasks run on this file's pool (see [`Pool`]). Call
/// first, before the fork server runs anything.
unsafe extern "C" fn node_adopt(env: NapiEnv, _info: NapiInfo) -> NapiValue {
    let Some(n) = napi() else {
        return std::ptr::null_mut();
    };
    new_pool();
    // SAFETY: the calling thread's environment and its platform object.
    let adopted = unsafe {
        let environment = environment(n);
        !environment.is_null() && {
            let platform = (n.platform_of)(environment);
            !platform.is_null() && adopt_worker_tasks(n, platform)
        }
    };
    if !adopted {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "take over the platform's worker tasks") };
    }
    std::ptr::null_mut()
}

/// `serve(controlFd, diskMb, openFiles, cpuS)`: the fork server's loop. Returns `null` in the
/// fork server when the server closes the control socket; in a program, restricted, with a
/// fresh event loop and only its own fds, `[chan, pid, ppid]`.
unsafe extern "C" fn node_serve(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    let Some([control_fd, disk_mb, open_files, cpu_s]) = (unsafe { int_args::<4>(env, info) })
    else {
        // SAFETY: the calling environment.
        return unsafe {
            throw(
                env,
                "serve(controlFd, diskMb, openFiles, cpuS): four integers",
            )
        };
    };
    let Some(n) = napi() else {
        return std::ptr::null_mut();
    };
    // SAFETY: reads this process's files; the config lives as long as it.
    let config = unsafe {
        gb_config(
            control_fd as c_int,
            disk_mb as u64,
            open_files as u64,
            cpu_s as u64,
        )
    };
    if config.is_null() {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "read the seccomp filters") };
    }
    // Every fd this process has now is the fork server's: a program replaces those that are
    // still without close-on-exec after its event loop is rebuilt (Node and libuv open
    // theirs with it).
    for fd in open_fds() {
        // SAFETY: clears a flag of this process's own fd table entry.
        unsafe { fcntl(fd, F_SETFD, 0) };
    }
    // V8 maps its heap and code "do not copy on fork" (MADV_DONTFORK): a fork would have
    // none of it. The fork server runs no JavaScript from here on, so what is mapped now is
    // all a program needs.
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for range in maps.lines().filter_map(|l| l.split(' ').next()) {
            let mut ends = range.split('-').map(|x| usize::from_str_radix(x, 16));
            if let (Some(Ok(lo)), Some(Ok(hi))) = (ends.next(), ends.next()) {
                // SAFETY: changes only whether this process's own mapping is copied on fork
                // (errors, as for the kernel's special mappings, change nothing).
                unsafe { madvise(lo as *mut c_void, hi - lo, MADV_DOFORK) };
            }
        }
    }
    set_name(c"gb-zygote".as_ptr());
    // SAFETY: a signal disposition of this process.
    unsafe { signal(SIGCHLD, SIG_IGN) };
    quiesce();
    let mut handed = Handed { chan: -1 };
    // SAFETY: valid config and out; the other threads of Node (its platform's workers, all
    // idle: the fork server runs with --single-threaded) do not exist in the forks.
    let r = unsafe { gb_serve(config, &mut handed) };
    if r < 0 {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "install the fork server's seccomp filters") };
    }
    if r != 0 {
        let mut null = std::ptr::null_mut();
        // SAFETY: the calling environment.
        unsafe { (n.get_null)(env, &mut null) };
        return null;
    }
    // A program: worker tasks go to a pool of its own, and V8's generators start afresh.
    new_pool();
    // SAFETY: on the isolate's own thread, inside this call's handle scope.
    if let Err(fail) = unsafe { renew_v8(n) } {
        program_failed(handed.chan, fail.0, fail.1);
    }
    // Its event loop's kernel objects (epoll, eventfd) are the fork server's: rebuild them,
    // then replace every fd it inherited. A step that fails is reported and ends the program
    // here: Node's own end would tear down a platform whose threads a fork lacks.
    let mut event_loop = std::ptr::null_mut();
    // SAFETY: the loop of the calling environment, on its own thread.
    let rebuilt = unsafe {
        (n.get_uv_event_loop)(env, &mut event_loop) == 0 && (n.uv_loop_fork)(event_loop) == 0
    };
    if !rebuilt {
        program_failed(handed.chan, "rebuild the event loop", errno());
    }
    // Every fd inherited from the fork server (those still without close-on-exec) now names
    // an eventfd of this program's own instead: Node's teardown still writes to its
    // platform's wake-up fd, which must not be the fork server's.
    // SAFETY: eventfd takes integers.
    let own = unsafe { eventfd(0, EFD_CLOEXEC) };
    if own < 0 {
        program_failed(handed.chan, "create an eventfd", errno());
    }
    for fd in open_fds() {
        // SAFETY: fcntl and dup2 on this process's own fds.
        unsafe {
            let flags = fcntl(fd, F_GETFD);
            if flags >= 0 && flags & FD_CLOEXEC == 0 && fd != handed.chan {
                dup3(own, fd, O_CLOEXEC);
            }
        }
    }
    // SAFETY: an fd of this process.
    unsafe { close(own) };
    // SAFETY: Node's C++ API on the calling thread, inside this call's handle scope.
    unsafe {
        let environment = environment(n);
        if environment.is_null() {
            program_failed(handed.chan, "find the Node environment", ENOENT);
        }
        (n.at_exit)(environment, at_exit, std::ptr::null_mut());
    }
    // SAFETY: the calling environment; getpid and getppid take nothing.
    unsafe {
        int_array(
            env,
            &[handed.chan.into(), getpid().into(), getppid().into()],
        )
    }
}

/// Fresh seeds for V8's generators in a program: the isolate's generator (which seeds
/// `Math.random` in every context and V8's own randomized choices), the one behind the
/// addresses V8 asks for new memory at, and `Math.random`'s state and cache in the main
/// context, which refills from the isolate's generator on its next call.
unsafe fn renew_v8(n: &Napi) -> Result<(), Fail> {
    let seeds = fresh::<16>()?;
    let seed = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&seeds[i * 8..i * 8 + 8]);
        i64::from_ne_bytes(b)
    };
    // SAFETY: V8's functions on the calling thread's isolate and its current (native)
    // context; a `Local<Context>` points to the slot holding the context's tagged pointer.
    unsafe {
        let isolate = (n.isolate_current)();
        let rng = if isolate.is_null() {
            std::ptr::null_mut()
        } else {
            (n.isolate_rng)(isolate)
        };
        let context = if isolate.is_null() {
            std::ptr::null_mut()
        } else {
            (n.isolate_context)(isolate)
        };
        if rng.is_null() || context.is_null() {
            return Err(Fail("renew V8's random generators", ENOENT));
        }
        (n.rng_set_seed)(rng, seed(0));
        (n.mmap_set_seed)(seed(1));
        (n.math_random_reset)(*(context as *const usize));
    }
    Ok(())
}

/// Report a program's failed step on its control socket and end it.
fn program_failed(chan: c_int, step: &'static str, errno: c_int) -> ! {
    send_failed(chan, &Fail(step, errno));
    // SAFETY: ends this process.
    unsafe { _exit(127) }
}

/// `limits(fileSizeBytes, openFiles, cpuS)`: the run's own rlimits.
unsafe extern "C" fn node_limits(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    let Some([fsize, nofile, cpu]) = (unsafe { int_args::<3>(env, info) }) else {
        // SAFETY: the calling environment.
        return unsafe {
            throw(
                env,
                "limits(fileSizeBytes, openFiles, cpuS): three integers",
            )
        };
    };
    let limit = |cur: i64, max: i64| RLimit {
        cur: cur.max(0) as u64,
        max: max.max(0) as u64,
    };
    // SAFETY: setrlimit with structures on this frame.
    let ok = unsafe {
        setrlimit(RLIMIT_FSIZE, &limit(fsize, fsize)) == 0
            && setrlimit(RLIMIT_NOFILE, &limit(nofile, nofile)) == 0
            && setrlimit(RLIMIT_CPU, &limit(cpu, cpu + 1)) == 0
    };
    if !ok {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "set rlimits") };
    }
    std::ptr::null_mut()
}

/// The program's exit code, as its `exit` listeners left it.
static EXIT_CODE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);

/// `exitCode(code)`: the code to end with when Node reaches its at-exit callbacks (after it
/// printed an uncaught exception).
unsafe extern "C" fn node_exit_code(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    if let Some([code]) = unsafe { int_args::<1>(env, info) } {
        EXIT_CODE.store(code as c_int, std::sync::atomic::Ordering::Relaxed);
    }
    std::ptr::null_mut()
}

/// `exit(code)`: end the program now, as python_zygote.py's `_finish` does.
unsafe extern "C" fn node_exit(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    let code = unsafe { int_args::<1>(env, info) }.map_or(1, |[c]| c as c_int);
    finish(code)
}

unsafe extern "C" fn at_exit(_arg: *mut c_void) {
    finish(EXIT_CODE.load(std::sync::atomic::Ordering::Relaxed))
}

/// Close the output (the server reads it to its end) and exit without Node's teardown: it
/// would join its platform's threads, which exist only in the fork server. The run's init
/// reports the exit from the wait status.
fn finish(code: c_int) -> ! {
    // SAFETY: closes this process's stdout and stderr, then ends it.
    unsafe {
        close(1);
        close(2);
        _exit(code & 0xff)
    }
}

/// Worker threads for V8's background tasks, in place of Node's platform's: those threads
/// exist in the fork server only, and a task left in their queue would keep a program's
/// event loop from ever ending (`NodePlatform::DrainTasks` waits for it). The fork server
/// hands its platform's worker tasks to this pool from its start; each program starts a
/// pool of its own (what the fork server's pool held stays with the fork server).
struct Pool {
    queue: std::sync::Mutex<Vec<(std::time::Instant, usize)>>,
    ready: std::sync::Condvar,
    idle: std::sync::Condvar,
    running: std::sync::atomic::AtomicUsize,
    started: std::sync::Once,
    /// Set in the fork server once it serves: no task runs while it forks.
    frozen: std::sync::atomic::AtomicBool,
}

static POOL: std::sync::atomic::AtomicPtr<Pool> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
const POOL_THREADS: usize = 2;

fn new_pool() {
    let pool = Box::leak(Box::new(Pool {
        queue: std::sync::Mutex::new(Vec::new()),
        ready: std::sync::Condvar::new(),
        idle: std::sync::Condvar::new(),
        running: std::sync::atomic::AtomicUsize::new(0),
        started: std::sync::Once::new(),
        frozen: std::sync::atomic::AtomicBool::new(false),
    }));
    POOL.store(pool, std::sync::atomic::Ordering::SeqCst);
}

fn pool() -> &'static Pool {
    // SAFETY: set by `new_pool` before the vtable sends any task here; never freed.
    unsafe { &*POOL.load(std::sync::atomic::Ordering::SeqCst) }
}

/// A `v8::Task`: its vtable is [complete destructor, deleting destructor, Run].
unsafe fn run_task(task: usize) {
    // SAFETY: `task` is a live v8::Task handed over with its ownership.
    unsafe {
        let vtable = *(task as *const *const unsafe extern "C" fn(usize));
        (*vtable.add(2))(task);
        (*vtable.add(1))(task);
    }
}

fn post(task: usize, delay_s: f64) {
    let pool = pool();
    pool.started.call_once(|| {
        for _ in 0..POOL_THREADS {
            std::thread::spawn(move || work(pool));
        }
    });
    let due =
        std::time::Instant::now() + std::time::Duration::from_secs_f64(delay_s.clamp(0.0, 1e6));
    pool.queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((due, task));
    pool.ready.notify_one();
}

fn work(pool: &'static Pool) {
    let mut queue = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = std::time::Instant::now();
        let next = queue
            .iter()
            .enumerate()
            .min_by_key(|(_, (due, _))| *due)
            .map(|(i, (due, _))| (i, *due));
        match next {
            _ if pool.frozen.load(std::sync::atomic::Ordering::SeqCst) => {
                queue = pool.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            Some((i, due)) if due <= now => {
                let (_, task) = queue.swap_remove(i);
                pool.running
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(queue);
                // SAFETY: a task V8 posted, owned by this pool.
                unsafe { run_task(task) };
                queue = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
                pool.running
                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                pool.idle.notify_all();
            }
            Some((_, due)) => {
                queue = pool
                    .ready
                    .wait_timeout(queue, due - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            None => queue = pool.ready.wait(queue).unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// Wait until no task is due or running (delayed ones may stay queued), then run no more.
fn quiesce() {
    if POOL.load(std::sync::atomic::Ordering::SeqCst).is_null() {
        return;
    }
    let pool = pool();
    let mut queue = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = std::time::Instant::now();
        let due = queue.iter().any(|(d, _)| *d <= now);
        if !due && pool.running.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            pool.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        queue = pool
            .idle
            .wait_timeout(queue, std::time::Duration::from_millis(10))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// `NodePlatform::CallOnWorkerThread(std::unique_ptr<Task>)`: the `unique_ptr` is passed by
/// address (it has a destructor); taking the pointer out leaves the caller nothing to free.
unsafe extern "C" fn call_on_worker(_platform: *mut c_void, task: *mut usize) {
    // SAFETY: `task` points to the caller's unique_ptr.
    let t = unsafe { std::mem::replace(&mut *task, 0) };
    if t != 0 {
        post(t, 0.0);
    }
}

unsafe extern "C" fn call_delayed_on_worker(_platform: *mut c_void, task: *mut usize, delay: f64) {
    // SAFETY: `task` points to the caller's unique_ptr.
    let t = unsafe { std::mem::replace(&mut *task, 0) };
    if t != 0 {
        post(t, delay);
    }
}

/// Point the platform's vtable entries for worker tasks at this pool: the platform object
/// gets a copy of its vtable (with the ABI's two words before it) in which the entries
/// equal to the two exported methods are replaced. Fails when they are not found.
unsafe fn adopt_worker_tasks(n: &Napi, platform: *mut c_void) -> bool {
    const SLOTS: usize = 64;
    // SAFETY: `platform` is Node's platform object, whose first word is its vtable pointer;
    // the vtable lies in the binary's read-only data, readable for SLOTS entries.
    unsafe {
        let vptr = *(platform as *const *const usize);
        let mut table: Box<[usize; SLOTS + 2]> = Box::new([0; SLOTS + 2]);
        std::ptr::copy_nonoverlapping(vptr.sub(2), table.as_mut_ptr(), SLOTS + 2);
        let mut found = 0;
        for slot in table[2..].iter_mut() {
            if *slot == n.call_on_worker as usize {
                *slot = call_on_worker as *const () as usize;
                found |= 1;
            } else if *slot == n.call_delayed_on_worker as usize {
                *slot = call_delayed_on_worker as *const () as usize;
                found |= 2;
            }
        }
        if found != 3 {
            return false;
        }
        let table = Box::leak(table);
        *(platform as *mut *const usize) = table.as_ptr().add(2);
        true
    }
}
