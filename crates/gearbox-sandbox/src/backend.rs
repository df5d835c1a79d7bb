//! The `linux` and `process` backends as the server sees them: a run goes to a warm
//! sandbox of the pool when one fits, or to a fresh helper (`helper.rs`).

use std::path::PathBuf;
use std::sync::Arc;

use gearbox_core::{
    BackendKind, BackendReport, CollectFuture, CollectLimits, Job, RunFuture, Sandbox,
};

use crate::helper::{run_collecting, run_helper, run_warm};
use crate::pool::{Warm, WarmPool};
use crate::wire::Mode;

/// The default backend: namespaces, a minimal root, seccomp, Landlock, cgroups.
pub struct LinuxSandbox {
    helper: PathBuf,
    pool: Arc<WarmPool>,
}

impl LinuxSandbox {
    /// `helper` is a binary whose `__jail` subcommand calls [`crate::jail_main`].
    pub fn new(helper: PathBuf) -> Self {
        let pool = WarmPool::new(helper.clone());
        LinuxSandbox { helper, pool }
    }

    /// The warm pool of this backend (empty until [`WarmPool::keep`] is called).
    pub fn pool(&self) -> Arc<WarmPool> {
        Arc::clone(&self.pool)
    }
}

/// Tops up a key of the warm pool when dropped ([`WarmPool::refill`]).
struct Refill(Arc<WarmPool>, Option<String>);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.refill(self.1.take());
    }
}

impl Sandbox for LinuxSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Linux
    }
    fn run(&self, mut job: Job) -> RunFuture<'_> {
        let pool = Arc::clone(&self.pool);
        let helper = self.helper.clone();
        Box::pin(async move {
            // Once the run is over, even if its caller went away, its key is topped up
            // (a key woken from rest refills only then, not competing with this run).
            let _refill = Refill(Arc::clone(&pool), pool.key_of(&job));
            let Some(warm) = pool.take_or_wait(&job).await else {
                return run_helper(helper, Mode::Linux, job).await;
            };
            // `_refill` drops after this tail expression: the key refills once the run ends.
            match warm {
                Warm::Helper(warm) => run_warm(warm, job).await.map(|(o, _)| o),
                Warm::Granted(warm, dir) => match dir.adopt(&mut job) {
                    Ok(()) => {
                        let result = run_warm(warm, job).await.map(|(o, _)| o);
                        drop(dir);
                        result
                    }
                    Err(why) => {
                        // Dropping the warm sandbox kills it; the run starts cold instead.
                        tracing::warn!(error = %why, "warm sandbox for a granted run unusable");
                        drop(warm);
                        drop(dir);
                        run_helper(helper, Mode::Linux, job).await
                    }
                },
                Warm::Forked(slot) => slot.run(job).await.map(|(o, _)| o),
            }
        })
    }
    /// A collecting run always starts cold: the warm pool's sandboxes are built without it.
    fn run_collecting(&self, job: Job, limits: CollectLimits) -> CollectFuture<'_> {
        Box::pin(run_collecting(
            self.helper.clone(),
            Mode::Linux,
            job,
            limits,
        ))
    }
    fn probe(&self) -> BackendReport {
        let mut report = crate::probe::probe(&self.helper, Mode::Linux);
        for s in self.pool.stats() {
            report.details.push(format!(
                "warm pool {}{}: {} ready (target {}), {} hits, {} misses, last refill {:.1} ms{}",
                s.language,
                if s.network { " (granted runs)" } else { "" },
                s.ready,
                s.target,
                s.hits,
                s.misses,
                s.last_refill_ms,
                if s.fork_server { ", fork server" } else { "" }
            ));
        }
        report
    }
}

/// No isolation: a child process with rlimits and a process-group kill.
pub struct ProcessSandbox {
    helper: PathBuf,
}

impl ProcessSandbox {
    pub fn new(helper: PathBuf) -> Self {
        ProcessSandbox { helper }
    }
}

impl Sandbox for ProcessSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Process
    }
    fn run(&self, job: Job) -> RunFuture<'_> {
        Box::pin(run_helper(self.helper.clone(), Mode::Process, job))
    }
    fn run_collecting(&self, job: Job, limits: CollectLimits) -> CollectFuture<'_> {
        Box::pin(run_collecting(
            self.helper.clone(),
            Mode::Process,
            job,
            limits,
        ))
    }
    fn probe(&self) -> BackendReport {
        crate::probe::probe(&self.helper, Mode::Process)
    }
}
