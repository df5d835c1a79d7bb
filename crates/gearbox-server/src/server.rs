//! [`GearboxServer`]: the one `ServerHandler`, whatever the transport.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::BTreeSet;

use gearbox_core::{BackendKind, Capability, ExecRequest, Gear, Outcome};
use gearbox_engine::Engine;
use gearbox_engine::config::{ApprovalsConfig, ToolProfile};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitationSchema,
    Implementation, InputRequest, InputRequests, InputRequiredResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    RequestStateCodec, ResourceContents, SealOptions, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::ElicitationError;
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::ServeOptions;
use crate::approvals::{self, Approvals, LocalChannel, TakeError};
use crate::args::parse;
use crate::audit::{self, AuditLog, CallInfo, Record, fill_outcome, fill_policy, fill_request};
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::plan::RunPlan;
use crate::resources;
use crate::sessions::{RunReport, SessionRun};
use crate::tools::{self, Prepared, ToolKind};
use crate::{Caller, TransportName};
use gearbox_broker::ToolCallRecord;
use gearbox_engine::policy::{self, PolicyReport, Verdict};

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
    /// The server's safety gear; calls may lower it.
    gear: Gear,
    approvals_cfg: ApprovalsConfig,
    approvals: Arc<Approvals>,
    /// Seals the `requestState` of input-required results (stateless protocol): a key per
    /// process, so a state outlives neither the process nor its TTL.
    state_codec: RequestStateCodec,
    /// The local approval socket, removed when the server goes.
    _local: Option<LocalChannel>,
}

/// The answer a human gives through elicitation.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct ApprovalAnswer {
    /// Run it with what it asks for?
    approve: bool,
    /// Optional words for the agent (why not, what to change).
    reason: Option<String>,
}

rmcp::elicit_safe!(ApprovalAnswer);

/// The key of the approval question in an input-required result.
const APPROVAL_INPUT: &str = "approval";
/// Code up to this size (the program and its files) is analysed on the calling task.
const INLINE_ANALYSIS_BYTES: usize = 4 * 1024;

/// A call after the gear: run it (with what was granted), or answer without running.
#[allow(clippy::large_enum_variant, reason = "one per call, moved once")]
enum Gate {
    Run { plan: RunPlan, report: PolicyReport },
    Answer(CallToolResponse),
}

/// What a run left for the result: its outcome, the tool calls its code made, what happened
/// to its session's workspace.
struct Done {
    outcome: Outcome,
    tool_calls: Option<Vec<ToolCallRecord>>,
    session: Option<RunReport>,
}

/// What a call says about the gear: a lower gear, a resumed approval.
#[derive(Debug, Default)]
struct CallPolicy {
    gear: Option<Gear>,
    operation_id: Option<String>,
}

/// Give the run what the gear granted.
fn grant(req: &mut ExecRequest, caps: &BTreeSet<Capability>) {
    if !caps.contains(&Capability::Network) {
        req.network = gearbox_core::Network::Off;
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
        let engine_gear = engine.config().gear;
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
        let approvals_cfg = engine.config().approvals.clone();
        let approvals = Arc::new(Approvals::new(
            Duration::from_secs(approvals_cfg.ttl_secs.max(1)),
            opts.audit.clone(),
        ));
        let local = if opts.local_approvals {
            let dir = approvals_cfg.socket_dir();
            match approvals::serve_local(approvals.clone(), &dir) {
                Ok(ch) => Some(ch),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e,
                        "approval socket not available; `gearbox approve` cannot reach this server");
                    None
                }
            }
        } else {
            None
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            approvals.spawn_sweeper(Duration::from_secs(5));
        }
        let mut key = [0u8; 32];
        key.iter_mut()
            .zip(
                uuid::Uuid::new_v4()
                    .as_bytes()
                    .iter()
                    .chain(uuid::Uuid::new_v4().as_bytes()),
            )
            .for_each(|(k, r)| *k = *r);
        let state_codec = match RequestStateCodec::try_new(key.to_vec()) {
            Ok(c) => c,
            Err(e) => unreachable!("a 32-byte key is long enough: {e}"),
        };
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
                gear: opts.gear.unwrap_or(engine_gear),
                approvals_cfg,
                approvals,
                state_codec,
                _local: local,
            }),
        }
    }

    /// The store of pending approvals (the HTTP daemon serves `/approvals`).
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.inner.approvals
    }

    /// The server's safety gear.
    pub fn gear(&self) -> Gear {
        self.inner.gear
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
    async fn record(&self, record: Record, info: &CallInfo) -> bool {
        audit::append(self.inner.audit.as_deref(), record, info).await
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

    /// Run `req` (over its session's workspace, when it has one), reporting progress while it
    /// goes when the client asked for it. `None` when the client cancelled the request or went
    /// away: the engine future is dropped, which kills the sandbox.
    async fn run(
        &self,
        req: ExecRequest,
        backend: Option<BackendKind>,
        session: Option<&SessionRun>,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<(Outcome, Option<RunReport>)> {
        let language = req.language.clone();
        let timeout_ms = req
            .limits
            .timeout_ms
            .unwrap_or(self.inner.engine.config().limits.timeout_ms);
        let token = ctx.meta.get_progress_token();
        let started = Instant::now();
        let engine = self.inner.engine.clone();
        let session = session.cloned();
        let run = async move {
            match session {
                None => (engine.execute(req, backend).await, None),
                Some(s) => {
                    let (o, r) = crate::sessions::run(&engine, &s, req, backend).await;
                    (o, Some(r))
                }
            }
        };
        tokio::pin!(run);
        let period = self.inner.progress_interval;
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                done = &mut run => return Some(done),
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
        session: Option<&SessionRun>,
        report: Option<&PolicyReport>,
        info: &CallInfo,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<(Outcome, Option<RunReport>)> {
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
            return Some((o, None));
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
                return Some((o, None));
            }
        };
        let hash_only = self.inner.audit.as_ref().is_some_and(|a| a.hash_only());
        let mut record = Record::new("execution", &info.caller, &info.transport, &info.tool);
        fill_request(&mut record, &req, &backend_name, hash_only);
        if let Some(p) = report {
            fill_policy(&mut record, p);
        }
        record.durations.queued_ms = queued_ms;
        let started = Instant::now();
        let language = req.language.clone();
        let done = self.run(req, backend, session, ctx).await;
        drop(slot);
        let m = &self.inner.metrics;
        let Some((outcome, session_report)) = done else {
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
        if let Some(e) = &outcome.egress {
            m.egress(record.gear.as_deref().unwrap_or("unknown"), e);
        }
        fill_outcome(&mut record, &outcome);
        if !self.record(record, info).await {
            m.error("audit");
        }
        Some((outcome, session_report))
    }

    /// The pipeline's last steps for a plan the gear let go: open the tool channel, run
    /// under the guard, collect the tool calls. `Err` is the answer when the channel cannot
    /// open; `Ok(None)` when the client cancelled.
    async fn execute_plan(
        &self,
        plan: RunPlan,
        report: &PolicyReport,
        info: &CallInfo,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Option<Done>, CallToolResponse> {
        let RunPlan {
            mut request,
            backend,
            session,
            tools,
        } = plan;
        let channel = match &tools {
            None => None,
            Some(t) => Some(
                t.open(self.broker())
                    .await
                    .map_err(crate::broker::refused)?,
            ),
        };
        if let Some(c) = &channel {
            c.apply(&mut request);
        }
        let done = self
            .guarded_run(request, backend, session.as_ref(), Some(report), info, ctx)
            .await;
        let tool_calls = channel.map(|c| c.finish());
        Ok(done.map(|(outcome, session)| Done {
            outcome,
            tool_calls,
            session,
        }))
    }

    /// The pipeline's "shape" step: the result of a run in the tool's layout, with the
    /// policy, the tool calls and the session's workspace.
    fn shape(
        &self,
        kind: ToolKind,
        done: &Done,
        report: &PolicyReport,
        session: Option<&SessionRun>,
    ) -> CallToolResponse {
        let mut result = match kind {
            ToolKind::CodeExecPython => tools::heroku_result(&done.outcome),
            ToolKind::ListPackages => tools::packages_result(&self.inner.engine, &done.outcome),
            _ => tools::with_policy(tools::outcome_result(&done.outcome), report),
        };
        if let Some(calls) = &done.tool_calls {
            result = crate::broker::attach(result, calls);
        }
        let response: CallToolResponse = result.into();
        match session {
            Some(s) => crate::sessions::shape(response, s, done.session.clone()),
            None => response,
        }
    }

    /// One tool call, through the request pipeline: parse → prepare → attach the session →
    /// check the tool access → gate (analysis, gear, approval) → open the tool channel → guard
    /// (audit, limiter) → execute → shape the result. Each step adds to one [`RunPlan`];
    /// a pending approval keeps the plan whole, so `approval_status` runs the same run.
    async fn call(
        &self,
        mut request: CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let engine = &self.inner.engine;
        let Some(mut kind) = self.kind_of(&request.name) else {
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
        if kind == ToolKind::Session
            && let Some(answer) = crate::sessions::answer(engine, &request)
        {
            return Ok(answer);
        }
        // Attach the session: exec_run, or execute_code with session_id, is execute_code
        // over the session's workspace.
        let session = match crate::sessions::attach(engine, &mut request) {
            Ok(s) => s,
            Err(message) => return Ok(crate::sessions::tool_error(message)),
        };
        if session.is_some() {
            kind = ToolKind::ExecuteCode;
        }
        // Answers of calls that ran nothing: a session call still says so.
        let finish = |response: CallToolResponse| match &session {
            Some(s) => crate::sessions::shape(response, s, None),
            None => response,
        };
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
            // Answered above.
            ToolKind::Session | ToolKind::Broker(_) => Err("this tool takes no run".into()),
            ToolKind::ApprovalStatus => Ok(Prepared::Refused(Outcome::denied(
                "",
                engine.config().backend.as_str(),
                "approval_status takes no run",
            ))),
        };
        let info = self.call_info(&request.name, ctx);
        if kind == ToolKind::ApprovalStatus {
            return match parse::<crate::args::ApprovalStatusArgs>(args) {
                Err(message) => Ok(tools::argument_error(kind, engine, message).into()),
                Ok(a) => self.approval_status(&a.operation_id, &info, ctx).await,
            };
        }
        let call_policy = CallPolicy {
            gear: args
                .and_then(|a| a.get("gear"))
                .and_then(|g| serde_json::from_value(g.clone()).ok()),
            operation_id: args
                .and_then(|a| a.get("operation_id"))
                .and_then(|v| v.as_str())
                .map(str::to_string),
        };
        let (req, backend) = match prepared {
            Err(message) => {
                tracing::debug!(tool = %request.name, %message, "argument error");
                let o = Outcome::denied("", engine.config().backend.as_str(), message.clone());
                self.refused(&info, None, &o, "invalid_arguments", "arguments")
                    .await;
                return Ok(finish(tools::argument_error(kind, engine, message).into()));
            }
            Ok(Prepared::Refused(outcome)) => {
                self.refused(&info, None, &outcome, "denied", "denied")
                    .await;
                let result = match kind {
                    ToolKind::CodeExecPython => tools::heroku_result(&outcome),
                    ToolKind::ListPackages => tools::packages_result(engine, &outcome),
                    _ => tools::outcome_result(&outcome),
                };
                return Ok(finish(result.into()));
            }
            Ok(Prepared::Run { request, backend }) => (request, backend),
        };
        // The tool access is checked now and opened only after the gear.
        let tools = if kind == ToolKind::ExecuteCode {
            let max_timeout_ms = engine.config().limits.timeout_ms;
            match crate::broker::access(self.broker(), max_timeout_ms, args) {
                Ok(t) => t,
                Err(message) => return Ok(finish(crate::broker::refused(message))),
            }
        } else {
            None
        };
        let plan = RunPlan {
            request: req,
            backend,
            session: session.clone(),
            tools,
        };
        let gated = if kind == ToolKind::ListPackages {
            // The server's own listing program, not caller code: no gear applies.
            Gate::Run {
                plan,
                report: self.plain_report(),
            }
        } else {
            self.gate(kind, plan, call_policy, &info, &request, ctx)
                .await
        };
        let (plan, report) = match gated {
            Gate::Answer(r) => return Ok(finish(r)),
            Gate::Run { plan, report } => (plan, report),
        };
        let done = match self.execute_plan(plan, &report, &info, ctx).await {
            Err(answer) => return Ok(finish(answer)),
            Ok(None) => {
                return Err(McpError::internal_error(
                    "request cancelled; its run was killed",
                    None,
                ));
            }
            Ok(Some(done)) => done,
        };
        tracing::debug!(
            tool = %request.name,
            status = %done.outcome.status,
            duration_ms = done.outcome.duration_ms,
            "tool call finished"
        );
        Ok(self.shape(kind, &done, &report, session.as_ref()))
    }

    /// A report for a run no gear looked at.
    fn plain_report(&self) -> PolicyReport {
        PolicyReport {
            gear: self.inner.gear,
            risk: gearbox_analysis::Risk::Low,
            requested: Vec::new(),
            detected: Vec::new(),
            granted: Vec::new(),
            decided_by: "gear".into(),
            findings: Vec::new(),
            operation_id: None,
        }
    }

    /// The answer of a call the gear refused: a `denied` outcome with the findings.
    #[allow(clippy::too_many_arguments)]
    async fn gear_refusal(
        &self,
        kind: ToolKind,
        info: &CallInfo,
        req: &ExecRequest,
        backend: Option<BackendKind>,
        report: &PolicyReport,
        reason: String,
        approval: &str,
    ) -> Gate {
        let backend_name = backend.unwrap_or(self.inner.engine.config().backend);
        let o = Outcome::denied(&req.language, backend_name.as_str(), reason);
        let m = &self.inner.metrics;
        m.request(&req.language, "denied");
        m.error("policy");
        let mut r = Record::new("refusal", &info.caller, &info.transport, &info.tool);
        let hash_only = self.inner.audit.as_ref().is_some_and(|a| a.hash_only());
        fill_request(&mut r, req, backend_name.as_str(), hash_only);
        fill_outcome(&mut r, &o);
        fill_policy(&mut r, report);
        r.capabilities = report
            .requested
            .iter()
            .chain(report.detected.iter())
            .map(|c| c.as_str().to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        r.approval = Some(approval.to_string());
        r.status = "denied".into();
        self.record(r, info).await;
        let result = match kind {
            ToolKind::CodeExecPython => tools::heroku_result(&o),
            _ => tools::with_policy(tools::outcome_result(&o), report),
        };
        Gate::Answer(result.into())
    }

    /// Apply the safety gear to a prepared run.
    #[allow(clippy::too_many_arguments)]
    async fn gate(
        &self,
        kind: ToolKind,
        mut plan: RunPlan,
        call: CallPolicy,
        info: &CallInfo,
        params: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Gate {
        let server_gear = self.inner.gear;
        let backend = plan.backend;
        let mut report = self.plain_report();
        let gear = match call.gear {
            Some(g) if g > server_gear => {
                let reason = format!(
                    "gear: {g} is above this server's gear ({server_gear}); a call may only \
                     lower it"
                );
                return self
                    .gear_refusal(kind, info, &plan.request, backend, &report, reason, "auto")
                    .await;
            }
            Some(g) => g,
            None => server_gear,
        };
        if let Err(reason) = policy::network_within_gear(
            gear,
            &plan.request.network,
            &self.inner.engine.config().network,
        ) {
            return self
                .gear_refusal(kind, info, &plan.request, backend, &report, reason, "auto")
                .await;
        }
        // Small programs (nearly every call) are parsed in place: a hand-off to the blocking
        // pool costs more than their parse.
        let req = &plan.request;
        let size: usize = req.code.len() + req.files.iter().map(|f| f.content.len()).sum::<usize>();
        let analysis = if size <= INLINE_ANALYSIS_BYTES {
            Ok(policy::analyse(self.inner.engine.language_table(), req))
        } else {
            let engine = self.inner.engine.clone();
            let for_analysis = req.clone();
            tokio::task::spawn_blocking(move || {
                policy::analyse(engine.language_table(), &for_analysis)
            })
            .await
        };
        let analysis = analysis.unwrap_or_else(|e| {
            tracing::error!(error = %e, "analysis failed");
            gearbox_analysis::Analysis {
                analysed: false,
                risk: gearbox_analysis::Risk::High,
                needs: BTreeSet::new(),
                findings: Vec::new(),
                parse_errors: false,
                reason: Some("analysis failed".into()),
            }
        });
        let mut requested = policy::requested(&plan.request);
        if plan.tools.is_some() {
            requested.insert(Capability::Tools);
        }
        let eval = policy::evaluate(
            gear,
            requested,
            analysis,
            self.inner.approvals_cfg.ask_on_high_risk,
        );
        report = eval.report;

        if let Some(id) = call.operation_id {
            let caps = match &eval.verdict {
                Verdict::Ask(c) | Verdict::Allow(c) => c.clone(),
                Verdict::Deny(reason) => {
                    return self
                        .gear_refusal(
                            kind,
                            info,
                            &plan.request,
                            backend,
                            &report,
                            reason.clone(),
                            "auto",
                        )
                        .await;
                }
            };
            let hash = approval_hash(&plan, &caps);
            return match self.inner.approvals.take(&id, Some(&hash)) {
                // The approved plan: equal to this one in everything the hash binds.
                Ok(approved) => {
                    let mut plan = approved.plan;
                    grant(&mut plan.request, &approved.capabilities);
                    Gate::Run {
                        plan,
                        report: approved.report,
                    }
                }
                Err(TakeError::Pending(view)) => {
                    let backend_name = backend.unwrap_or(self.inner.engine.config().backend);
                    Gate::Answer(
                        tools::pending_result(backend_name.as_str(), &view, &report).into(),
                    )
                }
                Err(e) => {
                    let answer = match &e {
                        TakeError::Rejected(_) => "rejected",
                        TakeError::Expired => "expired",
                        _ => "auto",
                    };
                    self.gear_refusal(
                        kind,
                        info,
                        &plan.request,
                        backend,
                        &report,
                        e.to_string(),
                        answer,
                    )
                    .await
                }
            };
        }

        match eval.verdict {
            Verdict::Allow(granted) => {
                grant(&mut plan.request, &granted);
                Gate::Run { plan, report }
            }
            Verdict::Deny(reason) => {
                self.gear_refusal(kind, info, &plan.request, backend, &report, reason, "auto")
                    .await
            }
            Verdict::Ask(caps) => self.ask(kind, plan, caps, report, info, params, ctx).await,
        }
    }

    /// Put a run to a human: elicitation when the client can answer it (input-required on
    /// the stateless protocol), else a pending operation approved out of band.
    #[allow(clippy::too_many_arguments)]
    async fn ask(
        &self,
        kind: ToolKind,
        plan: RunPlan,
        caps: BTreeSet<Capability>,
        mut report: PolicyReport,
        info: &CallInfo,
        params: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Gate {
        let req = &plan.request;
        let backend = plan.backend;
        let mut question =
            policy::question(&req.language, &req.packages, &req.network, &caps, &report);
        if caps.contains(&Capability::Packages) && !req.packages.is_empty() {
            // Validate before bothering a human, and show what would be installed.
            match self
                .inner
                .engine
                .resolve_packages(&req.language, &req.packages)
                .await
            {
                Ok(pkgs) => {
                    let list: Vec<String> = pkgs
                        .iter()
                        .map(|p| format!("{}=={}", p.name, p.version))
                        .collect();
                    question.push_str(&format!(
                        "\nThat installs (with dependencies): {}",
                        list.join(", ")
                    ));
                }
                Err(e) => {
                    return self
                        .gear_refusal(kind, info, req, backend, &report, e, "auto")
                        .await;
                }
            }
        }
        let hash = approval_hash(&plan, &caps);
        let cfg = &self.inner.approvals_cfg;
        let client_elicits = ctx
            .client_capabilities()
            .is_some_and(|c| c.elicitation.is_some());
        let stateless = ctx
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let approve_with = |mut plan: RunPlan, mut report: PolicyReport| {
            grant(&mut plan.request, &caps);
            report.granted = caps.iter().copied().collect();
            report.decided_by = "elicitation".into();
            Gate::Run { plan, report }
        };

        if cfg.elicitation && client_elicits && stateless {
            if let (Some(state), Some(responses)) = (&params.request_state, &params.input_responses)
            {
                if let Err(e) = self.inner.state_codec.open_with(state, hash.as_bytes()) {
                    let reason = format!(
                        "the approval state does not match this request ({e}): the code or \
                         its arguments changed, the state expired, or it was altered. Call \
                         again without requestState to ask anew"
                    );
                    return self
                        .gear_refusal(kind, info, req, backend, &report, reason, "auto")
                        .await;
                }
                let answer = responses.get(APPROVAL_INPUT).cloned().unwrap_or_default();
                let action = answer.get("action").and_then(|a| a.as_str()).unwrap_or("");
                let content = answer.get("content").cloned().unwrap_or_default();
                let approve = content
                    .get("approve")
                    .and_then(|a| a.as_bool())
                    .unwrap_or(false);
                let words = content
                    .get("reason")
                    .and_then(|r| r.as_str())
                    .map(str::to_string);
                return match action {
                    "accept" if approve => {
                        self.audit_elicitation(info, req, &caps, "elicitation_accepted", None)
                            .await;
                        approve_with(plan.clone(), report)
                    }
                    "accept" | "decline" => {
                        let reason = declined_reason(words.as_deref());
                        self.gear_refusal(
                            kind,
                            info,
                            req,
                            backend,
                            &report,
                            reason,
                            "elicitation_declined",
                        )
                        .await
                    }
                    _ => {
                        self.gear_refusal(
                            kind,
                            info,
                            req,
                            backend,
                            &report,
                            "the human dismissed the approval question; nothing ran".into(),
                            "elicitation_cancelled",
                        )
                        .await
                    }
                };
            }
            let schema = match ElicitationSchema::from_type::<ApprovalAnswer>() {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "approval schema");
                    return self
                        .gear_refusal(kind, info, req, backend, &report, e.to_string(), "auto")
                        .await;
                }
            };
            let state = self.inner.state_codec.seal_with(
                APPROVAL_INPUT.as_bytes(),
                &SealOptions::new()
                    .associated_data(hash.as_bytes())
                    .ttl(Duration::from_secs(cfg.ttl_secs.max(1))),
            );
            let elicit = ElicitRequest::new(ElicitRequestParams::FormElicitationParams {
                meta: None,
                message: format!("{question}\nApprove this run?"),
                requested_schema: schema,
            });
            let mut inputs = InputRequests::new();
            inputs.insert(APPROVAL_INPUT.into(), InputRequest::Elicitation(elicit));
            self.audit_elicitation(info, req, &caps, "asked", None)
                .await;
            return Gate::Answer(CallToolResponse::InputRequired(InputRequiredResult::new(
                Some(inputs),
                Some(state),
            )));
        }

        if cfg.elicitation && client_elicits && !stateless {
            self.audit_elicitation(info, req, &caps, "asked", None)
                .await;
            let timeout = Duration::from_secs(cfg.elicitation_timeout_secs.max(1));
            let answer = ctx
                .peer
                .elicit_with_timeout::<ApprovalAnswer>(
                    format!("{question}\nApprove this run?"),
                    Some(timeout),
                )
                .await;
            let (reason, how) = match answer {
                Ok(Some(a)) if a.approve => {
                    self.audit_elicitation(info, req, &caps, "elicitation_accepted", None)
                        .await;
                    return approve_with(plan.clone(), report);
                }
                Ok(Some(a)) => (declined_reason(a.reason.as_deref()), "elicitation_declined"),
                Ok(None) | Err(ElicitationError::NoContent) => {
                    (declined_reason(None), "elicitation_declined")
                }
                Err(ElicitationError::UserDeclined) => {
                    (declined_reason(None), "elicitation_declined")
                }
                Err(ElicitationError::UserCancelled) => (
                    "the human dismissed the approval question; nothing ran".to_string(),
                    "elicitation_cancelled",
                ),
                Err(ElicitationError::CapabilityNotSupported) => (String::new(), ""),
                Err(e) => (
                    format!("no answer to the approval question ({e}); nothing ran"),
                    "elicitation_cancelled",
                ),
            };
            if !how.is_empty() {
                return self
                    .gear_refusal(kind, info, req, backend, &report, reason, how)
                    .await;
            }
        }

        // Out of band.
        let backend_name = backend.unwrap_or(self.inner.engine.config().backend);
        report.operation_id = None;
        match self
            .inner
            .approvals
            .create(plan.clone(), hash, &caps, question, report.clone())
        {
            Ok(view) => {
                self.audit_elicitation(info, req, &caps, "asked", Some(&view.operation_id))
                    .await;
                self.inner
                    .metrics
                    .request(&req.language, "pending_approval");
                let result = if kind == ToolKind::CodeExecPython {
                    // The drop-in shape: returncode -1, the how-to in stderr.
                    tools::heroku_result(&tools::pending_outcome(backend_name.as_str(), &view).0)
                } else {
                    tools::pending_result(backend_name.as_str(), &view, &report)
                };
                Gate::Answer(result.into())
            }
            Err(reason) => {
                self.gear_refusal(kind, info, req, backend, &report, reason, "auto")
                    .await
            }
        }
    }

    async fn audit_elicitation(
        &self,
        info: &CallInfo,
        req: &ExecRequest,
        caps: &BTreeSet<Capability>,
        what: &str,
        operation_id: Option<&str>,
    ) {
        let mut r = Record::new("approval", &info.caller, &info.transport, &info.tool);
        let hash_only = self.inner.audit.as_ref().is_some_and(|a| a.hash_only());
        let backend = self.inner.engine.config().backend;
        fill_request(&mut r, req, backend.as_str(), hash_only);
        r.gear = Some(self.inner.gear.to_string());
        r.capabilities = caps.iter().map(|c| c.as_str().to_string()).collect();
        r.approval = Some(what.to_string());
        r.status = what.to_string();
        r.operation_id = operation_id.map(str::to_string);
        self.record(r, info).await;
    }

    /// `approval_status`: pending again, the approved run, or the refusal.
    async fn approval_status(
        &self,
        id: &str,
        info: &CallInfo,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let backend = self.inner.engine.config().backend;
        let report = self.plain_report();
        let deny = |reason: String| {
            tools::with_policy(
                tools::outcome_result(&Outcome::denied("", backend.as_str(), reason)),
                &report,
            )
            .into()
        };
        if !approvals::valid_id(id) {
            return Ok(deny(
                "operation_id: not an operation id (expected the UUID of a pending_approval \
                 result)"
                    .into(),
            ));
        }
        match self.inner.approvals.take(id, None) {
            // The approved plan, whole: its session and its tools too.
            Ok(approved) => {
                let mut plan = approved.plan;
                grant(&mut plan.request, &approved.capabilities);
                let session = plan.session.clone();
                match self.execute_plan(plan, &approved.report, info, ctx).await {
                    Err(answer) => Ok(answer),
                    Ok(Some(done)) => Ok(self.shape(
                        ToolKind::ExecuteCode,
                        &done,
                        &approved.report,
                        session.as_ref(),
                    )),
                    Ok(None) => Err(McpError::internal_error(
                        "request cancelled; its run was killed",
                        None,
                    )),
                }
            }
            Err(TakeError::Pending(view)) => {
                Ok(tools::pending_result(backend.as_str(), &view, &report).into())
            }
            Err(e) => Ok(deny(e.to_string())),
        }
    }
}

/// The hash a human's approval of `plan` binds to: its request and capabilities, its tools
/// (`allow_tools` and limits) and its session, when it has them.
fn approval_hash(plan: &RunPlan, caps: &BTreeSet<Capability>) -> String {
    let binding = match (plan.tools_spec(), &plan.session) {
        (None, None) => None,
        (tools, session) => Some(
            serde_json::json!({
                "tools": tools,
                "session": session.as_ref().map(|s| s.id().to_string()),
            })
            .to_string(),
        ),
    };
    policy::approval_hash(&plan.request, caps, binding.as_deref())
}

fn declined_reason(words: Option<&str>) -> String {
    match words.map(str::trim).filter(|w| !w.is_empty()) {
        Some(w) => format!("the human declined this run: {w}"),
        None => "the human declined this run".into(),
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
        self.call(request, &ctx).await
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
