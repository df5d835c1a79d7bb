//! `/approvals`: humans approve or reject pending runs over HTTP.
//!
//! Only admin keys (`[http.keys.NAME] admin = true`, a token with the admin scope) and the
//! API keys named in `[approvals] http_approvers` may list or decide; every other caller
//! (anonymous included) gets 403, so the key an agent uses for `/mcp` cannot approve its own
//! runs unless the operator made it an approver. An approver that is not an admin sees and
//! decides only its own tenant's operations (another tenant's are "not found"), and cannot
//! approve a run asked under a gear above its own highest gear.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use crate::Caller;
use crate::approvals::{Scope, printable, valid_id};

/// The body of `POST /approvals/ID`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// `approve` or `reject`.
    pub decision: String,
    /// Words for the agent.
    pub reason: Option<String>,
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

/// The caller when it may decide approvals.
#[allow(
    clippy::result_large_err,
    reason = "the error is the HTTP answer itself"
)]
fn approver(state: &AppState, caller: Option<&Caller>) -> Result<Caller, Response> {
    let allowed = &state.server.engine().config().approvals.http_approvers;
    // `http_approvers` names API keys: a token whose subject has a listed name is not one.
    let is_key = |c: &Caller| state.auth.keys.names().contains(&c.name.as_str());
    match caller {
        Some(c) if c.admin || (is_key(c) && allowed.contains(&c.name)) => Ok(c.clone()),
        _ => Err(error(
            StatusCode::FORBIDDEN,
            "forbidden: this API key may not decide approvals (mark it admin, or list its \
             name in [approvals] http_approvers)",
        )),
    }
}

/// Whose operations `c` sees: an admin every tenant's, an approver its own tenant's.
fn scope(c: &Caller) -> Scope<'_> {
    if c.admin {
        Scope::All
    } else {
        Scope::Tenant(&c.tenant)
    }
}

/// `GET /approvals`: the operations not yet used, pending first.
pub async fn list(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
) -> Response {
    let c = match approver(&state, caller.as_ref().map(|c| &c.0)) {
        Ok(c) => c,
        Err(r) => return r,
    };
    Json(state.server.approvals().list_in(scope(&c))).into_response()
}

/// `GET /approvals/ID`.
pub async fn show(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    Path(id): Path<String>,
) -> Response {
    let c = match approver(&state, caller.as_ref().map(|c| &c.0)) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if !valid_id(&id) {
        return error(
            StatusCode::BAD_REQUEST,
            "not an operation id (expected a UUID v4)",
        );
    }
    match state.server.approvals().status_in(&id, scope(&c)) {
        Some(v) => Json(v).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no operation {id}")),
    }
}

/// `POST /approvals/ID` with `{"decision": "approve"|"reject", "reason": "..."}`.
pub async fn decide(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    Path(id): Path<String>,
    body: Result<Json<DecisionBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let by = match approver(&state, caller.as_ref().map(|c| &c.0)) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if !valid_id(&id) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("not an operation id: {:?}", printable(&id)),
        );
    }
    let Json(body) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("bad body: {e}")),
    };
    let approve = match body.decision.as_str() {
        "approve" => true,
        "reject" => false,
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "decision: expected \"approve\" or \"reject\", got {:?}",
                    printable(other)
                ),
            );
        }
    };
    match state
        .server
        .approvals()
        .decide_as(
            &id,
            approve,
            &format!("http:{}", by.name),
            body.reason,
            scope(&by),
            by.max_gear,
        )
        .await
    {
        Ok(v) => Json(v).into_response(),
        Err(m) if m.starts_with("no operation") => error(StatusCode::NOT_FOUND, m),
        Err(m) if m.starts_with("forbidden") => error(StatusCode::FORBIDDEN, m),
        Err(m) => error(StatusCode::CONFLICT, m),
    }
}
