//! [`DockerSandbox`]: one run = one fresh container, removed before the run's answer.
//!
//! Per run: create (image, limits, labels, a tmpfs volume at the workdir), attach
//! stdin/stdout/stderr, start, copy the files in as a tar stream, send the go line, then the
//! program's stdin; read the output capped while it streams; wait with a deadline (kill at
//! expiry); inspect for the OOM flag when the exit was not clean; remove the container and its
//! volume.
//!
//! Why start before copying: the workspace is a tmpfs-backed local volume (a size bound, and
//! nothing of the run reaches the engine's disk). The engine mounts such a volume only while
//! something uses it, so files copied into a created-but-not-started container would vanish
//! at the copy's unmount. The container therefore starts with `/bin/sh -c 'read -r _; exec
//! "$@"'` in front of the program: it waits for one line on stdin, which is sent once the
//! files are in place. The program's clock starts there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig, ResourcesUlimits,
};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, InspectContainerOptions, KillContainerOptions,
    RemoveContainerOptions, UploadToContainerOptions,
};
use futures::StreamExt;
use gearbox_core::capture::finish;
use gearbox_core::{
    BackendKind, BackendReport, Job, Outcome, ResourceUsage, RunFuture, Sandbox, SandboxError,
    Status,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::OnceCell;

use crate::client::connect;
use crate::config::{DockerConfig, DockerImage};
use crate::reap::{self, Owner};

/// The Docker-format seccomp profile every container gets (the Linux backend's deny list).
pub const SECCOMP_PROFILE: &str = include_str!("seccomp.json");

/// Shell in front of the program: wait for the go line, then become the program.
const GO_WRAPPER: &str = "read -r _ || exit 125; exec \"$@\"";

/// How long output may keep arriving after the container exited.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How long after the deadline's kill the run gives up waiting for the engine.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// The `docker` backend. Cheap to create: it connects, negotiates the API version and reaps
/// orphaned containers on first use (and again after a failed connection).
pub struct DockerSandbox {
    config: Arc<DockerConfig>,
    /// This process, as its containers' labels name it; read on the first run (a
    /// `gearbox run` of another backend never pays for it).
    owner: std::sync::OnceLock<Owner>,
    client: OnceCell<Docker>,
}

impl DockerSandbox {
    pub fn new(config: DockerConfig) -> DockerSandbox {
        DockerSandbox {
            config: Arc::new(config),
            owner: std::sync::OnceLock::new(),
            client: OnceCell::new(),
        }
    }

    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// The engine client, connected and version-negotiated; orphans are reaped the first
    /// time.
    pub async fn client(&self) -> Result<Docker, SandboxError> {
        self.client
            .get_or_try_init(|| async {
                self.config.validate().map_err(SandboxError::Unavailable)?;
                let docker = connect(&self.config.host)
                    .await
                    .map_err(SandboxError::Unavailable)?;
                match reap::reap_orphans(&docker).await {
                    Ok(ids) if !ids.is_empty() => {
                        tracing::warn!(count = ids.len(), "removed orphaned gearbox containers")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "listing orphaned containers failed"),
                }
                Ok(docker)
            })
            .await
            .cloned()
    }

    async fn run_job(&self, job: Job) -> Result<Outcome, SandboxError> {
        // A container joins no network: a docker network would reach the host's bridge and
        // private ranges, and nothing here confines it to the egress proxy.
        if job.egress.is_some() {
            return Err(SandboxError::Unavailable(
                "the docker backend grants no network; runs with network use the linux backend"
                    .into(),
            ));
        }
        let image = self.config.images.get(&job.language).ok_or_else(|| {
            SandboxError::Unavailable(format!(
                "the docker backend has no image for {lang}: add [docker.images.{lang}] \
                 (image, command, workdir) to the configuration",
                lang = job.language
            ))
        })?;
        let docker = self.client().await?;
        let run_id = uuid::Uuid::new_v4().simple().to_string();
        let body = container_body(
            &self.config,
            image,
            &job,
            self.owner.get_or_init(Owner::current),
            &run_id,
        );
        let t0 = Instant::now();
        let created = docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(format!("gearbox-{run_id}")),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(|e| create_error(e, image))?;
        let mut guard = RemoveOnDrop::new(docker.clone(), created.id.clone());
        let id = created.id.as_str();
        let result = self.drive(&docker, id, image, &job, t0).await;
        // Remove before answering: when `run` returns, nothing of the run is left.
        guard.disarm();
        remove(&docker, id).await;
        result
    }

    /// Everything between create and remove.
    async fn drive(
        &self,
        docker: &Docker,
        id: &str,
        image: &DockerImage,
        job: &Job,
        t0: Instant,
    ) -> Result<Outcome, SandboxError> {
        let setup = |step: &str, e: DockerError| SandboxError::Setup {
            step: step.to_string(),
            message: e.to_string(),
        };
        let mut attach = docker
            .attach_container(
                id,
                Some(AttachContainerOptions {
                    stream: true,
                    stdin: true,
                    stdout: true,
                    stderr: true,
                    logs: false,
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| setup("attach", e))?;
        docker
            .start_container(id, None)
            .await
            .map_err(|e| setup("start", e))?;
        let tar = workspace_tar(job, self.config.uid, self.config.gid)
            .map_err(|e| SandboxError::Protocol(format!("building the files' tar stream: {e}")))?;
        docker
            .upload_to_container(
                id,
                Some(UploadToContainerOptions {
                    path: image.workdir.clone(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| setup("copy files", e))?;

        // The go line, then the program's stdin, then EOF; in a task of its own so a program
        // that never reads its stdin cannot block the run.
        let mut input = attach.input;
        let stdin = job.stdin.clone();
        let writer = tokio::spawn(async move {
            input.write_all(b"\n").await?;
            input.write_all(&stdin).await?;
            input.flush().await?;
            input.shutdown().await
        });
        let _abort_writer = AbortOnDrop(writer);
        let started = Instant::now();
        let setup_us = u64::try_from(started.duration_since(t0).as_micros()).unwrap_or(u64::MAX);

        let cap = usize::try_from(job.limits.output_bytes).unwrap_or(usize::MAX);
        let mut stdout = Capped::new(cap);
        let mut stderr = Capped::new(cap);
        let mut wait = Box::pin(docker.wait_container(id, None));
        let deadline = tokio::time::sleep(Duration::from_millis(job.limits.timeout_ms));
        tokio::pin!(deadline);
        let mut exit: Option<Result<i64, String>> = None;
        let mut timed_out = false;
        let mut duration = None;
        let mut output_open = true;
        let mut drain_until: Option<tokio::time::Instant> = None;
        let mut give_up =
            tokio::time::Instant::now() + Duration::from_millis(job.limits.timeout_ms) + KILL_GRACE;
        loop {
            if exit.is_some() && !output_open {
                break;
            }
            let drain = async {
                match drain_until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                item = attach.output.next(), if output_open => match item {
                    Some(Ok(LogOutput::StdOut { message })) => stdout.push(&message),
                    Some(Ok(LogOutput::StdErr { message })) => stderr.push(&message),
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => output_open = false,
                },
                w = wait.next(), if exit.is_none() => {
                    duration.get_or_insert_with(|| started.elapsed());
                    exit = Some(match w {
                        Some(Ok(r)) => Ok(r.status_code),
                        Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Ok(code),
                        Some(Err(e)) => Err(e.to_string()),
                        None => Err("the engine ended the wait without a status".into()),
                    });
                    drain_until = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                },
                _ = &mut deadline, if !timed_out && exit.is_none() => {
                    timed_out = true;
                    duration = Some(started.elapsed());
                    if let Err(e) = docker
                        .kill_container(id, Some(KillContainerOptions { signal: "KILL".into() }))
                        .await
                    {
                        tracing::debug!(container = %id, error = %e, "kill at the deadline");
                    }
                    give_up = tokio::time::Instant::now() + KILL_GRACE;
                },
                _ = tokio::time::sleep_until(give_up), if exit.is_none() => {
                    exit = Some(Err("the engine did not report the container's exit".into()));
                    break;
                },
                _ = drain => break,
            }
        }
        let duration_ms = u64::try_from(duration.unwrap_or_else(|| started.elapsed()).as_millis())
            .unwrap_or(u64::MAX);

        let code = match exit {
            Some(Ok(code)) => code,
            Some(Err(e)) if !timed_out => {
                return Err(SandboxError::Protocol(format!(
                    "waiting for the container: {e}"
                )));
            }
            _ => -1,
        };
        // The OOM flag is only in the container's state; ask only when the exit was not clean.
        let oom_killed = if code != 0 && !timed_out {
            docker
                .inspect_container(id, None::<InspectContainerOptions>)
                .await
                .ok()
                .and_then(|i| i.state)
                .and_then(|s| s.oom_killed)
                .unwrap_or(false)
        } else {
            false
        };

        let out = stdout.finish();
        let err = stderr.finish();
        let mut outcome = Outcome {
            status: Status::Ok,
            exit_code: None,
            signal: None,
            stdout: out.text,
            stderr: err.text,
            stdout_truncated: out.truncated,
            stderr_truncated: err.truncated,
            duration_ms,
            usage: ResourceUsage {
                setup_us: Some(setup_us),
                memory_limit: Some("cgroup".into()),
                ..Default::default()
            },
            reason: None,
            language: job.language.clone(),
            backend: BackendKind::Docker.as_str().to_string(),
            egress: None,
            result: None,
            pictures: Vec::new(),
            outputs: Vec::new(),
            outputs_skipped: Vec::new(),
        };
        if timed_out {
            outcome.status = Status::Timeout;
            outcome.signal = Some(9);
            outcome.reason = Some(format!(
                "wall-clock limit of {} ms exceeded; the container was killed",
                job.limits.timeout_ms
            ));
        } else if oom_killed {
            outcome.status = Status::Killed;
            outcome.signal = Some(9);
            outcome.reason = Some(format!(
                "memory limit of {} MiB exceeded",
                job.limits.memory_mb
            ));
        } else if code == 0 {
            outcome.exit_code = Some(0);
        } else if let Some(sig) = signal_of(code) {
            // docker-init (and a shell) report a signal death as 128 + the signal.
            outcome.signal = Some(sig);
            if sig == SIGXCPU {
                outcome.status = Status::Killed;
                outcome.reason = Some(format!(
                    "CPU time limit of {} ms exceeded",
                    job.limits.effective_cpu_ms()
                ));
            } else if sig == SIGXFSZ {
                outcome.status = Status::Killed;
                outcome.reason = Some(format!(
                    "file size limit of {} MiB exceeded",
                    job.limits.file_size_mb
                ));
            } else {
                outcome.status = Status::Error;
            }
        } else {
            outcome.status = Status::Error;
            outcome.exit_code = Some(i32::try_from(code).unwrap_or(-1));
        }
        Ok(outcome)
    }
}

const SIGXCPU: i32 = 24;
const SIGXFSZ: i32 = 25;

/// The signal an exit status of 128 + N stands for, N in 1..=64.
fn signal_of(code: i64) -> Option<i32> {
    (129..=192)
        .contains(&code)
        .then(|| i32::try_from(code - 128).ok())
        .flatten()
}

impl Sandbox for DockerSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Docker
    }

    fn run(&self, job: Job) -> RunFuture<'_> {
        Box::pin(self.run_job(job))
    }

    fn probe(&self) -> BackendReport {
        crate::probe::probe(&self.config)
    }
}

/// The container of one run.
fn container_body(
    config: &DockerConfig,
    image: &DockerImage,
    job: &Job,
    owner: &Owner,
    run_id: &str,
) -> ContainerCreateBody {
    let limits = &job.limits;
    let mib = |v: u64| i64::try_from(v.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX);
    let memory = mib(limits.memory_mb);
    let cpu_secs = limits.effective_cpu_ms().div_ceil(1000).max(1);
    let ulimit2 = |name: &str, soft: u64, hard: u64| ResourcesUlimits {
        name: Some(name.to_string()),
        soft: Some(i64::try_from(soft).unwrap_or(i64::MAX)),
        hard: Some(i64::try_from(hard).unwrap_or(i64::MAX)),
    };
    let ulimit = |name: &str, v: u64| ulimit2(name, v, v);
    let labels = reap::labels(owner, run_id);
    let disk = format!("size={}m", limits.disk_mb);
    let volume_opts = HashMap::from([
        ("type".to_string(), "tmpfs".to_string()),
        ("device".to_string(), "tmpfs".to_string()),
        (
            "o".to_string(),
            format!(
                "{disk},uid={},gid={},mode=0755,nosuid,nodev",
                config.uid, config.gid
            ),
        ),
    ]);
    let host_config = HostConfig {
        memory: Some(memory),
        // Swap equal to memory: no swap at all on top of the limit.
        memory_swap: Some(memory),
        cpu_period: Some(100_000),
        cpu_quota: Some(
            i64::try_from(config.cpu_millicores.saturating_mul(100)).unwrap_or(i64::MAX),
        ),
        pids_limit: Some(i64::try_from(limits.pids).unwrap_or(i64::MAX)),
        ulimits: Some(vec![
            ulimit("nofile", limits.open_files),
            ulimit("fsize", limits.file_size_mb.saturating_mul(1024 * 1024)),
            // SIGXCPU at the limit (reported as `killed`), SIGKILL a second later.
            ulimit2("cpu", cpu_secs, cpu_secs + 1),
            ulimit("core", 0),
        ]),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".to_string()]),
        security_opt: Some(vec![
            "no-new-privileges:true".to_string(),
            format!("seccomp={SECCOMP_PROFILE}"),
        ]),
        network_mode: Some("none".to_string()),
        init: Some(config.init),
        ipc_mode: Some("private".to_string()),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            // exec: Docker's tmpfs default is noexec, and `go run` builds and starts its
            // binary under /tmp (as on the Linux backend, whose /tmp allows it too).
            format!("rw,exec,nosuid,nodev,{disk},mode=1777"),
        )])),
        mounts: Some(vec![Mount {
            target: Some(image.workdir.clone()),
            typ: Some(MountType::VOLUME),
            read_only: Some(false),
            volume_options: Some(MountVolumeOptions {
                no_copy: Some(true),
                labels: Some(labels.clone()),
                driver_config: Some(MountVolumeOptionsDriverConfig {
                    name: Some("local".to_string()),
                    options: Some(volume_opts),
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        // Output goes to the attached stream only; nothing is logged to the engine's disk.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_string()),
            config: None,
        }),
        auto_remove: Some(false),
        ..Default::default()
    };
    let mut cmd = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        GO_WRAPPER.to_string(),
        "gearbox".to_string(),
    ];
    cmd.extend(program_command(image, job));
    ContainerCreateBody {
        image: Some(image.image.clone()),
        cmd: Some(cmd),
        entrypoint: Some(Vec::new()),
        env: Some(environment(job, &image.workdir)),
        working_dir: Some(image.workdir.clone()),
        user: Some(format!("{}:{}", config.uid, config.gid)),
        hostname: Some("gearbox".to_string()),
        labels: Some(labels),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        stdin_once: Some(true),
        tty: Some(false),
        network_disabled: Some(true),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// The configured command with `{entrypoint}` replaced, then the call's args.
pub fn program_command(image: &DockerImage, job: &Job) -> Vec<String> {
    let entry = job.program_argv.first().map(String::as_str).unwrap_or("");
    image
        .command
        .iter()
        .map(|a| a.replace("{entrypoint}", entry))
        .chain(job.program_argv.iter().skip(1).cloned())
        .collect()
}

/// The job's environment with `{workspace}` and `{tmp}` substituted, plus PATH, HOME and
/// TMPDIR unless the job sets them.
fn environment(job: &Job, workdir: &str) -> Vec<String> {
    let mut env: std::collections::BTreeMap<String, String> = job
        .env
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.replace("{workspace}", workdir).replace("{tmp}", "/tmp"),
            )
        })
        .collect();
    env.entry("PATH".into())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".into());
    env.entry("HOME".into())
        .or_insert_with(|| workdir.to_string());
    env.entry("TMPDIR".into()).or_insert_with(|| "/tmp".into());
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// The job's files as a tar stream, owned by the container's user, directories first.
pub fn workspace_tar(job: &Job, uid: u32, gid: u32) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut dirs = std::collections::BTreeSet::new();
    for f in &job.files {
        let path = std::path::Path::new(&f.path);
        let parents: Vec<&std::path::Path> = path
            .ancestors()
            .skip(1)
            .filter(|d| !d.as_os_str().is_empty())
            .collect();
        for dir in parents.into_iter().rev() {
            if dirs.insert(dir.to_path_buf()) {
                let mut h = tar::Header::new_gnu();
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_uid(u64::from(uid));
                h.set_gid(u64::from(gid));
                h.set_size(0);
                h.set_mtime(0);
                builder.append_data(&mut h, dir, std::io::empty())?;
            }
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_uid(u64::from(uid));
        h.set_gid(u64::from(gid));
        h.set_size(f.content.len() as u64);
        h.set_mtime(0);
        builder.append_data(&mut h, path, f.content.as_slice())?;
    }
    builder.into_inner()
}

fn create_error(e: DockerError, image: &DockerImage) -> SandboxError {
    match e {
        DockerError::DockerResponseServerError {
            status_code: 404,
            message,
        } => SandboxError::Unavailable(format!(
            "image {img} is not on the Docker engine ({message}); gearbox does not pull: \
             run `docker pull {img}` (or `docker build`/`docker import` it); \
             scripts/setup-docker.sh builds the default gearbox/python:bookworm and \
             gearbox/runtimes:bookworm",
            img = image.image
        )),
        other => SandboxError::Setup {
            step: "create container".into(),
            message: other.to_string(),
        },
    }
}

async fn remove(docker: &Docker, id: &str) {
    if let Err(e) = docker
        .remove_container(
            id,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
    {
        tracing::warn!(container = %id, error = %e, "removing the container failed");
    }
}

/// Removes the container when the run's future is dropped before it finished (a cancelled
/// call); the start-up reaper covers a process that died outright.
struct RemoveOnDrop {
    docker: Docker,
    id: String,
    armed: bool,
}

impl RemoveOnDrop {
    fn new(docker: Docker, id: String) -> Self {
        RemoveOnDrop {
            docker,
            id,
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let docker = self.docker.clone();
            let id = std::mem::take(&mut self.id);
            handle.spawn(async move { remove(&docker, &id).await });
        }
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One output stream: keep up to `cap` bytes, count the rest.
struct Capped {
    cap: usize,
    kept: Vec<u8>,
    total: u64,
}

impl Capped {
    fn new(cap: usize) -> Self {
        Capped {
            cap,
            kept: Vec::new(),
            total: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.total += bytes.len() as u64;
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn finish(self) -> gearbox_core::CappedOutput {
        finish(self.kept, self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearbox_core::{ExecRequest, FileInput, LanguageTable, Limits};

    fn job() -> Job {
        let lang = LanguageTable::builtin().resolve("bash").expect("bash");
        let req = ExecRequest {
            language: "python".into(),
            code: "print(1)".into(),
            entrypoint: Some("main.py".into()),
            files: vec![FileInput {
                filename: "pkg/sub/data.txt".into(),
                content: "x".into(),
                encoding: Default::default(),
            }],
            args: vec!["a b".into()],
            ..Default::default()
        };
        let mut j = Job::build(&req, &lang, &Limits::default()).expect("job");
        j.language = "python".into();
        j
    }

    #[test]
    fn command_substitutes_the_entrypoint_and_appends_args() {
        let image = &DockerConfig::default().images["python"];
        assert_eq!(
            program_command(image, &job()),
            ["python3", "-s", "main.py", "a b"]
        );
    }

    #[test]
    fn tar_has_parent_directories_and_the_users_ownership() {
        let bytes = workspace_tar(&job(), 65534, 65534).expect("tar");
        let mut archive = tar::Archive::new(bytes.as_slice());
        let entries: Vec<(String, u64)> = archive
            .entries()
            .expect("entries")
            .map(|e| {
                let e = e.expect("entry");
                (
                    e.path().expect("path").display().to_string(),
                    e.header().uid().expect("uid"),
                )
            })
            .collect();
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["main.py", "pkg", "pkg/sub", "pkg/sub/data.txt"],
            "{entries:?}"
        );
        assert!(entries.iter().all(|(_, uid)| *uid == 65534));
    }

    #[test]
    fn the_container_is_locked_down() {
        let c = DockerConfig::default();
        let j = job();
        let body = container_body(&c, &c.images["python"], &j, &Owner::current(), "r1");
        let h = body.host_config.expect("host config");
        assert_eq!(h.memory, h.memory_swap);
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        let sec = h.security_opt.expect("security opts");
        assert!(sec.iter().any(|s| s == "no-new-privileges:true"));
        assert!(sec.iter().any(|s| s.starts_with("seccomp={")));
        assert_eq!(body.user.as_deref(), Some("65534:65534"));
        assert!(
            body.env
                .expect("env")
                .iter()
                .any(|e| e == "HOME=/workspace")
        );
        let profile: serde_json::Value =
            serde_json::from_str(SECCOMP_PROFILE).expect("profile is JSON");
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ALLOW");
    }

    #[test]
    fn exit_statuses_above_128_are_signals() {
        assert_eq!(signal_of(137), Some(9));
        assert_eq!(signal_of(1), None);
        assert_eq!(signal_of(128), None);
        assert_eq!(signal_of(255), None);
    }
}
