//! The fork server (known elsewhere as a zygote): warm sandboxes that cost a few forks instead
//! of a helper, namespaces from scratch and an interpreter start.
//!
//! One fork server runs per pool key, inside a sandbox built like any other (the helper's init
//! builds the root and starts `launchers/python_zygote.py` or `launchers/node_zygote.js`, or,
//! for languages that run by `execve`, forks the exec fork server, `jail/exec_zygote.rs`,
//! with the Landlock ruleset on fd 3
//! and a `SOCK_SEQPACKET` control socket on fd 4). For each slot the server sends one packet
//! with four fds: the slot's own control socket and the program's stdin, stdout and stderr
//! pipes. The fork server clones the
//! run's pid 1 straight into fresh mount, network, IPC, UTS and pid namespaces; once in its
//! own cgroup it takes a cgroup namespace, scratch tmpfs and /proc, and forks the program,
//! which restricts itself exactly as the cold path's program does (setsid, rlimits, every
//! capability dropped, no_new_privs, Landlock, the cold path's seccomp allow list: part
//! inherited from the fork server, the rest its own, see `jail/seccomp.rs`), starts its keeper
//! (Python and Node: a process sharing its memory, so that its exit does not wait for the
//! address space's teardown; `launchers/fork/serve.rs`) and then blocks reading its program
//! from stdin. The loop, init and the restriction are native
//! (`launchers/fork/`); only the program runs Python or JavaScript. Nothing is shared
//! between runs but the read-only root and the fork server's pristine memory (copy-on-write).
//!
//! The slot speaks one JSON message per packet; the kernel attaches each sender's pid
//! (`SO_PASSCRED`), translated into the server's pid namespace. The server puts the slot in
//! a cgroup of its own before it builds anything (`hello` → `go`), keeps a pidfd to the
//! run's pid 1 (killing it kills every process of the run), and counts the run's time from
//! `started` (sent before any of the run's code runs: by the program, or by init for a bash
//! started before its run, `jail/prestart.rs`) to init's `exited`.
//! How the run ended comes from its supervisors only: the exit status from init's wait
//! status, CPU time and peak memory from the run's cgroup (init's rusage of its children
//! where the cgroup has no CPU figure), the duration from the server's clock. The program
//! holds no descriptor through which it could say otherwise: it closes its end of the
//! control socket before its code runs.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gearbox_core::{Job, Limits, Outcome, SandboxError, read_capped_until};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixCredentials, recvmsg, sendmsg, setsockopt, socketpair, sockopt,
};
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;

use crate::cgroup::{Cgroup, CgroupSupport};
use crate::helper::{Spawned, build_outcome, pidfd_open, spawn_with, spec_for, take_payload};
use crate::step::{Step, StepError};
use crate::wire::{HandOver, JailReport, Mode, Pooled, SetupFailure, encode_handover};

/// How long a slot may take from request to ready (the first slot waits for the fork server).
const BUILD_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a program may take from hand-over to `started` (reading its files).
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a run's init may take, after its program exited, to stop what is left of the run
/// before its outputs are read.
const OUTPUTS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a finished run's pid 1 and the program's keeper are kept after its outcome, so
/// that their teardown (address spaces, mount namespace: both cores for ~0.5 ms) comes after
/// the answer instead of beside it. Not on the path of anything else: a timeout, a failure
/// or a cancelled call kills at once.
const ANSWER_FIRST: Duration = Duration::from_millis(1);

/// The fork server of languages without a launcher: the native loop run by the helper's own
/// code (`jail/exec_zygote.rs`), each program an `execve` of the run's command.
pub(crate) const EXEC_FORK_SERVER: &str = "exec-zygote";

/// Node's fork server (`launchers/node_zygote.js`).
pub(crate) const NODE_FORK_SERVER: &str = "node-zygote";

/// The built-in launchers that have a fork server, by launcher name.
pub(crate) fn launcher_of(launcher: &str) -> Option<&'static str> {
    match launcher {
        "python" => Some("python-zygote"),
        "node" => Some(NODE_FORK_SERVER),
        _ => None,
    }
}

/// Interpreter options a fork server starts with, after the interpreter's path. Node's V8
/// must post no work to its platform's worker threads: they do not exist in a fork. It also
/// compiles every function of what it loads at once (`--no-lazy`): the launcher's code and
/// Node's modules are loaded before the fork server serves, so what a run calls there is
/// compiled once, not again in each run's copy (warm `console.log(1)` 7.6 → 6.2 ms,
/// docs/PERFORMANCE.md).
fn interpreter_options(launcher: &str) -> &'static [&'static str] {
    match launcher {
        NODE_FORK_SERVER => &["--single-threaded", "--no-lazy"],
        _ => &[],
    }
}

/// Whether this server can run fork servers: they need per-run cgroups (the pids and
/// memory limits of each run; see docs/PERFORMANCE.md), so root and a cgroup mount.
pub(crate) fn supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        nix::unistd::Uid::current().is_root()
            && !matches!(CgroupSupport::cached(), CgroupSupport::None { .. })
    })
}

/// The fork server that serves jobs like `job` on this host, if one does: the launcher's
/// (Python, Node), or, for a language that runs by `execve` (no launcher: Bash, Go, ...), the
/// exec fork server ([`EXEC_FORK_SERVER`]).
pub(crate) fn serves(job: &Job) -> Option<&'static str> {
    match &job.launcher {
        Some((name, _)) => launcher_of(name),
        None => Some(EXEC_FORK_SERVER),
    }
    .filter(|_| std::env::var("GEARBOX_FORK_SERVER").as_deref() != Ok("0"))
    .filter(|_| supported())
}

/// The limits a fork server's slot is built with: what a run cannot change after the slot
/// exists (its cgroup, its scratch tmpfs). A run lowers the others at hand-over.
pub(crate) fn built_limits(l: &Limits) -> (u64, u64, u64) {
    (l.memory_mb, l.pids, l.disk_mb)
}

/// How long one fork server serves before a fresh one replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkServerLife {
    /// Slots it builds.
    pub max_runs: u64,
    /// Time since it started.
    pub max_age: std::time::Duration,
}

impl Default for ForkServerLife {
    fn default() -> Self {
        ForkServerLife {
            max_runs: 1000,
            max_age: std::time::Duration::from_secs(600),
        }
    }
}

/// One message of a slot.
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum SlotMsg {
    Hello,
    Ready,
    Applied {
        mechanisms: Vec<String>,
    },
    Failed {
        step: String,
        message: String,
    },
    Started,
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        cpu_time_ms: u64,
        max_rss_kb: u64,
        /// `/work/outputs` holds something: init stops the rest of the run, says
        /// [`SlotMsg::Outputs`] and waits while the server reads them.
        #[serde(default)]
        outputs: bool,
    },
    /// Every other process of the run is gone: its outputs can be read.
    Outputs,
}

/// A running fork server.
pub(crate) struct ForkServer {
    control: Mutex<OwnedFd>,
    helper: Mutex<crate::helper::HelperProcess>,
    limits: Limits,
    /// Set by [`ForkServer::stop`]: its end is expected, not a failure.
    stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Slots asked for so far, and when it started (see [`ForkServerLife`]).
    served: std::sync::atomic::AtomicU64,
    born: Instant,
    /// Whether a slot of it was ever ready: its interpreter has started.
    built: std::sync::atomic::AtomicBool,
}

impl ForkServer {
    /// Start a fork server for jobs like `template` (whose launcher is `launcher`).
    pub async fn start(
        helper: &Path,
        template: &Job,
        launcher: &str,
    ) -> Result<Arc<ForkServer>, SandboxError> {
        let mut argv = match &template.launcher {
            Some((_, argv)) => argv.clone(),
            None if launcher == EXEC_FORK_SERVER => Vec::new(),
            None => return Err(SandboxError::Protocol("no launcher".into())),
        };
        let at = 1.min(argv.len());
        argv.splice(
            at..at,
            interpreter_options(launcher).iter().map(|o| o.to_string()),
        );
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| SandboxError::Spawn(e.into()))?;
        let pooled = Pooled {
            launcher: Some((launcher.to_string(), argv)),
            fork_server: true,
        };
        let spec = spec_for(Mode::Linux, template, Some(pooled));
        let Spawned {
            child,
            mut stdin,
            stdout,
            stderr,
            report,
        } = spawn_with(helper, &spec, Some(theirs.as_raw_fd())).await?;
        drop(theirs);
        let _ = stdin.shutdown().await;
        // The fork server's own output and the helper's report arrive only if it fails: log them.
        let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = Arc::clone(&stopping);
        tokio::spawn(async move {
            let never = std::future::pending::<()>();
            let (out, err) = tokio::join!(
                read_capped_until(stdout, 64 * 1024, std::future::pending::<()>()),
                read_capped_until(stderr, 64 * 1024, never)
            );
            let mut report = report;
            let mut buf = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut report, &mut buf).await;
            if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                tracing::debug!(report = %String::from_utf8_lossy(&buf), "fork server stopped");
                return;
            }
            tracing::warn!(
                stdout = %out.text.trim(),
                stderr = %err.text.trim(),
                report = %String::from_utf8_lossy(&buf),
                "fork server ended"
            );
        });
        Ok(Arc::new(ForkServer {
            control: Mutex::new(ours),
            helper: Mutex::new(child),
            limits: template.limits,
            stopping,
            served: std::sync::atomic::AtomicU64::new(0),
            born: Instant::now(),
            built: std::sync::atomic::AtomicBool::new(false),
        }))
    }

    /// Whether a slot of it was ever ready (it serves in milliseconds from then on).
    pub fn has_built(&self) -> bool {
        self.built.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether it has served its [`ForkServerLife`]: a fresh one takes its place.
    pub fn exhausted(&self, life: ForkServerLife) -> bool {
        self.served.load(std::sync::atomic::Ordering::Relaxed) >= life.max_runs
            || self.born.elapsed() >= life.max_age
    }

    /// Stop a fork server taken out of service once nothing of it is left: no slot waiting
    /// in the pool and no run (a run's sandbox lives inside its fork server's).
    pub async fn retire(server: Arc<ForkServer>) {
        while Arc::strong_count(&server) > 1 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server.stop();
        server
            .wait_until(Instant::now() + Duration::from_secs(2))
            .await;
    }

    pub fn alive(&self) -> bool {
        let mut child = self.helper.lock().unwrap_or_else(|p| p.into_inner());
        matches!(child.try_wait(), Ok(None))
    }

    /// Ask the fork server to end: it reads end-of-file on its control socket and exits,
    /// and its helper then removes its cgroup. Slots already built are not affected.
    pub fn stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        let _ = nix::sys::socket::shutdown(control.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }

    /// Wait for the helper to end until `deadline`, then kill it.
    pub async fn wait_until(&self, deadline: Instant) {
        while self.alive() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if self.alive() {
            tracing::warn!("a fork server did not stop in time; killing it");
            let mut child = self.helper.lock().unwrap_or_else(|p| p.into_inner());
            let _ = child.start_kill();
        }
    }

    /// Ask for one single-use sandbox and wait until its program is restricted and waits.
    pub async fn slot(self: &Arc<Self>) -> Result<Slot, SandboxError> {
        self.served
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let setup = |step: Step, e: String| SandboxError::from(StepError::new(step, e));
        let (chan, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| SandboxError::Spawn(e.into()))?;
        setsockopt(&chan, sockopt::PassCred, &true).map_err(|e| SandboxError::Spawn(e.into()))?;
        // Non-blocking on our side only: the slot's end stays blocking.
        nix::fcntl::fcntl(
            &chan,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(|e| SandboxError::Spawn(e.into()))?;
        let (stdin_r, stdin_w) = pipe()?;
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        {
            let control = self.control.lock().unwrap_or_else(|p| p.into_inner());
            let fds = [
                theirs.as_raw_fd(),
                stdin_r.as_raw_fd(),
                stdout_w.as_raw_fd(),
                stderr_w.as_raw_fd(),
            ];
            sendmsg::<()>(
                control.as_raw_fd(),
                &[IoSlice::new(b"slot")],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(|e| setup(Step::AskForkServer, e.to_string()))?;
        }
        drop((theirs, stdin_r, stdout_w, stderr_w));
        // SAFETY: `chan` is an open socket owned by the AsyncFd for its whole life.
        let chan = unsafe { AsyncFd::register(chan) }.map_err(|e| SandboxError::Spawn(e.into()))?;
        let deadline = tokio::time::Instant::now() + BUILD_TIMEOUT;
        let (msg, pid) = next_built(&chan, deadline).await?;
        let Ok(SlotMsg::Hello) = serde_json::from_slice(&msg) else {
            return Err(setup(
                Step::BuildSlot,
                format!(
                    "unexpected first message: {}",
                    String::from_utf8_lossy(&msg)
                ),
            ));
        };
        let pid = pid.ok_or_else(|| setup(Step::BuildSlot, "no sender credentials".into()))?;
        let limits = self.limits;
        // On v1 the slot's init moves itself in through the `tasks` files sent with `go`
        // (`Cgroup::open_tasks`: no RCU wait, no host-wide stall of forks); elsewhere the
        // server moves it.
        let (cgroup, tasks) = tokio::task::spawn_blocking(move || {
            let cg = Cgroup::create(&limits)?;
            match cg.open_tasks() {
                Some(Ok(tasks)) => Ok((cg, tasks)),
                _ => cg.attach(pid).map(|()| (cg, Vec::new())),
            }
        })
        .await
        .map_err(|e| setup(Step::JoinCgroup, e.to_string()))?
        .map_err(|e| setup(Step::JoinCgroup, e))?;
        let mut enforced = cgroup.describe();
        // From here on, a slot that fails to build is killed and its cgroup removed.
        let mut guard = RunGuard {
            init: None,
            init_pid: 0,
            cgroup: Some(cgroup),
        };
        let fds: Vec<RawFd> = tasks.iter().map(AsRawFd::as_raw_fd).collect();
        let rights = [ControlMessage::ScmRights(&fds)];
        let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
        sendmsg::<()>(
            chan.get_ref().as_raw_fd(),
            &[IoSlice::new(b"{\"t\":\"go\"}")],
            cmsgs,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| setup(Step::BuildSlot, e.to_string()))?;
        drop(tasks);
        let mut applied = false;
        let mut program = None;
        while guard.init.is_none() || !applied {
            let (msg, pid) = next_built(&chan, deadline).await?;
            match serde_json::from_slice::<SlotMsg>(&msg) {
                Ok(SlotMsg::Ready) => {
                    let pid = pid.ok_or_else(|| setup(Step::BuildSlot, "no sender pid".into()))?;
                    guard.init = Some(pidfd_open(pid).map_err(SandboxError::Spawn)?);
                    guard.init_pid = pid;
                }
                Ok(SlotMsg::Applied { mechanisms }) => {
                    enforced.extend(mechanisms);
                    applied = true;
                    if let Some(pid) = pid {
                        program = Some((pid, pidfd_open(pid).map_err(SandboxError::Spawn)?));
                    }
                }
                // A step of the native loop (`launchers/fork/`), named by it.
                Ok(SlotMsg::Failed { step, message }) => {
                    return Err(SandboxError::Setup { step, message });
                }
                _ => return Err(setup(Step::BuildSlot, "unexpected message".into())),
            }
        }
        enforced.push(
            "namespaces: user, mount, pid, net (loopback only), ipc, uts, cgroup: fresh per \
             run"
            .into(),
        );
        self.built.store(true, std::sync::atomic::Ordering::Relaxed);
        // Registered with the runtime now, so that a run's first write and reads do not wait
        // for the reactor to learn the pipes' readiness.
        let spawn = SandboxError::Spawn;
        Ok(Slot {
            server: Arc::clone(self),
            chan,
            guard,
            stdin: tokio::net::unix::pipe::Sender::from_owned_fd(stdin_w).map_err(spawn)?,
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(stdout_r).map_err(spawn)?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(stderr_r).map_err(spawn)?,
            program,
            enforced,
        })
    }
}

/// One built, waiting, single-use sandbox of a fork server.
pub(crate) struct Slot {
    /// The fork server it came from, which must outlive it (see [`ForkServer::retire`]).
    server: Arc<ForkServer>,
    chan: AsyncFd<OwnedFd>,
    guard: RunGuard,
    stdin: tokio::net::unix::pipe::Sender,
    stdout: tokio::net::unix::pipe::Receiver,
    stderr: tokio::net::unix::pipe::Receiver,
    /// The program's pid (in the server's pid namespace) and a pidfd that tells whether that
    /// pid is still the program.
    program: Option<(i32, OwnedFd)>,
    enforced: Vec<String>,
}

/// Record how the program ended, as init's `exited` says.
fn ended(
    report: &mut JailReport,
    started: Option<Instant>,
    code: Option<i32>,
    signal: Option<i32>,
    cpu_time_ms: u64,
    max_rss_kb: u64,
) {
    report.duration_us = started.map_or(0, |s| s.elapsed().as_micros() as u64);
    report.exit_code = code;
    report.signal = signal;
    report.cpu_time_ms = Some(cpu_time_ms);
    report.peak_memory_kb = Some(max_rss_kb);
}

/// A slot's pid 1 and cgroup. Dropped — the run ended, failed, or its caller went away (a
/// cancelled call) — it kills every process of the run and removes the cgroup.
struct RunGuard {
    /// pidfd of the run's pid 1: killing it makes the kernel kill its whole pid namespace.
    init: Option<OwnedFd>,
    /// Its pid, in the server's pid namespace (valid while `init` has not exited).
    init_pid: i32,
    cgroup: Option<Cgroup>,
}

impl RunGuard {
    fn kill(&self) {
        if let Some(fd) = &self.init {
            // SAFETY: pidfd_send_signal on a pidfd we own; no memory is passed.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
        }
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        self.kill();
        if let Some(cgroup) = self.cgroup.take() {
            // Emptying, resetting or removing a cgroup can take milliseconds: never on the
            // answer's path.
            let cleanup = move || cgroup.release();
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(cleanup)),
                Err(_) => drop(std::thread::spawn(cleanup)),
            }
        }
    }
}

impl Slot {
    /// Still waiting for its program: nothing was said and nothing closed since it was built.
    pub fn waiting(&self) -> bool {
        let mut buf = [0u8; 1];
        matches!(
            nix::sys::socket::recv(
                self.chan.get_ref().as_raw_fd(),
                &mut buf,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT
            ),
            Err(nix::errno::Errno::EAGAIN)
        )
    }

    /// Hand `job` over and wait for it.
    pub async fn run(self, job: Job) -> Result<(Outcome, Vec<String>), SandboxError> {
        let env =
            crate::wire::with_display_env(crate::wire::program_env(&job.env, "/work", "/tmp"));
        let handover = HandOver {
            argv: job.argv.clone(),
            program_argv: job.program_argv.clone(),
            env: env.into_iter().collect(),
            files: job
                .files
                .iter()
                .map(|f| (f.path.clone(), f.content.len() as u64))
                .collect(),
            limits: Some(job.limits),
            cpu_s: Some(job.limits.cpu_rlimit_secs()),
        };
        let header =
            encode_handover(&handover).map_err(|e| SandboxError::Protocol(e.to_string()))?;
        let mut job = job;
        let payload = take_payload(vec![header], &mut job);
        let Slot {
            server,
            chan,
            guard,
            mut stdin,
            stdout,
            stderr,
            program,
            enforced,
        } = self;
        // Built at a lower priority (`jail/init.rs`); the run itself gets the normal priority a cold run has.
        if let Some((pid, pidfd)) = &program
            && !pidfd_exited(pidfd)
        {
            // SAFETY: setpriority takes integers; the pidfd says the pid is still ours.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, *pid as libc::id_t, 0) };
        }
        let slot_kill = || guard.kill();
        let handed = Instant::now();
        let writer = async move {
            // A program that exits without reading its stdin closes the pipe: expected.
            for chunk in &payload {
                // What fits in the pipe goes at once; the rest as the program reads.
                let mut sent = 0;
                while sent < chunk.len() {
                    match stdin.try_write(&chunk[sent..]) {
                        Ok(n) => sent += n,
                        Err(_) => break,
                    }
                }
                if stdin.write_all(&chunk[sent..]).await.is_err() {
                    break;
                }
            }
            drop(stdin);
        };
        let (exited_tx, out_reader, err_reader) =
            crate::helper::output_readers(stdout, stderr, job.limits.output_bytes);
        let timeout = Duration::from_millis(job.limits.timeout_ms);
        let watcher = async {
            let mut report = JailReport {
                enforced,
                ..JailReport::default()
            };
            let mut started: Option<Instant> = None;
            // Set when the program exited leaving outputs: until init says they can be read.
            let mut outputs_by: Option<Instant> = None;
            // Whether to read them: `Ok(false)` when there are none.
            let mut outputs_ready: Result<bool, String> = Ok(false);
            loop {
                let deadline = match (outputs_by, started) {
                    (Some(by), _) => by,
                    (None, Some(s)) => s + timeout,
                    (None, None) => handed + HANDOVER_TIMEOUT,
                };
                let said = tokio::time::timeout_at(deadline.into(), recv(&chan)).await;
                if outputs_by.is_some() {
                    // The run is over: anything but init's word leaves the outputs unread.
                    let stopped = matches!(
                        &said,
                        Ok(Ok(Some((msg, _))))
                            if matches!(serde_json::from_slice(msg), Ok(SlotMsg::Outputs))
                    );
                    outputs_ready = if stopped {
                        Ok(true)
                    } else {
                        Err(format!(
                            "the sandbox did not stop the rest of the run within \
                             {OUTPUTS_TIMEOUT:?} after its program"
                        ))
                    };
                    break;
                }
                match said {
                    Err(_) => {
                        slot_kill();
                        match started {
                            Some(s) => {
                                report.timed_out = true;
                                report.duration_us = s.elapsed().as_micros() as u64;
                            }
                            None => {
                                report.error = Some(
                                    StepError::new(
                                        Step::HandOver,
                                        format!(
                                            "the program did not start within \
                                             {HANDOVER_TIMEOUT:?}"
                                        ),
                                    )
                                    .into(),
                                );
                            }
                        }
                        break;
                    }
                    Ok(Ok(Some((msg, _)))) => match serde_json::from_slice::<SlotMsg>(&msg) {
                        Ok(SlotMsg::Started) => {
                            let now = Instant::now();
                            report.setup_us = now.duration_since(handed).as_micros() as u64;
                            started = Some(now);
                        }
                        Ok(SlotMsg::Failed { step, message }) => {
                            slot_kill();
                            report.error = Some(SetupFailure { step, message });
                            break;
                        }
                        Ok(SlotMsg::Exited {
                            code,
                            signal,
                            cpu_time_ms,
                            max_rss_kb,
                            outputs,
                        }) => {
                            ended(&mut report, started, code, signal, cpu_time_ms, max_rss_kb);
                            if !outputs {
                                break;
                            }
                            outputs_by = Some(Instant::now() + OUTPUTS_TIMEOUT);
                        }
                        _ => {}
                    },
                    Ok(Ok(None)) | Ok(Err(_)) => {
                        slot_kill();
                        report.error = Some(
                            StepError::new(
                                Step::WaitForProgram,
                                "the sandbox ended without a report",
                            )
                            .into(),
                        );
                        break;
                    }
                }
            }
            let _ = exited_tx.send(true);
            (report, outputs_ready)
        };
        let ((), out, err, (mut report, outputs_ready)) =
            tokio::join!(writer, out_reader, err_reader, watcher);
        let outputs = match outputs_ready {
            Ok(false) => None,
            Err(e) => Some(Err(e)),
            Ok(true) => {
                let init = guard.init.as_ref().and_then(|fd| fd.try_clone().ok());
                let pid = guard.init_pid;
                let read = tokio::task::spawn_blocking(move || match init {
                    Some(fd) => read_outputs(pid, &fd),
                    None => Err("the run's pid 1 is unknown".into()),
                })
                .await;
                Some(read.unwrap_or_else(|e| Err(e.to_string())))
            }
        };
        if let Some(cgroup) = &guard.cgroup {
            report.oom_killed = cgroup.oom_killed();
            if let Some(kb) = cgroup.peak_memory_kb() {
                report.peak_memory_kb = Some(kb);
            }
            if let Some(ms) = cgroup.cpu_time_ms() {
                report.cpu_time_ms = Some(ms);
            }
        }
        // The answer first: init waits (the program's keeper alive, everything holding a
        // descriptor already dead) until its channel closes and it is killed, ANSWER_FIRST
        // from now; the answer, built below, has normally left by then. The run's pid
        // namespace dies with init.
        let chan = chan.into_inner();
        tokio::spawn(async move {
            tokio::time::sleep(ANSWER_FIRST).await;
            drop(guard);
            drop(chan);
            drop(server);
        });
        let enforced = report.enforced.clone();
        let mut outcome = build_outcome(report, out, err, &job, Mode::Linux)?;
        match outputs {
            Some(Err(e)) => outcome
                .outputs_skipped
                .push(format!("outputs not brought back: {e}")),
            Some(Ok(c)) => crate::helper::outputs_from(&mut outcome, c),
            None => {}
        }
        Ok((outcome, enforced))
    }
}

/// Read a finished run's `/work/outputs` from outside its sandbox, while its pid 1 (`pid`,
/// `pidfd`) waits and nothing else of the run is left: beneath `/proc/<pid>/root/work`,
/// `outputs` resolved with `openat2` (no symlink, no magic link, no other mount), then walked
/// one name at a time without following a symlink, regular files only, opened non-blocking,
/// within `OUTPUT_LIMITS` (a file past them is skipped with a note). Nothing the program
/// planted reaches past its own outputs or holds the server.
fn read_outputs(pid: i32, pidfd: &OwnedFd) -> Result<gearbox_core::Collected, String> {
    use std::io::Read;
    use std::os::fd::AsFd;
    let work = gearbox_core::tree::open_dir(Path::new(&format!("/proc/{pid}/root/work")))
        .map_err(|e| format!("the run's /work cannot be read: {e}"))?;
    // Opened while the pidfd's process lives: the pid was not reused.
    if pidfd_exited(pidfd) {
        return Err("the run's sandbox ended before its outputs were read".into());
    }
    let dir = gearbox_core::tree::open_beneath(
        work.as_fd(),
        gearbox_core::tree::OUTPUTS_DIR,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
    .map_err(|e| format!("/work/outputs cannot be opened: {e}"))?;
    let mut files = Vec::new();
    let summary = gearbox_core::tree::walk_with(
        dir.as_fd(),
        &gearbox_core::OUTPUT_LIMITS,
        true,
        &mut |path, file, size| {
            let mut content = Vec::with_capacity(size as usize);
            file.take(size).read_to_end(&mut content)?;
            files.push(gearbox_core::JobFile {
                path: path.to_string(),
                content,
            });
            Ok(())
        },
    )
    .map_err(|e| format!("reading /work/outputs: {e}"))?;
    Ok(gearbox_core::Collected { files, summary })
}

/// The next packet of a slot being built, or why there is none.
async fn next_built(
    chan: &AsyncFd<OwnedFd>,
    deadline: tokio::time::Instant,
) -> Result<(Vec<u8>, Option<i32>), SandboxError> {
    let setup = |message: String| SandboxError::from(StepError::new(Step::BuildSlot, message));
    match tokio::time::timeout_at(deadline, recv(chan)).await {
        Err(_) => Err(setup(format!("took longer than {BUILD_TIMEOUT:?}"))),
        Ok(Err(e)) => Err(setup(e.to_string())),
        Ok(Ok(None)) => Err(setup("the fork server closed the slot".into())),
        Ok(Ok(Some(m))) => Ok(m),
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SandboxError::Spawn(e.into()))
}

/// Whether the process behind `pidfd` has exited (its pid may be someone else's by now).
fn pidfd_exited(pidfd: &OwnedFd) -> bool {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd on this stack frame, no timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n != 0
}

/// The next packet and its sender's pid (in this process's pid namespace); `None` at EOF.
async fn recv(chan: &AsyncFd<OwnedFd>) -> std::io::Result<Option<(Vec<u8>, Option<i32>)>> {
    loop {
        let mut guard = chan.readable().await?;
        let got = guard.try_io(|fd| {
            let mut buf = [0u8; 4096];
            let mut space = nix::cmsg_space!(UnixCredentials);
            let (n, pid) = {
                let mut iov = [IoSliceMut::new(&mut buf)];
                let msg = recvmsg::<()>(
                    fd.get_ref().as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
                )
                .map_err(std::io::Error::from)?;
                let pid = msg.cmsgs().ok().and_then(|mut c| {
                    c.find_map(|c| match c {
                        ControlMessageOwned::ScmCredentials(cr) => Some(cr.pid()),
                        _ => None,
                    })
                });
                (msg.bytes, pid)
            };
            Ok((n, pid, buf))
        });
        match got {
            Ok(Ok((0, _, _))) => return Ok(None),
            Ok(Ok((n, pid, buf))) => return Ok(Some((buf[..n].to_vec(), pid))),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}
