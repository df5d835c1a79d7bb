//! Live sessions over MCP: `exec_open` with `stateful: true` keeps a Python interpreter in a
//! sandbox of its own, driven over real stdio by rmcp's client. State persists from cell to
//! cell; a runaway cell is interrupted and the session goes on; a cell that will not stop, or
//! a session over its memory, ends that session and no other; two sessions share nothing;
//! idle sessions expire and their sandboxes are gone. Run with
//! `cargo test --workspace --test mcp -- live::`.

use std::path::Path;
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, ReadResourceRequestParams};
use rmcp::service::RunningService;
use serde_json::{Value, json};

use crate::support::{TempDir, obj, structured, text};

struct Server {
    session: RunningService<RoleClient, ()>,
    pid: u32,
}

/// `gearbox serve --profile sessions`, gear full_trust, with `extra` configuration (whole
/// tables) and `sessions` (lines of `[sessions]`).
async fn start(dir: &Path, extra: &str) -> Server {
    start_with(dir, extra, "").await
}

async fn start_with(dir: &Path, extra: &str, sessions: &str) -> Server {
    let config = dir.join("gearbox.toml");
    std::fs::write(
        &config,
        format!(
            "gear = \"full_trust\"\npool = {{}}\n{extra}\n[sessions]\ndir = {:?}\n{sessions}\n",
            dir.join("sessions").display().to_string()
        ),
    )
    .expect("write config");
    let (session, pid) = crate::support::serve_sessions(&config).await;
    Server { session, pid }
}

async fn call(s: &Server, tool: &str, args: Value) -> CallToolResult {
    s.session
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj(args)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

async fn open_live(s: &Server) -> String {
    let r = call(
        s,
        "exec_open",
        json!({"stateful": true, "language": "python"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["live"], "python", "{v}");
    v["session_id"].as_str().expect("session_id").to_string()
}

/// Run `code` as the next cell of session `id`; the outcome's structured content.
async fn cell(s: &Server, id: &str, code: &str, timeout_ms: u64) -> Value {
    let r = call(
        s,
        "exec_run",
        json!({"session_id": id, "language": "python", "code": code, "timeout_ms": timeout_ms}),
    )
    .await;
    structured(&r).clone()
}

/// Processes below `pid` (its children, theirs, ...), from every process's parent in /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // The parent is the second field after the command name's closing parenthesis.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((p, ppid));
        }
    }
    let mut all = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, parent) in &parent_of {
            if parent == p {
                frontier.push(child);
                all.push(child);
            }
        }
    }
    all
}

/// Run cgroups a process `pid` made (`run-{pid}-…`) still present.
fn cgroups_of(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("run-{pid}-");
    crate::cgroups::gearbox_roots()
        .iter()
        .flat_map(|root| std::fs::read_dir(root).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// The helpers (direct children) of the server: one per live session here.
fn helpers(server: u32) -> Vec<u32> {
    let all = descendants(server);
    all.into_iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1).map(str::to_string))
                })
                .is_some_and(|pp| pp == server.to_string())
        })
        .collect()
}

/// Wait until none of `helpers` runs and none left a cgroup behind.
async fn all_gone(helpers: &[u32]) {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let alive: Vec<u32> = helpers
            .iter()
            .copied()
            .filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        let cgroups: Vec<_> = helpers.iter().flat_map(|&p| cgroups_of(p)).collect();
        if alive.is_empty() && cgroups.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < until,
            "still there: helpers {alive:?}, cgroups {cgroups:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn variables_imports_and_the_working_directory_persist() {
    let dir = TempDir::new("live-state");
    let s = start(&dir.0, "").await;
    let id = open_live(&s).await;
    let v = cell(&s, &id, "x = 41", 10_000).await;
    assert_eq!(v["status"], "ok", "{v}");
    assert!(
        v.get("result").is_none(),
        "an assignment has no result: {v}"
    );
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "python", "code": "x + 1"}),
    )
    .await;
    assert_eq!(structured(&r)["result"], "42", "{}", text(&r));
    assert!(text(&r).contains("--- result ---\n42\n"), "{}", text(&r));
    let v = cell(
        &s,
        &id,
        "import json, os\nos.chdir('/tmp')\nrows = [{'n': i} for i in range(3)]\nf = open('/work/log.txt', 'w')",
        10_000,
    )
    .await;
    assert_eq!(v["status"], "ok", "{v}");
    let v = cell(
        &s,
        &id,
        "f.write('kept open'); f.close()\nprint(json.dumps(rows[-1]), os.getcwd(), open('/work/log.txt').read())\nlen(rows)",
        10_000,
    )
    .await;
    assert_eq!(v["stdout"], "{\"n\": 2} /tmp kept open\n", "{v}");
    assert_eq!(v["result"], "3", "{v}");
    // An error is the cell's: reported with its traceback, and the session goes on.
    let v = cell(&s, &id, "undefined_name", 10_000).await;
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("NameError") && e.contains("<cell")),
        "{v}"
    );
    assert_eq!(cell(&s, &id, "x", 10_000).await["result"], "41");
    // The session's resource shows its interpreter.
    let res = s
        .session
        .read_resource(ReadResourceRequestParams::new(format!(
            "gearbox://sessions/{id}"
        )))
        .await
        .expect("read");
    let body = match &res.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("{other:?}"),
    };
    let body: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(body["live"]["language"], "python", "{body}");
    assert_eq!(body["live"]["alive"], true, "{body}");
    assert_eq!(body["live"]["cells"], 6, "{body}");
}

#[tokio::test]
async fn output_of_a_cell_is_its_own() {
    let dir = TempDir::new("live-output");
    let s = start(&dir.0, "").await;
    let id = open_live(&s).await;
    let v = cell(
        &s,
        &id,
        "import threading, time, subprocess\n\
         def late():\n    time.sleep(0.5)\n    print('LATE from an earlier cell')\n\
         threading.Thread(target=late).start()\n\
         subprocess.run(['echo', 'from a subprocess'])\nprint('now')",
        10_000,
    )
    .await;
    assert_eq!(v["stdout"], "from a subprocess\nnow\n", "{v}");
    let v = cell(
        &s,
        &id,
        "import time\ntime.sleep(1)\nprint('second')",
        10_000,
    )
    .await;
    assert_eq!(v["stdout"], "second\n", "{v}");
}

#[tokio::test]
async fn a_runaway_cell_is_interrupted_and_the_session_survives() {
    let dir = TempDir::new("live-interrupt");
    let s = start(&dir.0, "").await;
    let id = open_live(&s).await;
    cell(&s, &id, "kept = 'still here'", 10_000).await;
    let v = cell(&s, &id, "while True:\n    pass", 1000).await;
    assert_eq!(v["status"], "timeout", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("interrupted") && r.contains("remain")),
        "{v}"
    );
    assert_eq!(
        cell(&s, &id, "kept", 10_000).await["result"],
        "'still here'"
    );
}

#[tokio::test]
async fn a_cell_that_will_not_stop_ends_its_session_and_the_next_call_says_so() {
    let dir = TempDir::new("live-stuck");
    let s = start(&dir.0, "").await;
    let id = open_live(&s).await;
    let before = helpers(s.pid);
    let other = open_live(&s).await;
    cell(&s, &other, "mine = 1", 10_000).await;
    // KeyboardInterrupt caught and ignored, forever.
    let code = "while True:\n    try:\n        while True:\n            pass\n    except KeyboardInterrupt:\n        pass";
    let v = cell(&s, &id, code, 1000).await;
    assert_eq!(v["status"], "killed", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("did not stop") && r.contains("ended")),
        "{v}"
    );
    let v = cell(&s, &id, "1", 10_000).await;
    assert_eq!(v["status"], "killed", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("has ended")),
        "{v}"
    );
    // Its sandbox and cgroup are gone; the other session never noticed.
    all_gone(&before).await;
    assert_eq!(cell(&s, &other, "mine + 1", 10_000).await["result"], "2");
}

#[tokio::test]
async fn a_session_over_its_memory_dies_with_the_reason_and_another_is_untouched() {
    let dir = TempDir::new("live-memory");
    let s = start(&dir.0, "[limits]\nmemory_mb = 128\n").await;
    let hog = open_live(&s).await;
    let other = open_live(&s).await;
    cell(&s, &other, "mine = 'untouched'", 10_000).await;
    let v = cell(
        &s,
        &hog,
        "b = []\nwhile True:\n    b.append(bytearray(16 << 20))",
        20_000,
    )
    .await;
    assert_eq!(v["status"], "killed", "{v}");
    assert!(
        v["reason"].as_str().is_some_and(|r| r.contains("memory")),
        "{v}"
    );
    assert_eq!(
        cell(&s, &other, "mine", 10_000).await["result"],
        "'untouched'"
    );
}

#[tokio::test]
async fn two_live_sessions_share_no_variable_and_no_file() {
    let dir = TempDir::new("live-apart");
    let s = start(&dir.0, "").await;
    let a = open_live(&s).await;
    let b = open_live(&s).await;
    cell(
        &s,
        &a,
        "secret = 'A-only'\nopen('/work/a.txt', 'w').write('A')\nopen('/tmp/a.tmp', 'w').write('A')",
        10_000,
    )
    .await;
    let v = cell(&s, &b, "secret", 10_000).await;
    assert_eq!(v["status"], "error", "{v}");
    let v = cell(
        &s,
        &b,
        "import os\nsorted(os.listdir('/work')) + sorted(os.listdir('/tmp'))",
        10_000,
    )
    .await;
    assert_eq!(v["result"], "[]", "{v}");
}

#[tokio::test]
async fn live_sessions_are_bounded_and_checked() {
    let dir = TempDir::new("live-bounds");
    let s = start(&dir.0, "").await;
    // The default allows 4; the fifth is refused with the setting's name.
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(open_live(&s).await);
    }
    let r = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "python"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("live_max"), "{}", text(&r));
    let r = call(&s, "exec_close", json!({"session_id": ids[0]})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    // Closing made room.
    ids[0] = open_live(&s).await;
    let r = call(&s, "exec_close", json!({"session_id": ids[3]})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    for (args, needle) in [
        (json!({"stateful": true}), "language"),
        (
            json!({"stateful": true, "language": "cobol"}),
            "could not start",
        ),
        (
            json!({"stateful": true, "language": "bash"}),
            "no live sessions",
        ),
        (json!({"language": "python"}), "stateful"),
    ] {
        let r = call(&s, "exec_open", args.clone()).await;
        assert_eq!(r.is_error, Some(true), "{args}");
        assert!(text(&r).contains(needle), "{args}: {}", text(&r));
    }
    // A cell in the wrong language, or with files, is refused and runs nothing.
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": ids[1], "language": "javascript", "code": "1"}),
    )
    .await;
    assert!(text(&r).contains("runs python"), "{}", text(&r));
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": ids[1], "language": "python", "code": "1",
               "additional_files": [{"filename": "a.txt", "content": "x"}]}),
    )
    .await;
    assert!(text(&r).contains("additional_files"), "{}", text(&r));
}

#[tokio::test]
async fn idle_live_sessions_expire_and_their_sandboxes_are_gone() {
    let dir = TempDir::new("live-expire");
    let s = start_with(&dir.0, "", "ttl_secs = 2").await;
    let id = open_live(&s).await;
    assert_eq!(cell(&s, &id, "1 + 1", 10_000).await["result"], "2");
    let live = helpers(s.pid);
    assert_eq!(live.len(), 1, "one helper for the live session: {live:?}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && !crate::cgroups::gearbox_roots().is_empty() {
        assert!(
            !cgroups_of(live[0]).is_empty(),
            "the session's cgroup exists"
        );
    }
    // Idle for longer than its TTL: the session expires, its sandbox and cgroup go.
    all_gone(&live).await;
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "python", "code": "1"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("does not exist"), "{}", text(&r));
}

/// Packages given at open are importable in every cell (a cached layer mounted in the
/// session's sandbox); a server whose gear would ask a human refuses them at open.
#[tokio::test]
async fn packages_given_at_open_are_importable_and_need_full_trust() {
    // Layers are mounted from the host: not under /tmp, which the sandbox has of its own.
    let cache =
        std::path::PathBuf::from(format!("/var/tmp/gearbox-live-pkgs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).expect("mkdir");
    // The sandbox user walks down to the layer.
    std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let dir = TempDir::new("live-packages");
    let packages = format!(
        "[packages]\ncache_dir = {:?}\ninstall_timeout_ms = 180000\n",
        cache.display().to_string()
    );
    let s = start(&dir.0, &packages).await;
    let r = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "python", "packages": ["iniconfig"]}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let id = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    // Not on the host: only the layer can provide it.
    let v = cell(&s, &id, "import iniconfig\niniconfig.__name__", 10_000).await;
    assert_eq!(v["result"], "'iniconfig'", "{v}");
    drop(s);
    // The same under user_confirmed: refused, nothing installed or started.
    let config = dir.0.join("gearbox.toml");
    let text_config = std::fs::read_to_string(&config)
        .expect("config")
        .replace("gear = \"full_trust\"", "gear = \"user_confirmed\"");
    std::fs::write(&config, text_config).expect("config");
    let (session, pid) = crate::support::serve_sessions(&config).await;
    let s = Server { session, pid };
    let r = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "python", "packages": ["iniconfig"]}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("full_trust"), "{}", text(&r));
    let _ = std::fs::remove_dir_all(&cache);
}

#[tokio::test]
async fn javascript_cells_keep_their_state_and_a_runaway_one_is_stopped() {
    let dir = TempDir::new("live-js");
    let s = start(&dir.0, "").await;
    let r = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "javascript"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(structured(&r)["live"], "javascript");
    let id = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    let js = |code: &str, timeout_ms: u64| json!({"session_id": id, "language": "javascript", "code": code, "timeout_ms": timeout_ms});
    for (code, want) in [
        ("let x = 41", Value::Null),
        ("x + 1", json!("42")),
        (
            "const fs = require('fs'); fs.writeFileSync('a.txt', 'kept'); 1",
            json!("1"),
        ),
        ("fs.readFileSync('a.txt', 'utf8')", json!("'kept'")),
        (
            "(async () => { await new Promise(r => setTimeout(r, 50)); return x * 2 })()",
            json!("82"),
        ),
    ] {
        let r = call(&s, "exec_run", js(code, 10_000)).await;
        let v = structured(&r);
        assert_eq!(v["status"], "ok", "{code}: {v}");
        assert_eq!(
            v.get("result").cloned().unwrap_or(Value::Null),
            want,
            "{code}: {v}"
        );
    }
    // Output scheduled by a cell after it ended is that cell's, not the next one's.
    let r = call(
        &s,
        "exec_run",
        js(
            "setTimeout(() => console.log('LATE'), 300); console.log('now')",
            10_000,
        ),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "now\n");
    let r = call(
        &s,
        "exec_run",
        js(
            "await0 = new Promise(r => setTimeout(r, 600)); await0",
            10_000,
        ),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "", "{}", text(&r));
    for code in ["while (true) {}", "new Promise(() => {})"] {
        let r = call(&s, "exec_run", js(code, 1000)).await;
        assert_eq!(structured(&r)["status"], "timeout", "{code}: {}", text(&r));
    }
    let r = call(&s, "exec_run", js("x", 10_000)).await;
    assert_eq!(structured(&r)["result"], "41", "{}", text(&r));
    let r = call(&s, "exec_run", js("nope()", 10_000)).await;
    let v = structured(&r);
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("ReferenceError") && e.contains("<cell")),
        "{v}"
    );
}

/// A live session's files are read from outside its sandbox, beneath its /work only: a
/// link the program planted, a fifo, a path out of /work are all "no file", and nothing hangs.
#[tokio::test]
async fn a_live_sessions_files_are_read_beneath_its_work_only() {
    let dir = TempDir::new("live-files");
    let s = start(&dir.0, "").await;
    let id = open_live(&s).await;
    let v = cell(
        &s,
        &id,
        "import os\nos.makedirs('/work/out', exist_ok=True)\nopen('/work/out/report.txt', 'w').write('made in a cell')\n\
         os.symlink('/etc/passwd', '/work/link')\nos.symlink('/proc/1/root/etc/hostname', '/work/magic')\nos.mkfifo('/work/fifo')",
        10_000,
    )
    .await;
    assert_eq!(v["status"], "ok", "{v}");
    let r = call(
        &s,
        "exec_get_artifact",
        json!({"session_id": id, "path": "out/report.txt"}),
    )
    .await;
    assert_eq!(structured(&r)["content"], "made in a cell", "{}", text(&r));
    for path in [
        "link",
        "magic",
        "fifo",
        "../etc/passwd",
        "/etc/passwd",
        "out",
    ] {
        let r = call(
            &s,
            "exec_get_artifact",
            json!({"session_id": id, "path": path}),
        )
        .await;
        assert_eq!(r.is_error, Some(true), "{path}: {}", text(&r));
        assert!(!text(&r).contains("root:"), "{path}: {}", text(&r));
    }
    let res = s
        .session
        .read_resource(ReadResourceRequestParams::new(format!(
            "gearbox://sessions/{id}/files/out/report.txt"
        )))
        .await
        .expect("read");
    match &res.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => {
            assert_eq!(text, "made in a cell")
        }
        other => panic!("{other:?}"),
    }
}

/// `exec_close` ends a session at once, even while a cell runs (the cell ends with it), and
/// the session's state can be read meanwhile (it says a cell is running).
#[tokio::test]
async fn closing_ends_a_session_at_once_even_during_a_cell() {
    let dir = TempDir::new("live-close");
    let s = std::sync::Arc::new(start(&dir.0, "").await);
    let id = open_live(&s).await;
    let started = std::time::Instant::now();
    let running = {
        let (s, id) = (s.clone(), id.clone());
        tokio::spawn(async move {
            call(
                &s,
                "exec_run",
                json!({"session_id": id, "language": "python", "code": "open('/work/f.txt', 'w').write('written before the sleep')\nimport time\ntime.sleep(60)", "timeout_ms": 120000}),
            )
            .await
        })
    };
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let res = s
            .session
            .read_resource(ReadResourceRequestParams::new(format!(
                "gearbox://sessions/{id}"
            )))
            .await
            .expect("read");
        let body = match &res.contents[0] {
            rmcp::model::ResourceContents::TextResourceContents { text, .. } => text.clone(),
            other => panic!("{other:?}"),
        };
        if body.contains("\"busy\":true") {
            // Its files can be read while the cell runs.
            let r = call(
                &s,
                "exec_get_artifact",
                json!({"session_id": id, "path": "f.txt"}),
            )
            .await;
            if structured(&r)["content"] == "written before the sleep" {
                break;
            }
        }
        assert!(
            std::time::Instant::now() < until,
            "the cell never ran: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = call(&s, "exec_close", json!({"session_id": id})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let r = running.await.expect("the cell's call");
    let v = structured(&r);
    assert_eq!(v["status"], "killed", "{v}");
    assert!(
        started.elapsed() < Duration::from_secs(55),
        "the cell ran its whole minute: {v}"
    );
}
