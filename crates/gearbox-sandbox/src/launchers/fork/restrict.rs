//! The program's restriction, applied by the program to itself before it returns to the
//! interpreter: the cold path's (`jail/program.rs`, `jail/landlock.rs`), from the same policy
//! (`restriction.rs`).

use std::ffi::{c_int, c_uint, c_ulong, c_void};

use super::config::Config;
use super::message::{Fail, check};
use super::restriction::{
    DEVICES, LANDLOCK_DEVICE, LANDLOCK_READ, LL_IOCTL_DEV, LL_TRUNCATE, MESSAGE_QUEUE_BYTES,
    PENDING_SIGNALS, SCRATCH,
};
use super::sys::*;

pub(crate) fn restrict(config: &Config, stdio: [c_int; 3]) -> Result<&'static str, Fail> {
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
        let counters = [
            (RLIMIT_SIGPENDING, PENDING_SIGNALS),
            (RLIMIT_MSGQUEUE, MESSAGE_QUEUE_BYTES),
        ];
        for (resource, value) in counters {
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

/// The Landlock rules of the shared policy, as `jail/landlock.rs` applies them on the cold
/// path: everything readable and executable, the writable areas fully usable, the device
/// nodes usable as files, signals and abstract unix sockets scoped to the sandbox (ABI 6);
/// best effort on older kernels.
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
        let rules = std::iter::once(("/", LANDLOCK_READ))
            .chain(SCRATCH.iter().map(|area| (area.target, handled)))
            .chain(DEVICES.iter().map(|d| (*d, LANDLOCK_DEVICE & handled)));
        let mut result = Ok(());
        for (path, access) in rules {
            let Some(path) = CPath::join(&[path]) else {
                result = Err(Fail::new("landlock: add rule", ENAMETOOLONG));
                break;
            };
            let parent = open(path.as_ptr(), O_PATH | O_CLOEXEC);
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
                result = Err(Fail::new("landlock: add rule", e));
                break;
            }
        }
        if result.is_ok() && syscall(SYS_LANDLOCK_RESTRICT_SELF, fd, 0 as c_uint) < 0 {
            result = Err(Fail::new("landlock: restrict", errno()));
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
