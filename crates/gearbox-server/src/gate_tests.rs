//! The gate in process: a [`GearboxServer`] and rmcp's client over an in-memory pipe, for
//! the paths that refuse or hold a call before anything runs (no sandbox, no binary). What
//! runs is tested against the real binary in `crates/gearbox/tests/mcp`.

use std::sync::Arc;

use gearbox_core::Gear;
use gearbox_engine::{Config, Engine};
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::{GearboxServer, ServeOptions};

struct InProcess {
    client: RunningService<RoleClient, ()>,
    server: GearboxServer,
}

/// A server of `gear` (no warm pool, no approval socket) and a client connected to it.
async fn connect(gear: Gear) -> InProcess {
    let config = Config {
        gear,
        pool: gearbox_engine::PoolConfig::only([]),
        ..Config::default()
    };
    // Nothing here runs code, so the helper binary is never started.
    let engine = Arc::new(Engine::new(config, "/nonexistent/gearbox".into()));
    let server = GearboxServer::new(engine, ServeOptions::default());
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let serving = server.clone();
    tokio::spawn(async move {
        if let Ok(running) = serving.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let client = ().serve(client_io).await.expect("initialize in process");
    InProcess { client, server }
}

async fn call(s: &InProcess, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    s.client
        .call_tool(
            CallToolRequestParams::new("execute_code").with_arguments(JsonObject::from(args)),
        )
        .await
        .expect("tools/call")
}

fn outcome(r: &CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structuredContent")
}

#[tokio::test]
async fn read_only_runs_nothing() {
    let s = connect(Gear::ReadOnly).await;
    let r = call(&s, json!({"language": "python", "code": "print(1)"})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(outcome(&r)["status"], "denied");
    assert!(
        outcome(&r)["reason"]
            .as_str()
            .unwrap_or("")
            .contains("read_only"),
        "{r:?}"
    );
}

#[tokio::test]
async fn restricted_refuses_what_the_call_asks_for_and_what_analysis_finds() {
    let s = connect(Gear::Restricted).await;
    let r = call(
        &s,
        json!({"language": "python", "code": "print(1)", "network": true}),
    )
    .await;
    assert_eq!(outcome(&r)["status"], "denied");
    assert!(
        outcome(&r)["reason"]
            .as_str()
            .unwrap_or("")
            .contains("network"),
        "{r:?}"
    );
    let r = call(
        &s,
        json!({"language": "python", "code": "import urllib.request\nurllib.request.urlopen('http://x')\n"}),
    )
    .await;
    let v = outcome(&r);
    assert_eq!(v["status"], "denied", "{v}");
    assert_eq!(v["policy"]["detected"], json!(["network"]), "{v}");
    assert!(
        v["reason"].as_str().unwrap_or("").contains("main.py:1"),
        "{v}"
    );
}

#[tokio::test]
async fn a_call_may_not_raise_the_gear() {
    let s = connect(Gear::Restricted).await;
    let r = call(
        &s,
        json!({"language": "python", "code": "print(1)", "gear": "full_trust"}),
    )
    .await;
    let v = outcome(&r);
    assert_eq!(v["status"], "denied", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap_or("")
            .contains("above this server's gear"),
        "{v}"
    );
}

/// user_confirmed puts a network run on hold; the approval binds the exact request: the
/// same id with other code is refused, and is still good for the code that was shown.
#[tokio::test]
async fn user_confirmed_holds_a_run_and_binds_the_approval_to_it() {
    let s = connect(Gear::UserConfirmed).await;
    let ask = json!({"language": "python", "code": "print(1)", "network": true});
    let r = call(&s, ask.clone()).await;
    let v = outcome(&r);
    assert_eq!(v["status"], "pending_approval", "{v}");
    assert_ne!(r.is_error, Some(true), "waiting is not an error");
    let id = v["operation_id"]
        .as_str()
        .expect("operation_id")
        .to_string();
    s.server
        .approvals()
        .decide(&id, true, "test", None)
        .await
        .expect("approve");
    let mut changed = ask.clone();
    changed["code"] = json!("print(2)");
    changed["operation_id"] = json!(id);
    let r = call(&s, changed).await;
    let v = outcome(&r);
    assert_eq!(v["status"], "denied", "{v}");
    assert!(v["reason"].as_str().unwrap_or("").contains("differ"), "{v}");
    // A different session or tools spec would differ the same way; without targets,
    // allow_tools is refused before the gear is asked.
    let mut tools = ask.clone();
    tools["allow_tools"] = json!(["everything/echo"]);
    let r = call(&s, tools).await;
    let v = outcome(&r);
    assert_eq!(v["status"], "denied", "{v}");
    assert!(
        v["reason"]
            .as_str()
            .unwrap_or("")
            .contains("no downstream servers"),
        "{v}"
    );
}

#[tokio::test]
async fn argument_errors_name_the_field_before_any_gear() {
    let s = connect(Gear::FullTrust).await;
    let r = call(&s, json!({"language": "python", "code": 5})).await;
    assert_eq!(r.is_error, Some(true));
    let text: String = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert!(text.contains("code"), "{text}");
}
