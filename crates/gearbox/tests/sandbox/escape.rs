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
    crate::support::until_running(marker, &task).await;
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
        "seccomp: 3 filters (allow list)",
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

/// Probes of the system call policy (`jail/seccomp.json`), from Python through ctypes and
/// its socket module: one `probe answer` line each, the answer `ok` or the errno's name.
const POLICY_PROBE: &str = r#"import ctypes, errno, socket, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
def name(e):
    return errno.errorcode.get(e, str(e))
def call(*args):
    ctypes.set_errno(0)
    r = libc.syscall(*[ctypes.c_long(a) for a in args])
    return 'ok' if r >= 0 else name(ctypes.get_errno())
def sock(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return 'ok'
    except OSError as e:
        return name(e.errno)
def pair(family):
    try:
        for s in socket.socketpair(family, socket.SOCK_STREAM):
            s.close()
        return 'ok'
    except OSError as e:
        return name(e.errno)
def tcp():
    try:
        with socket.create_server(('127.0.0.1', 0)) as srv:
            with socket.create_connection(srv.getsockname()) as c:
                conn, _ = srv.accept()
                c.sendall(b'x')
                got = conn.recv(1)
                conn.close()
        return 'ok' if got == b'x' else 'lost'
    except OSError as e:
        return name(e.errno)
print('vsock', sock(40, socket.SOCK_STREAM))
print('packet', sock(17, socket.SOCK_RAW, 0x0300))
print('alg', sock(38, socket.SOCK_SEQPACKET))
print('bluetooth', sock(31, socket.SOCK_STREAM))
print('netlink_audit', sock(16, socket.SOCK_RAW, 9))
print('netlink_uevent', sock(16, socket.SOCK_DGRAM, 15))
print('netlink_sock_diag', sock(16, socket.SOCK_RAW, 4))
print('inet_sock_packet', sock(2, 10, 0x0300))
print('inet_sctp', sock(2, socket.SOCK_STREAM, 132))
print('socketpair_inet', pair(socket.AF_INET))
print('modify_ldt', call(154, 0, 0, 0))
print('x32_getpid', call(0x40000000 | 39))
print('process_madvise', call(440, -1, 0, 0, 0, 0))
print('set_thread_area', call(205, 0))
print('unreviewed_getxattrat', call(464, -1, 0, 0, 0, 0, 0))
print('sync', call(162))
print('ioctl_tiocsti_high_bits', call(16, 0, 0x100005412, 0))
print('personality_no_aslr', call(135, 0x0040000))
print('clone3', call(435, 0, 0))
print('unshare', call(272, 0x10000000))
print('unix_stream', sock(1, socket.SOCK_STREAM))
print('unix_dgram', sock(1, socket.SOCK_DGRAM))
print('inet_tcp', sock(2, socket.SOCK_STREAM))
print('inet_udp', sock(2, socket.SOCK_DGRAM, 17))
print('inet6_tcp', sock(10, socket.SOCK_STREAM, 6))
print('inet6_udp', sock(10, socket.SOCK_DGRAM))
print('netlink_route', sock(16, socket.SOCK_RAW, 0))
print('socketpair_unix', pair(socket.AF_UNIX))
print('personality_query', call(135, 0xffffffff))
print('tcp_loopback', tcp())
print('interfaces', 'ok' if 'lo' in [n for _, n in socket.if_nameindex()] else 'no lo')
t = threading.Thread(target=print, args=('thread', 'ok'))
t.start()
t.join()
print('subprocess', 'ok' if subprocess.run(['/bin/true']).returncode == 0 else 'failed')
"#;

/// What [`POLICY_PROBE`] must print. Refused: socket families outside the allow list
/// (EAFNOSUPPORT), netlink protocols but route, SOCK_PACKET and SCTP sockets, modify_ldt,
/// x32 and newer-than-reviewed system calls (ENOSYS), process_madvise, TIOCSTI even with
/// high bits set, namespaces. Allowed: what programs use, end to end.
const POLICY_ANSWERS: &[(&str, &str)] = &[
    ("vsock", "EAFNOSUPPORT"),
    ("packet", "EAFNOSUPPORT"),
    ("alg", "EAFNOSUPPORT"),
    ("bluetooth", "EAFNOSUPPORT"),
    ("netlink_audit", "EPERM"),
    ("netlink_uevent", "EPERM"),
    ("netlink_sock_diag", "EPERM"),
    ("inet_sock_packet", "EPERM"),
    ("inet_sctp", "EPERM"),
    ("socketpair_inet", "EAFNOSUPPORT"),
    ("modify_ldt", "EPERM"),
    ("x32_getpid", "ENOSYS"),
    ("process_madvise", "EPERM"),
    ("set_thread_area", "EPERM"),
    ("unreviewed_getxattrat", "ENOSYS"),
    ("sync", "EPERM"),
    ("ioctl_tiocsti_high_bits", "EPERM"),
    ("personality_no_aslr", "EPERM"),
    ("clone3", "ENOSYS"),
    ("unshare", "EPERM"),
    ("unix_stream", "ok"),
    ("unix_dgram", "ok"),
    ("inet_tcp", "ok"),
    ("inet_udp", "ok"),
    ("netlink_route", "ok"),
    ("socketpair_unix", "ok"),
    ("personality_query", "ok"),
    ("tcp_loopback", "ok"),
    ("interfaces", "ok"),
    ("thread", "ok"),
    ("subprocess", "ok"),
];

/// Whether this host's kernel has IPv6 sockets: the sandbox must have them exactly then.
fn host_inet6() -> &'static str {
    // SAFETY: socket and close take integers.
    let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_STREAM, 0) };
    if fd < 0 {
        return "EAFNOSUPPORT";
    }
    // SAFETY: closes the socket just opened.
    unsafe { libc::close(fd) };
    "ok"
}

/// `o` printed every answer of [`POLICY_ANSWERS`] (and `extra`).
fn assert_policy_answers(path: &str, o: &gearbox_core::Outcome, extra: &[(&str, &str)]) {
    assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
    let answers: std::collections::BTreeMap<&str, &str> =
        o.stdout.lines().filter_map(|l| l.split_once(' ')).collect();
    let inet6 = host_inet6();
    let expected = POLICY_ANSWERS
        .iter()
        .chain(extra)
        .copied()
        .chain([("inet6_tcp", inet6), ("inet6_udp", inet6)]);
    for (probe, want) in expected {
        assert_eq!(
            answers.get(probe).copied(),
            Some(want),
            "{path}: {probe}\n{}\n{}",
            o.stdout,
            o.stderr
        );
    }
}

/// A Node program that runs the probe in a child (which inherits the program's filters)
/// and uses Unix, TCP, UDP and route netlink sockets itself.
const NODE_POLICY_PROBE: &str = r#"const { spawnSync } = require('child_process');
const r = spawnSync('/usr/bin/python3', ['probe.py'], { encoding: 'utf8' });
process.stdout.write(r.stdout || '');
process.stderr.write(r.stderr || '');
const os = require('os'), net = require('net'), dgram = require('dgram');
console.log('node_interfaces', 'lo' in os.networkInterfaces() ? 'ok' : 'no lo');
const u = dgram.createSocket('udp4');
u.bind(0, '127.0.0.1', () => { console.log('node_udp', 'ok'); u.close(); });
const srv = net.createServer((c) => c.end('x'));
srv.listen(0, '127.0.0.1', () => {
  net.connect(srv.address().port, '127.0.0.1').on('data', (d) => { console.log('node_tcp', d.toString() === 'x' ? 'ok' : 'lost'); srv.close(); });
});
const us = net.createServer((c) => c.end('y'));
us.listen('/tmp/probe.sock', () => {
  net.connect('/tmp/probe.sock').on('data', (d) => { console.log('node_unix', d.toString() === 'y' ? 'ok' : 'lost'); us.close(); });
});
"#;

const NODE_ANSWERS: &[(&str, &str)] = &[
    ("node_interfaces", "ok"),
    ("node_udp", "ok"),
    ("node_tcp", "ok"),
    ("node_unix", "ok"),
];

#[tokio::test]
async fn system_call_policy_holds_for_python() {
    let o = run("python", POLICY_PROBE).go().await;
    assert_policy_answers("python", &o, &[]);
}

#[tokio::test]
async fn system_call_policy_holds_for_bash_and_its_children() {
    let o = run("bash", "/usr/bin/python3 probe.py")
        .file("probe.py", POLICY_PROBE)
        .go()
        .await;
    assert_policy_answers("bash", &o, &[]);
}

#[tokio::test]
async fn system_call_policy_holds_for_node_and_its_children() {
    let o = run("javascript", NODE_POLICY_PROBE)
        .file("probe.py", POLICY_PROBE)
        .go()
        .await;
    assert_policy_answers("javascript", &o, NODE_ANSWERS);
}

#[tokio::test]
async fn system_call_policy_holds_for_go() {
    let code = r#"package main

import (
	"fmt"
	"syscall"
)

func answer(e syscall.Errno) string {
	switch e {
	case 0:
		return "ok"
	case syscall.EPERM:
		return "EPERM"
	case syscall.ENOSYS:
		return "ENOSYS"
	case syscall.EAFNOSUPPORT:
		return "EAFNOSUPPORT"
	}
	return fmt.Sprint(uintptr(e))
}

func sock(family, kind, proto int) string {
	fd, err := syscall.Socket(family, kind, proto)
	if err != nil {
		return answer(err.(syscall.Errno))
	}
	syscall.Close(fd)
	return "ok"
}

func call(nr uintptr, args ...uintptr) string {
	a := make([]uintptr, 6)
	copy(a, args)
	_, _, e := syscall.RawSyscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5])
	return answer(e)
}

func main() {
	fmt.Println("vsock", sock(40, syscall.SOCK_STREAM, 0))
	fmt.Println("packet", sock(syscall.AF_PACKET, syscall.SOCK_RAW, 0x300))
	fmt.Println("netlink_audit", sock(syscall.AF_NETLINK, syscall.SOCK_RAW, 9))
	fmt.Println("netlink_route", sock(syscall.AF_NETLINK, syscall.SOCK_RAW, 0))
	fmt.Println("inet_tcp", sock(syscall.AF_INET, syscall.SOCK_STREAM, 0))
	fmt.Println("unix_stream", sock(syscall.AF_UNIX, syscall.SOCK_STREAM, 0))
	fmt.Println("x32_getpid", call(0x40000000|39))
	fmt.Println("modify_ldt", call(154, 0, 0, 0))
	fmt.Println("process_madvise", call(440, ^uintptr(0), 0, 0, 0, 0))
	if _, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC); err != nil {
		fmt.Println("netlink_dump", err)
	} else {
		fmt.Println("netlink_dump", "ok")
	}
}
"#;
    let o = run("go", code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let expected = "vsock EAFNOSUPPORT\npacket EAFNOSUPPORT\nnetlink_audit EPERM\n\
                    netlink_route ok\ninet_tcp ok\nunix_stream ok\nx32_getpid ENOSYS\n\
                    modify_ldt EPERM\nprocess_madvise EPERM\nnetlink_dump ok\n";
    assert_eq!(o.stdout, expected, "{o:?}");
}

#[tokio::test]
async fn system_call_policy_holds_in_forked_sandboxes() {
    // The fork servers' programs run under the policy in two parts (the fork server's,
    // inherited, and their own): the same answers, each run checked to be a pool hit.
    if !crate::support::root_and_cgroups("system_call_policy_holds_in_forked_sandboxes") {
        return;
    }
    use crate::fork_server::{forked, forked_engine_for};
    let python = forked_engine_for("python", 1);
    let o = forked(&python, run("python", POLICY_PROBE)).await;
    assert_policy_answers("forked python", &o, &[]);
    let node = forked_engine_for("javascript", 1);
    let o = forked(
        &node,
        run("javascript", NODE_POLICY_PROBE).file("probe.py", POLICY_PROBE),
    )
    .await;
    assert_policy_answers("forked javascript", &o, NODE_ANSWERS);
}
