//! `doctor` for the helper-based backends: run a tiny program through the real helper and
//! report what was enforced, or why the sandbox could not be built.

use std::path::{Path, PathBuf};

use gearbox_core::{BackendKind, BackendReport, Job, JobFile, Limits};

use crate::cgroup::CgroupSupport;
use crate::helper::run_helper_report;
use crate::wire::Mode;

pub fn probe(helper: &Path, mode: Mode) -> BackendReport {
    let backend = match mode {
        Mode::Linux => BackendKind::Linux,
        Mode::Process => BackendKind::Process,
    };
    let helper: PathBuf = helper.to_path_buf();
    let job = Job {
        language: "probe".into(),
        argv: vec!["/bin/sh".into(), "probe.sh".into()],
        program_argv: vec!["probe.sh".into()],
        files: vec![JobFile {
            path: "probe.sh".into(),
            content: b"exit 0\n".to_vec(),
        }],
        limits: Limits {
            timeout_ms: 5000,
            ..Limits::default()
        },
        ..Job::default()
    };
    // Run on a private runtime in its own thread: callers may already be inside one.
    let result = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
            .and_then(|rt| {
                rt.block_on(run_helper_report(helper, mode, job))
                    .map_err(|e| e.to_string())
            })
    })
    .join()
    .unwrap_or_else(|_| Err("probe thread panicked".into()));
    let mut details = vec![];
    let available = match result {
        Ok((outcome, enforced)) if outcome.is_ok() => {
            details.extend(enforced);
            if let Some(us) = outcome.usage.setup_us {
                details.push(format!("sandbox set-up: {:.1} ms", us as f64 / 1000.0));
            }
            true
        }
        Ok((outcome, _)) => {
            details.push(format!("probe program failed: {}", outcome.summary()));
            false
        }
        Err(e) => {
            details.push(format!("cannot build a sandbox here: {e}"));
            false
        }
    };
    if mode == Mode::Linux {
        if let Some(why) = unenforced_limits() {
            details.push(format!(
                "cgroups: {why}: the memory of the whole run is sampled every 10 ms and the run \
                 killed past memory_mb, memfd and SysV shared memory refused, processes capped by \
                 RLIMIT_NPROC, CPU time by RLIMIT_CPU per process (`[sandbox] require_limits` \
                 refuses runs here)"
            ));
        }
    } else {
        details.push(
            "WARNING: no isolation — the program can read and write what the server's user can, \
             reach the network, and a setsid() descendant can outlive the run"
                .into(),
        );
    }
    BackendReport {
        backend,
        available,
        details,
    }
}

/// Why the `linux` backend cannot give runs kernel-enforced whole-run limits (a cgroup per
/// run) on this host, or `None` when it can.
pub fn unenforced_limits() -> Option<String> {
    if !nix::unistd::Uid::current().is_root() {
        return Some("not used (not root)".into());
    }
    match CgroupSupport::detect() {
        CgroupSupport::None { why } => Some(format!("unavailable ({why})")),
        _ => None,
    }
}
