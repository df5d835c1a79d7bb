//! The gate, step 4 of the request pipeline (`GearboxServer::call`): analysis and the safety
//! gear decide whether a prepared run goes, is refused, or is put to a human; this module
//! holds that decision and the approval flow that follows it.
//!
//! A human is asked by elicitation when the client can answer it (and `[approvals]
//! elicitation` is on): on the stateless protocol
//! the call ends with an input-required result whose `requestState` is sealed to the request
//! (its approval hash), and the same call again with the answer runs or is refused; on the
//! stateful one the server waits for the client's answer. Otherwise the plan is stored as a
//! pending operation ([`crate::approvals`]) that a human decides out of band, and the same call
//! with `operation_id`, or `approval_status`, takes it for its one run. Each step is audited
//! (`asked`, `elicitation_accepted`, `elicitation_declined`, ...); a refusal is a `denied`
//! outcome with the findings.
//!
//! The gate answers with a [`Gate`]: the plan to run with what was granted, or the answer of
//! a call that runs nothing. Opening the tool channel, the guard and the run stay with the
//! server.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gearbox_core::{BackendKind, Capability, ExecRequest, Gear, Outcome};
use gearbox_engine::Engine;
use gearbox_engine::config::ApprovalsConfig;
use gearbox_engine::policy::{self, PolicyReport, Verdict};
use rmcp::RoleServer;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitationSchema,
    InputRequest, InputRequests, InputRequiredResult, ProtocolVersion, RequestStateCodec,
    SealOptions,
};
use rmcp::service::{ElicitationError, RequestContext};

use crate::approvals::{self, Approvals, LocalChannel, TakeError};
use crate::audit::{self, AuditLog, CallInfo, Record, fill_outcome, fill_policy, fill_request};
use crate::metrics::Metrics;
use crate::plan::RunPlan;
use crate::tools::{self, ToolKind};

/// The key of the approval question in an input-required result.
const APPROVAL_INPUT: &str = "approval";
/// Code up to this size (the program and its files) is analysed on the calling task.
const INLINE_ANALYSIS_BYTES: usize = 4 * 1024;

/// A call after the gear: run it (with what was granted), or answer without running.
#[allow(clippy::large_enum_variant, reason = "one per call, moved once")]
pub(crate) enum Gate {
    Run { plan: RunPlan, report: PolicyReport },
    Answer(CallToolResponse),
}

/// What a call says about the gear: a lower gear, a resumed approval.
#[derive(Debug, Default)]
pub(crate) struct CallPolicy {
    pub gear: Option<Gear>,
    pub operation_id: Option<String>,
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

/// The gate of one server: its gear, its approvals (the store of pending operations, the
/// local socket, the key that seals input-required states), and where a refusal or a question
/// is counted and audited.
pub(crate) struct Gatekeeper {
    engine: Arc<Engine>,
    /// The server's safety gear; calls may lower it.
    gear: Gear,
    approvals_cfg: ApprovalsConfig,
    approvals: Arc<Approvals>,
    /// Seals the `requestState` of input-required results (stateless protocol): a key per
    /// process, so a state outlives neither the process nor its TTL.
    state_codec: RequestStateCodec,
    metrics: Arc<Metrics>,
    audit: Option<Arc<AuditLog>>,
    /// The local approval socket, removed when the server goes.
    _local: Option<LocalChannel>,
}

impl Gatekeeper {
    /// The gate of a server of `gear`; with `local_approvals`, it serves the local approval
    /// socket (`gearbox approve`).
    pub fn new(
        engine: Arc<Engine>,
        gear: Gear,
        audit: Option<Arc<AuditLog>>,
        metrics: Arc<Metrics>,
        local_approvals: bool,
    ) -> Gatekeeper {
        let approvals_cfg = engine.config().approvals.clone();
        let approvals = Arc::new(Approvals::new(
            Duration::from_secs(approvals_cfg.ttl_secs.max(1)),
            audit.clone(),
        ));
        let local = if local_approvals {
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
        Gatekeeper {
            engine,
            gear,
            approvals_cfg,
            approvals,
            state_codec,
            metrics,
            audit,
            _local: local,
        }
    }

    /// The store of pending approvals.
    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.approvals
    }

    /// The server's safety gear.
    pub fn gear(&self) -> Gear {
        self.gear
    }

    /// The highest gear a call of `info`'s caller runs at: the server's, or the caller's cap
    /// when lower.
    pub fn ceiling(&self, info: &CallInfo) -> Gear {
        info.max_gear.map_or(self.gear, |cap| cap.min(self.gear))
    }

    /// A report for a run no gear looked at.
    pub fn plain_report(&self) -> PolicyReport {
        PolicyReport {
            gear: self.gear,
            risk: gearbox_analysis::Risk::Low,
            requested: Vec::new(),
            detected: Vec::new(),
            granted: Vec::new(),
            decided_by: "gear".into(),
            findings: Vec::new(),
            operation_id: None,
        }
    }

    /// Apply the safety gear to a prepared run.
    #[allow(clippy::too_many_arguments)]
    pub async fn gate(
        &self,
        kind: ToolKind,
        mut plan: RunPlan,
        call: CallPolicy,
        info: &CallInfo,
        params: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Gate {
        let server_gear = self.gear;
        let ceiling = self.ceiling(info);
        let backend = plan.backend;
        let mut report = self.plain_report();
        // Above the server's gear: refused. Above the caller's own cap (`[http.keys.NAME]
        // max_gear`, a token's gear scope): lowered to the cap, as is the server's gear.
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
            Some(g) => g.min(ceiling),
            None => ceiling,
        };
        if let Err(reason) =
            policy::network_within_gear(gear, &plan.request.network, &self.engine.config().network)
        {
            return self
                .gear_refusal(kind, info, &plan.request, backend, &report, reason, "auto")
                .await;
        }
        // Small programs (nearly every call) are parsed in place: a hand-off to the blocking
        // pool costs more than their parse.
        let req = &plan.request;
        let size: usize = req.code.len() + req.files.iter().map(|f| f.content.len()).sum::<usize>();
        let analysis = if size <= INLINE_ANALYSIS_BYTES {
            Ok(policy::analyse(self.engine.language_table(), req))
        } else {
            let engine = self.engine.clone();
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
            self.approvals_cfg.ask_on_high_risk,
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
            return match self
                .approvals
                .take_capped(&id, Some(&hash), &info.tenant, gear)
            {
                // The approved plan: equal to this one in everything the hash binds.
                Ok(approved) => run_approved(approved),
                Err(TakeError::Pending(view)) => {
                    let backend_name = backend.unwrap_or(self.engine.config().backend);
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
        let cfg = &self.approvals_cfg;
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
                if let Err(e) = self.state_codec.open_with(state, hash.as_bytes()) {
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
            let state = self.state_codec.seal_with(
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
        let backend_name = backend.unwrap_or(self.engine.config().backend);
        report.operation_id = None;
        match self.approvals.create(
            plan.clone(),
            hash,
            &caps,
            question,
            report.clone(),
            &info.tenant,
        ) {
            Ok(view) => {
                self.audit_elicitation(info, req, &caps, "asked", Some(&view.operation_id))
                    .await;
                self.metrics.request(&req.language, "pending_approval");
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

    /// The gate of `approval_status`: the approved plan, whole (its session and its tools
    /// too), with what was granted; else the answer: still pending, or the refusal.
    pub fn approval_status(&self, id: &str, info: &CallInfo) -> Gate {
        let backend = self.engine.config().backend;
        let report = self.plain_report();
        let deny = |reason: String| {
            Gate::Answer(
                tools::with_policy(
                    tools::outcome_result(&Outcome::denied("", backend.as_str(), reason)),
                    &report,
                )
                .into(),
            )
        };
        if !approvals::valid_id(id) {
            return deny(
                "operation_id: not an operation id (expected the UUID of a pending_approval \
                 result)"
                    .into(),
            );
        }
        match self
            .approvals
            .take_capped(id, None, &info.tenant, self.ceiling(info))
        {
            Ok(approved) => run_approved(approved),
            Err(TakeError::Pending(view)) => {
                Gate::Answer(tools::pending_result(backend.as_str(), &view, &report).into())
            }
            Err(e) => deny(e.to_string()),
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
        let backend_name = backend.unwrap_or(self.engine.config().backend);
        let o = Outcome::denied(&req.language, backend_name.as_str(), reason);
        let m = &self.metrics;
        m.request(&req.language, "denied");
        m.error("policy");
        let mut r = Record::new("refusal", &info.caller, &info.transport, &info.tool);
        let hash_only = self.audit.as_ref().is_some_and(|a| a.hash_only());
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
        audit::append(self.audit.as_deref(), r, info).await;
        let result = match kind {
            ToolKind::CodeExecPython => tools::heroku_result(&o),
            _ => tools::with_policy(tools::outcome_result(&o), report),
        };
        Gate::Answer(result.into())
    }

    /// The `approval` line of a question put to a human, or of their answer.
    async fn audit_elicitation(
        &self,
        info: &CallInfo,
        req: &ExecRequest,
        caps: &BTreeSet<Capability>,
        what: &str,
        operation_id: Option<&str>,
    ) {
        let mut r = Record::new("approval", &info.caller, &info.transport, &info.tool);
        let hash_only = self.audit.as_ref().is_some_and(|a| a.hash_only());
        let backend = self.engine.config().backend;
        fill_request(&mut r, req, backend.as_str(), hash_only);
        // Only user_confirmed asks: the gear the run was evaluated under, whatever the
        // server's (a caller's cap or its `gear` may have lowered it to this one).
        r.gear = Some(Gear::UserConfirmed.to_string());
        r.capabilities = caps.iter().map(|c| c.as_str().to_string()).collect();
        r.approval = Some(what.to_string());
        r.status = what.to_string();
        r.operation_id = operation_id.map(str::to_string);
        audit::append(self.audit.as_deref(), r, info).await;
    }
}

/// Give the run what the gear granted.
fn grant(req: &mut ExecRequest, caps: &BTreeSet<Capability>) {
    if !caps.contains(&Capability::Network) {
        req.network = gearbox_core::Network::Off;
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

/// What the agent is told when the human declined, with their words if any.
fn declined_reason(words: Option<&str>) -> String {
    match words.map(str::trim).filter(|w| !w.is_empty()) {
        Some(w) => format!("the human declined this run: {w}"),
        None => "the human declined this run".into(),
    }
}

/// An approved operation's plan, with what was granted, as the run to make.
fn run_approved(approved: crate::approvals::Approved) -> Gate {
    let mut plan = approved.plan;
    grant(&mut plan.request, &approved.capabilities);
    Gate::Run {
        plan,
        report: approved.report,
    }
}
