//! The fork server's loop and each run's init: [`gb_serve`] (called by the Python fork
//! server after `gb_config`, and by the Node one through `napi.rs`), then, in each run, pid 1
//! building the run's namespaces' contents from the shared policy and forking the program,
//! which restricts itself and starts its keeper ([`start_keeper`]; not for the exec fork
//! server's programs, [`gb_serve_exec`]).

use std::ffi::{c_char, c_int, c_long, c_ulong, c_void};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, Ordering};

use super::config::Config;
use super::entropy::OpenSsl;
use super::message::{
    Buf, Fail, check, init_failed, program_failed, send_buf, send_failed, send_str,
};
use super::restrict::restrict;
use super::restriction::{HOSTNAME, PROC_READONLY, SCRATCH, USER_LIMITS, scratch_inodes};
use super::sys::*;

/// What a program gets back: its control socket (stdio is on 0, 1, 2), which it closes
/// before any of the run's code runs. How the program ended is never its to say: the run's
/// init reports it from the wait status.
#[repr(C)]
pub struct Handed {
    pub(crate) chan: c_int,
}

pub(crate) fn set_name(name: *const c_char) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string (the kernel keeps 15 bytes).
    unsafe { prctl(PR_SET_NAME, name) };
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
    let mut start = -1;
    // SAFETY: the caller's promise, passed on.
    unsafe { serve(config, out, true, None, &mut start) }
}

/// [`gb_serve`] for the exec fork server (`jail/exec_zygote.rs`): its programs get no
/// keeper ([`start_keeper`]), since one would keep the fork server's own memory image, which
/// the program's `execve` drops, where the program could read it. With a `feeder`, each
/// run's init takes the hand-over itself (see [`Feed`]), and `start` gets, in the program,
/// the read end of the pipe its start-up comes through.
///
/// # Safety
/// As [`gb_serve`]; `start` points to a valid int.
#[allow(dead_code, reason = "the gearbox binary's, not the shared object's")]
pub(crate) unsafe fn gb_serve_exec(
    config: *const Config,
    out: *mut Handed,
    feeder: Option<Feeder>,
    start: *mut c_int,
) -> c_int {
    // SAFETY: the caller's promise, passed on.
    unsafe { serve(config, out, false, feeder, start) }
}

/// What a run's init hands its [`Feeder`]: the slot's control socket, the run's stdin (the
/// hand-over comes first on it), the write end of the program's start-up pipe and the fd
/// number the program reads it as, and the program's pid. The program was started before
/// the hand-over and waits on that pipe (the exec fork server's pre-started Bash:
/// `jail/prestart.rs`).
#[allow(dead_code, reason = "the gearbox binary's, not the shared object's")]
pub(crate) struct Feed {
    pub(crate) chan: c_int,
    pub(crate) stdin: c_int,
    pub(crate) start: c_int,
    pub(crate) start_fd: c_int,
    pub(crate) program: c_int,
}

/// How a [`Feeder`] left the run.
#[allow(dead_code, reason = "the gearbox binary's, not the shared object's")]
pub(crate) enum Fed {
    /// The run's start-up is written and `started` sent: init closes the pipe, and the
    /// program runs.
    Started,
    /// The run is not the one the program was started for: init kills the program and forks
    /// a fresh one, which returns from [`gb_serve_exec`] with no start-up pipe and takes the
    /// hand-over the feeder kept.
    Replace,
    /// A step failed, and the feeder said so: init kills the program and reports.
    Failed,
}

/// Takes a run's hand-over in its init (see [`Feed`]).
pub(crate) type Feeder = fn(&Feed) -> Fed;

/// The loop of [`gb_serve`]; `keeper`: whether each program starts its keeper; `feeder` and
/// `start`: see [`gb_serve_exec`].
unsafe fn serve(
    config: *const Config,
    out: *mut Handed,
    keeper: bool,
    feeder: Option<Feeder>,
    start: *mut c_int,
) -> c_int {
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
    let openssl = OpenSsl::find();
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
            let (handed, pipe) = init(
                config,
                &openssl,
                [fds[0], fds[1], fds[2], fds[3]],
                ids,
                keeper,
                feeder,
            );
            // SAFETY: `out` and `start` are valid; init returns only in the program.
            unsafe {
                *out = handed;
                *start = pipe;
            }
            return 0;
        }
        if pid < 0 {
            send_failed(fds[0], &Fail::new("new namespaces", errno()));
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

/// Pid 1 of a run. Returns only in the program, with the read end of its start-up pipe
/// (-1 without a `feeder`, or in a program forked to replace a pre-started one).
fn init(
    config: &Config,
    openssl: &OpenSsl,
    fds: [c_int; 4],
    (uid, gid): (u32, u32),
    keeper: bool,
    feeder: Option<Feeder>,
) -> (Handed, c_int) {
    let [chan, stdin, stdout, stderr] = fds;
    set_name(c"gb-init".as_ptr());
    // SAFETY: plain fd and signal calls on this process.
    unsafe {
        signal(SIGCHLD, SIG_DFL);
        close(config.control_fd);
    }
    if let Err(fail) = map_ids(uid, gid) {
        init_failed(chan, fail);
    }
    send_str(chan, "{\"t\":\"hello\"}");
    // `go`, with the `tasks` file of each of the run's v1 cgroups when the server sends them
    // (opened by the server, which the kernel checks): init moves itself in, which takes no
    // host-wide lock, where the server moving it would wait for an RCU grace period.
    let mut tasks = [-1 as c_int; 8];
    if receive(chan, &mut tasks) <= 0 {
        // SAFETY: ends this process.
        unsafe { _exit(0) };
    }
    for &fd in tasks.iter().filter(|&&fd| fd >= 0) {
        // SAFETY: writes one byte from a static to an fd this process received.
        let n = unsafe { write(fd, b"0".as_ptr().cast(), 1) };
        if n != 1 {
            init_failed(chan, Fail::new("join cgroup", errno()));
        }
    }
    close_all(&tasks);
    if let Err(fail) = build(config) {
        init_failed(chan, fail);
    }
    // Init is not dumpable from here on, as the cold path's init is (it changed its ids):
    // its /proc files belong to its user namespace's root, which the run does not map, so
    // the program can neither list init's descriptors nor write what an owner may write
    // there. Set before the fork, so that the program never runs beside a dumpable init;
    // the program is dumpable again at once, as a cold program is after its exec.
    // SAFETY: prctl takes integers.
    if unsafe { prctl(PR_SET_DUMPABLE, 0 as c_ulong) } != 0 {
        init_failed(chan, Fail::new("make init undumpable", errno()));
    }
    // The pipe a pre-started program reads its start-up from (see [`Feed`]).
    let mut pipe = [-1 as c_int; 2];
    // SAFETY: pipe2 writes two fds into the array on this frame.
    if feeder.is_some() && unsafe { pipe2(pipe.as_mut_ptr(), O_CLOEXEC) } != 0 {
        init_failed(chan, Fail::new("start-up pipe", errno()));
    }
    let [start_r, start_w] = pipe;
    let stdio = [chan, stdin, stdout, stderr];
    let mut child = match fork_program(config, openssl, stdio, keeper, start_w) {
        Ok(child) => child,
        Err(handed) => return (handed, start_r),
    };
    // With a feeder, stdin, stdout and stderr stay open here until the run has its program
    // (a replacement may be forked).
    if feeder.is_none() {
        close_all(&[stdin, stdout, stderr]);
    }
    send_str(chan, "{\"t\":\"ready\"}");
    if let Some(feed) = feeder {
        close_all(&[start_r]);
        let fed = feed(&Feed {
            chan,
            stdin,
            start: start_w,
            start_fd: start_r,
            program: child,
        });
        // The end of the start-up: the program runs from here (or reads end-of-file and
        // exits, if the feeder failed).
        close_all(&[start_w]);
        match fed {
            Fed::Started => {}
            Fed::Failed => {
                // SAFETY: signals this run's program.
                unsafe { kill(child, SIGKILL) };
            }
            Fed::Replace => {
                // SAFETY: signals and reaps this run's program, writing the status on this
                // frame.
                unsafe {
                    kill(child, SIGKILL);
                    waitpid(child, &mut 0, 0);
                }
                child = match fork_program(config, openssl, stdio, keeper, -1) {
                    Ok(child) => child,
                    Err(handed) => return (handed, -1),
                };
            }
        }
        close_all(&[stdin, stdout, stderr]);
    }
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
    // One open when the program wrote no outputs (the usual case).
    let outputs = has_outputs();
    let _ = write!(
        buf,
        "\"cpu_time_ms\":{},\"max_rss_kb\":{},\"outputs\":{outputs}}}",
        cpu_us / 1000,
        maxrss
    );
    send_buf(chan, &buf);
    if outputs {
        // The server reads /work/outputs from outside (beneath /proc/<this pid>/root) once
        // nothing is left to change it: every other process killed and reaped.
        // SAFETY: signals every process of this pid namespace.
        unsafe { kill(-1, SIGKILL) };
        loop {
            let mut status: c_int = 0;
            // SAFETY: waits for this process's children, writing the status on this frame.
            let pid = unsafe { waitpid(-1, &mut status, 0) };
            if pid < 0 && errno() != EINTR {
                break;
            }
        }
        send_str(chan, "{\"t\":\"outputs\"}");
    } else {
        // The answer first, the teardown after: every process holding a descriptor (the
        // run's output pipes among them) dies now, so the output ends with the report; the
        // program's keeper, which holds none, keeps its address space, and this process its
        // own, until the server's word below. Tearing both down here took both cores while
        // the server answered.
        kill_holders();
    }
    // The server's word: it closes the slot (or kills this process) `ANSWER_FIRST` after the
    // outcome, or once it has read the outputs; its going away ends the wait too.
    let mut done = [0u8; 8];
    // SAFETY: reads into a buffer on this stack frame.
    unsafe { recv(chan, done.as_mut_ptr().cast(), done.len(), 0) };
    // Whatever is left (what held no descriptor) dies with this pid namespace.
    // SAFETY: signals every process of this pid namespace.
    unsafe { kill(-1, SIGKILL) };
    // SAFETY: ends this process.
    unsafe { _exit(0) }
}

/// Fork the run's program: `Ok(pid)` in init, `Err` with what the program gets in the
/// program (which closes `start_w`, the write end of its start-up pipe, if there is one).
fn fork_program(
    config: &Config,
    openssl: &OpenSsl,
    stdio: [c_int; 4],
    keeper: bool,
    start_w: c_int,
) -> Result<c_int, Handed> {
    let chan = stdio[0];
    // SAFETY: this process has one thread; glibc's fork sets the child's thread id.
    let child = unsafe { fork() };
    if child == 0 {
        // SAFETY: prctl takes integers.
        if unsafe { prctl(PR_SET_DUMPABLE, 1 as c_ulong) } != 0 {
            init_failed(chan, Fail::new("make the program dumpable", errno()));
        }
        close_all(&[start_w]);
        return Err(program(config, openssl, stdio, keeper));
    }
    if child < 0 {
        init_failed(chan, Fail::new("fork program", errno()));
    }
    Ok(child)
}

/// Kill every process of this pid namespace but this one and those with no open descriptor
/// (the program's keeper), pass after pass until one finds no process it has not killed
/// already (a process may fork while a pass looks). A process whose descriptors cannot be
/// listed is killed. One with none cannot reach the run's pipes or this process's channel
/// (nothing it can open names them), and dies with this process shortly after. Past
/// [`KILLED_MAX`] processes, or without a readable `/proc`, everything dies now.
fn kill_holders() {
    let mut killed = [0 as c_int; KILLED_MAX];
    let mut n = 0;
    loop {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            break;
        };
        let before = n;
        for entry in procs.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<c_int>().ok())
            else {
                continue;
            };
            if pid == 1 || killed[..n].contains(&pid) {
                continue;
            }
            let holds_none = std::fs::read_dir(entry.path().join("fd"))
                .is_ok_and(|mut fds| fds.next().is_none());
            if holds_none {
                continue;
            }
            if n == KILLED_MAX {
                // SAFETY: signals every process of this pid namespace.
                unsafe { kill(-1, SIGKILL) };
                return;
            }
            // SAFETY: signals one process of this pid namespace.
            unsafe { kill(pid, SIGKILL) };
            killed[n] = pid;
            n += 1;
        }
        if n == before {
            return;
        }
    }
    // SAFETY: signals every process of this pid namespace.
    unsafe { kill(-1, SIGKILL) };
}

/// Most processes [`kill_holders`] kills one by one.
const KILLED_MAX: usize = 256;

/// Whether the program left anything in `/work/outputs` (a symlink in its place is
/// followed here, but the server, which reads the files, refuses it).
fn has_outputs() -> bool {
    std::fs::read_dir("/work/outputs").is_ok_and(|mut d| d.next().is_some())
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
    write_file(c"/proc/self/setgroups".as_ptr(), b"deny", "map ids")?;
    write_file(
        c"/proc/self/gid_map".as_ptr(),
        &gid_map.data[..gid_map.len],
        "map ids",
    )?;
    write_file(
        c"/proc/self/uid_map".as_ptr(),
        &uid_map.data[..uid_map.len],
        "map ids",
    )
}

/// Where each run's scratch tmpfs is staged (an empty directory of the fork server's root,
/// see `jail/mount.rs`), and the same as a C string.
const STAGE_DIR: &str = "/.gearbox/stage/";
const STAGE: &[u8] = b"/.gearbox/stage\0";

/// `parts` joined as a C path; a path too long for [`CPath`] fails `step`.
fn path(parts: &[&str], step: &'static str) -> Result<CPath, Fail> {
    CPath::join(parts).ok_or(Fail::new(step, ENAMETOOLONG))
}

/// Write `content` to the existing file at `path` in one write.
fn write_file(path: *const c_char, content: &[u8], step: &'static str) -> Result<(), Fail> {
    // SAFETY: open, write and close with a NUL-terminated path and a buffer of `content`.
    unsafe {
        let fd = check(open(path, O_WRONLY | O_CLOEXEC), step)?;
        let n = write(fd, content.as_ptr().cast(), content.len());
        let e = errno();
        close(fd);
        if n != content.len() as isize {
            return Err(Fail::new(step, e));
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
        let inodes = scratch_inodes(config.disk_mb);
        let mut data = Buf::new();
        let _ = write!(
            data,
            "size={}m,nr_inodes={},mode=0755\0",
            config.disk_mb, inodes
        );
        check(
            mount(
                c"tmpfs".as_ptr(),
                STAGE.as_ptr().cast(),
                c"tmpfs".as_ptr(),
                MS_NOSUID | MS_NODEV,
                data.data.as_ptr().cast(),
            ),
            "mount scratch tmpfs",
        )?;
        for area in &SCRATCH {
            let step = "create scratch directory";
            let src = path(&[STAGE_DIR, area.stage], step)?;
            let target = path(&[area.target], "bind")?;
            check(mkdir(src.as_ptr(), 0o700), step)?;
            check(chmod(src.as_ptr(), area.mode), step)?;
            let r = mount(
                src.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                MS_BIND,
                std::ptr::null(),
            );
            if r < 0 {
                return Err(Fail::on("bind", area.target, errno()));
            }
        }
        check(
            umount2(STAGE.as_ptr().cast(), MNT_DETACH),
            "detach scratch stage",
        )?;
        check(
            sethostname(HOSTNAME.as_ptr().cast(), HOSTNAME.len()),
            "set hostname",
        )?;
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
        for (name, value) in USER_LIMITS {
            let step = "limit the run's kernel counters";
            let p = path(&["/.gearbox/proc/sys/user/", name], step)?;
            write_file(p.as_ptr(), value.as_bytes(), step)?;
        }
        for entry in PROC_READONLY {
            let p = path(&["/.gearbox/proc/", entry], "bind /proc entry")?;
            let p = p.as_ptr();
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
            return Err(Fail::new("detach fork server /proc", errno()));
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
            return Err(Fail::new("bring up loopback", e));
        }
    }
    Ok(())
}

/// The program: restricted exactly as the cold path restricts a program before exec
/// (`jail/program.rs`), then back to Python. A failed step is reported and ends it.
/// `keeper`: start the program's keeper ([`start_keeper`]) once it is restricted.
fn program(
    config: &Config,
    openssl: &OpenSsl,
    [chan, stdin, stdout, stderr]: [c_int; 4],
    keeper: bool,
) -> Handed {
    set_name(config.program_name);
    if let Err(fail) = openssl.renew() {
        program_failed(chan, fail)
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
            if keeper {
                start_keeper();
            }
            Handed { chan }
        }
        Err(fail) => program_failed(chan, fail),
    }
}

/// Bytes of the keeper's stack: it calls a handful of system calls and nothing else.
const KEEPER_STACK: usize = 16 * 1024;

#[repr(C, align(16))]
struct KeeperStack([u8; KEEPER_STACK]);

/// The keeper's stack, in this process's memory (each program's copy is its own).
static mut KEEPER_STACK_MEMORY: KeeperStack = KeeperStack([0; KEEPER_STACK]);
/// The keeper's state, which the program waits on: its tid from the clone on (the kernel
/// writes it before the keeper runs, `CLONE_PARENT_SETTID`), [`KEEPER_READY`] once it holds
/// no descriptor and blocks every signal, or 0 if it died before (the kernel clears it and
/// wakes the waiter, `CLONE_CHILD_CLEARTID`).
static KEEPER: AtomicU32 = AtomicU32::new(0);
const KEEPER_READY: u32 = u32::MAX;

/// Start the program's keeper: a process that shares the program's memory (`CLONE_VM`),
/// holds nothing else and waits for the run's end.
///
/// Why: a forked interpreter's address space is large, and the kernel tears it down when its
/// last user exits, before the parent hears of the exit (`exit_mm` comes before
/// `exit_notify`). That teardown was most of the time between a warm program's exit and
/// init's report (0.7 ms for Python, 1.2 ms for Node, `bench/warm_phases.py`). With the
/// keeper still using the memory, the program's exit only drops a reference; init reports
/// the wait status at once and then kills every process of the run, the keeper with them,
/// whose exit pays for the teardown off the answer's path.
///
/// Started after the program's whole restriction, so the keeper is held by everything the
/// program is (the same seccomp filters, Landlock domain, rlimits, no capabilities, no new
/// privileges, the run's cgroup and namespaces): sharing memory with the run's own code, it
/// can do no more than a thread of the program. It closes every descriptor it was given (it
/// has its own table, so the program's pipes close when the program exits) before the
/// program goes on, blocks every signal but `SIGKILL` and `SIGSTOP`, and sends no signal to
/// the program when it ends (the program's `wait` does not see it). A program that kills it
/// only loses the speed-up. Where it cannot be started (the pids limit), or dies before it
/// is ready (the kernel then clears [`KEEPER`] and wakes the program), the run goes on
/// without it.
fn start_keeper() {
    // SAFETY: the stack's end, within the static; the keeper is the only user of that memory.
    let top = unsafe {
        (&raw mut KEEPER_STACK_MEMORY)
            .cast::<u8>()
            .add(KEEPER_STACK)
    };
    // SAFETY: glibc's clone runs `keep` on its own stack, in this process's memory, with
    // the state word for the kernel's tid writes; exit signal 0 (a "clone" child: the
    // program's plain waits ignore it).
    let pid = unsafe {
        clone(
            keep,
            top.cast(),
            CLONE_VM | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID,
            std::ptr::null_mut(),
            KEEPER.as_ptr(),
            std::ptr::null_mut::<c_void>(),
            KEEPER.as_ptr(),
        )
    };
    if pid <= 0 {
        return;
    }
    loop {
        let state = KEEPER.load(Ordering::Acquire);
        if state == KEEPER_READY || state == 0 {
            return;
        }
        // SAFETY: waits on the state's address while it holds the keeper's tid; no memory
        // is written. Not a private futex: the kernel's wake at the keeper's exit
        // (`CLONE_CHILD_CLEARTID`) is a shared one, which a private wait would not hear.
        unsafe {
            syscall(
                SYS_FUTEX,
                KEEPER.as_ptr(),
                FUTEX_WAIT as c_long,
                c_long::from(state),
                0usize,
            )
        };
    }
}

/// The keeper's whole life (see [`start_keeper`]). It shares the program's memory, its
/// thread-local storage included, so it calls libc's plain system-call wrappers and nothing
/// that keeps state (they write `errno` only when a call fails, and none of these can but by
/// a bug).
extern "C" fn keep(_: *mut c_void) -> c_int {
    let all: u64 = !0;
    // SAFETY: system calls on this process's own signal mask (from this stack) and
    // descriptor table.
    unsafe {
        syscall(
            SYS_RT_SIGPROCMASK,
            SIG_SETMASK as c_long,
            &all as *const u64,
            0usize,
            8usize,
        );
        syscall(
            SYS_CLOSE_RANGE,
            0 as c_long,
            c_long::from(u32::MAX),
            0 as c_long,
        );
    }
    set_name(c"gb-keeper".as_ptr());
    KEEPER.store(KEEPER_READY, Ordering::Release);
    // SAFETY: wakes the program waiting on the state.
    unsafe {
        syscall(
            SYS_FUTEX,
            KEEPER.as_ptr(),
            FUTEX_WAKE as c_long,
            1 as c_long,
        )
    };
    loop {
        // SAFETY: waits on nothing, for ever (every signal it could take is blocked).
        unsafe { syscall(SYS_PPOLL, 0usize, 0usize, 0usize, 0usize, 0usize) };
    }
}
