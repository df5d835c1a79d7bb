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
    /// Environment variables of the daemon.
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
        if let Some(k) = o.keys {
            cmd.env("GEARBOX_API_KEYS", k);
        }
        cmd.env_remove("SSL_CERT_FILE")
            .env_remove("GEARBOX_REPLICA")
            .env_remove("GEARBOX_PEER_SECRET")
            .envs(o.env.iter().copied());
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

/// Ending an MCP session with `DELETE` answers 200 (as the official SDKs' servers do), and
/// the session is gone afterwards: a call on it is refused.
#[tokio::test]
async fn deleting_a_session_answers_200_and_ends_it() {
    let d = Daemon::start(Opts::default()).await;
    let sid = raw_session(&d, ALICE).await;
    let delete = |sid: String| {
        http()
            .delete(d.url("/mcp"))
            .bearer_auth(ALICE)
            .header("mcp-session-id", sid)
            .header("mcp-protocol-version", "2025-03-26")
            .send()
    };
    let r = delete(sid.clone()).await.expect("delete");
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let (status, _, body) = raw_call(&d, ALICE, &sid, 7, "echo gone").await;
    assert!(
        (400..500).contains(&status) && !body.contains("gone\\n"),
        "{status} {body}"
    );
}

/// Over HTTP as over stdio, a method the server serves whose params do not fit is a JSON-RPC
/// error -32602 naming what does not fit, with the request's id; an unknown method is -32601.
#[tokio::test]
async fn params_that_do_not_fit_are_invalid_params_over_http() {
    let d = Daemon::start(Opts::default()).await;
    let sid = raw_session(&d, ALICE).await;
    for (id, body, code, names) in [
        (
            11,
            json!({"jsonrpc": "2.0", "id": 11, "method": "resources/read", "params": {}}),
            -32602,
            "`uri`",
        ),
        (
            12,
            json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call",
                "params": {"name": "execute_code", "arguments": "print(1)"}}),
            -32602,
            "expected a map",
        ),
        (
            13,
            json!({"jsonrpc": "2.0", "id": 13, "method": "no/such/method"}),
            -32601,
            "no/such/method",
        ),
    ] {
        let r = mcp_post(&d.url("/mcp"))
            .bearer_auth(ALICE)
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", "2025-03-26")
            .json(&body)
            .send()
            .await
            .expect("post");
        let text = r.text().await.expect("body");
        let v = rpc_result(&text, id).unwrap_or_else(|| panic!("no answer to {id}: {text}"));
        assert_eq!(v["error"]["code"], json!(code), "{v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{v}");
    }
}

/// A POST to `/mcp` whose JSON body cannot be read is a 400 with a JSON-RPC error (`id`
/// null), as the official TypeScript and Python SDKs' servers answer: -32700 when the body
/// is not JSON (a truncated object, bytes that are not UTF-8), -32600 when it is JSON but no
/// JSON-RPC message. Another content type is 415. The session serves on, a readable call
/// with a `charset` parameter included.
#[tokio::test]
async fn an_unreadable_body_is_a_bad_request_with_a_json_rpc_error() {
    let d = Daemon::start(Opts::default()).await;
    let sid = raw_session(&d, ALICE).await;
    let post = |content_type: &'static str, body: Vec<u8>| {
        http()
            .post(d.url("/mcp"))
            .header("accept", "application/json, text/event-stream")
            .bearer_auth(ALICE)
            .header("content-type", content_type)
            .header("mcp-session-id", &sid)
            .header("mcp-protocol-version", "2025-03-26")
            .body(body)
            .send()
    };
    for (content_type, body, code) in [
        ("application/json", b"{".to_vec(), -32700),
        ("application/json", vec![0xff, 0xfe], -32700),
        ("application/json; charset=utf-8", b"[]".to_vec(), -32600),
        ("application/json", br#"{"jsonrpc":"2.0"}"#.to_vec(), -32600),
    ] {
        let r = post(content_type, body.clone()).await.expect("post");
        assert_eq!(r.status(), 400, "{body:?}");
        let v: Value = r.json().await.expect("a JSON-RPC error body");
        assert_eq!(v["error"]["code"], json!(code), "{body:?}: {v}");
        assert_eq!(v["id"], Value::Null, "{v}");
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
    }
    // A request that is not of a request's shape but has an id is answered for that id,
    // saying what is wrong (rmcp's transport alone answers 415, and the rewrite id null);
    // a batch is answered with id null, saying it is one.
    for (body, id, why) in [
        (
            r#"{"jsonrpc":"2.0","id":21,"method":"tools/call","params":"x"}"#.to_string(),
            json!(21),
            r#""params" must be an object"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":"t","method":"tools/list","params":{"_meta":[]}}"#.to_string(),
            json!("t"),
            r#""params._meta" must be an object"#,
        ),
        // Valid JSON nested deeper than the parser reads.
        (
            format!(
                r#"{{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{{"x":{}{}}}}}"#,
                "[".repeat(300),
                "]".repeat(300)
            ),
            json!(22),
            "the message is nested more than 128 levels deep",
        ),
        // A batch is not taken over HTTP, and the error says so.
        (
            r#"[{"jsonrpc":"2.0","id":30,"method":"ping"}]"#.to_string(),
            Value::Null,
            "a JSON-RPC batch; over HTTP, send one message per request",
        ),
    ] {
        let r = post("application/json", body.clone().into_bytes())
            .await
            .expect("post");
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.expect("a JSON-RPC error body");
        assert_eq!(v["id"], id, "{v}");
        assert_eq!(v["error"]["code"], -32600, "{v}");
        assert_eq!(
            v["error"]["message"],
            format!("Invalid Request: {why}"),
            "{v}"
        );
    }
    let r = post("text/plain", b"{}".to_vec()).await.expect("post");
    assert_eq!(r.status(), 415);
    // A readable call with a JSON content type's parameter is served (the 415 rewrite
    // applies to unreadable bodies only).
    let r = post(
        "application/json; charset=utf-8",
        br#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#.to_vec(),
    )
    .await
    .expect("post");
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    assert!(rpc_result(&text, 9).is_some(), "{text}");
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
    sigterm_once_running(&d, marker).await;
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
        .unwrap_or_else(|_| panic!("the running call is not answered:\n{}", d.stderr()))
        .expect("join");
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(structured(&r)["status"], "ok", "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "finished\n", "{}", text(&r));
    // The answer went out before the sessions ended (its POST's stream closed by itself).
    assert_drained(&mut d).await;
    let ran: Vec<Value> = d
        .audit_lines()
        .into_iter()
        .filter(|l| l["event"] == "execution")
        .collect();
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0]["status"], "ok", "{ran:?}");
    drop(second);
}

/// A legacy SSE session (2024-11-05) of one key: its event stream and its endpoint.
struct Sse {
    stream: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: String,
    endpoint: String,
    key: &'static str,
}

impl Sse {
    /// `GET /sse` as `key`, up to the `endpoint` event.
    async fn open(d: &Daemon, key: &'static str) -> Sse {
        let r = http()
            .get(d.url("/sse"))
            .bearer_auth(key)
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("sse");
        assert_eq!(r.status(), 200);
        let mut sse = Sse {
            stream: r.bytes_stream().map(|c| c.map(|b| b.to_vec())).boxed(),
            buf: String::new(),
            endpoint: String::new(),
            key,
        };
        let (event, endpoint) = sse.next().await;
        assert_eq!(event, "endpoint");
        assert!(endpoint.starts_with("/messages?sessionId="), "{endpoint}");
        sse.endpoint = endpoint;
        sse
    }

    /// The next event with data (name, data); bounded in time.
    async fn next(&mut self) -> (String, String) {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
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
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.stream.next())
                .await
                .expect("event in time")
                .expect("stream open")
                .expect("chunk");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// POST `body` to the session's endpoint as `key`; the HTTP status.
    async fn post_as(&self, d: &Daemon, key: &str, body: Value) -> reqwest::StatusCode {
        http()
            .post(d.url(&self.endpoint))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .expect("post")
            .status()
    }

    async fn post(&self, d: &Daemon, body: Value) -> reqwest::StatusCode {
        self.post_as(d, self.key, body).await
    }

    /// `initialize` (2024-11-05) and `initialized`; the initialize result.
    async fn initialize(&mut self, d: &Daemon) -> Value {
        let mut init = initialize_body();
        init["params"]["protocolVersion"] = json!("2024-11-05");
        assert_eq!(self.post(d, init).await, 202);
        let (event, data) = self.next().await;
        assert_eq!(event, "message");
        let v: Value = serde_json::from_str(&data).expect("json");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        assert_eq!(self.post(d, initialized).await, 202);
        v
    }
}

/// Once a process with `marker` in its command line runs, SIGTERM the daemon.
async fn sigterm_once_running(d: &Daemon, marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while processes_with(marker).is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = d.child.id().expect("pid") as i32;
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid, libc::SIGTERM) };
}

/// The daemon exits 0, and every answer went out before the sessions ended.
async fn assert_drained(d: &mut Daemon) {
    let status = tokio::time::timeout(Duration::from_secs(15), d.child.wait())
        .await
        .unwrap_or_else(|_| panic!("not stopped:\n{}", d.stderr()))
        .expect("wait");
    assert!(status.success(), "exit status {status:?}:\n{}", d.stderr());
    assert!(
        !d.stderr().contains("answers still being written"),
        "{}",
        d.stderr()
    );
}

#[tokio::test]
async fn legacy_sse_transport_round_trip() {
    let d = Daemon::start(Opts::default()).await;
    let mut sse = Sse::open(&d, BOB).await;
    let v = sse.initialize(&d).await;
    assert_eq!(v["result"]["protocolVersion"], "2024-11-05");
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"language": "python", "code": "print(7*6)"}}});
    assert_eq!(sse.post(&d, call).await, 202);
    let (_, data) = sse.next().await;
    let v: Value = serde_json::from_str(&data).expect("json");
    assert_eq!(v["id"], 2);
    assert_eq!(v["result"]["structuredContent"]["stdout"], "42\n", "{v}");
    // Another key cannot post into bob's session.
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(sse.post_as(&d, ALICE, initialized).await, 403);
    let lines = d.audit_lines();
    assert_eq!(lines.last().expect("a line")["transport"], "sse");
    assert_eq!(lines.last().expect("a line")["caller"], "bob");
}

/// Graceful drain on the legacy SSE transport: a call under way when SIGTERM comes is
/// answered on the session's stream before the session ends (its answer is counted until
/// it has gone out, as a Streamable HTTP answer is).
#[tokio::test]
async fn sigterm_lets_a_running_sse_call_be_answered() {
    let mut d = Daemon::start(Opts {
        config: "[http]\nshutdown_grace_ms = 30000\n",
        ..Opts::default()
    })
    .await;
    let mut sse = Sse::open(&d, BOB).await;
    sse.initialize(&d).await;
    let marker = "3.4247";
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
        "name": "execute_code",
        "arguments": {"language": "bash", "code": format!("sleep {marker}; echo finished")}}});
    assert_eq!(sse.post(&d, call).await, 202);
    sigterm_once_running(&d, marker).await;
    let (_, data) = sse.next().await;
    let v: Value = serde_json::from_str(&data).expect("json");
    assert_eq!(v["id"], 9, "{v}");
    assert_eq!(
        v["result"]["structuredContent"]["stdout"], "finished\n",
        "{v}"
    );
    assert_drained(&mut d).await;
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

/// A stateless run's outputs belong to the tenant that ran it: another API key of the same
/// daemon is told the link does not exist; the owner reads it.
#[tokio::test]
async fn a_tenants_run_outputs_do_not_exist_for_another() {
    let d = Daemon::start(Opts {
        config: "gear = \"full_trust\"\n",
        ..Opts::default()
    })
    .await;
    let alice = d.client(Some(ALICE)).await;
    let bob = d.client(Some(BOB)).await;
    let code = "import os\nos.makedirs('/work/outputs')\n\
                open('/work/outputs/secret.txt', 'w').write('alice only')\n";
    let r = call(
        &alice,
        "execute_code",
        json!({"language": "python", "code": code}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let uri = r
        .content
        .iter()
        .find_map(|c| match c {
            rmcp::model::ContentBlock::ResourceLink(l) => Some(l.uri.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a link: {}", text(&r)));
    assert!(uri.starts_with("gearbox://runs/"), "{uri}");
    let read = bob
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri.clone()))
        .await;
    assert!(read.is_err(), "bob read alice's output: {read:?}");
    let read = alice
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await
        .expect("alice reads her output");
    match &read.contents[0] {
        rmcp::model::ResourceContents::TextResourceContents { text, .. } => {
            assert_eq!(text, "alice only")
        }
        other => panic!("{other:?}"),
    }
}

/// A key capped at `restricted` (`[http.keys.bob] max_gear`) on a `full_trust` daemon: its
/// calls run at `restricted` whatever they ask (network refused, the outcome's gear says
/// so), a live session with packages is refused, and the audit names its tenant; the
/// uncapped key keeps the server's gear.
#[tokio::test]
async fn a_capped_key_never_runs_above_its_cap() {
    let dir = TempDir::new("capped");
    let config = format!(
        "gear = \"full_trust\"\n[sessions]\ndir = {:?}\n[http.keys.bob]\nmax_gear = \"restricted\"\n\
         tenant = \"ci\"\n",
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
    let plain = json!({"language": "python", "code": "print('plain')", "gear": "full_trust"});
    let r = call(&alice, "execute_code", plain.clone()).await;
    assert_eq!(structured(&r)["status"], "ok", "{}", text(&r));
    assert_eq!(
        structured(&r)["policy"]["gear"],
        "full_trust",
        "{}",
        text(&r)
    );
    let r = call(&bob, "execute_code", plain).await;
    assert_eq!(structured(&r)["status"], "ok", "{}", text(&r));
    assert_eq!(
        structured(&r)["policy"]["gear"],
        "restricted",
        "asked full_trust, lowered to the cap: {}",
        text(&r)
    );
    let net = json!({"language": "python", "code": "print('net')", "network": true, "gear": "full_trust"});
    let r = call(&bob, "execute_code", net.clone()).await;
    assert_eq!(structured(&r)["status"], "denied", "{}", text(&r));
    assert!(
        text(&r).contains("restricted gear denies network"),
        "{}",
        text(&r)
    );
    assert!(!text(&r).contains("\nnet\n"), "{}", text(&r));
    let r = call(&alice, "execute_code", net).await;
    assert_eq!(structured(&r)["status"], "ok", "{}", text(&r));
    let r = call(
        &bob,
        "exec_open",
        json!({"stateful": true, "language": "python", "packages": ["six"]}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("restricted gear"), "{}", text(&r));
    // A live session without packages opens, and its cells run at the cap too.
    let r = call(
        &bob,
        "exec_open",
        json!({"stateful": true, "language": "python"}),
    )
    .await;
    let live = structured(&r)["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", text(&r)))
        .to_string();
    let r = call(
        &bob,
        "exec_run",
        json!({"session_id": live, "language": "python", "code": "1", "network": true, "gear": "full_trust"}),
    )
    .await;
    assert!(
        text(&r).contains("restricted gear denies network"),
        "{}",
        text(&r)
    );
    alice.cancel().await.expect("close");
    bob.cancel().await.expect("close");
    let lines = d.audit_lines();
    assert!(!lines.is_empty());
    for l in &lines {
        let expected = if l["caller"] == "bob" { "ci" } else { "alice" };
        assert_eq!(l["tenant"], expected, "{l}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l["caller"] == "bob" && l["status"] == "denied" && l["gear"] == "restricted"),
        "{lines:?}"
    );
}

/// A local OAuth issuer on loopback: its metadata (RFC 8414) names its key set, which the
/// test can rotate; it counts the key set's fetches.
struct Issuer {
    url: String,
    jwks: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<std::sync::atomic::AtomicUsize>,
}

/// An ES256 signing key of the issuer, made in the test with ring.
struct IssuerKey {
    kid: String,
    enc: jsonwebtoken::EncodingKey,
    jwk: Value,
}

impl IssuerKey {
    fn new(kid: &str) -> IssuerKey {
        use base64::Engine;
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).expect("key");
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("pair");
        let public = pair.public_key().as_ref();
        assert_eq!(public.len(), 65, "uncompressed P-256 point");
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        IssuerKey {
            kid: kid.to_string(),
            enc: jsonwebtoken::EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({"kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
                "x": b64.encode(&public[1..33]), "y": b64.encode(&public[33..])}),
        }
    }

    fn mint(&self, claims: Value) -> String {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, &claims, &self.enc).expect("sign")
    }
}

impl Issuer {
    async fn start(keys: &[&IssuerKey]) -> Issuer {
        use axum::routing::get;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let jwks = Arc::new(Mutex::new(
            keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>(),
        ));
        let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let meta = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
        let (set, count) = (jwks.clone(), fetches.clone());
        let app = axum::Router::new()
            .route(
                "/.well-known/oauth-authorization-server",
                get(move || async move { axum::Json(meta) }),
            )
            .route(
                "/jwks",
                get(move || async move {
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    let keys = set.lock().expect("lock").clone();
                    axum::Json(json!({ "keys": keys }))
                }),
            );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Issuer { url, jwks, fetches }
    }

    fn fetches(&self) -> usize {
        self.fetches.load(std::sync::atomic::Ordering::SeqCst)
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// `initialize` with `bearer`: the status, the `WWW-Authenticate` header, the body.
async fn initialize_with(d: &Daemon, bearer: &str) -> (u16, String, String) {
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(bearer)
        .json(&initialize_body())
        .send()
        .await
        .expect("initialize");
    let status = r.status().as_u16();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().expect("ascii").to_string())
        .unwrap_or_default();
    (status, challenge, r.text().await.unwrap_or_default())
}

/// OAuth 2.1 resource server over Streamable HTTP: tokens minted by a local issuer (its
/// key set discovered from its metadata); a valid token works through rmcp's client with
/// the subject as tenant and the gear of its scope; expired, wrong audience, wrong issuer,
/// unknown key are 401 `invalid_token`; no gearbox scope is 403 `insufficient_scope`; a
/// rotated key is accepted once the issuer publishes it; the metadata document and the
/// 401 challenge name each other; API keys keep working beside tokens.
#[tokio::test]
async fn oauth_tokens_from_a_local_issuer() {
    const AUD: &str = "http://gearbox.test/mcp";
    let k1 = IssuerKey::new("k1");
    let issuer = Issuer::start(&[&k1]).await;
    let config = format!(
        "gear = \"full_trust\"\n[http.oauth]\nissuer = \"{}\"\naudience = \"{AUD}\"\n\
         jwks_refetch_secs = 0\n[approvals]\nhttp_approvers = [\"agent-7\"]\n",
        issuer.url
    );
    let d = Daemon::start(Opts {
        config: &config,
        ..Opts::default()
    })
    .await;
    let prm_url = "http://gearbox.test/.well-known/oauth-protected-resource/mcp";
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let m: Value = http()
            .get(d.url(path))
            .send()
            .await
            .expect("metadata")
            .json()
            .await
            .expect("json");
        assert_eq!(m["resource"], AUD, "{m}");
        assert_eq!(m["authorization_servers"], json!([issuer.url]), "{m}");
        assert!(
            m["scopes_supported"]
                .as_array()
                .is_some_and(|s| s.contains(&json!("gearbox:full_trust"))),
            "{m}"
        );
    }
    let r = mcp_post(&d.url("/mcp"))
        .json(&initialize_body())
        .send()
        .await
        .expect("post");
    assert_eq!(r.status().as_u16(), 401);
    let challenge = r.headers()["www-authenticate"].to_str().expect("ascii");
    assert_eq!(
        challenge,
        format!("Bearer resource_metadata=\"{prm_url}\""),
        "no token: no error"
    );

    let now = now_secs();
    let claims = |over: Value| {
        let mut c = json!({"iss": issuer.url, "aud": AUD, "sub": "agent-7",
            "scope": "openid gearbox:restricted", "iat": now, "exp": now + 600});
        for (k, v) in over.as_object().expect("object") {
            c[k] = v.clone();
        }
        c
    };
    // A valid token: works through rmcp's client, the tenant is the subject, the gear is
    // its scope's (below the server's full_trust).
    let token = k1.mint(claims(json!({})));
    let client = d.client(Some(&token)).await;
    let r = call(
        &client,
        "execute_code",
        json!({"language": "python", "code": "print('token ok')", "gear": "full_trust"}),
    )
    .await;
    assert_eq!(structured(&r)["status"], "ok", "{}", text(&r));
    assert_eq!(structured(&r)["stdout"], "token ok\n");
    assert_eq!(
        structured(&r)["policy"]["gear"],
        "restricted",
        "{}",
        text(&r)
    );
    client.cancel().await.expect("close");
    let fetched = issuer.fetches();
    assert_eq!(fetched, 1, "the key set is fetched once and cached");

    for (what, bad, needle) in [
        (
            "expired",
            k1.mint(claims(json!({"exp": now - 3600, "iat": now - 7200}))),
            "expired",
        ),
        (
            "wrong audience",
            k1.mint(claims(json!({"aud": "http://elsewhere.test/mcp"}))),
            "aud",
        ),
        (
            "wrong issuer",
            k1.mint(claims(json!({"iss": "http://impostor.test"}))),
            "iss",
        ),
        (
            "unknown key",
            IssuerKey::new("rogue").mint(claims(json!({}))),
            "not in the issuer's key set",
        ),
        (
            "not yet valid",
            k1.mint(claims(json!({"nbf": now + 3600}))),
            "nbf",
        ),
    ] {
        let (status, challenge, body) = initialize_with(&d, &bad).await;
        assert_eq!(status, 401, "{what}: {body}");
        assert!(
            challenge.starts_with(&format!("Bearer resource_metadata=\"{prm_url}\""))
                && challenge.contains("error=\"invalid_token\""),
            "{what}: {challenge}"
        );
        assert!(body.contains(needle), "{what}: {body}");
    }
    let (status, challenge, body) =
        initialize_with(&d, &k1.mint(claims(json!({"scope": "openid profile"})))).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        challenge.contains("error=\"insufficient_scope\""),
        "{challenge}"
    );
    assert!(body.contains("gearbox:"), "{body}");

    // Rotation: the issuer publishes k2 after the server cached the set with k1 only.
    let k2 = IssuerKey::new("k2");
    issuer.jwks.lock().expect("lock").push(k2.jwk.clone());
    let rotated = k2.mint(claims(
        json!({"sub": "agent-8", "scope": "gearbox:full_trust"}),
    ));
    let (status, _, body) = initialize_with(&d, &rotated).await;
    assert_eq!(
        status, 200,
        "the rotated key is fetched and accepted: {body}"
    );
    assert!(
        issuer.fetches() > fetched,
        "an unknown kid fetched the set again"
    );
    let client = d.client(Some(&rotated)).await;
    let r = call(
        &client,
        "execute_code",
        json!({"language": "python", "code": "print(2)"}),
    )
    .await;
    assert_eq!(
        structured(&r)["policy"]["gear"],
        "full_trust",
        "{}",
        text(&r)
    );
    client.cancel().await.expect("close");

    // `http_approvers` names keys, not token subjects; the admin scope makes an admin.
    let r = http()
        .get(d.url("/approvals"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("approvals");
    assert_eq!(
        r.status().as_u16(),
        403,
        "a subject named like an approver key"
    );
    let admin = k1.mint(claims(
        json!({"sub": "ops", "scope": "gearbox:read_only gearbox:admin"}),
    ));
    let r = http()
        .get(d.url("/approvals"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("approvals");
    assert_eq!(r.status().as_u16(), 200, "the admin scope");
    assert!(r.json::<Value>().await.expect("json").is_array());

    // API keys keep working beside tokens.
    let (status, _, body) = initialize_with(&d, ALICE).await;
    assert_eq!(status, 200, "{body}");
    let (status, challenge, _) = initialize_with(&d, "not-a-key-and-not-a-token").await;
    assert_eq!(status, 401);
    assert!(challenge.contains("resource_metadata="), "{challenge}");

    let lines = d.audit_lines();
    assert!(
        lines
            .iter()
            .any(|l| l["tenant"] == "agent-7" && l["status"] == "ok" && l["gear"] == "restricted"),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l["tenant"] == "agent-8"), "{lines:?}");
    let all = std::fs::read_to_string(&d.audit).expect("audit");
    assert!(!all.contains(&token), "a token is never audited");
}

/// The local issuer over https: a CA made in the test signs a certificate for 127.0.0.1;
/// a minimal HTTP/1.1 responder serves the metadata and the key set over rustls. Returns
/// the issuer and the CA's PEM file.
async fn tls_issuer(keys: &[&IssuerKey], dir: &Path) -> (Issuer, PathBuf) {
    use tokio_rustls::rustls;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "gearbox test issuer CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = rcgen::KeyPair::generate().expect("ca key");
    let ca_cert = ca.self_signed(&ca_key).expect("ca cert");
    let ca_file = dir.join("issuer-ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).expect("write ca");
    let ca = rcgen::Issuer::new(ca, ca_key);
    let mut leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("leaf");
    leaf.use_authority_key_identifier_extension = true;
    leaf.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
    let leaf_cert = leaf.signed_by(&leaf_key, &ca).expect("leaf cert");
    #[allow(deprecated, reason = "ring, as the daemon uses")]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf_cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("https://{}", listener.local_addr().expect("addr"));
    let jwks = Arc::new(Mutex::new(
        keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>(),
    ));
    let fetches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let meta = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
    let (set, count) = (jwks.clone(), fetches.clone());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, set, count, meta) =
                (acceptor.clone(), set.clone(), count.clone(), meta.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("");
                let (status, body) = match path {
                    "/.well-known/oauth-authorization-server" => ("200 OK", meta.to_string()),
                    "/jwks" => {
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let keys = set.lock().expect("lock").clone();
                        ("200 OK", json!({ "keys": keys }).to_string())
                    }
                    _ => ("404 Not Found", "{}".to_string()),
                };
                let answer = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (Issuer { url, jwks, fetches }, ca_file)
}

/// An https issuer: its metadata and key set are fetched over TLS, verified against the
/// roots of `SSL_CERT_FILE` (here the test's CA): a token is accepted; a daemon that does
/// not trust that CA never gets the keys and refuses the token.
#[tokio::test]
async fn oauth_keys_are_fetched_over_verified_tls() {
    const AUD: &str = "http://gearbox.test/mcp";
    let dir = TempDir::new("tls-issuer");
    let k1 = IssuerKey::new("k1");
    let (issuer, ca_file) = tls_issuer(&[&k1], &dir.0).await;
    let config = format!(
        "[http.oauth]\nissuer = \"{}\"\naudience = \"{AUD}\"\n",
        issuer.url
    );
    let now = now_secs();
    let token = k1.mint(json!({"iss": issuer.url, "aud": AUD, "sub": "tls-agent",
        "scope": "gearbox:restricted", "exp": now + 600}));
    let ca = ca_file.display().to_string();
    let trusting = Daemon::start(Opts {
        config: &config,
        env: &[("SSL_CERT_FILE", &ca)],
        ..Opts::default()
    })
    .await;
    let (status, _, body) = initialize_with(&trusting, &token).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(issuer.fetches(), 1);
    // Another CA, not the one that signed the issuer's certificate.
    let mut stranger = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    stranger.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let stranger = stranger
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("cert");
    let stranger_file = dir.0.join("stranger-ca.pem");
    std::fs::write(&stranger_file, stranger.pem()).expect("write");
    let other = stranger_file.display().to_string();
    let distrusting = Daemon::start(Opts {
        config: &config,
        env: &[("SSL_CERT_FILE", &other)],
        ..Opts::default()
    })
    .await;
    let (status, challenge, body) = initialize_with(&distrusting, &token).await;
    assert_eq!(status, 401, "{body}");
    assert!(challenge.contains("invalid_token"), "{challenge}");
    assert!(body.contains("could not be fetched"), "{body}");
    assert!(body.contains("TLS"), "the handshake failed: {body}");
    assert_eq!(
        issuer.fetches(),
        1,
        "the untrusted daemon never got the key set"
    );
}

/// Poll `/metrics` until it has `needle`; the text. (A bound on waiting, not on speed.)
async fn metrics_until(d: &Daemon, needle: &str) -> String {
    metrics_within(d, &[needle], Duration::from_secs(60)).await
}

/// Poll `/metrics` until it has every one of `needles`, for at most `bound`; the text.
async fn metrics_within(d: &Daemon, needles: &[&str], bound: Duration) -> String {
    let deadline = Instant::now() + bound;
    loop {
        let m = d.metrics().await;
        if needles.iter().all(|n| m.contains(n)) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "not all of {needles:?} within {bound:?} in\n{m}\n{}",
            d.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One `tools/call` of `execute_code` over raw HTTP: status, Retry-After, body.
async fn raw_call(
    d: &Daemon,
    key: &str,
    sid: &str,
    id: i64,
    code: &str,
) -> (u16, Option<String>, String) {
    let r = mcp_post(&d.url("/mcp"))
        .bearer_auth(key)
        .header("mcp-session-id", sid)
        .header("mcp-protocol-version", "2025-03-26")
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": {"language": "bash", "code": code}}}))
        .send()
        .await
        .expect("post");
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, retry, r.text().await.expect("body"))
}

/// With one run slot, tenant A queues a flood of slow runs, then tenant B queues one: B's
/// run starts before A's third (waiting tenants are served in turn), whatever the speed.
#[tokio::test]
async fn a_flood_of_one_tenant_does_not_hold_back_another() {
    let d = Daemon::start(Opts {
        config: "[concurrency]\nmax_running = 1\nmax_queued = 64\n",
        ..Opts::default()
    })
    .await;
    let alice = d.client(Some(ALICE)).await;
    let bob = d.client(Some(BOB)).await;
    let code = "import time\nprint(time.time_ns())\ntime.sleep(1)\n";
    async fn run(
        c: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
        code: &str,
    ) -> Result<rmcp::model::CallToolResult, rmcp::ServiceError> {
        c.call_tool(
            CallToolRequestParams::new("execute_code")
                .with_arguments(obj(json!({"language": "python", "code": code}))),
        )
        .await
    }
    let start_of = |r: &rmcp::model::CallToolResult| -> u128 {
        assert_ne!(r.is_error, Some(true), "{}", text(r));
        structured(r)["stdout"]
            .as_str()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("no start time: {}", text(r)))
    };
    let flood = futures::future::join_all((0..5).map(|_| run(&alice, code)));
    let single = async {
        // Every one of alice's calls is running or waiting before bob's is made.
        metrics_until(&d, "gearbox_tenant_queued{tenant=\"alice\"} 4").await;
        let mine = run(&bob, code);
        let seen = async {
            // alice's runs granted by the time bob's call waits in the queue.
            let m = metrics_until(&d, "gearbox_tenant_queued{tenant=\"bob\"} 1").await;
            m.lines()
                .find_map(|l| l.strip_prefix("gearbox_tenant_runs_total{tenant=\"alice\"} "))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .unwrap_or_else(|| panic!("alice's runs in\n{m}"))
        };
        let (r, granted) = tokio::join!(mine, seen);
        (r, granted)
    };
    let (flood, (single, granted)) = tokio::join!(flood, single);
    let mut alice_starts: Vec<u128> = flood
        .iter()
        .map(|r| start_of(r.as_ref().expect("alice's call")))
        .collect();
    alice_starts.sort_unstable();
    let bob_start = start_of(&single.expect("bob's call"));
    let before = alice_starts.iter().filter(|s| **s < bob_start).count();
    // Once bob waits, at most one more of alice's runs goes before his (first in, first out
    // would put all five first).
    assert!(
        granted < 5,
        "alice's flood ran out before bob queued: {granted}"
    );
    assert!(
        before <= granted + 1,
        "bob's one run waited for {before} of alice's runs, {granted} of them granted before \
         he queued (starts {alice_starts:?}, bob {bob_start})"
    );
    let m = d.metrics().await;
    assert!(
        m.contains("gearbox_tenant_runs_total{tenant=\"alice\"} 5"),
        "{m}"
    );
    assert!(
        m.contains("gearbox_tenant_runs_total{tenant=\"bob\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("gearbox_tenant_cpu_seconds_total{tenant=\"alice\"}"),
        "{m}"
    );
}

/// Quotas per tenant over HTTP: alice may run one at a time with one waiting, and hold one
/// live session; bob may start three runs a minute. Past a quota: 429 with Retry-After
/// naming the quota (known before the call is accepted), or a tool error naming it; the
/// other tenant is untouched; the quota resets when a run ends or a session closes.
#[tokio::test]
async fn a_tenant_over_its_quota_is_refused_and_the_quota_resets() {
    let dir = TempDir::new("quotas");
    let config = format!(
        "[concurrency]\nmax_running = 4\n[sessions]\ndir = {:?}\n\
         [quotas.tenants.alice]\nmax_running = 1\nmax_queued = 1\nlive_sessions = 1\n\
         [quotas.tenants.bob]\nruns_per_minute = 3\n",
        dir.0.join("sessions").display().to_string()
    );
    let d = Daemon::start(Opts {
        config: &config,
        extra: &["--profile", "sessions"],
        ..Opts::default()
    })
    .await;
    let alice = d.client(Some(ALICE)).await;
    let alice_raw = raw_session(&d, ALICE).await;
    let bob_raw = raw_session(&d, BOB).await;
    let slow = || {
        alice.call_tool(
            CallToolRequestParams::new("execute_code").with_arguments(obj(
                json!({"language": "bash", "code": "sleep 1; echo slow"}),
            )),
        )
    };
    let checks = async {
        metrics_until(&d, "gearbox_tenant_queued{tenant=\"alice\"} 1").await;
        // alice: one running, one waiting; a third call is refused before it is accepted.
        let (status, retry, body) = raw_call(&d, ALICE, &alice_raw, 7, "echo three").await;
        assert_eq!(status, 429, "{body}");
        let retry: u64 = retry.expect("Retry-After").parse().expect("seconds");
        assert!(retry >= 1, "{retry}");
        let v: Value = serde_json::from_str(&body).expect("json-rpc body");
        assert_eq!(v["id"], json!(7));
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(
            msg.contains("max_queued") && msg.contains("alice") && msg.contains("1 of 1"),
            "{msg}"
        );
        // bob is not held back by alice's quota.
        let (status, _, body) = raw_call(&d, BOB, &bob_raw, 8, "echo bob").await;
        assert_eq!(status, 200, "{body}");
        let r = rpc_result(&body, 8).unwrap_or_else(|| panic!("no result: {body}"));
        assert_eq!(
            r["result"]["structuredContent"]["stdout"], "bob\n",
            "{body}"
        );
    };
    let (a, b, ()) = tokio::join!(slow(), slow(), checks);
    for r in [a, b] {
        let r = r.expect("alice's call");
        assert_eq!(structured(&r)["stdout"], "slow\n", "{}", text(&r));
    }
    // Reset: alice's runs ended, so she may run again.
    let (status, _, body) = raw_call(&d, ALICE, &alice_raw, 9, "echo again").await;
    assert_eq!(status, 200, "{body}");
    let r = rpc_result(&body, 9).unwrap_or_else(|| panic!("no result: {body}"));
    assert_eq!(
        r["result"]["structuredContent"]["stdout"], "again\n",
        "{body}"
    );

    // bob's third run of the minute goes; the fourth is refused naming runs_per_minute.
    for id in [10, 11] {
        let (status, _, body) = raw_call(&d, BOB, &bob_raw, id, "true").await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, retry, body) = raw_call(&d, BOB, &bob_raw, 12, "true").await;
    assert_eq!(status, 429, "{body}");
    let retry: u64 = retry.expect("Retry-After").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(
        body.contains("runs_per_minute") && body.contains("3 of 3"),
        "{body}"
    );

    // Live sessions: alice may hold one; the second is a tool error naming the quota.
    let bob = d.client(Some(BOB)).await;
    let live = json!({"stateful": true, "language": "python"});
    let r = call(&alice, "exec_open", live.clone()).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let first = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    let r = call(&alice, "exec_open", live.clone()).await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(
        text(&r).contains("live_sessions") && text(&r).contains("1 of 1"),
        "{}",
        text(&r)
    );
    let r = call(&bob, "exec_open", live.clone()).await;
    assert_ne!(r.is_error, Some(true), "bob's own: {}", text(&r));
    let r = call(&alice, "exec_close", json!({"session_id": first})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let r = call(&alice, "exec_open", live).await;
    assert_ne!(r.is_error, Some(true), "reset by closing: {}", text(&r));

    let m = d.metrics().await;
    for needle in [
        "gearbox_tenant_refusals_total{tenant=\"alice\",quota=\"max_queued\"} 1",
        "gearbox_tenant_refusals_total{tenant=\"alice\",quota=\"live_sessions\"} 1",
        "gearbox_tenant_refusals_total{tenant=\"bob\",quota=\"runs_per_minute\"} 1",
        "gearbox_tenant_runs_total{tenant=\"alice\"} 3",
    ] {
        assert!(m.contains(needle), "{needle} in\n{m}");
    }
}

/// `session_storage_mb` over HTTP: a run whose files would take the tenant past it runs but
/// keeps nothing; up to it the files are kept; at it no session opens (a tool error naming
/// the quota) for that tenant, while another opens as before; closing frees the space.
#[tokio::test]
async fn a_tenants_session_storage_is_bounded() {
    let dir = TempDir::new("storage");
    let config = format!(
        "gear = \"full_trust\"\n[sessions]\ndir = {:?}\n[quotas.tenants.alice]\nsession_storage_mb = 1\n",
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
    let id = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    // f.bin makes the workspace's files, the program's included, `n` bytes in all.
    let write = |n: usize| {
        json!({"session_id": id, "language": "python",
            "code": format!("import os\nother = sum(os.path.getsize(os.path.join(d, f)) \
                for d, _, fs in os.walk('.') for f in fs if f != 'f.bin')\n\
                open('f.bin', 'wb').write(b'x' * ({n} - other))\n")})
    };
    let r = call(&alice, "exec_run", write((1 << 20) + 1)).await;
    let all = serde_json::to_string(&r).expect("json");
    assert!(
        all.contains("workspace not saved")
            && all.contains("session_storage_mb")
            && all.contains("1048577 bytes of its 1 MiB"),
        "{all}"
    );
    let r = call(&alice, "exec_run", write(1 << 20)).await;
    assert_eq!(
        structured(&r)["workspace_saved"],
        json!(true),
        "{}",
        text(&r)
    );
    let r = call(&alice, "exec_open", json!({})).await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(
        text(&r).contains("session_storage_mb") && text(&r).contains("1048576 bytes of its 1 MiB"),
        "{}",
        text(&r)
    );
    let r = call(&bob, "exec_open", json!({})).await;
    assert_ne!(r.is_error, Some(true), "bob's own: {}", text(&r));
    let r = call(&alice, "exec_close", json!({"session_id": id})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let r = call(&alice, "exec_open", json!({})).await;
    assert_ne!(r.is_error, Some(true), "space freed: {}", text(&r));
    let m = d.metrics().await;
    assert!(
        m.contains(
            "gearbox_tenant_refusals_total{tenant=\"alice\",quota=\"session_storage_mb\"} 1"
        ),
        "{m}"
    );
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

/// Every process below `root`, with its command line.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent.insert(pid, ppid);
        }
    }
    let below = |mut pid: u32| {
        while let Some(&p) = parent.get(&pid) {
            if p == root {
                return true;
            }
            if p <= 1 {
                return false;
            }
            pid = p;
        }
        false
    };
    let mut out: Vec<(u32, String)> = parent
        .keys()
        .copied()
        .filter(|&pid| below(pid))
        .map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmd).replace('\0', " "))
        })
        .collect();
    out.sort();
    out
}

/// The children of `pid` that have exited and wait to be reaped (state `Z`).
fn zombies_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("proc").flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`
        let mut rest = stat.rfind(')').map(|i| stat[i + 1..].split_whitespace());
        let state = rest.as_mut().and_then(|r| r.next());
        let ppid = rest.as_mut().and_then(|r| r.next());
        if state == Some("Z") && ppid == Some(pid.to_string().as_str()) {
            out.extend(e.file_name().to_string_lossy().parse::<u32>().ok());
        }
    }
    out
}

/// Cold runs' helpers are started with `posix_spawn` and reaped by the server itself
/// (through their pidfd; nothing else reaps them): after cold calls, and one cancelled
/// while its program runs, no helper is left a zombie below the server.
#[tokio::test]
async fn cold_runs_leave_no_unreaped_helper() {
    let d = Daemon::start(Opts {
        config: "pool = {}\n",
        ..Opts::default()
    })
    .await;
    let pid = d.child.id().expect("pid");
    let client = d.client(Some(ALICE)).await;
    for i in 0..3 {
        let r = call(
            &client,
            "execute_code",
            json!({"language": "python", "code": format!("print({i} * 7)")}),
        )
        .await;
        assert!(text(&r).contains(&(i * 7).to_string()), "{}", text(&r));
    }
    // A call dropped while its program runs: its helper is killed, then reaped too.
    let slow = call(
        &client,
        "execute_code",
        json!({"language": "python", "code": "import time; time.sleep(30)"}),
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), slow).await;
    client.cancel().await.expect("close");
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let zombies = zombies_of(pid);
        if zombies.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "unreaped children of the server: {zombies:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The Python processes below `pid` (a fork server, its helper, warm sandboxes).
fn python_below(pid: u32) -> Vec<(u32, String)> {
    descendants(pid)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("python"))
        .collect()
}

/// Poll `/metrics` until it has every one of `needles`; the text. (A bound on waiting, not
/// on speed.)
async fn metrics_until_all(d: &Daemon, needles: &[&str]) -> String {
    metrics_within(d, needles, Duration::from_secs(60)).await
}

/// Issue 23, cold start: the pool starts filling once the server's first run is over (or at a
/// quiet moment `start_delay_ms` after start), not beside a call made right after launch.
/// With a delay of a minute, half a second after start nothing of the pool exists: no series,
/// no Python process below the server. Once the first run is over (a Bash call, which has no
/// pool of its own; or a live session's opening), Python's warm sandbox is built and a Python
/// call takes it. (The waits bound waiting, not speed.)
#[tokio::test]
async fn the_pool_starts_filling_once_the_first_run_is_over() {
    for first in ["a bash call", "a live session"] {
        let d = Daemon::start(Opts {
            config: "[pool]\npython = 1\nstart_delay_ms = 60000\n",
            extra: &["--profile", "sessions"],
            ..Opts::default()
        })
        .await;
        let pid = d.child.id().expect("pid");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let m = d.metrics().await;
        assert_eq!(
            pool_value_if_any(&m, "ready", "python"),
            None,
            "{first}: {m}"
        );
        assert_eq!(
            pool_value_if_any(&m, "building", "python"),
            None,
            "{first}: {m}"
        );
        let python = python_below(pid);
        assert!(
            python.is_empty(),
            "{first}: built before any run: {python:?}"
        );

        let client = d.client(Some(ALICE)).await;
        let r = if first == "a bash call" {
            call(
                &client,
                "execute_code",
                json!({"language": "bash", "code": "echo $((6*7))"}),
            )
            .await
        } else {
            call(
                &client,
                "exec_open",
                json!({"stateful": true, "language": "javascript"}),
            )
            .await
        };
        assert_eq!(r.is_error, Some(false), "{first}: {}", text(&r));
        // Well within the start delay's minute: it is the first run's end that started it.
        metrics_within(
            &d,
            &["gearbox_pool_ready{language=\"python\",network=\"false\"} 1"],
            Duration::from_secs(30),
        )
        .await;
        let r = call(
            &client,
            "execute_code",
            json!({"language": "python", "code": "print(6*7)"}),
        )
        .await;
        assert_eq!(r.is_error, Some(false), "{first}: {}", text(&r));
        assert!(text(&r).contains("42"), "{first}: {}", text(&r));
        metrics_until(
            &d,
            "gearbox_pool_hits_total{language=\"python\",network=\"false\"} 1",
        )
        .await;
        client.cancel().await.expect("close");
    }
}

/// Issue 23, light at rest. `[pool] python = { min = 0, max = 2 }, bash = 1, idle_secs = 2`:
/// Python keeps nothing until called; after a call it builds a warm sandbox, and once idle it
/// drops it, stops its fork server and leaves no Python process below the server; a call after
/// that is still answered. Bash keeps its one warm sandbox at rest: a burst grows it, and idle
/// shrinks it back to one. (Every wait is a bound on waiting, not on speed.)
#[tokio::test]
async fn an_idle_pool_shrinks_to_its_minimum_and_rests_at_zero() {
    let d = Daemon::start(Opts {
        config: "[concurrency]\nmax_running = 8\n[pool]\npython = { min = 0, max = 2 }\nbash = 1\n\
                 idle_secs = 2\n",
        ..Opts::default()
    })
    .await;
    let pid = d.child.id().expect("pid");
    let series = |name: &str, language: &str, n: u32| {
        format!("gearbox_pool_{name}{{language=\"{language}\",network=\"false\"}} {n}")
    };
    // Python joins the pool once Bash (the first language with a minimum) has a sandbox
    // ready, a moment after it: its series are waited for too, and it keeps nothing.
    metrics_until_all(
        &d,
        &[
            &series("ready", "bash", 1),
            &series("min", "python", 0),
            &series("max", "python", 2),
            &series("min", "bash", 1),
            &series("ready", "python", 0),
        ],
    )
    .await;
    let client = d.client(Some(ALICE)).await;
    let python = json!({"language": "python", "code": "print(6*7)"});
    for round in 0..2 {
        let r = call(&client, "execute_code", python.clone()).await;
        assert_eq!(r.is_error, Some(false), "round {round}: {}", text(&r));
        assert!(text(&r).contains("42"), "round {round}: {}", text(&r));
        // The call woke the key; two idle seconds later it is at rest again, with nothing
        // ready, no fork server and no Python process left.
        metrics_until_all(
            &d,
            &[
                &series("resting", "python", 1),
                &series("ready", "python", 0),
                &series("fork_servers", "python", 0),
            ],
        )
        .await;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !python_below(pid).is_empty() {
            assert!(
                Instant::now() < deadline,
                "round {round}: left behind at rest: {:?}\n{}",
                python_below(pid),
                d.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // Bursts of Bash calls miss the one warm sandbox and grow the target; idle shrinks the
    // pool back to one, dropping what the bursts added. (Eight calls at once on a pool of one
    // miss unless every refill beats the next arrival: a few bursts bound that, not a clock.)
    let bash = json!({"language": "bash", "code": "sleep 0.2; echo $((6*7))"});
    let mut bursts = 0;
    loop {
        bursts += 1;
        let burst = (0..8).map(|_| call(&client, "execute_code", bash.clone()));
        for r in futures::future::join_all(burst).await {
            assert_eq!(r.is_error, Some(false), "{}", text(&r));
            assert!(text(&r).contains("42"), "{}", text(&r));
        }
        let m = d.metrics().await;
        if !m.contains(&series("target", "bash", 1)) {
            break;
        }
        assert!(
            bursts < 10,
            "ten bursts of eight never grew a pool of one\n{m}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let log = d.stderr();
        let shrunk = log.lines().any(|l| {
            l.contains("shrunk to its minimum")
                && l.contains("language=bash")
                && !l.contains("dropped=0")
        });
        if shrunk {
            break;
        }
        assert!(Instant::now() < deadline, "bash never shrank\n{log}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    metrics_until_all(
        &d,
        &[
            &series("target", "bash", 1),
            &series("ready", "bash", 1),
            &series("resting", "bash", 0),
        ],
    )
    .await;
    client.cancel().await.expect("close");
}

/// The value of the warm-pool series `gearbox_pool_{name}` of `language` (no network) in `m`.
fn pool_value(m: &str, name: &str, language: &str) -> f64 {
    pool_value_if_any(m, name, language)
        .unwrap_or_else(|| panic!("no gearbox_pool_{name} of {language} in\n{m}"))
}

/// The same, `None` while the language has no pool yet (languages after the first join the
/// pool once the first has a sandbox ready, or after a bound: `engine.rs`, `STAGGER_MAX`).
fn pool_value_if_any(m: &str, name: &str, language: &str) -> Option<f64> {
    let prefix = format!("gearbox_pool_{name}{{language=\"{language}\",network=\"false\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Issue 23: all languages together hold at most `memory_budget_mb / 8` warm sandboxes. With
/// a budget of two, Python's one and Bash's one fill it: bursts of Bash calls raise Bash's
/// target, yet once nothing is being built no more than two are ready in all.
#[tokio::test]
async fn the_pool_never_holds_more_than_its_memory_budget() {
    let d = Daemon::start(Opts {
        config: "[concurrency]\nmax_running = 8\n[pool]\npython = { min = 1, max = 8 }\n\
                 bash = { min = 1, max = 8 }\nmemory_budget_mb = 16\nidle_secs = 0\n",
        ..Opts::default()
    })
    .await;
    let client = d.client(Some(ALICE)).await;
    let bash = json!({"language": "bash", "code": "sleep 0.2; echo $((6*7))"});
    let mut bursts = 0;
    let m = loop {
        bursts += 1;
        let burst = (0..8).map(|_| call(&client, "execute_code", bash.clone()));
        for r in futures::future::join_all(burst).await {
            assert_eq!(r.is_error, Some(false), "{}", text(&r));
            assert!(text(&r).contains("42"), "{}", text(&r));
        }
        let m = d.metrics().await;
        // Bash's pool may not exist yet on a loaded machine: the first language's sandbox
        // comes first.
        if pool_value_if_any(&m, "target", "bash").is_some_and(|t| t >= 3.0) {
            break m;
        }
        assert!(
            bursts < 20,
            "twenty bursts of eight never grew Bash's target\n{m}"
        );
    };
    assert_eq!(pool_value(&m, "max", "bash"), 8.0, "{m}");
    // Settled: nothing being built (a bound on waiting, not on speed).
    let deadline = Instant::now() + Duration::from_secs(60);
    let m = loop {
        let m = d.metrics().await;
        if pool_value(&m, "building", "bash") == 0.0 && pool_value(&m, "building", "python") == 0.0
        {
            break m;
        }
        assert!(Instant::now() < deadline, "the pool never settled\n{m}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ready = pool_value(&m, "ready", "bash") + pool_value(&m, "ready", "python");
    assert!(ready <= 2.0, "{ready} ready over a budget of two\n{m}");
    assert!(pool_value(&m, "target", "bash") >= 3.0, "{m}");
    client.cancel().await.expect("close");
}
