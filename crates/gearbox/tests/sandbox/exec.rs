//! Execution: languages, exit codes, signals, stdin, files, args, env, output handling,
//! limits, concurrency.

use gearbox_core::{BackendKind, LimitOverrides, Status};

use crate::support::run;

#[tokio::test]
async fn python_hello() {
    let o = run("python", "import sys\nprint('hello', sys.version_info[0])")
        .go()
        .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "hello 3\n");
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(o.backend, "linux");
}

#[tokio::test]
async fn javascript_hello() {
    let o = run("javascript", "console.log(6*7); console.error('to stderr')")
        .go()
        .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "42\n");
    assert_eq!(o.stderr, "to stderr\n");
}

#[tokio::test]
async fn go_hello() {
    let code = "package main\nimport (\"fmt\"; \"os\")\nfunc main() { fmt.Println(\"go\", len(os.Args)); os.Exit(0) }\n";
    let o = run("go", code).go().await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "go 1\n");
}

#[tokio::test]
async fn bash_hello_with_args_and_env() {
    let o = run("bash", "echo \"$1|$2|$GREETING|$(pwd)|$HOME\"")
        .args(&["a b", "c"])
        .env("GREETING", "hi")
        .go()
        .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "a b|c|hi|/work|/work\n");
}

#[tokio::test]
async fn exit_code_is_reported_as_error() {
    let o = run("python", "import sys; print('x'); sys.exit(3)")
        .go()
        .await;
    assert_eq!(o.status, Status::Error);
    assert_eq!(o.exit_code, Some(3));
    assert_eq!(o.stdout, "x\n");
    assert!(
        o.render_text()
            .starts_with("Execution Failed (error): exit code 3")
    );
}

#[tokio::test]
async fn signal_is_reported() {
    let o = run(
        "python",
        "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    )
    .go()
    .await;
    assert_eq!(o.status, Status::Error);
    assert_eq!(o.signal, Some(15));
    assert_eq!(o.exit_code, None);
}

#[tokio::test]
async fn uncaught_exception_shows_traceback() {
    let o = run("python", "raise ValueError('boom')").go().await;
    assert_eq!(o.status, Status::Error);
    assert!(o.stderr.contains("ValueError: boom"), "{}", o.stderr);
}

#[tokio::test]
async fn stdin_is_delivered() {
    let o = run(
        "python",
        "import sys; data = sys.stdin.read(); print(data.upper(), end='')",
    )
    .stdin("hello\nworld\n")
    .go()
    .await;
    assert_eq!(o.stdout, "HELLO\nWORLD\n", "{o:?}");
}

#[tokio::test]
async fn no_stdin_means_eof_not_a_hang() {
    let o = run(
        "python",
        "try:\n    input()\nexcept EOFError:\n    print('eof')",
    )
    .timeout_ms(5000)
    .go()
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "eof\n");
}

#[tokio::test]
async fn large_stdin_does_not_deadlock() {
    let big = "x".repeat(4 * 1024 * 1024);
    let o = run("python", "import sys; print(len(sys.stdin.read()))")
        .stdin(&big)
        .go()
        .await;
    assert_eq!(o.stdout.trim(), (4 * 1024 * 1024).to_string(), "{o:?}");
}

#[tokio::test]
async fn additional_files_are_in_the_workspace() {
    let o = run(
        "python",
        "import json\nprint(open('data/in.json').read().strip(), json.load(open('data/in.json'))['k'])",
    )
    .file("data/in.json", "{\"k\": 7}\n")
    .go()
    .await;
    assert_eq!(o.stdout, "{\"k\": 7} 7\n", "{o:?}");
}

#[tokio::test]
async fn unicode_round_trips_and_invalid_utf8_is_replaced() {
    let o = run(
        "python",
        "import sys\nprint('héllo ✓ 日本 🎉')\nsys.stdout.flush()\nsys.stdout.buffer.write(b'bad:\\xff\\xfe\\n')",
    )
    .go()
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(o.stdout.starts_with("héllo ✓ 日本 🎉\n"), "{}", o.stdout);
    assert!(o.stdout.contains("bad:\u{fffd}\u{fffd}"), "{}", o.stdout);
}

#[tokio::test]
async fn output_before_a_timeout_is_kept() {
    let o = run(
        "python",
        "import time\nprint('before', flush=False)\ntime.sleep(30)",
    )
    .timeout_ms(1000)
    .go()
    .await;
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    assert_eq!(o.stdout, "before\n");
    assert!(
        o.duration_ms >= 1000 && o.duration_ms < 5000,
        "{}",
        o.duration_ms
    );
    assert!(o.reason.as_deref().unwrap_or("").contains("1000 ms"));
}

#[tokio::test]
async fn output_is_capped_with_a_marker() {
    let o = run(
        "bash",
        "head -c 300000 /dev/zero | tr '\\0' a; echo; echo err >&2",
    )
    .limits(LimitOverrides {
        output_bytes: Some(1000),
        ..Default::default()
    })
    .go()
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(o.stdout_truncated);
    assert!(!o.stderr_truncated);
    assert!(o.stdout.starts_with(&"a".repeat(1000)));
    assert!(
        o.stdout.contains("output truncated"),
        "{}",
        &o.stdout[1000..]
    );
    assert!(o.stdout.len() < 1200);
    assert_eq!(o.stderr, "err\n");
}

#[tokio::test]
async fn cpu_limit_kills_a_spinning_program() {
    let o = run("python", "while True: pass")
        .limits(LimitOverrides {
            cpu_ms: Some(1000),
            timeout_ms: Some(20_000),
            ..Default::default()
        })
        .go()
        .await;
    assert_eq!(o.status, Status::Killed, "{o:?}");
    assert!(o.reason.as_deref().unwrap_or("").contains("CPU"), "{o:?}");
}

#[tokio::test]
async fn file_size_limit_is_enforced() {
    let o = run("python", "open('big','wb').write(b'x' * (3 * 1024 * 1024))")
        .limits(LimitOverrides {
            file_size_mb: Some(1),
            ..Default::default()
        })
        .go()
        .await;
    assert_ne!(o.status, Status::Ok, "{o:?}");
    assert!(o.stderr.contains("File too large"), "{}", o.stderr);
}

#[tokio::test]
async fn resource_usage_is_measured() {
    let o = run(
        "python",
        "x = bytearray(50 * 1024 * 1024)\nsum(range(2_000_000))",
    )
    .go()
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(o.usage.cpu_time_ms.is_some());
    let peak = o.usage.peak_memory_kb.expect("peak memory");
    assert!(peak > 40 * 1024, "peak {peak} KiB");
    assert!(o.usage.setup_us.is_some());
}

#[tokio::test]
async fn sixteen_concurrent_runs_get_their_own_output() {
    let runs = (0..16).map(|i| {
        run(
            "python",
            &format!("import time\ntime.sleep(0.2)\nprint('run-{i}')"),
        )
        .go()
    });
    let outcomes = futures_join_all(runs).await;
    for (i, o) in outcomes.iter().enumerate() {
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, format!("run-{i}\n"));
    }
}

async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futs: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = vec![];
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

#[tokio::test]
async fn unknown_language_and_bad_names_are_refused_before_running() {
    let o = run("cobol", "DISPLAY 'x'").go().await;
    assert_eq!(o.status, Status::Error);
    assert!(
        o.reason
            .as_deref()
            .unwrap_or("")
            .contains("unknown language")
    );
    for bad in ["../escape.txt", "/etc/cron.d/x", "a/../../b", "nul\0byte"] {
        let o = run("bash", "echo ran").file(bad, "x").go().await;
        assert_eq!(o.status, Status::Denied, "{bad:?}: {o:?}");
        assert!(o.stdout.is_empty(), "nothing may run");
    }
}

#[tokio::test]
async fn limits_above_the_maximum_are_refused_naming_the_field() {
    let o = run("bash", "true")
        .limits(LimitOverrides {
            memory_mb: Some(1 << 20),
            ..Default::default()
        })
        .go()
        .await;
    assert_eq!(o.status, Status::Denied);
    assert!(
        o.reason.as_deref().unwrap_or("").contains("memory_mb"),
        "{o:?}"
    );
}

#[tokio::test]
async fn process_backend_runs_and_kills_its_group() {
    let o = run("bash", "echo from-process; pwd")
        .backend(BackendKind::Process)
        .go()
        .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert!(
        o.stdout.starts_with("from-process\n/tmp/gearbox-run-"),
        "{}",
        o.stdout
    );
    let o = run("bash", "sleep 30")
        .timeout_ms(500)
        .backend(BackendKind::Process)
        .go()
        .await;
    assert_eq!(o.status, Status::Timeout, "{o:?}");
}

#[tokio::test]
async fn cgroups_are_used_when_root() {
    if !crate::support::root_and_cgroups("cgroups_are_used_when_root") {
        return;
    }
    let o = run("bash", "cat /proc/self/cgroup").go().await;
    // Inside its own cgroup namespace the run sees itself at the root.
    assert!(o.stdout.contains(":/"), "{}", o.stdout);
    assert!(
        !o.stdout.contains("gearbox"),
        "cgroup path of the host leaks: {}",
        o.stdout
    );
}

#[tokio::test]
async fn warm_pool_serves_identical_runs_once_each() {
    use gearbox_engine::{Config, Engine, PoolConfig};
    let rt = crate::support::runtime();
    let engine = {
        let _g = rt.enter();
        let config = Config {
            pool: PoolConfig::only([("python".to_string(), 1), ("bash".to_string(), 1)]),
            ..Config::default()
        };
        std::sync::Arc::new(Engine::new(config, crate::support::gearbox_bin()))
    };
    let go = |r: crate::support::Run| {
        let e = std::sync::Arc::clone(&engine);
        async move {
            rt.spawn(async move { e.execute(r.req, r.backend).await })
                .await
                .expect("task")
        }
    };
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let code = "import sys, os\nprint(sys.argv, sys.orig_argv[1:], os.getcwd(), __name__, sys.stdin.read())\nopen('state', 'a').write('x')\nprint(len(open('state').read()))";
    for _ in 0..3 {
        let o = go(run("python", code).args(&["a", "b"]).stdin("in")).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        // A fresh workspace every time: no state survives between runs.
        assert_eq!(
            o.stdout, "['main.py', 'a', 'b'] ['-s', 'main.py', 'a', 'b'] /work __main__ in\n1\n",
            "{o:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let o = go(run("python", "import sys\nsys.exit(4)")).await;
    assert_eq!(o.exit_code, Some(4));
    let o = go(run("python", "def f():\n    raise KeyError('k')\nf()")).await;
    assert_eq!(o.status, Status::Error);
    assert!(
        o.stderr
            .starts_with("Traceback (most recent call last):\n  File \"/work/main.py\""),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("launcher"), "{}", o.stderr);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // The deadline counts from hand-over, not from when the sandbox was built.
    let o = go(run(
        "python",
        "import time\nprint('t', flush=True)\ntime.sleep(5)",
    ))
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let o = go(run("bash", "echo \"$0 $1 $(pwd)\"").args(&["x"])).await;
    assert_eq!(o.stdout, "main.sh x /work\n", "{o:?}");
    let stats = engine.pool_stats();
    let py = stats
        .iter()
        .find(|s| s.language == "python" && !s.network)
        .expect("python pool");
    assert!(py.hits >= 4, "{stats:?}");
    // As root (per-run cgroups), Python's warm sandboxes come from its fork server.
    if crate::support::is_root() {
        assert!(py.fork_server, "{stats:?}");
    }
    let sh = stats
        .iter()
        .find(|s| s.language == "bash" && !s.network)
        .expect("bash pool");
    assert!(sh.hits >= 1, "{stats:?}");
}

#[tokio::test]
async fn wasm_backend_runs_javascript_and_refuses_other_languages() {
    let o = run(
        "javascript",
        "console.log([1, 2, 3].map(x => x * 2).join(','))",
    )
    .backend(BackendKind::Wasm)
    .go()
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.backend, "wasm");
    assert_eq!(o.stdout, "2,4,6\n");
    let o = run("python", "print(1)")
        .backend(BackendKind::Wasm)
        .go()
        .await;
    assert_eq!(o.status, Status::Denied, "{o:?}");
    assert!(
        o.reason
            .as_deref()
            .unwrap_or("")
            .contains("javascript only")
    );
}

/// A server mount under /tmp (the broker's run directory when there is no
/// XDG_RUNTIME_DIR and the server is unprivileged) is visible on top of the run's private
/// /tmp, read-only, and the rest of /tmp is still the run's own.
#[tokio::test]
async fn a_server_mount_under_tmp_is_visible_over_the_runs_tmp() {
    let dir = std::env::temp_dir().join(format!("gearbox-mnt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    // The sandbox user (nobody as root) must be able to walk down to it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(dir.join("sdk.txt"), "from the host\n").expect("write");
    let path = dir.join("sdk.txt").display().to_string();
    let code = format!(
        "cat {path}; echo mine > /tmp/own && cat /tmp/own; echo x > {path} 2>/dev/null || echo read-only"
    );
    let o = run("bash", &code).mount(&dir).go().await;
    std::fs::remove_dir_all(&dir).expect("cleanup");
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout, "from the host\nmine\nread-only\n", "{o:?}");
}

/// A request's files are written into the sandbox only once init has joined the run's
/// cgroup, so they count against the run's memory like anything the program writes: on the
/// cold path the helper creates the cgroup while init mounts the root, and init waits for it
/// before the files (a warm sandbox writes them at hand-over, inside its cgroup already).
#[tokio::test]
async fn a_requests_files_count_against_its_memory() {
    let size = 24usize << 20;
    let o = run("python", "import os\nprint(os.path.getsize('big.txt'))")
        .file("big.txt", &"x".repeat(size))
        .go()
        .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout.trim(), size.to_string());
    // Only a cgroup charges file pages to the run; sampling measures processes.
    if o.usage.memory_limit.as_deref() != Some("cgroup") {
        return;
    }
    let peak = o.usage.peak_memory_kb.expect("a peak from the cgroup");
    assert!(
        peak >= (size as u64) >> 10,
        "peak {peak} KiB with {} KiB of files",
        size >> 10
    );
}
