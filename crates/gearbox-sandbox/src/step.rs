//! The steps of building and running a sandbox, by name: what a [`StepError`] says failed.
//! Each step displays as the text users see in `sandbox set-up failed at step …`.
//!
//! Errors are typed where they happen (the helper, init, the program before exec, the server's
//! side of a fork server). Between processes they travel as [`SetupFailure`], the step's
//! display text and the message.

use std::fmt;
use std::path::PathBuf;

use gearbox_core::SandboxError;

use crate::wire::SetupFailure;

/// A step that can fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    // The helper.
    MarkReportFdCloseOnExec,
    CheckHelperBuild,
    ReadRequest,
    TieHelperToServer,
    DropSupplementaryGroups,
    LoadSeccompFilters,
    CreateSyncPipe,
    CreateStatusPipe,
    CloneIntoNewNamespaces,
    /// One file of the new user namespace's id map (`setgroups`, `gid_map`, `uid_map`).
    WriteIdMap(&'static str),
    ReleaseInit,
    StartProgram,
    WaitForProgram,
    Watch,
    BuildSandbox,
    // Init.
    BecomeSandboxGroup,
    BecomeSandboxUser,
    TieInitToHelper,
    SetHostname,
    BringUpLoopback,
    NewCgroupNamespace,
    ForkProgram,
    CreateJobPipe,
    CreateStartUpPipe,
    ReadHandOver,
    EncodeJob,
    HandOverToLauncher,
    StartForkServer,
    ForkForkServer,
    // The root (`jail/mount.rs`).
    MakeMountsPrivate,
    MountRootTmpfs,
    CreateLauncherDirectory,
    WriteLauncher,
    WritePythonHelpers,
    EnterNewRoot,
    PivotRoot,
    DetachOldRoot,
    EnterRoot,
    MakeRootReadOnly,
    CreateForkServerMountPoints,
    WriteForkServerLoop,
    WriteSeccompFilters,
    WriteForkServerLimits,
    ReadLink(PathBuf),
    Link(PathBuf),
    Bind(PathBuf),
    MakeReadOnly(PathBuf),
    CreateEtc,
    /// A generated `/etc` file.
    WriteEtc(&'static str),
    /// A host `/etc` file copied in.
    Copy(PathBuf),
    CreateProc,
    MountProc,
    LimitKernelCounters,
    CreateDev,
    MountDev,
    CreateDevice(String),
    BindDevice(String),
    LinkDevice(&'static str),
    CreateDevShm,
    CreateScratch,
    MountScratchTmpfs,
    CreateScratchDir,
    ChmodScratchDir,
    /// The mount point of one scratch area (`work`, `tmp`, `dev/shm`).
    CreateScratchTarget(String),
    BindScratch(String),
    DetachScratchStage,
    RemoveScratchStage,
    WriteFiles,
    CreateDirectoryFor(String),
    /// One of the job's files.
    WriteFile(String),
    // `process` mode.
    CreateWorkspace,
    CreateTmp,
    CollectWorkspace,
    OpenPidfd,
    // The program, before exec (`jail/program.rs`).
    PrepareArgv,
    PrepareEnvironment,
    NewSession,
    /// One rlimit (`core`, `nofile`, …).
    Rlimit(&'static str),
    EnterWorkspace,
    DropCapabilities,
    SetNoNewPrivs,
    Landlock,
    InstallSeccompFilter,
    CompileMemoryFilter,
    InstallMemoryFilter,
    PassJobPipe,
    Execve,
    // The egress relay of a granted run (`jail/relay.rs`).
    BindRelay,
    ForkRelay,
    TieRelayToInit,
    OpenDevNull,
    RelayStdio,
    DropRelayCapabilities,
    MakeRelayUndumpable,
    InstallRelaySeccompFilter,
    // The server's side of a fork server (`fork_server.rs`).
    AskForkServer,
    BuildSlot,
    JoinCgroup,
    HandOver,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Step::*;
        let text = match self {
            MarkReportFdCloseOnExec => "mark report fd close-on-exec",
            CheckHelperBuild => "check the helper's build",
            ReadRequest => "read request",
            TieHelperToServer => "tie helper to server",
            DropSupplementaryGroups => "drop supplementary groups",
            LoadSeccompFilters => "load the seccomp filters",
            CreateSyncPipe => "create sync pipe",
            CreateStatusPipe => "create status pipe",
            CloneIntoNewNamespaces => "clone into new namespaces",
            WriteIdMap(file) => return write!(f, "write {file}"),
            ReleaseInit => "release init",
            StartProgram => "start program",
            WaitForProgram => "wait for program",
            Watch => "watch",
            BuildSandbox => "build sandbox",
            BecomeSandboxGroup => "become sandbox group",
            BecomeSandboxUser => "become sandbox user",
            TieInitToHelper => "tie init to helper",
            SetHostname => "set hostname",
            BringUpLoopback => "bring up loopback",
            NewCgroupNamespace => "new cgroup namespace",
            ForkProgram => "fork program",
            CreateJobPipe => "create job pipe",
            CreateStartUpPipe => "create start-up pipe",
            ReadHandOver => "read hand-over",
            EncodeJob => "encode job",
            HandOverToLauncher => "hand over to launcher",
            StartForkServer => "start fork server",
            ForkForkServer => "fork fork server",
            MakeMountsPrivate => "make mounts private",
            MountRootTmpfs => "mount root tmpfs",
            CreateLauncherDirectory => "create launcher directory",
            WriteLauncher => "write launcher",
            WritePythonHelpers => "write the display helpers",
            EnterNewRoot => "enter new root",
            PivotRoot => "pivot_root",
            DetachOldRoot => "detach old root",
            EnterRoot => "enter /",
            MakeRootReadOnly => "make root read-only",
            CreateForkServerMountPoints => "create fork server mount points",
            WriteForkServerLoop => "write fork server loop",
            WriteSeccompFilters => "write seccomp filters",
            WriteForkServerLimits => "write fork server limits",
            ReadLink(path) => return write!(f, "read link {}", path.display()),
            Link(path) => return write!(f, "link {}", path.display()),
            Bind(path) => return write!(f, "bind {}", path.display()),
            MakeReadOnly(path) => return write!(f, "make {} read-only", path.display()),
            CreateEtc => "create /etc",
            WriteEtc(name) => return write!(f, "write /etc/{name}"),
            Copy(path) => return write!(f, "copy {}", path.display()),
            CreateProc => "create /proc",
            MountProc => "mount /proc",
            LimitKernelCounters => "limit the run's kernel counters",
            CreateDev => "create /dev",
            MountDev => "mount /dev",
            CreateDevice(name) => return write!(f, "create /dev/{name}"),
            BindDevice(name) => return write!(f, "bind /dev/{name}"),
            LinkDevice(name) => return write!(f, "link /dev/{name}"),
            CreateDevShm => "create /dev/shm",
            CreateScratch => "create scratch",
            MountScratchTmpfs => "mount scratch tmpfs",
            CreateScratchDir => "create scratch dir",
            ChmodScratchDir => "chmod scratch dir",
            CreateScratchTarget(sub) => return write!(f, "create /{sub}"),
            BindScratch(sub) => return write!(f, "bind /{sub}"),
            DetachScratchStage => "detach scratch stage",
            RemoveScratchStage => "remove scratch stage",
            WriteFiles => "write files",
            CreateDirectoryFor(name) => return write!(f, "create directory for {name}"),
            WriteFile(name) => return write!(f, "write {name}"),
            CreateWorkspace => "create workspace",
            CreateTmp => "create tmp",
            CollectWorkspace => "collect workspace",
            OpenPidfd => "open pidfd",
            PrepareArgv => "prepare argv",
            PrepareEnvironment => "prepare environment",
            NewSession => "new session",
            Rlimit(name) => return write!(f, "rlimit {name}"),
            EnterWorkspace => "enter workspace",
            DropCapabilities => "drop capabilities",
            SetNoNewPrivs => "set no_new_privs",
            Landlock => "landlock",
            InstallSeccompFilter => "install seccomp filter",
            CompileMemoryFilter => "compile memory filter",
            InstallMemoryFilter => "install memory filter",
            PassJobPipe => "pass job pipe",
            Execve => "execve",
            BindRelay => "bind the egress relay",
            ForkRelay => "fork the egress relay",
            TieRelayToInit => "tie the relay to init",
            OpenDevNull => "open /dev/null",
            RelayStdio => "point the relay's stdio at /dev/null",
            DropRelayCapabilities => "drop the relay's capabilities",
            MakeRelayUndumpable => "make the relay undumpable",
            InstallRelaySeccompFilter => "install the relay's seccomp filter",
            AskForkServer => "ask fork server",
            BuildSlot => "build slot",
            JoinCgroup => "join cgroup",
            HandOver => "hand over",
        };
        f.write_str(text)
    }
}

/// A step that failed, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    pub step: Step,
    pub message: String,
}

impl StepError {
    pub fn new(step: Step, message: impl Into<String>) -> StepError {
        StepError {
            step,
            message: message.into(),
        }
    }
}

impl From<StepError> for SetupFailure {
    fn from(e: StepError) -> SetupFailure {
        SetupFailure {
            step: e.step.to_string(),
            message: e.message,
        }
    }
}

impl From<StepError> for SandboxError {
    fn from(e: StepError) -> SandboxError {
        SandboxError::Setup {
            step: e.step.to_string(),
            message: e.message,
        }
    }
}

/// Attach the step to an error.
pub trait AtStep<T> {
    fn step(self, step: Step) -> Result<T, StepError>;
}

impl<T, E: fmt::Display> AtStep<T> for Result<T, E> {
    fn step(self, step: Step) -> Result<T, StepError> {
        self.map_err(|e| StepError::new(step, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_read_as_before() {
        for (step, text) in [
            (Step::CreateSyncPipe, "create sync pipe"),
            (Step::WriteIdMap("uid_map"), "write uid_map"),
            (Step::Bind("/usr".into()), "bind /usr"),
            (
                Step::MakeReadOnly("/tmp/usr".into()),
                "make /tmp/usr read-only",
            ),
            (Step::WriteEtc("passwd"), "write /etc/passwd"),
            (Step::CreateScratchTarget("work".into()), "create /work"),
            (Step::BindDevice("null".into()), "bind /dev/null"),
            (Step::Rlimit("nofile"), "rlimit nofile"),
            (Step::WriteFile("main.py".into()), "write main.py"),
            (Step::EnterRoot, "enter /"),
            (Step::Execve, "execve"),
        ] {
            assert_eq!(step.to_string(), text);
        }
        let failure = SetupFailure::from(StepError::new(Step::PivotRoot, "EINVAL"));
        assert_eq!(failure.step, "pivot_root");
        assert_eq!(failure.message, "EINVAL");
    }
}
