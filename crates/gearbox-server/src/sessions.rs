//! Sessions over MCP: `exec_open`, `exec_run`, `exec_close`, `exec_get_artifact`,
//! `session_id` on `execute_code`, and the resources `gearbox://sessions/{id}/files/{path}`.
//!
//! A session run is an ordinary `execute_code` call (same validation, gear, limiter, audit)
//! made inside a [`Scope`] naming the session: the engine call at the bottom of the server's
//! run path ([`execute`]) sees the scope and runs over the session's workspace instead
//! (`Engine::execute_collecting`), then writes back what the program left. The store lives
//! in `gearbox-sessions`; this module only maps tools and resources onto it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine as _;
use gearbox_core::{BackendKind, ExecRequest, Outcome};
use gearbox_engine::Engine;
use gearbox_engine::config::SessionsConfig;
use gearbox_sessions::{FileChange, SessionId, SessionStore, StoreError, StoreOptions};
use rmcp::ErrorData as McpError;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    ReadResourceResult, Resource, ResourceContents, ResourceTemplate, Tool, ToolAnnotations,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::args::parse;
use crate::limiter::Refusal;
use crate::quotas::Quotas;

pub const EXEC_OPEN: &str = "exec_open";
pub const EXEC_RUN: &str = "exec_run";
pub const EXEC_CLOSE: &str = "exec_close";
pub const EXEC_GET_ARTIFACT: &str = "exec_get_artifact";
/// URI prefix of session files: `gearbox://sessions/{id}/files/{path}`.
pub const SESSIONS_PREFIX: &str = "gearbox://sessions/";
pub const FILES_TEMPLATE: &str = "gearbox://sessions/{id}/files/{path}";
/// Bytes `exec_get_artifact` returns when the call does not say.
pub const DEFAULT_ARTIFACT_BYTES: u64 = 64 * 1024;
/// Most bytes one `exec_get_artifact` call or resource read returns.
pub const MAX_ARTIFACT_BYTES: u64 = 1024 * 1024;
/// Most session files `resources/list` names (the template reaches all of them).
const MAX_LISTED_FILES: usize = 500;

/// Arguments of `exec_open`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecOpenArgs {
    /// Keep a live interpreter for the session (default false: each run is a fresh
    /// sandbox over the session's files). Variables, imports, open files and the working
    /// directory then persist from one exec_run to the next, and the value of a cell's last
    /// bare expression comes back as `result`. Needs `language`.
    pub stateful: Option<bool>,
    /// The live interpreter's language (`python` or `javascript`), with `stateful: true`.
    pub language: Option<String>,
    /// Packages the live interpreter can import (as `execute_code`'s `packages`), installed
    /// into a cached layer mounted when the session opens. Only where the server's gear is
    /// `full_trust` (opening asks no human).
    pub packages: Option<Vec<String>>,
    /// With `stateful: true`: the downstream tools (`server/tool` globs) the live
    /// interpreter may call through the `gearbox` SDK, as `execute_code`'s `allow_tools`.
    /// The limits below apply to each cell; each cell's result lists the calls it made, and
    /// each cell is gated as a run that calls tools.
    pub allow_tools: Option<Vec<String>>,
    /// Milliseconds from a cell's start after which its tool calls are refused.
    pub wall_clock_ms: Option<u64>,
    /// Milliseconds one tool call may take.
    pub per_call_ms: Option<u64>,
    /// Tool calls (and listings) one cell may make.
    pub max_calls: Option<u32>,
    /// KiB of one tool result handed to the code; a larger one becomes an artifact.
    pub max_output_kb: Option<u64>,
}

/// Arguments of `exec_close`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecCloseArgs {
    /// The session to close.
    pub session_id: String,
    /// Keep the session's files after closing (readable with `exec_get_artifact` and as
    /// resources, no longer runnable, never expiring). Default false: delete them.
    pub persist: Option<bool>,
}

/// Arguments of `exec_get_artifact`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecGetArtifactArgs {
    /// The session holding the file, or the id of a run without a session whose outputs it
    /// is (the `{id}` of the run's `gearbox://runs/{id}/outputs/…` links).
    pub session_id: String,
    /// Path of the file relative to the workspace (`/work`), as listed in `files_changed`
    /// (or `outputs/…`, as in a run's `outputs`).
    pub path: String,
    /// Byte offset to start from (default 0); use `next_offset` of the previous page.
    pub offset: Option<u64>,
    /// Most bytes to return (default 65536, at most 1048576).
    pub max_bytes: Option<u64>,
}

/// What `exec_open` returns.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Opened {
    pub session_id: String,
    /// Where the session's files are inside the sandbox (the working directory).
    pub workspace: String,
    /// When the session expires if unused (RFC 3339); each run renews it.
    pub expires_at: Option<String>,
    pub quota_bytes: u64,
    pub max_files: usize,
    /// A live session: its interpreter's language (absent for a session of files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live: Option<String>,
}

/// What a session run adds to the outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunReport {
    session_id: String,
    /// Files the run created, modified or deleted (path, change, size, sha256).
    files_changed: Vec<FileChange>,
    /// False when the workspace stayed as it was (timeout, refusal, over the quota).
    workspace_saved: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    skipped: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// A live cell's tool calls (shaped into the result as `tool_calls`, as any run's).
    #[serde(skip)]
    pub(crate) tool_calls: Option<Vec<gearbox_broker::ToolCallRecord>>,
}

/// The session a run uses: its store and its id, checked open when the call was planned.
#[derive(Clone)]
pub struct SessionRun {
    store: Arc<SessionStore>,
    id: SessionId,
    /// The tenant that owns it (its storage quota applies to what a run leaves).
    tenant: String,
}

impl std::fmt::Debug for SessionRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRun").field("id", &self.id).finish()
    }
}

impl SessionRun {
    pub fn id(&self) -> &SessionId {
        &self.id
    }
}

/// The options of the store `cfg` describes.
pub fn store_options(cfg: &SessionsConfig) -> StoreOptions {
    StoreOptions {
        dir: cfg.dir(),
        ttl: Duration::from_secs(cfg.ttl_secs.max(1)),
        quota_bytes: cfg.quota_mb.max(1) * 1024 * 1024,
        max_files: cfg.max_files.max(1),
        max_sessions: cfg.max_sessions.max(1),
    }
}

/// The store of `engine`'s configuration: one per directory in this process, shared by
/// every server of the process (stdio, each HTTP session). Opening it cleans what a crash
/// left and starts the expiry sweeper.
pub fn store(engine: &Engine) -> Result<Arc<SessionStore>, String> {
    static STORES: OnceLock<Mutex<HashMap<PathBuf, Arc<SessionStore>>>> = OnceLock::new();
    let opts = store_options(&engine.config().sessions);
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(s) = stores.get(&opts.dir) {
        return Ok(s.clone());
    }
    let period = (opts.ttl / 4).clamp(Duration::from_millis(500), Duration::from_secs(60));
    let s =
        SessionStore::open(opts.clone()).map_err(|e| format!("sessions are not available: {e}"))?;
    if tokio::runtime::Handle::try_current().is_ok() {
        s.spawn_sweeper(period);
    }
    stores.insert(opts.dir, s.clone());
    Ok(s)
}

/// Open the store at start-up when the session tools are served, so a crash's leftovers
/// and expired sessions go now rather than at first use.
pub fn start(engine: &Engine, tools: &[Tool]) {
    if tools.iter().any(|t| t.name == EXEC_OPEN)
        && let Err(e) = store(engine)
    {
        tracing::warn!(error = %e, "session store");
    }
}

fn session_tool(name: &'static str, title: &str, description: &str) -> Tool {
    Tool::new(name, description.to_string(), Arc::new(JsonObject::new())).with_title(title)
}

fn annotations(title: &str, read_only: bool, destructive: bool) -> ToolAnnotations {
    let mut a = ToolAnnotations::new()
        .read_only(read_only)
        .destructive(destructive)
        .idempotent(read_only)
        .open_world(false);
    a.title = Some(title.to_string());
    a
}

/// The four session tools. `exec_run`'s schema is `execute_code`'s with `session_id`.
pub fn tools(execute_code: &Tool) -> Vec<Tool> {
    let mut run_schema = execute_code.input_schema.as_ref().clone();
    if let Some(Value::Object(props)) = run_schema.get_mut("properties") {
        props.insert(
            "session_id".into(),
            json!({"type": "string", "description": "The session whose workspace the run uses (from exec_open)."}),
        );
    }
    let mut required: Vec<Value> = run_schema
        .get("required")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    required.push(json!("session_id"));
    run_schema.insert("required".into(), Value::Array(required));
    let mut run = session_tool(
        EXEC_RUN,
        "Run code in a session",
        "Run a program in a fresh sandbox over a session's workspace: the files earlier runs \
         of the session left in /work are there, and the files this run leaves are kept for \
         the next. Arguments as execute_code, plus session_id. Returns the outcome plus \
         files_changed (created, modified, deleted: path, size, sha256). A run that times \
         out leaves the workspace as it was. In a live session (exec_open with stateful: \
         true) the code runs as the next cell of the session's interpreter instead: \
         variables, imports and open files persist, and the value of a last bare expression \
         comes back as `result`; a cell past timeout_ms is interrupted and the session goes \
         on.",
    )
    .with_annotations(annotations("Run code in a session", false, false));
    run.input_schema = Arc::new(run_schema);
    run.output_schema = execute_code.output_schema.clone();
    vec![
        session_tool(
            EXEC_OPEN,
            "Open a session",
            "Open a session: a workspace whose files persist across exec_run calls (each run \
             is still a fresh sandbox). With stateful: true and language (python or \
             javascript), the session instead keeps a live interpreter in a sandbox of its own, so variables and imports \
             persist from one exec_run to the next (like notebook cells). Returns session_id, \
             the workspace path, expires_at (idle sessions expire; each run renews it) and the \
             quota. Close it with exec_close.",
        )
        .with_input_schema::<ExecOpenArgs>()
        .with_output_schema::<Opened>()
        .with_annotations(annotations("Open a session", false, false)),
        run,
        session_tool(
            EXEC_CLOSE,
            "Close a session",
            "Close a session and delete its files, or keep them with persist: true (readable, \
             no longer runnable).",
        )
        .with_input_schema::<ExecCloseArgs>()
        .with_annotations(annotations("Close a session", false, true)),
        session_tool(
            EXEC_GET_ARTIFACT,
            "Get a session file",
            "Read a file of a session's workspace: text inline, binary as base64 plus an \
             embedded resource; large files in pages (offset, max_bytes; next_offset says \
             where to continue). Also readable as the resource \
             gearbox://sessions/{id}/files/{path}.",
        )
        .with_input_schema::<ExecGetArtifactArgs>()
        .with_annotations(annotations("Get a session file", true, false)),
    ]
}

pub fn tool_error(message: impl Into<String>) -> CallToolResponse {
    let message = message.into();
    let mut r = CallToolResult::error(vec![ContentBlock::text(message.clone())]);
    r.structured_content = Some(json!({ "error": message }));
    r.into()
}

fn ok(value: Value, text: String) -> CallToolResponse {
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = Some(value);
    r.into()
}

/// A session file's URI, its path percent-encoded but for unreserved characters and `/`,
/// so that [`parse_uri`] gives back exactly that path (`100%.txt`, `a%41`).
fn file_uri(id: &SessionId, path: &str) -> String {
    let mut uri = format!("{SESSIONS_PREFIX}{id}/files/");
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// Would the files a run left keep its tenant within its storage quota? `Ok` without one.
fn within_storage(
    engine: &Engine,
    scope: &SessionRun,
    collected: &gearbox_core::tree::Collected,
) -> Result<(), Refusal> {
    let cfg = &engine.config().quotas;
    if cfg.for_tenant(&scope.tenant).session_storage_mb == 0 {
        return Ok(());
    }
    let mine = scope.store.info(&scope.id).map_or(0, |i| i.bytes);
    let others = storage_of(&scope.store, &scope.tenant).saturating_sub(mine);
    let new: u64 = collected.files.iter().map(|f| f.content.len() as u64).sum();
    Quotas::new(cfg.clone()).storage(&scope.tenant, others, new)
}

/// Bytes of the files of every session `tenant` owns (open or persisted).
fn storage_of(store: &SessionStore, tenant: &str) -> u64 {
    store
        .list()
        .iter()
        .filter(|s| s.owner == tenant)
        .map(|s| s.bytes)
        .sum()
}

/// The tenant's session quotas (`[quotas] live_sessions`, `session_storage_mb`) for a call
/// of a session tool: only `exec_open` takes anything they bound.
pub fn check_quotas(
    engine: &Engine,
    quotas: &Quotas,
    tenant: &str,
    request: &CallToolRequestParams,
) -> Result<(), Refusal> {
    if request.name != EXEC_OPEN {
        return Ok(());
    }
    let stateful = request
        .arguments
        .as_ref()
        .and_then(|a| a.get("stateful"))
        .and_then(Value::as_bool)
        == Some(true);
    if stateful {
        quotas.live_sessions(tenant, live_sessions().count_for(tenant))?;
    }
    if quotas.of(tenant).session_storage_mb > 0
        && let Ok(store) = store(engine)
    {
        quotas.storage(tenant, storage_of(&store, tenant), 0)?;
    }
    Ok(())
}

/// Answer `exec_open`, `exec_close` or `exec_get_artifact` (none of them runs code); `None`
/// for any other tool. Only called for tools this server exposes.
pub async fn answer(
    engine: &Engine,
    broker: Option<&gearbox_broker::Broker>,
    gear: gearbox_core::Gear,
    tenant: &str,
    request: &CallToolRequestParams,
) -> Option<CallToolResponse> {
    let name: &str = &request.name;
    let args = request.arguments.as_ref();
    if ![EXEC_OPEN, EXEC_CLOSE, EXEC_GET_ARTIFACT].contains(&name) {
        return None;
    }
    let store = match store(engine) {
        Ok(s) => s,
        Err(e) => return Some(tool_error(e)),
    };
    Some(match name {
        EXEC_OPEN => match parse::<ExecOpenArgs>(args) {
            Err(e) => tool_error(e),
            Ok(a) if a.stateful == Some(true) => {
                open_live(engine, broker, gear, tenant, &store, a, args).await
            }
            Ok(a)
                if a.language.is_some()
                    || a.packages.is_some()
                    || a.allow_tools.is_some()
                    || a.wall_clock_ms.is_some()
                    || a.per_call_ms.is_some()
                    || a.max_calls.is_some()
                    || a.max_output_kb.is_some() =>
            {
                tool_error(
                    "language, packages and allow_tools: only with stateful: true (a live \
                     session); a session of files takes them on each exec_run",
                )
            }
            Ok(_) => match store.create(tenant) {
                Err(e) => tool_error(e.to_string()),
                Ok(info) => {
                    let opened = Opened {
                        session_id: info.session_id.clone(),
                        workspace: info.workspace.clone(),
                        expires_at: info.expires_at.clone(),
                        quota_bytes: info.quota_bytes,
                        max_files: info.max_files,
                        live: None,
                    };
                    let text = format!(
                        "session {} opened: workspace {}, expires {} unless used, quota {} bytes",
                        opened.session_id,
                        opened.workspace,
                        opened.expires_at.as_deref().unwrap_or("never"),
                        opened.quota_bytes
                    );
                    ok(serde_json::to_value(&opened).unwrap_or_default(), text)
                }
            },
        },
        EXEC_CLOSE => match parse::<ExecCloseArgs>(args) {
            Err(e) => tool_error(e),
            Ok(a) => match SessionId::parse("session_id", &a.session_id) {
                Err(e) => tool_error(e),
                Ok(id) => {
                    let persist = a.persist.unwrap_or(false);
                    if let Err(e) = store.check_owner(&id, tenant) {
                        return Some(tool_error(e.to_string()));
                    }
                    if let Some(live) = live_sessions().remove(&id) {
                        live.end().await;
                    }
                    match store.close(&id, persist) {
                        Err(e) => tool_error(e.to_string()),
                        Ok(info) => ok(
                            json!({"session_id": id.to_string(), "closed": true, "persist": persist, "files": info.files, "bytes": info.bytes}),
                            if persist {
                                format!("session {id} closed; its {} files are kept", info.files)
                            } else {
                                format!("session {id} closed and deleted")
                            },
                        ),
                    }
                }
            },
        },
        _ => match parse::<ExecGetArtifactArgs>(args) {
            Err(e) => tool_error(e),
            Ok(a) if crate::runs::owns(&a.session_id, tenant) => run_artifact(tenant, &a),
            Ok(a) => match SessionId::parse("session_id", &a.session_id)
                .map_err(|e| e.to_string())
                .and_then(|id| store.check_owner(&id, tenant).map_err(|e| e.to_string()))
            {
                Err(e) => tool_error(e),
                Ok(()) => match live_artifact(&a).await {
                    Some(read) => artifact_result(read),
                    None => get_artifact(&store, a),
                },
            },
        },
    })
}

/// The pipeline's "attach session" step, for `exec_run` or `execute_code` with
/// `session_id` (on a server whose tools include the session tools): take `session_id` out of
/// the arguments (the rest are `execute_code`'s) and check that the session is open.
/// `Ok(None)` for any other call; `Err` is the message of the tool error to answer.
pub fn attach(
    engine: &Engine,
    tenant: &str,
    request: &mut CallToolRequestParams,
) -> Result<Option<SessionRun>, String> {
    let named = request.name == EXEC_RUN;
    let has_session = request
        .arguments
        .as_ref()
        .is_some_and(|a| a.contains_key("session_id"));
    if !(named || (request.name == "execute_code" && has_session)) {
        return Ok(None);
    }
    let mut args = request.arguments.take().unwrap_or_default();
    let raw = args.remove("session_id");
    request.arguments = Some(args);
    let id = match raw.as_ref().map(|v| v.as_str()) {
        Some(Some(s)) => SessionId::parse("session_id", s)?,
        Some(None) => return Err("session_id: expected a string".into()),
        None => return Err("session_id: missing; open a session with exec_open".into()),
    };
    let store = store(engine)?;
    store.check_owner(&id, tenant).map_err(|e| e.to_string())?;
    match store.info(&id) {
        Err(e) => return Err(e.to_string()),
        Ok(i) if i.closed => return Err(StoreError::Closed(id).to_string()),
        Ok(_) => {}
    }
    Ok(Some(SessionRun {
        store,
        id,
        tenant: tenant.to_string(),
    }))
}

/// Add what happened to the session's workspace to a run's result (`report`), or that
/// nothing ran (`None`: the call was refused or is waiting for a human).
pub fn shape(
    response: CallToolResponse,
    session: &SessionRun,
    report: Option<RunReport>,
) -> CallToolResponse {
    let report = report.unwrap_or_else(|| RunReport {
        session_id: session.id.to_string(),
        note: Some("nothing ran; the workspace is unchanged".into()),
        ..Default::default()
    });
    match response {
        CallToolResponse::Complete(mut r) => {
            // Full-size pictures the run kept in the session: offered as resources.
            let fulls: Vec<String> = r
                .structured_content
                .as_ref()
                .and_then(|v| v.get("pictures"))
                .and_then(Value::as_array)
                .map(|ps| {
                    ps.iter()
                        .filter_map(|p| p.get("full").and_then(Value::as_str))
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            for full in fulls {
                if let Some(change) = report.files_changed.iter().find(|c| c.path == full) {
                    let mime = if full.ends_with(".svg") {
                        "image/svg+xml"
                    } else {
                        "image/png"
                    };
                    r.content.push(ContentBlock::resource_link(
                        Resource::new(file_uri(&session.id, &full), full.clone())
                            .with_description("the full-size picture")
                            .with_mime_type(mime)
                            .with_size(change.size),
                    ));
                }
            }
            if let Some(Value::Object(map)) = r.structured_content.as_mut()
                && let Ok(Value::Object(extra)) = serde_json::to_value(&report)
            {
                map.extend(extra);
            }
            r.content.push(ContentBlock::text(describe(&report)));
            CallToolResponse::Complete(r)
        }
        other => other,
    }
}

fn describe(r: &RunReport) -> String {
    let mut s = format!("--- session {} ---\n", r.session_id);
    if !r.workspace_saved {
        s.push_str("workspace unchanged");
        if let Some(n) = &r.note {
            s.push_str(&format!(": {n}"));
        }
        s.push('\n');
        return s;
    }
    if r.files_changed.is_empty() {
        s.push_str("no files changed\n");
    }
    for c in &r.files_changed {
        let kind = serde_json::to_value(c.change).unwrap_or_default();
        s.push_str(&format!(
            "{} {} ({} bytes)\n",
            kind.as_str().unwrap_or("changed"),
            c.path,
            c.size
        ));
    }
    if !r.skipped.is_empty() {
        s.push_str(&format!("not kept: {}\n", r.skipped.join(", ")));
    }
    s
}

/// Run `req` over the session's workspace and keep the files it leaves (a run that did not
/// end by itself changes nothing). Returns the outcome and what happened to the workspace.
pub async fn run(
    engine: &Engine,
    scope: &SessionRun,
    req: ExecRequest,
    backend: Option<BackendKind>,
) -> (Outcome, RunReport) {
    if let Some(live) = live_sessions().get(&scope.id) {
        return run_live(engine, scope, &live, req).await;
    }
    let backend_name = backend.unwrap_or(engine.config().backend).to_string();
    let mut report = RunReport {
        session_id: scope.id.to_string(),
        ..Default::default()
    };
    let refuse = |e: StoreError| Outcome::denied(&req.language, &backend_name, e.to_string());
    let guard = match scope.store.begin_run(&scope.id).await {
        Ok(g) => g,
        Err(e) => return (refuse(e), report),
    };
    let files = match scope.store.workspace_files(&guard) {
        Ok(f) => f,
        Err(e) => return (refuse(e), report),
    };
    let limits = scope.store.limits();
    let (mut outcome, collected) = engine.execute_collecting(req, backend, files, limits).await;
    match collected {
        None => {
            report.note = Some(
                outcome
                    .reason
                    .clone()
                    .unwrap_or_else(|| "the run did not end by itself".into()),
            );
        }
        Some(c) => {
            report.skipped = c.summary.skipped.clone();
            let saved = within_storage(engine, scope, &c)
                .map_err(|r| StoreError::Quota(r.to_string()))
                .and_then(|()| scope.store.apply(&guard, &c));
            match saved {
                Ok(changes) => {
                    report.files_changed = changes;
                    report.workspace_saved = true;
                }
                Err(e) => {
                    let text = format!("workspace not saved: {e}");
                    report.note = Some(text.clone());
                    outcome.reason = Some(match outcome.reason.take() {
                        Some(r) => format!("{r}; {text}"),
                        None => text,
                    });
                }
            }
        }
    }
    (outcome, report)
}

fn get_artifact(store: &SessionStore, a: ExecGetArtifactArgs) -> CallToolResponse {
    let id = match SessionId::parse("session_id", &a.session_id) {
        Ok(id) => id,
        Err(e) => return tool_error(e),
    };
    let max = a.max_bytes.unwrap_or(DEFAULT_ARTIFACT_BYTES);
    if max == 0 || max > MAX_ARTIFACT_BYTES {
        return tool_error(format!(
            "max_bytes: {max} is out of range 1..={MAX_ARTIFACT_BYTES}"
        ));
    }
    let art = match store.read(&id, &a.path, a.offset.unwrap_or(0), max) {
        Ok(x) => x,
        Err(e) => return tool_error(e.to_string()),
    };
    artifact_result(Ok((id, art)))
}

/// A page of one of the outputs a run without a session kept (`a.session_id` is the run's
/// id, the `{id}` of its `gearbox://runs/{id}/outputs/…` links).
fn run_artifact(tenant: &str, a: &ExecGetArtifactArgs) -> CallToolResponse {
    let max = a.max_bytes.unwrap_or(DEFAULT_ARTIFACT_BYTES);
    if max == 0 || max > MAX_ARTIFACT_BYTES {
        return tool_error(format!(
            "max_bytes: {max} is out of range 1..={MAX_ARTIFACT_BYTES}"
        ));
    }
    let offset = a.offset.unwrap_or(0);
    match crate::runs::read_page(&a.session_id, tenant, &a.path, offset, max) {
        Err(e) => tool_error(e),
        Ok((uri, size, content)) => page_result(
            a.session_id.clone(),
            uri,
            gearbox_sessions::Artifact {
                path: a.path.clone(),
                size,
                offset: offset.min(size),
                content,
            },
        ),
    }
}

/// A page of a live session's file (`None`: not a live session).
async fn live_artifact(
    a: &ExecGetArtifactArgs,
) -> Option<Result<(SessionId, gearbox_sessions::Artifact), String>> {
    let id = SessionId::parse("session_id", &a.session_id).ok()?;
    let files = live_sessions().files(&id)?;
    let max = a.max_bytes.unwrap_or(DEFAULT_ARTIFACT_BYTES);
    if max == 0 || max > MAX_ARTIFACT_BYTES {
        return Some(Err(format!(
            "max_bytes: {max} is out of range 1..={MAX_ARTIFACT_BYTES}"
        )));
    }
    let read = files.read_file(&a.path, a.offset.unwrap_or(0), max);
    Some(read.map(|(size, content)| {
        (
            id,
            gearbox_sessions::Artifact {
                path: a.path.clone(),
                size,
                offset: a.offset.unwrap_or(0).min(size),
                content,
            },
        )
    }))
}

/// The answer of `exec_get_artifact` for a page read of a session's file.
fn artifact_result(
    read: Result<(SessionId, gearbox_sessions::Artifact), String>,
) -> CallToolResponse {
    match read {
        Ok((id, art)) => page_result(id.to_string(), file_uri(&id, &art.path), art),
        Err(e) => tool_error(e),
    }
}

/// The answer of `exec_get_artifact` for a page of `art`, a file of session (or run) `id`
/// known as `uri`.
fn page_result(id: String, uri: String, art: gearbox_sessions::Artifact) -> CallToolResponse {
    let (text, used) = utf8_prefix(&art.content);
    let binary = text.is_none();
    let length = if binary { art.content.len() } else { used };
    let next = art.offset + length as u64;
    let more = next < art.size;
    let mut value = json!({
        "session_id": id,
        "path": art.path,
        "uri": uri,
        "size": art.size,
        "offset": art.offset,
        "length": length,
        "more": more,
        "encoding": if binary { "base64" } else { "utf8" },
    });
    if more {
        value["next_offset"] = json!(next);
    }
    let mut content = Vec::new();
    match text {
        Some(t) => {
            value["content"] = json!(t);
            content.push(ContentBlock::text(t.to_string()));
        }
        None => {
            let b64 = base64::engine::general_purpose::STANDARD.encode(&art.content);
            value["content"] = json!(b64);
            content.push(ContentBlock::text(format!(
                "{}: binary, {} bytes from offset {} of {} (base64 in the embedded resource)",
                art.path, length, art.offset, art.size
            )));
            content.push(ContentBlock::resource(
                ResourceContents::blob(b64, uri).with_mime_type("application/octet-stream"),
            ));
        }
    }
    if more {
        content.push(ContentBlock::text(format!(
            "[{} more bytes: call again with offset {next}]",
            art.size - next
        )));
    }
    let mut r = CallToolResult::success(content);
    r.structured_content = Some(value);
    r.into()
}

/// The slice as text when it is UTF-8, allowing a character cut at the end of a page (the
/// cut bytes start the next page). `None` for binary content.
fn utf8_prefix(bytes: &[u8]) -> (Option<&str>, usize) {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.contains('\0') => (Some(s), bytes.len()),
        Ok(_) => (None, bytes.len()),
        Err(e) if e.error_len().is_none() && e.valid_up_to() + 4 > bytes.len() => {
            let s = std::str::from_utf8(&bytes[..e.valid_up_to()]).ok();
            match s {
                Some(s) if !s.is_empty() && !s.contains('\0') => (Some(s), e.valid_up_to()),
                _ => (None, bytes.len()),
            }
        }
        Err(_) => (None, bytes.len()),
    }
}

/// Percent-decode a URI component strictly (`%XX` only); the result is validated as a
/// workspace path afterwards, so `%2e%2e` is refused like `..`.
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            // Two hex digits: `u8::from_str_radix` alone would also take a sign (`%+1`).
            let hex = b
                .get(i + 1..i + 3)
                .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} does not decode to UTF-8"))
}

/// Whether `uri` is a session resource.
pub fn is_session_uri(uri: &str) -> bool {
    uri.starts_with(SESSIONS_PREFIX)
}

/// The session of a session resource URI and, for a file, its percent-decoded path (not
/// yet validated: the store validates every path it is given).
fn parse_uri(uri: &str) -> Result<(SessionId, Option<String>), String> {
    let rest = uri.strip_prefix(SESSIONS_PREFIX).unwrap_or_default();
    let (id, tail) = match rest.split_once('/') {
        Some((id, tail)) => (id, Some(tail)),
        None => (rest, None),
    };
    let id = SessionId::parse("session id", id)?;
    let Some(tail) = tail else {
        return Ok((id, None));
    };
    let Some(encoded) = tail.strip_prefix("files/") else {
        return Err(format!("no resource {uri:?}; try {FILES_TEMPLATE}"));
    };
    Ok((id, Some(percent_decode(encoded)?)))
}

/// `resources/read` of `gearbox://sessions/{id}/files/{path}` (and `gearbox://sessions/{id}`
/// for the manifest).
pub async fn read_resource(
    engine: &Engine,
    uri: &str,
    tenant: &str,
) -> Result<ReadResourceResult, McpError> {
    let not_found = |m: String| McpError::resource_not_found(m, Some(json!({ "uri": uri })));
    let store = store(engine).map_err(not_found)?;
    let (id, path) = parse_uri(uri).map_err(not_found)?;
    store
        .check_owner(&id, tenant)
        .map_err(|e| not_found(e.to_string()))?;
    match path {
        None => {
            let files = store.files(&id).map_err(|e| not_found(e.to_string()))?;
            let mut body = json!({ "session_id": id.to_string(), "files": files });
            if let Some(live) = live_state(&id) {
                body["live"] = live;
            }
            Ok(ReadResourceResult::new(vec![
                ResourceContents::text(body.to_string(), uri).with_mime_type("application/json"),
            ]))
        }
        Some(path) => {
            let art = match live_sessions().files(&id) {
                Some(files) => {
                    let (size, content) = files
                        .read_file(&path, 0, MAX_ARTIFACT_BYTES)
                        .map_err(not_found)?;
                    gearbox_sessions::Artifact {
                        path: path.clone(),
                        size,
                        offset: 0,
                        content,
                    }
                }
                None => store
                    .read(&id, &path, 0, MAX_ARTIFACT_BYTES)
                    .map_err(|e| not_found(e.to_string()))?,
            };
            if art.more() {
                return Err(McpError::invalid_params(
                    format!(
                        "{path:?} is {} bytes, more than {MAX_ARTIFACT_BYTES}: read it in pages with {EXEC_GET_ARTIFACT}",
                        art.size
                    ),
                    Some(json!({ "uri": uri })),
                ));
            }
            let contents = match std::str::from_utf8(&art.content) {
                Ok(t) => ResourceContents::text(t, uri),
                Err(_) => ResourceContents::blob(
                    base64::engine::general_purpose::STANDARD.encode(&art.content),
                    uri,
                )
                .with_mime_type("application/octet-stream"),
            };
            Ok(ReadResourceResult::new(vec![contents]))
        }
    }
}

/// The files of every open session, as resources (at most a few hundred; the template
/// reaches the rest).
pub fn list_resources(engine: &Engine, tenant: &str) -> Vec<Resource> {
    let Ok(store) = store(engine) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for s in store.list_for(tenant) {
        let Ok(id) = SessionId::parse("id", &s.session_id) else {
            continue;
        };
        let Ok(files) = store.files(&id) else {
            continue;
        };
        for (path, entry) in files {
            if out.len() >= MAX_LISTED_FILES {
                return out;
            }
            out.push(
                Resource::new(file_uri(&id, &path), path.clone())
                    .with_description(format!("file of session {id}"))
                    .with_size(entry.size),
            );
        }
    }
    out
}

/// The template of session files.
pub fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(FILES_TEMPLATE, "session-file")
            .with_title("Session file")
            .with_description(
                "A file of a session's workspace (PATH relative to /work); text or base64 blob",
            ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_is_strict_and_validated_later() {
        assert_eq!(percent_decode("a%20b").as_deref(), Ok("a b"));
        assert_eq!(percent_decode("%2e%2e/etc").as_deref(), Ok("../etc"));
        assert!(gearbox_core::validate_relative_path("p", "../etc").is_err());
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%2").is_err());
        assert!(percent_decode("%ff").is_err());
    }

    /// Regression (found by `proptests::decoding_is_strict`): a `+` after `%` was taken as
    /// a sign by `u8::from_str_radix`, so `%+1` decoded to byte 1 although only `%XX` is an
    /// escape.
    #[test]
    fn a_sign_is_not_a_hex_digit() {
        for bad in ["%+1", "%+f", "a%+0b", "%-1"] {
            assert!(percent_decode(bad).is_err(), "{bad:?} decoded");
        }
    }

    /// Regression (found by `proptests::a_listed_file_uri_names_that_file`): a file's URI
    /// carried its path unencoded, so `100%.txt` was listed with a URI that did not parse and
    /// `a%41` with one that named another file, `aA`.
    #[test]
    fn listed_uris_encode_what_decoding_would_change() {
        let id = SessionId::new();
        for path in ["100%.txt", "a%41", "with space/x.txt", "é.txt", "a#b?c"] {
            assert_eq!(
                parse_uri(&file_uri(&id, path)),
                Ok((id, Some(path.to_string()))),
                "{path}"
            );
        }
        assert_eq!(
            file_uri(&id, "out/result.txt"),
            format!("{SESSIONS_PREFIX}{id}/files/out/result.txt")
        );
    }

    #[test]
    fn text_pages_do_not_split_characters() {
        let s = "aé".as_bytes();
        assert_eq!(utf8_prefix(&s[..2]), (Some("a"), 1));
        assert_eq!(utf8_prefix(s), (Some("aé"), 3));
        assert_eq!(utf8_prefix(&[0xff, 0xfe, 0, 1]).0, None);
        assert_eq!(utf8_prefix(b"a\0b").0, None);
    }
}

/// Property tests of session resource URIs, which a client writes: any URI parses to an
/// error or to a session id and a decoded path without panicking; decoding is strict
/// (`%XX` only) and undoes any encoding; a file's listed URI reads back that very file.
/// `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    /// `s` with the characters `mask` picks (and every `%`) encoded as `%XX`, upper or
    /// lower case hex.
    fn encode(s: &str, mask: &[bool], lower: bool) -> String {
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            let picked = !mask.is_empty() && mask[i % mask.len()];
            if picked || c == '%' {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&if lower {
                        format!("%{b:02x}")
                    } else {
                        format!("%{b:02X}")
                    });
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    fn tail() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("%".to_string()),
            Just("%2e".to_string()),
            Just("%2F".to_string()),
            Just("%+1".to_string()),
            Just("%00".to_string()),
            Just("%ff".to_string()),
            Just("%c3%a9".to_string()),
            Just("..".to_string()),
            Just("/".to_string()),
            Just("files/".to_string()),
            "[a-z0-9.]{1,4}",
            any::<char>().prop_map(String::from),
        ];
        proptest::collection::vec(piece, 0..10).prop_map(|v| v.concat())
    }

    fn uri() -> impl Strategy<Value = String> {
        let id = prop_oneof![
            Just(SessionId::new().to_string()),
            "[0-9a-f-]{36}",
            any::<String>(),
        ];
        (
            prop::sample::select(vec![
                SESSIONS_PREFIX,
                "gearbox://sessions",
                "gearbox://",
                "",
            ]),
            id,
            prop::sample::select(vec!["", "/", "/files/", "/files", "/other/"]),
            tail(),
        )
            .prop_map(|(prefix, id, sep, tail)| format!("{prefix}{id}{sep}{tail}"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(512)))]

        #[test]
        fn decoding_is_strict(s in prop_oneof![tail(), any::<String>()]) {
            if percent_decode(&s).is_ok() {
                let b = s.as_bytes();
                for (i, _) in s.match_indices('%') {
                    prop_assert!(
                        b.len() > i + 2 && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit(),
                        "{:?} decoded",
                        s
                    );
                }
            }
        }

        #[test]
        fn decoding_undoes_any_encoding(
            s in any::<String>(),
            mask in proptest::collection::vec(any::<bool>(), 0..8),
            lower in any::<bool>(),
        ) {
            prop_assert_eq!(percent_decode(&encode(&s, &mask, lower)), Ok(s));
        }

        #[test]
        fn uris_parse_to_an_id_and_a_path_or_an_error(uri in uri()) {
            if let Ok((id, path)) = parse_uri(&uri) {
                prop_assert!(uri.starts_with(&format!("{SESSIONS_PREFIX}{id}")), "{}", uri);
                if let Some(path) = path {
                    // What the store would then accept is a plain relative path.
                    if gearbox_core::validate_relative_path("path", &path).is_ok() {
                        prop_assert!(std::path::Path::new(&path)
                            .components()
                            .all(|c| matches!(c, std::path::Component::Normal(_))));
                    }
                }
            }
        }

        #[test]
        fn a_listed_file_uri_names_that_file(
            parts in proptest::collection::vec("[^/\\p{Cc}\\\\]{1,12}", 1..4),
        ) {
            let path = parts.join("/");
            prop_assume!(gearbox_core::validate_relative_path("p", &path).is_ok());
            let id = SessionId::new();
            prop_assert_eq!(parse_uri(&file_uri(&id, &path)), Ok((id, Some(path.clone()))));
        }
    }
}

// Live sessions: an interpreter kept running in a sandbox of its own.

/// A live session's interpreter, or why it ended.
pub struct LiveSession {
    live: Option<gearbox_engine::live::Live>,
    language: String,
    opened_at: std::time::SystemTime,
    /// The tool channel its interpreter was started with (`allow_tools` at open).
    tools: Option<crate::broker::OpenTools>,
}

/// A live session as the registry holds it: the session (locked by a running cell) and a
/// way to end its sandbox at once, whatever the session is doing.
#[derive(Clone)]
struct LiveEntry {
    /// The tenant that opened it.
    tenant: String,
    session: Arc<tokio::sync::Mutex<LiveSession>>,
    killer: gearbox_engine::live::Killer,
    files: gearbox_engine::live::LiveFiles,
    /// What its tools are (`allow_tools` and limits at open): each cell is gated with it.
    access: Option<crate::broker::ToolAccess>,
}

impl LiveEntry {
    /// End the session now: its sandbox is killed at once (a running cell ends), then the
    /// session is closed once the cell has let go of it.
    async fn end(&self) {
        self.killer.kill();
        self.session.lock().await.end().await;
    }
}

impl LiveSession {
    /// End it now (its sandbox is killed).
    async fn end(&mut self) {
        if let Some(live) = self.live.take() {
            live.close().await;
        }
        // The channel closes with the sandbox (its directory is removed).
        self.tools.take();
    }
}

/// The live sessions of this process, by session id (their files are in the store like any
/// session's: the store says when one expired or was closed).
#[derive(Default)]
pub struct LiveSessions {
    map: Mutex<HashMap<SessionId, LiveEntry>>,
}

impl LiveSessions {
    fn get(&self, id: &SessionId) -> Option<Arc<tokio::sync::Mutex<LiveSession>>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|e| e.session.clone())
    }

    /// Whether `id` is a live session of this process, and the tools its cells may call.
    pub fn tools_of(&self, id: &SessionId) -> Option<Option<crate::broker::ToolAccess>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|e| e.access.clone())
    }

    /// The reader of a live session's files (usable while a cell runs).
    fn files(&self, id: &SessionId) -> Option<gearbox_engine::live::LiveFiles> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .map(|e| e.files)
    }

    fn remove(&self, id: &SessionId) -> Option<LiveEntry> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    fn count(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Live sessions `tenant` opened.
    fn count_for(&self, tenant: &str) -> usize {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|e| e.tenant == tenant)
            .count()
    }

    fn ids(&self) -> Vec<SessionId> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }
}

/// The live sessions of this process.
pub fn live_sessions() -> &'static LiveSessions {
    static LIVE: OnceLock<LiveSessions> = OnceLock::new();
    LIVE.get_or_init(LiveSessions::default)
}

/// The server is leaving: end every live session (each helper removes its cgroup).
pub async fn end_all_live() {
    for id in live_sessions().ids() {
        if let Some(live) = live_sessions().remove(&id) {
            live.end().await;
        }
    }
}

/// Every two seconds, end the live sessions whose session expired or was closed.
fn start_reaper(store: Arc<SessionStore>) {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                for id in live_sessions().ids() {
                    let gone = match store.info(&id) {
                        Ok(info) => info.closed,
                        Err(_) => true,
                    };
                    if gone && let Some(live) = live_sessions().remove(&id) {
                        tracing::info!(session = %id, "live session expired; its sandbox ends");
                        live.end().await;
                    }
                }
            }
        });
    });
}

async fn open_live(
    engine: &Engine,
    broker: Option<&gearbox_broker::Broker>,
    gear: gearbox_core::Gear,
    tenant: &str,
    store: &Arc<SessionStore>,
    a: ExecOpenArgs,
    args: Option<&JsonObject>,
) -> CallToolResponse {
    let Some(language) = a.language else {
        return tool_error(
            "language: a live session (stateful: true) needs its language, e.g. python",
        );
    };
    let packages = a.packages.unwrap_or_default();
    if !packages.is_empty() && gear != gearbox_core::Gear::FullTrust {
        return tool_error(format!(
            "packages: a live session installs them when it opens, which the {gear} gear does \
             not allow without asking; open it without packages, or on a full_trust server"
        ));
    }
    // The tools the interpreter may call: checked now, the channel opened with the sandbox.
    // Each cell is then gated as a run that calls tools (user_confirmed asks per cell).
    let access = match crate::broker::access(broker, engine.config().limits.timeout_ms, args) {
        Ok(a) => a,
        Err(message) => return tool_error(message),
    };
    if access.is_some() && gear < gearbox_core::Gear::UserConfirmed {
        return tool_error(format!(
            "allow_tools: the {gear} gear denies tools, so no cell of this session could use them"
        ));
    }
    let max = engine.config().sessions.live_max.max(1);
    if live_sessions().count() >= max {
        return tool_error(format!(
            "at most {max} live sessions may be open at once ([sessions] live_max); close one with exec_close"
        ));
    }
    let tools = match &access {
        None => None,
        Some(t) => match t.open(broker).await {
            Ok(open) => Some(open),
            Err(message) => return tool_error(message),
        },
    };
    let info = match store.create(tenant) {
        Ok(i) => i,
        Err(e) => return tool_error(e.to_string()),
    };
    let id = match SessionId::parse("session_id", &info.session_id) {
        Ok(id) => id,
        Err(e) => return tool_error(e),
    };
    let mut template = ExecRequest {
        language,
        packages,
        ..Default::default()
    };
    if let Some(t) = &tools {
        t.apply_live(&mut template);
    }
    let live = match engine.open_live(template).await {
        Ok(l) => l,
        Err(e) => {
            let _ = store.close(&id, false);
            return tool_error(format!("the live session could not start: {e}"));
        }
    };
    let language = live.language().to_string();
    let killer = live.killer();
    let files = live.files();
    live_sessions()
        .map
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            id,
            LiveEntry {
                tenant: tenant.to_string(),
                session: Arc::new(tokio::sync::Mutex::new(LiveSession {
                    live: Some(live),
                    language: language.clone(),
                    opened_at: std::time::SystemTime::now(),
                    tools,
                })),
                killer,
                files,
                access,
            },
        );
    start_reaper(store.clone());
    let opened = Opened {
        session_id: info.session_id.clone(),
        workspace: info.workspace.clone(),
        expires_at: info.expires_at.clone(),
        quota_bytes: info.quota_bytes,
        max_files: info.max_files,
        live: Some(language.clone()),
    };
    let text = format!(
        "live {language} session {} opened: variables persist across exec_run calls; expires {} unless used, and after {} s in any case",
        opened.session_id,
        opened.expires_at.as_deref().unwrap_or("never"),
        engine.config().sessions.live_max_age_secs
    );
    ok(serde_json::to_value(&opened).unwrap_or_default(), text)
}

/// Run `req`'s code as the next cell of a live session.
async fn run_live(
    engine: &Engine,
    scope: &SessionRun,
    live: &Arc<tokio::sync::Mutex<LiveSession>>,
    req: ExecRequest,
) -> (Outcome, RunReport) {
    let report = RunReport {
        session_id: scope.id.to_string(),
        note: Some("live session: variables and files stay in its interpreter's sandbox".into()),
        ..Default::default()
    };
    let mut session = live.lock().await;
    let refuse = |why: String| (Outcome::denied(&req.language, "linux", why), report.clone());
    let wanted = engine
        .normalize_language(&req.language)
        .unwrap_or_else(|_| req.language.clone());
    if wanted != session.language {
        return refuse(format!(
            "language: this live session runs {}, not {}",
            session.language, req.language
        ));
    }
    if !req.files.is_empty() || !req.args.is_empty() || !req.stdin.is_empty() {
        return refuse(
            "additional_files, args and stdin are not taken by a live session's cells; \
             write files from the code itself"
                .into(),
        );
    }
    if req.network.is_on() {
        return refuse("network: a live session's interpreter has no network".into());
    }
    if !req.packages.is_empty() || !req.env.is_empty() {
        return refuse(
            "packages and env are not taken by a live session's cells (its interpreter was \
             started with the session)"
                .into(),
        );
    }
    // The lease: one cell at a time, and using the session renews it.
    let guard = match scope.store.begin_run(&scope.id).await {
        Ok(g) => g,
        Err(e) => return refuse(e.to_string()),
    };
    let limits = &engine.config().limits;
    let timeout_ms = req
        .limits
        .timeout_ms
        .unwrap_or(limits.timeout_ms)
        .min(limits.timeout_ms)
        .max(1);
    let output = req
        .limits
        .output_bytes
        .unwrap_or(limits.output_bytes)
        .min(limits.output_bytes) as usize;
    let s = &mut *session;
    let Some(interpreter) = s.live.as_mut() else {
        return refuse("the live session has ended".into());
    };
    let mut calls = s.tools.as_ref().map(|t| t.begin_cell());
    let cell = interpreter
        .run_cell(&req.code, Duration::from_millis(timeout_ms), output)
        .await;
    // Idle from now on: the session's TTL counts from the end of this cell.
    if let Err(e) = scope.store.renew(&guard) {
        tracing::debug!(session = %scope.id, error = %e, "renewing a live session's lease");
    }
    if let (Some(calls), Some(t)) = (calls.as_mut(), s.tools.as_ref()) {
        calls.extend(t.take_records());
    }
    use gearbox_engine::live::CellStatus;
    let (status, reason) = match cell.status {
        CellStatus::Ok => (gearbox_core::Status::Ok, None),
        CellStatus::Error => (gearbox_core::Status::Error, cell.reason.clone()),
        CellStatus::Interrupted => (
            gearbox_core::Status::Timeout,
            Some(format!(
                "the cell ran past its {timeout_ms} ms timeout and was interrupted; the session and its variables remain"
            )),
        ),
        CellStatus::Dead => (
            gearbox_core::Status::Killed,
            Some(format!(
                "the live session has ended: {}",
                cell.reason.clone().unwrap_or_default()
            )),
        ),
    };
    let language = session.language.clone();
    let mut outcome = Outcome::failed_to_start(&language, "linux", String::new());
    outcome.status = status;
    outcome.reason = reason;
    outcome.stdout = cell.stdout;
    outcome.stderr = cell.stderr;
    outcome.stdout_truncated = cell.stdout_truncated;
    outcome.stderr_truncated = cell.stderr_truncated;
    outcome.duration_ms = cell.duration_ms;
    outcome.result = cell.result;
    outcome.exit_code = (status == gearbox_core::Status::Ok).then_some(0);
    outcome.take_pictures();
    // The full-size pictures the cell kept in its /work/outputs: listed, so the result links
    // them (readable as the session's files while it lives).
    let mut report = report;
    for full in outcome.pictures.iter().filter_map(|p| p.full.as_deref()) {
        let interpreter = session.live.as_ref();
        if let Some(Ok((size, _))) = interpreter.map(|l| l.read_file(full, 0, 0)) {
            report.files_changed.push(FileChange {
                path: full.to_string(),
                change: gearbox_sessions::ChangeKind::Created,
                size,
                sha256: None,
            });
        }
    }
    report.tool_calls = calls;
    (outcome, report)
}

/// What `gearbox://sessions/{id}` adds for a live session: its language, cells run, age,
/// and whether its interpreter still lives.
pub fn live_state(id: &SessionId) -> Option<Value> {
    let live = live_sessions().get(id)?;
    // A running cell holds the session: say so rather than wait for it.
    let Ok(mut s) = live.try_lock() else {
        return Some(json!({"alive": true, "busy": true}));
    };
    let language = s.language.clone();
    let opened_at = s.opened_at;
    let (alive, cells, ended) = match s.live.as_mut() {
        Some(l) => (l.alive(), l.cells(), l.dead().map(str::to_string)),
        None => (false, 0, Some("closed".into())),
    };
    let age = opened_at.elapsed().map(|d| d.as_secs()).unwrap_or_default();
    Some(
        json!({"language": language, "alive": alive, "cells": cells, "ended": ended, "age_secs": age}),
    )
}
