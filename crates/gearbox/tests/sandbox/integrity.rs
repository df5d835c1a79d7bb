//! Sandbox integrity on every path a run can take: nothing of one run reaches the next,
//! the outcome is the supervisor's, limits hold with or without root.
//!
//! Paths: `cold` (a helper per run), `warm` (the default pool: helper-built warm sandboxes,
//! or the fork servers where the host has root and cgroups), and, where the host has root
//! and cgroups, each fork server on its own (`python-fork`, `javascript-fork`, and the exec
//! fork server as `bash-fork`). Each check names the path in its failure message.

use std::sync::Arc;
use std::time::Duration;

use gearbox_core::{ExecRequest, LimitOverrides, Outcome, Status};
use gearbox_engine::{Config, Engine, PoolConfig};

use crate::support::{Run, root_and_cgroups, run};

fn engine_with(pool: PoolConfig) -> Arc<Engine> {
    let _g = crate::support::runtime().enter();
    let config = Config {
        pool,
        ..Config::default()
    };
    Arc::new(Engine::new(config, crate::support::gearbox_bin()))
}

/// The paths a run of `language` can take on this host, each with an engine that takes it:
/// `cold`, and the warm one (`{language}-fork` where fork servers run: Python's and Node's
/// own, the exec fork server for the others; else `warm`, a helper-built warm sandbox).
pub(crate) fn paths(language: &str) -> Vec<(String, Arc<Engine>)> {
    vec![
        ("cold".to_string(), engine_with(PoolConfig::only([]))),
        (
            warm_path(language),
            engine_with(PoolConfig::only([(language.to_string(), 1)])),
        ),
    ]
}

/// The name of the warm path a run of `language` takes on this host (see [`paths`]).
fn warm_path(language: &str) -> String {
    if root_and_cgroups("fork-server paths of the integrity checks") {
        format!("{language}-fork")
    } else {
        "warm".to_string()
    }
}

async fn exec(engine: &Arc<Engine>, req: ExecRequest) -> Outcome {
    let e = Arc::clone(engine);
    crate::support::runtime()
        .spawn(async move { e.execute(req, None).await })
        .await
        .expect("run task")
}

/// Wait until `engine`'s pool holds a warm sandbox. The bound is generous (a loaded CI
/// machine builds slowly, and a failed build is retried after a delay); the pool's own
/// account, last error included, is in the message when it runs out.
async fn wait_warm(path: &str, engine: &Arc<Engine>) {
    let until = std::time::Instant::now() + Duration::from_secs(120);
    while engine.pool_stats().iter().all(|s| s.ready == 0) {
        assert!(
            std::time::Instant::now() < until,
            "{path}: no warm sandbox after 120 s: {:?}",
            engine.pool_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Run `r` on `engine`; on a pooled engine, only once a warm sandbox is ready and checked to
/// have served it (a run that fell back to a cold start would test the wrong path).
pub(crate) async fn on(path: &str, engine: &Arc<Engine>, r: Run) -> Outcome {
    if path == "cold" {
        return exec(engine, r.req).await;
    }
    let hits = || engine.pool_stats().iter().map(|s| s.hits).sum::<u64>();
    wait_warm(path, engine).await;
    if path.ends_with("-fork") {
        assert!(
            engine
                .pool_stats()
                .iter()
                .all(|s| s.fork_server || s.network),
            "{path}: not a fork server: {:?}",
            engine.pool_stats()
        );
    }
    let before = hits();
    let o = exec(engine, r.req).await;
    assert_eq!(hits(), before + 1, "{path}: not served warm: {o:?}");
    o
}

/// A program that writes a forged end — the old done message and init's `exited` line — to
/// every descriptor it holds beyond 0, 1 and 2, then burns CPU time and exits 3. It prints
/// the descriptors it found.
fn forger(language: &str) -> String {
    let fake = r#"{"code":0,"cpu_time_ms":1,"max_rss_kb":1}\n{"t":"exited","code":0,"signal":null,"cpu_time_ms":1,"max_rss_kb":1}\n{"t":"exited","code":0}\n"#;
    match language {
        "python" => format!(
            r#"import os, fcntl, time
held = []
for fd in range(3, 1024):
    try:
        fcntl.fcntl(fd, fcntl.F_GETFD)
    except OSError:
        continue
    held.append((fd, os.readlink('/proc/self/fd/%d' % fd)))
print('held', held, flush=True)
for fd, _ in held:
    try:
        os.write(fd, b'{fake}')
    except OSError:
        pass
# Burn 300 ms of CPU time (not of wall-clock time: the machine may be loaded).
while time.process_time() < 0.3:
    pass
raise SystemExit(3)
"#
        ),
        "javascript" => format!(
            r#"const fs = require('fs');
const held = [];
for (const name of fs.readdirSync('/proc/self/fd')) {{
  const fd = Number(name);
  if (fd < 3) continue;
  try {{ held.push([fd, fs.readlinkSync('/proc/self/fd/' + name)]); }} catch {{}}
}}
console.log('held', JSON.stringify(held));
// A pipe whose both ends this process holds is its own event loop's (writing garbage there
// crashes only the program itself); anything else could lead to a supervisor.
const ends = {{}};
for (const [, what] of held) ends[what] = (ends[what] || 0) + 1;
const outward = held.filter(([, what]) => what.startsWith('socket:') || (what.startsWith('pipe:') && ends[what] < 2));
console.log('outward', JSON.stringify(outward));
for (const [fd] of outward) {{
  try {{ fs.writeSync(fd, '{fake}'); }} catch {{}}
}}
const t = process.cpuUsage();
while (process.cpuUsage(t).user + process.cpuUsage(t).system < 300000) {{}}
process.exitCode = 3;
"#
        ),
        _ => format!(
            r#"held=""
for f in /proc/self/fd/*; do n=${{f##*/}}; [ "$n" -gt 2 ] && held="$held $n:$(readlink $f)"; done
echo "held$held"
for f in /proc/self/fd/*; do n=${{f##*/}}; [ "$n" -gt 2 ] && printf '{fake}' >&$n 2>/dev/null; done
for ((i = 0; i < 300000; i++)); do :; done
exit 3
"#
        ),
    }
}

#[tokio::test]
async fn the_outcome_is_the_supervisors_and_programs_hold_only_stdio() {
    for language in ["python", "javascript", "bash"] {
        for (path, engine) in paths(language) {
            for _ in 0..2 {
                let o = on(&path, &engine, run(language, &forger(language))).await;
                let at = format!("{language} on {path}");
                assert_eq!(o.status, Status::Error, "{at}: {o:?}");
                assert_eq!(o.exit_code, Some(3), "{at}: {o:?}");
                // The program burnt 300 ms of CPU time (Bash: a fixed count of iterations):
                // the figures are the supervisor's, not the forged 1 ms.
                let cpu = o.usage.cpu_time_ms.expect("CPU time measured");
                let least = if language == "bash" { 50 } else { 290 };
                assert!(cpu >= least, "{at}: CPU time {cpu} ms: {o:?}");
                // The duration starts when the helper hears the program started, after the
                // interpreter's own start-up, which its CPU clock already counts: a loaded
                // machine can make it a little shorter than the CPU time. Not the forged 0.
                assert!(o.duration_ms >= least / 2, "{at}: {o:?}");
                let held = o.stdout.lines().next().unwrap_or_default();
                match language {
                    // Python: nothing at all beyond stdio (the opened /proc/self/fd/N of
                    // readlink is closed again before the next check).
                    "python" => assert_eq!(held, "held []", "{at}: {o:?}"),
                    // Node's own event loop holds epoll fds, eventfds and pipes whose both
                    // ends it holds; nothing leads outward.
                    "javascript" => assert!(o.stdout.contains("\noutward []\n"), "{at}: {o:?}"),
                    // The shell's directory listing of its own fds.
                    _ => assert!(
                        !held.contains("socket:") && !held.contains("pipe:"),
                        "{at}: {held}"
                    ),
                }
            }
        }
    }
}

/// A granted run has one more process in its sandbox (the egress relay) and the proxy's
/// socket in reach; its program still holds only stdio and its outcome is still the
/// supervisor's.
#[tokio::test]
async fn a_granted_run_holds_only_stdio_and_cannot_forge_its_end() {
    let engine = engine_with(PoolConfig::only([]));
    for language in ["python", "bash"] {
        let mut r = run(language, &forger(language));
        r.req.network = gearbox_core::Network::Any;
        let o = exec(&engine, r.req).await;
        assert_eq!(o.status, Status::Error, "{language}: {o:?}");
        assert_eq!(o.exit_code, Some(3), "{language}: {o:?}");
        assert!(o.egress.is_some(), "{language}: a granted run: {o:?}");
        let least = if language == "bash" { 50 } else { 290 };
        let cpu = o.usage.cpu_time_ms.expect("CPU time measured");
        assert!(cpu >= least, "{language}: CPU time {cpu} ms: {o:?}");
        let held = o.stdout.lines().next().unwrap_or_default();
        if language == "python" {
            assert_eq!(held, "held []", "{o:?}");
        } else {
            assert!(
                !held.contains("socket:") && !held.contains("pipe:"),
                "{held}"
            );
        }
    }
}

/// A granted run never takes a fork server's slot or a warm sandbox built without network
/// (those have no relay): the first starts cold and gets its proxy; once a granted run has
/// missed, the pool keeps a sandbox built for granted runs (helper-built, with its relay),
/// and the next one is served by it, with a proxy of its own and a ledger all the same.
#[tokio::test]
async fn a_granted_run_is_served_warm_only_by_a_sandbox_built_for_it() {
    for language in ["python", "javascript"] {
        for (path, engine) in paths(language).into_iter().skip(1) {
            wait_warm(&path, &engine).await;
            let hits = |network: bool| {
                engine
                    .pool_stats()
                    .iter()
                    .filter(|s| s.network == network)
                    .map(|s| s.hits)
                    .sum::<u64>()
            };
            let before = hits(false);
            let code = if language == "python" {
                "import os; print(os.environ['HTTPS_PROXY'], os.environ['NO_PROXY'])"
            } else {
                "console.log(process.env.HTTPS_PROXY, process.env.NO_PROXY)"
            };
            let granted = || {
                let mut req = run(language, code).req;
                req.network = gearbox_core::Network::Any;
                req
            };
            let o = exec(&engine, granted()).await;
            assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
            assert_eq!(
                o.stdout, "http://127.0.0.1:3128 localhost,127.0.0.1,::1\n",
                "{path}: {o:?}"
            );
            assert!(o.egress.is_some(), "{path}: {o:?}");
            assert_eq!(hits(true), 0, "{path}: served warm with no sandbox kept");
            // The miss made the pool keep one for granted runs.
            let until = std::time::Instant::now() + Duration::from_secs(120);
            while !engine.pool_stats().iter().any(|s| s.network && s.ready > 0) {
                assert!(
                    std::time::Instant::now() < until,
                    "{path}: no warm sandbox for granted runs: {:?}",
                    engine.pool_stats()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let o = exec(&engine, granted()).await;
            assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
            assert_eq!(
                o.stdout, "http://127.0.0.1:3128 localhost,127.0.0.1,::1\n",
                "{path}: {o:?}"
            );
            assert!(o.egress.is_some(), "{path}: {o:?}");
            assert_eq!(hits(true), 1, "{path}: not served warm: {o:?}");
            assert_eq!(
                hits(false),
                before,
                "{path}: served by a sandbox without network"
            );
        }
    }
}

/// Fields a program prints that must differ between any two runs.
fn entropy_probe(language: &str) -> &'static str {
    match language {
        "python" => {
            "import os, random, uuid, secrets, tempfile\n\
             print(os.urandom(8).hex(), random.random(), random.getrandbits(64), uuid.uuid4(), \
             secrets.token_hex(8), secrets.randbelow(1 << 60), next(tempfile._get_candidate_names()), \
             random.SystemRandom().random())"
        }
        _ => {
            "const c = require('crypto');\n\
             console.log(c.randomBytes(8).toString('hex'), Math.random(), Math.random(), c.randomUUID(), \
             c.getRandomValues(new Uint32Array(2)).join('.'), c.webcrypto.getRandomValues(new Uint8Array(8)).join('.'), \
             c.randomInt(2 ** 47), c.generateKeySync('hmac', { length: 64 }).export().toString('hex'))"
        }
    }
}

#[tokio::test]
async fn every_run_gets_fresh_entropy() {
    for language in ["python", "javascript"] {
        for (path, engine) in paths(language) {
            let mut seen: Vec<Vec<String>> = vec![];
            for _ in 0..3 {
                let o = on(&path, &engine, run(language, entropy_probe(language))).await;
                assert_eq!(o.status, Status::Ok, "{language} on {path}: {o:?}");
                let fields: Vec<String> = o.stdout.split_whitespace().map(String::from).collect();
                assert_eq!(fields.len(), 8, "{language} on {path}: {o:?}");
                for earlier in &seen {
                    for (i, (a, b)) in earlier.iter().zip(&fields).enumerate() {
                        assert_ne!(
                            a, b,
                            "{language} on {path}: field {i} repeated between runs: {earlier:?} / {fields:?}"
                        );
                    }
                }
                seen.push(fields);
            }
        }
    }
}

/// A fork server serves at most `fork_server_max_runs` runs: what a fork cannot renew (here
/// Python's string hash seed, fixed when the interpreter starts) is shared by at most that
/// many runs, and fresh fork servers keep serving.
#[tokio::test]
async fn a_fork_server_serves_a_bounded_number_of_runs() {
    if !root_and_cgroups("fork server life") {
        return;
    }
    let engine = engine_with(PoolConfig {
        fork_server_max_runs: 2,
        ..PoolConfig::only([("python".to_string(), 1)])
    });
    let mut seeds: Vec<String> = vec![];
    for _ in 0..7 {
        let o = on(
            "python-fork",
            &engine,
            run("python", "print(hash('gearbox-seed'))"),
        )
        .await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        seeds.push(o.stdout.trim().to_string());
    }
    for s in &seeds {
        let n = seeds.iter().filter(|t| *t == s).count();
        assert!(n <= 2, "one hash seed served {n} runs: {seeds:?}");
    }
    assert!(engine.fork_servers_retired() >= 2, "{seeds:?}");
}

#[tokio::test]
async fn an_expired_timeout_is_a_timeout_whatever_the_cpu_limit() {
    for (language, code) in [
        ("python", "while True:\n    pass\n"),
        ("javascript", "for (;;) {}"),
        ("bash", "while :; do :; done"),
    ] {
        for (path, engine) in paths(language) {
            if path == "warm" {
                // A helper-built warm sandbox serves only runs with the default limits.
                continue;
            }
            let o = on(&path, &engine, run(language, code).timeout_ms(1000)).await;
            assert_eq!(o.status, Status::Timeout, "{language} on {path}: {o:?}");
            assert!(
                o.reason
                    .as_deref()
                    .unwrap_or_default()
                    .contains("wall-clock"),
                "{language} on {path}: {o:?}"
            );
        }
    }
}

/// `/proc/sys/user` of the run's own user namespace bounds its share of the host user's
/// inotify budget.
#[tokio::test]
async fn a_run_cannot_exhaust_the_host_users_kernel_counters() {
    let code = "import ctypes, os\n\
                libc = ctypes.CDLL(None, use_errno=True)\n\
                print(open('/proc/sys/user/max_inotify_instances').read().strip())\n\
                fds = []\n\
                for _ in range(200):\n\
                \x20   fd = libc.inotify_init()\n\
                \x20   if fd < 0:\n\
                \x20       break\n\
                \x20   fds.append(fd)\n\
                print(len(fds), os.strerror(ctypes.get_errno()))\n";
    for (path, engine) in paths("python") {
        let o = on(&path, &engine, run("python", code)).await;
        assert_eq!(o.status, Status::Ok, "python on {path}: {o:?}");
        let lines: Vec<&str> = o.stdout.lines().collect();
        assert_eq!(lines.first(), Some(&"16"), "python on {path}: {o:?}");
        let held: usize = lines
            .get(1)
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX);
        assert!(held <= 16, "python on {path}: {o:?}");
    }
}

/// The program's restriction is the same on every path: the cold path's helper applies it in
/// Rust (`jail/`), a fork server's programs in its native loop (`launchers/fork/`), both from
/// one policy (`restriction.rs`). What each path shows a program is compared, and checked.
#[tokio::test]
async fn the_restriction_is_the_same_on_every_path() {
    let code = r#"import os, resource, socket
for e in ['sys', 'sysrq-trigger', 'irq', 'bus', 'fs']:
    p = '/proc/' + e
    if os.path.exists(p):
        print(p, 'read-only' if os.statvfs(p).f_flag & os.ST_RDONLY else 'WRITABLE')
areas = ['/work', '/tmp', '/dev/shm']
for p in areas:
    open(p + '/probe', 'w').write('x')
    print(p, 'writable')
print('one scratch', len({os.stat(p).st_dev for p in areas}) == 1, os.stat('/work').st_dev != os.stat('/').st_dev)
for p in ['/gx', '/usr/gx', '/etc/gx', '/dev/gx', '/proc/gx']:
    try:
        open(p, 'w').write('x'); print('WROTE', p)
    except OSError:
        print('refused', p)
open('/dev/null', 'w').write('x')
print('zero', open('/dev/zero', 'rb').read(4) == bytes(4), 'random', len(open('/dev/urandom', 'rb').read(8)))
full = os.open('/dev/full', os.O_WRONLY)
try:
    os.write(full, b'x')
except OSError as e:
    print('full', e.errno)
for name in ['CORE', 'SIGPENDING', 'MSGQUEUE']:
    print(name, resource.getrlimit(getattr(resource, 'RLIMIT_' + name)))
print('inotify', open('/proc/sys/user/max_inotify_instances').read().strip(), open('/proc/sys/user/max_inotify_watches').read().strip())
print('host', socket.gethostname())
status = open('/proc/self/status').read().splitlines()
for key in ['CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp']:
    print([l for l in status if l.startswith(key + ':')][0])
"#;
    let mut seen: Option<(String, String)> = None;
    for (path, engine) in paths("python") {
        let o = on(&path, &engine, run("python", code)).await;
        assert_eq!(o.status, Status::Ok, "python on {path}: {o:?}");
        let out = o.stdout.replace('\t', " ");
        for line in [
            "/proc/sys read-only",
            "/work writable",
            "/tmp writable",
            "/dev/shm writable",
            "one scratch True True",
            "refused /gx",
            "refused /usr/gx",
            "refused /etc/gx",
            "refused /dev/gx",
            "refused /proc/gx",
            "zero True random 8",
            "full 28",
            "CORE (0, 0)",
            "SIGPENDING (1024, 1024)",
            "MSGQUEUE (65536, 65536)",
            "inotify 16 4096",
            "host gearbox",
            "CapInh: 0000000000000000",
            "CapPrm: 0000000000000000",
            "CapEff: 0000000000000000",
            "CapBnd: 0000000000000000",
            "CapAmb: 0000000000000000",
            "NoNewPrivs: 1",
            "Seccomp: 2",
        ] {
            assert!(out.contains(line), "python on {path}: {line}: {out}");
        }
        assert!(
            !out.contains("WROTE") && !out.contains("WRITABLE"),
            "python on {path}: {out}"
        );
        match &seen {
            None => seen = Some((path, out)),
            Some((first, expected)) => {
                assert_eq!(&out, expected, "python on {path} differs from {first}");
            }
        }
    }
}

/// `memory_mb` holds for the run as a whole, whether the kernel bounds it (a cgroup) or the
/// helper samples it (no cgroup: an unprivileged helper): shared anonymous memory, many
/// processes, memfd. The peak is measured, never a small wrong number.
#[tokio::test]
async fn the_memory_limit_holds_for_the_whole_run() {
    let limits = LimitOverrides {
        memory_mb: Some(128),
        timeout_ms: Some(20_000),
        ..Default::default()
    };
    let hogs = [
        (
            "shared anonymous mapping",
            "import mmap, time\nm = mmap.mmap(-1, 1 << 30)\nfor i in range(0, 1 << 30, 4096):\n    m[i] = 1\nprint('HELD', flush=True)\ntime.sleep(1)\n",
        ),
        (
            "eight children",
            "import os, time\nkids = []\nfor _ in range(8):\n    pid = os.fork()\n    if pid == 0:\n        b = bytearray(100 << 20)\n        for i in range(0, len(b), 4096):\n            b[i] = 1\n        time.sleep(3)\n        os._exit(0)\n    kids.append(pid)\nif all(os.waitpid(p, 0)[1] == 0 for p in kids):\n    print('HELD', flush=True)\nelse:\n    raise SystemExit('a child was killed')\n",
        ),
        (
            "memfd",
            "import os\nfd = os.memfd_create('x')\nchunk = b'x' * (1 << 20)\nfor _ in range(1024):\n    os.write(fd, chunk)\nprint('HELD', flush=True)\n",
        ),
    ];
    for (path, engine) in paths("python") {
        // A warm sandbox serves runs with the default limits (512 MiB): the hogs pass those
        // too.
        let limits = if path == "cold" {
            limits.clone()
        } else {
            LimitOverrides::default()
        };
        for (what, code) in hogs {
            let o = on(&path, &engine, run("python", code).limits(limits.clone())).await;
            let at = format!("{what} on {path}");
            assert!(!o.stdout.contains("HELD"), "{at}: {o:?}");
            assert_ne!(o.status, Status::Ok, "{at}: {o:?}");
            assert!(
                matches!(
                    o.usage.memory_limit.as_deref(),
                    Some("cgroup") | Some("sampled")
                ),
                "{at}: {o:?}"
            );
        }
        // A run that holds 64 MiB in a child for a moment reports at least that much.
        let o = on(
            &path,
            &engine,
            run(
                "python",
                "import os, time\npid = os.fork()\nif pid == 0:\n    b = bytearray(64 << 20)\n    for i in range(0, len(b), 4096):\n        b[i] = 1\n    time.sleep(0.5)\n    os._exit(0)\nos.waitpid(pid, 0)\n",
            )
            .limits(limits.clone()),
        )
        .await;
        assert_eq!(o.status, Status::Ok, "peak on {path}: {o:?}");
        let peak = o.usage.peak_memory_kb.expect("a measured peak");
        assert!(peak >= 60 << 10, "peak on {path}: {peak} KiB: {o:?}");
    }
}

/// `[sandbox] require_limits` refuses runs where the kernel cannot bound a run as a whole,
/// and only there.
#[tokio::test]
async fn require_limits_refuses_only_hosts_without_whole_run_limits() {
    let engine = {
        let _g = crate::support::runtime().enter();
        Arc::new(Engine::new(
            Config {
                pool: PoolConfig::only([]),
                sandbox: gearbox_engine::SandboxConfig {
                    require_limits: true,
                },
                ..Config::default()
            },
            crate::support::gearbox_bin(),
        ))
    };
    let o = exec(&engine, run("python", "print(6 * 7)").req).await;
    match gearbox_sandbox::unenforced_limits() {
        None => assert_eq!((o.status, o.stdout.as_str()), (Status::Ok, "42\n"), "{o:?}"),
        Some(_) => {
            assert_eq!(o.status, Status::Denied, "{o:?}");
            assert!(
                o.reason
                    .as_deref()
                    .unwrap_or_default()
                    .contains("require_limits"),
                "{o:?}"
            );
        }
    }
    let e = Arc::clone(&engine);
    let o = crate::support::runtime()
        .spawn(async move {
            e.execute(
                run("python", "print(1)").req,
                Some(gearbox_core::BackendKind::Process),
            )
            .await
        })
        .await
        .expect("run task");
    assert_eq!(o.status, Status::Denied, "{o:?}");
}

/// A program starts with every signal at its default disposition and none blocked, as
/// under a shell: whatever the server, its helper (Rust ignores SIGPIPE) or a fork server
/// ignored does not survive into it. A pipeline's writer then dies of SIGPIPE.
#[tokio::test]
async fn a_program_starts_with_default_signal_dispositions() {
    for (path, engine) in paths("bash") {
        let o = on(
            &path,
            &engine,
            run(
                "bash",
                "grep -E '^Sig(Ign|Blk):' /proc/self/status\nyes | head -c 2 > /dev/null; echo \"pipe ${PIPESTATUS[0]}\"",
            ),
        )
        .await;
        assert_eq!(
            o.stdout, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\npipe 141\n",
            "bash on {path}: {o:?}"
        );
    }
}

/// Run `script` (args `x y`, a file `data.txt`) on every path of `language`: each run must
/// succeed and print what the first path's did (the first differing line is named). Returns
/// that output.
async fn same_on_every_path(language: &str, script: &str) -> String {
    let mut first: Option<(String, String)> = None;
    for (path, engine) in paths(language) {
        let r = run(language, script)
            .args(&["x", "y"])
            .file("data.txt", "d");
        let o = on(&path, &engine, r).await;
        assert_eq!(o.status, Status::Ok, "{language} on {path}: {o:?}");
        match &first {
            None => first = Some((path, o.stdout)),
            Some((first_path, want)) => {
                for (a, b) in o.stdout.lines().zip(want.lines()) {
                    assert_eq!(a, b, "{path} against {first_path}");
                }
                assert_eq!(&o.stdout, want, "{path} against {first_path}");
            }
        }
    }
    first.expect("every language has a path").1
}

/// A warm Python program starts in the state a cold one does: the fork server's rehearsal
/// of a run (a file written to /tmp and removed, the environment set and cleared, `__main__`
/// and `sys.argv` replaced and restored) leaves nothing behind, and a script compiled from
/// the handed-over bytes reads as the file does (a byte order mark, a declared encoding).
#[tokio::test]
async fn a_warm_python_program_starts_as_a_cold_one_does() {
    let probe = "import os, sys\n\
        m = sys.modules['__main__']\n\
        print(sorted(os.listdir('/tmp')), sorted(os.listdir('/dev/shm')), sorted(os.listdir('.')))\n\
        print(sorted(os.environ.items()))\n\
        print(sys.argv, sys.orig_argv[1:], sys.path[0], __name__, __file__)\n\
        print(m.__file__, m.__dict__ is globals(), m.__spec__, m.__loader__.path, m.__cached__)\n\
        print(sorted(k for k in globals() if k != 'm'))\n\
        print(len('\u{e9}t\u{e9}'))\n";
    // UTF-8 bytes read as Latin-1: 'été' is five characters then.
    for (script, len) in [
        (probe.to_string(), "3\n"),
        (format!("\u{feff}{probe}"), "3\n"),
        (format!("# -*- coding: latin-1 -*-\n{probe}"), "5\n"),
    ] {
        let out = same_on_every_path("python", &script).await;
        assert!(out.starts_with("[] [] ['data.txt', 'main.py']\n"), "{out}");
        assert!(out.contains("('TMPDIR', '/tmp')"), "{out}");
        assert!(out.ends_with(len), "{out}");
    }
}

/// A warm Node program starts in the state a cold one does: what the fork server does
/// before it serves (a module loaded from its own /tmp and dropped from the cache, its
/// environment set and cleared) leaves nothing a program can see.
#[tokio::test]
async fn a_warm_node_program_starts_as_a_cold_one_does() {
    let probe = "const fs = require('fs');\n\
        console.log(JSON.stringify([fs.readdirSync('/tmp'), fs.readdirSync('/dev/shm'), fs.readdirSync('.').sort()]));\n\
        console.log(JSON.stringify(Object.entries(process.env).sort()));\n\
        console.log(JSON.stringify([process.argv.slice(1), process.execArgv, require.main === module, module.id, module.filename, module.paths]));\n\
        console.log(JSON.stringify(Object.keys(require.cache)));\n";
    let out = same_on_every_path("javascript", probe).await;
    assert!(
        out.starts_with("[[],[],[\"data.txt\",\"main.js\"]]\n"),
        "{out}"
    );
    assert!(out.contains("[\"TMPDIR\",\"/tmp\"]"), "{out}");
    assert!(out.ends_with("[\"/work/main.js\"]\n"), "{out}");
}

/// A warm Node program runs no callback it did not queue: what the fork server's warming
/// and the program's rehearsal queue (their streams' write and finish callbacks) has run
/// before the hand-over, so an async hook the program installs first sees every callback's
/// resource created, as in a cold run, and nothing of the rehearsal runs after its code.
#[tokio::test]
async fn a_warm_node_program_runs_no_callback_it_did_not_queue() {
    let probe = "const seen = new Set();\n\
        const foreign = [];\n\
        require('async_hooks').createHook({\n\
          init(id) { seen.add(id); },\n\
          before(id) { if (!seen.has(id)) foreign.push(id); },\n\
        }).enable();\n\
        setImmediate(() => {});\n\
        process.on('exit', () => console.log(`callbacks of resources not seen created: ${foreign.length}`));\n";
    let out = same_on_every_path("javascript", probe).await;
    assert_eq!(out, "callbacks of resources not seen created: 0\n");
}

/// A warm Node program finds the package scopes a cold one does. The module loader caches,
/// by path, which `package.json` governs a file (and that none does), so no warming may load
/// a module from where a run can write: a `/tmp/package.json` the program writes then decides
/// how `/tmp`'s files load, as in a cold run (`"type": "module"`: not as CommonJS).
#[tokio::test]
async fn a_warm_node_program_finds_the_package_scopes_a_cold_one_does() {
    let probe = "const fs = require('fs');\n\
        fs.writeFileSync('/tmp/package.json', '{\"type\": \"module\"}');\n\
        fs.writeFileSync('/tmp/m.js', 'module.exports = 1;\\n');\n\
        try { require('/tmp/m.js'); console.log('/tmp/m.js loaded as CommonJS'); }\n\
        catch { console.log('/tmp/m.js not loaded as CommonJS'); }\n";
    let out = same_on_every_path("javascript", probe).await;
    assert_eq!(out, "/tmp/m.js not loaded as CommonJS\n");
}

/// A warm Python or Node program's signal dispositions are a cold one's: its fork server's
/// interpreter starts with every signal at its default, as a cold program does, so nothing
/// ignored where the server was started (the C library's reserved 32 and 33 included) is
/// ignored in a run or in what it starts.
#[tokio::test]
async fn warm_programs_start_with_a_cold_ones_signal_dispositions() {
    for (language, probe) in [
        (
            "python",
            "print([l for l in open('/proc/self/status').read().splitlines() if l.startswith(('SigIgn', 'SigBlk'))])\n",
        ),
        (
            "javascript",
            "console.log(require('fs').readFileSync('/proc/self/status', 'utf8').split('\\n').filter((l) => /^Sig(Ign|Blk)/.test(l)).join(' '));\n",
        ),
    ] {
        same_on_every_path(language, probe).await;
    }
}

/// A warm Python program holds no importer for a place a run can write but those a cold one
/// holds, and imports what it writes as a cold one does: an importer caches its view of a
/// directory, so no warming may leave one for /tmp, /dev/shm or /work (its finders are the
/// read-only root's). Then a module the program writes to /tmp or /work, and imports, is found.
#[tokio::test]
async fn a_warm_python_program_imports_the_modules_it_writes() {
    let probe = "import sys\n\
        writable = ('/tmp', '/dev/shm', '/work')\n\
        print(sorted(k for k in sys.path_importer_cache if k.startswith(writable) and k != '/work/main.py'))\n\
        for d in ('/tmp', '/work'):\n\
        \x20   open(d + '/written_now.py', 'w').write('WHERE = %r\\n' % d)\n\
        \x20   sys.path.insert(0, d)\n\
        \x20   import written_now\n\
        \x20   print(written_now.WHERE)\n\
        \x20   del sys.modules['written_now']\n\
        \x20   sys.path.pop(0)\n";
    let out = same_on_every_path("python", probe).await;
    assert_eq!(out, "[]\n/tmp\n/work\n");
}

/// A program reaches into its run's init on no path more than on the cold one. As root,
/// init's /proc files belong to its user namespace's root, which the run does not map, so a
/// program lists none of init's descriptors and can write none of the files an owner may
/// write (its OOM score among them): the cold path's init changed its ids and is not
/// dumpable, and a fork server's init (which was dumpable, owned by the sandbox user) now
/// says so. Unprivileged, init keeps its ids and stays dumpable on every path (the helper,
/// outside, samples the run's memory through `/proc/<init>/root`, which the kernel grants a
/// user without root only for a dumpable process): the program can list init's descriptors,
/// but writes nothing of init's either way. The program's own /proc files are its own.
#[tokio::test]
async fn init_is_out_of_a_programs_reach_on_every_path() {
    let probes = [
        (
            "python",
            "import os\n\
             print(os.stat('/proc/1/status').st_uid, os.stat('/proc/self/status').st_uid)\n\
             for what, f in (('fds', lambda: os.listdir('/proc/1/fd')), ('oom', lambda: open('/proc/1/oom_score_adj', 'w').write('1000'))):\n\
             \x20   try:\n\
             \x20       f(); print(what, 'reached')\n\
             \x20   except PermissionError:\n\
             \x20       print(what, 'denied')\n",
        ),
        (
            "javascript",
            "const fs = require('fs');\n\
             console.log(fs.statSync('/proc/1/status').uid, fs.statSync('/proc/self/status').uid);\n\
             for (const [what, f] of [['fds', () => fs.readdirSync('/proc/1/fd')], ['oom', () => fs.writeFileSync('/proc/1/oom_score_adj', '1000')]]) {\n\
             \x20 try { f(); console.log(what, 'reached'); } catch (e) { console.log(what, e.code === 'EACCES' ? 'denied' : e.code); }\n\
             }\n",
        ),
        (
            "bash",
            "echo $(stat -c %u /proc/1/status) $(stat -c %u /proc/self/status)\n\
             ls /proc/1/fd >/dev/null 2>&1 && echo fds reached || echo fds denied\n\
             (echo 1000 > /proc/1/oom_score_adj) 2>/dev/null && echo oom reached || echo oom denied\n",
        ),
    ];
    for (language, probe) in probes {
        let out = same_on_every_path(language, probe).await;
        let want = if crate::support::is_root() {
            "65534 1000\nfds denied\noom denied\n"
        } else {
            "1000 1000\nfds reached\noom denied\n"
        };
        assert_eq!(out, want, "{language}");
    }
}

/// A warm Bash program starts as a cold one does. On both warm paths (the exec fork server's
/// slots, helper-built warm sandboxes) its program is bash started before the run and fed
/// the run's arguments through `BASH_ENV` (`jail/prestart.rs`): the variables, options, limits, descriptors, stdin
/// and `$0 $_ $@` it starts with are the cold path's. What differs is left out of the
/// comparison, as docs/PERFORMANCE.md says (and `$SECONDS` is compared as "under 2": a
/// start a whole second apart from the first line would read 1 on any path): bash's argument stack for debuggers
/// (`BASH_ARGC`, `BASH_ARGV`: the script's arguments cold, none warm), its initial
/// environment in `/proc` (which names `BASH_ENV`: the proof that the pre-started path was
/// taken), and, on every fork server's path, `ulimit -u` (the run's own user namespace and
/// its cgroup's pids limit hold the processes there). A run bash was not started for
/// (another entrypoint) is served by a program forked in its place, as a cold one.
#[tokio::test]
async fn a_warm_bash_program_starts_as_a_cold_one_does() {
    let probe = r#"echo "$# [$*] $0 $_ $SHLVL $((SECONDS < 2)) ${BASH_ENV-unset} $- $PWD $BASH_SOURCE"
ls /proc/$$/fd > /tmp/fds; echo $(cat /tmp/fds)
declare -p | grep -vE '^declare -[-a-zA-Z]+ (BASHPID|BASH_ARGC|BASH_ARGV|RANDOM|SRANDOM|EPOCHSECONDS|EPOCHREALTIME|SECONDS|BASH_COMMAND|_)='
set -o; shopt; ulimit -a | grep -v '^max user processes'; env | sort; trap -p; alias
echo "stdin: $(cat) $(cat data.txt)"; umask; stat -c '%n %a %u %g %s' . "$0" data.txt
echo "pre-started: $(tr '\0' '\n' < /proc/$$/environ | grep -c ^BASH_ENV=)"
"#;
    let mut cold = None;
    for (path, engine) in paths("bash") {
        let r = run("bash", probe)
            .args(&["x y", "it's", "", "a\n$(id)`id`'\\"])
            .stdin("in")
            .file("data.txt", "d");
        let mut other = r.clone();
        other.req.entrypoint = Some("other.sh".into());
        let o = on(&path, &engine, r).await;
        assert_eq!(o.status, Status::Ok, "bash on {path}: {o:?}");
        let (out, marker) = o
            .stdout
            .split_at(o.stdout.rfind("pre-started").expect("marker"));
        let Some(want) = &cold else {
            let head = "4 [x y it's  a\n$(id)`id`'\\] main.sh /usr/bin/bash 1 1 unset hB /work main.sh\n0 1 2 255\n";
            assert!(out.starts_with(head), "{out}");
            assert_eq!(marker, "pre-started: 0\n", "cold");
            cold = Some(out.to_string());
            continue;
        };
        for (a, b) in out.lines().zip(want.lines()) {
            assert_eq!(a, b, "{path} against cold");
        }
        assert_eq!(out, want, "{path} against cold");
        assert_eq!(marker, "pre-started: 1\n", "{path}");
        let o = on(&path, &engine, other).await;
        assert_eq!(o.status, Status::Ok, "bash on {path}, other.sh: {o:?}");
        assert_eq!(
            o.stdout.replace("other.sh", "main.sh"),
            format!("{want}pre-started: 0\n"),
            "{path}, other.sh"
        );
    }
}

/// A pre-started bash that dies before its run (killed from outside here) is not the run's
/// outcome: its init gives the run a fresh program, which runs it as the other path does;
/// on each warm path (the exec fork server's slot, or, where fork servers do not run, a
/// helper-built warm sandbox, whose init feeds its bash the same way). The waiting bash is
/// this engine's alone: its environment carries a marker of its own (the language's, so
/// that the pool's template and the run share it).
#[tokio::test]
async fn a_warm_run_outlives_the_death_of_its_pre_started_bash() {
    let marker = format!("GB_PRESTART_TEST=gone-{}", std::process::id());
    let mut bash = gearbox_core::LanguageTable::builtin()
        .get("bash")
        .expect("bash is built in")
        .clone();
    let (k, v) = marker.split_once('=').expect("a variable");
    bash.env.insert(k.into(), v.into());
    let engine = crate::support::engine_with_language("bash", bash, 1);
    let path = warm_path("bash");
    wait_warm(&path, &engine).await;
    // The waiting bash: its environment has the marker and names its start-up pipe. A
    // sandbox is ready once its program is forked, which may exec bash a moment later.
    let waiting = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .filter(|pid: &i32| {
                let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                let vars: Vec<&[u8]> = environ.split(|&b| b == 0).collect();
                vars.contains(&marker.as_bytes())
                    && vars
                        .iter()
                        .any(|v| v.starts_with(b"BASH_ENV=/proc/self/fd/"))
            })
            .collect()
    };
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while waiting().is_empty() && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let waiting = waiting();
    assert_eq!(
        waiting.len(),
        1,
        "{path}: one pre-started bash: {waiting:?}"
    );
    // SAFETY: signals the process found above.
    unsafe { libc::kill(waiting[0], libc::SIGKILL) };
    // Dead before the run comes (a zombie until its init reaps it): a signal is delivered
    // at the process's pace, and a bash still dying when init looks is fed and dies in the
    // run, as a program killed at its start would on any path.
    let dead = || {
        std::fs::read_to_string(format!("/proc/{}/stat", waiting[0])).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    };
    while !dead() {
        assert!(
            std::time::Instant::now() < until,
            "{path}: the bash did not die"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let o = on(
        &path,
        &engine,
        run("bash", "echo \"fine $# $*\"").args(&["a b"]),
    )
    .await;
    assert_eq!(
        (o.status, o.stdout.as_str()),
        (Status::Ok, "fine 1 a b\n"),
        "{path}: {o:?}"
    );
}
