//! Sessions over MCP: `gearbox serve --profile sessions` driven over real stdio by rmcp's
//! client. Files persist across runs; idle sessions expire, also across a `kill -9`; ids and
//! paths that try to leave the store, and symlinks planted in a session on the host, are
//! refused. Run with `cargo test --workspace --test mcp -- sessions::`.

use std::path::Path;
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ReadResourceRequestParams, ResourceContents,
};
use rmcp::service::RunningService;
use serde_json::{Value, json};

use crate::support::{TempDir, obj, structured, text};

struct Server {
    session: RunningService<RoleClient, ()>,
    pid: u32,
}

/// `gearbox serve --profile sessions` with its sessions in `dir/sessions`.
async fn start(dir: &Path, ttl_secs: u64) -> Server {
    let config = dir.join("gearbox.toml");
    std::fs::write(
        &config,
        format!(
            "pool = {{}}\n[sessions]\ndir = {:?}\nttl_secs = {ttl_secs}\nquota_mb = 4\nmax_files = 100\n",
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

async fn open(s: &Server) -> String {
    let r = call(s, "exec_open", json!({})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["workspace"], "/work");
    assert!(
        v["expires_at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{v}"
    );
    v["session_id"].as_str().expect("session_id").to_string()
}

#[tokio::test]
async fn open_run_write_run_read_get_artifact_close() {
    let dir = TempDir::new("flow");
    let s = start(&dir.0, 3600).await;
    let tools: Vec<String> = s
        .session
        .list_all_tools()
        .await
        .expect("tools")
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    for t in [
        "execute_code",
        "exec_open",
        "exec_run",
        "exec_close",
        "exec_get_artifact",
    ] {
        assert!(tools.contains(&t.to_string()), "{tools:?}");
    }
    let id = open(&s).await;
    assert!(dir.0.join("sessions").join(&id).join("files").is_dir());

    let code = "import os\nos.makedirs('out', exist_ok=True)\nopen('out/result.txt','w').write('the answer is 42\\n')\nopen('out/blob.bin','wb').write(bytes(range(256))*1000)\nprint('written')";
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "python", "code": code}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["stdout"], "written\n");
    assert_eq!(v["workspace_saved"], true, "{v}");
    let changed: Vec<(String, String)> = v["files_changed"]
        .as_array()
        .expect("files_changed")
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap_or_default().to_string(),
                c["change"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        changed.contains(&("out/result.txt".into(), "created".into())),
        "{changed:?}"
    );
    assert!(text(&r).contains("created out/result.txt"), "{}", text(&r));

    // A second run, through execute_code with session_id, reads the first run's file.
    let r = call(
        &s,
        "execute_code",
        json!({"session_id": id, "language": "bash", "code": "cat out/result.txt; echo more >> out/result.txt"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let v = structured(&r);
    assert_eq!(v["stdout"], "the answer is 42\n");
    assert!(
        v["files_changed"]
            .as_array()
            .expect("changes")
            .iter()
            .any(|c| c["path"] == "out/result.txt" && c["change"] == "modified"),
        "{v}"
    );

    // Text inline.
    let r = call(
        &s,
        "exec_get_artifact",
        json!({"session_id": id, "path": "out/result.txt"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert_eq!(structured(&r)["content"], "the answer is 42\nmore\n");
    assert_eq!(structured(&r)["encoding"], "utf8");
    // Binary: base64 and an embedded resource, in pages.
    let mut all = Vec::new();
    let mut offset = 0u64;
    let mut pages = 0;
    loop {
        let r = call(
            &s,
            "exec_get_artifact",
            json!({"session_id": id, "path": "out/blob.bin", "offset": offset, "max_bytes": 100000}),
        )
        .await;
        assert_ne!(r.is_error, Some(true), "{}", text(&r));
        let v = structured(&r).clone();
        assert_eq!(v["encoding"], "base64");
        assert!(r.content.iter().any(|c| c.as_resource().is_some()));
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v["content"].as_str().expect("content"))
            .expect("base64");
        all.extend(bytes);
        pages += 1;
        match v.get("next_offset").and_then(Value::as_u64) {
            Some(n) => offset = n,
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(all, (0..=255u8).cycle().take(256_000).collect::<Vec<_>>());

    // The file as a resource, and in resources/list.
    let uri = format!("gearbox://sessions/{id}/files/out/result.txt");
    let rr = s
        .session
        .read_resource(ReadResourceRequestParams::new(uri.clone()))
        .await
        .expect("read resource");
    assert!(
        matches!(&rr.contents[0], ResourceContents::TextResourceContents { text, .. } if text == "the answer is 42\nmore\n")
    );
    let listed = s.session.list_all_resources().await.expect("resources");
    assert!(listed.iter().any(|r| r.uri == uri), "{listed:?}");

    let r = call(&s, "exec_close", json!({"session_id": id})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    assert!(!dir.0.join("sessions").join(&id).exists());
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "bash", "code": "true"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("does not exist"), "{}", text(&r));
    let _ = s.session.cancel().await;
}

#[tokio::test]
async fn traversal_ids_paths_and_planted_symlinks_are_refused() {
    let dir = TempDir::new("hostile");
    let secret = dir.0.join("host-secret.txt");
    std::fs::write(&secret, "PLANTED HOST SECRET").expect("plant");
    let s = start(&dir.0, 3600).await;
    let id = open(&s).await;
    let files = dir.0.join("sessions").join(&id).join("files");
    std::os::unix::fs::symlink(&secret, files.join("link.txt")).expect("symlink");
    std::os::unix::fs::symlink("/etc", files.join("etc")).expect("symlink");
    std::os::unix::fs::symlink("..", files.join("up")).expect("symlink");

    for path in [
        "link.txt",
        "etc/passwd",
        "up/meta.json",
        "../meta.json",
        "../../host-secret.txt",
        "../../../../etc/passwd",
        "/etc/passwd",
        "%2e%2e/meta.json",
        "out/../../meta.json",
    ] {
        let r = call(
            &s,
            "exec_get_artifact",
            json!({"session_id": id, "path": path}),
        )
        .await;
        assert_eq!(r.is_error, Some(true), "{path}: {}", text(&r));
        let t = text(&r);
        assert!(
            !t.contains("PLANTED") && !t.contains("root:"),
            "{path}: {t}"
        );
    }
    for bad_id in [
        "../../etc/passwd",
        "..",
        "%2e%2e",
        "/etc",
        "00000000-0000-0000-0000-000000000000",
        "c232ab00-9414-11ec-b3c8-9f6bdeced846",
        &id.to_uppercase(),
    ] {
        for (tool, args) in [
            (
                "exec_get_artifact",
                json!({"session_id": bad_id, "path": "x"}),
            ),
            (
                "exec_run",
                json!({"session_id": bad_id, "language": "bash", "code": "true"}),
            ),
            ("exec_close", json!({"session_id": bad_id})),
        ] {
            let r = call(&s, tool, args).await;
            assert_eq!(r.is_error, Some(true), "{tool} {bad_id}");
            assert!(
                text(&r).contains("session_id"),
                "{tool} {bad_id}: {}",
                text(&r)
            );
        }
    }
    for uri in [
        format!("gearbox://sessions/{id}/files/link.txt"),
        format!("gearbox://sessions/{id}/files/etc/passwd"),
        format!("gearbox://sessions/{id}/files/%2e%2e/meta.json"),
        format!("gearbox://sessions/{id}/files/..%2f..%2fhost-secret.txt"),
        format!("gearbox://sessions/{id}/files/%2fetc%2fpasswd"),
        "gearbox://sessions/../../etc/passwd".to_string(),
        "gearbox://sessions/%2e%2e/files/x".to_string(),
    ] {
        let r = s
            .session
            .read_resource(ReadResourceRequestParams::new(uri.clone()))
            .await;
        assert!(r.is_err(), "{uri}: {r:?}");
    }
    // A run in the session does not see the planted links either (they are skipped on
    // copy-in), and its result says nothing of the secret.
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "bash", "code": "ls -A; cat link.txt etc/passwd 2>&1 | head -3"}),
    )
    .await;
    let v = structured(&r);
    assert!(!v.to_string().contains("PLANTED"), "{v}");
    assert_eq!(
        std::fs::read_to_string(&secret).expect("intact"),
        "PLANTED HOST SECRET"
    );
    let _ = s.session.cancel().await;
}

#[tokio::test]
async fn idle_sessions_expire() {
    let dir = TempDir::new("expiry");
    let s = start(&dir.0, 1).await;
    let id = open(&s).await;
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "bash", "code": "echo hi > f"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    // The sweeper removes it from the disk without any call.
    let path = dir.0.join("sessions").join(&id);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while path.exists() && std::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!path.exists(), "expired session still on disk");
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "bash", "code": "cat f"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("does not exist"), "{}", text(&r));
    let _ = s.session.cancel().await;
}

#[tokio::test]
async fn a_restart_after_kill_9_removes_expired_sessions() {
    let dir = TempDir::new("crash");
    let s = start(&dir.0, 2).await;
    let id = open(&s).await;
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "bash", "code": "echo hi > f"}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let path = dir.0.join("sessions").join(&id);
    // SAFETY: kill(2) on the server process this test started.
    assert_eq!(unsafe { libc::kill(s.pid as i32, libc::SIGKILL) }, 0);
    drop(s);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        path.exists(),
        "nothing should have removed it while no server ran"
    );
    // A long TTL for the new server: its sweeper would not run for a minute, so what
    // removes the session is the start-up cleanup.
    let s = start(&dir.0, 3600).await;
    assert!(!path.exists(), "expired session survived the restart");
    let r = call(
        &s,
        "exec_get_artifact",
        json!({"session_id": id, "path": "f"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    let _ = s.session.cancel().await;
}
