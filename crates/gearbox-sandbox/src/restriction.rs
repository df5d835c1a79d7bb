//! The restriction of a run, as data: what the helper's init and program apply on the cold
//! path (`jail/mount.rs`, `jail/init.rs`, `jail/program.rs`, `jail/landlock.rs`), and what the
//! fork server's native loop applies to each run it forks (`launchers/fork/`). Both compile
//! this one file: the crate as `crate::restriction`, the native loop through a `#[path]`
//! module. So it holds plain data only, uses nothing outside `core`, and every item is used on
//! both sides.

/// One area a program may write: a directory of the run's scratch tmpfs (one tmpfs backs them
/// all, so one limit covers all the program can write), bound at its place.
pub struct Scratch {
    /// The directory's name on the scratch tmpfs.
    pub stage: &'static str,
    pub mode: u32,
    /// Where the program finds it.
    pub target: &'static str,
}

/// The writable areas. Landlock allows every right beneath them.
pub const SCRATCH: [Scratch; 3] = [
    Scratch {
        stage: "work",
        mode: 0o755,
        target: "/work",
    },
    Scratch {
        stage: "tmp",
        mode: 0o1777,
        target: "/tmp",
    },
    Scratch {
        stage: "shm",
        mode: 0o1777,
        target: "/dev/shm",
    },
];

/// Inodes of a scratch tmpfs of `disk_mb` MiB.
pub const fn scratch_inodes(disk_mb: u64) -> u64 {
    let n = disk_mb.saturating_mul(64);
    if n < 1024 {
        1024
    } else if n > 1 << 20 {
        1 << 20
    } else {
        n
    }
}

/// Device nodes of the run's /dev (bound from the host): Landlock lets the program use them
/// as files.
pub const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// /proc entries a run sees read-only (kernel knobs the program must never write).
pub const PROC_READONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];

/// Limits of the run's user namespace (`/proc/sys/user`, written before /proc/sys turns
/// read-only): how much of the host user's inotify budget one run may hold (the counters are
/// charged to every user namespace up to the host's, each checked against its own limit).
pub const USER_LIMITS: [(&str, &str); 2] = [
    ("max_inotify_instances", "16"),
    ("max_inotify_watches", "4096"),
];

/// Per-user counters, counted in the run's own user namespace: its share of the host user's
/// pending signals (`RLIMIT_SIGPENDING`) and POSIX message-queue bytes (`RLIMIT_MSGQUEUE`).
///
/// The process count is not here: the cold path also sets `RLIMIT_NPROC` to the run's pids
/// limit, as the bound on hosts without cgroups; fork servers run only where every slot has a
/// pids cgroup, which bounds the run as a whole, so their programs do without it.
pub const PENDING_SIGNALS: u64 = 1024;
pub const MESSAGE_QUEUE_BYTES: u64 = 65536;

/// The run's hostname.
pub const HOSTNAME: &str = "gearbox";

// Landlock access rights (`linux/landlock.h`) the rules below name.
pub const LL_EXECUTE: u64 = 1;
pub const LL_WRITE_FILE: u64 = 2;
pub const LL_READ_FILE: u64 = 4;
pub const LL_READ_DIR: u64 = 8;
pub const LL_TRUNCATE: u64 = 0x4000;
pub const LL_IOCTL_DEV: u64 = 0x8000;

/// What Landlock allows beneath `/`: reading and executing (the mounts decide what exists).
pub const LANDLOCK_READ: u64 = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR;
/// What Landlock allows on the device nodes (of the rights the kernel handles): using them as
/// files.
pub const LANDLOCK_DEVICE: u64 =
    LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV;
