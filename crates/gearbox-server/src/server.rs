//! [`GearboxServer`]: the one `ServerHandler`, whatever the transport: MCP dispatch and the
//! request pipeline (`call`). The pipeline's gate (the gear and human approvals) is
//! [`crate::gate`]; what an audit line says of a call is mapped in [`crate::audit`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use gearbox_core::{BackendKind, ExecRequest, Gear, Outcome};
use gearbox_engine::Engine;
use gearbox_engine::config::ToolProfile;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CustomRequest, CustomResult, ErrorCode,
    Implementation, InitializeRequestParams, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ResourceContents, ServerCapabilities, ServerConfig,
    Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::ServeOptions;
use crate::approvals::Approvals;
use crate::args::parse;
use crate::audit::{self, AuditLog, CallInfo, Record, fill_outcome, fill_policy, fill_request};
use crate::gate::{CallPolicy, Gate, Gatekeeper};
use crate::limiter::{Limiter, Refusal};
use crate::metrics::Metrics;
use crate::plan::RunPlan;
use crate::quotas::Quotas;
use crate::resources;
use crate::sessions::{RunReport, SessionRun};
use crate::tools::{self, Prepared, ToolKind};
use crate::{Caller, TransportName};
use gearbox_broker::ToolCallRecord;
use gearbox_engine::policy::PolicyReport;

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
    /// The quotas of each tenant and their recent usage.
    quotas: Arc<Quotas>,
    metrics: Arc<Metrics>,
    audit: Option<Arc<AuditLog>>,
    /// The downstream servers of `[[targets]]` (code mode), or why they are unusable.
    broker: Result<Option<gearbox_broker::Broker>, String>,
    /// Transport and caller when the request does not say (stdio).
    transport: &'static str,
    caller: String,
    /// The gear and human approvals (step 4 of the pipeline).
    gatekeeper: Gatekeeper,
}

/// What a run left for the result: its outcome, the tool calls its code made, what happened
/// to its session's workspace.
struct Done {
    outcome: Outcome,
    tool_calls: Option<Vec<ToolCallRecord>>,
    session: Option<RunReport>,
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
        let quotas = Arc::new(Quotas::new(engine.config().quotas.clone()));
        let metrics = Arc::new(Metrics::with_tenants(quotas.named()));
        let gatekeeper = Gatekeeper::new(
            engine.clone(),
            opts.gear.unwrap_or(engine.config().gear),
            opts.audit.clone(),
            metrics.clone(),
            opts.local_approvals,
        );
        GearboxServer {
            inner: Arc::new(Inner {
                engine,
                profiles,
                tools,
                progress_interval: opts.progress_interval.max(Duration::from_millis(50)),
                languages: OnceCell::new(),
                limiter,
                quotas,
                metrics,
                audit: opts.audit,
                broker,
                transport: opts.transport,
                caller: opts.caller,
                gatekeeper,
            }),
        }
    }

    /// The store of pending approvals (the HTTP daemon serves `/approvals`).
    pub fn approvals(&self) -> &Arc<Approvals> {
        self.inner.gatekeeper.approvals()
    }

    /// The server's safety gear.
    pub fn gear(&self) -> Gear {
        self.inner.gatekeeper.gear()
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }

    /// The run budget every call of every transport shares.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.inner.limiter
    }

    /// What a run of `tenant` asked for now would get, without taking anything: `Some`
    /// when it would be refused (closing, busy, or over one of the tenant's quotas). Lets a
    /// transport answer before it accepts the request.
    pub fn would_refuse(&self, tenant: &str) -> Option<Refusal> {
        let limits = self.inner.quotas.limits(tenant);
        if let Some(r) = self.inner.limiter.would_refuse(tenant, limits) {
            return Some(r);
        }
        self.inner.quotas.check(tenant).err()
    }

    /// Whether a call of the tool `name` asks for a run (and so passes the limiter and the
    /// run quotas).
    pub fn runs_code(&self, name: &str) -> bool {
        match self.kind_of(name) {
            None | Some(ToolKind::Broker(_)) => false,
            Some(ToolKind::Session) => name == crate::sessions::EXEC_RUN,
            Some(_) => true,
        }
    }

    /// A call refused by a tenant quota, counted.
    fn quota_refused(&self, tenant: &str, refusal: &Refusal) {
        if let Some(q) = refusal.quota() {
            self.inner.metrics.tenant_refusal(tenant, q);
        }
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
            .or_else(|| ctx.extensions.get::<Caller>())
            .cloned()
            .unwrap_or_else(|| Caller::named(&self.inner.caller));
        let transport = parts
            .and_then(|p| p.extensions.get::<TransportName>())
            .or_else(|| ctx.extensions.get::<TransportName>())
            .map_or(self.inner.transport, |t| t.0);
        CallInfo {
            caller: caller.name,
            tenant: caller.tenant,
            max_gear: caller.max_gear,
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
        let tenant = info.caller.as_str();
        if let Err(refusal) = self.inner.quotas.admit(tenant) {
            self.quota_refused(tenant, &refusal);
            let o = Outcome::failed_to_start(&req.language, &backend_name, refusal.to_string());
            self.refused(info, Some(&req), &o, "quota", "quota").await;
            return Some((o, None));
        }
        let limits = self.inner.quotas.limits(tenant);
        let slot = tokio::select! {
            slot = self.inner.limiter.acquire(tenant, limits) => slot,
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
                let why = if refusal.quota().is_some() {
                    "quota"
                } else {
                    "busy"
                };
                self.inner.quotas.unadmit(tenant);
                self.quota_refused(tenant, &refusal);
                self.refused(info, Some(&req), &o, why, why).await;
                return Some((o, None));
            }
        };
        self.inner.metrics.tenant_run(tenant);
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
        if let Some(cpu_ms) = done.as_ref().and_then(|(o, _)| o.usage.cpu_time_ms) {
            self.inner.quotas.charge_cpu(tenant, cpu_ms);
            m.tenant_cpu(tenant, cpu_ms as f64 / 1000.0);
        }
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
        // A live session's channel is already open, with its sandbox.
        let live = session
            .as_ref()
            .is_some_and(|s| crate::sessions::live_sessions().tools_of(s.id()).is_some());
        let channel = match &tools {
            None => None,
            Some(_) if live => None,
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
        Ok(done.map(|(outcome, mut session)| Done {
            outcome,
            tool_calls: tool_calls.or_else(|| session.as_mut().and_then(|r| r.tool_calls.take())),
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
        tenant: &str,
    ) -> CallToolResponse {
        // A run without a session: its outputs are kept for its tenant and linked (by the
        // tools whose result is the outcome).
        let links = !matches!(kind, ToolKind::CodeExecPython | ToolKind::ListPackages);
        let mut kept;
        let outcome = if links && session.is_none() && !done.outcome.outputs.is_empty() {
            kept = done.outcome.clone();
            crate::runs::keep(tenant, &mut kept);
            &kept
        } else {
            &done.outcome
        };
        let mut result = match kind {
            ToolKind::CodeExecPython => tools::heroku_result(outcome),
            ToolKind::ListPackages => tools::packages_result(&self.inner.engine, outcome),
            _ => tools::with_policy(tools::outcome_result(outcome), report),
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
        let CallInfo {
            tenant, max_gear, ..
        } = self.call_info(&request.name, ctx);
        // A live session's packages need full_trust: the caller's cap counts.
        let ceiling = max_gear.map_or(self.gear(), |cap| cap.min(self.gear()));
        if kind == ToolKind::Session
            && let Err(refusal) =
                crate::sessions::check_quotas(engine, &self.inner.quotas, &tenant, &request)
        {
            self.quota_refused(&tenant, &refusal);
            return Ok(crate::sessions::tool_error(refusal.to_string()));
        }
        if kind == ToolKind::Session
            && let Some(answer) =
                crate::sessions::answer(engine, self.broker(), ceiling, &tenant, &request).await
        {
            return Ok(answer);
        }
        // Attach the session: exec_run, or execute_code with session_id, is execute_code
        // over the session's workspace.
        let session = match crate::sessions::attach(engine, &tenant, &mut request) {
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
        // The tool access is checked now and opened only after the gear. A live session's
        // cell calls the tools its session was opened with, through the session's channel.
        let live_tools = session
            .as_ref()
            .and_then(|s| crate::sessions::live_sessions().tools_of(s.id()));
        let tools = if let Some(access) = live_tools {
            if args.is_some_and(|a| a.contains_key("allow_tools")) {
                return Ok(finish(crate::broker::refused(
                    "allow_tools: a live session's tools are given when it opens (exec_open)"
                        .into(),
                )));
            }
            access
        } else if kind == ToolKind::ExecuteCode {
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
                report: self.inner.gatekeeper.plain_report(),
            }
        } else {
            self.inner
                .gatekeeper
                .gate(kind, plan, call_policy, &info, &request, ctx)
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
        Ok(self.shape(kind, &done, &report, session.as_ref(), &tenant))
    }

    /// `approval_status`: pending again, the approved run, or the refusal.
    async fn approval_status(
        &self,
        id: &str,
        info: &CallInfo,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        // The approved plan, whole: its session and its tools too.
        let (plan, report) = match self.inner.gatekeeper.approval_status(id, info) {
            Gate::Answer(answer) => return Ok(answer),
            Gate::Run { plan, report } => (plan, report),
        };
        let session = plan.session.clone();
        match self.execute_plan(plan, &report, info, ctx).await {
            Err(answer) => Ok(answer),
            Ok(Some(done)) => Ok(self.shape(
                ToolKind::ExecuteCode,
                &done,
                &report,
                session.as_ref(),
                &info.caller,
            )),
            Ok(None) => Err(McpError::internal_error(
                "request cancelled; its run was killed",
                None,
            )),
        }
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
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let tenant = self.call_info("resources/list", &ctx).caller;
        Ok(ListResourcesResult::with_all_items(resources::list(
            &self.inner.engine,
            &self.inner.profiles,
            &tenant,
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
        ctx: RequestContext<RoleServer>,
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
        } else if crate::runs::is_runs_uri(uri) {
            crate::runs::read_resource(uri, &self.call_info("resources/read", &ctx).caller)?
        } else if crate::sessions::is_session_uri(uri)
            && self.inner.profiles.contains(&ToolProfile::Sessions)
        {
            crate::sessions::read_resource(
                &self.inner.engine,
                uri,
                &self.call_info("resources/read", &ctx).caller,
            )
            .await?
        } else {
            resources::read_snippets(&self.inner.engine, uri)?
        };
        Ok(result.into())
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        Err(unread_request_error(&request.method, request.params))
    }
}

/// The answer to a request rmcp could not read as one it knows (it arrives as a custom
/// request): an unknown method is "method not found"; a method this server serves whose
/// params do not fit is "invalid params" (-32602), naming what does not fit, as JSON-RPC
/// says and the official Python SDK answers (rmcp's default said "method not found" for a
/// method the server lists). The stdio transport's stand-in for a request it could not
/// read (too long, of the wrong shape, too deep) is answered here too: `-32600` with the
/// message it carries (`request_shape.rs`).
fn unread_request_error(method: &str, params: Option<Value>) -> McpError {
    fn why<T: serde::de::DeserializeOwned>(params: Option<Value>) -> String {
        match params {
            None => "params are missing".to_string(),
            Some(p) => match serde_json::from_value::<T>(p) {
                Err(e) => e.to_string(),
                // Read alone they fit: what did not is elsewhere in the request (`_meta`).
                Ok(_) => "the request does not fit its schema".to_string(),
            },
        }
    }
    if let Some(message) = crate::request_shape::stand_in_message(method, params.as_ref()) {
        return McpError::invalid_request(message.to_string(), None);
    }
    let why = match method {
        "initialize" => why::<InitializeRequestParams>(params),
        "tools/call" => why::<CallToolRequestParams>(params),
        "resources/read" => why::<ReadResourceRequestParams>(params),
        "tools/list" | "resources/list" | "resources/templates/list" => {
            why::<PaginatedRequestParams>(params)
        }
        _ => return McpError::new(ErrorCode::METHOD_NOT_FOUND, method.to_string(), None),
    };
    McpError::invalid_params(format!("invalid params for {method}: {why}"), None)
}
