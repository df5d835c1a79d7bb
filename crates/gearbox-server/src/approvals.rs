//! Pending approvals: runs the `user_confirmed` gear put to a human out of band.
//!
//! An operation binds an unguessable id (UUID v4, 122 random bits) to the SHA-256 of exactly
//! the request that was shown ([`gearbox_engine::policy::request_hash`]). A human approves or rejects
//! it through the local socket (`gearbox approve ID`), or `POST /approvals/ID` on the HTTP
//! daemon; the agent then calls again with the `operation_id` (same arguments) or calls
//! `approval_status`, and the approved run happens once. Operations expire.
//!
//! The local channel is a Unix socket per server process in a 0700 directory; a connection
//! is served only when the peer's uid (`SO_PEERCRED`) is the server's or root's.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gearbox_core::{Capability, Gear};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::audit::{AuditLog, Record};
use crate::plan::RunPlan;
use gearbox_engine::policy::PolicyReport;

/// Most pending operations kept at once; beyond, new asks are refused (never evicted
/// silently).
pub const MAX_PENDING: usize = 1024;
/// Longest request line on the local socket.
const MAX_LINE: usize = 64 * 1024;

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpState {
    Pending,
    Approved,
    Rejected,
    Expired,
    /// Approved and run (an approval is good for one run).
    Used,
}

/// What a caller (agent, human, HTTP client) sees of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OpView {
    pub operation_id: String,
    pub state: OpState,
    /// What the code wants, with the findings: the text the human decides on.
    pub summary: String,
    pub language: String,
    /// SHA-256 of the entrypoint's source, to compare with what the agent shows.
    pub code_sha256: String,
    pub capabilities: Vec<Capability>,
    /// Seconds until it expires (0 once expired or decided and used).
    pub expires_in_secs: u64,
    /// The tenant whose call asked.
    #[serde(default)]
    pub tenant: String,
    /// The gear the run was asked under: approving it runs it at this gear.
    #[serde(default)]
    pub gear: Gear,
    /// Who decided (`local:UID`, an API key's name), once decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// The human's answer, when they gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A pending or decided operation, with the run it binds: the whole plan (request, session,
/// tools), so the approved run is the one that was shown.
struct Op {
    view: OpView,
    /// The tenant whose call asked (an API key's name, `local` on stdio): only its calls may
    /// resume or ask about the operation; to others it does not exist.
    owner: String,
    hash: String,
    expires: Instant,
    plan: RunPlan,
    report: PolicyReport,
}

/// An approved operation handed back for its one run.
pub(crate) struct Approved {
    pub plan: RunPlan,
    pub capabilities: BTreeSet<Capability>,
    pub report: PolicyReport,
}

/// Why an operation cannot be run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeError {
    Unknown,
    Pending(Box<OpView>),
    Rejected(Box<OpView>),
    Expired,
    Used,
    /// The request differs from the approved one.
    Changed,
    /// The run was asked under a gear above the highest the caller may now run at.
    AboveCap {
        gear: Gear,
        cap: Gear,
    },
}

impl std::fmt::Display for TakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TakeError::Unknown => f.write_str("operation_id: no such operation on this server"),
            TakeError::Pending(_) => f.write_str("the operation is still waiting for a human"),
            TakeError::Rejected(v) => write!(
                f,
                "a human rejected the operation{}",
                v.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ),
            TakeError::Expired => f.write_str(
                "operation_id: the operation expired before it was approved and run; call \
                 again without it to ask anew",
            ),
            TakeError::Used => f.write_str(
                "operation_id: that approval was already used (an approval is good for one \
                 run); call again without it to ask anew",
            ),
            TakeError::Changed => f.write_str(
                "operation_id: the code or its arguments differ from what was approved; the \
                 approval covers exactly the request that was shown. Call again without \
                 operation_id to ask for this one",
            ),
            TakeError::AboveCap { gear, cap } => write!(
                f,
                "operation_id: the operation was asked under the {gear} gear, above the \
                 highest gear this caller may run at ({cap}); call again without it"
            ),
        }
    }
}

/// The store of operations of one server.
pub struct Approvals {
    ops: Mutex<HashMap<String, Op>>,
    ttl: Duration,
    audit: Option<Arc<AuditLog>>,
}

/// Whose operations a decider sees: every tenant's (the local socket, an admin key) or one
/// tenant's; to a decider of one tenant, another's operations do not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    All,
    Tenant(&'a str),
}

impl Scope<'_> {
    fn sees(&self, owner: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Tenant(t) => *t == owner,
        }
    }
}

/// Whether `id` looks like an operation id (a UUID v4, hyphenated, lower case). Checked
/// before any lookup so that hostile ids never reach a log or a path.
pub fn valid_id(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok_and(|u| {
        u.get_version_num() == 4 && u.hyphenated().to_string() == id && id.len() == 36
    })
}

impl Approvals {
    pub fn new(ttl: Duration, audit: Option<Arc<AuditLog>>) -> Approvals {
        Approvals {
            ops: Mutex::new(HashMap::new()),
            ttl,
            audit,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Op>> {
        self.ops.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record a new pending operation for `plan`; its view, or an error when too many are
    /// pending.
    pub(crate) fn create(
        &self,
        plan: RunPlan,
        hash: String,
        capabilities: &BTreeSet<Capability>,
        summary: String,
        report: PolicyReport,
        owner: &str,
    ) -> Result<OpView, String> {
        self.sweep();
        let id = uuid::Uuid::new_v4().hyphenated().to_string();
        let view = OpView {
            operation_id: id.clone(),
            state: OpState::Pending,
            summary,
            language: plan.request.language.clone(),
            code_sha256: crate::audit::sha256_hex(plan.request.code.as_bytes()),
            capabilities: capabilities.iter().copied().collect(),
            expires_in_secs: self.ttl.as_secs(),
            tenant: owner.to_string(),
            gear: report.gear,
            decided_by: None,
            reason: None,
        };
        let mut ops = self.lock();
        let pending = ops
            .values()
            .filter(|o| o.view.state == OpState::Pending)
            .count();
        if pending >= MAX_PENDING {
            return Err(format!(
                "{pending} approvals are already pending on this server; decide or let them \
                 expire first"
            ));
        }
        ops.insert(
            id,
            Op {
                view: view.clone(),
                owner: owner.to_string(),
                hash,
                expires: Instant::now() + self.ttl,
                plan,
                report,
            },
        );
        Ok(view)
    }

    /// Approve or reject a pending operation, as the operator (every tenant, no cap).
    pub async fn decide(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        reason: Option<String>,
    ) -> Result<OpView, String> {
        self.decide_as(id, approve, by, reason, Scope::All, None)
            .await
    }

    /// Approve or reject a pending operation of `scope`; a decider capped at `max_gear`
    /// cannot approve a run asked under a higher gear.
    pub async fn decide_as(
        &self,
        id: &str,
        approve: bool,
        by: &str,
        reason: Option<String>,
        scope: Scope<'_>,
        max_gear: Option<Gear>,
    ) -> Result<OpView, String> {
        if !valid_id(id) {
            return Err("not an operation id (expected a UUID v4)".into());
        }
        let reason = reason.map(|r| r.chars().take(2000).collect::<String>());
        self.sweep();
        let view = {
            let mut ops = self.lock();
            let Some(op) = ops.get_mut(id).filter(|op| scope.sees(&op.owner)) else {
                return Err(format!("no operation {id} on this server"));
            };
            if let Some(cap) = max_gear
                && approve
                && op.report.gear > cap
            {
                return Err(format!(
                    "forbidden: operation {id} runs at the {} gear, above this approver's \
                     highest gear ({cap})",
                    op.report.gear
                ));
            }
            if op.view.state != OpState::Pending {
                return Err(format!(
                    "operation {id} is {} already",
                    state_name(op.view.state)
                ));
            }
            op.view.state = if approve {
                OpState::Approved
            } else {
                OpState::Rejected
            };
            op.view.decided_by = Some(by.to_string());
            op.view.reason = reason;
            let mut v = op.view.clone();
            v.expires_in_secs = op
                .expires
                .saturating_duration_since(Instant::now())
                .as_secs();
            v
        };
        self.audit_decision(&view, if approve { "approved" } else { "rejected" }, by)
            .await;
        Ok(view)
    }

    /// The current view of an operation.
    pub fn status(&self, id: &str) -> Option<OpView> {
        self.status_in(id, Scope::All)
    }

    /// The current view of an operation of `scope`.
    pub fn status_in(&self, id: &str, scope: Scope<'_>) -> Option<OpView> {
        if !valid_id(id) {
            return None;
        }
        self.sweep();
        let ops = self.lock();
        ops.get(id).filter(|op| scope.sees(&op.owner)).map(|op| {
            let mut v = op.view.clone();
            v.expires_in_secs = op
                .expires
                .saturating_duration_since(Instant::now())
                .as_secs();
            v
        })
    }

    /// Every operation not yet used, pending first.
    pub fn list(&self) -> Vec<OpView> {
        self.list_in(Scope::All)
    }

    /// The operations of `scope` not yet used, pending first.
    pub fn list_in(&self, scope: Scope<'_>) -> Vec<OpView> {
        self.sweep();
        let ops = self.lock();
        let mut v: Vec<OpView> = ops
            .values()
            .filter(|o| o.view.state != OpState::Used && scope.sees(&o.owner))
            .map(|o| {
                let mut v = o.view.clone();
                v.expires_in_secs = o
                    .expires
                    .saturating_duration_since(Instant::now())
                    .as_secs();
                v
            })
            .collect();
        v.sort_by_key(|o| (o.state != OpState::Pending, o.operation_id.clone()));
        v
    }

    /// Take an approved operation for its one run. With `hash`, the caller's request must be
    /// the approved one; without, the stored request runs (`approval_status`).
    /// Only `tenant`, the tenant that asked, may take it: to any other it is unknown.
    #[cfg(test)]
    pub(crate) fn take(
        &self,
        id: &str,
        hash: Option<&str>,
        tenant: &str,
    ) -> Result<Approved, TakeError> {
        self.take_capped(id, hash, tenant, Gear::FullTrust)
    }

    /// [`Approvals::take`] by a caller whose runs go no higher than `ceiling`: an operation
    /// asked under a higher gear is refused, whoever approved it.
    pub(crate) fn take_capped(
        &self,
        id: &str,
        hash: Option<&str>,
        tenant: &str,
        ceiling: Gear,
    ) -> Result<Approved, TakeError> {
        if !valid_id(id) {
            return Err(TakeError::Unknown);
        }
        self.sweep();
        let mut ops = self.lock();
        let Some(op) = ops.get_mut(id).filter(|op| op.owner == tenant) else {
            return Err(TakeError::Unknown);
        };
        match op.view.state {
            OpState::Pending => return Err(TakeError::Pending(Box::new(op.view.clone()))),
            OpState::Rejected => return Err(TakeError::Rejected(Box::new(op.view.clone()))),
            OpState::Expired => return Err(TakeError::Expired),
            OpState::Used => return Err(TakeError::Used),
            OpState::Approved => {}
        }
        if let Some(h) = hash
            && h != op.hash
        {
            return Err(TakeError::Changed);
        }
        if op.report.gear > ceiling {
            return Err(TakeError::AboveCap {
                gear: op.report.gear,
                cap: ceiling,
            });
        }
        op.view.state = OpState::Used;
        op.expires = Instant::now() + self.ttl;
        let mut report = op.report.clone();
        report.decided_by = "human".into();
        report.operation_id = Some(id.to_string());
        report.granted = op.view.capabilities.clone();
        Ok(Approved {
            plan: op.plan.clone(),
            capabilities: op.view.capabilities.iter().copied().collect(),
            report,
        })
    }

    /// Mark expired operations; forget used and expired ones a TTL later. Expiries are
    /// audited once.
    pub fn sweep(&self) {
        let now = Instant::now();
        let mut expired = Vec::new();
        {
            let mut ops = self.lock();
            ops.retain(|_, op| {
                let gone = matches!(
                    op.view.state,
                    OpState::Used | OpState::Expired | OpState::Rejected
                ) && now > op.expires + self.ttl;
                !gone
            });
            for op in ops.values_mut() {
                if matches!(op.view.state, OpState::Pending | OpState::Approved) && now > op.expires
                {
                    op.view.state = OpState::Expired;
                    op.view.expires_in_secs = 0;
                    // Remembered one more TTL, so a late caller learns "expired".
                    op.expires = now;
                    expired.push(op.view.clone());
                }
            }
        }
        if !expired.is_empty()
            && let Some(log) = self.audit.clone()
        {
            tokio::spawn(async move {
                for v in expired {
                    let mut r = approval_record(&v, "expired", "gearbox");
                    r.reason = Some("the operation expired".into());
                    let _ = log.write(&r).await;
                }
            });
        }
    }

    async fn audit_decision(&self, v: &OpView, what: &'static str, by: &str) {
        if let Some(log) = &self.audit {
            let r = approval_record(v, what, by);
            if let Err(e) = log.write(&r).await {
                tracing::error!(error = %e, "approval decision not audited");
            }
        }
    }

    /// Sweep every `period` until the store is dropped.
    pub fn spawn_sweeper(self: &Arc<Self>, period: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut t = tokio::time::interval(period);
            loop {
                t.tick().await;
                let Some(me) = weak.upgrade() else { return };
                me.sweep();
            }
        });
    }
}

fn state_name(s: OpState) -> &'static str {
    match s {
        OpState::Pending => "pending",
        OpState::Approved => "approved",
        OpState::Rejected => "rejected",
        OpState::Expired => "expired",
        OpState::Used => "used",
    }
}

/// An audit line for a decision about an operation.
pub fn approval_record(v: &OpView, what: &'static str, by: &str) -> Record {
    let mut r = Record::new("approval", by, "local", "approval");
    r.tenant.clone_from(&v.tenant);
    r.gear = Some(v.gear.to_string());
    r.language = Some(v.language.clone());
    r.code_sha256 = Some(v.code_sha256.clone());
    r.status = what.to_string();
    r.approval = Some(what.to_string());
    r.operation_id = Some(v.operation_id.clone());
    r.capabilities = v
        .capabilities
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    r.reason = v.reason.clone();
    r
}

// ---- the local channel -------------------------------------------------------------

/// A request on the local approval socket (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum LocalRequest {
    Approve { id: String, reason: Option<String> },
    Reject { id: String, reason: Option<String> },
    Status { id: String },
    List,
}

/// The answer (one JSON line).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalResponse {
    Ok { operations: Vec<OpView> },
    Error { message: String, unknown: bool },
}

/// The socket of this process in `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(format!("{}.sock", std::process::id()))
}

/// A bound local approval socket; removed on drop.
pub struct LocalChannel {
    path: PathBuf,
}

impl Drop for LocalChannel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Bind the approval socket in `dir` (created 0700) and serve it in the background.
pub fn serve_local(approvals: Arc<Approvals>, dir: &Path) -> std::io::Result<LocalChannel> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    // Parents it creates are traversable (0711): they may be shared with other state
    // directories that sandboxes must reach (the broker's SDK under `/run/gearbox/broker`).
    if let Some(parent) = dir.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(parent)?;
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    {
        use std::os::unix::fs::MetadataExt;
        if meta.uid() != euid() {
            return Err(std::io::Error::other(format!(
                "{} belongs to uid {}, not to this server's uid {}",
                dir.display(),
                meta.uid(),
                euid()
            )));
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(std::io::Error::other(
            "the approval socket needs a running tokio runtime",
        ));
    }
    let path = socket_path(dir);
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let me = euid();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let uid = stream.peer_cred().map(|c| c.uid()).ok();
            if uid != Some(me) && uid != Some(0) {
                tracing::warn!(?uid, "approval socket: refused a peer of another user");
                continue;
            }
            let approvals = approvals.clone();
            let by = format!("local:{}", uid.unwrap_or(me));
            tokio::spawn(async move {
                if let Err(e) = serve_conn(stream, approvals, &by).await {
                    tracing::debug!(error = %e, "approval socket connection");
                }
            });
        }
    });
    Ok(LocalChannel { path })
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

async fn serve_conn(
    stream: tokio::net::UnixStream,
    approvals: Arc<Approvals>,
    by: &str,
) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    let n = tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(r).take(MAX_LINE as u64).read_line(&mut line),
    )
    .await
    .map_err(|_| std::io::Error::other("timed out"))??;
    let resp = if n == 0 {
        return Ok(());
    } else {
        match serde_json::from_str::<LocalRequest>(&line) {
            Err(e) => LocalResponse::Error {
                message: format!("bad request: {e}"),
                unknown: false,
            },
            Ok(LocalRequest::List) => LocalResponse::Ok {
                operations: approvals.list(),
            },
            Ok(LocalRequest::Status { id }) => match approvals.status(&id) {
                Some(v) => LocalResponse::Ok {
                    operations: vec![v],
                },
                None => LocalResponse::Error {
                    message: format!("no operation {} on this server", printable(&id)),
                    unknown: true,
                },
            },
            Ok(LocalRequest::Approve { id, reason }) => {
                decision(&approvals, &id, true, by, reason).await
            }
            Ok(LocalRequest::Reject { id, reason }) => {
                decision(&approvals, &id, false, by, reason).await
            }
        }
    };
    let mut out = serde_json::to_vec(&resp).unwrap_or_default();
    out.push(b'\n');
    w.write_all(&out).await?;
    w.shutdown().await
}

async fn decision(
    approvals: &Approvals,
    id: &str,
    approve: bool,
    by: &str,
    reason: Option<String>,
) -> LocalResponse {
    match approvals.decide(id, approve, by, reason).await {
        Ok(v) => LocalResponse::Ok {
            operations: vec![v],
        },
        Err(message) => LocalResponse::Error {
            unknown: message.starts_with("no operation") || message.starts_with("not an"),
            message,
        },
    }
}

/// At most 64 printable characters of `s`, for messages about hostile input.
pub fn printable(s: &str) -> String {
    s.chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Send `req` to every server socket in `dir`; the answers of those that know the
/// operation (all of them for `List`). Used by `gearbox approve`/`reject`/`approvals`.
pub fn ask_local(dir: &Path, req: &LocalRequest) -> Result<Vec<OpView>, String> {
    use std::io::{BufRead, Write};
    let entries = std::fs::read_dir(dir).map_err(|e| {
        format!(
            "no gearbox server found: cannot read {}: {e} (is `gearbox serve` running as \
             this user, with the same [approvals] socket_dir?)",
            dir.display()
        )
    })?;
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let mut reached = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("sock") {
            continue;
        }
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(&path) else {
            continue;
        };
        reached += 1;
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        if s.write_all(&line).is_err() {
            continue;
        }
        let mut answer = String::new();
        if std::io::BufReader::new(&s).read_line(&mut answer).is_err() {
            continue;
        }
        match serde_json::from_str::<LocalResponse>(&answer) {
            Ok(LocalResponse::Ok { operations }) => out.extend(operations),
            Ok(LocalResponse::Error { unknown: true, .. }) => {}
            Ok(LocalResponse::Error { message, .. }) => errors.push(message),
            Err(e) => errors.push(format!("bad answer from {}: {e}", path.display())),
        }
    }
    if reached == 0 {
        return Err(format!(
            "no gearbox server is listening in {}",
            dir.display()
        ));
    }
    if out.is_empty() && !matches!(req, LocalRequest::List) {
        return Err(errors
            .into_iter()
            .next()
            .unwrap_or_else(|| "no running gearbox server knows that operation".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearbox_core::{ExecRequest, Gear};
    use gearbox_engine::policy;

    fn report() -> PolicyReport {
        PolicyReport {
            gear: Gear::UserConfirmed,
            risk: gearbox_analysis::Risk::Low,
            requested: vec![Capability::Network],
            detected: vec![],
            granted: vec![],
            decided_by: "gear".into(),
            findings: vec![],
            operation_id: None,
        }
    }

    fn pending(a: &Approvals, code: &str) -> (OpView, String) {
        let req = ExecRequest {
            language: "python".into(),
            code: code.into(),
            network: gearbox_core::Network::Any,
            ..Default::default()
        };
        let caps: BTreeSet<_> = [Capability::Network].into();
        let hash = policy::request_hash(&req, &caps);
        let plan = crate::plan::RunPlan {
            request: req,
            backend: None,
            session: None,
            tools: None,
        };
        let v = a
            .create(
                plan,
                hash.clone(),
                &caps,
                "wants network".into(),
                report(),
                "alice",
            )
            .expect("create");
        (v, hash)
    }

    #[tokio::test]
    async fn approve_then_take_once_with_the_same_hash() {
        let a = Approvals::new(Duration::from_secs(60), None);
        let (v, hash) = pending(&a, "print(1)");
        assert!(valid_id(&v.operation_id));
        assert!(matches!(
            a.take(&v.operation_id, Some(&hash), "alice"),
            Err(TakeError::Pending(_))
        ));
        a.decide(&v.operation_id, true, "local:0", None)
            .await
            .expect("approve");
        assert!(matches!(
            a.take(&v.operation_id, Some("0000"), "alice"),
            Err(TakeError::Changed)
        ));
        let ok = a
            .take(&v.operation_id, Some(&hash), "alice")
            .expect("approved");
        assert_eq!(ok.plan.request.code, "print(1)");
        assert!(matches!(
            a.take(&v.operation_id, Some(&hash), "alice"),
            Err(TakeError::Used)
        ));
        assert!(
            a.decide(&v.operation_id, false, "local:0", None)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn another_tenant_cannot_take_or_learn_of_an_operation() {
        let a = Approvals::new(Duration::from_secs(60), None);
        let (v, hash) = pending(&a, "print(4)");
        a.decide(&v.operation_id, true, "local:0", None)
            .await
            .expect("approve");
        assert!(matches!(
            a.take(&v.operation_id, Some(&hash), "bob"),
            Err(TakeError::Unknown)
        ));
        assert!(matches!(
            a.take(&v.operation_id, None, "bob"),
            Err(TakeError::Unknown)
        ));
        a.take(&v.operation_id, None, "alice")
            .expect("its tenant still may");
    }

    #[tokio::test]
    async fn a_decider_sees_its_scope_and_a_cap_bounds_approval_and_run() {
        let a = Approvals::new(Duration::from_secs(60), None);
        let (v, hash) = pending(&a, "print(5)");
        assert_eq!((v.tenant.as_str(), v.gear), ("alice", Gear::UserConfirmed));
        let id = v.operation_id.as_str();
        assert!(a.list_in(Scope::Tenant("bob")).is_empty());
        assert_eq!(a.list_in(Scope::Tenant("alice")).len(), 1);
        assert_eq!(a.list_in(Scope::All).len(), 1);
        assert!(a.status_in(id, Scope::Tenant("bob")).is_none());
        assert!(a.status_in(id, Scope::Tenant("alice")).is_some());
        let e = a
            .decide_as(id, true, "http:b", None, Scope::Tenant("bob"), None)
            .await
            .expect_err("another tenant");
        assert!(e.starts_with("no operation"), "{e}");
        let e = a
            .decide_as(
                id,
                true,
                "http:j",
                None,
                Scope::Tenant("alice"),
                Some(Gear::Restricted),
            )
            .await
            .expect_err("capped approver");
        assert!(e.starts_with("forbidden"), "{e}");
        assert_eq!(a.status(id).map(|v| v.state), Some(OpState::Pending));
        a.decide_as(id, true, "http:h", None, Scope::Tenant("alice"), None)
            .await
            .expect("an approver of the tenant");
        assert!(matches!(
            a.take_capped(id, Some(&hash), "alice", Gear::Restricted),
            Err(TakeError::AboveCap { .. })
        ));
        a.take_capped(id, Some(&hash), "alice", Gear::UserConfirmed)
            .expect("at its gear");
    }

    #[tokio::test]
    async fn rejection_carries_the_answer() {
        let a = Approvals::new(Duration::from_secs(60), None);
        let (v, hash) = pending(&a, "print(2)");
        a.decide(&v.operation_id, false, "local:0", Some("not today".into()))
            .await
            .expect("reject");
        match a.take(&v.operation_id, Some(&hash), "alice") {
            Err(e @ TakeError::Rejected(_)) => assert!(e.to_string().contains("not today")),
            Err(other) => panic!("expected a rejection, got {other:?}"),
            Ok(_) => panic!("expected a rejection, got a run"),
        }
    }

    #[tokio::test]
    async fn operations_expire() {
        let a = Approvals::new(Duration::from_millis(30), None);
        let (v, hash) = pending(&a, "print(3)");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(
            a.status(&v.operation_id).map(|v| v.state),
            Some(OpState::Expired)
        );
        assert!(a.decide(&v.operation_id, true, "x", None).await.is_err());
        assert!(matches!(
            a.take(&v.operation_id, Some(&hash), "alice"),
            Err(TakeError::Expired)
        ));
    }

    #[tokio::test]
    async fn hostile_ids_are_refused_before_lookup() {
        let a = Approvals::new(Duration::from_secs(60), None);
        for id in [
            "",
            "../../etc/passwd",
            "00000000-0000-0000-0000-000000000000",
            "6F9619FF-8B86-4011-B42D-00C04FC964FF",
            "6f9619ff-8b86-1011-b42d-00c04fc964ff",
            "6f9619ff8b864011b42d00c04fc964ff",
        ] {
            assert!(!valid_id(id), "{id}");
            assert!(a.decide(id, true, "x", None).await.is_err());
            assert!(a.status(id).is_none());
        }
    }

    #[tokio::test]
    async fn the_local_socket_approves_and_lists() {
        let dir = std::env::temp_dir().join(format!("gearbox-approvals-{}", uuid::Uuid::new_v4()));
        let a = Arc::new(Approvals::new(Duration::from_secs(60), None));
        let _ch = serve_local(a.clone(), &dir).expect("bind");
        let (v, _) = pending(&a, "print(4)");
        let d = dir.clone();
        let list = tokio::task::spawn_blocking(move || ask_local(&d, &LocalRequest::List))
            .await
            .expect("join")
            .expect("list");
        assert!(list.iter().any(|o| o.operation_id == v.operation_id));
        let d = dir.clone();
        let id = v.operation_id.clone();
        let done = tokio::task::spawn_blocking(move || {
            ask_local(
                &d,
                &LocalRequest::Approve {
                    id,
                    reason: Some("fine".into()),
                },
            )
        })
        .await
        .expect("join")
        .expect("approve");
        assert_eq!(done[0].state, OpState::Approved);
        assert!(
            done[0]
                .decided_by
                .as_deref()
                .unwrap_or("")
                .starts_with("local:")
        );
        let d = dir.clone();
        let err = tokio::task::spawn_blocking(move || {
            ask_local(
                &d,
                &LocalRequest::Approve {
                    id: "../../x".into(),
                    reason: None,
                },
            )
        })
        .await
        .expect("join")
        .expect_err("hostile id");
        assert!(!err.is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
