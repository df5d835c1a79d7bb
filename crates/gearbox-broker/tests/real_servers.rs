//! The broker against real downstream MCP servers from npm (`tests/npm`, installed by
//! `scripts/setup.sh`): discovery, stubs, and code-mode calls made by a real Python process
//! through the run channel and the shipped SDK. (The same calls from inside the Linux sandbox,
//! through `gearbox serve`, are tested in `crates/gearbox/tests/mcp/broker.rs`.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gearbox_broker::{
    Broker, BrokerConfig, CallLimits, CallOutcome, CallPolicy, FileArtifactSink, Status,
    StubLanguage, TargetConfig,
};

fn npm_dir() -> PathBuf {
    manifest_dir().join("../../tests/npm/node_modules/@modelcontextprotocol")
}

fn server_js(name: &str) -> String {
    let p = npm_dir().join(name).join("dist/index.js");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup.sh (npm install in tests/npm)",
        p.display()
    );
    p.display().to_string()
}

struct Tmp(PathBuf);
impl Tmp {
    fn new(tag: &str) -> Tmp {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("gearbox-broker-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).expect("mkdir");
        Tmp(p)
    }
}
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn everything() -> TargetConfig {
    TargetConfig {
        name: "everything".into(),
        command: Some("node".into()),
        args: vec![server_js("server-everything"), "stdio".into()],
        tags: vec!["reference".into()],
        ..Default::default()
    }
}

fn memory(file: &Path) -> TargetConfig {
    TargetConfig {
        name: "memory".into(),
        command: Some("node".into()),
        args: vec![server_js("server-memory")],
        env: [("MEMORY_FILE_PATH".to_string(), file.display().to_string())].into(),
        ..Default::default()
    }
}

fn filesystem(root: &Path) -> TargetConfig {
    TargetConfig {
        name: "filesystem".into(),
        command: Some("node".into()),
        args: vec![server_js("server-filesystem"), root.display().to_string()],
        ..Default::default()
    }
}

fn config(runtime: &Path) -> BrokerConfig {
    BrokerConfig {
        runtime_dir: Some(runtime.join("rt")),
        ..Default::default()
    }
}

fn policy(allow: &[&str], f: impl FnOnce(&mut CallLimits)) -> CallPolicy {
    let mut l = CallLimits::default();
    f(&mut l);
    CallPolicy::new(allow.iter().map(|s| s.to_string()).collect(), l).expect("policy")
}

/// Run `code` with python3 and the channel's environment (the SDK on PYTHONPATH); stdout.
async fn python(env: &[(String, String)], code: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(code)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().cloned())
        .output()
        .await
        .expect("python3");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_servers_tools_schemas_and_stubs() {
    let tmp = Tmp::new("disc");
    let broker = Broker::new(
        &[everything(), memory(&tmp.0.join("mem.json"))],
        config(&tmp.0),
    )
    .expect("broker");
    let servers = broker.servers().await;
    assert_eq!(servers.len(), 2);
    for s in &servers {
        assert_eq!(s.status, Status::Up, "{s:?}");
        assert!(s.tool_count.unwrap_or(0) >= 5, "{s:?}");
    }
    let sums = broker.tools(None, Some("sum")).await.expect("tools");
    assert!(
        sums.iter()
            .any(|t| t.server == "everything" && t.name == "get-sum"),
        "{sums:?}"
    );
    let memory_tools = broker
        .tools(Some("memory"), Some("memory/*graph*"))
        .await
        .expect("glob");
    assert!(
        memory_tools.iter().any(|t| t.name == "read_graph"),
        "{memory_tools:?}"
    );
    assert!(
        memory_tools.iter().all(|t| t.name.contains("graph")),
        "{memory_tools:?}"
    );
    let echo = broker.tool_info("everything", "echo").await.expect("info");
    assert!(
        echo.input_schema
            .get("properties")
            .is_some_and(|p| p.get("message").is_some())
    );
    let e = broker
        .tool_info("everything", "nope")
        .await
        .expect_err("unknown");
    assert!(e.to_string().contains("nope"), "{e}");
    let e = broker
        .tools(Some("nobody"), None)
        .await
        .expect_err("server");
    assert!(e.to_string().contains("everything, memory"), "{e}");

    // The Python stub module is valid Python and calls through the SDK.
    let py = broker
        .stubs("everything", StubLanguage::Python)
        .await
        .expect("stubs");
    assert!(
        py.contains("def get_sum(*, a: float, b: float) -> Any:"),
        "{py}"
    );
    let js = broker
        .stubs("everything", StubLanguage::Javascript)
        .await
        .expect("js stubs");
    assert!(js.contains("async function get_sum(args = {})"), "{js}");
    let run = broker
        .open_run(policy(&["everything/*"], |_| {}))
        .await
        .expect("open");
    let code = "from tools import everything\nprint(everything.get_sum(a=2, b=40))\n";
    let (ok, out, err) = python(&run.env(), code).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("42"), "{out}");
    let node = tokio::process::Command::new("node")
        .arg("-e")
        .arg(
            "const e = require('tools/everything');\
             e.get_sum({a: 1, b: 2}).then(r => console.log('sum', r));",
        )
        .env_clear()
        .env("PATH", "/usr/bin:/bin:/usr/local/bin")
        .envs(run.env())
        .output()
        .await
        .expect("node");
    let out = String::from_utf8_lossy(&node.stdout);
    assert!(
        out.contains("sum") && out.contains('3'),
        "{out}{}",
        String::from_utf8_lossy(&node.stderr)
    );
    let records = run.finish();
    assert_eq!(records.len(), 2, "{records:?}");
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_calls_three_servers_and_combines_results() {
    let tmp = Tmp::new("three");
    let root = tmp.0.join("files");
    std::fs::create_dir_all(&root).expect("mkdir");
    std::fs::write(root.join("notes.txt"), "gearbox brokers tools\n").expect("write");
    let broker = Broker::new(
        &[
            everything(),
            memory(&tmp.0.join("mem.json")),
            filesystem(&root),
        ],
        config(&tmp.0),
    )
    .expect("broker");
    let run = broker
        .open_run(policy(
            &[
                "everything/get-sum",
                "memory/*",
                "filesystem/read_text_file",
            ],
            |_| {},
        ))
        .await
        .expect("open");
    // Permissions the sandbox relies on: the directory is traversable and the socket
    // writable by the server and the sandbox's group (root), or by the server's uid only.
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    // SAFETY: geteuid has no preconditions.
    let as_root = unsafe { libc::geteuid() } == 0;
    assert_eq!(mode(run.dir()), if as_root { 0o710 } else { 0o700 });
    assert_eq!(mode(run.socket()), if as_root { 0o660 } else { 0o600 });
    assert_eq!(mode(&run.sdk_dir().join("gearbox.py")), 0o444);
    let code = format!(
        r#"
import gearbox, json
total = gearbox.call_tool("everything", "get-sum", {{"a": 19, "b": 23}})
gearbox.call_tool("memory", "create_entities", {{"entities": [
    {{"name": "gearbox", "entityType": "project", "observations": ["sum is " + str(total)]}}]}})
graph = gearbox.call_tool("memory", "read_graph", {{}})
text = gearbox.call_tool("filesystem", "read_text_file", {{"path": {:?}}})
if isinstance(text, dict):
    text = text.get("content", text)
print(json.dumps({{"total": total, "entities": [e["name"] for e in graph["entities"]],
                  "file": text.strip()}}))
"#,
        root.join("notes.txt").display().to_string()
    );
    let (ok, out, err) = python(&run.env(), &code).await;
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["entities"][0], "gearbox", "{v}");
    assert_eq!(v["file"], "gearbox brokers tools", "{v}");
    assert!(v["total"].to_string().contains("42"), "{v}");
    let dir = run.dir().to_path_buf();
    let records = run.finish();
    assert!(!dir.exists(), "finish removes the run directory");
    let names: Vec<String> = records
        .iter()
        .map(|r| format!("{}/{}", r.server, r.tool))
        .collect();
    assert_eq!(
        names,
        [
            "everything/get-sum",
            "memory/create_entities",
            "memory/read_graph",
            "filesystem/read_text_file"
        ]
    );
    assert!(
        records.iter().all(|r| r.outcome == CallOutcome::Ok),
        "{records:?}"
    );
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowlist_max_calls_and_per_call_deadline_are_enforced() {
    let tmp = Tmp::new("limits");
    let broker = Broker::new(&[everything()], config(&tmp.0)).expect("broker");
    let run = broker
        .open_run(policy(
            &[
                "everything/echo",
                "everything/trigger-long-running-operation",
            ],
            |l| {
                l.max_calls = 4;
                l.per_call_ms = 700;
            },
        ))
        .await
        .expect("open");
    let code = r#"
import gearbox, time
print(gearbox.call_tool("everything", "echo", {"message": "one"}))
try:
    gearbox.call_tool("everything", "get-env", {})
except gearbox.ToolNotAllowed as e:
    print("refused:", e)
t = time.monotonic()
try:
    gearbox.call_tool("everything", "trigger-long-running-operation", {"duration": 5, "steps": 5})
except gearbox.ToolTimeout as e:
    print("timeout after %.1f s:" % (time.monotonic() - t), e)
print(gearbox.call_tool("everything", "echo", {"message": "four"}))
try:
    gearbox.call_tool("everything", "echo", {"message": "five"})
except gearbox.CallLimitExceeded as e:
    print("limit:", e)
print(issubclass(gearbox.CallLimitExceeded, gearbox.ToolError))
"#;
    let started = Instant::now();
    let (ok, out, err) = python(&run.env(), code).await;
    assert!(ok, "{out}{err}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the deadline cut the 5 s operation"
    );
    assert!(out.contains("Echo: one"), "{out}");
    assert!(
        out.contains("refused: everything/get-env is not allowed"),
        "{out}"
    );
    assert!(
        out.contains("timeout after 0.") && out.contains("per_call_ms"),
        "{out}"
    );
    assert!(out.contains("Echo: four"), "{out}");
    assert!(out.contains("limit: call limit reached"), "{out}");
    let outcomes: Vec<CallOutcome> = run.finish().iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [
            CallOutcome::Ok,
            CallOutcome::NotAllowed,
            CallOutcome::Timeout,
            CallOutcome::Ok,
            CallOutcome::CallLimit
        ]
    );
    // The target is still usable after a cancelled call.
    let r = broker
        .call(
            "everything",
            "echo",
            Some(serde_json::from_str(r#"{"message":"after"}"#).expect("obj")),
            Duration::from_secs(10),
        )
        .await
        .expect("call");
    assert!(format!("{r:?}").contains("after"));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_result_becomes_an_artifact() {
    let tmp = Tmp::new("large");
    let root = tmp.0.join("files");
    std::fs::create_dir_all(&root).expect("mkdir");
    let big: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(root.join("big.txt"), &big).expect("write");
    let broker = Broker::new(&[filesystem(&root)], config(&tmp.0)).expect("broker");
    let sink = Arc::new(FileArtifactSink::new(tmp.0.join("artifacts")));
    let run = broker
        .open_run_with_sink(
            policy(&["filesystem/*"], |l| l.max_output_kb = 16),
            sink.clone(),
        )
        .await
        .expect("open");
    let code = format!(
        "import gearbox, json\nr = gearbox.call_tool('filesystem', 'read_text_file', {{'path': {:?}}})\n\
         print(json.dumps({{'truncated': r['truncated'], 'id': r['artifact_id'], 'size': r['size_bytes'], \
         'preview': r['preview'][:20]}}))\n",
        root.join("big.txt").display().to_string()
    );
    let (ok, out, err) = python(&run.env(), &code).await;
    assert!(ok, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["truncated"], true);
    assert!(v["size"].as_u64().unwrap_or(0) > big.len() as u64, "{v}");
    assert!(
        v["preview"].as_str().unwrap_or("").starts_with("line 0"),
        "{v}"
    );
    let id = v["id"].as_str().expect("id");
    let stored = sink.read(id).expect("artifact stored");
    let doc: serde_json::Value = serde_json::from_slice(&stored).expect("json");
    assert!(doc["text"].as_str().unwrap_or("").contains("line 19999"));
    let records = run.finish();
    assert_eq!(records[0].artifact_id.as_deref(), Some(id));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_target_fails_the_call_clearly_and_restarts_next_time() {
    let tmp = Tmp::new("crash");
    let broker = Broker::new(&[everything()], config(&tmp.0)).expect("broker");
    let run = broker
        .open_run(policy(&["everything/*"], |l| l.per_call_ms = 20_000))
        .await
        .expect("open");
    let pid = broker
        .target_pid("everything")
        .await
        .expect("started by open_run (stubs)");
    let env = run.env();
    let code = r#"
import gearbox
try:
    gearbox.call_tool("everything", "trigger-long-running-operation", {"duration": 10, "steps": 10})
    print("finished?")
except gearbox.ToolFailed as e:
    print("failed:", e)
print(gearbox.call_tool("everything", "echo", {"message": "again"}))
"#;
    let child = tokio::spawn(async move { python(&env, code).await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // SAFETY: kill has no memory-safety preconditions; the pid is the target's server.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let (ok, out, err) = child.await.expect("join");
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("failed: everything/trigger-long-running-operation: connection lost"),
        "{out}"
    );
    assert!(out.contains("restarted on next use"), "{out}");
    assert!(out.contains("Echo: again"), "{out}");
    let new_pid = broker.target_pid("everything").await.expect("restarted");
    assert_ne!(new_pid, pid);
    let info = broker.servers().await;
    assert_eq!(info[0].starts, 2, "{info:?}");
    let records = run.finish();
    assert_eq!(records[0].outcome, CallOutcome::Failed);
    assert_eq!(records[1].outcome, CallOutcome::Ok);
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variables_reach_the_target_and_secrets_never_reach_the_code() {
    let tmp = Tmp::new("secret");
    let secret = format!("sk-test-{}", std::process::id());
    let mut t = everything();
    t.env.insert(
        "GEARBOX_TEST_API_KEY".into(),
        "${BROKER_TEST_SECRET}".into(),
    );
    let lookup = |k: &str| (k == "BROKER_TEST_SECRET").then(|| secret.clone());
    let broker = Broker::with_lookup(&[t.clone()], config(&tmp.0), &lookup).expect("broker");
    // The target itself got the substituted value.
    let direct = broker
        .call("everything", "get-env", None, Duration::from_secs(10))
        .await
        .expect("get-env");
    assert!(
        format!("{direct:?}").contains(&secret),
        "substituted into the target's env"
    );
    assert!(!format!("{broker:?} {t:?}").contains(&secret));

    let run = broker
        .open_run(policy(&["everything/*"], |_| {}))
        .await
        .expect("open");
    assert!(!format!("{:?}", run.env()).contains(&secret));
    let code = r#"
import gearbox, os
env = gearbox.call_tool("everything", "get-env", {})
print(env)
print("environ:", sorted(os.environ))
"#;
    let (ok, out, err) = python(&run.env(), code).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("GEARBOX_TEST_API_KEY"), "{out}");
    assert!(!out.contains(&secret), "the secret reached the code: {out}");
    assert!(out.contains("[redacted]"), "{out}");
    for entry in walk(run.dir()) {
        let text = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&text).contains(&secret),
            "{} holds the secret",
            entry.display()
        );
    }
    let records = run.finish();
    assert!(!format!("{records:?}").contains(&secret));

    // A missing variable is an error naming it and the target.
    let e = Broker::with_lookup(&[t], config(&tmp.0), &|_| None).expect_err("missing");
    let text = e.to_string();
    assert!(
        text.contains("BROKER_TEST_SECRET") && text.contains("\"everything\""),
        "{text}"
    );
    broker.shutdown().await;
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_cannot_start_is_reported_not_fatal() {
    let tmp = Tmp::new("down");
    let bad = TargetConfig {
        name: "broken".into(),
        command: Some("/nonexistent/mcp-server".into()),
        ..Default::default()
    };
    let broker = Broker::new(&[bad, everything()], config(&tmp.0)).expect("broker");
    let servers = broker.servers().await;
    let broken = servers.iter().find(|s| s.name == "broken").expect("listed");
    assert_eq!(broken.status, Status::Down);
    assert!(
        broken
            .error
            .as_deref()
            .unwrap_or("")
            .contains("/nonexistent/mcp-server"),
        "{broken:?}"
    );
    let ok = servers
        .iter()
        .find(|s| s.name == "everything")
        .expect("listed");
    assert_eq!(ok.status, Status::Up);
    // Listing every server skips the one that is down.
    assert!(!broker.tools(None, None).await.expect("tools").is_empty());
    // The next attempt waits for the back-off and says so.
    let e = broker.tools(Some("broken"), None).await.expect_err("down");
    assert!(e.to_string().contains("next start attempt in"), "{e}");
    broker.shutdown().await;
}

/// This package's directory: as cargo gives it when it runs the test (a build cache shared
/// between checkouts may hold a binary compiled in another one).
fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}
