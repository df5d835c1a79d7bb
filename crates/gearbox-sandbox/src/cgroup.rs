//! Per-run cgroups: memory (no swap), pids, and CPU accounting. cgroup v1 hierarchies (as on
//! this kind of host) and a delegated cgroup v2 tree are both supported; where neither is
//! writable (an unprivileged helper), the run falls back to rlimits and `doctor` says so.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gearbox_core::Limits;

/// Name of gearbox's parent cgroup in each hierarchy.
const PARENT: &str = "gearbox";

/// Which cgroup layout the host offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupSupport {
    /// v1 hierarchies by controller.
    V1 {
        memory: Option<PathBuf>,
        pids: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    /// A v2 mount with the memory and pids controllers available.
    V2 {
        root: PathBuf,
    },
    None {
        why: String,
    },
}

impl CgroupSupport {
    /// What [`CgroupSupport::detect`] found the first time this process asked: a server
    /// creates a cgroup for every fork-server slot, and reading mountinfo each time showed up
    /// in its profile. (`gearbox doctor` detects afresh.)
    pub fn cached() -> CgroupSupport {
        static DETECTED: std::sync::OnceLock<CgroupSupport> = std::sync::OnceLock::new();
        DETECTED.get_or_init(CgroupSupport::detect).clone()
    }

    /// Read /proc/self/mountinfo.
    pub fn detect() -> CgroupSupport {
        let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
            return CgroupSupport::None {
                why: "cannot read /proc/self/mountinfo".into(),
            };
        };
        let (mut memory, mut pids, mut cpuacct, mut v2) = (None, None, None, None);
        for line in info.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).map(PathBuf::from);
            let mut r = right.split(' ');
            let fstype = r.next().unwrap_or_default();
            let opts = r.nth(1).unwrap_or_default();
            match fstype {
                "cgroup" => {
                    let has = |c: &str| opts.split(',').any(|o| o == c);
                    if has("memory") {
                        memory = mount_point.clone();
                    }
                    if has("pids") {
                        pids = mount_point.clone();
                    }
                    if has("cpuacct") {
                        cpuacct = mount_point.clone();
                    }
                }
                "cgroup2" => {
                    if let Some(mp) = mount_point {
                        let controllers =
                            fs::read_to_string(mp.join("cgroup.controllers")).unwrap_or_default();
                        if controllers.split_whitespace().any(|c| c == "memory")
                            && controllers.split_whitespace().any(|c| c == "pids")
                        {
                            v2 = Some(mp);
                        }
                    }
                }
                _ => {}
            }
        }
        if memory.is_some() || pids.is_some() {
            CgroupSupport::V1 {
                memory,
                pids,
                cpuacct,
            }
        } else if let Some(root) = v2 {
            CgroupSupport::V2 { root }
        } else {
            CgroupSupport::None {
                why: "no cgroup mount offers the memory or pids controller".into(),
            }
        }
    }
}

/// [`sweep_stale`] on a thread of its own, as root (only root makes run cgroups). A server
/// calls it as it starts; a one-shot `gearbox run` does not: what it leaves when killed, the
/// next server's start removes, and the scan would take CPU from its own run.
pub fn sweep_stale_in_background() {
    if !nix::unistd::Uid::current().is_root() {
        return;
    }
    std::thread::spawn(|| {
        let n = sweep_stale();
        if n > 0 {
            tracing::info!(removed = n, "removed run cgroups left by dead processes");
        }
    });
}

/// Remove run cgroups left behind by processes that died before they could (a helper killed
/// with its run, a server killed): names carry the creating process's pid; a cgroup whose
/// creator is gone and that holds no process is removed. Returns how many were removed.
pub fn sweep_stale() -> usize {
    let mut removed = 0;
    for parent in run_parents() {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix("run-")
                .and_then(|r| r.split('-').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            // rmdir fails on a cgroup that still holds a process: nothing live is touched.
            if fs::remove_dir(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// The directory holding run cgroups in each hierarchy gearbox uses on this host.
fn run_parents() -> Vec<PathBuf> {
    let hierarchies: Vec<PathBuf> = match CgroupSupport::detect() {
        CgroupSupport::V1 {
            memory,
            pids,
            cpuacct,
        } => [memory, pids, cpuacct].into_iter().flatten().collect(),
        CgroupSupport::V2 { root } => vec![root],
        CgroupSupport::None { .. } => vec![],
    };
    hierarchies.into_iter().map(|h| h.join(PARENT)).collect()
}

/// Remove the emptied run cgroups this process kept for later runs (a server that stops;
/// what a killed server kept, the next one's [`sweep_stale`] removes).
pub fn remove_spares() {
    // Taken out first: removing waits for stragglers, which must not hold the lock.
    let spares = std::mem::take(&mut *SPARES.lock().unwrap_or_else(|p| p.into_inner()));
    drop(spares);
}

/// The cgroup(s) of one run; removed on drop, or kept for another run by
/// [`Cgroup::release`].
pub struct Cgroup {
    dirs: Vec<PathBuf>,
    memory: Option<PathBuf>,
    pids: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    v2: bool,
    /// Whether `memory.memsw.*` (swap accounting) exists.
    memsw: bool,
    /// Open v1 control files, where both the memory and the pids hierarchy exist.
    files: Option<V1Files>,
    limits: Limits,
}

/// The control files of a v1 run cgroup that every run reads or writes, kept open and used
/// at offset 0: opening a cgroup file walks its path and builds a seq_file each time.
struct V1Files {
    /// `cgroup.procs` of each hierarchy, in the order of `Cgroup::dirs`.
    procs: Vec<fs::File>,
    oom_control: fs::File,
    max_usage: fs::File,
    memsw_max_usage: Option<fs::File>,
    usage: fs::File,
    pids_current: fs::File,
}

impl V1Files {
    fn open(cg: &Cgroup) -> Result<V1Files, String> {
        let (Some(memory), Some(pids)) = (&cg.memory, &cg.pids) else {
            return Err("a memory and a pids cgroup".into());
        };
        let open = |dir: &Path, file: &str, read: bool, write: bool| {
            let path = dir.join(file);
            fs::OpenOptions::new()
                .read(read)
                .write(write)
                .open(&path)
                .map_err(|e| format!("open {}: {e}", path.display()))
        };
        Ok(V1Files {
            procs: cg
                .dirs
                .iter()
                .map(|d| open(d, "cgroup.procs", false, true))
                .collect::<Result<_, _>>()?,
            oom_control: open(memory, "memory.oom_control", true, false)?,
            max_usage: open(memory, "memory.max_usage_in_bytes", true, true)?,
            memsw_max_usage: if cg.memsw {
                Some(open(
                    memory,
                    "memory.memsw.max_usage_in_bytes",
                    false,
                    true,
                )?)
            } else {
                None
            },
            usage: open(memory, "memory.usage_in_bytes", true, false)?,
            pids_current: open(pids, "pids.current", true, false)?,
        })
    }
}

/// The whole text of an open control file (read afresh from offset 0).
fn read_file(f: &fs::File) -> Option<String> {
    let mut buf = [0u8; 512];
    let n = f.read_at(&mut buf, 0).ok()?;
    String::from_utf8(buf[..n].to_vec()).ok()
}

fn read_file_u64(f: &fs::File) -> Option<u64> {
    read_file(f)?.trim().parse().ok()
}

/// Emptied v1 run cgroups, each kept for the next run with the same memory and pids limits
/// (see [`Cgroup::release`]): creating and removing two v1 cgroups was ~6 % of a warm run's
/// CPU.
static SPARES: std::sync::Mutex<Vec<Cgroup>> = std::sync::Mutex::new(Vec::new());
/// How many emptied cgroups are kept at most.
const MAX_SPARES: usize = 16;
/// Memory still charged to an emptied cgroup above which it is removed rather than kept:
/// the next run's usage and peak start from it. Most of it is the kernel's per-CPU charge
/// batches (up to 64 pages per CPU, held by the cgroup that charged last on that CPU, and
/// counted in a fresh cgroup's usage too once it has run there); the rest is page cache and
/// kernel objects the run brought in, allowed up to 512 KiB.
/// Computed once: glibc's `sysconf(_SC_NPROCESSORS_ONLN)` opens and reads a sysfs file each
/// time, and a release checks the residue every few milliseconds until the run has left.
fn max_residue() -> u64 {
    static RESIDUE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *RESIDUE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as u64;
        (512 << 10) + cpus * 64 * 4096
    })
}

impl Cgroup {
    pub fn create(limits: &Limits) -> Result<Cgroup, String> {
        if let Some(spare) = Cgroup::spare(limits) {
            return Ok(spare);
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        // A server builds many cgroups at once (fork-server slots): a counter keeps names apart.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("run-{}-{nanos}-{seq}", std::process::id());
        let mut cg = Cgroup {
            dirs: vec![],
            memory: None,
            pids: None,
            cpuacct: None,
            v2: false,
            memsw: false,
            files: None,
            limits: *limits,
        };
        let mem_bytes = limits.memory_mb * 1024 * 1024;
        match CgroupSupport::cached() {
            CgroupSupport::None { why } => return Err(why),
            CgroupSupport::V1 {
                memory,
                pids,
                cpuacct,
            } => {
                if let Some(m) = memory {
                    let dir = cg.make(&m, &name)?;
                    write(&dir, "memory.limit_in_bytes", &mem_bytes.to_string())?;
                    // Swap counts against the same limit where swap accounting exists.
                    if dir.join("memory.memsw.limit_in_bytes").exists() {
                        write(&dir, "memory.memsw.limit_in_bytes", &mem_bytes.to_string())?;
                        cg.memsw = true;
                    }
                    let _ = write(&dir, "memory.swappiness", "0");
                    cg.memory = Some(dir);
                }
                if let Some(p) = pids {
                    let dir = cg.make(&p, &name)?;
                    write(&dir, "pids.max", &limits.pids.to_string())?;
                    cg.pids = Some(dir);
                }
                // CPU time comes from rusage: joining one more v1 hierarchy costs another
                // cgroup migration per run.
                let _ = cpuacct;
                if cg.memory.is_some() && cg.pids.is_some() {
                    cg.files = Some(V1Files::open(&cg)?);
                }
            }
            CgroupSupport::V2 { root } => {
                let parent = root.join(PARENT);
                if !parent.exists() {
                    fs::create_dir(&parent)
                        .map_err(|e| format!("create {}: {e}", parent.display()))?;
                }
                let _ = write(&root, "cgroup.subtree_control", "+memory +pids +cpu");
                write(&parent, "cgroup.subtree_control", "+memory +pids")?;
                let dir = parent.join(&name);
                fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
                cg.dirs.push(dir.clone());
                write(&dir, "memory.max", &mem_bytes.to_string())?;
                let _ = write(&dir, "memory.swap.max", "0");
                write(&dir, "pids.max", &limits.pids.to_string())?;
                cg.v2 = true;
                cg.memory = Some(dir.clone());
                cg.pids = Some(dir.clone());
                cg.cpuacct = Some(dir);
            }
        }
        Ok(cg)
    }

    /// A kept cgroup with these limits, if there is one.
    fn spare(limits: &Limits) -> Option<Cgroup> {
        let mut spares = SPARES.lock().unwrap_or_else(|p| p.into_inner());
        let i = spares.iter().position(|cg| {
            cg.limits.memory_mb == limits.memory_mb && cg.limits.pids == limits.pids
        })?;
        let mut cg = spares.swap_remove(i);
        cg.limits = *limits;
        Some(cg)
    }

    /// The run is over (its pid 1 was killed): keep this cgroup for the next run with the
    /// same limits if it empties in time and is clean — no process left and next to no memory
    /// still charged within 250 ms, no OOM kill — with its peak reset; remove it otherwise. Only v1 cgroups
    /// are kept (v2's `memory.peak` resets per open file). Blocking: it may wait a little for
    /// the run's processes to leave.
    pub fn release(mut self) {
        if self.reusable() {
            let mut spares = SPARES.lock().unwrap_or_else(|p| p.into_inner());
            if spares.len() < MAX_SPARES {
                spares.push(self);
                return;
            }
        }
        if !self.try_remove() {
            self.kill_all();
        }
        // Dropped: removed, waiting for stragglers.
    }

    /// Empty and clean, with its peak reset: ready for another run.
    fn reusable(&self) -> bool {
        let Some(files) = &self.files else {
            return false;
        };
        // pids.current counts every task of the run until it is reaped; the memory cgroup
        // holds the same tasks (both were joined by the run's pid 1, before it forked). What
        // the run's processes held is uncharged as they go, some of it after an RCU grace
        // period: on a loaded machine both take a while.
        let deadline = std::time::Instant::now() + Duration::from_millis(250);
        loop {
            if read_file_u64(&files.pids_current) == Some(0)
                && read_file_u64(&files.usage).is_some_and(|u| u <= max_residue())
            {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.oom_killed() {
            return false;
        }
        // Writing 0 sets the peak to the current usage.
        let reset = |f: &fs::File| f.write_at(b"0", 0).is_ok();
        reset(&files.max_usage) && files.memsw_max_usage.as_ref().is_none_or(reset)
    }

    fn make(&mut self, hierarchy: &Path, name: &str) -> Result<PathBuf, String> {
        let parent = hierarchy.join(PARENT);
        if !parent.exists() {
            fs::create_dir(&parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
        }
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// Lines for the report: what this cgroup enforces.
    pub fn describe(&self) -> Vec<String> {
        let v = if self.v2 { "v2" } else { "v1" };
        let mut out = vec![];
        if self.memory.is_some() {
            out.push(format!(
                "cgroup {v}: memory {} MiB, no swap",
                self.limits.memory_mb
            ));
        }
        if self.pids.is_some() {
            out.push(format!("cgroup {v}: pids {}", self.limits.pids));
        }
        out
    }

    /// The `tasks` file of each v1 hierarchy, opened for writing by this (root) process, for
    /// a process to move itself in by writing `0` ([`join_self`]); `None` on v2.
    ///
    /// Moving a whole process (`cgroup.procs`, or another pid) write-locks the kernel's
    /// global `cgroup_threadgroup_rwsem`, which waits for an RCU grace period (0.1 to 18 ms
    /// measured here) and meanwhile holds up every fork and exit on the host; a thread that
    /// moves itself through `tasks` takes no such lock (20 µs). The kernel checks the
    /// credentials the file was opened with, so the process that writes may have given up
    /// its privileges since.
    pub fn open_tasks(&self) -> Option<Result<Vec<std::os::fd::OwnedFd>, String>> {
        if self.v2 {
            return None;
        }
        Some(
            self.dirs
                .iter()
                .map(|d| {
                    let path = d.join("tasks");
                    fs::OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map(std::os::fd::OwnedFd::from)
                        .map_err(|e| format!("open {}: {e}", path.display()))
                })
                .collect(),
        )
    }

    pub fn attach(&self, pid: i32) -> Result<(), String> {
        if let Some(files) = &self.files {
            for (f, dir) in files.procs.iter().zip(&self.dirs) {
                f.write_at(pid.to_string().as_bytes(), 0)
                    .map_err(|e| format!("write {}/cgroup.procs: {e}", dir.display()))?;
            }
            return Ok(());
        }
        for dir in &self.dirs {
            write(dir, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    pub fn oom_killed(&self) -> bool {
        let Some(m) = &self.memory else { return false };
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = match &self.files {
            Some(files) => read_file(&files.oom_control),
            None => fs::read_to_string(m.join(file)).ok(),
        }
        .unwrap_or_default();
        text.lines().any(|l| {
            let mut it = l.split_whitespace();
            it.next() == Some("oom_kill")
                && it.next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) > 0
        })
    }

    pub fn peak_memory_kb(&self) -> Option<u64> {
        let m = self.memory.as_ref()?;
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        match &self.files {
            Some(files) => read_file_u64(&files.max_usage),
            None => read_u64(&m.join(file)),
        }
        .map(|b| b / 1024)
    }

    pub fn cpu_time_ms(&self) -> Option<u64> {
        let c = self.cpuacct.as_ref()?;
        if self.v2 {
            let text = fs::read_to_string(c.join("cpu.stat")).ok()?;
            let usec = text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))?
                .trim()
                .parse::<u64>()
                .ok()?;
            Some(usec / 1000)
        } else {
            read_u64(&c.join("cpuacct.usage")).map(|ns| ns / 1_000_000)
        }
    }

    /// Remove the cgroup if it is empty already (a finished run's usually is): whether it is
    /// gone. What could not be removed stays for [`Cgroup::kill_all`] and the drop.
    fn try_remove(&mut self) -> bool {
        self.files = None;
        self.dirs
            .retain(|dir| fs::remove_dir(dir).is_err() && dir.exists());
        self.dirs.is_empty()
    }

    /// Kill anything still in the cgroup (normally nothing: the pid namespace is gone).
    pub fn kill_all(&self) {
        for dir in &self.dirs {
            if self.v2 {
                let _ = write(dir, "cgroup.kill", "1");
            }
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) with a pid read from our own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.files = None;
        for dir in self.dirs.iter().rev() {
            // Processes killed a moment ago may still be leaving the cgroup.
            for _ in 0..50 {
                if fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    fs::write(dir.join(file), value).map_err(|e| format!("write {}/{file}: {e}", dir.display()))
}

fn read_u64(p: &Path) -> Option<u64> {
    fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Move the calling thread (a single-threaded process: the whole process) into the cgroups
/// whose `tasks` files are `tasks` ([`Cgroup::open_tasks`]).
pub fn join_self(tasks: &[std::os::fd::OwnedFd]) -> Result<(), String> {
    for fd in tasks {
        nix::unistd::write(fd, b"0").map_err(|e| format!("write tasks: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Child, Command, Stdio};

    /// Real cgroups: as root on a host with v1 memory and pids hierarchies only.
    fn v1_host() -> bool {
        // SAFETY: getuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let v1 = matches!(
            CgroupSupport::cached(),
            CgroupSupport::V1 {
                memory: Some(_),
                pids: Some(_),
                ..
            }
        );
        if !(root && v1) {
            eprintln!("skipped: needs root and cgroup v1 memory and pids hierarchies");
        }
        root && v1
    }

    /// The sweep removes a run cgroup whose creator is gone and leaves one whose creator
    /// runs, in every hierarchy.
    #[test]
    fn the_sweep_removes_only_what_dead_processes_left() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || run_parents().is_empty() {
            eprintln!("skipped: needs root and cgroups");
            return;
        }
        let mut gone = Command::new("true").spawn().expect("spawn true");
        let dead = gone.id();
        gone.wait().expect("wait");
        let live = std::process::id();
        let mut made = Vec::new();
        for parent in run_parents() {
            fs::create_dir_all(&parent).expect("run cgroup parent");
            let stale = parent.join(format!("run-{dead}-sweep-unit"));
            let kept = parent.join(format!("run-{live}-sweep-unit"));
            fs::create_dir(&stale).expect("stale cgroup");
            fs::create_dir(&kept).expect("live cgroup");
            made.push((stale, kept));
        }
        sweep_stale();
        for (stale, kept) in &made {
            let (gone, there) = (!stale.exists(), kept.exists());
            let _ = fs::remove_dir(kept);
            assert!(gone, "not removed: {stale:?}");
            assert!(there, "a live process's cgroup was removed: {kept:?}");
        }
    }

    /// A process in `cg` that, once told, holds `mb` MiB (touched) and exits.
    fn allocator(cg: &Cgroup, mb: u64) -> Child {
        // The interpreter's files are read into the page cache outside `cg` first: page cache
        // is charged to the cgroup that reads it first, and would stay charged to `cg`.
        let warm = Command::new("python3").args(["-c", "pass"]).status();
        assert!(warm.expect("python3").success());
        let mut child = Command::new("python3")
            .args([
                "-c",
                &format!("import sys\nsys.stdin.read(1)\nx = b'x' * ({mb} << 20)"),
            ])
            .stdin(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        cg.attach(child.id() as i32).expect("attach");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(b"g")
            .expect("go");
        child
    }

    fn limits(memory_mb: u64, pids: u64) -> Limits {
        Limits {
            memory_mb,
            pids,
            ..Limits::default()
        }
    }

    #[test]
    fn an_emptied_cgroup_is_kept_for_the_next_run_with_its_peak_reset() {
        if !v1_host() {
            return;
        }
        // Limits no other test uses: the kept cgroups are process-wide.
        let l = limits(301, 37);
        let cg = Cgroup::create(&l).expect("create");
        let dirs = cg.dirs.clone();
        assert!(allocator(&cg, 40).wait().expect("wait").success());
        assert!(cg.peak_memory_kb().expect("peak") >= 40 << 10);
        cg.release();
        assert!(dirs.iter().all(|d| d.exists()), "kept: {dirs:?}");

        let again = Cgroup::create(&l).expect("create");
        assert_eq!(again.dirs, dirs, "the emptied cgroup was not reused");
        let peak = again.peak_memory_kb().expect("peak");
        assert!(
            peak <= max_residue() / 1024,
            "peak carried over: {peak} KiB"
        );
        assert!(!again.oom_killed());
        // Other limits never get it.
        let other = Cgroup::create(&limits(302, 37)).expect("create");
        assert_ne!(other.dirs, dirs);
        drop(other);
        drop(again);
        assert!(dirs.iter().all(|d| !d.exists()), "not removed: {dirs:?}");
    }

    #[test]
    fn a_cgroup_with_a_process_left_is_emptied_and_removed() {
        if !v1_host() {
            return;
        }
        let l = limits(303, 37);
        let cg = Cgroup::create(&l).expect("create");
        let dirs = cg.dirs.clone();
        let mut left = Command::new("sleep").arg("30").spawn().expect("sleep");
        cg.attach(left.id() as i32).expect("attach");
        cg.release();
        let status = left.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert!(dirs.iter().all(|d| !d.exists()), "not removed: {dirs:?}");
        let next = Cgroup::create(&l).expect("create");
        assert_ne!(next.dirs, dirs);
    }

    #[test]
    fn a_cgroup_whose_run_was_killed_for_memory_is_not_kept() {
        if !v1_host() {
            return;
        }
        let l = limits(32, 38);
        let cg = Cgroup::create(&l).expect("create");
        let dirs = cg.dirs.clone();
        let status = allocator(&cg, 100).wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
        assert!(cg.oom_killed());
        cg.release();
        let next = Cgroup::create(&l).expect("create");
        assert_ne!(next.dirs, dirs);
        assert!(!next.oom_killed());
        assert!(dirs.iter().all(|d| !d.exists()), "not removed: {dirs:?}");
    }
}
