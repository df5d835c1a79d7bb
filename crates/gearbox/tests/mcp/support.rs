//! What every MCP test module shares: scratch directories, argument objects, a result's text
//! and structured content, the package directory.

use std::path::PathBuf;

use rmcp::model::{CallToolResult, JsonObject};
use serde_json::Value;

/// A scratch directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("gearbox-mcp-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).expect("mkdir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A JSON object, as tool arguments.
pub fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(o) => o,
        other => panic!("not an object: {other}"),
    }
}

/// Every text block of a result, in order.
pub fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

/// A result's structured content.
pub fn structured(r: &CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structuredContent")
}

/// This package's directory: as cargo gives it when it runs the test (a build cache shared
/// between checkouts may hold a binary compiled in another one).
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// `gearbox --config CONFIG serve --profile sessions` over stdio, with rmcp's client
/// connected: the client and the server's pid.
pub async fn serve_sessions(
    config: &std::path::Path,
) -> (rmcp::service::RunningService<rmcp::RoleClient, ()>, u32) {
    use rmcp::ServiceExt;
    use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
    let transport = TokioChildProcess::new(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_gearbox")).configure(|c| {
            c.arg("--config")
                .arg(config)
                .args(["serve", "--profile", "sessions"]);
        }),
    )
    .expect("spawn gearbox serve");
    let pid = transport.id().expect("pid");
    let session = ().serve(transport).await.expect("initialize");
    (session, pid)
}
