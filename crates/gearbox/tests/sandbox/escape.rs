//! The escape suite: each test is a hostile program and the containment it must meet.

use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use gearbox_core::{LimitOverrides, Status};

use crate::support::{gearbox_bin, is_root, run};

/// A file the test plants on the host; the sandbox must not see it.
struct Planted {
    path: std::path::PathBuf,
}

impl Planted {
    fn new(tag: &str) -> Planted {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("gearbox-planted-{tag}-{}", std::process::id()));
        std::fs::write(&path, "TOP-SECRET-HOST-DATA").expect("plant");
        Planted { path }
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[tokio::test]
async fn cannot_read_a_planted_host_file() {
    let planted = Planted::new("read");
    let p = planted.path.display().to_string();
    let code = format!(
        "import os\nfor p in ['{p}', '/proc/1/root{p}', '/proc/self/root{p}']:\n    try:\n        print(open(p).read())\n    except OSError as e:\n        print('denied', type(e).__name__)\nprint(sorted(os.listdir('/')))"
    );
    let o = run("python", &code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(!o.stdout.contains("TOP-SECRET"), "{}", o.stdout);
    assert_eq!(o.stdout.matches("denied").count(), 3, "{}", o.stdout);
    for hidden in ["'root'", "'home'", "'var'", "'run'", "'sys'", "'boot'"] {
        assert!(!o.stdout.contains(hidden), "{hidden} visible: {}", o.stdout);
    }
}

#[tokio::test]
async fn cannot_write_outside_the_workspace() {
    let code = r#"
for p in ['/usr/gearbox-x', '/etc/gearbox-x', '/gearbox-x', '/proc/sys/kernel/core_pattern',
          '/proc/sysrq-trigger', '/dev/gearbox-x', '/lib/gearbox-x']:
    try:
        open(p, 'w').write('x')
        print('WROTE', p)
    except OSError as e:
        print('refused', p, e.errno)
open('/work/ok', 'w').write('fine'); open('/tmp/ok', 'w').write('fine'); open('/dev/shm/ok', 'w').write('fine')
open('/dev/null', 'w').write('fine')
print('workspace ok')
"#;
    let o = run("python", code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(!o.stdout.contains("WROTE"), "{}", o.stdout);
    assert!(o.stdout.contains("workspace ok"));
    for p in [
        "/usr/gearbox-x",
        "/etc/gearbox-x",
        "/gearbox-x",
        "/lib/gearbox-x",
    ] {
        assert!(
            !std::path::Path::new(p).exists(),
            "{p} appeared on the host"
        );
    }
}

#[tokio::test]
async fn cannot_reach_a_listener_on_the_host_loopback() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let code = format!(
        "import socket\ns = socket.socket()\ns.settimeout(2)\ntry:\n    s.connect(('127.0.0.1', {port}))\n    print('CONNECTED')\nexcept OSError as e:\n    print('refused', e)\ntry:\n    socket.getaddrinfo('example.com', 80)\n    print('RESOLVED')\nexcept OSError as e:\n    print('no dns', e)"
    );
    let o = run("python", &code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(
        !o.stdout.contains("CONNECTED") && !o.stdout.contains("RESOLVED"),
        "{}",
        o.stdout
    );
    assert!(
        listener.accept().is_err(),
        "the sandbox reached the host listener"
    );
}

#[tokio::test]
async fn loopback_inside_the_sandbox_works() {
    let code = "import socket\nsrv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()\nc = socket.create_connection(srv.getsockname())\nconn, _ = srv.accept(); c.sendall(b'ping'); print(conn.recv(4).decode())";
    let o = run("python", code).go().await;
    assert_eq!(o.stdout, "ping\n", "{o:?}");
}

#[tokio::test]
async fn fork_bomb_is_contained() {
    let o = run("bash", ":(){ :|:& };:\nsleep 2\necho survived")
        .limits(LimitOverrides {
            timeout_ms: Some(4000),
            pids: Some(64),
            ..Default::default()
        })
        .go()
        .await;
    assert!(
        matches!(o.status, Status::Ok | Status::Timeout | Status::Error),
        "{o:?}"
    );
    assert!(o.duration_ms < 6000, "{o:?}");
    assert!(
        o.stderr.contains("Resource temporarily unavailable") || o.stderr.contains("retry"),
        "the process limit was never hit: {}",
        o.stderr.chars().take(300).collect::<String>()
    );
    // The engine is still healthy afterwards.
    let o = run("bash", "echo after").go().await;
    assert_eq!(o.stdout, "after\n");
}

#[tokio::test]
async fn memory_bomb_is_killed() {
    let o = run(
        "python",
        "x = []\nwhile True:\n    x.append(bytearray(16 * 1024 * 1024))",
    )
    .limits(LimitOverrides {
        memory_mb: Some(128),
        timeout_ms: Some(20_000),
        ..Default::default()
    })
    .go()
    .await;
    if is_root() {
        assert_eq!(o.status, Status::Killed, "{o:?}");
        assert!(
            o.reason.as_deref().unwrap_or("").contains("memory"),
            "{o:?}"
        );
    } else {
        // Without cgroups RLIMIT_DATA makes the allocation fail inside the program.
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert!(o.stderr.contains("MemoryError"), "{}", o.stderr);
    }
}

#[tokio::test]
async fn node_runs_under_the_memory_limit() {
    // RLIMIT_AS would break V8's reservations; the cgroup (or RLIMIT_DATA) must not.
    let o = run(
        "javascript",
        "const a = new Array(1e6).fill(1); console.log(a.length)",
    )
    .limits(LimitOverrides {
        memory_mb: Some(256),
        ..Default::default()
    })
    .go()
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "1000000\n");
}

#[tokio::test]
async fn disk_fill_stops_at_the_workspace_size() {
    let code = "i = 0\ntry:\n    with open('fill', 'wb') as f:\n        while True:\n            f.write(b'x' * 1048576); f.flush(); i += 1\nexcept OSError as e:\n    print('stopped', i, e.errno)";
    let o = run("python", code)
        .limits(LimitOverrides {
            disk_mb: Some(8),
            file_size_mb: Some(64),
            ..Default::default()
        })
        .go()
        .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let mib: u64 = o
        .stdout
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(999);
    assert!(o.stdout.contains(" 28"), "expected ENOSPC: {}", o.stdout);
    assert!(mib <= 8, "{}", o.stdout);
}

#[tokio::test]
async fn output_flood_is_capped_and_bounded_in_time() {
    let o = run("bash", "yes flood")
        .limits(LimitOverrides {
            timeout_ms: Some(1500),
            output_bytes: Some(64 * 1024),
            ..Default::default()
        })
        .go()
        .await;
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    assert!(o.stdout_truncated);
    assert!(o.stdout.len() < 70 * 1024);
}

#[tokio::test]
async fn setsid_and_double_fork_do_not_outlive_the_run() {
    for (marker, timeout) in [("31.4159", false), ("27.1828", true)] {
        let tail = if timeout {
            "sleep 60"
        } else {
            "echo parent-done"
        };
        let code = format!(
            "setsid sh -c 'sleep {marker}' &\n( ( nohup sleep {marker} & ) & )\nsleep 0.3\n{tail}"
        );
        let o = run("bash", &code).timeout_ms(1500).go().await;
        if timeout {
            assert_eq!(o.status, Status::Timeout, "{o:?}");
        } else {
            assert_eq!(o.status, Status::Ok, "{o:?}");
        }
        let survivors =
            crate::support::survivors_after(&format!("sleep {marker}"), Duration::from_secs(3))
                .await;
        assert!(survivors.is_empty(), "survivors: {survivors:?}");
    }
}

#[test]
fn the_servers_environment_does_not_leak() {
    let code = "import os, glob\nprint(sorted(os.environ))\nfor p in glob.glob('/proc/*/environ'):\n    try:\n        print(p, open(p, 'rb').read())\n    except OSError:\n        pass";
    let mut child = std::process::Command::new(gearbox_bin())
        .args(["run", "--language", "python", "-"])
        .env("GEARBOX_TEST_SECRET", "hunter2-secret-value")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn gearbox run");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(code.as_bytes())
        .expect("write");
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    assert!(child.wait().expect("wait").success(), "{out}");
    assert!(out.contains("'PATH'"), "{out}");
    assert!(!out.contains("hunter2"), "secret leaked: {out}");
    assert!(!out.contains("GEARBOX_TEST_SECRET"), "{out}");
}

#[tokio::test]
async fn host_processes_are_invisible() {
    let code = "import os\npids = [p for p in os.listdir('/proc') if p.isdigit()]\nprint(len(pids))\nfor p in pids:\n    print(open(f'/proc/{p}/cmdline','rb').read())";
    let o = run("python", code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let count: usize = o
        .stdout
        .lines()
        .next()
        .and_then(|l| l.parse().ok())
        .unwrap_or(999);
    assert!(count <= 3, "sees {count} processes: {}", o.stdout);
    assert!(
        !o.stdout.contains("cargo") && !o.stdout.contains("sandbox-"),
        "{}",
        o.stdout
    );
}

#[tokio::test]
async fn killing_everything_it_can_see_harms_only_itself() {
    let o = run(
        "bash",
        "kill -9 1; kill -9 $PPID; kill -9 -1; echo still-here",
    )
    .timeout_ms(3000)
    .go()
    .await;
    assert!(matches!(o.status, Status::Ok | Status::Error), "{o:?}");
    // The server (this test process) is alive and the next run works.
    let o = run("bash", "echo next").go().await;
    assert_eq!(o.stdout, "next\n");
}

#[tokio::test]
async fn no_namespaces_mounts_or_privileges_from_inside() {
    let code = r#"
unshare -Ur true 2>/dev/null && echo UNSHARE-OK || echo unshare-refused
unshare -m true 2>/dev/null && echo UNSHARE-M-OK || echo unshare-m-refused
mount -t tmpfs none /tmp 2>/dev/null && echo MOUNT-OK || echo mount-refused
grep -E '^Cap(Eff|Prm|Bnd|Amb):' /proc/self/status
grep NoNewPrivs /proc/self/status
grep Seccomp: /proc/self/status
"#;
    let o = run("bash", code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    for bad in ["UNSHARE-OK", "UNSHARE-M-OK", "MOUNT-OK"] {
        assert!(!o.stdout.contains(bad), "{}", o.stdout);
    }
    for cap in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        assert!(
            o.stdout.contains(&format!("{cap}:\t0000000000000000")),
            "{cap} not empty: {}",
            o.stdout
        );
    }
    assert!(o.stdout.contains("NoNewPrivs:\t1"));
    assert!(o.stdout.contains("Seccomp:\t2"));
}

#[tokio::test]
async fn dangerous_syscalls_are_refused() {
    // ptrace(PTRACE_TRACEME), bpf, keyctl, userfaultfd, io_uring_setup, perf_event_open,
    // the x32 alias of getpid: each must fail.
    let code = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
calls = {'ptrace': (101, 0, 0, 0, 0), 'bpf': (321, 0, 0, 0), 'keyctl': (250, 0, 0, 0),
         'userfaultfd': (323, 0), 'io_uring_setup': (425, 1, 0), 'perf_event_open': (298, 0, 0, -1, -1, 0),
         'x32_getpid': (0x40000000 + 39,), 'open_by_handle_at': (304, -100, 0, 0)}
for name, args in calls.items():
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    print(name, 'ALLOWED' if r >= 0 else 'refused', ctypes.get_errno())
"#;
    let o = run("python", code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(!o.stdout.contains("ALLOWED"), "{}", o.stdout);
    assert_eq!(o.stdout.lines().count(), 8, "{}", o.stdout);
}

#[tokio::test]
async fn dev_has_only_harmless_devices() {
    let o = run("bash", "ls /dev | tr '\\n' ' '").go().await;
    let listed: Vec<&str> = o.stdout.split_whitespace().collect();
    for d in &listed {
        assert!(
            [
                "null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr",
                "shm"
            ]
            .contains(d),
            "unexpected /dev entry {d}"
        );
    }
}

#[tokio::test]
async fn write_escape_through_a_symlink_in_the_workspace_stays_inside() {
    // The program plants a symlink to a host path and writes through it: the target is the
    // sandbox's own read-only root, never the host.
    let code = "import os\nos.symlink('/etc/gearbox-through-link', 'link')\ntry:\n    open('link','w').write('x'); print('WROTE')\nexcept OSError as e:\n    print('refused', e.errno)";
    let o = run("python", code).go().await;
    assert!(!o.stdout.contains("WROTE"), "{o:?}");
    assert!(!std::path::Path::new("/etc/gearbox-through-link").exists());
}

#[tokio::test]
async fn dropping_a_run_kills_its_sandbox() {
    // What a cancelled MCP call or a vanished client does: the future is dropped mid-run.
    let marker = "sleep 41.2718";
    let r = run("bash", &format!("( {marker} & ); {marker}")).timeout_ms(20_000);
    let task = crate::support::runtime().spawn(crate::support::engine().execute(r.req, r.backend));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!task.is_finished());
    task.abort();
    let survivors = crate::support::survivors_after(marker, Duration::from_secs(3)).await;
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
}

#[test]
fn every_mechanism_is_reported_enforced() {
    // The mechanisms that leave no trace a program can read (Landlock, the seccomp policy
    // itself, cgroup limits) are reported by the helper as it applies them; doctor shows them.
    let reports = crate::support::engine().probe();
    let linux = reports
        .iter()
        .find(|r| r.backend == gearbox_core::BackendKind::Linux)
        .expect("linux backend report");
    assert!(linux.available, "{linux:?}");
    let details = linux.details.join("\n");
    let mut expected = vec![
        "capabilities: none",
        "no_new_privs",
        "seccomp: 2 filters",
        "net (loopback only)",
    ];
    let lsm = std::fs::read_to_string("/sys/kernel/security/lsm").unwrap_or_default();
    if lsm.split(',').any(|m| m.trim() == "landlock") {
        expected.push("landlock: fully enforced");
    }
    if is_root() && crate::support::cgroups_writable() {
        expected.push("memory");
        expected.push("pids");
    }
    for e in expected {
        assert!(details.contains(e), "{e:?} missing from doctor:\n{details}");
    }
}
