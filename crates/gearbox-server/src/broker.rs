//! Code mode: the downstream MCP servers of `[[targets]]` ([`gearbox_broker`]).
//!
//! The `broker` profile adds four discovery tools: `servers_list`, `server_tools_list`,
//! `tool_info` and `tool_stubs`. `execute_code` (and `exec_run`) with `allow_tools` gets a
//! run channel: the call's [`ToolAccess`] is checked when the call is planned, the channel
//! opens once the gear has let the run go ([`ToolAccess::open`]), its directory is mounted
//! read-only into the sandbox and its environment (`GEARBOX_BROKER`, `PYTHONPATH`,
//! `NODE_PATH`) added to the run ([`OpenTools::apply`]), and the calls the code made are added
//! to the result as `tool_calls` ([`attach`]).

use gearbox_broker::{
    Broker, CallLimitOverrides, CallPolicy, RunChannel, StubLanguage, ToolCallRecord, ToolSummary,
};
use gearbox_core::{ExecRequest, Outcome};
use gearbox_engine::config::Config;
use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, JsonObject, Tool, ToolAnnotations,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::args::parse;

/// The discovery tools of the `broker` profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerTool {
    ServersList,
    ServerToolsList,
    ToolInfo,
    ToolStubs,
}

/// Arguments of `servers_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServersListArgs {}

/// Arguments of `server_tools_list`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerToolsListArgs {
    /// Only this server's tools (default: every server that is up).
    pub server: Option<String>,
    /// Keep tools whose name or description contains this text (case-insensitive), or whose
    /// `server/tool` matches it when it has `*` or `?`.
    pub filter: Option<String>,
}

/// Arguments of `tool_info`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolInfoArgs {
    pub server: String,
    pub tool: String,
}

/// Arguments of `tool_stubs`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolStubsArgs {
    pub server: String,
    /// `python` (default) or `javascript`.
    pub language: Option<StubLanguage>,
}

/// The downstream tools a call may use (`allow_tools` and its limits), checked against the
/// configuration when the call is planned. Its channel opens only once the gear has let the
/// run go ([`ToolAccess::open`]).
#[derive(Debug, Clone)]
pub struct ToolAccess {
    policy: CallPolicy,
    /// The run's `timeout_ms` ceiling: the channel's wall clock, at most the configured maximum.
    timeout_cap_ms: u64,
    /// `allow_tools` and its limits as canonical JSON: what an approval binds to.
    pub spec: String,
}

/// The open channel of one run.
pub struct OpenTools {
    channel: RunChannel,
    timeout_cap_ms: u64,
}

/// The broker of the configuration's `[[targets]]`; `None` without targets. An error (a
/// `${VAR}` that is not set, an invalid target) names the target and the variable.
pub fn from_config(config: &Config) -> Result<Option<Broker>, String> {
    if config.targets.is_empty() {
        return Ok(None);
    }
    Broker::new(&config.targets, config.broker.clone())
        .map(Some)
        .map_err(|e| format!("[[targets]]: {e}"))
}

fn read_only() -> ToolAnnotations {
    let mut a = ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(false);
    a.title = None;
    a
}

/// The discovery tools, in order.
pub fn tools() -> Vec<(BrokerTool, Tool)> {
    let empty = || std::sync::Arc::new(JsonObject::new());
    vec![
        (
            BrokerTool::ServersList,
            Tool::new(
                "servers_list",
                "List the downstream MCP servers whose tools sandboxed code can call \
                 (execute_code with allow_tools): name, tags, status (up, down, idle) and \
                 tool count.",
                empty(),
            )
            .with_input_schema::<ServersListArgs>()
            .with_annotations(read_only()),
        ),
        (
            BrokerTool::ServerToolsList,
            Tool::new(
                "server_tools_list",
                "List downstream tools as server/name with a one-line description; filter by \
                 server and by text or glob. Read tool_info or tool_stubs for the arguments.",
                empty(),
            )
            .with_input_schema::<ServerToolsListArgs>()
            .with_annotations(read_only()),
        ),
        (
            BrokerTool::ToolInfo,
            Tool::new(
                "tool_info",
                "The full definition of one downstream tool: description, input and output \
                 JSON schemas, annotations.",
                empty(),
            )
            .with_input_schema::<ToolInfoArgs>()
            .with_annotations(read_only()),
        ),
        (
            BrokerTool::ToolStubs,
            Tool::new(
                "tool_stubs",
                "Typed stubs of a downstream server's tools: a Python module (or JavaScript \
                 module) with one function per tool and its arguments documented. In \
                 execute_code with allow_tools the same module is importable: \
                 `from tools import SERVER` (Python), `require(\"tools/SERVER\")` (Node).",
                empty(),
            )
            .with_input_schema::<ToolStubsArgs>()
            .with_annotations(read_only()),
        ),
    ]
}

fn error(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn success(text: String, structured: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(structured);
    r
}

#[derive(Serialize)]
struct ToolList<'a> {
    tools: &'a [ToolSummary],
}

/// Answer one discovery tool.
pub async fn discovery(
    broker: Option<&Broker>,
    tool: BrokerTool,
    args: Option<&JsonObject>,
) -> CallToolResult {
    let Some(broker) = broker else {
        return match tool {
            BrokerTool::ServersList => success(
                "No downstream servers are configured ([[targets]] in gearbox.toml).".into(),
                json!({"servers": []}),
            ),
            _ => {
                error("No downstream servers are configured ([[targets]] in gearbox.toml).".into())
            }
        };
    };
    match tool {
        BrokerTool::ServersList => {
            if let Err(e) = parse::<ServersListArgs>(args) {
                return error(e);
            }
            let servers = broker.servers().await;
            let mut text = String::new();
            for s in &servers {
                text.push_str(&format!(
                    "{} [{}] {}{}{}\n",
                    s.name,
                    s.transport,
                    serde_json::to_value(&s.status)
                        .ok()
                        .and_then(|v| v.as_str().map(String::from))
                        .unwrap_or_default(),
                    s.tool_count
                        .map(|n| format!(", {n} tools"))
                        .unwrap_or_default(),
                    s.error
                        .as_deref()
                        .map(|e| format!(": {}", broker.scrub(e)))
                        .unwrap_or_default(),
                ));
            }
            let value = json!({ "servers": servers });
            success(
                broker.scrub(&text),
                serde_json::from_str(&broker.scrub(&value.to_string())).unwrap_or(value),
            )
        }
        BrokerTool::ServerToolsList => {
            let a = match parse::<ServerToolsListArgs>(args) {
                Ok(a) => a,
                Err(e) => return error(e),
            };
            match broker.tools(a.server.as_deref(), a.filter.as_deref()).await {
                Ok(tools) => {
                    let text: String = tools
                        .iter()
                        .map(|t| format!("{}/{}: {}\n", t.server, t.name, t.description))
                        .collect();
                    let text = if text.is_empty() {
                        "no tools match\n".to_string()
                    } else {
                        text
                    };
                    success(
                        text,
                        serde_json::to_value(ToolList { tools: &tools }).unwrap_or_default(),
                    )
                }
                Err(e) => error(broker.scrub(&e.to_string())),
            }
        }
        BrokerTool::ToolInfo => {
            let a = match parse::<ToolInfoArgs>(args) {
                Ok(a) => a,
                Err(e) => return error(e),
            };
            match broker.tool_info(&a.server, &a.tool).await {
                Ok(t) => {
                    let v = serde_json::to_value(&t).unwrap_or_default();
                    success(serde_json::to_string_pretty(&v).unwrap_or_default(), v)
                }
                Err(e) => error(broker.scrub(&e.to_string())),
            }
        }
        BrokerTool::ToolStubs => {
            let a = match parse::<ToolStubsArgs>(args) {
                Ok(a) => a,
                Err(e) => return error(e),
            };
            let language = a.language.unwrap_or(StubLanguage::Python);
            match broker.stubs(&a.server, language).await {
                Ok(code) => {
                    let path = language.file_name(&a.server);
                    success(
                        code.clone(),
                        json!({"server": a.server, "language": language, "path": path, "code": code}),
                    )
                }
                Err(e) => error(broker.scrub(&e.to_string())),
            }
        }
    }
}

pub fn refused(message: String) -> CallToolResponse {
    let o = Outcome::denied("", "", message);
    let mut r = CallToolResult::error(vec![ContentBlock::text(o.render_text())]);
    r.structured_content = serde_json::to_value(&o).ok();
    r.into()
}

/// The pipeline's "tools" step: the tool access an `execute_code` call asks for, or `None`
/// when it asks for none. An error is the refusal's text: limits without `allow_tools`, a
/// server without `[[targets]]`, an invalid allowlist or limit. `max_timeout_ms` is the
/// configured maximum of a run's `timeout_ms`.
/// The tool fields of `execute_code`'s and `exec_open`'s arguments (the others ignored).
#[derive(Debug, Default, Deserialize)]
struct ToolArgs {
    allow_tools: Option<Vec<String>>,
    wall_clock_ms: Option<u64>,
    per_call_ms: Option<u64>,
    max_calls: Option<u32>,
    max_output_kb: Option<u64>,
}

pub fn access(
    broker: Option<&Broker>,
    max_timeout_ms: u64,
    args: Option<&JsonObject>,
) -> Result<Option<ToolAccess>, String> {
    // Arguments that do not parse are answered by the call's own parsing (execute_code's or
    // exec_open's), naming the field.
    let access: ToolArgs = args
        .and_then(|a| serde_json::from_value(Value::Object(a.clone())).ok())
        .unwrap_or_default();
    let Some(allow) = access.allow_tools else {
        if access.wall_clock_ms.is_some()
            || access.per_call_ms.is_some()
            || access.max_calls.is_some()
            || access.max_output_kb.is_some()
        {
            return Err(
                "wall_clock_ms, per_call_ms, max_calls and max_output_kb apply to tool calls: \
                 give allow_tools too"
                    .into(),
            );
        }
        return Ok(None);
    };
    let Some(broker) = broker else {
        return Err(
            "allow_tools: this server has no downstream servers ([[targets]] in its \
             configuration)"
                .into(),
        );
    };
    let overrides = CallLimitOverrides {
        wall_clock_ms: access.wall_clock_ms,
        per_call_ms: access.per_call_ms,
        max_calls: access.max_calls,
        max_output_kb: access.max_output_kb,
    };
    let policy = broker
        .config()
        .limits(&overrides)
        .and_then(|l| CallPolicy::new(allow, l))?;
    let mut spec = serde_json::Map::new();
    for key in [
        "allow_tools",
        "wall_clock_ms",
        "per_call_ms",
        "max_calls",
        "max_output_kb",
    ] {
        if let Some(v) = args.and_then(|a| a.get(key)) {
            spec.insert(key.into(), v.clone());
        }
    }
    Ok(Some(ToolAccess {
        timeout_cap_ms: policy.limits.wall_clock_ms.min(max_timeout_ms),
        policy,
        spec: Value::Object(spec).to_string(),
    }))
}

impl ToolAccess {
    /// Open the run's channel (directory, SDK, stubs, socket).
    pub async fn open(&self, broker: Option<&Broker>) -> Result<OpenTools, String> {
        let broker = broker.ok_or("allow_tools: this server has no downstream servers")?;
        let channel = broker
            .open_run(self.policy.clone())
            .await
            .map_err(|e| format!("allow_tools: could not open the tool channel: {e}"))?;
        Ok(OpenTools {
            channel,
            timeout_cap_ms: self.timeout_cap_ms,
        })
    }
}

impl OpenTools {
    /// Add the channel to `req`: its directory as a read-only mount, its environment, and
    /// the run's wall clock as a ceiling of the program's timeout.
    pub fn apply(&self, req: &mut ExecRequest) {
        self.apply_live(req);
        let cap = self.timeout_cap_ms;
        req.limits.timeout_ms = Some(req.limits.timeout_ms.map_or(cap, |t| t.min(cap)));
    }

    /// Add the channel to a live session's interpreter: its directory and environment
    /// (a cell's wall clock is the channel's, from [`OpenTools::begin_cell`]).
    pub fn apply_live(&self, req: &mut ExecRequest) {
        req.mounts.push(self.channel.dir().to_path_buf());
        for (k, v) in self.channel.env() {
            let value = match req.env.get(&k) {
                Some(old) if k != "GEARBOX_BROKER" && !old.is_empty() => format!("{v}:{old}"),
                _ => v.clone(),
            };
            req.env.insert(k, value);
        }
    }

    /// A live session's next cell begins: its limits count from now. Returns the calls
    /// made since the last cell's result (by code still running in the background).
    pub fn begin_cell(&self) -> Vec<ToolCallRecord> {
        self.channel.begin_cell()
    }

    /// The calls made since [`OpenTools::begin_cell`].
    pub fn take_records(&self) -> Vec<ToolCallRecord> {
        self.channel.take_records()
    }

    /// Close the channel (calls in flight are cancelled) and return the calls made.
    pub fn finish(self) -> Vec<ToolCallRecord> {
        self.channel.finish()
    }
}

/// Add `tool_calls` to a result's structured content, and one line per call to its text.
pub fn attach(mut r: CallToolResult, records: &[ToolCallRecord]) -> CallToolResult {
    if let Some(Value::Object(map)) = r.structured_content.as_mut() {
        map.insert(
            "tool_calls".into(),
            serde_json::to_value(records).unwrap_or_default(),
        );
    }
    let mut text = format!("--- tool calls ({}) ---\n", records.len());
    for c in records {
        let outcome = serde_json::to_value(c.outcome)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        text.push_str(&format!(
            "{}/{} {} {} ms{}{}\n",
            c.server,
            c.tool,
            outcome,
            c.duration_ms,
            c.artifact_id
                .as_deref()
                .map(|a| format!(", artifact {a}"))
                .unwrap_or_default(),
            c.error
                .as_deref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ));
    }
    r.content.push(ContentBlock::text(text));
    r
}
