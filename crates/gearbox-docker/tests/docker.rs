//! The docker backend against a real engine: behaviour (exit codes, stdin, files, output cap,
//! timeout, limits) and hostile programs (escape attempts), each run in a fresh container of
//! `gearbox/python:bookworm`, and every built-in language in its default image
//! (`gearbox/runtimes:bookworm` for Node and Go; both built by `scripts/setup-docker.sh`).
//!
//! Without an engine every test prints `DOCKER TESTS SKIPPED` and returns; with
//! `GEARBOX_DOCKER_REQUIRED=1` (set by scripts/test.sh once the engine started) a missing
//! engine or image fails instead.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::query_parameters::{
    InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use gearbox_core::{
    ExecRequest, FileInput, Job, LanguageTable, LimitOverrides, Limits, Outcome, ResolvedLanguage,
    Sandbox, SandboxError, Status,
};
use gearbox_docker::reap::{LABEL_BACKEND, LABEL_OWNER, Owner};
use gearbox_docker::{DockerConfig, DockerImage, DockerSandbox};

/// The backend, or `None` (after a loud message) when no engine or image is available here.
async fn backend() -> Option<DockerSandbox> {
    let sb = DockerSandbox::new(DockerConfig::default());
    let problem = match sb.client().await {
        Ok(docker) => {
            let mut missing = Vec::new();
            for img in sb.config().images.values() {
                if let Err(e) = docker.inspect_image(&img.image).await {
                    missing.push(format!("image {} is missing ({e})", img.image));
                }
            }
            if missing.is_empty() {
                return Some(sb);
            }
            missing.join("; ")
        }
        Err(e) => e.to_string(),
    };
    if std::env::var_os("GEARBOX_DOCKER_REQUIRED").is_some() {
        panic!("GEARBOX_DOCKER_REQUIRED is set but the docker backend cannot run: {problem}");
    }
    eprintln!(
        "DOCKER TESTS SKIPPED: {problem}. Run scripts/setup-docker.sh (as root) to start an \
         engine and build the image."
    );
    None
}

/// Python as the language table has it; the interpreter path is the image's concern.
fn python() -> ResolvedLanguage {
    let table = LanguageTable::builtin();
    let spec = table.get("python").expect("python").clone();
    ResolvedLanguage {
        name: "python".into(),
        spec,
        interpreter: PathBuf::from("/usr/bin/python3"),
        mounts: Vec::new(),
    }
}

fn job_with(code: &str, f: impl FnOnce(&mut ExecRequest)) -> Job {
    let mut req = ExecRequest {
        language: "python".into(),
        code: code.into(),
        ..Default::default()
    };
    f(&mut req);
    Job::build(&req, &python(), &Limits::default()).expect("valid job")
}

fn job(code: &str) -> Job {
    job_with(code, |_| {})
}

async fn run(sb: &DockerSandbox, job: Job) -> Outcome {
    sb.run(job).await.expect("the backend runs the job")
}

/// Ids of labelled containers whose environment holds `GEARBOX_TEST_MARK=mark`.
async fn containers_marked(sb: &DockerSandbox, mark: &str) -> Vec<String> {
    let docker = sb.client().await.expect("client");
    let list = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("{LABEL_BACKEND}=docker")],
            )])),
            ..Default::default()
        }))
        .await
        .expect("list");
    let mut found = Vec::new();
    for c in list {
        let Some(id) = c.id else { continue };
        if let Ok(i) = docker
            .inspect_container(&id, None::<InspectContainerOptions>)
            .await
        {
            let env = i.config.and_then(|c| c.env).unwrap_or_default();
            if env
                .iter()
                .any(|e| e == &format!("GEARBOX_TEST_MARK={mark}"))
            {
                found.push(id);
            }
        }
    }
    found
}

fn mark() -> String {
    format!("m{}", std::process::id()) + &format!("{:?}", Instant::now()).replace(['.', ' '], "")
}

fn marked(code: &str, mark: &str) -> Job {
    job_with(code, |r| {
        r.env.insert("GEARBOX_TEST_MARK".into(), mark.into());
    })
}

// ---------------------------------------------------------------------------------------------
// Behaviour

/// Every built-in language runs in its default image (the drop-in promise of the seed that
/// ran Python, JavaScript and Go in containers): each prints what it computed, as `nobody`.
#[tokio::test]
async fn every_builtin_language_runs_in_its_default_image() {
    let Some(sb) = backend().await else { return };
    let table = LanguageTable::builtin();
    for (lang, code) in [
        ("python", "import os\nprint(6*7, os.getuid())\n"),
        ("bash", "echo $((6*7)) $(id -u)\n"),
        ("javascript", "console.log(6*7, process.getuid())\n"),
        (
            "go",
            "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() { fmt.Println(6*7, os.Getuid()) }\n",
        ),
    ] {
        let spec = table.get(lang).expect(lang).clone();
        let resolved = ResolvedLanguage {
            name: lang.into(),
            spec,
            interpreter: PathBuf::from(lang),
            mounts: Vec::new(),
        };
        let req = ExecRequest {
            language: lang.into(),
            code: code.into(),
            ..Default::default()
        };
        let job = Job::build(&req, &resolved, &Limits::default()).expect("valid job");
        let o = run(&sb, job).await;
        assert_eq!(o.status, Status::Ok, "{lang}: {o:?}");
        assert_eq!(o.stdout, "42 65534\n", "{lang}: {o:?}");
        assert_eq!(o.backend, "docker");
    }
}

#[tokio::test]
async fn exit_codes_and_output() {
    let Some(sb) = backend().await else { return };
    let o = run(&sb, job("print('hello')")).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(o.stdout, "hello\n");
    assert_eq!(o.backend, "docker");
    assert!(o.usage.setup_us.is_some());

    let o = run(
        &sb,
        job("import sys\nprint('to err', file=sys.stderr)\nsys.exit(3)"),
    )
    .await;
    assert_eq!(o.status, Status::Error, "{o:?}");
    assert_eq!(o.exit_code, Some(3));
    assert_eq!(o.stderr, "to err\n");

    let o = run(&sb, job("raise ValueError('boom')")).await;
    assert_eq!(o.exit_code, Some(1));
    assert!(o.stderr.contains("ValueError: boom"), "{o:?}");

    let o = run(
        &sb,
        job("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)"),
    )
    .await;
    assert_eq!(o.status, Status::Error, "{o:?}");
    assert_eq!(o.signal, Some(15), "{o:?}");
}

#[tokio::test]
async fn stdin_reaches_the_program() {
    let Some(sb) = backend().await else { return };
    let j = job_with(
        "import sys\ndata = sys.stdin.read()\nprint(len(data), data.upper())",
        |r| r.stdin = b"abc\ndef".to_vec(),
    );
    let o = run(&sb, j).await;
    assert_eq!(o.stdout, "7 ABC\nDEF\n", "{o:?}");

    // Empty stdin: the program reads EOF at once.
    let o = run(&sb, job("import sys\nprint(repr(sys.stdin.read()))")).await;
    assert_eq!(o.stdout, "''\n", "{o:?}");

    // A megabyte the program never reads does not block the run.
    let j = job_with("print('done')", |r| r.stdin = vec![b'x'; 1 << 20]);
    let o = run(&sb, j).await;
    assert_eq!(o.stdout, "done\n", "{o:?}");
}

#[tokio::test]
async fn files_args_env_and_workdir() {
    let Some(sb) = backend().await else { return };
    let code = r#"
import os, sys
print(os.getcwd())
print(open('pkg/data.txt').read())
print(open('bin.dat', 'rb').read())
print(sys.argv[1:])
print(os.environ['GREETING'], os.environ['HOME'], os.environ['TMPDIR'])
import helper; print(helper.VALUE)
open('out.txt', 'w').write('written')
print(open('/tmp/t', 'w').write('tmp ok'))
"#;
    let j = job_with(code, |r| {
        r.files = vec![
            FileInput {
                filename: "pkg/data.txt".into(),
                content: "nested file".into(),
                encoding: Default::default(),
            },
            FileInput {
                filename: "bin.dat".into(),
                content: "AAH/".into(),
                encoding: gearbox_core::Encoding::Base64,
            },
            FileInput {
                filename: "helper.py".into(),
                content: "VALUE = 42".into(),
                encoding: Default::default(),
            },
        ];
        r.args = vec!["one".into(), "two words".into()];
        r.env = BTreeMap::from([("GREETING".into(), "hi".into())]);
    });
    let o = run(&sb, j).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(
        o.stdout,
        "/workspace\nnested file\nb'\\x00\\x01\\xff'\n['one', 'two words']\nhi /workspace /tmp\n42\n6\n"
    );
}

#[tokio::test]
async fn output_is_capped_while_streaming() {
    let Some(sb) = backend().await else { return };
    let j = job_with(
        "import sys\nfor _ in range(2000):\n    sys.stdout.write('x' * 4096)\n    sys.stderr.write('y' * 4096)\n",
        |r| {
            r.limits = LimitOverrides {
                output_bytes: Some(1000),
                ..Default::default()
            }
        },
    );
    let o = run(&sb, j).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(o.stdout_truncated && o.stderr_truncated);
    assert!(o.stdout.starts_with(&"x".repeat(1000)));
    assert!(o.stdout.len() < 1200, "{}", o.stdout.len());
    assert!(
        o.stdout
            .contains(&format!("{} more bytes", 2000 * 4096 - 1000)),
        "{}",
        &o.stdout[1000..]
    );
    assert!(o.stderr.starts_with(&"y".repeat(1000)));
}

#[tokio::test]
async fn timeout_kills_and_removes_the_container() {
    let Some(sb) = backend().await else { return };
    let m = mark();
    let mut j = marked("print('started', flush=True)\nwhile True:\n    pass\n", &m);
    j.limits.timeout_ms = 1500;
    let t = Instant::now();
    let o = run(&sb, j).await;
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    assert_eq!(o.stdout, "started\n");
    assert!((1500..4000).contains(&o.duration_ms), "{o:?}");
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(containers_marked(&sb, &m).await.is_empty());
}

#[tokio::test]
async fn memory_limit_kills() {
    let Some(sb) = backend().await else { return };
    let mut j = job("b = bytearray(400 * 1024 * 1024)\nprint('allocated')");
    j.limits.memory_mb = 64;
    let o = run(&sb, j).await;
    assert_eq!(o.status, Status::Killed, "{o:?}");
    assert!(
        o.reason.as_deref().unwrap_or("").contains("memory"),
        "{o:?}"
    );
    assert!(!o.stdout.contains("allocated"));
}

#[tokio::test]
async fn fork_bomb_hits_the_pids_limit() {
    let Some(sb) = backend().await else { return };
    let code = r#"
import os, time
n = 0
try:
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print('stopped after', n, e.errno)
"#;
    let mut j = job(code);
    j.limits.pids = 16;
    j.limits.timeout_ms = 20_000;
    let o = run(&sb, j).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let n: u64 = o
        .stdout
        .split_whitespace()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .expect("count");
    assert!(n < 16, "{o:?}");
    // The program exits at once: its sleeping children die with the container.
    assert!(o.duration_ms < 15_000, "{o:?}");
}

#[tokio::test]
async fn cpu_time_limit_kills() {
    let Some(sb) = backend().await else { return };
    let mut j = job("while True:\n    pass\n");
    j.limits.cpu_ms = 1000;
    j.limits.timeout_ms = 20_000;
    let o = run(&sb, j).await;
    assert_eq!(o.status, Status::Killed, "{o:?}");
    assert!(o.reason.as_deref().unwrap_or("").contains("CPU"), "{o:?}");
}

#[tokio::test]
async fn no_container_left_behind_after_a_run_or_a_cancelled_run() {
    let Some(sb) = backend().await else { return };
    let m = mark();
    let o = run(&sb, marked("print(1)", &m)).await;
    assert_eq!(o.status, Status::Ok);
    assert!(containers_marked(&sb, &m).await.is_empty());

    // Drop the run's future while the program runs: the container goes away anyway.
    let m = mark();
    // Drive the run until its container exists (on a loaded machine creating and starting
    // it can take seconds), then drop it.
    let mut fut = Box::pin(sb.run(marked("import time\ntime.sleep(60)", &m)));
    let t = Instant::now();
    loop {
        tokio::select! {
            o = &mut fut => panic!("the run ended before it was dropped: {o:?}"),
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        let running = containers_marked(&sb, &m).await.len();
        if running > 0 {
            assert_eq!(running, 1, "one container per run");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "never started");
    }
    drop(fut);
    let t = Instant::now();
    while !containers_marked(&sb, &m).await.is_empty() {
        assert!(t.elapsed() < Duration::from_secs(15), "not removed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn missing_image_is_a_clear_error() {
    let Some(_) = backend().await else { return };
    let mut config = DockerConfig::default();
    config.images.insert(
        "python".into(),
        DockerImage {
            image: "gearbox/absent:never".into(),
            command: vec!["python3".into(), "{entrypoint}".into()],
            workdir: "/workspace".into(),
        },
    );
    let sb = DockerSandbox::new(config);
    match sb.run(job("print(1)")).await {
        Err(SandboxError::Unavailable(e)) => {
            assert!(e.contains("gearbox/absent:never"), "{e}");
            assert!(e.contains("docker pull gearbox/absent:never"), "{e}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let mut j = job("print(1)");
    j.language = "ruby".into();
    match sb.run(j).await {
        Err(SandboxError::Unavailable(e)) => assert!(e.contains("docker.images.ruby"), "{e}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn orphans_of_dead_owners_are_reaped_on_start_up() {
    let Some(sb) = backend().await else { return };
    let docker = sb.client().await.expect("client");
    // A gearbox process that died: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().expect("spawn");
    let dead_pid = child.id();
    child.wait().expect("wait");
    let me = Owner::current();
    let dead = Owner {
        pid: dead_pid,
        start_time: 1,
        ..me.clone()
    };
    let mut ids = Vec::new();
    for (owner, is_dead) in [(&dead, true), (&me, false)] {
        let labels = HashMap::from([
            (LABEL_BACKEND.to_string(), "docker".to_string()),
            (LABEL_OWNER.to_string(), owner.label()),
        ]);
        let c = docker
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                bollard::models::ContainerCreateBody {
                    image: Some("gearbox/python:bookworm".into()),
                    cmd: Some(vec!["sleep".into(), "60".into()]),
                    labels: Some(labels),
                    host_config: Some(bollard::models::HostConfig {
                        network_mode: Some("none".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )
            .await
            .expect("create");
        match docker.start_container(&c.id, None).await {
            Ok(()) => {}
            // Other tests' backends reap in parallel, and the dead owner's container is theirs
            // to reap as soon as it exists: being removed (409) or gone (404) is the outcome
            // this test checks.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409,
                ..
            }) if is_dead => {}
            Err(e) => panic!("start: {e:?}"),
        }
        ids.push(c.id);
    }
    // A new backend (as in a new gearbox process) reaps on first use.
    let fresh = DockerSandbox::new(DockerConfig::default());
    fresh.client().await.expect("client");
    let exists = |id: String| {
        let docker = docker.clone();
        async move {
            docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
                .is_ok()
        }
    };
    // Other tests' backends reap too, in parallel: the one that got there first may still be
    // removing it (and this reaper was told "already in progress"). Wait for it to be gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    while exists(ids[0].clone()).await {
        assert!(
            Instant::now() < deadline,
            "the dead owner's container was reaped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        exists(ids[1].clone()).await,
        "a live owner's container stays"
    );
    docker
        .remove_container(
            &ids[1],
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove");
}

// ---------------------------------------------------------------------------------------------
// Escape attempts

#[tokio::test]
async fn no_network() {
    let Some(sb) = backend().await else { return };
    let code = r#"
import os, socket
print(sorted(os.listdir('/sys/class/net')))
try:
    socket.getaddrinfo('data.example.org', 443)
    print('resolved')
except OSError as e:
    print('no dns')
"#;
    let o = run(&sb, job(code)).await;
    assert_eq!(o.stdout, "['lo']\nno dns\n", "{o:?}");
}

#[tokio::test]
async fn a_job_with_network_is_refused() {
    let Some(sb) = backend().await else { return };
    let mut j = job("print(1)");
    j.egress = Some("/run/gearbox/egress/x/proxy.sock".into());
    let e = sb.run(j).await.expect_err("refused");
    assert!(e.to_string().contains("grants no network"), "{e}");
}

#[tokio::test]
async fn read_only_root_and_writable_workspace() {
    let Some(sb) = backend().await else { return };
    let code = r#"
import errno
for p in ['/etc/passwd', '/usr/bin/x', '/x', '/var/x', '/root/x']:
    try:
        open(p, 'a').write('x')
        print(p, 'WRITABLE')
    except OSError as e:
        print(p, errno.errorcode[e.errno])
open('/workspace/ok', 'w').write('ok')
open('/tmp/ok', 'w').write('ok')
print('workspace and tmp writable')
"#;
    let o = run(&sb, job(code)).await;
    assert!(!o.stdout.contains("WRITABLE"), "{}", o.stdout);
    // Non-root meets EACCES on root-owned files first; a new name anywhere is EROFS.
    for p in ["/usr/bin/x", "/x", "/var/x"] {
        assert!(o.stdout.contains(&format!("{p} EROFS")), "{}", o.stdout);
    }
    assert!(o.stdout.ends_with("workspace and tmp writable\n"), "{o:?}");
}

#[tokio::test]
async fn workspace_size_is_bounded() {
    let Some(sb) = backend().await else { return };
    let code = r#"
import errno
try:
    with open('big', 'wb') as f:
        for _ in range(64):
            f.write(b'\0' * (1 << 20))
    print('wrote 64 MiB')
except OSError as e:
    print(errno.errorcode[e.errno])
"#;
    let mut j = job(code);
    j.limits.disk_mb = 16;
    let o = run(&sb, j).await;
    assert_eq!(o.stdout, "ENOSPC\n", "{o:?}");
}

#[tokio::test]
async fn non_root_without_capabilities_under_seccomp() {
    let Some(sb) = backend().await else { return };
    let code = r#"
import os
print(os.getuid(), os.getgid(), os.geteuid())
status = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
for k in ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp']:
    print(k, status[k].strip())
"#;
    let o = run(&sb, job(code)).await;
    assert_eq!(
        o.stdout,
        "65534 65534 65534\nCapInh 0000000000000000\nCapPrm 0000000000000000\n\
         CapEff 0000000000000000\nCapBnd 0000000000000000\nCapAmb 0000000000000000\n\
         NoNewPrivs 1\nSeccomp 2\n",
        "{o:?}"
    );
}

#[tokio::test]
async fn denied_syscalls_fail_with_eperm() {
    let Some(sb) = backend().await else { return };
    // x86_64 numbers: io_uring_setup 425, unshare 272, keyctl 250, bpf 321, userfaultfd 323,
    // perf_event_open 298.
    let code = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
for name, nr, args in [('io_uring_setup', 425, (8, 0)), ('unshare', 272, (0x10000000,)),
                       ('keyctl', 250, (0, 0)), ('bpf', 321, (0, 0, 0)),
                       ('userfaultfd', 323, (0,)), ('perf_event_open', 298, (0, 0, -1, -1, 0))]:
    r = libc.syscall(nr, *args)
    print(name, r, errno.errorcode.get(ctypes.get_errno()))
"#;
    if std::env::consts::ARCH != "x86_64" {
        eprintln!(
            "syscall numbers in this test are x86_64's; skipped on {}",
            std::env::consts::ARCH
        );
        return;
    }
    let o = run(&sb, job(code)).await;
    for name in [
        "io_uring_setup",
        "unshare",
        "keyctl",
        "bpf",
        "userfaultfd",
        "perf_event_open",
    ] {
        assert!(
            o.stdout.contains(&format!("{name} -1 EPERM")),
            "{name}: {}",
            o.stdout
        );
    }
}

#[tokio::test]
async fn host_files_and_processes_are_not_visible() {
    let Some(sb) = backend().await else { return };
    let secret = format!("/tmp/gearbox-docker-secret-{}", std::process::id());
    std::fs::write(&secret, "host secret").expect("write");
    let code = format!(
        r#"
import os
print(os.path.exists({secret:?}))
pids = [p for p in os.listdir('/proc') if p.isdigit()]
print(len(pids) < 10, open('/proc/1/cmdline').read().split('\0')[0])
print(os.path.exists('/var/run/docker.sock'), os.path.exists('/root/.cargo'))
"#
    );
    let o = run(&sb, job(&code)).await;
    let _ = std::fs::remove_file(&secret);
    assert_eq!(
        o.stdout, "False\nTrue /sbin/docker-init\nFalse False\n",
        "{o:?}"
    );
}

#[tokio::test]
async fn a_setsid_daemon_dies_with_the_run() {
    let Some(sb) = backend().await else { return };
    // A sleep with a unique duration, in a new session, double-forked, left running.
    let secs = 900_000 + u64::from(std::process::id() % 90_000);
    let code = format!(
        r#"
import os, subprocess
if os.fork() == 0:
    os.setsid()
    subprocess.Popen(['sleep', '{secs}'], start_new_session=True)
    os._exit(0)
os.wait()
print('left a daemon')
"#
    );
    let o = run(&sb, job(&code)).await;
    assert_eq!(o.stdout, "left a daemon\n", "{o:?}");
    // The container is gone, and so is every process it started.
    let needle = format!("sleep\0{secs}");
    let alive = std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .any(|c| String::from_utf8_lossy(&c).contains(&needle));
    assert!(!alive, "the daemon outlived its run");
}
