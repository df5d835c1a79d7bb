//! What the native loop needs of libc and the kernel, declared by hand (it is built with no
//! dependencies, see `mod.rs`): functions, constants, structures. Linux x86_64 and aarch64.
//! Self-contained: the crate's tests compile this file on its own to compare the constants
//! with the `libc` crate's.

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};

unsafe extern "C" {
    pub(crate) fn syscall(n: c_long, ...) -> c_long;
    pub(crate) fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    pub(crate) fn dlopen(name: *const c_char, flags: c_int) -> *mut c_void;
    pub(crate) fn getrandom(buf: *mut c_void, len: usize, flags: c_uint) -> isize;
    pub(crate) fn write(fd: c_int, buf: *const c_void, len: usize) -> isize;
    pub(crate) fn getuid() -> c_uint;
    pub(crate) fn getgid() -> c_uint;
    pub(crate) fn recvmsg(fd: c_int, msg: *mut MsgHdr, flags: c_int) -> isize;
    pub(crate) fn send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize;
    pub(crate) fn recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    pub(crate) fn close(fd: c_int) -> c_int;
    pub(crate) fn fork() -> c_int;
    pub(crate) fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    pub(crate) fn unshare(flags: c_int) -> c_int;
    pub(crate) fn mount(
        src: *const c_char,
        target: *const c_char,
        fstype: *const c_char,
        flags: c_ulong,
        data: *const c_void,
    ) -> c_int;
    pub(crate) fn umount2(target: *const c_char, flags: c_int) -> c_int;
    pub(crate) fn mkdir(path: *const c_char, mode: c_uint) -> c_int;
    pub(crate) fn chmod(path: *const c_char, mode: c_uint) -> c_int;
    pub(crate) fn access(path: *const c_char, mode: c_int) -> c_int;
    pub(crate) fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    pub(crate) fn sethostname(name: *const c_char, len: usize) -> c_int;
    pub(crate) fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    pub(crate) fn ioctl(fd: c_int, request: c_ulong, ...) -> c_int;
    pub(crate) fn waitpid(pid: c_int, status: *mut c_int, options: c_int) -> c_int;
    pub(crate) fn getrusage(who: c_int, usage: *mut RUsage) -> c_int;
    pub(crate) fn kill(pid: c_int, sig: c_int) -> c_int;
    pub(crate) fn _exit(code: c_int) -> !;
    pub(crate) fn prctl(option: c_int, ...) -> c_int;
    pub(crate) fn dup2(old: c_int, new: c_int) -> c_int;
    pub(crate) fn setsid() -> c_int;
    pub(crate) fn setrlimit(resource: c_int, limit: *const RLimit) -> c_int;
    pub(crate) fn chdir(path: *const c_char) -> c_int;
    pub(crate) fn signal(sig: c_int, handler: usize) -> usize;
    pub(crate) fn __errno_location() -> *mut c_int;
    pub(crate) fn strerror(errnum: c_int) -> *const c_char;

    pub(crate) fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    pub(crate) fn getpid() -> c_int;
    pub(crate) fn getppid() -> c_int;
    pub(crate) fn eventfd(initval: c_uint, flags: c_int) -> c_int;
    pub(crate) fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    pub(crate) fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    pub(crate) fn clone(
        f: extern "C" fn(*mut c_void) -> c_int,
        stack: *mut c_void,
        flags: c_int,
        arg: *mut c_void,
        ...
    ) -> c_int;
}

/// The system call numbers that differ between the two architectures.
#[cfg(target_arch = "x86_64")]
mod numbers {
    use std::ffi::c_long;
    pub(crate) const SYS_CLONE: c_long = 56;
    pub(crate) const SYS_CAPSET: c_long = 126;
    pub(crate) const SYS_RT_SIGPROCMASK: c_long = 14;
    pub(crate) const SYS_FUTEX: c_long = 202;
    pub(crate) const SYS_PPOLL: c_long = 271;
}
/// The system call numbers that differ between the two architectures.
#[cfg(target_arch = "aarch64")]
mod numbers {
    use std::ffi::c_long;
    pub(crate) const SYS_CLONE: c_long = 220;
    pub(crate) const SYS_CAPSET: c_long = 91;
    pub(crate) const SYS_RT_SIGPROCMASK: c_long = 135;
    pub(crate) const SYS_FUTEX: c_long = 98;
    pub(crate) const SYS_PPOLL: c_long = 73;
}
pub(crate) use numbers::*;
pub(crate) const SYS_CLOSE_RANGE: c_long = 436;
pub(crate) const SYS_LANDLOCK_CREATE_RULESET: c_long = 444;
pub(crate) const SYS_LANDLOCK_ADD_RULE: c_long = 445;
pub(crate) const SYS_LANDLOCK_RESTRICT_SELF: c_long = 446;

pub(crate) const CLONE_VM: c_int = 0x0000_0100;
pub(crate) const CLONE_PARENT_SETTID: c_int = 0x0010_0000;
pub(crate) const CLONE_CHILD_CLEARTID: c_int = 0x0020_0000;
pub(crate) const CLONE_NEWNS: c_int = 0x0002_0000;
pub(crate) const CLONE_NEWUSER: c_int = 0x1000_0000;
pub(crate) const CLONE_NEWCGROUP: c_int = 0x0200_0000;
pub(crate) const CLONE_NEWUTS: c_int = 0x0400_0000;
pub(crate) const CLONE_NEWIPC: c_int = 0x0800_0000;
pub(crate) const CLONE_NEWPID: c_int = 0x2000_0000;
pub(crate) const CLONE_NEWNET: c_int = 0x4000_0000;
pub(crate) const SIGCHLD: c_int = 17;
pub(crate) const SIGKILL: c_int = 9;
pub(crate) const SIG_DFL: usize = 0;
pub(crate) const EINTR: c_int = 4;
pub(crate) const ECHILD: c_int = 10;
pub(crate) const ENOENT: c_int = 2;
pub(crate) const EINVAL: c_int = 22;
pub(crate) const MSG_NOSIGNAL: c_int = 0x4000;
pub(crate) const MSG_CMSG_CLOEXEC: c_int = 0x4000_0000;
pub(crate) const SOL_SOCKET: c_int = 1;
pub(crate) const SCM_RIGHTS: c_int = 1;
pub(crate) const MS_NOSUID: c_ulong = 2;
pub(crate) const MS_NODEV: c_ulong = 4;
pub(crate) const MS_NOEXEC: c_ulong = 8;
pub(crate) const MS_RDONLY: c_ulong = 1;
pub(crate) const MS_REMOUNT: c_ulong = 32;
pub(crate) const MS_BIND: c_ulong = 4096;
pub(crate) const MS_MOVE: c_ulong = 8192;
pub(crate) const MS_REC: c_ulong = 16384;
pub(crate) const MNT_DETACH: c_int = 2;
pub(crate) const O_PATH: c_int = 0o1000_0000;
pub(crate) const O_CLOEXEC: c_int = 0o200_0000;
pub(crate) const O_WRONLY: c_int = 1;
pub(crate) const AF_INET: c_int = 2;
pub(crate) const SOCK_DGRAM: c_int = 2;
pub(crate) const SIOCGIFFLAGS: c_ulong = 0x8913;
pub(crate) const SIOCSIFFLAGS: c_ulong = 0x8914;
pub(crate) const FIONREAD: c_ulong = 0x541B;
pub(crate) const IFF_UP: i16 = 1;
pub(crate) const RLIMIT_CPU: c_int = 0;
pub(crate) const RLIMIT_CORE: c_int = 4;
pub(crate) const RLIMIT_NOFILE: c_int = 7;
pub(crate) const RLIMIT_SIGPENDING: c_int = 11;
pub(crate) const RLIMIT_MSGQUEUE: c_int = 12;
pub(crate) const RUSAGE_CHILDREN: c_int = -1;
pub(crate) const PR_SET_DUMPABLE: c_int = 4;
pub(crate) const PR_SET_NAME: c_int = 15;
pub(crate) const PR_CAPBSET_DROP: c_int = 24;
pub(crate) const PR_SET_SECCOMP: c_int = 22;
pub(crate) const PR_SET_NO_NEW_PRIVS: c_int = 38;
pub(crate) const PR_CAP_AMBIENT: c_int = 47;
pub(crate) const PR_CAP_AMBIENT_CLEAR_ALL: c_ulong = 4;
pub(crate) const SECCOMP_MODE_FILTER: c_ulong = 2;
pub(crate) const SIG_SETMASK: c_int = 2;
pub(crate) const FUTEX_WAIT: c_int = 0;
pub(crate) const FUTEX_WAKE: c_int = 1;

// Landlock (linux/landlock.h): the rights of ABI 1, and those later ABIs added (the rights
// the policy names are in `restriction.rs`); the scopes of ABI 6.
pub(crate) const LL_ABI1: u64 = 0x1FFF;
pub(crate) const LL_REFER: u64 = 0x2000;
pub(crate) const LL_SCOPE_ALL: u64 = 0x3;
pub(crate) const LL_TARGET_ABI: c_long = 6;
pub(crate) const LL_RULE_PATH_BENEATH: c_int = 1;
pub(crate) const LL_CREATE_RULESET_VERSION: c_uint = 1;

pub(crate) const F_GETFD: c_int = 1;
pub(crate) const F_SETFD: c_int = 2;
pub(crate) const FD_CLOEXEC: c_int = 1;
pub(crate) const RLIMIT_FSIZE: c_int = 1;
pub(crate) const SIG_IGN: usize = 1;
pub(crate) const MADV_DOFORK: c_int = 11;
pub(crate) const EFD_CLOEXEC: c_int = O_CLOEXEC;
pub(crate) const RTLD_LAZY: c_int = 1;
pub(crate) const RTLD_NOLOAD: c_int = 4;
pub(crate) const EIO: c_int = 5;
pub(crate) const ENAMETOOLONG: c_int = 36;

#[repr(C)]
pub(crate) struct IoVec {
    pub(crate) base: *mut c_void,
    pub(crate) len: usize,
}

#[repr(C)]
pub(crate) struct MsgHdr {
    pub(crate) name: *mut c_void,
    pub(crate) namelen: c_uint,
    pub(crate) iov: *mut IoVec,
    pub(crate) iovlen: usize,
    pub(crate) control: *mut c_void,
    pub(crate) controllen: usize,
    pub(crate) flags: c_int,
}

#[repr(C)]
pub(crate) struct CmsgHdr {
    pub(crate) len: usize,
    pub(crate) level: c_int,
    pub(crate) ty: c_int,
}

#[repr(C)]
pub(crate) struct TimeVal {
    pub(crate) sec: i64,
    pub(crate) usec: i64,
}

#[repr(C)]
pub(crate) struct RUsage {
    pub(crate) utime: TimeVal,
    pub(crate) stime: TimeVal,
    pub(crate) maxrss: c_long,
    pub(crate) rest: [c_long; 13],
}

#[repr(C)]
pub(crate) struct RLimit {
    pub(crate) cur: u64,
    pub(crate) max: u64,
}

#[repr(C, packed)]
pub(crate) struct PathBeneath {
    pub(crate) allowed: u64,
    pub(crate) parent_fd: i32,
}

/// The kernel's `struct sock_fprog`: a compiled seccomp filter.
#[repr(C)]
pub struct SockFprog {
    pub(crate) len: u16,
    pub(crate) filter: *const c_void,
}

pub(crate) fn errno() -> c_int {
    // SAFETY: glibc's per-thread errno location.
    unsafe { *__errno_location() }
}

/// A NUL-terminated path joined from `parts`, on the stack (no allocation: the heap is the
/// interpreter's, and a write to it would copy a page).
pub(crate) struct CPath {
    bytes: [u8; 128],
}

impl CPath {
    /// `None` when the path does not fit.
    pub(crate) fn join(parts: &[&str]) -> Option<CPath> {
        let mut bytes = [0u8; 128];
        let mut len = 0;
        for part in parts {
            let b = part.as_bytes();
            // One byte stays for the NUL.
            if len + b.len() >= bytes.len() || b.contains(&0) {
                return None;
            }
            bytes[len..len + b.len()].copy_from_slice(b);
            len += b.len();
        }
        Some(CPath { bytes })
    }

    pub(crate) fn as_ptr(&self) -> *const c_char {
        self.bytes.as_ptr().cast()
    }
}
