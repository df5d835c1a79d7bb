//! The escape suite against sandboxes of the exec fork server (languages that run by
//! `execve`: Bash here), each run checked to have been served by it (one pool hit per run).
//! Its programs are forks of a process running the helper's own code until they exec the
//! run's command: nothing of that process (memory, descriptors, signal dispositions,
//! privileges) may reach the command, and runs at once must not see each other.

use std::sync::Arc;
use std::time::Duration;

use gearbox_core::{LimitOverrides, Status};
use gearbox_engine::Engine;

use crate::fork_server::{
    assert_absent, assert_restricted, exec, forked, forked_engine_for, forked_ok, ready,
    shared_files,
};
use crate::support::{Run, root_and_cgroups, run};

/// The engine of Bash's exec fork server keeping `min` sandboxes ready, or `None` when this
/// host cannot run fork servers (skipped, or a failure under `GEARBOX_SANDBOX_REQUIRED`).
fn bash_engine(min: usize) -> Option<Arc<Engine>> {
    root_and_cgroups("exec fork server tests").then(|| forked_engine_for("bash", min))
}

fn sh(code: &str) -> Run {
    run("bash", code)
}

#[tokio::test]
async fn bash_forked_program_sees_its_argv_stdin_files_and_a_fresh_workspace() {
    let Some(engine) = bash_engine(2) else {
        return;
    };
    for _ in 0..3 {
        let o = forked(
            &engine,
            sh("echo \"$0|$*|$PWD|$(cat)|$(cat data/x.txt)|$(ls -A | tr '\\n' ' ')\"\ntouch state")
                .args(&["a", "b c"])
                .stdin("in")
                .file("data/x.txt", "file"),
        )
        .await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(
            o.stdout, "main.sh|a b c|/work|in|file|data main.sh \n",
            "{o:?}"
        );
    }
}

#[tokio::test]
async fn bash_forked_program_reports_its_exit_code_and_the_signal_that_ended_it() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let o = forked(&engine, sh("echo out; echo err >&2; exit 7")).await;
    assert_eq!(
        (o.status, o.exit_code, o.stdout.as_str(), o.stderr.as_str()),
        (Status::Error, Some(7), "out\n", "err\n"),
        "{o:?}"
    );
    let o = forked(&engine, sh("kill -SEGV $$")).await;
    assert_eq!(o.signal, Some(libc::SIGSEGV), "{o:?}");
}

/// What the fork server's own process held: its signal dispositions (Rust ignores SIGPIPE),
/// its nice value, its memory (the gearbox binary) and its descriptors. A program starts
/// with none of them, as on the cold path.
#[tokio::test]
async fn bash_forked_program_inherits_nothing_of_the_fork_servers_process() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let stdout = forked_ok(
        &engine,
        sh(r#"grep -E '^(SigIgn|SigBlk):' /proc/self/status
yes | head -c 2 > /dev/null; echo "pipe ${PIPESTATUS[0]}"
echo "nice $(nice)"
echo "gearbox mapped $(grep -c gearbox /proc/self/maps)"
echo "fds $(ls /proc/self/fd | tr '\n' ' ')"
echo "exe $(readlink /proc/$$/exe)"
"#),
    )
    .await;
    // `grep` itself: nothing ignored or blocked; `yes` killed by SIGPIPE (128 + 13).
    assert!(stdout.contains("SigIgn:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("SigBlk:\t0000000000000000"), "{stdout}");
    assert!(stdout.contains("pipe 141"), "{stdout}");
    assert!(stdout.contains("nice 0"), "{stdout}");
    assert!(stdout.contains("gearbox mapped 0"), "{stdout}");
    // `ls`'s stdio and the directory it lists.
    assert!(stdout.contains("fds 0 1 2 3 \n"), "{stdout}");
    assert!(stdout.contains("exe /usr/bin/bash"), "{stdout}");
}

#[tokio::test]
async fn bash_forked_program_cannot_read_or_write_the_host() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let planted = std::env::temp_dir().join(format!("gearbox-exec-planted-{}", std::process::id()));
    std::fs::write(&planted, "TOP-SECRET-HOST-DATA").expect("plant");
    let p = planted.display();
    let code = format!(
        r#"for f in {p} /proc/1/root{p} /proc/self/root{p}; do cat "$f" 2>/dev/null || echo denied; done
for f in /usr/gx /etc/gx /gx /.gearbox/gx /.gearbox/seccomp-0.bpf /proc/sys/kernel/core_pattern /proc/sysrq-trigger /dev/gx; do
  (echo x >> "$f") 2>/dev/null && echo "WROTE $f" || echo refused
done
for f in /work/ok /tmp/ok /dev/shm/ok /dev/null; do echo fine > "$f"; done
ls /
"#
    );
    let stdout = forked_ok(&engine, sh(&code)).await;
    let _ = std::fs::remove_file(&planted);
    assert_absent(&stdout, &["TOP-SECRET", "WROTE"]);
    assert_eq!(stdout.matches("denied").count(), 3, "{stdout}");
    assert_eq!(stdout.matches("refused").count(), 8, "{stdout}");
    for hidden in ["root\n", "home\n", "var\n", "run\n", "sys\n", "boot\n"] {
        assert!(!stdout.contains(hidden), "{hidden} visible: {stdout}");
    }
}

#[tokio::test]
async fn bash_forked_program_holds_no_privilege_and_sees_no_other_process() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let stdout = forked_ok(
        &engine,
        sh(
            r#"grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|CapInh|NoNewPrivs|Seccomp):' /proc/self/status
echo "pids $(ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\n' ' ')"
echo "third $(cat /proc/3/comm 2>/dev/null)"
cat /proc/1/environ > /dev/null 2>&1 && echo "INIT ENVIRON" || echo "init environ refused"
tr '\0' '\n' < /proc/$$/environ | grep -E 'CARGO|RUST' && echo LEAK
unshare -U true 2>/dev/null && echo UNSHARED
echo done
"#,
        ),
    )
    .await;
    assert_restricted(&stdout);
    assert_absent(&stdout, &["INIT ENVIRON", "LEAK", "UNSHARED"]);
    // Init (1), bash (2), and the pipeline's processes: nothing of the fork server, and no
    // keeper (one would keep the fork server's memory image, which bash's exec dropped).
    assert!(stdout.contains("pids 1 2 "), "{stdout}");
    assert!(!stdout.contains("gb-keeper"), "{stdout}");
    assert!(stdout.contains("init environ refused"), "{stdout}");
}

#[tokio::test]
async fn bash_forked_program_cannot_reach_the_hosts_loopback() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let stdout = forked_ok(
        &engine,
        sh(&format!(
            "(echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED || echo no host loopback"
        )),
    )
    .await;
    assert_absent(&stdout, &["CONNECTED"]);
    assert!(listener.accept().is_err(), "the sandbox reached the host");
}

/// Two runs at once from the same fork server: no shared files, loopback or processes.
#[tokio::test]
async fn bash_forked_runs_at_once_cannot_reach_each_other() {
    let Some(engine) = bash_engine(2) else {
        return;
    };
    ready(&engine, 2).await;
    let holder = "echo RUN-A-SECRET > /tmp/secret; echo RUN-A-SECRET > /work/secret\n\
                  echo holding; sleep 3; echo alive";
    let prober = "sleep 0.8\nfor f in /tmp/secret /work/secret /dev/shm/secret; do cat $f 2>/dev/null | sed 's/^/READ /' || true; done\n\
                  echo \"pids $(ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' ')\"\n\
                  for p in $(seq 3 400); do kill -9 $p 2>/dev/null && [ $p != $BASHPID ] && echo KILLED $p; done; echo probed";
    let hits = |e: &Engine| e.pool_stats().iter().map(|s| s.hits).sum::<u64>();
    let before = hits(&engine);
    let (a, b) = tokio::join!(
        exec(&engine, sh(holder).timeout_ms(10_000).req),
        exec(&engine, sh(prober).timeout_ms(10_000).req)
    );
    assert_eq!(hits(&engine), before + 2, "{a:?} {b:?}");
    assert_eq!(a.stdout, "holding\nalive\n", "{a:?}");
    assert!(b.stdout.ends_with("probed\n"), "{b:?}");
    assert_absent(&b.stdout, &["READ", "KILLED"]);
    assert!(b.stdout.contains("pids 1 2 "), "{}", b.stdout);
}

// Limits: memory, processes, file size, wall clock, output; escapees.

#[tokio::test]
async fn bash_forked_program_is_held_to_its_limits() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    // Memory: a variable that grows without end.
    let o = forked(
        &engine,
        sh("x=0123456789abcdef; while :; do x=$x$x; done").timeout_ms(20_000),
    )
    .await;
    assert_eq!(o.status, Status::Killed, "{o:?}");
    assert!(
        o.reason.as_deref().unwrap_or("").contains("memory"),
        "{o:?}"
    );
    // Processes: a fork bomb is held by the run's pids limit and dies at its deadline; the
    // fork server serves the next run.
    let o = forked(&engine, sh(":(){ :|:& };:; sleep 3").timeout_ms(2000)).await;
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    // File size, lowered by the run below the slot's: the writer is stopped at 1 MiB.
    let o = forked(
        &engine,
        sh("head -c 3000000 /dev/zero > big; echo \"rc $? size $(stat -c %s big)\"").limits(
            LimitOverrides {
                file_size_mb: Some(1),
                ..LimitOverrides::default()
            },
        ),
    )
    .await;
    assert!(o.stdout.contains("rc 153 size 1048576"), "{o:?}");
    // Wall clock, with an escape by setsid and double fork that must die with the run.
    let o = forked(
        &engine,
        sh("setsid sleep 33.1416 & ( ( setsid sleep 33.1416 & ) & ); while :; do :; done")
            .timeout_ms(1500),
    )
    .await;
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    assert!(o.duration_ms < 4000, "{o:?}");
    let survivors = crate::support::survivors_after("sleep 33.1416", Duration::from_secs(3)).await;
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
    // A leftover holding no descriptor outlives the early kill of a finished run, not the run.
    let o = forked(
        &engine,
        // `done` once the leftover runs with no descriptor (init's scan must find it so).
        sh("setsid sleep 35.2718 0<&- 1>&- 2>&- &\n\
            for i in $(seq 500); do for p in /proc/[0-9]*; do \
            [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = 'sleep 35.2718 ' ] && \
            [ -z \"$(ls -A $p/fd 2>/dev/null)\" ] && echo done && exit; done; sleep 0.01; done\n\
            echo not started"),
    )
    .await;
    assert_eq!(o.stdout, "done\n", "{o:?}");
    let survivors = crate::support::survivors_after("sleep 35.2718", Duration::from_secs(3)).await;
    assert!(survivors.is_empty(), "survivors: {survivors:?}");
    // Output: a flood is cut at the limit.
    let o = forked(&engine, sh("yes flood").timeout_ms(1500)).await;
    assert!(o.stdout_truncated, "{o:?}");
    let o = forked(&engine, sh("echo next")).await;
    assert_eq!(o.stdout, "next\n", "{o:?}");
}

/// A hand-over larger than a pipe holds (a 2 MiB file, 3 MiB of stdin) reaches a pre-started
/// bash whole: its init reads the hand-over's bytes and no more, so the run's stdin starts
/// where it should, and the run's lower CPU and file-size limits reach bash by `prlimit`.
#[tokio::test]
async fn bash_forked_program_takes_a_large_hand_over_and_its_runs_limits() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let file = "f".repeat(2 << 20);
    let stdin = format!("first line\n{}", "s".repeat(3 << 20));
    let o = forked(
        &engine,
        sh("read -r first; echo \"$first $(wc -c < big.txt) $(wc -c) $(ulimit -t) $(ulimit -f)\"")
            .file("big.txt", &file)
            .stdin(&stdin)
            .limits(LimitOverrides {
                cpu_ms: Some(3000),
                file_size_mb: Some(2),
                ..LimitOverrides::default()
            }),
    )
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(
        o.stdout,
        format!("first line {} {} 3 2048\n", 2 << 20, 3 << 20),
        "{o:?}"
    );
}

/// Killing everything it can see harms only itself; the fork server keeps serving.
#[tokio::test]
async fn bash_forked_program_killing_all_it_sees_harms_only_itself() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let o = forked(
        &engine,
        sh("kill -9 1 $PPID -1 2>/dev/null; echo still here"),
    )
    .await;
    assert!(
        matches!(o.status, Status::Ok | Status::Error | Status::Killed),
        "{o:?}"
    );
    let o = forked(&engine, sh("echo next")).await;
    assert_eq!(o.stdout, "next\n", "{o:?}");
}

#[tokio::test]
async fn bash_forked_program_holds_no_file_of_the_fork_server() {
    let Some(engine) = bash_engine(1) else {
        return;
    };
    let shared = shared_files(&engine, "bash", "sleep 1.7323", "sleep 1.7323").await;
    assert!(shared.is_empty(), "bash program shares {shared:?}");
}

/// Go (compiled by `go run` in the run, its build cache shared read-only) is served by the
/// exec fork server too: twice in a row, each a pool hit, each with a fresh workspace.
#[tokio::test]
async fn go_is_served_by_the_exec_fork_server() {
    if !root_and_cgroups("exec fork server tests") {
        return;
    }
    let engine = forked_engine_for("go", 1);
    for _ in 0..2 {
        let o = forked(
            &engine,
            run(
                "go",
                "package main\n\nimport (\"fmt\"; \"os\")\n\nfunc main() {\n\t_, err := os.Stat(\"state\")\n\tfmt.Println(\"hello\", os.IsNotExist(err))\n\tos.WriteFile(\"state\", nil, 0o644)\n}\n",
            )
            .timeout_ms(30_000),
        )
        .await;
        assert_eq!(
            (o.status, o.stdout.as_str()),
            (Status::Ok, "hello true\n"),
            "{o:?}"
        );
    }
}
