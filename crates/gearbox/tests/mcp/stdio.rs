//! `gearbox serve` driven over real stdio by rmcp's client: the binary, the Linux sandbox and
//! the protocol, end to end. Run with `cargo test --workspace --test mcp -- stdio::`.
//! `UPDATE_FIXTURES=1` rewrites the tools/list snapshot after an intended interface change.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ErrorCode,
    ProgressNotificationParam, ReadResourceRequestParams, ResourceContents,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::{Value, json};

use crate::cgroups;

use crate::support::{TempDir, manifest_dir, obj, structured, text};

/// Records progress notifications.
#[derive(Clone, Default)]
struct Client {
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Client {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _ctx: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().expect("lock").push(params);
    }
}

type Session = RunningService<RoleClient, Client>;

struct Server {
    session: Session,
    client: Client,
    /// The `gearbox serve` process.
    pid: u32,
    _dir: TempDir,
}

/// Start `gearbox serve` with a config that has a snippets dir, plus `args`.
async fn start(args: &[&str]) -> Server {
    let dir = TempDir::new("srv");
    let snippets = dir.0.join("snippets");
    std::fs::create_dir_all(&snippets).expect("mkdir");
    std::fs::write(snippets.join("hello.py"), "print('hello from a snippet')\n").expect("write");
    std::fs::write(snippets.join("greet.sh"), "echo \"greet $1\"\n").expect("write");
    let config = dir.0.join("gearbox.toml");
    std::fs::write(
        &config,
        format!("snippets_dir = {:?}\n", snippets.display().to_string()),
    )
    .expect("write");
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(|c| {
            c.arg("--config").arg(&config).arg("serve").args(&args);
        }),
    )
    .expect("spawn gearbox serve");
    let pid = transport.id().expect("server pid");
    let client = Client::default();
    let session = client.clone().serve(transport).await.expect("initialize");
    Server {
        session,
        client,
        pid,
        _dir: dir,
    }
}

async fn call(s: &Server, tool: &str, args: Value) -> CallToolResult {
    s.session
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj(args)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

fn fixture(name: &str) -> PathBuf {
    manifest_dir().join("tests/fixtures").join(name)
}

#[tokio::test]
async fn tools_list_matches_the_snapshot() {
    let s = start(&[
        "--profile",
        "default",
        "--profile",
        "quickjs",
        "--profile",
        "heroku",
        "--profile",
        "sidecar",
    ])
    .await;
    let tools = s.session.list_all_tools().await.expect("tools/list");
    let got = serde_json::to_string_pretty(&tools).expect("json") + "\n";
    let path = fixture("mcp_tools_list.json");
    if std::env::var_os("UPDATE_FIXTURES").is_some() {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, &got).expect("write fixture");
    }
    let want =
        std::fs::read_to_string(&path).expect("fixture exists; create it with UPDATE_FIXTURES=1");
    assert_eq!(
        got, want,
        "tools/list changed; review and rerun with UPDATE_FIXTURES=1"
    );

    let default = start(&[]).await;
    let names: Vec<String> = default
        .session
        .list_all_tools()
        .await
        .expect("tools/list")
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["execute_code", "approval_status"]);
    let info = default.session.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("gearbox")
    );
}

/// Every tool of every profile has schemas in standard JSON Schema: Ajv in strict mode,
/// draft 2020-12 (the validator of the official TypeScript SDK), compiles each one, so no
/// client warns about a custom `format` such as `uint64`.
#[tokio::test]
async fn tool_schemas_compile_in_a_strict_draft_2020_12_validator() {
    let mut args = Vec::new();
    for p in [
        "default", "isolator", "quickjs", "heroku", "sidecar", "sessions", "broker",
    ] {
        args.extend(["--profile", p]);
    }
    let s = start(&args).await;
    let tools = s.session.list_all_tools().await.expect("tools/list");
    assert!(tools.len() >= 14, "every profile's tools: {}", tools.len());
    let file = s._dir.0.join("tools.json");
    std::fs::write(&file, serde_json::to_vec(&tools).expect("json")).expect("write");
    let script = manifest_dir().join("../../tests/e2e/strict_schemas.js");
    let out = std::process::Command::new("node")
        .arg(&script)
        .arg(&file)
        .output()
        .expect("node (scripts/setup.sh installs tests/npm)");
    assert!(
        out.status.success(),
        "strict validation failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("schemas of"), "{said}");
}

#[tokio::test]
async fn each_language_runs_with_structured_output() {
    let s = start(&[]).await;
    let cases = [
        ("python", "import sys\nprint('py', sys.argv[1])", "py arg\n"),
        (
            "javascript",
            "console.log('js', process.argv[2])",
            "js arg\n",
        ),
        ("bash", "echo sh \"$1\"", "sh arg\n"),
        (
            "go",
            "package main\nimport (\"fmt\"; \"os\")\nfunc main() { fmt.Println(\"go\", os.Args[1]) }\n",
            "go arg\n",
        ),
    ];
    for (language, code, want) in cases {
        let r = call(
            &s,
            "execute_code",
            json!({"language": language, "code": code, "args": ["arg"]}),
        )
        .await;
        let v = structured(&r);
        assert_eq!(r.is_error, Some(false), "{language}: {}", text(&r));
        assert_eq!(v["status"], "ok", "{language}: {v}");
        assert_eq!(v["stdout"], want, "{language}: {v}");
        assert_eq!(v["language"], language);
        assert_eq!(text(&r), format!("--- stdout ---\n{want}--- stderr ---\n"));
    }
}

/// QuickJS calls start from one snapshot of the set-up engine: each still finds nothing of
/// the call before it and draws its own random numbers.
#[tokio::test]
async fn wasm_calls_share_nothing_through_the_snapshot() {
    let s = start(&[]).await;
    let mut seen = Vec::new();
    for i in 0..3 {
        let r = call(
            &s,
            "execute_code",
            json!({"language": "javascript", "backend": "wasm", "args": [i.to_string()],
                   "code": "console.log(typeof globalThis.left, process.argv[2], Math.random()); \
                            globalThis.left = 1; Math.random = () => 0"}),
        )
        .await;
        let v = structured(&r);
        assert_eq!(
            (v["status"].as_str(), v["backend"].as_str()),
            (Some("ok"), Some("wasm")),
            "{v}"
        );
        let out = v["stdout"].as_str().unwrap_or_default().to_string();
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words[..2], ["undefined", i.to_string().as_str()], "{out}");
        seen.push(words[2].to_string());
    }
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen.len(),
        3,
        "calls drew the same random numbers: {seen:?}"
    );
}

#[tokio::test]
async fn inputs_reach_the_program() {
    let s = start(&[]).await;
    let r = call(
        &s,
        "execute_code",
        json!({
            "language": "Python",
            "entrypoint_code": "import os, sys\nprint(open('data/in.txt').read().strip(), sys.stdin.read().strip(), os.environ['GREETING'], os.getcwd())",
            "entrypoint_filename": "prog.py",
            "files": [{"filename": "data/in.txt", "content": "ZmlsZQ==", "encoding": "base64"}],
            "stdin": "input",
            "env": {"GREETING": "hi"},
            "timeout_ms": 10000,
        }),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "file input hi /work\n");
}

#[tokio::test]
async fn failures_are_tool_errors_with_the_seed_layout() {
    let s = start(&[]).await;
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": "import sys\nprint('out')\nprint('bad', file=sys.stderr)\nsys.exit(3)"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    let v = structured(&r);
    assert_eq!(v["status"], "error");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(
        text(&r),
        "Execution Failed (error): exit code 3\n--- stdout ---\nout\n--- stderr ---\nbad\n"
    );

    let r = call(
        &s,
        "execute_code",
        json!({"language": "bash", "code": "echo before; sleep 20", "timeout_ms": 500}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["status"], "timeout", "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "before\n");
}

#[tokio::test]
async fn argument_errors_name_the_field() {
    let s = start(&[]).await;
    let cases = [
        (json!({"language": "python", "code": 5}), "code"),
        (
            json!({"language": "python", "code": "1", "cod": "x"}),
            "cod",
        ),
        (json!({"language": "python"}), "code"),
        (json!({"code": "print(1)"}), "language"),
        (json!({"language": "cobol", "code": "x"}), "language"),
        (
            json!({"language": "python", "code": "1", "timeout_ms": 99_999_999}),
            "timeout_ms",
        ),
        (
            json!({"language": "python", "code": "1", "memory_mb": "big"}),
            "memory_mb",
        ),
        (
            json!({"language": "python", "code": "1", "additional_files": [{"filename": "../x", "content": ""}]}),
            "additional_files[0].filename",
        ),
        (
            json!({"language": "python", "code": "1", "snippet_name": "hello"}),
            "snippet_name",
        ),
        (
            json!({"language": "python", "code": "1", "backend": "vm"}),
            "backend",
        ),
        (
            json!({"language": "python", "code": "1", "backend": "process"}),
            "backend",
        ),
    ];
    for (args, field) in cases {
        let r = call(&s, "execute_code", args.clone()).await;
        assert_eq!(r.is_error, Some(true), "{args}");
        let t = text(&r);
        assert!(t.contains(field), "{args}: {t}");
        assert_eq!(structured(&r)["status"], "denied", "{args}");
    }
}

#[tokio::test]
async fn unknown_tool_is_a_protocol_error() {
    let s = start(&[]).await;
    let e = s
        .session
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await
        .expect_err("unknown tool");
    match e {
        ServiceError::McpError(e) => {
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
            assert!(e.message.contains("no_such_tool"), "{}", e.message);
        }
        other => panic!("expected a JSON-RPC error, got {other}"),
    }
}

#[tokio::test]
async fn snippets_run_by_name_and_traversal_is_refused() {
    let s = start(&["--profile", "isolator"]).await;
    let r = call(&s, "execute_code", json!({"snippet_name": "hello"})).await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "hello from a snippet\n");
    assert_eq!(structured(&r)["language"], "python");
    let r = call(
        &s,
        "execute_code",
        json!({"snippet_name": "greet", "args": ["you"]}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "greet you\n", "{}", text(&r));

    for bad in ["../etc/passwd", "a/b", "..", "x\u{0}y", "missing"] {
        let r = call(&s, "execute_code", json!({"snippet_name": bad})).await;
        assert_eq!(r.is_error, Some(true), "{bad:?}");
        assert_eq!(structured(&r)["status"], "denied", "{bad:?}");
        assert!(text(&r).contains("snippet_name"), "{bad:?}: {}", text(&r));
    }

    let templates = s
        .session
        .list_all_resource_templates()
        .await
        .expect("templates");
    assert!(
        templates
            .iter()
            .any(|t| t.uri_template == "gearbox://snippets/{name}")
    );
    let resources = s.session.list_all_resources().await.expect("resources");
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert!(uris.contains(&"gearbox://snippets/hello"), "{uris:?}");
    let src = read(&s, "gearbox://snippets/hello").await;
    assert_eq!(src, "print('hello from a snippet')\n");
    let index: Value = serde_json::from_str(&read(&s, "gearbox://snippets").await).expect("json");
    assert_eq!(index["snippets"][0]["name"], "greet");
    let e = s
        .session
        .read_resource(ReadResourceRequestParams::new("gearbox://snippets/../x"))
        .await
        .expect_err("traversal");
    assert!(matches!(e, ServiceError::McpError(_)), "{e}");
}

async fn read(s: &Server, uri: &str) -> String {
    let r = s
        .session
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
        .unwrap_or_else(|e| panic!("{uri}: {e}"));
    match &r.contents[0] {
        ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("{uri}: not text: {other:?}"),
    }
}

#[tokio::test]
async fn environment_resource_describes_the_sandbox() {
    let s = start(&["--profile", "sidecar"]).await;
    let env: Value = serde_json::from_str(&read(&s, "gearbox://env").await).expect("json");
    assert_eq!(env["workspace"]["cwd"], "/work");
    assert_eq!(env["workspace"]["network"], false);
    let langs = env["languages"].as_array().expect("languages");
    let python = langs
        .iter()
        .find(|l| l["name"] == "python")
        .expect("python");
    assert!(
        python["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("Python 3")),
        "{python}"
    );
    assert!(env["limits"]["timeout_ms"].as_u64().is_some());
    let info = read(&s, "env://info").await;
    assert!(
        info.contains("python: Python 3") && info.contains("/work"),
        "{info}"
    );
}

#[tokio::test]
async fn drop_in_profiles() {
    let s = start(&[
        "--profile",
        "quickjs",
        "--profile",
        "heroku",
        "--profile",
        "sidecar",
    ])
    .await;
    let r = call(
        &s,
        "run_javascript_code",
        json!({"code": "console.log(6 * 7)"}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "42\n");

    let r = call(
        &s,
        "code_exec_python",
        json!({"code": "print('heroku')", "use_temp_dir": true}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    assert_eq!(
        structured(&r),
        &json!({"returncode": 0, "stdout": "heroku\n", "stderr": ""})
    );
    let r = call(
        &s,
        "code_exec_python",
        json!({"code": "import sys; sys.exit(4)"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["returncode"], 4);
    // A URL requirement is refused before anything is installed.
    let r = call(
        &s,
        "code_exec_python",
        json!({"code": "print(1)", "packages": ["requests @ https://evil.example/r.whl"]}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("packages"), "{}", text(&r));

    let r = call(&s, "execute", json!({"code": "print('sidecar')"})).await;
    assert_eq!(structured(&r)["stdout"], "sidecar\n", "{}", text(&r));
    assert_eq!(structured(&r)["exit_code"], 0);
    let r = call(
        &s,
        "execute",
        json!({"code": "echo sh", "language": "bash"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "sh\n", "{}", text(&r));

    let r = call(&s, "list_packages", json!({})).await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let v = structured(&r);
    assert!(
        v["python"].as_str().is_some_and(|p| p.starts_with('3')),
        "{v}"
    );
    let modules = v["modules"].as_array().expect("modules");
    assert!(modules.iter().any(|m| m == "json"), "{v}");
}

/// Processes on this host whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            out.push(pid);
        }
    }
    out
}

/// A server started with the usual soft limit of open files raises it to its hard limit: it
/// holds several descriptors per warm sandbox, call and connection.
#[tokio::test]
async fn the_server_raises_its_open_files_limit() {
    let dir = TempDir::new("nofile");
    let config = dir.0.join("gearbox.toml");
    std::fs::write(&config, "").expect("write");
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(|c| {
            c.arg("--config").arg(&config).arg("serve");
            // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
            unsafe {
                c.pre_exec(|| {
                    let limit = libc::rlimit {
                        rlim_cur: 256,
                        rlim_max: 4096,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }),
    )
    .expect("spawn gearbox serve");
    let pid = transport.id().expect("pid");
    let session = Client::default()
        .serve(transport)
        .await
        .expect("initialize");
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("open files line");
    let figures: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&figures[3..5], ["4096", "4096"], "{line}");
    session.cancel().await.expect("close");
}

/// The parent pid and name of process `pid`.
fn parent_and_name(pid: u32) -> Option<(u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (left, right) = stat.rsplit_once(')')?;
    let name = left.split_once('(')?.1.to_string();
    Some((right.split_whitespace().nth(1)?.parse().ok()?, name))
}

/// Run cgroups created by process `pid` (named after it).
fn run_cgroups_named_for(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("run-{pid}-");
    cgroups::gearbox_roots()
        .iter()
        .flat_map(|r| std::fs::read_dir(r).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// A server whose client leaves ends its fork servers and its helper-built warm sandboxes
/// and leaves no cgroup behind: neither theirs nor the run cgroups it kept for later runs.
#[tokio::test]
async fn a_server_that_stops_leaves_no_cgroup() {
    if !cgroups::root_and_cgroups("run cgroups") {
        return;
    }
    let s = start(&[]).await;
    for (language, code) in [
        ("python", "print(1)"),
        ("javascript", "console.log(1)"),
        ("bash", "echo 1"),
    ] {
        for _ in 0..3 {
            let r = call(
                &s,
                "execute_code",
                json!({"language": language, "code": code}),
            )
            .await;
            assert_eq!(structured(&r)["stdout"], "1\n", "{r:?}");
        }
    }
    // Both fork servers, found from the host as descendants of the server.
    let descends = |mut pid: u32| {
        while pid > 1 {
            if pid == s.pid {
                return true;
            }
            pid = parent_and_name(pid).map_or(0, |(ppid, _)| ppid);
        }
        false
    };
    let descendants = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|&p| descends(p))
            .collect()
    };
    // The cgroups of every process below the server and of the server's own runs, once the
    // two fork servers' and the Bash warm sandbox's are among them (each helper's cgroup is
    // named after the helper).
    let prefix = format!("run-{}-", s.pid);
    let t = Instant::now();
    let dirs = loop {
        let mut dirs: Vec<PathBuf> = descendants()
            .into_iter()
            .flat_map(cgroups::gearbox_cgroups_of)
            .chain(run_cgroups_named_for(s.pid))
            .collect();
        dirs.sort();
        dirs.dedup();
        let mut names: Vec<String> = dirs
            .iter()
            .filter_map(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names.dedup();
        let (runs, helpers): (Vec<&String>, Vec<&String>) =
            names.iter().partition(|n| n.starts_with(&prefix));
        if helpers.len() >= 3 && !runs.is_empty() {
            break dirs;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{dirs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pid = s.pid;
    s.session.cancel().await.expect("close the session");
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the server did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let left: Vec<PathBuf> = dirs
        .iter()
        .filter(|d| d.exists())
        .cloned()
        .chain(run_cgroups_named_for(pid))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// What a killed process left (a run cgroup named after a pid that no longer runs, holding
/// no process) is removed when a server starts (which cgroups the sweep spares: the unit test
/// `the_sweep_removes_only_what_dead_processes_left`).
#[tokio::test]
async fn a_server_start_removes_the_cgroups_dead_processes_left() {
    if !cgroups::root_and_cgroups("run cgroups") {
        return;
    }
    // A pid that ran and is gone: a process started and reaped here.
    let mut gone = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead = gone.id();
    gone.wait().expect("wait");
    let mut stale = Vec::new();
    for root in cgroups::gearbox_roots() {
        std::fs::create_dir_all(&root).expect("gearbox cgroup parent");
        let s = root.join(format!("run-{dead}-sweep-test"));
        std::fs::create_dir(&s).expect("stale cgroup");
        stale.push(s);
    }
    let s = start(&[]).await;
    let t = Instant::now();
    while stale.iter().any(|d| d.exists()) {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "not removed: {stale:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.session.cancel().await.expect("close the session");
}

#[tokio::test]
async fn progress_is_reported_and_cancellation_kills_the_run() {
    let s = start(&[]).await;
    let marker = format!("gearbox-cancel-{}", std::process::id());
    let params = CallToolRequestParams::new("execute_code").with_arguments(obj(json!({
        "language": "python",
        // The marker in a child's command line: a warm Python program is a fork of the fork
        // server, whose command line it keeps (its `sys.argv` is the run's).
        "code": "import subprocess, sys\nprint('started', flush=True)\n\
                 subprocess.run(['/bin/sh', '-c', 'sleep 60', sys.argv[1]])",
        "args": [marker],
    })));
    let handle = s
        .session
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("send");
    let started = Instant::now();
    while s.client.progress.lock().expect("lock").is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no progress notification"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while processes_with(&marker).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the program should be running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let p = s.client.progress.lock().expect("lock")[0].clone();
    assert!(p.message.unwrap_or_default().contains("python"));
    handle.cancel(Some("test".into())).await.expect("cancel");
    let t = Instant::now();
    loop {
        if processes_with(&marker).is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the sandbox survived cancellation: {:?}",
            processes_with(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The server still serves.
    let r = call(
        &s,
        "execute_code",
        json!({"language": "bash", "code": "echo alive"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "alive\n");
}

#[tokio::test]
async fn a_client_that_leaves_gets_its_runs_killed() {
    let s = start(&[]).await;
    let marker = format!("gearbox-leave-{}", std::process::id());
    let params = CallToolRequestParams::new("execute_code").with_arguments(obj(json!({
        "language": "bash", "code": "sleep 60", "args": [marker],
    })));
    let _handle = s
        .session
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("send");
    let t = Instant::now();
    while processes_with(&marker).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(s);
    let t = Instant::now();
    while !processes_with(&marker).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the sandbox outlived its client"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn twenty_concurrent_calls_each_get_their_own_output() {
    let s = Arc::new(start(&[]).await);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let r = call(
                &s,
                "execute_code",
                json!({"language": "python", "code": format!("import time\ntime.sleep(0.2)\nprint('call-{i}')")}),
            )
            .await;
            (i, r)
        }));
    }
    for t in tasks {
        let (i, r) = t.await.expect("join");
        assert_eq!(r.is_error, Some(false), "{i}: {}", text(&r));
        assert_eq!(structured(&r)["stdout"], format!("call-{i}\n"));
    }
}

#[tokio::test]
async fn older_protocol_revisions_negotiate() {
    use rmcp::model::{
        ClientCapabilities, Implementation, InitializeRequestParams, ProtocolVersion,
    };
    for version in [ProtocolVersion::V_2024_11_05, ProtocolVersion::V_2025_03_26] {
        let transport = TokioChildProcess::new(
            tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(|c| {
                c.arg("serve");
            }),
        )
        .expect("spawn");
        let info = InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("test", "0"),
        )
        .with_protocol_version(version.clone());
        let session = info.serve(transport).await.expect("initialize");
        assert_eq!(session.peer_info().expect("info").protocol_version, version);
        let r = session
            .call_tool(
                CallToolRequestParams::new("execute_code")
                    .with_arguments(obj(json!({"language": "bash", "code": "echo v"}))),
            )
            .await
            .expect("call");
        assert_eq!(r.structured_content.expect("s")["stdout"], "v\n");
    }
}

/// The stateless 2026-07-28 revision: no `initialize`, a `server/discover` probe, then
/// self-contained requests carrying their protocol version in `_meta`.
#[tokio::test]
async fn stateless_2026_07_28_revision_runs_code() {
    use rmcp::model::ProtocolVersion;
    use rmcp::{ClientLifecycleMode, ClientServiceExt};
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(|c| {
            c.arg("serve");
        }),
    )
    .expect("spawn");
    let session = Client::default()
        .serve_with_lifecycle(
            transport,
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("server/discover");
    assert_eq!(
        session.peer_info().expect("info").protocol_version,
        ProtocolVersion::V_2026_07_28
    );
    let tools = session.list_all_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "execute_code"));
    let r = session
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(obj(json!({"language": "python", "code": "print(6*7)"}))),
        )
        .await
        .expect("call");
    assert_eq!(r.structured_content.expect("structured")["stdout"], "42\n");
}

/// `gearbox serve` with raw pipes, for tests that write bytes no MCP client would: the child
/// (killed when dropped), its stdin, and its stdout's lines.
fn raw_serve() -> (
    tokio::process::Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) {
    use tokio::io::AsyncBufReadExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox"))
        .arg("serve")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn gearbox serve");
    let stdin = child.stdin.take().expect("stdin");
    let lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    (child, stdin, lines)
}

/// A request longer than a message on stdio may be (16 MiB) is not read, and its id is
/// answered with an error that says so (the transport alone would drop it, and its caller
/// would wait for ever); one with a string id, or with its id after the long params, too. A
/// long notification is dropped. The next call is answered as usual.
#[tokio::test]
async fn an_oversized_request_on_stdio_is_answered_with_an_error() {
    use std::collections::HashMap;
    use tokio::io::AsyncWriteExt;
    let (_child, mut stdin, mut lines) = raw_serve();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let big = "a".repeat(17 << 20);
    let call = |id: &str, stdin: &str, id_last: bool| {
        let params = format!(
            r#""params":{{"name":"execute_code","arguments":{{"language":"python","code":"import sys; print(len(sys.stdin.read()))","stdin":"{stdin}","env":{{"id":"not this"}}}}}}"#
        );
        if id_last {
            format!(r#"{{"jsonrpc":"2.0","method":"tools/call",{params},"id":{id}}}"#)
        } else {
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call",{params}}}"#)
        }
    };
    let string_id = r#""big-\"three\"""#;
    let mut input = [
        init.to_string(),
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_string(),
        call("2", &big, false),
        call(string_id, &big, true),
        format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{big}"}}}}"#
        ),
        call("4", "abc", false),
    ]
    .join("\n");
    input.push('\n');
    let writer = tokio::spawn(async move {
        stdin.write_all(input.as_bytes()).await.expect("write");
        stdin.flush().await.expect("flush");
        stdin
    });
    let mut answers: HashMap<String, Value> = HashMap::new();
    while answers.len() < 4 {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("no more answers within 60 s; have {answers:?}"))
            .expect("read")
            .expect("the server closed stdout early");
        let v: Value = serde_json::from_str(&line).expect("every line the server writes is JSON");
        answers.insert(v["id"].to_string(), v);
    }
    let _stdin = writer.await.expect("writer");
    assert!(answers["1"]["result"]["serverInfo"].is_object());
    for id in ["2", string_id] {
        let v = &answers[id];
        assert_eq!(v["error"]["code"], json!(-32600), "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("not read") && message.contains("16777215"),
            "{v}"
        );
    }
    assert_eq!(
        answers["4"]["result"]["structuredContent"]["stdout"], "3\n",
        "{:?}",
        answers["4"]
    );
}

/// What a broken or hostile client writes on stdio, as raw bytes: lines that are not JSON,
/// JSON that is not JSON-RPC, requests of the wrong shape, wrong types, an unknown method,
/// params that do not fit a method the server serves, a 16 MiB line, invalid UTF-8. Each gets a JSON-RPC error or is
/// dropped; the server never dies and answers the next
/// well-formed call correctly.
#[tokio::test]
async fn hostile_bytes_on_stdio_never_stop_the_server() {
    use tokio::io::{AsyncWriteExt, BufReader};
    let (mut child, mut stdin, mut lines) = raw_serve();
    // Write one line, then read answers until the one with `id` (others are logged).
    async fn send(stdin: &mut tokio::process::ChildStdin, line: &[u8]) {
        stdin.write_all(line).await.expect("write");
        stdin.write_all(b"\n").await.expect("write");
        stdin.flush().await.expect("flush");
    }
    async fn answer(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
        id: i64,
    ) -> Value {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no answer to id {id} within 60 s"))
                .expect("read")
                .unwrap_or_else(|| panic!("the server closed stdout before answering id {id}"));
            let v: Value =
                serde_json::from_str(&line).expect("every line the server writes is JSON");
            assert_eq!(v["jsonrpc"], "2.0", "{line}");
            if v["id"] == json!(id) {
                return v;
            }
        }
    }
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    send(&mut stdin, b"this is not json").await;
    send(&mut stdin, init.to_string().as_bytes()).await;
    let v = answer(&mut lines, 1).await;
    assert!(v["result"]["serverInfo"].is_object(), "{v}");
    send(
        &mut stdin,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;

    let hostile: Vec<Vec<u8>> = vec![
        b"{".to_vec(),
        b"[]".to_vec(),
        b"null".to_vec(),
        br#"{"jsonrpc":"1.0","id":50,"method":"tools/list"}"#.to_vec(),
        b"\xff\xfe\x00garbage".to_vec(),
        br#"{"jsonrpc":"2.0","id":{"nested":true},"method":"tools/list"}"#.to_vec(),
        format!(
            r#"{{"jsonrpc":"2.0","id":51,"method":"tools/call","params":{{"name":"execute_code","arguments":{{"language":"python","code":"{}"}}}}}}"#,
            "#".repeat(16 << 20)
        )
        .into_bytes(),
    ];
    for line in &hostile {
        send(&mut stdin, line).await;
    }
    // A request of the wrong shape whose id can be answered is answered for it, saying what
    // is wrong (rmcp's transport alone answers `-32600` without an id: its caller waits).
    let v = answer(&mut lines, 50).await;
    assert_eq!(v["error"]["code"], json!(-32600), "{v}");
    assert_eq!(
        v["error"]["message"], r#"Invalid Request: "jsonrpc" must be "2.0""#,
        "{v}"
    );
    for (id, line, why) in [
        (
            10,
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":"print(1)"}"#.to_string(),
            r#""params" must be an object"#,
        ),
        (
            11,
            r#"{"method":"tools/call","params":{"name":"execute_code","arguments":{"language":"python","code":"print(1)"},"_meta":"x"},"jsonrpc":"2.0","id":11}"#.to_string(),
            r#""params._meta" must be an object"#,
        ),
        // Valid JSON nested deeper than the parser reads (which takes it for bytes that are
        // not JSON): its caller is answered too.
        (
            12,
            format!(
                r#"{{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{{"name":"execute_code","arguments":{{"language":"python","code":"print(1)","x":{}{}}}}}}}"#,
                "[".repeat(300),
                "]".repeat(300)
            ),
            "the message is nested more than 128 levels deep",
        ),
    ] {
        send(&mut stdin, line.as_bytes()).await;
        let v = answer(&mut lines, id).await;
        assert_eq!(v["error"]["code"], json!(-32600), "{v}");
        assert_eq!(
            v["error"]["message"],
            format!("Invalid Request: {why}"),
            "{v}"
        );
    }
    // A batch (MCP 2025-03-26 has servers accept them): each request answered on its own.
    send(
        &mut stdin,
        br#"[{"jsonrpc":"2.0","id":20,"method":"ping"},{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"execute_code","arguments":{"language":"python","code":"print(20+1)"}}}]"#,
    )
    .await;
    // Answered in any order: read until both have come.
    let mut batch = std::collections::BTreeMap::new();
    while batch.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("both of the batch's requests answered within 60 s")
            .expect("read")
            .expect("the server closed stdout");
        let v: Value = serde_json::from_str(&line).expect("JSON");
        if let Some(id) = v["id"].as_i64().filter(|id| [20, 21].contains(id)) {
            batch.insert(id, v);
        }
    }
    assert_eq!(batch[&20]["result"], json!({}), "{:?}", batch[&20]);
    assert_eq!(
        batch[&21]["result"]["structuredContent"]["stdout"], "21\n",
        "{:?}",
        batch[&21]
    );
    // Wrong types and an unknown method get JSON-RPC errors with their own ids.
    send(
        &mut stdin,
        br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_code","arguments":{"language":5,"code":[]}}}"#,
    )
    .await;
    let v = answer(&mut lines, 2).await;
    let said = v.to_string();
    assert!(
        v["error"].is_object() || v["result"]["isError"] == json!(true),
        "wrong types are refused: {said}"
    );
    assert!(
        said.contains("language"),
        "the error names the field: {said}"
    );
    send(
        &mut stdin,
        br#"{"jsonrpc":"2.0","id":3,"method":"no/such/method"}"#,
    )
    .await;
    let v = answer(&mut lines, 3).await;
    assert_eq!(v["error"]["code"], json!(-32601), "{v}");
    // A method the server serves, with params that do not fit: "invalid params" naming what
    // does not fit, never "method not found".
    for (id, line, names) in [
        (
            5,
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call"}"#,
            "params are missing",
        ),
        (
            6,
            r#"{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{}}"#,
            "`uri`",
        ),
        (
            7,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"execute_code","arguments":"print(1)"}}"#,
            "expected a map",
        ),
        (
            8,
            r#"{"jsonrpc":"2.0","id":8,"method":"initialize","params":{}}"#,
            "`protocolVersion`",
        ),
    ] {
        send(&mut stdin, line.as_bytes()).await;
        let v = answer(&mut lines, id).await;
        assert_eq!(v["error"]["code"], json!(-32602), "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{v}");
    }
    send(
        &mut stdin,
        br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"execute_code","arguments":{"language":"python","code":"print(6*7)"}}}"#,
    )
    .await;
    let v = answer(&mut lines, 4).await;
    assert_eq!(v["result"]["structuredContent"]["stdout"], "42\n", "{v}");
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the server is still running"
    );
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the server ends when stdin closes")
        .expect("wait");
    assert!(status.success(), "clean exit on EOF, not a panic: {status}");
}
