//! Where gearbox's cgroups are on this host, seen from the host: shared by the test binaries
//! that check a run's or a fork server's cgroup (included with `#[path]`).

use std::path::PathBuf;

use gearbox_sandbox::CgroupSupport;

/// Whether this host can run the checks that need root and per-run cgroups (the fork
/// servers, cgroup limits, the stale-cgroup sweep). Without them a check is skipped loudly,
/// unless `GEARBOX_SANDBOX_REQUIRED` is set (CI's root pass sets it): then a skip is a failure.
pub fn root_and_cgroups(what: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root && !matches!(CgroupSupport::detect(), CgroupSupport::None { .. }) {
        return true;
    }
    if std::env::var_os("GEARBOX_SANDBOX_REQUIRED").is_some() {
        panic!("{what}: needs root and cgroups, and GEARBOX_SANDBOX_REQUIRED is set");
    }
    eprintln!("SKIPPED {what}: needs root and cgroups (per-run limits)");
    false
}

/// The `gearbox` parent cgroup of each hierarchy gearbox uses (memory and pids on v1).
pub fn gearbox_roots() -> Vec<PathBuf> {
    match CgroupSupport::detect() {
        CgroupSupport::V1 { memory, pids, .. } => [memory, pids]
            .into_iter()
            .flatten()
            .map(|r| r.join("gearbox"))
            .collect(),
        CgroupSupport::V2 { root } => vec![root.join("gearbox")],
        CgroupSupport::None { .. } => vec![],
    }
}

/// The host directories of the gearbox cgroups process `pid` is in (`/proc/PID/cgroup`).
pub fn gearbox_cgroups_of(pid: u32) -> Vec<PathBuf> {
    let lines = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut dirs = Vec::new();
    for line in lines.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (
            parts.next(),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        let Some(name) = path.strip_prefix("/gearbox/") else {
            continue;
        };
        match CgroupSupport::detect() {
            CgroupSupport::V1 { memory, pids, .. } => {
                for (controller, root) in [("memory", memory), ("pids", pids)] {
                    if let Some(root) = root
                        && controllers.split(',').any(|c| c == controller)
                    {
                        dirs.push(root.join("gearbox").join(name));
                    }
                }
            }
            CgroupSupport::V2 { root } => dirs.push(root.join("gearbox").join(name)),
            CgroupSupport::None { .. } => {}
        }
    }
    dirs
}
