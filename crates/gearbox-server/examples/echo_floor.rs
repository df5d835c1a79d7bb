//! The protocol floor for bench/fast_path.py (issue 23): a trivial MCP server over stdio,
//! built on the same rmcp and Tokio set-up as `gearbox serve`, with one tool `execute_code`
//! (`{language, code}`) that runs nothing. It answers a fixed small text and
//! `structuredContent` `{status: "ok", stdout}`, where `stdout` is the first quoted nonce
//! found in `code` (`print("n123")` answers `n123\n`), else `1\n`. What a call costs here is
//! what any rmcp stdio server costs: the floor gearbox's fast path is measured against.
//!
//! Not shipped; a benchmark fixture only:
//!
//!     cargo build --release --locked -p gearbox-server --example echo_floor

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

#[derive(Clone)]
struct Floor {
    tool: Tool,
}

impl Floor {
    fn new() -> Self {
        let schema = json!({
            "type": "object",
            "properties": {
                "language": {"type": "string"},
                "code": {"type": "string"},
            },
            "required": ["language", "code"],
        });
        let Value::Object(schema) = schema else {
            unreachable!("a JSON object literal")
        };
        let tool = Tool::new(
            "execute_code",
            "Runs nothing: echoes the first quoted string of `code` as stdout (a benchmark floor).",
            Arc::new(schema as JsonObject),
        );
        Self { tool }
    }
}

/// The first string between matching quotes (`"` or `'`) in `code`.
fn nonce(code: &str) -> Option<&str> {
    let start = code.find(['"', '\''])?;
    let quote = code[start..].chars().next()?;
    let rest = &code[start + 1..];
    let end = rest.find(quote)?;
    Some(&rest[..end])
}

impl ServerHandler for Floor {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("echo_floor", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(vec![self.tool.clone()]))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        (name == self.tool.name).then(|| self.tool.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if request.name != self.tool.name {
            return Err(McpError::invalid_params("unknown tool", None));
        }
        let args = request.arguments.unwrap_or_default();
        let code = args.get("code").and_then(Value::as_str).unwrap_or("");
        let stdout = format!("{}\n", nonce(code).unwrap_or("1"));
        let mut r = CallToolResult::success(vec![ContentBlock::text(format!(
            "status: ok\n--- stdout ---\n{stdout}"
        ))]);
        r.structured_content = Some(json!({ "status": "ok", "stdout": stdout }));
        Ok(r.into())
    }
}

fn main() -> anyhow::Result<()> {
    // The runtime of `gearbox serve` (crates/gearbox/src/cli.rs): two worker threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let running = Floor::new().serve(rmcp::transport::stdio_pipes()).await?;
        running.waiting().await?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::nonce;

    #[test]
    fn nonce_is_the_first_quoted_string() {
        assert_eq!(nonce("print(\"n42\")"), Some("n42"));
        assert_eq!(nonce("console.log('n7')"), Some("n7"));
        assert_eq!(nonce("print(1)"), None);
    }
}
