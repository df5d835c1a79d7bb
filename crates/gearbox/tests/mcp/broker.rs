//! Code mode end to end: `gearbox serve` over stdio (rmcp's client) with `[[targets]]` of real
//! downstream MCP servers from npm (`tests/npm`, installed by `scripts/setup.sh`); Python and
//! Node in the Linux sandbox call their tools through the broker's channel.
//! Run with `cargo test --workspace --test mcp -- broker::`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::{TempDir, manifest_dir, obj, structured, text};

const SECRET: &str = "sk-broker-test-7f3a9c";

fn server_js(name: &str) -> String {
    let p = manifest_dir()
        .join("../../tests/npm/node_modules/@modelcontextprotocol")
        .join(name)
        .join("dist/index.js");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup.sh (npm install in tests/npm)",
        p.display()
    );
    p.display().to_string()
}

struct Server {
    session: RunningService<RoleClient, ()>,
    pid: u32,
    files: PathBuf,
    _dir: TempDir,
}

/// The configuration: the three reference servers, `everything` with a secret in its env.
/// Calling other servers' tools is a capability: `full_trust` grants it when asked for,
/// `user_confirmed` asks a human. Sessions and approvals live in `dir`.
fn config(dir: &Path, files: &Path, gear: &str) -> String {
    format!(
        r#"
gear = "{gear}"

[sessions]
dir = {sessions:?}

[approvals]
socket_dir = {approvals:?}

[[targets]]
name = "everything"
command = "node"
args = [{everything:?}, "stdio"]
tags = ["reference"]
env = {{ GEARBOX_TEST_API_KEY = "${{BROKER_MCP_SECRET}}" }}

[[targets]]
name = "memory"
command = "node"
args = [{memory:?}]
env = {{ MEMORY_FILE_PATH = {memfile:?} }}

[[targets]]
name = "filesystem"
command = "node"
args = [{filesystem:?}, {files:?}]
"#,
        everything = server_js("server-everything"),
        memory = server_js("server-memory"),
        filesystem = server_js("server-filesystem"),
        memfile = dir.join("memory.json").display().to_string(),
        files = files.display().to_string(),
        sessions = dir.join("sessions").display().to_string(),
        approvals = dir.join("approvals").display().to_string(),
    )
}

async fn start() -> Server {
    start_with("full_trust", &["default", "broker"]).await
}

async fn start_with(gear: &str, profiles: &[&str]) -> Server {
    let dir = TempDir::new("srv");
    let files = dir.0.join("files");
    std::fs::create_dir_all(&files).expect("mkdir");
    let cfg = dir.0.join("gearbox.toml");
    std::fs::write(&cfg, config(&dir.0, &files, gear)).expect("write config");
    let profiles: Vec<String> = profiles
        .iter()
        .flat_map(|p| ["--profile".to_string(), p.to_string()])
        .collect();
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(|c| {
            c.env("BROKER_MCP_SECRET", SECRET)
                .arg("--config")
                .arg(&cfg)
                .arg("serve")
                .args(&profiles);
        }),
    )
    .expect("spawn gearbox serve");
    let pid = transport.id().expect("pid");
    let session = ().serve(transport).await.expect("initialize");
    Server {
        session,
        pid,
        files,
        _dir: dir,
    }
}

async fn call(s: &Server, tool: &str, args: Value) -> CallToolResult {
    s.session
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj(args)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

fn outcomes(r: &CallToolResult) -> Vec<String> {
    structured(r)["tool_calls"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| format!("{}/{} {}", c["server"], c["tool"], c["outcome"]).replace('"', ""))
                .collect()
        })
        .unwrap_or_default()
}

async fn python(s: &Server, code: &str, extra: Value) -> CallToolResult {
    let mut args = json!({"language": "python", "code": code});
    if let (Some(a), Value::Object(e)) = (args.as_object_mut(), extra) {
        a.extend(e);
    }
    call(s, "execute_code", args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_tools_list_servers_tools_schemas_and_stubs() {
    let s = start().await;
    let names: Vec<String> = s
        .session
        .list_all_tools()
        .await
        .expect("tools/list")
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    for tool in [
        "execute_code",
        "servers_list",
        "server_tools_list",
        "tool_info",
        "tool_stubs",
    ] {
        assert!(names.iter().any(|n| n == tool), "{tool} missing: {names:?}");
    }
    let r = call(&s, "servers_list", json!({})).await;
    let servers = structured(&r)["servers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(servers.len(), 3, "{}", text(&r));
    for srv in &servers {
        assert_eq!(srv["status"], "up", "{srv}");
        assert!(srv["tool_count"].as_u64().unwrap_or(0) > 0, "{srv}");
    }
    let r = call(
        &s,
        "server_tools_list",
        json!({"server": "everything", "filter": "sum"}),
    )
    .await;
    assert!(
        text(&r).contains("everything/get-sum: Returns the sum of two numbers"),
        "{}",
        text(&r)
    );
    let r = call(
        &s,
        "tool_info",
        json!({"server": "everything", "tool": "get-sum"}),
    )
    .await;
    assert_eq!(structured(&r)["inputSchema"]["required"], json!(["a", "b"]));
    let r = call(&s, "tool_stubs", json!({"server": "memory"})).await;
    assert!(
        text(&r).contains("def read_graph() -> Any:"),
        "{}",
        text(&r)
    );
    assert_eq!(structured(&r)["path"], "tools/memory.py");
    let r = call(&s, "tool_info", json!({"server": "nope", "tool": "x"})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(
        text(&r).contains("everything, filesystem, memory"),
        "{}",
        text(&r)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxed_python_calls_three_servers_and_combines_the_results() {
    let s = start().await;
    std::fs::write(s.files.join("motto.txt"), "isolate everything\n").expect("write");
    let code = format!(
        r#"
import gearbox, json
from tools import everything
total = everything.get_sum(a=40, b=2)
gearbox.call_tool("memory", "create_entities", {{"entities": [
    {{"name": "gearbox", "entityType": "project", "observations": ["total %s" % total]}}]}})
graph = gearbox.call_tool("memory", "read_graph", {{}})
motto = gearbox.call_tool("filesystem", "read_text_file", {{"path": {:?}}})
if isinstance(motto, dict):
    motto = motto.get("content", motto)
print(json.dumps({{"total": total, "observations": graph["entities"][0]["observations"],
                  "motto": motto.strip()}}))
"#,
        s.files.join("motto.txt").display().to_string()
    );
    let r = python(
        &s,
        &code,
        json!({"allow_tools": ["everything/get-sum", "memory/*", "filesystem/read_text_file"]}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    let out: Value = serde_json::from_str(v["stdout"].as_str().unwrap_or("").trim()).expect("json");
    assert_eq!(out["motto"], "isolate everything", "{out}");
    assert!(out["total"].to_string().contains("42"), "{out}");
    assert!(
        out["observations"][0].as_str().unwrap_or("").contains("42"),
        "{out}"
    );
    assert_eq!(
        outcomes(&r),
        [
            "everything/get-sum ok",
            "memory/create_entities ok",
            "memory/read_graph ok",
            "filesystem/read_text_file ok"
        ]
    );
    assert!(text(&r).contains("--- tool calls (4) ---"), "{}", text(&r));

    // Node in the sandbox, through the same channel.
    let r = call(
        &s,
        "execute_code",
        json!({"language": "javascript", "allow_tools": ["everything/echo"],
               "code": "const g = require('gearbox');\n\
                        g.callTool('everything', 'echo', {message: 'from node'}).then(console.log);\n\
                        g.callTool('everything', 'get-sum', {a: 1, b: 1}).catch(e => console.log(e.name));"}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    let out = v["stdout"].as_str().unwrap_or("");
    assert!(
        out.contains("Echo: from node") && out.contains("ToolNotAllowed"),
        "{out}"
    );

    // Without allow_tools the sandbox has no channel.
    let r = python(
        &s,
        "import os\nprint(os.environ.get('GEARBOX_BROKER'))",
        json!({}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "None\n");
    assert!(structured(&r).get("tool_calls").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlist_call_limit_and_deadline_are_enforced_in_the_sandbox() {
    let s = start().await;
    let code = r#"
import gearbox, time
try:
    gearbox.call_tool("memory", "read_graph", {})
except gearbox.ToolNotAllowed as e:
    print("refused:", e)
t = time.monotonic()
try:
    gearbox.call_tool("everything", "trigger-long-running-operation", {"duration": 5, "steps": 5})
except gearbox.ToolTimeout as e:
    print("timeout %.1f" % (time.monotonic() - t))
print(gearbox.call_tool("everything", "echo", {"message": "third"}))
try:
    gearbox.call_tool("everything", "echo", {"message": "fourth"})
except gearbox.CallLimitExceeded as e:
    print("limit:", e)
"#;
    let started = Instant::now();
    let r = python(
        &s,
        code,
        json!({"allow_tools": ["everything/*"], "max_calls": 3, "per_call_ms": 800}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the deadline cut the 5 s operation"
    );
    let out = v["stdout"].as_str().unwrap_or("");
    assert!(
        out.contains("refused: memory/read_graph is not allowed"),
        "{out}"
    );
    assert!(
        out.contains("timeout 0.") || out.contains("timeout 1."),
        "{out}"
    );
    assert!(out.contains("Echo: third"), "{out}");
    assert!(out.contains("limit: call limit reached"), "{out}");
    assert_eq!(
        outcomes(&r),
        [
            "memory/read_graph not_allowed",
            "everything/trigger-long-running-operation timeout",
            "everything/echo ok",
            "everything/echo call_limit"
        ]
    );
    // A limit above the configured maximum is refused, naming the field.
    let r = python(
        &s,
        "print(1)",
        json!({"allow_tools": ["everything/*"], "max_calls": 100000}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("max_calls"), "{}", text(&r));
    let r = python(&s, "print(1)", json!({"allow_tools": ["echo"]})).await;
    assert!(text(&r).contains("allow_tools[0]"), "{}", text(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_reaches_the_code_as_a_preview_and_an_artifact() {
    let s = start().await;
    let big: String = (0..30_000).map(|i| format!("row {i}\n")).collect();
    std::fs::write(s.files.join("big.txt"), &big).expect("write");
    let code = format!(
        "import gearbox\nr = gearbox.call_tool('filesystem', 'read_text_file', {{'path': {:?}}})\n\
         print(r['truncated'], r['size_bytes'], r['preview'][:5], r['artifact_id'])\n",
        s.files.join("big.txt").display().to_string()
    );
    let r = python(
        &s,
        &code,
        json!({"allow_tools": ["filesystem/*"], "max_output_kb": 8}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    let out = v["stdout"].as_str().unwrap_or("");
    let id = v["tool_calls"][0]["artifact_id"]
        .as_str()
        .expect("artifact id recorded");
    assert!(
        out.starts_with("True ") && out.contains("row 0") && out.contains(id),
        "{out}"
    );
    assert!(
        out.len() < 2_000,
        "only the preview reached the code: {} bytes",
        out.len()
    );
}

/// Children of `pid` whose command line contains `needle`.
fn children_matching(pid: u32, needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
        if ppid == Some(pid) && String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(child);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_crash_mid_run_is_a_clear_error_and_the_target_restarts() {
    let s = start().await;
    let r = call(&s, "servers_list", json!({})).await;
    assert!(text(&r).contains("everything [stdio] up"), "{}", text(&r));
    let victims = children_matching(s.pid, "server-everything");
    assert_eq!(victims.len(), 1, "one everything server is running");
    let code = r#"
import gearbox
try:
    gearbox.call_tool("everything", "trigger-long-running-operation", {"duration": 8, "steps": 8})
except gearbox.ToolFailed as e:
    print("failed:", e)
"#;
    let victim = victims[0];
    let killer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(2500)).await;
        // SAFETY: kill has no memory-safety preconditions; the pid is the target's server.
        unsafe { libc::kill(victim as i32, libc::SIGKILL) }
    });
    let r = python(
        &s,
        code,
        json!({"allow_tools": ["everything/*"], "per_call_ms": 30000}),
    )
    .await;
    assert_eq!(killer.await.expect("join"), 0);
    let v = structured(&r);
    let out = v["stdout"].as_str().unwrap_or("");
    assert!(
        out.contains("failed: everything/trigger-long-running-operation: connection lost"),
        "{out}{}",
        text(&r)
    );
    assert_eq!(
        outcomes(&r),
        ["everything/trigger-long-running-operation failed"]
    );
    // The next run restarts the server.
    let r = python(
        &s,
        "import gearbox\nprint(gearbox.call_tool('everything', 'echo', {'message': 'back'}))",
        json!({"allow_tools": ["everything/echo"]}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "Echo: back\n", "{}", text(&r));
    let r = call(&s, "servers_list", json!({})).await;
    let everything = structured(&r)["servers"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "everything").cloned())
        .expect("listed");
    assert_eq!(everything["starts"], 2, "{everything}");
    let now = children_matching(s.pid, "server-everything");
    assert_eq!(now.len(), 1);
    assert_ne!(now[0], victim);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_secret_never_reaches_the_sandbox_or_the_result() {
    let s = start().await;
    let code = r#"
import gearbox, os, json
found = []
for k, v in os.environ.items():
    found.append("%s=%s" % (k, v))
for root, dirs, files in os.walk(os.path.dirname(os.environ["GEARBOX_BROKER"])):
    for f in files:
        try:
            found.append(open(os.path.join(root, f), errors="replace").read())
        except OSError:
            pass
env = gearbox.call_tool("everything", "get-env", {})
print(json.dumps({"env_seen_by_target": env, "sandbox": found}))
"#;
    let r = python(&s, code, json!({"allow_tools": ["everything/get-env"]})).await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    let all = format!("{} {}", serde_json::to_string(&r).expect("json"), text(&r));
    assert!(!all.contains(SECRET), "the secret leaked: {all}");
    let out = v["stdout"].as_str().unwrap_or("");
    // The target did get the variable (substituted from gearbox's environment) ...
    assert!(out.contains("GEARBOX_TEST_API_KEY"), "{out}");
    // ... and its value was redacted on the way back.
    assert!(out.contains("[redacted]"), "{out}");
}

#[tokio::test]
async fn a_missing_variable_stops_serve_with_its_name_and_the_target() {
    let dir = TempDir::new("missing");
    let cfg = dir.0.join("gearbox.toml");
    std::fs::write(
        &cfg,
        "[[targets]]\nname = \"api\"\ncommand = \"node\"\nenv = { TOKEN = \"${GEARBOX_SURELY_UNSET_VAR}\" }\n",
    )
    .expect("write");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox"))
            .arg("--config")
            .arg(&cfg)
            .arg("serve")
            .env_remove("GEARBOX_SURELY_UNSET_VAR")
            .stdin(std::process::Stdio::null())
            .output(),
    )
    .await
    .expect("exits")
    .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GEARBOX_SURELY_UNSET_VAR")
            && err.contains("\"api\"")
            && err.contains("env.TOKEN"),
        "{err}"
    );
}

/// A session run may call tools too: `exec_run` with `allow_tools` gets its channel, and the
/// files it writes stay in the session for the next run.
#[tokio::test]
async fn a_session_run_calls_tools_and_keeps_its_files() {
    let s = start_with("full_trust", &["sessions", "broker"]).await;
    let opened = call(&s, "exec_open", json!({})).await;
    let id = structured(&opened)["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let code = "from tools import everything\n\
                total = everything.get_sum(a=20, b=22)\n\
                open('total.txt', 'w').write(str(total))\n\
                print('sum', total)\n";
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "python", "code": code,
               "allow_tools": ["everything/get-sum"]}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    assert!(v["stdout"].as_str().unwrap_or("").contains("42"), "{v}");
    assert_eq!(v["tool_calls"][0]["tool"], "get-sum", "{v}");
    assert_eq!(v["workspace_saved"], true, "{v}");
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "bash", "code": "cat total.txt"}),
    )
    .await;
    assert!(
        structured(&r)["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("42"),
        "the file the first run left: {}",
        text(&r)
    );
}

/// `gearbox approve` against the server of `config`.
fn approve(config_dir: &Path, id: &str) {
    let cfg = config_dir.join("gearbox.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gearbox"))
        .arg("--config")
        .arg(&cfg)
        .args(["approve", id])
        .output()
        .expect("gearbox approve");
    assert!(
        out.status.success(),
        "gearbox approve: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A run that waits for a human is resumed whole: `approval_status` runs it with its tool
/// channel and in its session, as the human saw it.
#[tokio::test]
async fn a_run_resumed_by_approval_status_keeps_its_tools_and_session() {
    let s = start_with("user_confirmed", &["default", "sessions", "broker"]).await;
    let opened = call(&s, "exec_open", json!({})).await;
    let id = structured(&opened)["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let code = "import gearbox\n\
                r = gearbox.call_tool('everything', 'echo', {'message': 'resumed'})\n\
                open('echo.txt', 'w').write(str(r))\n\
                print(r)\n";
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "python", "code": code,
               "allow_tools": ["everything/echo"]}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "pending_approval", "{}", text(&r));
    assert_eq!(v["workspace_saved"], false, "nothing ran yet: {v}");
    let op = v["operation_id"]
        .as_str()
        .expect("operation_id")
        .to_string();
    approve(&s._dir.0, &op);
    let r = call(&s, "approval_status", json!({"operation_id": op})).await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    assert!(
        v["stdout"].as_str().unwrap_or("").contains("resumed"),
        "the tool channel was there: {v}"
    );
    assert_eq!(v["tool_calls"][0]["tool"], "echo", "{v}");
    assert_eq!(v["session_id"], id.as_str(), "{v}");
    assert_eq!(v["workspace_saved"], true, "the session's workspace: {v}");
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "bash", "code": "cat echo.txt"}),
    )
    .await;
    assert!(
        structured(&r)["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("resumed"),
        "{}",
        text(&r)
    );
}

/// A live session opened with `allow_tools`: every cell of its interpreter reaches the
/// tools through the session's channel, the limits apply to each cell, each result lists
/// that cell's calls, and closing the session removes the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_sessions_cells_call_tools_within_per_cell_limits() {
    let s = start_with("full_trust", &["sessions", "broker"]).await;
    let opened = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "python",
               "allow_tools": ["everything/get-sum", "memory/*"], "max_calls": 2}),
    )
    .await;
    assert_ne!(opened.is_error, Some(true), "{}", text(&opened));
    let id = structured(&opened)["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let cell = |code: &str| json!({"session_id": id, "language": "python", "code": code});

    let r = call(
        &s,
        "exec_run",
        cell("from tools import everything\nimport os\nsock = os.environ['GEARBOX_BROKER']\nt = everything.get_sum(a=40, b=2)\nt"),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    assert!(v["result"].to_string().contains("42"), "{v}");
    assert_eq!(outcomes(&r), ["everything/get-sum ok"]);

    // State persists; a cell without calls reports none.
    let r = call(&s, "exec_run", cell("sock")).await;
    let v = structured(&r);
    let sock = v["result"]
        .as_str()
        .unwrap_or("")
        .trim_matches('\'')
        .to_string();
    assert!(sock.ends_with("broker.sock"), "{v}");
    assert!(
        Path::new(&sock).exists(),
        "the channel lives with the session: {sock}"
    );
    assert_eq!(outcomes(&r), Vec::<String>::new());

    // max_calls counts per cell: two calls pass (three in the session so far), the third
    // is refused; a tool outside the allowlist is refused.
    let code = "import gearbox\nout = []\nfor i in range(3):\n    try:\n        out.append(everything.get_sum(a=i, b=1))\n    except Exception as e:\n        out.append(type(e).__name__)\nprint(out)\n";
    let r = call(&s, "exec_run", cell(code)).await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    assert!(
        v["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("CallLimitExceeded"),
        "{v}"
    );
    assert_eq!(
        outcomes(&r),
        [
            "everything/get-sum ok",
            "everything/get-sum ok",
            "everything/get-sum call_limit"
        ]
    );
    let r = call(
        &s,
        "exec_run",
        cell("try:\n    gearbox.call_tool('everything', 'echo', {'message': 'x'})\nexcept Exception as e:\n    print(type(e).__name__)"),
    )
    .await;
    assert!(
        structured(&r)["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("ToolNotAllowed"),
        "{}",
        text(&r)
    );

    // A cell cannot bring tools of its own.
    let mut args = cell("1");
    args["allow_tools"] = json!(["filesystem/*"]);
    let r = call(&s, "exec_run", args).await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("exec_open"), "{}", text(&r));

    let closed = call(&s, "exec_close", json!({"session_id": id})).await;
    assert_ne!(closed.is_error, Some(true), "{}", text(&closed));
    assert!(
        !Path::new(&sock).exists(),
        "closing removes the channel: {sock}"
    );

    // JavaScript: a cell's promise is awaited.
    let opened = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "javascript", "allow_tools": ["everything/echo"]}),
    )
    .await;
    let id = structured(&opened)["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "javascript",
               "code": "const g = require('gearbox'); g.callTool('everything', 'echo', {message: 'from a cell'})"}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(v["status"], "ok", "{}", text(&r));
    assert!(v["result"].to_string().contains("from a cell"), "{v}");
    assert_eq!(outcomes(&r), ["everything/echo ok"]);
}

/// A gear that denies tools cannot open a live session with them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_session_gets_no_tools_where_the_gear_denies_them() {
    let s = start_with("restricted", &["sessions", "broker"]).await;
    let r = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "python", "allow_tools": ["everything/*"]}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(
        text(&r).contains("restricted gear denies tools"),
        "{}",
        text(&r)
    );
}
