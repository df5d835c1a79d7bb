//! The escape suite against sandboxes forked by the Python and Node fork servers, each run
//! checked to have been served by one (one pool hit per run). Runs of one fork server share
//! only its read-only root and its user namespace; two of them at once must not see each
//! other, and a program holds no open file of its fork server.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use gearbox_core::{ExecRequest, LimitOverrides, Outcome, Status};
use gearbox_engine::{Config, Engine, PoolConfig};

use crate::support::{Run, root_and_cgroups, run};

/// An engine whose only pool is `language`'s, served by its fork server.
pub(crate) fn forked_engine_for(language: &str, min: usize) -> Arc<Engine> {
    let _g = crate::support::runtime().enter();
    let config = Config {
        pool: PoolConfig::only([(language.to_string(), min)]),
        ..Config::default()
    };
    Arc::new(Engine::new(config, crate::support::gearbox_bin()))
}

fn forked_engine(min: usize) -> Arc<Engine> {
    forked_engine_for("python", min)
}

/// The stats of the engine's one pool (of runs without network).
fn python_stats(engine: &Engine) -> gearbox_engine::PoolStats {
    let stats: Vec<_> = engine
        .pool_stats()
        .into_iter()
        .filter(|s| !s.network)
        .collect();
    assert_eq!(stats.len(), 1, "{stats:?}");
    stats.into_iter().next().expect("one pool")
}

/// Whether the engine's pool (of runs without network) exists yet.
fn has_pool(engine: &Engine) -> bool {
    engine.pool_stats().iter().any(|s| !s.network)
}

/// Wait until `n` forked sandboxes are ready. (A fresh engine's pool appears once its start
/// delay has passed: `[pool] start_delay_ms`.)
pub(crate) async fn ready(engine: &Engine, n: usize) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if !has_pool(engine) {
            assert!(
                std::time::Instant::now() < until,
                "no pool after 30 s: {:?}",
                engine.pool_stats()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let s = python_stats(engine);
        assert!(s.fork_server, "the fork server was given up: {s:?}");
        if s.ready >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "no warm sandbox after 30 s: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn exec(engine: &Arc<Engine>, req: ExecRequest) -> Outcome {
    let e = Arc::clone(engine);
    crate::support::runtime()
        .spawn(async move { e.execute(req, None).await })
        .await
        .expect("run task")
}

/// Run `r` in a forked sandbox and check that it was one.
pub(crate) async fn forked(engine: &Arc<Engine>, r: Run) -> Outcome {
    ready(engine, 1).await;
    let before = python_stats(engine).hits;
    let o = exec(engine, r.req).await;
    let after = python_stats(engine).hits;
    assert_eq!(after, before + 1, "not served by the fork server: {o:?}");
    o
}

/// The engine of a Python fork server keeping `min` forked sandboxes ready, or `None` when
/// this host cannot run fork servers (skipped, or a failure under `GEARBOX_SANDBOX_REQUIRED`).
fn python_engine(min: usize) -> Option<Arc<Engine>> {
    root_and_cgroups("fork server tests").then(|| forked_engine(min))
}

/// The same for Node's fork server.
fn node_engine(min: usize) -> Option<Arc<Engine>> {
    root_and_cgroups("fork server tests").then(|| forked_engine_for("javascript", min))
}

/// Run `r` in a forked sandbox, check that it ended well, and return its output.
pub(crate) async fn forked_ok(engine: &Arc<Engine>, r: Run) -> String {
    let o = forked(engine, r).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    o.stdout
}

/// A host file holding a secret (`TOP-SECRET-HOST-DATA`), named after `name` and this
/// process; the caller removes it.
fn plant(name: &str) -> std::path::PathBuf {
    let planted = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    std::fs::write(&planted, "TOP-SECRET-HOST-DATA").expect("plant");
    planted
}

/// A listener on the host's loopback that no one should reach, and its port.
fn host_listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    (listener, port)
}

/// A Python program's prelude giving it libc through ctypes.
const PY_LIBC: &str = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n";

// Ordinary behaviour: argv, stdin, files, exit codes, tracebacks, a fresh workspace.

#[tokio::test]
async fn forked_python_sees_its_argv_stdin_files_and_a_fresh_workspace() {
    let Some(engine) = python_engine(2) else {
        return;
    };
    for _ in 0..2 {
        let o = forked(
            &engine,
            run("python", "import sys, os\nprint(sys.argv, sys.orig_argv[1:], os.getcwd(), sys.stdin.read(), open('data/x.txt').read(), sorted(os.listdir('.')))\nopen('state', 'a').write('x')")
                .args(&["a"])
                .stdin("in")
                .file("data/x.txt", "file"),
        )
        .await;
        assert_eq!(
            o.stdout, "['main.py', 'a'] ['-s', 'main.py', 'a'] /work in file ['data', 'main.py']\n",
            "{o:?}"
        );
    }
}

#[tokio::test]
async fn forked_python_reports_its_exit_code() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(&engine, run("python", "import sys\nsys.exit(3)")).await;
    assert_eq!((o.status, o.exit_code), (Status::Error, Some(3)), "{o:?}");
}

#[tokio::test]
async fn forked_python_reports_a_system_exit_message() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(&engine, run("python", "raise SystemExit('bye')")).await;
    assert_eq!(
        (o.exit_code, o.stderr.as_str()),
        (Some(1), "bye\n"),
        "{o:?}"
    );
}

#[tokio::test]
async fn forked_python_runs_atexit_handlers_after_its_threads() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        run(
            "python",
            "import atexit, threading, time\natexit.register(lambda: print('atexit'))\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()",
        ),
    )
    .await;
    assert_eq!(o.stdout, "thread\natexit\n", "{o:?}");
}

#[tokio::test]
async fn forked_python_prints_tracebacks_of_its_main_file() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(&engine, run("python", "def f():\n    1/0\nf()")).await;
    assert!(
        o.stderr
            .starts_with("Traceback (most recent call last):\n  File \"/work/main.py\""),
        "{o:?}"
    );
    assert!(o.stderr.ends_with("ZeroDivisionError: division by zero\n"));
}

#[tokio::test]
async fn forked_python_reports_the_signal_that_ended_it() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(&engine, run("python", "import os\nos.abort()")).await;
    assert_eq!(o.signal, Some(libc::SIGABRT), "{o:?}");
}

// Host files, writes outside the workspace, the host's loopback, DNS.

#[tokio::test]
async fn forked_python_cannot_read_host_files() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let planted = plant("gearbox-fork-planted");
    let p = planted.display();
    let code = format!(
        r#"for p in ['{p}', '/proc/1/root{p}', '/proc/self/root{p}']:
    try:
        print(open(p).read())
    except OSError as e:
        print('denied', type(e).__name__)
"#
    );
    let o = forked(&engine, run("python", &code)).await;
    let _ = std::fs::remove_file(&planted);
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_absent(&o.stdout, &["TOP-SECRET"]);
    assert_eq!(o.stdout.matches("denied").count(), 3, "{}", o.stdout);
}

#[tokio::test]
async fn forked_python_cannot_write_outside_its_workspace() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = r#"for p in ['/usr/gx', '/etc/gx', '/gx', '/.gearbox/gx', '/.gearbox/launcher', '/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger', '/dev/gx']:
    try:
        open(p, 'a').write('x'); print('WROTE', p)
    except OSError as e:
        print('refused', p)
for p in ['/work/ok', '/tmp/ok', '/dev/shm/ok', '/dev/null']:
    open(p, 'w').write('fine')
"#;
    let stdout = forked_ok(&engine, run("python", code)).await;
    assert_absent(&stdout, &["WROTE"]);
    assert_eq!(stdout.matches("refused").count(), 8, "{}", stdout);
}

#[tokio::test]
async fn forked_python_sees_none_of_the_hosts_directories() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let stdout = forked_ok(
        &engine,
        run("python", "import os\nprint(sorted(os.listdir('/')))"),
    )
    .await;
    for hidden in ["'root'", "'home'", "'var'", "'run'", "'sys'", "'boot'"] {
        assert!(!stdout.contains(hidden), "{hidden} visible: {}", stdout);
    }
}

#[tokio::test]
async fn forked_python_cannot_reach_the_hosts_loopback() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let (listener, port) = host_listener();
    let code = format!(
        r#"import socket
s = socket.socket(); s.settimeout(2)
try:
    s.connect(('127.0.0.1', {port})); print('CONNECTED')
except OSError as e:
    print('no host loopback')
"#
    );
    let stdout = forked_ok(&engine, run("python", &code)).await;
    assert_absent(&stdout, &["CONNECTED"]);
    assert!(listener.accept().is_err(), "the sandbox reached the host");
}

#[tokio::test]
async fn forked_python_cannot_resolve_names() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = r#"import socket
try:
    socket.getaddrinfo('example.com', 80); print('RESOLVED')
except OSError:
    print('no dns')
"#;
    let stdout = forked_ok(&engine, run("python", code)).await;
    assert_absent(&stdout, &["RESOLVED"]);
}

// No privileges, no namespaces or mounts, the seccomp policy, other processes invisible.

#[tokio::test]
async fn forked_python_holds_no_privilege() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = r#"status = open('/proc/self/status').read()
for key in ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'CapInh', 'NoNewPrivs', 'Seccomp']:
    print([l for l in status.splitlines() if l.startswith(key + ':')][0])
"#;
    let stdout = forked_ok(&engine, run("python", code)).await;
    assert_restricted(&stdout);
}

#[tokio::test]
async fn forked_python_cannot_unshare_or_mount() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = format!(
        "{PY_LIBC}print('unshare', libc.unshare(0x10000000), 'mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None))\n"
    );
    let stdout = forked_ok(&engine, run("python", &code)).await;
    assert!(stdout.contains("unshare -1 mount -1"), "{}", stdout);
}

#[tokio::test]
async fn forked_python_is_refused_the_dangerous_system_calls() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = format!(
        r#"{PY_LIBC}calls = {{'ptrace': (101, 0, 0, 0, 0), 'bpf': (321, 0, 0, 0), 'keyctl': (250, 0, 0, 0),
         'userfaultfd': (323, 0), 'io_uring_setup': (425, 1, 0), 'setns': (308, 0, 0),
         'sethostname': (170, 0, 0), 'open_by_handle_at': (304, -100, 0, 0)}}
for name, args in calls.items():
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    print(name, 'ALLOWED' if r >= 0 else 'refused')
"#
    );
    let stdout = forked_ok(&engine, run("python", &code)).await;
    assert_absent(&stdout, &["ALLOWED"]);
}

#[tokio::test]
async fn forked_python_gets_the_answers_of_the_system_call_policy() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = format!(
        r#"{PY_LIBC}# Answers only the seccomp policy gives (without it: EFAULT, a new keyring, EFAULT).
for name, args in {{'io_uring_setup': (425, 1, 0), 'keyctl': (250, 0, -1, 1), 'clone3': (435, 0, 0)}}.items():
    ctypes.set_errno(0)
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    print(name, 'errno', ctypes.get_errno() if r < 0 else 'none')
"#
    );
    let stdout = forked_ok(&engine, run("python", &code)).await;
    // The policy's two parts (the fork server's, inherited, and the program's own): EPERM
    // and ENOSYS from the filters, not what the kernel would answer without them.
    for line in [
        "io_uring_setup errno 1",
        "keyctl errno 1",
        "clone3 errno 38",
    ] {
        assert!(stdout.contains(line), "{line}: {}", stdout);
    }
}

#[tokio::test]
async fn forked_python_sees_no_process_but_its_own() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = r#"import os
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
print('pids', pids, os.getpid(), os.getppid())
for p in pids:
    try:
        open(f'/proc/{p}/mem', 'rb').read(1); print('MEM', p)
    except OSError:
        pass
"#;
    let stdout = forked_ok(&engine, run("python", code)).await;
    assert_absent(&stdout, &["MEM"]);
    // pid 1 (the run's init), the program and its keeper: nothing of the fork server or
    // other runs.
    assert!(stdout.contains("pids [1, 2, 3] 2 1"), "{}", stdout);
}

/// What a program says of its keeper (pid 3) holds everything the program is held by, no
/// descriptor and no signal, and that killing it left the program running: the lines the
/// Python and Node checks below print.
fn assert_keeper_holds_nothing(stdout: &str) {
    assert!(stdout.contains("name gb-keeper parent 2\n"), "{stdout}");
    assert_absent(stdout, &["DIFFER", "SIGNALS"]);
    for line in [
        "Seccomp same",
        "Seccomp_filters same",
        "NoNewPrivs same",
        "caps 0000000000000000 0000000000000000",
        "blocked all",
        "fds []",
        "mounts same",
        "cgroup same",
        "still here",
    ] {
        assert!(stdout.contains(line), "{line}: {stdout}");
    }
}

/// The program's keeper (`launchers/fork/serve.rs`: it shares the program's memory so that
/// the program's exit does not wait for its teardown) is held by everything the program is
/// held by, keeps no descriptor, takes no signal, is not the program's to wait for, and
/// killing it harms nothing.
#[tokio::test]
async fn forked_python_keeper_holds_nothing_the_program_lacks() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = r#"import os, signal
def status(pid):
    return dict(l.split(':', 1) for l in open(f'/proc/{pid}/status').read().splitlines())
me, keeper = status('self'), status(3)
print('name', keeper['Name'].strip(), 'parent', keeper['PPid'].strip())
for key in ['Seccomp', 'Seccomp_filters', 'NoNewPrivs', 'CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'Cpus_allowed_list']:
    print(key, 'same' if me[key] == keeper[key] else f'DIFFERS {me[key]} {keeper[key]}')
print('caps', keeper['CapEff'].strip(), keeper['CapBnd'].strip())
blocked = int(keeper['SigBlk'], 16)
print('blocked all' if blocked | (1 << 8) | (1 << 18) == (1 << 64) - 1 else f'SIGNALS {blocked:x}')
print('fds', os.listdir('/proc/3/fd'))
print('mounts', 'same' if open('/proc/3/mountinfo').read() == open('/proc/self/mountinfo').read() else 'DIFFER')
print('cgroup', 'same' if open('/proc/3/cgroup').read() == open('/proc/self/cgroup').read() else 'DIFFER')
try:
    os.wait(); print('WAITED')
except ChildProcessError:
    print('nothing to wait for')
os.kill(3, signal.SIGKILL)
print('still here')
"#;
    let stdout = forked_ok(&engine, run("python", code)).await;
    assert_keeper_holds_nothing(&stdout);
    assert_absent(&stdout, &["WAITED"]);
    assert!(stdout.contains("nothing to wait for"), "{stdout}");
    // The next run of the same fork server has a keeper of its own, as bare.
    let stdout = forked_ok(
        &engine,
        run(
            "python",
            "import os\nprint(sorted(os.listdir('/proc/3/fd')), open('/proc/3/comm').read())",
        ),
    )
    .await;
    assert_eq!(stdout, "[] gb-keeper\n\n");
}

/// The same for Node's fork server's programs.
#[tokio::test]
async fn node_forked_program_keeper_holds_nothing_the_program_lacks() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let code = r#"const fs = require('fs');
const status = (pid) => Object.fromEntries(fs.readFileSync(`/proc/${pid}/status`, 'utf8')
  .split('\n').filter((l) => l.includes(':')).map((l) => [l.slice(0, l.indexOf(':')), l.slice(l.indexOf(':') + 1)]));
const me = status('self'), keeper = status(3);
console.log('name', keeper.Name.trim(), 'parent', keeper.PPid.trim());
for (const key of ['Seccomp', 'Seccomp_filters', 'NoNewPrivs', 'CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'Cpus_allowed_list'])
  console.log(key, me[key] === keeper[key] ? 'same' : `DIFFERS ${me[key]} ${keeper[key]}`);
console.log('caps', keeper.CapEff.trim(), keeper.CapBnd.trim());
const blocked = BigInt('0x' + keeper.SigBlk.trim());
console.log((blocked | (1n << 8n) | (1n << 18n)) === (1n << 64n) - 1n ? 'blocked all' : `SIGNALS ${blocked.toString(16)}`);
console.log('fds', JSON.stringify(fs.readdirSync('/proc/3/fd')));
const same = (f) => fs.readFileSync(`/proc/3/${f}`, 'utf8') === fs.readFileSync(`/proc/self/${f}`, 'utf8') ? 'same' : 'DIFFER';
console.log('mounts', same('mountinfo'));
console.log('cgroup', same('cgroup'));
process.kill(3, 'SIGKILL');
console.log('still here');
"#;
    let stdout = forked_ok(&engine, js(code)).await;
    assert_keeper_holds_nothing(&stdout);
}

#[tokio::test]
async fn forked_python_environment_holds_nothing_of_the_host() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = r#"import os
env = open('/proc/self/environ', 'rb').read()
try:
    env += open('/proc/1/environ', 'rb').read()
except OSError:
    print('init environ refused')
print('LEAK' if b'CARGO' in env or b'RUST' in env else 'env clean', sorted(os.environ))
"#;
    let stdout = forked_ok(&engine, run("python", code)).await;
    assert_absent(&stdout, &["LEAK"]);
    assert!(stdout.contains("init environ refused"), "{}", stdout);
}

#[tokio::test]
async fn forked_python_runs_at_the_normal_priority() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let stdout = forked_ok(
        &engine,
        run(
            "python",
            "import os\nprint('nice', os.getpriority(os.PRIO_PROCESS, 0))",
        ),
    )
    .await;
    // Built at a lower priority, run at the normal one (as a cold run).
    assert!(stdout.contains("nice 0"), "{}", stdout);
}

/// Two runs at once from the same fork server: no shared files, loopback, abstract
/// sockets, processes, or signals.
#[tokio::test]
async fn forked_python_runs_at_once_cannot_reach_each_other() {
    let Some(engine) = python_engine(2) else {
        return;
    };
    ready(&engine, 2).await;
    let holder = r#"import os, socket, time
open('/tmp/secret', 'w').write('RUN-A-SECRET'); open('/work/secret', 'w').write('RUN-A-SECRET')
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind(('127.0.0.1', 47611)); srv.listen()
ab = socket.socket(socket.AF_UNIX); ab.bind('\0gearbox-run-a'); ab.listen()
print('holding', flush=True)
time.sleep(3)
print('alive')
"#;
    let prober = r#"import os, socket, time, signal
time.sleep(0.8)
for p in ['/tmp/secret', '/work/secret', '/dev/shm/secret']:
    try:
        print('READ', open(p).read())
    except OSError:
        print('no', p)
try:
    socket.create_connection(('127.0.0.1', 47611), timeout=1); print('CONNECTED')
except OSError:
    print('no tcp')
try:
    s = socket.socket(socket.AF_UNIX); s.connect('\0gearbox-run-a'); print('ABSTRACT')
except OSError:
    print('no abstract')
print('pids', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
# 3 is its own keeper.
for pid in range(4, 400):
    try:
        os.kill(pid, signal.SIGKILL); print('KILLED', pid)
    except OSError:
        pass
"#;
    let before = python_stats(&engine).hits;
    let (a, b) = tokio::join!(
        exec(&engine, run("python", holder).timeout_ms(10_000).req),
        exec(&engine, run("python", prober).timeout_ms(10_000).req)
    );
    assert_eq!(python_stats(&engine).hits, before + 2, "{a:?} {b:?}");
    assert_eq!(a.stdout, "holding\nalive\n", "{a:?}");
    assert_eq!(b.status, Status::Ok, "{b:?}");
    assert_absent(&b.stdout, &["READ", "CONNECTED", "ABSTRACT", "KILLED"]);
    assert!(b.stdout.contains("pids [1, 2, 3]"), "{}", b.stdout);
}

// Limits: memory, processes, disk, CPU time, wall clock, output.

#[tokio::test]
async fn forked_python_is_killed_at_its_memory_limit() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        run(
            "python",
            "b = []\nwhile True:\n    b.append(bytearray(16 << 20))",
        )
        .limits(LimitOverrides::default()),
    )
    .await;
    assert_eq!(o.status, Status::Killed, "{o:?}");
    assert!(
        o.reason.as_deref().unwrap_or("").contains("memory"),
        "{o:?}"
    );
}

#[tokio::test]
async fn forked_python_cannot_fork_past_its_process_limit() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        run("python", "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)"),
    )
    .await;
    assert!(o.stdout.starts_with("stopped"), "{o:?}");
    let n: u64 = o
        .stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX);
    assert!(n < 200, "{o:?}");
}

#[tokio::test]
async fn forked_python_cannot_write_past_its_disk_limit() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        run("python", "f = open('/tmp/fill', 'wb')\ntry:\n    while True:\n        f.write(b'x' * (1 << 20)); f.flush()\nexcept OSError as e:\n    print('full', e.errno)"),
    )
    .await;
    assert!(o.stdout.starts_with("full"), "{o:?}");
}

#[tokio::test]
async fn forked_python_busy_loop_is_stopped_at_its_deadline() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        run("python", "while True:\n    pass").timeout_ms(1500),
    )
    .await;
    assert_stopped_in_time(&o);
}

#[tokio::test]
async fn forked_python_output_is_truncated_at_its_limit() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        run(
            "python",
            "import sys\nwhile True:\n    sys.stdout.write('flood' * 1000)",
        )
        .timeout_ms(1500),
    )
    .await;
    assert!(o.stdout_truncated, "{o:?}");
}

/// Escapes by setsid and double fork (`sleep marker`) die with the run, which ends with
/// `tail` and `status`.
async fn escapees_die_with_the_run(marker: &str, tail: &str, status: Status) {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let code = format!(
        "import subprocess, os\nsubprocess.Popen(['setsid', 'sleep', '{marker}'])\nif os.fork() == 0:\n    if os.fork() == 0:\n        os.setsid(); os.execvp('sleep', ['sleep', '{marker}'])\n    os._exit(0)\nimport time\ntime.sleep(0.3)\n{tail}"
    );
    let o = forked(&engine, run("python", &code).timeout_ms(1500)).await;
    assert_eq!(o.status, status, "{o:?}");
    let survivors =
        crate::support::survivors_after(&format!("sleep {marker}"), Duration::from_secs(3)).await;
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
}

#[tokio::test]
async fn forked_python_escapees_die_when_it_exits() {
    escapees_die_with_the_run("31.4161", "print('done')", Status::Ok).await;
}

#[tokio::test]
async fn forked_python_escapees_die_at_its_deadline() {
    escapees_die_with_the_run("27.1829", "import time\ntime.sleep(60)", Status::Timeout).await;
}

/// A leftover that holds no descriptor (`sleep marker`, started by `code`, which prints
/// `done`) outlives the early kill of a finished run (init spares what cannot reach the run's
/// pipes, so that the program's keeper holds its address space until the answer is out) but
/// not the run: it dies when the server kills init after the answer. The next run of the fork
/// server (`pids`, which prints the pids it sees) sees only its own init, program and keeper.
async fn leftover_without_descriptors_dies(
    engine: &Arc<Engine>,
    language: &str,
    code: &str,
    marker: &str,
    pids: &str,
) {
    let o = forked(engine, run(language, code)).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "done\n", "{o:?}");
    let survivors =
        crate::support::survivors_after(&format!("sleep {marker}"), Duration::from_secs(3)).await;
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
    assert_eq!(forked_ok(engine, run(language, pids)).await, "1 2 3\n");
}

#[tokio::test]
async fn forked_python_leftovers_without_descriptors_die_after_the_answer() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    // `done` once the leftover runs with no descriptor (init's scan must find it so).
    let code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        \
                os.closerange(0, 1 << 20)\n        os.execvp('sleep', ['sleep', '36.9112'])\n    \
                os._exit(0)\nos.wait()\n\
                def fdless():\n    for p in filter(str.isdigit, os.listdir('/proc')):\n        try:\n            \
                if b'36.9112' in open(f'/proc/{p}/cmdline', 'rb').read() and not os.listdir(f'/proc/{p}/fd'):\n                \
                return True\n        except OSError:\n            pass\n    return False\n\
                t = time.time()\nwhile not fdless() and time.time() - t < 5:\n    time.sleep(0.01)\n\
                print('done' if fdless() else 'not started')";
    let pids = "import os\nprint(*sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))";
    leftover_without_descriptors_dies(&engine, "python", code, "36.9112", pids).await;
}

#[tokio::test]
async fn node_forked_leftovers_without_descriptors_die_after_the_answer() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    // `done` once the leftover runs with no descriptor (init's scan must find it so). The
    // leftover is `sleep` itself: `setsid`, run by a process group leader, forks it and exits,
    // and was seen, fd-less, for that moment (a flaky pass once).
    let code = "const fs = require('fs');\nconst { spawn } = require('child_process');\n\
                spawn('sh', ['-c', 'exec setsid sleep 37.4159 0<&- 1>&- 2>&-'], \
                { stdio: 'ignore', detached: true }).unref();\n\
                const fdless = () => fs.readdirSync('/proc').filter((p) => /^\\d+$/.test(p)).some((p) => { try { \
                return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1') === 'sleep\\x0037.4159\\x00' \
                && fs.readdirSync(`/proc/${p}/fd`).length === 0; } catch { return false; } });\n\
                const t = Date.now();\nwhile (!fdless() && Date.now() - t < 5000) \
                Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);\n\
                console.log(fdless() ? 'done' : 'not started');";
    let pids = "console.log(require('fs').readdirSync('/proc').filter((p) => /^\\d+$/.test(p))\
                .map(Number).sort((a, b) => a - b).join(' '))";
    leftover_without_descriptors_dies(&engine, "javascript", code, "37.4159", pids).await;
}

/// Killing everything it can see harms only itself; the fork server keeps serving.
#[tokio::test]
async fn forked_python_killing_all_it_sees_harms_only_itself() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    let o = forked(&engine, run("python", "import os, signal\nfor p in (1, os.getppid(), -1):\n    try:\n        os.kill(p, signal.SIGKILL)\n    except OSError as e:\n        print('refused', p)\nprint('still here')")).await;
    assert!(matches!(o.status, Status::Ok | Status::Error), "{o:?}");
    let o = forked(&engine, run("python", "print('next')")).await;
    assert_eq!(o.stdout, "next\n", "{o:?}");
    assert!(python_stats(&engine).fork_server);
}

/// A program holds no descriptor to its supervisors: a forged end written to every fd it
/// has changes nothing (`integrity.rs` checks this on every path), and what the run left
/// running dies with it.
#[tokio::test]
async fn forked_python_cannot_forge_its_end() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    ready(&engine, 1).await;
    let code = "import json, os, subprocess\nsubprocess.Popen(['setsid', 'sleep', '42.3187'])\n\
         print('forged', flush=True)\nfor fd in range(3, 256):\n    try:\n        \
         os.write(fd, json.dumps({'code': 7, 'cpu_time_ms': 0, 'max_rss_kb': 0}).encode())\n    \
         except OSError:\n        pass\nprint('went on')\nraise SystemExit(5)";
    let o = forked(&engine, run("python", code).timeout_ms(20_000)).await;
    assert_eq!(
        (o.exit_code, o.stdout.as_str()),
        (Some(5), "forged\nwent on\n"),
        "{o:?}"
    );
    let survivors = crate::support::survivors_after("sleep 42.3187", Duration::from_secs(3)).await;
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
}

/// A finished run's cgroup is emptied: removed, or kept empty for a later run (found from
/// the host through a process of the run).
#[tokio::test]
async fn forked_python_cgroup_is_emptied_when_it_ends() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    ready(&engine, 1).await;
    let (o, dirs) = run_in_cgroup(&engine, "sleep 1.4142", "").await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_emptied(&dirs).await;
}

/// A cancelled call (the future dropped mid-run) takes its sandbox with it.
#[tokio::test]
async fn forked_python_cancelled_call_takes_its_sandbox_with_it() {
    let Some(engine) = python_engine(1) else {
        return;
    };
    ready(&engine, 1).await;
    let marker = "sleep 41.2719";
    let req = run(
        "python",
        &format!("import subprocess\nsubprocess.Popen(['setsid', 'sleep', '41.2719'])\nsubprocess.run(['{marker}'], shell=True)"),
    )
    .timeout_ms(20_000)
    .req;
    let e = Arc::clone(&engine);
    let task = crate::support::runtime().spawn(async move { e.execute(req, None).await });
    crate::support::until_running(marker, &task).await;
    task.abort();
    let survivors = crate::support::survivors_after(marker, Duration::from_secs(3)).await;
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
}

/// None of `markers` (what a program prints when an escape worked) is in `stdout`.
pub(crate) fn assert_absent(stdout: &str, markers: &[&str]) {
    for bad in markers {
        assert!(!stdout.contains(bad), "{bad}: {stdout}");
    }
}

/// A run that would go on forever was stopped, by its deadline or its memory limit, soon
/// after its 1.5 s deadline.
fn assert_stopped_in_time(o: &Outcome) {
    assert!(
        matches!(o.status, Status::Timeout | Status::Killed),
        "{o:?}"
    );
    assert!(o.duration_ms < 4000, "{o:?}");
}

/// The /proc/self/status lines a program printed: no capability in any set, no_new_privs,
/// seccomp filtering.
pub(crate) fn assert_restricted(stdout: &str) {
    for cap in ["CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"] {
        assert!(
            stdout.contains(&format!("{cap}:\t0000000000000000")),
            "{cap} not empty: {stdout}"
        );
    }
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
    assert!(stdout.contains("Seccomp:\t2"), "{stdout}");
}

/// Run a Python program that runs `marker` (a `sleep` command) after `before`, and find
/// the run's cgroup from the host through that process: the outcome and the cgroup's dirs.
async fn run_in_cgroup(
    engine: &Arc<Engine>,
    marker: &str,
    before: &str,
) -> (Outcome, Vec<std::path::PathBuf>) {
    let req = run(
        "python",
        &format!("{before}\nimport subprocess\nsubprocess.run(['{marker}'], shell=True)"),
    )
    .timeout_ms(20_000)
    .req;
    let e = Arc::clone(engine);
    let task = crate::support::runtime().spawn(async move { e.execute(req, None).await });
    let t = std::time::Instant::now();
    let dirs = loop {
        let found = crate::support::host_processes_with(marker);
        if let Some(pid) = found.first().and_then(|p| p.split(':').next()) {
            break crate::cgroups::gearbox_cgroups_of(pid.parse().expect("pid"));
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the run never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        !dirs.is_empty() && dirs.iter().all(|d| d.exists()),
        "{dirs:?}"
    );
    (task.await.expect("run task"), dirs)
}

/// Within 5 s, each of `dirs` is gone or holds no process.
async fn assert_emptied(dirs: &[std::path::PathBuf]) {
    let t = std::time::Instant::now();
    while dirs.iter().any(|d| {
        std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
    }) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "left behind: {dirs:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Finished runs' emptied cgroups may serve later runs (v1 hosts), and each run's memory
/// figures are its own: a run after one that held 80 MiB, or after one killed for memory,
/// reports only itself.
#[tokio::test]
async fn cgroups_of_finished_runs_carry_nothing_to_later_runs() {
    if !root_and_cgroups("cgroup reuse") {
        return;
    }
    // A memory limit of its own: kept cgroups are shared by every engine of this process,
    // and other tests' slots would take them.
    let engine = {
        let _g = crate::support::runtime().enter();
        let mut config = Config {
            pool: PoolConfig::only([("python".to_string(), 1)]),
            ..Config::default()
        };
        config.limits.memory_mb = 509;
        Arc::new(Engine::new(config, crate::support::gearbox_bin()))
    };
    let mut seen = std::collections::HashSet::new();
    let mut reused = 0;
    for i in 0..6 {
        ready(&engine, 1).await;
        let big = i % 2 == 0;
        let before = if big { "x = b'x' * (80 << 20)" } else { "" };
        let (o, dirs) = run_in_cgroup(&engine, &format!("sleep 0.1{i}7"), before).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        let peak = o.usage.peak_memory_kb.expect("a peak from the cgroup");
        if big {
            assert!(peak >= 80 << 10, "{peak} KiB: {o:?}");
        } else {
            assert!(peak < 20 << 10, "carried over: {peak} KiB: {o:?}");
        }
        assert_emptied(&dirs).await;
        if !seen.insert(dirs) {
            reused += 1;
        }
        // The slot built next (now) finds this run's cgroup kept.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Whether a cgroup was kept in time for the next slot depends on the machine's load (a
    // finished run's cgroup must empty within 250 ms): reuse is an optimization, measured in
    // bench/, not asserted here. What must hold whether or not it was reused is above.
    eprintln!("{reused} of 6 runs reused a cgroup");
    // A run killed for memory leaves nothing to the next ones.
    let o = forked(
        &engine,
        run(
            "python",
            "b = []\nwhile True:\n    b.append(b'x' * (16 << 20))",
        ),
    )
    .await;
    assert_eq!(o.status, Status::Killed, "{o:?}");
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let o = forked(&engine, run("python", "print(1)")).await;
        assert_eq!((o.status, o.stdout.as_str()), (Status::Ok, "1\n"), "{o:?}");
        assert!(
            o.usage.peak_memory_kb.is_some_and(|kb| kb < 20 << 10),
            "{o:?}"
        );
    }
}

/// The pairs (program fd, fork server fd) that name the same open file, from the host
/// (kcmp), for the run whose process `child_pid` is a child of the program.
fn shared_with_fork_server(child_pid: &str) -> (Vec<(i32, i32)>, usize) {
    let ppid = |pid: &str| -> String {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("PPid:").map(|p| p.trim().to_string()))
            .unwrap_or_default()
    };
    let program = ppid(child_pid);
    let server = ppid(&ppid(&program));
    let comm = std::fs::read_to_string(format!("/proc/{server}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "gb-zygote", "not the fork server: {server}");
    let fds = |pid: &str| -> Vec<i32> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let (mine, theirs) = (fds(&program), fds(&server));
    assert!(!mine.is_empty() && !theirs.is_empty(), "{program} {server}");
    let (p, z): (i32, i32) = (program.parse().unwrap_or(0), server.parse().unwrap_or(0));
    let mut shared = Vec::new();
    for &a in &mine {
        for &b in &theirs {
            // SAFETY: kcmp takes integers; KCMP_FILE (0) compares two processes' files.
            if unsafe { libc::syscall(libc::SYS_kcmp, p, z, 0, a, b) } == 0 {
                shared.push((a, b));
            }
        }
    }
    (shared, mine.len())
}

/// Run `code` (which starts `marker` as a child and waits for it) and, while it runs, list
/// the files its program shares with the fork server.
pub(crate) async fn shared_files(
    engine: &Arc<Engine>,
    language: &str,
    code: &str,
    marker: &str,
) -> Vec<(i32, i32)> {
    ready(engine, 1).await;
    let req = run(language, code).timeout_ms(20_000).req;
    let e = Arc::clone(engine);
    let task = crate::support::runtime().spawn(async move { e.execute(req, None).await });
    let t = std::time::Instant::now();
    let (shared, count) = loop {
        let found = crate::support::host_processes_with(marker);
        if let Some(pid) = found.first().and_then(|p| p.split(':').next()) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            break shared_with_fork_server(pid);
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the run never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let o = task.await.expect("run task");
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(count >= 3, "{count}");
    shared
}

#[tokio::test]
async fn forked_programs_hold_no_file_of_the_fork_server() {
    if !root_and_cgroups("fork server tests") {
        return;
    }
    // Node's event loop and its platform's threads hold epoll instances, eventfds and pipes
    // in the fork server: none of them may reach a program.
    for (language, code, marker) in [
        (
            "python",
            "import subprocess\nsubprocess.run(['sleep 1.7321'], shell=True)",
            "sleep 1.7321",
        ),
        (
            "javascript",
            "require('child_process').spawnSync('/bin/sh', ['-c', 'sleep 1.7322'])",
            "sleep 1.7322",
        ),
    ] {
        let engine = forked_engine_for(language, 1);
        let shared = shared_files(&engine, language, code, marker).await;
        assert!(shared.is_empty(), "{language} program shares {shared:?}");
    }
}
fn js(code: &str) -> Run {
    run("javascript", code)
}

/// The fork server still serves: a later run prints what it should.
async fn assert_still_serving(engine: &Arc<Engine>) {
    let o = forked(engine, js("console.log('next')")).await;
    assert_eq!(o.stdout, "next\n", "{o:?}");
    assert!(python_stats(engine).fork_server);
}

// Ordinary behaviour: argv, stdin, files, identity, a fresh workspace, the environment.

#[tokio::test]
async fn node_forked_program_sees_its_argv_stdin_files_and_a_fresh_workspace() {
    let Some(engine) = node_engine(2) else {
        return;
    };
    for _ in 0..2 {
        let o = forked(
            &engine,
            js("const fs = require('fs');\nconsole.log(JSON.stringify([process.argv.slice(1), process.execArgv, process.cwd(), fs.readFileSync(0, 'utf8'), fs.readFileSync('data/x.txt', 'utf8'), fs.readdirSync('.').sort(), process.pid, process.ppid, Object.keys(process.env).includes('NODE_DISABLE_COLORS')]));\nfs.appendFileSync('state', 'x');")
                .args(&["a"])
                .stdin("in")
                .file("data/x.txt", "file"),
        )
        .await;
        assert_eq!(
            o.stdout,
            "[[\"/work/main.js\",\"a\"],[],\"/work\",\"in\",\"file\",[\"data\",\"main.js\"],2,1,true]\n",
            "{o:?}"
        );
    }
}

/// A way a program ends: its code, its output, nothing after.
async fn node_ends(code: &str, exit: i32, stdout: &str, stderr: &str) {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let o = forked(&engine, js(code)).await;
    assert_eq!(
        (o.exit_code, o.stdout.as_str()),
        (Some(exit), stdout),
        "{code}: {o:?}"
    );
    assert!(o.stderr.contains(stderr), "{code}: {o:?}");
    if !stderr.is_empty() {
        assert!(o.stderr.starts_with("/work/main.js:"), "{code}: {o:?}");
    }
}

#[tokio::test]
async fn node_forked_program_exits_0_after_its_output() {
    node_ends("console.log('x')", 0, "x\n", "").await;
}

#[tokio::test]
async fn node_forked_program_exits_with_its_exit_code() {
    node_ends("process.exitCode = 4", 4, "", "").await;
}

#[tokio::test]
async fn node_forked_program_exit_handlers_run_and_set_the_code() {
    node_ends(
        "process.on('exit', (c) => { console.log('bye', c); process.exitCode = 9 }); process.exit(3)",
        9,
        "bye 3\n",
        "",
    )
    .await;
}

#[tokio::test]
async fn node_forked_program_runs_its_pending_timers() {
    node_ends(
        "setTimeout(() => console.log('later'), 100)",
        0,
        "later\n",
        "",
    )
    .await;
}

#[tokio::test]
async fn node_forked_program_runs_work_scheduled_before_exit() {
    node_ends(
        "process.on('beforeExit', () => { if (!globalThis.n) { globalThis.n = 1; setTimeout(() => console.log('again'), 10) } })",
        0,
        "again\n",
        "",
    )
    .await;
}

#[tokio::test]
async fn node_forked_program_exits_1_on_an_uncaught_exception() {
    node_ends(
        "function f() { throw new Error('boom') }\nf()",
        1,
        "",
        "Error: boom",
    )
    .await;
}

#[tokio::test]
async fn node_forked_program_exits_1_on_an_unhandled_rejection() {
    node_ends(
        "Promise.reject(new Error('rejected'))",
        1,
        "",
        "Error: rejected",
    )
    .await;
}

#[tokio::test]
async fn node_forked_program_runs_exit_handlers_after_a_type_error() {
    node_ends(
        "process.on('exit', () => console.log('exit ran')); null.x",
        1,
        "exit ran\n",
        "TypeError",
    )
    .await;
}

#[tokio::test]
async fn node_forked_program_reports_the_signal_that_ended_it() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let o = forked(&engine, js("process.abort()")).await;
    assert_eq!(o.signal, Some(libc::SIGABRT), "{o:?}");
}

/// Work V8 hands to background threads (garbage collection, WebAssembly compilation) and
/// the thread pool of libuv: a fork has none of the fork server's threads.
#[tokio::test]
async fn node_forked_program_runs_work_on_background_threads() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let code = "let a = []; for (let i = 0; i < 2e6; i++) { a.push({ i }); if (a.length > 1e5) a = [] }\n\
                const wasm = new Uint8Array([0,97,115,109,1,0,0,0,1,7,1,96,2,127,127,1,127,3,2,1,0,7,7,1,3,97,100,100,0,0,10,9,1,7,0,32,0,32,1,106,11]);\n\
                WebAssembly.instantiate(wasm).then(({ instance }) => console.log('wasm', instance.exports.add(2, 3)));\n\
                require('fs').promises.readFile('/etc/hostname').then(() => console.log('fs'));\n\
                require('zlib').gzip('x', () => console.log('zlib'));\n\
                const { Worker } = require('worker_threads');\n\
                new Worker('require(\"worker_threads\").parentPort.postMessage(42)', { eval: true }).on('message', (m) => console.log('worker', m));\n\
                const c = require('child_process').spawn('/bin/echo', ['child']); c.stdout.on('data', (d) => process.stdout.write(d));";
    for _ in 0..3 {
        let o = forked(&engine, js(code).timeout_ms(20_000)).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        let mut lines: Vec<&str> = o.stdout.lines().collect();
        lines.sort();
        assert_eq!(
            lines,
            ["child", "fs", "wasm 5", "worker 42", "zlib"],
            "{o:?}"
        );
    }
}

// Host files, writes outside the workspace, the host's loopback; privileges, seccomp,
// other processes.

#[tokio::test]
async fn node_forked_program_cannot_read_host_files() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let planted = plant("gearbox-fork-node");
    let code = format!(
        r#"const fs = require('fs');
for (const p of ['{p}', '/proc/1/root{p}']) {{ try {{ console.log(fs.readFileSync(p, 'utf8')) }} catch {{ console.log('denied') }} }}
"#,
        p = planted.display(),
    );
    let o = forked(&engine, js(&code)).await;
    let _ = std::fs::remove_file(&planted);
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_absent(&o.stdout, &["TOP-SECRET"]);
    assert_eq!(o.stdout.matches("denied").count(), 2, "{}", o.stdout);
}

#[tokio::test]
async fn node_forked_program_cannot_write_outside_its_workspace() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let code = r#"const fs = require('fs');
for (const p of ['/usr/gx', '/etc/gx', '/.gearbox/gx', '/.gearbox/fork.so', '/proc/sysrq-trigger']) { try { fs.appendFileSync(p, 'x'); console.log('WROTE', p) } catch { console.log('refused') } }
"#;
    let stdout = forked_ok(&engine, js(code)).await;
    assert_absent(&stdout, &["WROTE"]);
    assert_eq!(stdout.matches("refused").count(), 5, "{}", stdout);
}

#[tokio::test]
async fn node_forked_program_holds_no_privilege() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let code = r#"const status = require('fs').readFileSync('/proc/self/status', 'utf8');
for (const key of ['CapEff', 'CapPrm', 'CapBnd', 'CapAmb', 'CapInh', 'NoNewPrivs', 'Seccomp']) console.log(status.split('\n').find((l) => l.startsWith(key + ':')));
"#;
    let stdout = forked_ok(&engine, js(code)).await;
    assert_restricted(&stdout);
}

#[tokio::test]
async fn node_forked_program_sees_no_process_but_its_own() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let code = r#"const fs = require('fs');
console.log('pids', fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p)).join(','));
console.log('keeper', fs.readFileSync('/proc/3/comm', 'utf8').trim(), fs.readdirSync('/proc/3/fd').length);
"#;
    let stdout = forked_ok(&engine, js(code)).await;
    // Init, the program and its keeper (which keeps no descriptor).
    assert!(
        stdout.contains("pids 1,2,3\nkeeper gb-keeper 0\n"),
        "{}",
        stdout
    );
}

#[tokio::test]
async fn node_forked_program_environment_holds_nothing_of_the_host() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let code = r#"console.log(require('fs').readFileSync('/proc/self/environ', 'utf8').includes('CARGO') ? 'LEAK' : 'env clean');
"#;
    let stdout = forked_ok(&engine, js(code)).await;
    assert_absent(&stdout, &["LEAK"]);
}

#[tokio::test]
async fn node_forked_program_cannot_reach_the_hosts_loopback() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let (listener, port) = host_listener();
    let code = format!(
        r#"const s = require('net').connect({port}, '127.0.0.1');
s.on('connect', () => {{ console.log('CONNECTED'); s.destroy() }});
s.on('error', () => console.log('no host loopback'));
"#
    );
    let stdout = forked_ok(&engine, js(&code)).await;
    assert_absent(&stdout, &["CONNECTED"]);
    assert!(stdout.contains("no host loopback"), "{}", stdout);
    assert!(listener.accept().is_err(), "the sandbox reached the host");
}

// Limits: memory, wall clock, output; a run that kills all it can see harms only itself.

#[tokio::test]
async fn node_forked_program_is_killed_at_its_memory_limit() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        js("const b = []; for (;;) b.push(Buffer.alloc(16 << 20, 1))"),
    )
    .await;
    assert_eq!(o.status, Status::Killed, "{o:?}");
}

#[tokio::test]
async fn node_forked_busy_loop_is_stopped_at_its_deadline() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let o = forked(&engine, js("for (;;) {}").timeout_ms(1500)).await;
    assert_stopped_in_time(&o);
}

/// Node queues what a full pipe does not take (in a cold run too): the flood ends with the
/// run, by its deadline or its memory limit, its output capped.
#[tokio::test]
async fn node_forked_output_flood_is_stopped_and_capped() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        js("for (;;) process.stdout.write('flood'.repeat(1000))").timeout_ms(1500),
    )
    .await;
    assert_stopped_in_time(&o);
    assert!(o.stdout.len() <= (1 << 20) + 1024, "{}", o.stdout.len());
}

#[tokio::test]
async fn node_forked_program_killing_all_it_sees_harms_only_itself() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let o = forked(&engine, js("for (const p of [1, process.ppid, -1]) { try { process.kill(p, 'SIGKILL') } catch { console.log('refused', p) } }\nconsole.log('still here')")).await;
    assert!(
        matches!(o.status, Status::Ok | Status::Error | Status::Killed),
        "{o:?}"
    );
    assert_still_serving(&engine).await;
}

/// The fork server's native module, loaded by a program: its control socket is gone and
/// it holds no capability, so `serve` serves nothing.
#[tokio::test]
async fn node_forked_program_cannot_serve_with_the_fork_servers_module() {
    let Some(engine) = node_engine(1) else {
        return;
    };
    let o = forked(&engine, js("const m = { exports: {} }; process.dlopen(m, '/.gearbox/fork.so');\ntry { console.log('serve', JSON.stringify(m.exports.serve(4, 1, 1, 1))) } catch (e) { console.log('serve refused') }")).await;
    assert!(
        matches!(o.stdout.as_str(), "serve null\n" | "serve refused\n"),
        "{o:?}"
    );
    assert_still_serving(&engine).await;
}

/// A warm build that fails is retried on its own, with no run asking for it: a pool whose
/// first build failed (a loaded machine, a fork server that died) does not stay empty.
#[tokio::test]
async fn a_failed_warm_build_is_retried_without_a_run() {
    if !root_and_cgroups("fork server tests") {
        return;
    }
    let mut broken = gearbox_core::LanguageTable::builtin()
        .get("python")
        .expect("python is built in")
        .clone();
    broken.launcher_command = vec!["/bin/false".into(), "{launcher}".into()];
    let engine = crate::support::engine_with_language("brokenpy", broken, 1);
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            std::time::Instant::now() < until,
            "a failed build was not retried: {:?}",
            engine.pool_stats()
        );
        // The pool appears once its start delay has passed.
        if !has_pool(&engine) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let s = python_stats(&engine);
        assert_eq!((s.hits, s.misses, s.ready), (0, 0, 0), "{s:?}");
        if s.failed_in_row >= 2 {
            assert!(s.last_error.is_some(), "{s:?}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
