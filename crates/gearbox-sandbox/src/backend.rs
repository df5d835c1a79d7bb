use std::path::PathBuf;

use gearbox_core::{BackendKind, BackendReport, Job, RunFuture, Sandbox, SandboxError};

pub struct LinuxSandbox {
    helper: PathBuf,
}
impl LinuxSandbox {
    pub fn new(helper: PathBuf) -> Self {
        LinuxSandbox { helper }
    }
}
impl Sandbox for LinuxSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Linux
    }
    fn run(&self, _job: Job) -> RunFuture<'_> {
        let h = self.helper.display().to_string();
        Box::pin(async move { Err(SandboxError::Unavailable(h)) })
    }
    fn probe(&self) -> BackendReport {
        BackendReport {
            backend: BackendKind::Linux,
            available: false,
            details: vec![],
        }
    }
}
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
    fn run(&self, _job: Job) -> RunFuture<'_> {
        let h = self.helper.display().to_string();
        Box::pin(async move { Err(SandboxError::Unavailable(h)) })
    }
    fn probe(&self) -> BackendReport {
        BackendReport {
            backend: BackendKind::Process,
            available: false,
            details: vec![],
        }
    }
}
