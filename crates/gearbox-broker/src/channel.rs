//! The tool-call channel of one run: a private directory with a Unix socket and the SDK, a
//! line-delimited JSON protocol on the socket, and the policy checks on every call.
//!
//! Protocol (one JSON object per line, both ways; requests on one connection may overlap and
//! are answered by `id`):
//!
//! ```text
//! → {"id": 1, "op": "call", "server": "everything", "tool": "echo", "args": {"message": "hi"}}
//! ← {"id": 1, "ok": true, "result": {"structured": null, "text": "Echo: hi", "content": [...]}}
//! ← {"id": 1, "ok": true, "result": {"truncated": true, "artifact_id": "...", "size_bytes": N, "preview": "..."}}
//! ← {"id": 1, "ok": false, "error": {"type": "ToolNotAllowed", "message": "..."}}
//! → {"id": 2, "op": "list_servers"}            ← result: [{"name", "tags", "status"}]
//! → {"id": 3, "op": "list_tools", "server": S} ← result: [{"name", "description"}]
//! ```
//!
//! Error types: `ToolNotAllowed`, `ToolTimeout`, `CallLimitExceeded`, `ToolFailed` (the tool
//! answered `isError`, or its server is down or crashed), `BadRequest`.
//!
//! Bounds (a program that floods the socket and never reads cannot grow the server): a
//! request line is at most 1 MiB; a run holds at most 16 connections; a connection has at
//! most 8 requests in flight and a run 16, where a request is in flight from the moment its
//! line is read until its answer is written to the socket. At a bound the broker stops
//! reading (the program's writes block), it does not buffer. Every operation, `list_servers`
//! and `list_tools` included, counts against `max_calls`.
//!
//! Who may connect: the run's directory is `0710` and its socket `0660`, both owned by the
//! server with the sandbox's group (root: `nobody`), or `0700`/`0600` when the server is
//! unprivileged (the sandbox is the server's own uid); a connection whose peer
//! (`SO_PEERCRED`) is neither the server's uid nor the sandbox's is closed unread.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use rmcp::model::CallToolResult;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_util::codec::{FramedRead, LinesCodec};

use crate::config::CallLimits;
use crate::stubs::StubLanguage;
use crate::target::CallError;
use crate::{ArtifactSink, Broker, BrokerError, glob};

/// The Python SDK, written read-only into each run's SDK directory.
pub const PYTHON_SDK: &str = include_str!("sdk/gearbox.py");
/// The Node.js SDK (CommonJS: `require("gearbox")`).
pub const NODE_SDK: &str = include_str!("sdk/gearbox.js");

/// Longest request line the broker reads (bytes).
const MAX_LINE: usize = 1024 * 1024;
/// Connections one run may hold open at once.
const MAX_CONNECTIONS: usize = 16;
/// Requests one connection may have in flight (read, not yet answered on the socket).
const MAX_IN_FLIGHT_PER_CONNECTION: usize = 8;
/// Requests one run may have in flight over all its connections.
const MAX_IN_FLIGHT_PER_RUN: usize = 16;
/// Characters of a trimmed result handed to the code.
const PREVIEW_CHARS: usize = 2_000;

/// What one run's code may call and how much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallPolicy {
    /// `server/tool` globs; a call must match one.
    pub allow: Vec<String>,
    pub limits: CallLimits,
}

impl CallPolicy {
    /// Validate `allow` (each entry `server/tool`, globs allowed); an error names the entry.
    pub fn new(allow: Vec<String>, limits: CallLimits) -> Result<CallPolicy, String> {
        if allow.is_empty() {
            return Err("allow_tools: give at least one server/tool pattern".into());
        }
        if allow.len() > 256 {
            return Err("allow_tools: at most 256 patterns".into());
        }
        for (i, p) in allow.iter().enumerate() {
            glob::validate(p).map_err(|e| format!("allow_tools[{i}]: {e}"))?;
            if !p.contains('/') {
                return Err(format!(
                    "allow_tools[{i}]: {p:?} must be server/tool (globs allowed, e.g. \"everything/*\")"
                ));
            }
        }
        Ok(CallPolicy { allow, limits })
    }

    fn allows(&self, server: &str, tool: &str) -> bool {
        let name = format!("{server}/{tool}");
        self.allow.iter().any(|p| glob::matches(p, &name))
    }

    /// Whether some pattern could allow a tool of `server`.
    fn touches(&self, server: &str) -> bool {
        self.allow.iter().any(|p| {
            let (s, _) = p.split_once('/').unwrap_or((p, ""));
            glob::matches(s, server)
        })
    }
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    Ok,
    /// The tool answered with `isError`.
    ToolError,
    /// Refused by the allowlist (or the target's `tools_allow`).
    NotAllowed,
    /// Past the per-call deadline or the run's wall clock.
    Timeout,
    /// Past `max_calls`.
    CallLimit,
    /// The server was down, crashed during the call, or answered with a protocol error.
    Failed,
}

/// One tool call of a run, as the run's result reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallRecord {
    pub server: String,
    pub tool: String,
    pub duration_ms: u64,
    pub outcome: CallOutcome,
    /// Why the call did not succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Where the full result went when it was larger than `max_output_kb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
}

struct RunState {
    broker: Broker,
    policy: CallPolicy,
    /// When the run began (or, in a live session, its current cell): `wall_clock_ms` counts
    /// from here.
    started: Mutex<Instant>,
    calls: AtomicU32,
    records: Mutex<Vec<ToolCallRecord>>,
    sink: Arc<dyn ArtifactSink>,
    /// Requests in flight over the run's connections (`MAX_IN_FLIGHT_PER_RUN` permits).
    in_flight: Arc<Semaphore>,
}

/// The channel of one run. Dropping it stops serving and removes its directory;
/// [`RunChannel::finish`] does the same and returns the calls made.
pub struct RunChannel {
    dir: PathBuf,
    socket: PathBuf,
    sdk: PathBuf,
    state: Arc<RunState>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for RunChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunChannel")
            .field("dir", &self.dir)
            .field("policy", &self.state.policy)
            .finish()
    }
}

fn io(what: &str, path: &Path, e: std::io::Error) -> BrokerError {
    BrokerError::Io(format!("{what} {}: {e}", path.display()))
}

fn reachable_by_sandbox(root: &Path) -> Result<(), BrokerError> {
    gearbox_core::rundir::reachable_by_sandbox(root, "the broker's SDK and socket")
        .map_err(BrokerError::Io)
}

fn write_ro(path: &Path, text: &str) -> Result<(), BrokerError> {
    std::fs::write(path, text).map_err(|e| io("writing", path, e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))
        .map_err(|e| io("chmod", path, e))
}

pub(crate) async fn open(
    broker: Broker,
    policy: CallPolicy,
    sink: Arc<dyn ArtifactSink>,
) -> Result<RunChannel, BrokerError> {
    let root = broker.config().runtime_dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(&root)
        .map_err(|e| io("creating", &root, e))?;
    reachable_by_sandbox(&root)?;
    let dir = root.join(format!("run-{}", uuid::Uuid::new_v4().simple()));
    let access = Access::of_server();
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| io("creating", &dir, e))?;
    access
        .restrict(&dir, 0o700)
        .map_err(|e| io("restricting", &dir, e))?;
    // From here on, a failure removes the directory (the channel's Drop).
    let mut channel = RunChannel {
        socket: dir.join("broker.sock"),
        sdk: dir.join("sdk"),
        dir,
        state: Arc::new(RunState {
            broker: broker.clone(),
            policy,
            started: Mutex::new(Instant::now()),
            calls: AtomicU32::new(0),
            records: Mutex::new(Vec::new()),
            sink,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_RUN)),
        }),
        server: None,
    };
    let tools_dir = channel.sdk.join("tools");
    for d in [&channel.sdk, &tools_dir] {
        std::fs::create_dir(d).map_err(|e| io("creating", d, e))?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io("chmod", d, e))?;
    }
    write_ro(&channel.sdk.join("gearbox.py"), PYTHON_SDK)?;
    write_ro(&channel.sdk.join("gearbox.js"), NODE_SDK)?;
    write_ro(
        &tools_dir.join("__init__.py"),
        "\"\"\"Typed stubs of the servers this run may call, one module per server.\"\"\"\n",
    )?;
    // Stubs of every server the allowlist touches; a server that is down gets none (the
    // code can still call it, and sees why it fails).
    let touched: Vec<String> = broker
        .target_names()
        .into_iter()
        .filter(|s| channel.state.policy.touches(s))
        .collect();
    let stubs = futures::future::join_all(touched.iter().map(|s| {
        let broker = broker.clone();
        async move {
            let py = broker.stubs(s, StubLanguage::Python).await;
            let js = broker.stubs(s, StubLanguage::Javascript).await;
            (s, py, js)
        }
    }))
    .await;
    for (server, py, js) in stubs {
        for (lang, text) in [(StubLanguage::Python, py), (StubLanguage::Javascript, js)] {
            match text {
                Ok(text) => write_ro(&channel.sdk.join(lang.file_name(server)), &text)?,
                Err(e) => tracing::info!(server, error = %e, "no stubs for a server that is down"),
            }
        }
    }
    let listener =
        UnixListener::bind(&channel.socket).map_err(|e| io("binding", &channel.socket, e))?;
    access
        .restrict(&channel.socket, 0o600)
        .map_err(|e| io("restricting", &channel.socket, e))?;
    channel.server = Some(tokio::spawn(serve(listener, channel.state.clone(), access)));
    Ok(channel)
}

impl RunChannel {
    /// The run's directory on the host; mount it read-only at the same path in the sandbox.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The socket's path (inside `dir`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The SDK directory (inside `dir`): `gearbox.py`, `gearbox.js`, `tools/`.
    pub fn sdk_dir(&self) -> &Path {
        &self.sdk
    }

    /// Environment for the sandboxed program: `GEARBOX_BROKER` (the socket), `PYTHONPATH`
    /// and `NODE_PATH` (the SDK directory).
    pub fn env(&self) -> Vec<(String, String)> {
        let sdk = self.sdk.display().to_string();
        vec![
            ("GEARBOX_BROKER".into(), self.socket.display().to_string()),
            ("PYTHONPATH".into(), sdk.clone()),
            ("NODE_PATH".into(), sdk),
        ]
    }

    pub fn policy(&self) -> &CallPolicy {
        &self.state.policy
    }

    /// The calls recorded so far.
    pub fn records(&self) -> Vec<ToolCallRecord> {
        self.state
            .records
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Start the limits afresh, for the next cell of a live session: `max_calls` and
    /// `wall_clock_ms` count from now, and the calls recorded so far are returned and
    /// forgotten (each cell reports its own).
    pub fn begin_cell(&self) -> Vec<ToolCallRecord> {
        *self.state.started.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.state.calls.store(0, Ordering::SeqCst);
        std::mem::take(&mut *self.state.records.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// The calls recorded since the last [`RunChannel::begin_cell`] (or the start), taken.
    pub fn take_records(&self) -> Vec<ToolCallRecord> {
        std::mem::take(&mut *self.state.records.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Stop serving (calls in flight are cancelled), remove the directory and return the
    /// calls made, in the order they finished.
    pub fn finish(mut self) -> Vec<ToolCallRecord> {
        self.stop();
        self.records()
    }

    fn stop(&mut self) {
        if let Some(task) = self.server.take() {
            task.abort();
        }
        if self.dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.dir)
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "removing a run's broker directory");
        }
    }
}

impl Drop for RunChannel {
    fn drop(&mut self) {
        self.stop();
    }
}

use gearbox_core::rundir::RunAccess as Access;

async fn serve(listener: UnixListener, state: Arc<RunState>, access: Access) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    match stream.peer_cred() {
                        Ok(cred) if access.admits(cred.uid()) => {}
                        Ok(cred) => {
                            tracing::warn!(uid = cred.uid(), pid = ?cred.pid(), "run broker: a connection from another user; closed");
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "run broker: no peer credentials; connection closed");
                            continue;
                        }
                    }
                    if conns.len() >= MAX_CONNECTIONS {
                        tracing::debug!("run broker: too many connections; closing one");
                        drop(stream);
                        continue;
                    }
                    conns.spawn(connection(stream, state.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "run broker: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    id: Value,
    op: String,
    #[serde(default)]
    server: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default)]
    args: Option<Value>,
}

/// An error answered to the code.
struct Refusal {
    kind: &'static str,
    message: String,
}

impl Refusal {
    fn new(kind: &'static str, message: impl Into<String>) -> Refusal {
        Refusal {
            kind,
            message: message.into(),
        }
    }
}

/// Slots a request holds from the moment its line is read until its answer is written.
type Slots = (OwnedSemaphorePermit, OwnedSemaphorePermit);

async fn connection(stream: UnixStream, state: Arc<RunState>) {
    let (read, mut write) = stream.into_split();
    let mut lines = FramedRead::new(read, LinesCodec::new_with_max_length(MAX_LINE));
    // Every answer in this channel holds its slots, so it never holds more than the
    // connection's in-flight bound.
    let (tx, mut rx) = mpsc::channel::<(String, Slots)>(MAX_IN_FLIGHT_PER_CONNECTION + 1);
    let writer = tokio::spawn(async move {
        while let Some((mut line, slots)) = rx.recv().await {
            line.push('\n');
            let written = write.write_all(line.as_bytes()).await;
            drop(slots);
            if written.is_err() {
                break;
            }
        }
    });
    let connection_slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION));
    let mut requests = JoinSet::new();
    loop {
        while requests.try_join_next().is_some() {}
        // Take both slots before reading the next line: at a bound the program's writes
        // block in its socket instead of piling up here.
        let slots = loop {
            tokio::select! {
                slots = take_slots(&connection_slots, &state.in_flight) => break slots,
                Some(_) = requests.join_next(), if !requests.is_empty() => {}
            }
        };
        let Some(slots) = slots else { break };
        // Reap finished requests while waiting for the next line (FramedRead keeps a
        // partial line across the select's cancellations).
        let line = loop {
            tokio::select! {
                line = lines.next() => break line,
                Some(_) = requests.join_next(), if !requests.is_empty() => {}
            }
        };
        let Some(line) = line else { break };
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                let answer = json!({"id": null, "ok": false, "error": {"type": "BadRequest", "message": format!("unreadable request: {e}")}});
                let _ = tx.send((answer.to_string(), slots)).await;
                break;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let state = state.clone();
        let tx = tx.clone();
        requests.spawn(async move {
            let answer = handle(&line, &state).await;
            let _ = tx.send((answer, slots)).await;
        });
    }
    while requests.join_next().await.is_some() {}
    drop(tx);
    let _ = writer.await;
}

/// A slot of the connection, then one of the run (always in this order). `None` once a
/// semaphore is closed (never, today).
async fn take_slots(connection: &Arc<Semaphore>, run: &Arc<Semaphore>) -> Option<Slots> {
    let mine = connection.clone().acquire_owned().await.ok()?;
    let ours = run.clone().acquire_owned().await.ok()?;
    Some((mine, ours))
}

async fn handle(line: &str, state: &RunState) -> String {
    let req: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => {
            return json!({"id": null, "ok": false, "error": {"type": "BadRequest", "message": format!("request is not valid: {e}")}}).to_string();
        }
    };
    let result = match req.op.as_str() {
        "call" => call(&req, state).await,
        "list_servers" => match state.count_listing() {
            Ok(()) => Ok(list_servers(state).await),
            Err(r) => Err(r),
        },
        "list_tools" => match state.count_listing() {
            Ok(()) => list_tools(&req, state).await,
            Err(r) => Err(r),
        },
        other => Err(Refusal::new(
            "BadRequest",
            format!("op: unknown operation {other:?}; use call, list_servers or list_tools"),
        )),
    };
    let answer = match result {
        Ok(v) => json!({"id": req.id, "ok": true, "result": v}),
        Err(r) => {
            json!({"id": req.id, "ok": false, "error": {"type": r.kind, "message": r.message}})
        }
    };
    state.broker.scrub(&answer.to_string())
}

async fn list_servers(state: &RunState) -> Value {
    let servers = state.broker.servers().await;
    Value::Array(
        servers
            .into_iter()
            .filter(|s| state.policy.touches(&s.name))
            .map(|s| json!({"name": s.name, "tags": s.tags, "status": s.status, "error": s.error}))
            .collect(),
    )
}

async fn list_tools(req: &Request, state: &RunState) -> Result<Value, Refusal> {
    let Some(server) = req.server.as_deref() else {
        return Err(Refusal::new("BadRequest", "server: missing"));
    };
    let tools = state
        .broker
        .tools(Some(server), None)
        .await
        .map_err(|e| Refusal::new("ToolFailed", e.to_string()))?;
    Ok(Value::Array(
        tools
            .into_iter()
            .filter(|t| state.policy.allows(server, &t.name))
            .map(|t| json!({"name": t.name, "description": t.description}))
            .collect(),
    ))
}

impl RunState {
    /// A listing counts against `max_calls` like a call (each one asks a server): past
    /// the limit it is refused.
    fn count_listing(&self) -> Result<(), Refusal> {
        let max = self.policy.limits.max_calls;
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 > max {
            return Err(Refusal::new(
                "CallLimitExceeded",
                format!(
                    "call limit reached: this run may make {max} tool calls and listings (max_calls)"
                ),
            ));
        }
        Ok(())
    }

    fn record(&self, r: ToolCallRecord) {
        if let Ok(mut records) = self.records.lock() {
            records.push(r);
        }
    }
}

async fn call(req: &Request, state: &RunState) -> Result<Value, Refusal> {
    let started = Instant::now();
    let (Some(server), Some(tool)) = (req.server.as_deref(), req.tool.as_deref()) else {
        return Err(Refusal::new("BadRequest", "server and tool are required"));
    };
    let args = match &req.args {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m.clone()),
        Some(_) => return Err(Refusal::new("BadRequest", "args: must be an object")),
    };
    let finish = |outcome: CallOutcome, error: Option<String>, artifact_id: Option<String>| {
        let error = error.map(|e| state.broker.scrub(&e));
        state.record(ToolCallRecord {
            server: server.to_string(),
            tool: tool.to_string(),
            duration_ms: started.elapsed().as_millis() as u64,
            outcome,
            error,
            artifact_id,
        });
    };
    let limits = state.policy.limits;
    let n = state.calls.fetch_add(1, Ordering::SeqCst) + 1;
    if n > limits.max_calls {
        let m = format!(
            "call limit reached: this run may make {} tool calls (max_calls)",
            limits.max_calls
        );
        finish(CallOutcome::CallLimit, Some(m.clone()), None);
        return Err(Refusal::new("CallLimitExceeded", m));
    }
    let exposed = state
        .broker
        .target(server)
        .map(|t| t.exposes(tool))
        .unwrap_or(true);
    if !state.policy.allows(server, tool) || !exposed {
        let m = format!(
            "{server}/{tool} is not allowed in this run (allowed: {})",
            state.policy.allow.join(", ")
        );
        finish(CallOutcome::NotAllowed, Some(m.clone()), None);
        return Err(Refusal::new("ToolNotAllowed", m));
    }
    let target = match state.broker.target(server) {
        Ok(t) => t.clone(),
        Err(e) => {
            finish(CallOutcome::Failed, Some(e.to_string()), None);
            return Err(Refusal::new("ToolFailed", e.to_string()));
        }
    };
    let wall = Duration::from_millis(limits.wall_clock_ms);
    let started = *state.started.lock().unwrap_or_else(|p| p.into_inner());
    let left = wall.saturating_sub(started.elapsed());
    if left.is_zero() {
        let m = format!(
            "the run's tool-call wall clock ({} ms, wall_clock_ms) is spent",
            limits.wall_clock_ms
        );
        finish(CallOutcome::Timeout, Some(m.clone()), None);
        return Err(Refusal::new("ToolTimeout", m));
    }
    let per_call = Duration::from_millis(limits.per_call_ms);
    let deadline = per_call.min(left);
    let result = target.call(tool, args, deadline).await;
    let result: CallToolResult = match result {
        Ok(r) => r,
        Err(CallError::Timeout(_)) => {
            let m = if deadline < per_call {
                format!(
                    "{server}/{tool}: no answer before the run's tool-call wall clock ({} ms) ran out; the call was cancelled",
                    limits.wall_clock_ms
                )
            } else {
                format!(
                    "{server}/{tool}: no answer within {} ms (per_call_ms); the call was cancelled",
                    limits.per_call_ms
                )
            };
            finish(CallOutcome::Timeout, Some(m.clone()), None);
            return Err(Refusal::new("ToolTimeout", m));
        }
        Err(e) => {
            let m = format!("{server}/{tool}: {e}");
            finish(CallOutcome::Failed, Some(m.clone()), None);
            return Err(Refusal::new("ToolFailed", m));
        }
    };
    let mut text = String::new();
    let mut content = Vec::new();
    for block in &result.content {
        if let Some(t) = block.as_text() {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&t.text);
        }
        content.push(serde_json::to_value(block).unwrap_or(Value::Null));
    }
    let max = (limits.max_output_kb as usize).saturating_mul(1024);
    if result.is_error == Some(true) {
        let mut m = format!("{server}/{tool} failed: {text}");
        if m.len() > max {
            m = format!("{}... [trimmed]", truncate(&m, max));
        }
        finish(CallOutcome::ToolError, Some(truncate(&m, 500)), None);
        return Err(Refusal::new("ToolFailed", m));
    }
    let value = json!({
        "structured": result.structured_content,
        "text": text,
        "content": content,
    });
    let full = state.broker.scrub(&value.to_string());
    if full.len() <= max {
        finish(CallOutcome::Ok, None, None);
        return Ok(serde_json::from_str(&full).unwrap_or(value));
    }
    let hint = format!("{server}-{tool}-{n}");
    let sink = state.sink.clone();
    let bytes = full.into_bytes();
    let size = bytes.len();
    let stored = tokio::task::spawn_blocking(move || sink.store(&hint, &bytes))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    match stored {
        Ok(id) => {
            let source = if text.is_empty() {
                result
                    .structured_content
                    .as_ref()
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            } else {
                text
            };
            let preview = state
                .broker
                .scrub(&truncate(&source, PREVIEW_CHARS.min(max.max(64))));
            finish(CallOutcome::Ok, None, Some(id.clone()));
            Ok(json!({
                "truncated": true,
                "artifact_id": id,
                "size_bytes": size,
                "max_output_kb": limits.max_output_kb,
                "preview": preview,
            }))
        }
        Err(e) => {
            let m = format!(
                "{server}/{tool}: the result ({size} bytes) is over max_output_kb and could not be stored: {e}"
            );
            finish(CallOutcome::Failed, Some(m.clone()), None);
            Err(Refusal::new("ToolFailed", m))
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_patterns_are_server_slash_tool() {
        let l = CallLimits::default();
        assert!(CallPolicy::new(vec![], l).is_err());
        let e = CallPolicy::new(vec!["ok/*".into(), "echo".into()], l).expect_err("no slash");
        assert!(e.starts_with("allow_tools[1]"), "{e}");
        let p = CallPolicy::new(vec!["everything/get-*".into(), "mem*/read_graph".into()], l)
            .expect("valid");
        assert!(p.allows("everything", "get-sum"));
        assert!(!p.allows("everything", "echo"));
        assert!(p.allows("memory", "read_graph"));
        assert!(p.touches("memory") && p.touches("everything") && !p.touches("fs"));
    }

    /// A private shared state directory (as another part of the server may create it) is
    /// made traversable; a private ancestor further up is a clear error. Root only.
    #[test]
    fn the_runtime_dir_is_reachable_by_the_sandbox_user_or_an_error() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("GEARBOX_SANDBOX_REQUIRED").is_none(),
                "GEARBOX_SANDBOX_REQUIRED is set but this test needs root"
            );
            eprintln!("SKIPPED: the check applies to a root server only");
            return;
        }
        let base = std::env::temp_dir().join(format!("gearbox-reach-{}", std::process::id()));
        let shared = base.join("state");
        std::fs::create_dir_all(shared.join("broker")).expect("mkdir");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        reachable_by_sandbox(&shared.join("broker")).expect("healed");
        let mode = std::fs::metadata(&shared)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o711);

        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let e = reachable_by_sandbox(&shared.join("broker")).expect_err("private ancestor");
        assert!(e.to_string().contains("cannot be traversed"), "{e}");
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    /// A channel of a broker without targets, its runtime directory under a fresh
    /// directory any user can traverse.
    async fn bare_channel(max_calls: u32) -> (RunChannel, PathBuf) {
        // Short: a socket's path must fit in sun_path (108 bytes).
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let base = std::env::temp_dir().join(format!("gbc-{}", &unique[..12]));
        std::fs::create_dir_all(&base).expect("mkdir");
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let config = crate::BrokerConfig {
            runtime_dir: Some(base.join("rt")),
            ..crate::BrokerConfig::default()
        };
        let broker = Broker::new(&[], config).expect("an empty broker");
        let limits = CallLimits {
            max_calls,
            ..CallLimits::default()
        };
        let policy = CallPolicy::new(vec!["everything/*".into()], limits).expect("policy");
        let channel = broker.open_run(policy).await.expect("open");
        (channel, base)
    }

    /// A program that writes requests with large answers and never reads them: the broker
    /// stops reading (the program's writes block) after a bounded amount, instead of
    /// taking every line in and holding its answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_program_that_never_reads_answers_is_not_read_either() {
        use std::io::Write;
        let (channel, base) = bare_channel(1_000_000).await;
        let socket = channel.socket().to_path_buf();
        // Each request names an unknown operation of 64 KiB, which the answer repeats.
        let consumed = tokio::task::spawn_blocking(move || {
            let mut stream = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
            stream.set_nonblocking(true).expect("nonblocking");
            let op = "x".repeat(64 * 1024);
            let mut written = 0usize;
            let mut stalled_since: Option<Instant> = None;
            let mut id = 0u64;
            let mut pending: Vec<u8> = Vec::new();
            // Up to 256 MiB, or until no byte has gone in for two seconds.
            while written < 256 << 20 {
                if pending.is_empty() {
                    id += 1;
                    pending = format!("{{\"id\":{id},\"op\":\"{op}\"}}\n").into_bytes();
                }
                match stream.write(&pending) {
                    Ok(n) => {
                        written += n;
                        pending.drain(..n);
                        stalled_since = None;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        let since = *stalled_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > Duration::from_secs(2) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("writing requests: {e}"),
                }
            }
            written
        })
        .await
        .expect("writer");
        // Bound: the socket buffers both ways, the requests in flight (8) and one partial
        // line (at most 1 MiB), with room to spare; without bounds all 256 MiB go in.
        assert!(
            consumed < 16 << 20,
            "the broker took {consumed} bytes of requests from a program that reads no answers"
        );
        assert!(
            channel.state.in_flight.available_permits()
                >= MAX_IN_FLIGHT_PER_RUN - MAX_IN_FLIGHT_PER_CONNECTION,
            "one connection holds at most its own share of the run's slots"
        );
        drop(channel);
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    /// A listing counts against max_calls like a call.
    #[tokio::test]
    async fn listings_count_against_max_calls() {
        use tokio::io::{AsyncBufReadExt, BufReader};
        let (channel, base) = bare_channel(2).await;
        let stream = UnixStream::connect(channel.socket())
            .await
            .expect("connect");
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let mut kinds = Vec::new();
        for (id, req) in [
            r#"{"id":1,"op":"list_servers"}"#,
            r#"{"id":2,"op":"list_tools","server":"everything"}"#,
            r#"{"id":3,"op":"list_servers"}"#,
            r#"{"id":4,"op":"call","server":"everything","tool":"echo"}"#,
        ]
        .iter()
        .enumerate()
        {
            write
                .write_all(format!("{req}\n").as_bytes())
                .await
                .expect("write");
            let line = lines.next_line().await.expect("read").expect("an answer");
            let v: Value = serde_json::from_str(&line).expect("json");
            assert_eq!(v["id"], json!(id + 1), "{line}");
            kinds.push(v["error"]["type"].as_str().unwrap_or("ok").to_string());
        }
        // The first listing succeeds; the second asks a server that is not configured (it
        // still counts); the third and the call are over the limit.
        assert_eq!(
            kinds,
            ["ok", "ToolFailed", "CallLimitExceeded", "CallLimitExceeded"],
            "answers in order"
        );
        drop(channel);
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    /// Who may connect, as root: the run's directory and socket admit the sandbox's group
    /// only, and a peer that passes the file modes but is neither the server's uid nor the
    /// sandbox's is closed unread (`SO_PEERCRED`). Each case is a real process of its own
    /// uid and gid.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_server_and_the_sandbox_user_reach_a_runs_socket() {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::process::CommandExt;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var_os("GEARBOX_SANDBOX_REQUIRED").is_none(),
                "GEARBOX_SANDBOX_REQUIRED is set but this test needs root"
            );
            eprintln!("skipped: needs root to act as other users");
            return;
        }
        let (channel, base) = bare_channel(100).await;
        let dir = std::fs::metadata(channel.dir()).expect("stat dir");
        assert_eq!(dir.mode() & 0o7777, 0o710);
        assert_eq!((dir.uid(), dir.gid()), (0, gearbox_core::SANDBOX_HOST_ID));
        let sock = std::fs::metadata(channel.socket()).expect("stat socket");
        assert_eq!(sock.mode() & 0o777, 0o660);
        assert_eq!(sock.gid(), gearbox_core::SANDBOX_HOST_ID);

        let socket = channel.socket().to_path_buf();
        let client = |uid: u32, gid: u32| {
            let socket = socket.clone();
            async move {
                let out = tokio::task::spawn_blocking(move || {
                    // Debian's interpreter: one under root's home is not reachable by
                    // another uid.
                    std::process::Command::new("/usr/bin/python3")
                        .arg("-c")
                        .arg(
                            "import socket,sys\n\
                             s=socket.socket(socket.AF_UNIX)\n\
                             try:\n s.connect(sys.argv[1])\n\
                             except OSError as e:\n print('refused', e.errno); sys.exit()\n\
                             try:\n\
                             \x20s.sendall(b'{\"id\":7,\"op\":\"list_servers\"}\\n')\n\
                             \x20s.settimeout(10)\n\
                             \x20r=s.recv(4096)\n\
                             except OSError:\n r=b''\n\
                             print('answer', r.decode().strip() or 'none')\n",
                        )
                        .arg(&socket)
                        .uid(uid)
                        .gid(gid)
                        .output()
                        .expect("python3")
                })
                .await
                .expect("client");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8_lossy(&out.stdout).trim().to_string()
            }
        };
        let nobody = gearbox_core::SANDBOX_HOST_ID;
        let sandbox = client(nobody, nobody).await;
        assert!(
            sandbox.starts_with("answer {\"id\":7,\"ok\":true"),
            "{sandbox}"
        );
        let stranger = client(4242, 4242).await;
        assert_eq!(
            stranger,
            format!("refused {}", libc::EACCES),
            "file modes keep out another user"
        );
        let in_group = client(4242, nobody).await;
        assert_eq!(
            in_group, "answer none",
            "a peer of another uid is closed unread"
        );
        drop(channel);
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    #[test]
    fn truncate_keeps_characters_whole() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}

/// Property tests of the line protocol, whose requests come from the sandboxed code:
/// arbitrary lines never panic the handler and always get one JSON answer; a request that
/// parses gets its own `id` back; a call outside the allowlist is refused as
/// `ToolNotAllowed` and recorded. `PROPTEST_CASES` raises the case count
/// (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    /// Refuses to store: a broker without targets never produces a result to store.
    struct NoSink;

    impl ArtifactSink for NoSink {
        fn store(&self, _hint: &str, _bytes: &[u8]) -> Result<String, String> {
            Err("no sink in this test".into())
        }
    }

    const ALLOW: [&str; 3] = ["everything/get-*", "mem*/read_graph", "fs/?at"];

    fn state(max_calls: u32) -> RunState {
        let broker = Broker::new(&[], crate::BrokerConfig::default()).expect("an empty broker");
        let limits = CallLimits {
            max_calls,
            ..CallLimits::default()
        };
        RunState {
            broker,
            policy: CallPolicy::new(ALLOW.iter().map(|s| s.to_string()).collect(), limits)
                .expect("valid policy"),
            started: Mutex::new(Instant::now()),
            calls: AtomicU32::new(0),
            records: Mutex::new(Vec::new()),
            sink: Arc::new(NoSink),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_RUN)),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "everything",
                "get-sum",
                "get-",
                "memory",
                "mem",
                "read_graph",
                "fs",
                "cat",
                "at",
                "echo",
                "",
                "*",
                "everything/get-x",
                "\0",
            ])
            .prop_map(String::from),
            "[a-z*?/_-]{0,10}",
            any::<String>(),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            // No floats: an `id` must compare equal after a trip through text.
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A request as the SDKs write it, every field optional, values sometimes mistyped.
    fn request() -> impl Strategy<Value = Map> {
        (
            json_value(),
            prop_oneof![
                prop::sample::select(vec!["call", "list_servers", "list_tools"])
                    .prop_map(|s| json!(s)),
                json_value(),
            ],
            proptest::option::of(name()),
            proptest::option::of(name()),
            proptest::option::of(json_value()),
        )
            .prop_map(|(id, op, server, tool, args)| {
                let mut m = Map::new();
                m.insert("id".into(), id);
                m.insert("op".into(), op);
                if let Some(s) = server {
                    m.insert("server".into(), json!(s));
                }
                if let Some(t) = tool {
                    m.insert("tool".into(), json!(t));
                }
                if let Some(a) = args {
                    m.insert("args".into(), a);
                }
                m
            })
    }

    type Map = serde_json::Map<String, Value>;

    /// One answer: a JSON object with a boolean `ok`, an `id`, and on failure a known error
    /// type.
    fn check_answer(answer: &str) -> Value {
        let v: Value = serde_json::from_str(answer).expect("the answer is JSON");
        assert!(v["ok"].is_boolean(), "{answer}");
        assert!(v.get("id").is_some(), "{answer}");
        if v["ok"] == json!(false) {
            let kind = v["error"]["type"].as_str().unwrap_or("");
            assert!(
                [
                    "ToolNotAllowed",
                    "ToolTimeout",
                    "CallLimitExceeded",
                    "ToolFailed",
                    "BadRequest"
                ]
                .contains(&kind),
                "{answer}"
            );
            assert!(v["error"]["message"].is_string(), "{answer}");
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(256)))]

        #[test]
        fn arbitrary_lines_get_one_answer(
            line in prop_oneof![
                any::<String>(),
                json_value().prop_map(|v| v.to_string()),
                (any::<f64>(), any::<String>()).prop_map(|(f, op)| {
                    format!("{{\"id\": {f}, \"op\": {}}}", Value::String(op))
                }),
                proptest::collection::vec(any::<u8>(), 0..64)
                    .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
            ],
        ) {
            let state = state(1_000);
            let answer = runtime().block_on(handle(&line, &state));
            check_answer(&answer);
        }

        #[test]
        fn requests_get_their_id_back_and_the_allowlist_holds(req in request()) {
            let state = state(1_000);
            let line = Value::Object(req.clone()).to_string();
            let answer = check_answer(&runtime().block_on(handle(&line, &state)));
            // Does the request parse as the protocol says?
            let parsed = serde_json::from_value::<Request>(Value::Object(req.clone())).ok();
            let Some(parsed) = parsed else {
                prop_assert_eq!(&answer["id"], &Value::Null);
                prop_assert_eq!(&answer["error"]["type"], "BadRequest");
                return Ok(());
            };
            prop_assert_eq!(&answer["id"], &parsed.id);
            let records = state.records.lock().expect("records").clone();
            match parsed.op.as_str() {
                "call" => {
                    // No target exists: a call never succeeds.
                    prop_assert_eq!(&answer["ok"], false);
                    let (Some(server), Some(tool)) = (&parsed.server, &parsed.tool) else {
                        prop_assert_eq!(&answer["error"]["type"], "BadRequest");
                        return Ok(());
                    };
                    if !matches!(parsed.args, None | Some(Value::Null) | Some(Value::Object(_))) {
                        prop_assert_eq!(&answer["error"]["type"], "BadRequest");
                        return Ok(());
                    }
                    let allowed = ALLOW
                        .iter()
                        .any(|p| glob::matches(p, &format!("{server}/{tool}")));
                    let expected = if allowed { "ToolFailed" } else { "ToolNotAllowed" };
                    prop_assert_eq!(&answer["error"]["type"], expected);
                    prop_assert_eq!(records.len(), 1);
                    prop_assert_eq!(&records[0].server, server);
                    prop_assert_eq!(&records[0].tool, tool);
                    let outcome = if allowed { CallOutcome::Failed } else { CallOutcome::NotAllowed };
                    prop_assert_eq!(records[0].outcome, outcome);
                }
                "list_servers" => {
                    prop_assert_eq!(&answer["ok"], true);
                    prop_assert_eq!(&answer["result"], &json!([]));
                    prop_assert!(records.is_empty());
                }
                "list_tools" => {
                    prop_assert_eq!(&answer["ok"], false);
                    prop_assert!(records.is_empty());
                }
                _ => {
                    prop_assert_eq!(&answer["error"]["type"], "BadRequest");
                    prop_assert!(records.is_empty());
                }
            }
        }

        #[test]
        fn calls_past_max_calls_are_refused(
            max_calls in 0u32..4,
            calls in proptest::collection::vec((name(), name()), 1..8),
        ) {
            let state = state(max_calls);
            let rt = runtime();
            for (i, (server, tool)) in calls.iter().enumerate() {
                let line = json!({"id": i, "op": "call", "server": server, "tool": tool}).to_string();
                let answer = check_answer(&rt.block_on(handle(&line, &state)));
                prop_assert_eq!(&answer["id"], &json!(i));
                if i as u32 >= max_calls {
                    prop_assert_eq!(&answer["error"]["type"], "CallLimitExceeded");
                } else {
                    prop_assert_ne!(&answer["error"]["type"], "CallLimitExceeded");
                }
            }
            prop_assert_eq!(state.records.lock().expect("records").len(), calls.len());
        }

        #[test]
        fn truncate_keeps_a_maximal_prefix_of_whole_characters(s in any::<String>(), max in 0usize..64) {
            let t = truncate(&s, max);
            prop_assert!(s.starts_with(&t));
            prop_assert!(t.len() <= max || t == s);
            // Nothing more fits: the next character would pass `max`.
            if t.len() < s.len() {
                let next = s[t.len()..].chars().next().map_or(0, char::len_utf8);
                prop_assert!(t.len() + next > max);
            }
        }
    }
}
