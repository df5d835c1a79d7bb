//! `/approvals`: humans approve or reject pending runs over HTTP.
//!
//! Only the API keys named in `[approvals] http_approvers` may list or decide; every other
//! caller (anonymous included) gets 403, so the key an agent uses for `/mcp` cannot approve
//! its own runs unless the operator made it an approver.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::AppState;
use crate::Caller;
use crate::approvals::{printable, valid_id};

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

/// The caller's key name when it may decide approvals.
#[allow(
    clippy::result_large_err,
    reason = "the error is the HTTP answer itself"
)]
fn approver(state: &AppState, caller: Option<&Caller>) -> Result<String, Response> {
    let name = caller.map(|c| c.0.clone()).unwrap_or_default();
    let allowed = &state.server.engine().config().approvals.http_approvers;
    if !name.is_empty() && name != "anonymous" && allowed.contains(&name) {
        Ok(name)
    } else {
        Err(error(
            StatusCode::FORBIDDEN,
            "forbidden: this API key may not decide approvals (list its name in [approvals] \
             http_approvers)",
        ))
    }
}

/// `GET /approvals`: the operations not yet used, pending first.
pub async fn list(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
) -> Response {
    if let Err(r) = approver(&state, caller.as_ref().map(|c| &c.0)) {
        return r;
    }
    Json(state.server.approvals().list()).into_response()
}

/// `GET /approvals/ID`.
pub async fn show(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    Path(id): Path<String>,
) -> Response {
    if let Err(r) = approver(&state, caller.as_ref().map(|c| &c.0)) {
        return r;
    }
    if !valid_id(&id) {
        return error(
            StatusCode::BAD_REQUEST,
            "not an operation id (expected a UUID v4)",
        );
    }
    match state.server.approvals().status(&id) {
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
        Ok(n) => n,
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
        .decide(&id, approve, &format!("http:{by}"), body.reason)
        .await
    {
        Ok(v) => Json(v).into_response(),
        Err(m) if m.starts_with("no operation") => error(StatusCode::NOT_FOUND, m),
        Err(m) => error(StatusCode::CONFLICT, m),
    }
}
