//! The memory of a run that has no memory cgroup (the helper is not root, or the host has no
//! writable cgroups), measured by the helper from outside the sandbox.
//!
//! Without a cgroup the kernel bounds each process on its own (`RLIMIT_DATA` caps private
//! writable memory), which leaves three ways past `memory_mb`: many processes, shared
//! memory (a `MAP_SHARED` anonymous mapping is not data), and files in the run's tmpfs. So
//! the helper samples the whole run every [`INTERVAL`]: the proportional anonymous and shared
//! memory of every process of the run (`Pss_Anon` + `Pss_Shmem` of `smaps_rollup`: a page
//! shared by several processes is counted once in all) plus what the run's tmpfs holds, and
//! kills the run when the sum passes the limit. Memory that no process maps and no tmpfs
//! holds (memfd, SysV shared memory and message queues) cannot be seen this way: without a
//! cgroup the seccomp policy refuses the calls that create it (`seccomp.rs`). The processes
//! are listed from the run's own /proc, reached through its init (`/proc/PID/root/proc`).
//!
//! What it does not bound: the kernel's own memory for the run (page tables, pipe and socket
//! buffers), and what a program allocates and frees again between two samples.

use std::path::PathBuf;
use std::time::Duration;

/// How often a run is measured.
pub const INTERVAL: Duration = Duration::from_millis(10);

/// The sampler of one run.
pub struct MemoryWatch {
    /// The run's root, as the helper reaches it: `/proc/<init>/root`.
    root: PathBuf,
    limit_kb: u64,
    /// Highest sum sampled so far, in KiB.
    pub peak_kb: u64,
    /// Whether any sample could be taken.
    pub measured: bool,
}

impl MemoryWatch {
    pub fn new(init_pid: i32, limit_mb: u64) -> MemoryWatch {
        MemoryWatch {
            root: PathBuf::from(format!("/proc/{init_pid}/root")),
            limit_kb: limit_mb.saturating_mul(1024),
            peak_kb: 0,
            measured: false,
        }
    }

    /// Measure the run once; true when it is over its limit.
    pub fn sample(&mut self) -> bool {
        let Some(kb) = self.total_kb() else {
            return false;
        };
        self.measured = true;
        self.peak_kb = self.peak_kb.max(kb);
        kb > self.limit_kb
    }

    /// Anonymous and shared memory of every process plus the tmpfs, in KiB; `None` when the
    /// run's /proc cannot be read (not yet mounted, or the run is gone).
    fn total_kb(&self) -> Option<u64> {
        let proc_dir = self.root.join("proc");
        let entries = std::fs::read_dir(&proc_dir).ok()?;
        let mut total = 0u64;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
                continue;
            }
            // A process that ended between the listing and the read counts nothing.
            if let Ok(text) = std::fs::read_to_string(entry.path().join("smaps_rollup")) {
                total += rollup_kb(&text);
            }
        }
        Some(total + tmpfs_used_kb(&self.root.join("work")).unwrap_or(0))
    }
}

/// `Pss_Anon` plus `Pss_Shmem` of a `smaps_rollup`, in KiB.
fn rollup_kb(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| {
            let (key, rest) = l.split_once(':')?;
            if key != "Pss_Anon" && key != "Pss_Shmem" {
                return None;
            }
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// Bytes in use on the file system holding `path`, in KiB.
fn tmpfs_used_kb(path: &std::path::Path) -> Option<u64> {
    let s = nix::sys::statfs::statfs(path).ok()?;
    let used = s.blocks().saturating_sub(s.blocks_free());
    Some(used.saturating_mul(s.block_size() as u64) / 1024)
}

/// System calls that hold memory no process maps and no tmpfs counts, refused (EPERM) where
/// the run has no memory cgroup: `memfd_create` (an anonymous file), `shmget` (SysV shared
/// memory, which lives on in the IPC namespace unattached) and `msgget` (SysV message
/// queues). With a cgroup the kernel charges all three to the run.
pub fn unaccounted_memory_filter() -> Result<seccompiler::BpfProgram, String> {
    let arch =
        seccompiler::TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let rules = [libc::SYS_memfd_create, libc::SYS_shmget, libc::SYS_msgget]
        .into_iter()
        .map(|nr| (nr, vec![]))
        .collect();
    let filter = seccompiler::SeccompFilter::new(
        rules,
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_unaccounted_memory_filter_compiles() {
        assert!(
            !super::unaccounted_memory_filter()
                .expect("compiles")
                .is_empty()
        );
    }

    #[test]
    fn a_rollup_counts_anonymous_and_shared_memory_only() {
        let text = "55d0c-7ffd0 ---p 00000000 00:00 0                          [rollup]\n\
                    Rss:               10240 kB\nPss:                9000 kB\n\
                    Pss_Anon:           4000 kB\nPss_File:           3000 kB\n\
                    Pss_Shmem:          2000 kB\nShared_Clean:       100 kB\n";
        assert_eq!(super::rollup_kb(text), 6000);
        assert_eq!(super::rollup_kb(""), 0);
    }

    #[test]
    fn this_process_is_measured_through_its_own_root() {
        // The helper reads a run's processes through /proc/<init>/root/proc; here the test
        // process's own root stands in for a run's.
        let mut w = super::MemoryWatch::new(std::process::id() as i32, 1 << 30);
        assert!(!w.sample(), "a terabyte is not exceeded");
        assert!(w.measured);
        assert!(w.peak_kb > 0);
    }
}
