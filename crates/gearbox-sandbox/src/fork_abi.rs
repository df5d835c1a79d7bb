//! The fork server's native loop declares what it needs of the kernel by hand
//! (`launchers/fork/sys.rs`: it is built with no dependencies). Those declarations are the
//! `libc` crate's and the Landlock library's, and the shared policy's Landlock rights are the
//! kernel's.

// Its functions and structures serve the native loop; the constants and layouts are checked
// here.
#[allow(dead_code)]
#[path = "launchers/fork/sys.rs"]
mod sys;

use std::mem::size_of;

use landlock::{ABI, Access, AccessFs, Scope};

use crate::restriction;

macro_rules! same {
    ($($ours:ident = $theirs:expr),* $(,)?) => {
        $(assert_eq!(sys::$ours as i128, $theirs as i128, stringify!($ours));)*
    };
}

#[test]
fn the_native_loops_kernel_constants_are_libcs() {
    same!(
        SYS_CLONE = libc::SYS_clone,
        SYS_CAPSET = libc::SYS_capset,
        SYS_RT_SIGPROCMASK = libc::SYS_rt_sigprocmask,
        SYS_FUTEX = libc::SYS_futex,
        SYS_PPOLL = libc::SYS_ppoll,
        SYS_CLOSE_RANGE = libc::SYS_close_range,
        CLONE_VM = libc::CLONE_VM,
        CLONE_PARENT_SETTID = libc::CLONE_PARENT_SETTID,
        CLONE_CHILD_CLEARTID = libc::CLONE_CHILD_CLEARTID,
        SYS_LANDLOCK_CREATE_RULESET = libc::SYS_landlock_create_ruleset,
        SYS_LANDLOCK_ADD_RULE = libc::SYS_landlock_add_rule,
        SYS_LANDLOCK_RESTRICT_SELF = libc::SYS_landlock_restrict_self,
        CLONE_NEWNS = libc::CLONE_NEWNS,
        CLONE_NEWUSER = libc::CLONE_NEWUSER,
        CLONE_NEWCGROUP = libc::CLONE_NEWCGROUP,
        CLONE_NEWUTS = libc::CLONE_NEWUTS,
        CLONE_NEWIPC = libc::CLONE_NEWIPC,
        CLONE_NEWPID = libc::CLONE_NEWPID,
        CLONE_NEWNET = libc::CLONE_NEWNET,
        SIGCHLD = libc::SIGCHLD,
        SIGKILL = libc::SIGKILL,
        SIG_DFL = libc::SIG_DFL,
        SIG_IGN = libc::SIG_IGN,
        EINTR = libc::EINTR,
        ECHILD = libc::ECHILD,
        ENOENT = libc::ENOENT,
        EINVAL = libc::EINVAL,
        EIO = libc::EIO,
        ENAMETOOLONG = libc::ENAMETOOLONG,
        MSG_NOSIGNAL = libc::MSG_NOSIGNAL,
        MSG_CMSG_CLOEXEC = libc::MSG_CMSG_CLOEXEC,
        SOL_SOCKET = libc::SOL_SOCKET,
        SCM_RIGHTS = libc::SCM_RIGHTS,
        MS_NOSUID = libc::MS_NOSUID,
        MS_NODEV = libc::MS_NODEV,
        MS_NOEXEC = libc::MS_NOEXEC,
        MS_RDONLY = libc::MS_RDONLY,
        MS_REMOUNT = libc::MS_REMOUNT,
        MS_BIND = libc::MS_BIND,
        MS_MOVE = libc::MS_MOVE,
        MS_REC = libc::MS_REC,
        MNT_DETACH = libc::MNT_DETACH,
        O_PATH = libc::O_PATH,
        O_CLOEXEC = libc::O_CLOEXEC,
        O_WRONLY = libc::O_WRONLY,
        AF_INET = libc::AF_INET,
        SOCK_DGRAM = libc::SOCK_DGRAM,
        SIOCGIFFLAGS = libc::SIOCGIFFLAGS,
        SIOCSIFFLAGS = libc::SIOCSIFFLAGS,
        FIONREAD = libc::FIONREAD,
        IFF_UP = libc::IFF_UP,
        RLIMIT_CPU = libc::RLIMIT_CPU,
        RLIMIT_FSIZE = libc::RLIMIT_FSIZE,
        RLIMIT_CORE = libc::RLIMIT_CORE,
        RLIMIT_NOFILE = libc::RLIMIT_NOFILE,
        RLIMIT_SIGPENDING = libc::RLIMIT_SIGPENDING,
        RLIMIT_MSGQUEUE = libc::RLIMIT_MSGQUEUE,
        RUSAGE_CHILDREN = libc::RUSAGE_CHILDREN,
        PR_SET_NAME = libc::PR_SET_NAME,
        PR_CAPBSET_DROP = libc::PR_CAPBSET_DROP,
        PR_SET_SECCOMP = libc::PR_SET_SECCOMP,
        PR_SET_NO_NEW_PRIVS = libc::PR_SET_NO_NEW_PRIVS,
        PR_CAP_AMBIENT = libc::PR_CAP_AMBIENT,
        PR_CAP_AMBIENT_CLEAR_ALL = libc::PR_CAP_AMBIENT_CLEAR_ALL,
        SECCOMP_MODE_FILTER = libc::SECCOMP_MODE_FILTER,
        SIG_SETMASK = libc::SIG_SETMASK,
        FUTEX_WAIT = libc::FUTEX_WAIT,
        FUTEX_WAKE = libc::FUTEX_WAKE,
        F_GETFD = libc::F_GETFD,
        F_SETFD = libc::F_SETFD,
        FD_CLOEXEC = libc::FD_CLOEXEC,
        MADV_DOFORK = libc::MADV_DOFORK,
        EFD_CLOEXEC = libc::EFD_CLOEXEC,
        RTLD_LAZY = libc::RTLD_LAZY,
        RTLD_NOLOAD = libc::RTLD_NOLOAD,
    );
}

#[test]
fn the_native_loops_structures_are_the_kernels() {
    assert_eq!(size_of::<sys::IoVec>(), size_of::<libc::iovec>());
    assert_eq!(size_of::<sys::MsgHdr>(), size_of::<libc::msghdr>());
    assert_eq!(size_of::<sys::CmsgHdr>(), size_of::<libc::cmsghdr>());
    assert_eq!(size_of::<sys::TimeVal>(), size_of::<libc::timeval>());
    assert_eq!(size_of::<sys::RUsage>(), size_of::<libc::rusage>());
    assert_eq!(size_of::<sys::RLimit>(), size_of::<libc::rlimit>());
    assert_eq!(size_of::<sys::SockFprog>(), size_of::<libc::sock_fprog>());
    // `struct landlock_path_beneath_attr` is packed: a u64 and an i32.
    assert_eq!(size_of::<sys::PathBeneath>(), 12);
}

#[test]
fn the_landlock_rights_are_the_kernels() {
    let bits = |set: landlock::BitFlags<AccessFs>| set.bits();
    for (ours, right) in [
        (restriction::LL_EXECUTE, AccessFs::Execute),
        (restriction::LL_WRITE_FILE, AccessFs::WriteFile),
        (restriction::LL_READ_FILE, AccessFs::ReadFile),
        (restriction::LL_READ_DIR, AccessFs::ReadDir),
        (restriction::LL_TRUNCATE, AccessFs::Truncate),
        (restriction::LL_IOCTL_DEV, AccessFs::IoctlDev),
        (sys::LL_REFER, AccessFs::Refer),
    ] {
        assert_eq!(ours, right as u64, "{right:?}");
    }
    assert_eq!(sys::LL_ABI1, bits(AccessFs::from_all(ABI::V1)));
    // `linux/landlock.h`: LANDLOCK_RULE_PATH_BENEATH, LANDLOCK_CREATE_RULESET_VERSION.
    assert_eq!(
        (sys::LL_RULE_PATH_BENEATH, sys::LL_CREATE_RULESET_VERSION),
        (1, 1)
    );
    // The rights the native loop handles on the newest ABI it asks for, as the crate's
    // ruleset does.
    assert_eq!(sys::LL_TARGET_ABI, 6);
    assert_eq!(
        sys::LL_ABI1 | sys::LL_REFER | restriction::LL_TRUNCATE | restriction::LL_IOCTL_DEV,
        bits(AccessFs::from_all(ABI::V6))
    );
    assert_eq!(sys::LL_SCOPE_ALL, Scope::from_all(ABI::V6).bits());
}
