//! [`GearboxServer`]: the one `ServerHandler`, whatever the transport.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gearbox_core::{BackendKind, ExecRequest, Outcome};
use gearbox_engine::Engine;
use gearbox_engine::config::ToolProfile;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    ResourceContents, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::ServeOptions;
use crate::args::parse;
use crate::audit::{self, AuditLog, Record};
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::resources;
use crate::tools::{self, Prepared, ToolKind};
use crate::{Caller, TransportName};

const INSTRUCTIONS: &str = "gearbox runs code in fresh, isolated sandboxes: no network, \
a private workspace (/work) and /tmp, time and memory limits, nothing kept between calls. \
Read gearbox://env for the languages, versions and limits of this host.";

/// The MCP handler: tools of the configured profiles and the resources, over one engine.
/// Cheap to clone; clones share the engine and caches.
#[derive(Clone)]
pub struct GearboxServer {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Arc<Engine>,
    profiles: Vec<ToolProfile>,
    tools: Vec<(ToolKind, Tool)>,
    progress_interval: Duration,
    /// `Engine::languages(true)`, computed on first read of the environment.
    languages: OnceCell<Value>,
    limiter: Arc<Limiter>,
    metrics: Arc<Metrics>,
    audit: Option<Arc<AuditLog>>,
    /// The downstream servers of `[[targets]]` (code mode), or why they are unusable.
    broker: Result<Option<gearbox_broker::Broker>, String>,
    /// Transport and caller when the request does not say (stdio).
    transport: &'static str,
    caller: String,
}

/// Who asked, over what, when: what the audit line and metrics need of one call.
struct CallInfo {
    caller: String,
    transport: String,
    tool: String,
    arrived: Instant,
}

fn fill_request(r: &mut Record, req: &ExecRequest, backend: &str, hash_only: bool) {
    r.language = Some(req.language.clone());
    r.backend = Some(backend.to_string());
    r.code_sha256 = Some(audit::sha256_hex(req.code.as_bytes()));
    if !hash_only {
        r.code = Some(req.code.clone());
    }
    r.code_bytes = req.code.len();
    r.files = req.files.iter().map(|f| f.filename.clone()).collect();
    r.entrypoint = req.entrypoint.clone();
    r.stdin_bytes = req.stdin.len();
    r.args = req.args.len();
    r.env = req.env.keys().cloned().collect();
}

fn fill_outcome(r: &mut Record, o: &Outcome) {
    r.status = o.status.to_string();
    r.exit_code = o.exit_code;
    r.signal = o.signal;
    r.reason = o.reason.clone();
    r.durations.run_ms = o.duration_ms;
    r.durations.setup_us = o.usage.setup_us;
    r.cpu_time_ms = o.usage.cpu_time_ms;
    r.peak_memory_kb = o.usage.peak_memory_kb;
    r.stdout_bytes = o.stdout.len();
    r.stderr_bytes = o.stderr.len();
    if r.language.is_none() && !o.language.is_empty() {
        r.language = Some(o.language.clone());
    }
    if r.backend.is_none() {
        r.backend = Some(o.backend.clone());
    }
}

/// The `mcp_execution_errors_total` reason of an outcome that is not ok.
fn error_reason(o: &Outcome) -> &'static str {
    use gearbox_core::Status;
    match o.status {
        Status::Ok => "",
        Status::Timeout => "timeout",
        Status::Killed => "killed",
        Status::Denied | Status::PendingApproval => "denied",
        Status::Error if o.exit_code.is_some() || o.signal.is_some() => "program",
        Status::Error => "sandbox",
    }
}

impl GearboxServer {
    pub fn new(engine: Arc<Engine>, opts: ServeOptions) -> GearboxServer {
        let mut profiles = if opts.profiles.is_empty() {
            engine.config().profiles.clone()
        } else {
            opts.profiles
        };
        if profiles.is_empty() {
            profiles.push(ToolProfile::Default);
        }
        profiles.dedup();
        let tools = tools::tools_for(&profiles);
        let session_tools: Vec<Tool> = tools.iter().map(|(_, t)| t.clone()).collect();
        crate::sessions::start(&engine, &session_tools);
        let c = &engine.config().concurrency;
        let limiter = Arc::new(Limiter::new(c.running(), c.max_queued));
        let broker = crate::broker::from_config(engine.config());
        GearboxServer {
            inner: Arc::new(Inner {
                engine,
                profiles,
                tools,
                progress_interval: opts.progress_interval.max(Duration::from_millis(50)),
                languages: OnceCell::new(),
                limiter,
                metrics: Arc::new(Metrics::new()),
                audit: opts.audit,
                broker,
                transport: opts.transport,
                caller: opts.caller,
            }),
        }
    }

    /// A tool call without the sessions' interception, as a named future type: the
    /// sessions module calls it from inside `call_tool`, which an opaque type could not
    /// express.
    pub(crate) fn call_direct(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<CallToolResponse, McpError>> + Send + '_>,
    > {
        Box::pin(async move {
            let Some(kind) = self.kind_of(&request.name) else {
                return Err(McpError::invalid_params(
                    format!(
                        "unknown tool {:?}; this server has: {}",
                        request.name,
                        self.tool_names().join(", ")
                    ),
                    None,
                ));
            };
            if let ToolKind::Broker(tool) = kind {
                let args = request.arguments.as_ref();
                return Ok(crate::broker::discovery(self.broker(), tool, args)
                    .await
                    .into());
            }
            if kind == ToolKind::ExecuteCode {
                let call = async { self.call(kind, &request, &ctx).await.map(Into::into) };
                let max_timeout_ms = self.inner.engine.config().limits.timeout_ms;
                return crate::broker::with_tools(self.broker(), max_timeout_ms, &request, call)
                    .await;
            }
            self.call(kind, &request, &ctx).await.map(Into::into)
        })
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }

    /// The run budget every call of every transport shares.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.inner.limiter
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub fn audit(&self) -> Option<&Arc<AuditLog>> {
        self.inner.audit.as_ref()
    }

    fn call_info(&self, tool: &str, ctx: &RequestContext<RoleServer>) -> CallInfo {
        let parts = ctx.extensions.get::<axum::http::request::Parts>();
        let caller = parts
            .and_then(|p| p.extensions.get::<Caller>())
            .map(|c| c.0.clone())
            .or_else(|| ctx.extensions.get::<Caller>().map(|c| c.0.clone()))
            .unwrap_or_else(|| self.inner.caller.clone());
        let transport = parts
            .and_then(|p| p.extensions.get::<TransportName>())
            .or_else(|| ctx.extensions.get::<TransportName>())
            .map_or(self.inner.transport, |t| t.0);
        CallInfo {
            caller,
            transport: transport.to_string(),
            tool: tool.to_string(),
            arrived: Instant::now(),
        }
    }

    /// Append `record`; false when the audit log is configured and the line did not reach
    /// the disk.
    async fn record(&self, mut record: Record, info: &CallInfo) -> bool {
        record.durations.total_ms = info.arrived.elapsed().as_millis() as u64;
        match &self.inner.audit {
            Some(log) => log.write(&record).await.is_ok(),
            None => true,
        }
    }

    /// A call refused before anything ran: audit line and metrics.
    async fn refused(
        &self,
        info: &CallInfo,
        req: Option<&ExecRequest>,
        o: &Outcome,
        status: &str,
        reason: &str,
    ) {
        let m = &self.inner.metrics;
        let language = req.map_or(o.language.as_str(), |r| r.language.as_str());
        m.request(
            if language.is_empty() {
                "unknown"
            } else {
                language
            },
            status,
        );
        m.error(reason);
        let mut r = Record::new("refusal", &info.caller, &info.transport, &info.tool);
        let hash_only = self.inner.audit.as_ref().is_some_and(|a| a.hash_only());
        if let Some(req) = req {
            fill_request(&mut r, req, &o.backend, hash_only);
        }
        fill_outcome(&mut r, o);
        r.status = status.to_string();
        self.record(r, info).await;
    }

    /// The downstream servers, when `[[targets]]` configures some and they are valid.
    fn broker(&self) -> Option<&gearbox_broker::Broker> {
        self.inner.broker.as_ref().ok().and_then(Option::as_ref)
    }

    /// An error when `[[targets]]` is invalid (a `${VAR}` not set, a bad name): serving
    /// must not start.
    pub fn broker_startup(&self) -> anyhow::Result<()> {
        match &self.inner.broker {
            Ok(_) => Ok(()),
            Err(e) => Err(anyhow::anyhow!("{e}")),
        }
    }

    /// Names of the tools this server exposes, in order.
    pub fn tool_names(&self) -> Vec<String> {
        self.inner
            .tools
            .iter()
            .map(|(_, t)| t.name.to_string())
            .collect()
    }

    /// The tool definitions `tools/list` returns.
    pub fn tools(&self) -> Vec<Tool> {
        self.inner.tools.iter().map(|(_, t)| t.clone()).collect()
    }

    fn kind_of(&self, name: &str) -> Option<ToolKind> {
        self.inner
            .tools
            .iter()
            .find(|(_, t)| t.name == name)
            .map(|(k, _)| *k)
    }

    async fn languages(&self) -> Value {
        self.inner
            .languages
            .get_or_init(|| async {
                let engine = self.inner.engine.clone();
                tokio::task::spawn_blocking(move || {
                    serde_json::to_value(engine.languages(true)).unwrap_or_default()
                })
                .await
                .unwrap_or_default()
            })
            .await
            .clone()
    }

    /// Run `req`, reporting progress while it goes when the client asked for it. `None` when
    /// the client cancelled the request or went away: the engine future is dropped, which
    /// kills the sandbox.
    async fn run(
        &self,
        req: ExecRequest,
        backend: Option<BackendKind>,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<Outcome> {
        let mut req = req;
        crate::broker::apply(&mut req);
        let language = req.language.clone();
        let timeout_ms = req
            .limits
            .timeout_ms
            .unwrap_or(self.inner.engine.config().limits.timeout_ms);
        let token = ctx.meta.get_progress_token();
        let started = Instant::now();
        let run = crate::sessions::execute(&self.inner.engine, req, backend);
        tokio::pin!(run);
        let period = self.inner.progress_interval;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                outcome = &mut run => return Some(outcome),
                () = ctx.ct.cancelled() => {
                    tracing::info!(id = %ctx.id, %language, "request cancelled; killing its run");
                    return None;
                }
                _ = ticks.tick(), if token.is_some() => {
                    let Some(token) = token.clone() else { continue };
                    let elapsed = started.elapsed().as_millis() as f64;
                    let param = ProgressNotificationParam::new(token, elapsed)
                        .with_total(timeout_ms as f64)
                        .with_message(format!(
                            "{language} running for {:.1} s (limit {:.1} s)",
                            elapsed / 1000.0,
                            timeout_ms as f64 / 1000.0
                        ));
                    let peer = ctx.peer.clone();
                    tokio::spawn(async move {
                        if let Err(e) = peer.notify_progress(param).await {
                            tracing::debug!(error = %e, "progress notification not sent");
                        }
                    });
                }
            }
        }
    }

    /// The audit check, a run slot, the run, the audit line and the metrics. `None` when the
    /// client cancelled.
    async fn guarded_run(
        &self,
        req: ExecRequest,
        backend: Option<BackendKind>,
        info: &CallInfo,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<Outcome> {
        let backend_name = backend
            .unwrap_or(self.inner.engine.config().backend)
            .to_string();
        if let Some(log) = &self.inner.audit
            && let Err(e) = log.ready().await
        {
            let o = Outcome::failed_to_start(
                &req.language,
                &backend_name,
                format!("{e}; executions are refused until the audit log can be written"),
            );
            tracing::error!(error = %e, "refusing a run: audit log not writable");
            self.refused(info, Some(&req), &o, "audit_unavailable", "audit")
                .await;
            return Some(o);
        }
        let slot = tokio::select! {
            slot = self.inner.limiter.acquire() => slot,
            () = ctx.ct.cancelled() => {
                self.inner.metrics.error("cancelled");
                return None;
            }
        };
        let queued_ms = info.arrived.elapsed().as_millis() as u64;
        let slot = match slot {
            Ok(s) => s,
            Err(refusal) => {
                let o = Outcome::failed_to_start(&req.language, &backend_name, refusal.to_string());
                self.refused(info, Some(&req), &o, "busy", "busy").await;
                return Some(o);
            }
        };
        let hash_only = self.inner.audit.as_ref().is_some_and(|a| a.hash_only());
        let mut record = Record::new("execution", &info.caller, &info.transport, &info.tool);
        fill_request(&mut record, &req, &backend_name, hash_only);
        record.durations.queued_ms = queued_ms;
        let started = Instant::now();
        let language = req.language.clone();
        let outcome = self.run(req, backend, ctx).await;
        drop(slot);
        let m = &self.inner.metrics;
        let Some(outcome) = outcome else {
            m.request(&language, "cancelled");
            m.error("cancelled");
            record.status = "cancelled".into();
            record.reason = Some("the client cancelled the call; its run was killed".into());
            self.record(record, info).await;
            return None;
        };
        m.request(&language, outcome.status.as_str());
        m.duration(started.elapsed().as_secs_f64());
        if let Some(us) = outcome.usage.setup_us {
            m.setup(us as f64 / 1e6);
        }
        if !outcome.is_ok() {
            m.error(error_reason(&outcome));
        }
        fill_outcome(&mut record, &outcome);
        if !self.record(record, info).await {
            m.error("audit");
        }
        Some(outcome)
    }

    async fn call(
        &self,
        kind: ToolKind,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let engine = &self.inner.engine;
        let args = request.arguments.as_ref();
        let prepared = match kind {
            ToolKind::ExecuteCode => parse(args).map(|a| tools::prepare_execute_code(engine, a)),
            ToolKind::RunJavascript => {
                parse(args).map(|a| tools::prepare_run_javascript(engine, a))
            }
            ToolKind::CodeExecPython => {
                parse(args).map(|a| tools::prepare_code_exec_python(engine, a))
            }
            ToolKind::SidecarExecute => {
                parse(args).map(|a| tools::prepare_sidecar_execute(engine, a))
            }
            ToolKind::ListPackages => {
                parse::<crate::args::NoArgs>(args).map(|_| tools::prepare_list_packages())
            }
            ToolKind::Session => Err("session tools are answered by the sessions module".into()),
            // Answered in call_direct, before this point.
            ToolKind::Broker(_) => Err("a discovery tool takes no run".into()),
        };
        let info = self.call_info(&request.name, ctx);
        let outcome = match prepared {
            Err(message) => {
                tracing::debug!(tool = %request.name, %message, "argument error");
                let o = Outcome::denied("", engine.config().backend.as_str(), message.clone());
                self.refused(&info, None, &o, "invalid_arguments", "arguments")
                    .await;
                return Ok(tools::argument_error(kind, engine, message));
            }
            Ok(Prepared::Refused(outcome)) => {
                self.refused(&info, None, &outcome, "denied", "denied")
                    .await;
                outcome
            }
            Ok(Prepared::Run {
                request: req,
                backend,
            }) => match self.guarded_run(req, backend, &info, ctx).await {
                Some(o) => o,
                None => {
                    return Err(McpError::internal_error(
                        "request cancelled; its run was killed",
                        None,
                    ));
                }
            },
        };
        tracing::debug!(
            tool = %request.name,
            status = %outcome.status,
            duration_ms = outcome.duration_ms,
            "tool call finished"
        );
        Ok(match kind {
            ToolKind::CodeExecPython => tools::heroku_result(&outcome),
            ToolKind::ListPackages => tools::packages_result(&self.inner.engine, &outcome),
            _ => tools::outcome_result(&outcome),
        })
    }
}

impl ServerHandler for GearboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(
            Implementation::new("gearbox", env!("CARGO_PKG_VERSION"))
                .with_title("gearbox code sandbox"),
        )
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner
            .tools
            .iter()
            .find(|(_, t)| t.name == name)
            .map(|(_, t)| t.clone())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(answer) = crate::sessions::intercept(self, &request, &ctx).await {
            return answer;
        }
        self.call_direct(request, ctx).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(resources::list(
            &self.inner.engine,
            &self.inner.profiles,
        )))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let mut templates = resources::templates();
        if self.inner.profiles.contains(&ToolProfile::Sessions) {
            templates.extend(crate::sessions::templates());
        }
        Ok(ListResourceTemplatesResult::with_all_items(templates))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = request.uri.as_str();
        let result = if uri == resources::ENV_URI || uri == resources::ENV_INFO_URI {
            let languages = self.languages().await;
            let doc = resources::env_document(&self.inner.engine, &self.inner.profiles, &languages);
            let contents = if uri == resources::ENV_URI {
                ResourceContents::text(serde_json::to_string_pretty(&doc).unwrap_or_default(), uri)
                    .with_mime_type("application/json")
            } else {
                ResourceContents::text(resources::env_text(&doc), uri)
            };
            ReadResourceResult::new(vec![contents])
        } else if crate::sessions::is_session_uri(uri)
            && self.inner.profiles.contains(&ToolProfile::Sessions)
        {
            crate::sessions::read_resource(&self.inner.engine, uri)?
        } else {
            resources::read_snippets(&self.inner.engine, uri)?
        };
        Ok(result.into())
    }
}
