//! `gearbox serve --http` end to end: the real binary on a loopback port, driven by rmcp's
//! Streamable HTTP client and by raw HTTP (reqwest). Run with
//! `cargo test --workspace --test mcp -- http::`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::support::{TempDir, obj, structured, text};

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-fedcba9876543210";

/// A running `gearbox serve --http 127.0.0.1:0`.
struct Daemon {
    child: tokio::process::Child,
    base: String,
    dir: TempDir,
    audit: PathBuf,
    stderr: Arc<Mutex<String>>,
}

struct Opts<'a> {
    keys: Option<&'a str>,
    config: &'a str,
    /// `None`: a fresh audit file in the temp dir.
    audit: Option<&'a Path>,
    extra: &'a [&'a str],
    /// `--http` address.
    listen: &'a str,
    env: &'a [(&'a str, &'a str)],
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            keys: Some("alice:alice-key-0123456789abcdef,bob:bob-key-fedcba9876543210"),
            config: "",
            audit: None,
            extra: &[],
            listen: "127.0.0.1:0",
            env: &[],
        }
    }
}

impl Daemon {
    async fn start(o: Opts<'_>) -> Daemon {
        let dir = TempDir::new("d");
        let config = dir.0.join("gearbox.toml");
        std::fs::write(&config, o.config).expect("config");
        let audit = o
            .audit
            .map_or_else(|| dir.0.join("audit.jsonl"), Path::to_path_buf);
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox"));
        cmd.arg("--config")
            .arg(&config)
            .args(["--log", "info", "serve", "--http", o.listen])
            .arg("--audit-log")
            .arg(&audit)
            .args(o.extra)
            .env_remove("GEARBOX_API_KEYS")
            .env_remove("PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd.env_remove("GEARBOX_REPLICA")
            .env_remove("GEARBOX_PEER_SECRET")
            .envs(o.env.iter().copied());
        if let Some(k) = o.keys {
            cmd.env("GEARBOX_API_KEYS", k);
        }
        let mut child = cmd.spawn().expect("spawn gearbox serve --http");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let log2 = log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut tx = Some(tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(rest) = line.strip_prefix("gearbox: listening on ")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(rest.trim_end_matches("/mcp").to_string());
                }
                let mut l = log2.lock().expect("lock");
                l.push_str(&line);
                l.push('\n');
            }
        });
        let base = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .unwrap_or_else(|_| panic!("no listening line; stderr:\n{}", log.lock().expect("l")))
            .unwrap_or_else(|_| panic!("gearbox exited; stderr:\n{}", log.lock().expect("l")));
        Daemon {
            child,
            base,
            dir,
            audit,
            stderr: log,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    async fn client(
        &self,
        key: Option<&str>,
    ) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
        let mut cfg = StreamableHttpClientTransportConfig::with_uri(self.url("/mcp"));
        cfg.auth_header = key.map(str::to_string);
        let transport = StreamableHttpClientTransport::from_config(cfg);
        ().serve(transport).await.expect("rmcp client connects")
    }

    fn audit_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad audit line {l}: {e}")))
            .collect()
    }

    async fn metrics(&self) -> String {
        http()
            .get(self.url("/metrics"))
            .bearer_auth(ALICE)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

fn initialize_body() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
}

fn mcp_post(url: &str) -> reqwest::RequestBuilder {
    http()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
}

/// `initialize` + `notifications/initialized` over raw HTTP; the session id.
async fn raw_session(d: &Daemon, key: &str) -> String {
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(key)
        .json(&initialize_body())
        .send()
        .await
        .expect("initialize");
    assert_eq!(r.status(), 200);
    let sid = r
        .headers()
        .get("mcp-session-id")
        .expect("session id")
        .to_str()
        .expect("ascii")
        .to_string();
    let _ = r.text().await;
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(key)
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", "2025-03-26")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .expect("initialized");
    assert_eq!(r.status(), 202);
    sid
}

/// The JSON-RPC message with `id` in an SSE or JSON response body.
fn rpc_result(body: &str, id: i64) -> Option<Value> {
    let candidates: Vec<Value> = if body.trim_start().starts_with('{') {
        serde_json::from_str(body).into_iter().collect()
    } else {
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    };
    candidates.into_iter().find(|v| v["id"] == json!(id))
}

#[tokio::test]
async fn rmcp_client_runs_code_and_the_audit_names_the_caller() {
    let d = Daemon::start(Opts::default()).await;
    let client = d.client(Some(ALICE)).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    assert!(tools.iter().any(|t| t.name == "execute_code"));
    let r = client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(obj(json!({"language": "python", "code": "print(6*7)"}))),
        )
        .await
        .expect("tools/call");
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    assert!(text(&r).contains("42"), "{}", text(&r));
    let r = client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(obj(json!({"language": "bash", "code": "exit 3"}))),
        )
        .await
        .expect("tools/call");
    assert_eq!(r.is_error, Some(true));
    client.cancel().await.expect("close");

    let lines = d.audit_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let first = &lines[0];
    assert_eq!(first["event"], "execution");
    assert_eq!(first["caller"], "alice");
    assert_eq!(first["transport"], "http");
    assert_eq!(first["tool"], "execute_code");
    assert_eq!(first["language"], "python");
    assert_eq!(first["status"], "ok");
    assert_eq!(first["code"], "print(6*7)");
    assert_eq!(
        first["code_sha256"],
        "cd3af9ab64293a6125a6da8ec338eed3869ab92ba950a4d09ce150114746cd90"
    );
    assert_eq!(first["code_sha256"].as_str().map(str::len), Some(64));
    assert!(first["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert!(first["durations"]["total_ms"].is_u64());
    assert!(first["durations"]["queued_ms"].is_u64());
    assert_eq!(lines[1]["status"], "error");
    assert_eq!(lines[1]["exit_code"], 3);
    let all = std::fs::read_to_string(&d.audit).expect("audit");
    assert!(!all.contains(ALICE), "the key itself must never be logged");
    assert!(
        !d.stderr().contains(ALICE),
        "the key itself must never be logged"
    );

    let m = d.metrics().await;
    for needle in [
        "mcp_execution_requests_total{language=\"python\",status=\"ok\"} 1",
        "mcp_execution_requests_total{language=\"bash\",status=\"error\"} 1",
        "mcp_execution_errors_total{reason=\"program\"} 1",
        "mcp_execution_duration_seconds_count 2",
        "mcp_execution_in_flight 0",
        "mcp_execution_queue_depth 0",
        "mcp_sandbox_setup_seconds_count",
    ] {
        assert!(m.contains(needle), "{needle} missing from\n{m}");
    }
}

#[tokio::test]
async fn keys_are_required_and_accepted_in_both_headers() {
    let d = Daemon::start(Opts::default()).await;
    let r = mcp_post(&d.url("/mcp"))
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    let body: Value = r.json().await.expect("json body");
    assert_eq!(body["jsonrpc"], "2.0");
    assert!(body["error"]["code"].is_i64());
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("API key")),
        "{body}"
    );
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth("wrong-key-0123456789abcdef")
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 401);
    let r = mcp_post(&d.url("/mcp"))
        .header("x-api-key", "wrong-key-0123456789abcdef")
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 401);
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(ALICE)
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    let r = mcp_post(&d.url("/mcp"))
        .header("x-api-key", BOB)
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    // Health needs no key; metrics and the SSE transport do.
    for (path, want) in [
        ("/healthz", 200),
        ("/readyz", 200),
        ("/metrics", 401),
        ("/sse", 401),
    ] {
        let r = http().get(d.url(path)).send().await.expect("get");
        assert_eq!(r.status(), want, "{path}");
    }
    let r = http()
        .post(d.url("/messages?sessionId=x"))
        .body("{}")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 401);
    // A client without a key cannot even connect.
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(d.url("/mcp"));
    cfg.auth_header = None;
    assert!(
        ().serve(StreamableHttpClientTransport::from_config(cfg))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_foreign_origin_is_refused() {
    let d = Daemon::start(Opts::default()).await;
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(ALICE)
        .header("origin", "http://evil.example")
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 403);
    let r = http()
        .get(d.url("/sse"))
        .bearer_auth(ALICE)
        .header("origin", "http://evil.example")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 403);
    let r = http()
        .get(d.url("/sse"))
        .bearer_auth(ALICE)
        .header("host", "evil.example")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 403, "DNS rebinding: a foreign Host");
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(ALICE)
        .header("origin", "http://localhost:3000")
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn an_oversized_body_is_refused() {
    let d = Daemon::start(Opts {
        config: "[http]\nmax_body_bytes = 65536\n",
        ..Opts::default()
    })
    .await;
    let big = "x".repeat(200_000);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {},
        "clientInfo": {"name": big, "version": "1"}}});
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(ALICE)
        .json(&body)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 413);
    let r = http()
        .post(d.url("/messages?sessionId=x"))
        .bearer_auth(ALICE)
        .body(big)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 413);
}

#[tokio::test]
async fn past_the_queue_every_call_still_gets_an_answer() {
    let d = Daemon::start(Opts {
        config: "[concurrency]\nmax_running = 1\nmax_queued = 2\n",
        ..Opts::default()
    })
    .await;
    let sid = raw_session(&d, ALICE).await;
    let n = 8;
    let calls = (0..n).map(|i| {
        let url = d.url("/mcp");
        let sid = sid.clone();
        async move {
            let r = mcp_post(&url)
                .bearer_auth(ALICE)
                .header("mcp-session-id", &sid)
                .header("mcp-protocol-version", "2025-03-26")
                .json(
                    &json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                    "params": {"name": "execute_code", "arguments": {
                        "language": "bash", "code": "sleep 0.6; echo done"}}}),
                )
                .send()
                .await
                .expect("post");
            let status = r.status().as_u16();
            let retry = r.headers().get("retry-after").cloned();
            let body = r.text().await.expect("body");
            (i, status, retry, body)
        }
    });
    let started = Instant::now();
    let answers = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(calls))
        .await
        .expect("every call answers in time");
    let (mut ok, mut busy) = (0, 0);
    for (i, status, retry, body) in answers {
        match status {
            200 => {
                let msg = rpc_result(&body, 100 + i).unwrap_or_else(|| panic!("no result: {body}"));
                let result = &msg["result"];
                if result["isError"] == json!(true) {
                    let t = result["structuredContent"]["reason"].as_str().unwrap_or("");
                    assert!(t.contains("busy") && t.contains("retry after"), "{body}");
                    busy += 1;
                } else {
                    assert!(result["structuredContent"]["stdout"] == "done\n", "{body}");
                    ok += 1;
                }
            }
            503 => {
                assert!(retry.is_some(), "503 without Retry-After");
                let v: Value = serde_json::from_str(&body).expect("json-rpc body");
                assert_eq!(v["id"], json!(100 + i));
                assert!(
                    v["error"]["message"]
                        .as_str()
                        .unwrap_or("")
                        .contains("busy")
                );
                busy += 1;
            }
            other => panic!("call {i}: unexpected status {other}: {body}"),
        }
    }
    assert_eq!(ok + busy, n);
    assert!(
        ok >= 3,
        "one running and two queued must run: ok={ok} busy={busy}"
    );
    assert!(
        busy >= 1,
        "more calls than slots+queue: some must be refused"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let m = d.metrics().await;
    assert!(
        m.contains("mcp_execution_errors_total{reason=\"busy\"}"),
        "{m}"
    );
    assert!(m.contains("mcp_execution_slots 1"), "{m}");
}

#[tokio::test]
async fn an_unwritable_audit_log_refuses_executions() {
    let dir = TempDir::new("closed");
    // A directory where the file should be: not writable whoever runs the test.
    let audit = dir.0.join("audit.jsonl");
    std::fs::create_dir_all(&audit).expect("mkdir");
    let d = Daemon::start(Opts {
        audit: Some(&audit),
        ..Opts::default()
    })
    .await;
    let r = http().get(d.url("/readyz")).send().await.expect("readyz");
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.expect("json");
    assert!(v["reasons"].to_string().contains("audit"), "{v}");
    let client = d.client(Some(ALICE)).await;
    let r = client
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(obj(json!({"language": "python", "code": "print('ran')"}))),
        )
        .await
        .expect("tools/call");
    assert_eq!(r.is_error, Some(true));
    let s = r.structured_content.clone().expect("structured");
    assert!(
        s["reason"].as_str().unwrap_or("").contains("audit log"),
        "{s}"
    );
    assert_eq!(s["stdout"], "", "nothing ran");
    client.cancel().await.expect("close");
    assert!(
        d.metrics()
            .await
            .contains("mcp_execution_errors_total{reason=\"audit\"} 1")
    );
    // Healthy again once the path is writable.
    std::fs::remove_dir(&audit).expect("rmdir");
    let r = http().get(d.url("/readyz")).send().await.expect("readyz");
    assert_eq!(r.status(), 200);
}

fn processes_with(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&cmd).contains(marker)
        {
            out.push(pid);
        }
    }
    out
}

#[tokio::test]
async fn sigterm_stops_within_ten_seconds_and_kills_running_sandboxes() {
    let mut d = Daemon::start(Opts {
        config: "[http]\nshutdown_grace_ms = 1500\n",
        ..Opts::default()
    })
    .await;
    let marker = "47.4242";
    let client = d.client(Some(ALICE)).await;
    let call = tokio::spawn(async move {
        let r = client
            .call_tool(
                CallToolRequestParams::new("execute_code").with_arguments(obj(
                    json!({"language": "bash", "code": format!("exec sleep {marker}")}),
                )),
            )
            .await;
        drop(client);
        r
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_with(marker).is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = d.child.id().expect("pid") as i32;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let t = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(10), d.child.wait())
        .await
        .unwrap_or_else(|_| panic!("not stopped within 10 s:\n{}", d.stderr()))
        .expect("wait");
    assert!(status.success(), "exit status {status:?}:\n{}", d.stderr());
    assert!(t.elapsed() < Duration::from_secs(10));
    let _ = tokio::time::timeout(Duration::from_secs(5), call).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while !processes_with(marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sandbox left behind: {:?}",
            processes_with(marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The cancelled run was audited and the log flushed.
    let lines = d.audit_lines();
    assert!(
        lines.iter().any(|l| l["status"] == "cancelled"),
        "{lines:?}\n{}",
        d.stderr()
    );
}

/// Graceful drain (what a pod's SIGTERM gets): a run under way finishes and is answered, a new
/// run is refused, and the process exits 0.
#[tokio::test]
async fn sigterm_lets_a_running_run_finish_and_refuses_new_ones() {
    let mut d = Daemon::start(Opts {
        config: "[http]\nshutdown_grace_ms = 30000\n",
        ..Opts::default()
    })
    .await;
    let marker = "3.4243";
    let first = d.client(Some(ALICE)).await;
    let second = d.client(Some(ALICE)).await;
    let running = tokio::spawn(async move {
        let r = call(
            &first,
            "execute_code",
            json!({"language": "bash", "code": format!("sleep {marker}; echo finished")}),
        )
        .await;
        drop(first);
        r
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_with(marker).is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = d.child.id().expect("pid") as i32;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d
        .stderr()
        .contains("shutting down: no new connections or runs")
    {
        assert!(
            Instant::now() < deadline,
            "no shutdown line:\n{}",
            d.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A new run.
    let refused = second
        .call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(obj(json!({"language": "bash", "code": "echo new"}))),
        )
        .await;
    // Refused over the open connection (503 / `shutting down`), or the connection was
    // refused because the listener is closed (an error).
    if let Ok(r) = &refused {
        assert!(
            r.is_error == Some(true) && text(r).contains("shutting down"),
            "a new run was accepted: {}",
            text(r)
        );
    }
    let r = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the running call is answered")
        .expect("join");
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(structured(&r)["status"], "ok", "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "finished\n", "{}", text(&r));
    let status = tokio::time::timeout(Duration::from_secs(15), d.child.wait())
        .await
        .unwrap_or_else(|_| panic!("not stopped:\n{}", d.stderr()))
        .expect("wait");
    assert!(status.success(), "exit status {status:?}:\n{}", d.stderr());
    let ran: Vec<Value> = d
        .audit_lines()
        .into_iter()
        .filter(|l| l["event"] == "execution")
        .collect();
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0]["status"], "ok", "{ran:?}");
    drop(second);
}

#[tokio::test]
async fn legacy_sse_transport_round_trip() {
    let d = Daemon::start(Opts::default()).await;
    let r = http()
        .get(d.url("/sse"))
        .bearer_auth(BOB)
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("sse");
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let mut buf = String::new();
    // The next event with data; bounded in time.
    async fn next_event<B: AsRef<[u8]>>(
        stream: &mut (impl futures::Stream<Item = reqwest::Result<B>> + Unpin),
        buf: &mut String,
    ) -> (String, String) {
        loop {
            if let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let mut event = String::from("message");
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event:") {
                        event = e.trim().to_string();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push_str(d.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // keep-alive comment
                }
                return (event, data);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), stream.next())
                .await
                .expect("event in time")
                .expect("stream open")
                .expect("chunk");
            buf.push_str(&String::from_utf8_lossy(chunk.as_ref()));
        }
    }
    let (event, endpoint) = next_event(&mut stream, &mut buf).await;
    assert_eq!(event, "endpoint");
    assert!(endpoint.starts_with("/messages?sessionId="), "{endpoint}");
    let post = |body: Value| {
        http()
            .post(d.url(&endpoint))
            .bearer_auth(BOB)
            .json(&body)
            .send()
    };
    let mut init = initialize_body();
    init["params"]["protocolVersion"] = json!("2024-11-05");
    assert_eq!(post(init).await.expect("post").status(), 202);
    let (event, data) = next_event(&mut stream, &mut buf).await;
    assert_eq!(event, "message");
    let v: Value = serde_json::from_str(&data).expect("json");
    assert_eq!(v["result"]["protocolVersion"], "2024-11-05");
    let r = post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await
        .expect("post");
    assert_eq!(r.status(), 202);
    let r = post(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"language": "python", "code": "print(7*6)"}}}),
    )
    .await
    .expect("post");
    assert_eq!(r.status(), 202);
    let (_, data) = next_event(&mut stream, &mut buf).await;
    let v: Value = serde_json::from_str(&data).expect("json");
    assert_eq!(v["id"], 2);
    assert_eq!(v["result"]["structuredContent"]["stdout"], "42\n", "{v}");
    // Another key cannot post into bob's session.
    let r = http()
        .post(d.url(&endpoint))
        .bearer_auth(ALICE)
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 403);
    let lines = d.audit_lines();
    assert_eq!(lines.last().expect("a line")["transport"], "sse");
    assert_eq!(lines.last().expect("a line")["caller"], "bob");
}

#[tokio::test]
async fn a_non_loopback_bind_without_keys_refuses_to_start() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox"))
        .args(["serve", "--http", "0.0.0.0:0"])
        .env_remove("GEARBOX_API_KEYS")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--insecure-no-auth"), "{err}");
}

#[tokio::test]
async fn a_slow_client_is_cut_off_after_the_header_timeout() {
    let d = Daemon::start(Opts {
        config: "[http]\nheader_timeout_ms = 500\n",
        ..Opts::default()
    })
    .await;
    let addr = d.base.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 256];
    let t = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("closed within 5 s")
        .unwrap_or(0);
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || answer.contains("408"), "{answer}");
    assert!(t.elapsed() < Duration::from_secs(3));
    let _ = &d.dir;
}

async fn call(
    c: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    args: Value,
) -> rmcp::model::CallToolResult {
    c.call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj(args)))
        .await
        .expect("tools/call")
}

/// Two tenants (API keys) of one daemon: neither sees, reads, runs in nor closes the other's
/// sessions (files or live), by list or by id; to the other, they do not exist.
#[tokio::test]
async fn a_tenants_sessions_do_not_exist_for_another() {
    let dir = TempDir::new("tenants");
    let config = format!(
        "gear = \"full_trust\"\n[sessions]\ndir = {:?}\n",
        dir.0.join("sessions").display().to_string()
    );
    let d = Daemon::start(Opts {
        config: &config,
        extra: &["--profile", "sessions"],
        ..Opts::default()
    })
    .await;
    let alice = d.client(Some(ALICE)).await;
    let bob = d.client(Some(BOB)).await;
    let r = call(&alice, "exec_open", json!({})).await;
    let files = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    let r = call(
        &alice,
        "exec_run",
        json!({"session_id": files, "language": "python", "code": "open('secret.txt', 'w').write('alice only')"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let r = call(
        &alice,
        "exec_open",
        json!({"stateful": true, "language": "python"}),
    )
    .await;
    let live = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    call(
        &alice,
        "exec_run",
        json!({"session_id": live, "language": "python", "code": "mine = 'alice'"}),
    )
    .await;
    for id in [&files, &live] {
        for (tool, args) in [
            (
                "exec_run",
                json!({"session_id": id, "language": "python", "code": "print(open('secret.txt').read())"}),
            ),
            (
                "execute_code",
                json!({"session_id": id, "language": "python", "code": "print(mine)"}),
            ),
            (
                "exec_get_artifact",
                json!({"session_id": id, "path": "secret.txt"}),
            ),
            ("exec_close", json!({"session_id": id})),
        ] {
            let r = call(&bob, tool, args).await;
            assert_eq!(r.is_error, Some(true), "bob's {tool} on {id}: {}", text(&r));
            assert!(text(&r).contains("does not exist"), "{tool}: {}", text(&r));
            assert!(!text(&r).contains("alice"), "{tool}: {}", text(&r));
        }
        let read = bob
            .read_resource(rmcp::model::ReadResourceRequestParams::new(format!(
                "gearbox://sessions/{id}/files/secret.txt"
            )))
            .await;
        assert!(read.is_err(), "bob read alice's file: {read:?}");
    }
    let listed = bob.list_all_resources().await.expect("resources/list");
    assert!(
        listed
            .iter()
            .all(|r| !r.uri.contains(&files) && !r.uri.contains(&live)),
        "{listed:?}"
    );
    // Alice still has both, untouched.
    let r = call(
        &alice,
        "exec_get_artifact",
        json!({"session_id": files, "path": "secret.txt"}),
    )
    .await;
    assert_eq!(structured(&r)["content"], "alice only", "{}", text(&r));
    let r = call(
        &alice,
        "exec_run",
        json!({"session_id": live, "language": "python", "code": "mine"}),
    )
    .await;
    assert_eq!(structured(&r)["result"], "'alice'", "{}", text(&r));
    let listed = alice.list_all_resources().await.expect("resources/list");
    assert!(listed.iter().any(|r| r.uri.contains(&files)), "{listed:?}");
}

/// A load balancer, as DNS: the first lookup answers replica A, every later one replica B.
/// With no idle connection kept, every request after `initialize` reaches B.
struct FirstThenOther {
    first: std::net::IpAddr,
    then: std::net::IpAddr,
    asked: std::sync::atomic::AtomicUsize,
}

impl reqwest::dns::Resolve for FirstThenOther {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let n = self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let ip = if n == 0 { self.first } else { self.then };
        let addrs: reqwest::dns::Addrs =
            Box::new(std::iter::once(std::net::SocketAddr::new(ip, 0)));
        Box::pin(async move { Ok(addrs) })
    }
}

const PEER_SECRET: &str = "peer-secret-0123456789abcdef";

/// Two replicas as two pods: A (`2`) on 127.0.0.2:P and B (`3`) on 127.0.0.3:P, each with
/// the other as peer through `http://127.0.0.{replica}:P`: on loopback a replica's name is
/// the last byte of its address. A is named by `[http] replica_id`, B by `GEARBOX_REPLICA`.
async fn two_replicas(dir: &TempDir) -> (Daemon, Daemon, u16) {
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .expect("bind a free port")
        .local_addr()
        .expect("addr")
        .port();
    let config = |name: &str, replica_id: &str| {
        format!(
            "gear = \"full_trust\"\n[sessions]\ndir = {:?}\n[http]\n\
             allowed_hosts = [\"gearbox\", \"127.0.0.2\", \"127.0.0.3\"]\n\
             peers = \"http://127.0.0.{{replica}}:{port}\"\n{replica_id}",
            dir.0.join(name).display().to_string()
        )
    };
    let (ca, cb) = (config("a", "replica_id = \"2\"\n"), config("b", ""));
    let (la, lb) = (format!("127.0.0.2:{port}"), format!("127.0.0.3:{port}"));
    let a = Daemon::start(Opts {
        config: &ca,
        extra: &["--profile", "sessions"],
        listen: &la,
        env: &[("GEARBOX_PEER_SECRET", PEER_SECRET)],
        ..Opts::default()
    })
    .await;
    let b = Daemon::start(Opts {
        config: &cb,
        extra: &["--profile", "sessions"],
        listen: &lb,
        env: &[
            ("GEARBOX_PEER_SECRET", PEER_SECRET),
            ("GEARBOX_REPLICA", "3"),
        ],
        ..Opts::default()
    })
    .await;
    (a, b, port)
}

/// A client of the stateless revision (no MCP session) talking to one replica.
async fn stateless_client(url: String) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    use rmcp::ClientServiceExt;
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url);
    cfg.auth_header = Some(ALICE.to_string());
    ().serve_with_lifecycle(
        StreamableHttpClientTransport::from_config(cfg),
        rmcp::ClientLifecycleMode::Discover {
            preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .expect("server/discover")
}

/// Issue 22 point 5: an MCP session opened on replica A keeps working when its requests land
/// on B (B forwards them to A); a live session opened through A runs its cells through B;
/// a forged peer header is refused and the peers' secret opens no door the API key does not;
/// when A is gone, B says so (404 for the MCP session, so the client re-initialises).
#[tokio::test]
async fn sessions_work_from_any_replica_of_a_fleet() {
    let dir = TempDir::new("fleet");
    let (mut a, b, port) = two_replicas(&dir).await;

    // 1. A real rmcp client: `initialize` reaches A, every later request B.
    let resolver = Arc::new(FirstThenOther {
        first: [127, 0, 0, 2].into(),
        then: [127, 0, 0, 3].into(),
        asked: Default::default(),
    });
    let http_client = reqwest::Client::builder()
        .dns_resolver(resolver.clone())
        .pool_max_idle_per_host(0)
        .no_proxy()
        .build()
        .expect("client");
    let mut cfg =
        StreamableHttpClientTransportConfig::with_uri(format!("http://gearbox:{port}/mcp"));
    cfg.auth_header = Some(ALICE.to_string());
    let c =
        ().serve(StreamableHttpClientTransport::with_client(http_client, cfg))
            .await
            .expect("initialize on A");
    let r = call(
        &c,
        "execute_code",
        json!({"language": "python", "code": "print(6 * 7)"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "42\n", "{}", text(&r));
    let asked = resolver.asked.load(std::sync::atomic::Ordering::SeqCst);
    assert!(asked >= 2, "every request went to A ({asked} lookups)");
    // The run happened on A, the session's owner; B only forwarded it.
    let runs = |d: &Daemon| {
        d.audit_lines()
            .iter()
            .filter(|l| l["event"] == "execution")
            .count()
    };
    assert_eq!(
        (runs(&a), runs(&b)),
        (1, 0),
        "A:\n{}\nB:\n{}",
        a.stderr(),
        b.stderr()
    );

    // 2. A live session opened through A; its cells run through B and keep their state.
    let on_a = stateless_client(a.url("/mcp")).await;
    let on_b = stateless_client(b.url("/mcp")).await;
    let r = call(
        &on_a,
        "exec_open",
        json!({"stateful": true, "language": "python"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let live = structured(&r)["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    assert!(live.starts_with("2."), "{live}");
    for (code, want) in [("x = 41", ""), ("print(x + 1)", "42\n")] {
        let r = call(
            &on_b,
            "exec_run",
            json!({"session_id": live, "language": "python", "code": code}),
        )
        .await;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        assert_eq!(structured(&r)["stdout"], want, "{}", text(&r));
    }
    // A file session too: a file written through A is read through B.
    let r = call(&on_a, "exec_open", json!({})).await;
    let files = structured(&r)["session_id"]
        .as_str()
        .expect("session_id")
        .to_string();
    let r = call(
        &on_a,
        "exec_run",
        json!({"session_id": files, "language": "python", "code": "open('n.txt', 'w').write('7')"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let r = call(
        &on_b,
        "exec_run",
        json!({"session_id": files, "language": "python", "code": "print(open('n.txt').read())"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "7\n", "{}", text(&r));
    // The same file as a resource, read through B.
    let read = on_b
        .read_resource(rmcp::model::ReadResourceRequestParams::new(format!(
            "gearbox://sessions/{files}/files/n.txt"
        )))
        .await
        .expect("resources/read through B");
    match &read.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => assert_eq!(text, "7"),
        other => panic!("{other:?}"),
    }
    // Another tenant is still told the session does not exist, through B as through A.
    let r = mcp_post(&b.url("/mcp"))
        .bearer_auth(BOB)
        .header("mcp-protocol-version", "2026-07-28")
        .json(&json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": "exec_run", "arguments": {"session_id": live, "language": "python", "code": "print(x)"}}}))
        .send()
        .await
        .expect("post");
    let body = r.text().await.expect("body");
    assert!(!body.contains("41"), "{body}");

    // 3. A forged peer header is refused; the right secret does not replace the API key.
    let raw = raw_session(&a, ALICE).await;
    assert!(raw.starts_with("2."), "{raw}");
    let r = mcp_post(&b.url("/mcp"))
        .bearer_auth(ALICE)
        .header("mcp-session-id", &raw)
        .header("x-gearbox-peer", "not-the-peers-secret-at-all")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 403);
    assert!(r.text().await.expect("body").contains("x-gearbox-peer"));
    let r = mcp_post(&a.url("/mcp"))
        .header("mcp-session-id", &raw)
        .header("x-gearbox-peer", PEER_SECRET)
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 401, "the secret without a key");
    // The same raw session through B (forwarded with the secret) answers.
    let r = mcp_post(&b.url("/mcp"))
        .bearer_auth(ALICE)
        .header("mcp-session-id", &raw)
        .header("mcp-protocol-version", "2025-03-26")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 200);
    let body = r.text().await.expect("body");
    assert!(
        rpc_result(&body, 2).is_some_and(|v| v["result"]["tools"].is_array()),
        "{body}"
    );

    // 4. A is gone: B answers 404 for its MCP session and 502 for its gearbox session.
    a.child.kill().await.expect("kill A");
    let r = mcp_post(&b.url("/mcp"))
        .bearer_auth(ALICE)
        .header("mcp-session-id", &raw)
        .header("mcp-protocol-version", "2025-03-26")
        .json(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 404);
    let body = r.text().await.expect("body");
    assert!(
        body.contains("replica 2") && body.contains("initialize"),
        "{body}"
    );
    let r = mcp_post(&b.url("/mcp"))
        .bearer_auth(ALICE)
        .header("mcp-protocol-version", "2026-07-28")
        .json(&json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "exec_run", "arguments": {"session_id": live, "language": "python", "code": "print(x)"}}}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), 502);
    let body = r.text().await.expect("body");
    assert!(body.contains("replica 2"), "{body}");
    // B itself still serves.
    let r = call(
        &on_b,
        "execute_code",
        json!({"language": "python", "code": "print('b')"}),
    )
    .await;
    assert_eq!(structured(&r)["stdout"], "b\n", "{}", text(&r));
    let _ = (&dir, &b.dir);
}
