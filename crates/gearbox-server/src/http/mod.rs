//! `gearbox serve --http`: the MCP server over HTTP.
//!
//! | route | what | key |
//! |---|---|---|
//! | `/mcp` | Streamable HTTP (rmcp's `StreamableHttpService`): session-based revisions up to 2025-11-25 and the stateless 2026-07-28 one on the same endpoint | yes |
//! | `/sse`, `/messages` | the 2024-11-05 HTTP+SSE transport ([`sse`]) | yes |
//! | `/metrics` | Prometheus text format | yes |
//! | `/healthz` | alive | no |
//! | `/readyz` | can execute: a backend works and the audit log is writable | no |
//! | `/approvals`, `/approvals/{id}` | human approvals ([`approvals`]) | yes |
//! | `/.well-known/oauth-protected-resource[/mcp]` | Protected Resource Metadata, with `[http.oauth]` ([`oauth`]) | no |
//!
//! "key" means: when API keys or `[http.oauth]` are configured ([`auth`]). In a fleet, a
//! request on `/mcp` for a session another replica owns is forwarded to it ([`fleet`]).
//! [`app`] builds the whole router so
//! tests can drive it without a socket; [`serve`] adds the listener: a connection limit,
//! header and body timeouts, and graceful shutdown on SIGTERM/SIGINT.

mod approvals;
pub mod auth;
pub mod fleet;
pub mod oauth;
pub mod sse;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use gearbox_engine::config::HttpConfig;
use hyper_util::rt::{TokioIo, TokioTimer};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::{GearboxServer, TransportName};
pub use auth::{ApiKeys, Auth};

/// Port used when neither `--http` nor `PORT` gives one.
pub const DEFAULT_PORT: u16 = 8080;
/// Most of the shutdown goes to running calls; this is what is left for closing
/// connections and flushing the audit log.
const SHUTDOWN_TAIL: Duration = Duration::from_secs(2);
/// How long a `/readyz` backend probe is reused.
const PROBE_TTL: Duration = Duration::from_secs(30);

/// Resolve `--http ADDR`: `HOST:PORT`, `HOST` (port from `PORT`, else 8080), `:PORT`, or
/// empty (loopback). `port_env` is the value of `PORT`.
pub fn resolve_addr(given: &str, port_env: Option<&str>) -> anyhow::Result<SocketAddr> {
    let given = given.trim();
    let env_port = || -> anyhow::Result<u16> {
        match port_env.map(str::trim).filter(|p| !p.is_empty()) {
            Some(p) => p
                .parse()
                .with_context(|| format!("PORT={p:?} is not a port number")),
            None => Ok(DEFAULT_PORT),
        }
    };
    if given.is_empty() {
        return Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), env_port()?));
    }
    if let Ok(a) = given.parse::<SocketAddr>() {
        return Ok(a);
    }
    let host = given.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, env_port()?));
    }
    if let Some(port) = given.strip_prefix(':') {
        let port = port
            .parse()
            .with_context(|| format!("--http {given:?}: bad port"))?;
        return Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
    }
    let (host, port) = match given.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse()
                .with_context(|| format!("--http {given:?}: bad port"))?,
        ),
        None => (given, env_port()?),
    };
    if host == "localhost" {
        return Ok(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
    }
    bail!("--http {given:?}: give an IP address (such as 127.0.0.1 or 0.0.0.0), not a host name")
}

/// Everything the routes share.
#[derive(Clone)]
pub struct AppState {
    pub server: GearboxServer,
    pub auth: Arc<Auth>,
    pub config: HttpConfig,
    /// Cancelled at shutdown: ends every MCP session.
    pub shutdown: CancellationToken,
    pub sse_sessions: Arc<sse::Sessions>,
    /// This replica's name and its peers (none for a single server).
    pub fleet: Arc<fleet::Fleet>,
    /// MCP POSTs whose response is still being written (a tool call's answer among them).
    pub responding: Arc<Responding>,
    probe: Arc<Mutex<Option<Probe>>>,
}

/// Counts MCP POSTs from their arrival until their response body has been sent or dropped,
/// and the requests of legacy SSE sessions until their answer has gone out on the session's
/// stream (`sse.rs`), so that shutdown ends the sessions only after the last running call's
/// answer went out (a run's slot is freed before its answer is written).
#[derive(Default)]
pub struct Responding {
    open: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Held for one POST; dropped with its response body.
pub(crate) struct RespondingGuard(Arc<Responding>);

impl Drop for RespondingGuard {
    fn drop(&mut self) {
        if self
            .0
            .open
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
        {
            self.0.idle.notify_waiters();
        }
    }
}

impl Responding {
    pub(crate) fn enter(self: &Arc<Self>) -> RespondingGuard {
        self.open.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        RespondingGuard(self.clone())
    }

    /// POSTs still answering now.
    pub fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Wait up to `limit` for every POST to have been answered; true if they all were.
    pub async fn drained(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.idle.notified();
                tokio::pin!(idle);
                idle.as_mut().enable();
                if self.open() == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }
}

/// Track a POST until its response body is done (see [`Responding`]).
async fn track_responses(
    State(responding): State<Arc<Responding>>,
    req: Request<Body>,
    next: Next,
) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let guard = responding.enter();
    let resp = next.run(req).await;
    // A body of known size (a JSON answer, a 202) is whole already: left as it is, with its
    // Content-Length. A stream (SSE) is tracked until it ends.
    if axum::body::HttpBody::size_hint(resp.body())
        .exact()
        .is_some()
    {
        return resp;
    }
    resp.map(|body| {
        Body::from_stream(futures::StreamExt::map(
            body.into_data_stream(),
            move |chunk| {
                let _held = &guard;
                chunk
            },
        ))
    })
}

/// When the backend was last probed, and what it said.
type Probe = (Instant, Result<(), String>);

impl AppState {
    pub fn new(server: GearboxServer, keys: ApiKeys, config: HttpConfig) -> AppState {
        let oauth = config.oauth.clone().map(oauth::OAuth::new);
        AppState {
            server,
            auth: Arc::new(Auth { keys, oauth }),
            config,
            shutdown: CancellationToken::new(),
            sse_sessions: Arc::new(sse::Sessions::default()),
            fleet: Arc::new(fleet::Fleet::default()),
            responding: Arc::new(Responding::default()),
            probe: Arc::new(Mutex::new(None)),
        }
    }

    /// Serve as a replica of `fleet`.
    pub fn with_fleet(mut self, fleet: fleet::Fleet) -> AppState {
        self.fleet = Arc::new(fleet);
        self
    }
}

fn json(status: StatusCode, v: serde_json::Value) -> Response {
    (status, axum::Json(v)).into_response()
}

/// A JSON-RPC error as a whole HTTP answer: `status`, and the error for `id` as the body.
fn rpc_error(status: StatusCode, id: serde_json::Value, code: i64, message: String) -> Response {
    json(
        status,
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": { "code": code, "message": message },
        }),
    )
}

/// A request's whole body, at most `limit` bytes (the body limit layer outside bounds every
/// body already; a middleware that reads one before the transport passes `usize::MAX`, or
/// its own bound); past it, the 413 to answer.
pub(crate) async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes, Response> {
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| (StatusCode::PAYLOAD_TOO_LARGE, "request body too large").into_response())
}

/// The Protected Resource Metadata (RFC 9728); 404 without `[http.oauth]`.
async fn resource_metadata(State(state): State<AppState>) -> Response {
    match &state.auth.oauth {
        Some(o) => json(StatusCode::OK, o.metadata()),
        None => (StatusCode::NOT_FOUND, "not found").into_response(),
    }
}

async fn healthz() -> Response {
    json(StatusCode::OK, serde_json::json!({"status": "ok"}))
}

/// Whether the default backend works here, cached for [`PROBE_TTL`].
async fn backend_ready(state: &AppState) -> Result<(), String> {
    if let Some((at, r)) = state
        .probe
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        && at.elapsed() < PROBE_TTL
    {
        return r.clone();
    }
    let engine = state.server.engine().clone();
    let kind = engine.config().backend;
    let result = tokio::task::spawn_blocking(move || {
        let reports = engine.probe();
        match reports.iter().find(|r| r.backend == kind) {
            Some(r) if r.available => Ok(()),
            Some(r) => Err(format!(
                "backend {kind} is not available: {}",
                r.details.join("; ")
            )),
            None => Err(format!("backend {kind} is not in this build")),
        }
    })
    .await
    .unwrap_or_else(|e| Err(format!("probing the backend: {e}")));
    *state.probe.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), result.clone()));
    result
}

async fn readyz(State(state): State<AppState>) -> Response {
    let backend = backend_ready(&state).await;
    let audit = match state.server.audit() {
        Some(log) => log.ready().await,
        None => Ok(()),
    };
    let closing = state.shutdown.is_cancelled() || state.server.limiter().is_closed();
    let mut reasons = Vec::new();
    if let Err(e) = &backend {
        reasons.push(e.clone());
    }
    if let Err(e) = &audit {
        reasons.push(format!("{e}; executions are refused"));
    }
    if closing {
        reasons.push("shutting down".to_string());
    }
    let ready = reasons.is_empty();
    json(
        if ready {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        serde_json::json!({
            "status": if ready { "ready" } else { "not ready" },
            "reasons": reasons,
            "backend": state.server.engine().config().backend.as_str(),
            "audit_log": state.server.audit().map(|a| a.path().display().to_string()),
            "running": state.server.limiter().running(),
            "queued": state.server.limiter().queued(),
        }),
    )
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state
        .server
        .metrics()
        .encode(state.server.limiter(), &state.server.engine().pool_stats());
    let mut r = (StatusCode::OK, text).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    r
}

/// Middleware: count each answer by route and status.
async fn count_http(State(state): State<AppState>, req: Request<Body>, next: Next) -> Response {
    let path = req.uri().path();
    let route = match path {
        "/mcp" | "/sse" | "/messages" | "/metrics" | "/healthz" | "/readyz" | "/approvals" => {
            path.to_string()
        }
        p if p.starts_with(oauth::PRM_PATH) => oauth::PRM_PATH.to_string(),
        _ => "other".to_string(),
    };
    let resp = next.run(req).await;
    state.server.metrics().http(&route, resp.status().as_u16());
    resp
}

/// The answer a transport sends when a call would be refused anyway: 429 when the
/// tenant is over one of its quotas, else 503 (busy, shutting down).
fn busy_response(refusal: &crate::limiter::Refusal, id: serde_json::Value) -> Response {
    let retry = refusal.retry_after_s();
    let status = if refusal.quota().is_some() {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut r = rpc_error(status, id, -32000, refusal.to_string());
    if let Ok(v) = HeaderValue::from_str(&retry.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// Middleware: a POST to `/mcp` whose JSON body cannot be read is a `400 Bad Request` with a
/// JSON-RPC error (`id` null), as the official TypeScript and Python SDKs' servers answer:
/// `-32700 Parse error` when the body is not JSON, `-32600 Invalid Request` when it is JSON
/// but no JSON-RPC message (for the request's own id, saying what is wrong, when it is a
/// request of the wrong shape or too deep to read with an id that can be answered:
/// `request_shape.rs`; saying so for a batch). The transport alone answers all of these
/// `415 Unsupported Media Type`, which tells a client its content type was wrong when it was
/// not; with a JSON content type a 415 can only be that, so only then is the body looked at
/// again (a call the transport reads pays nothing more than the body held for the while).
/// A body of another content type is left to the transport.
async fn unreadable_body_is_bad_request(
    State(state): State<AppState>,
    req: Request<Body>,
    next: Next,
) -> Response {
    let json_body = req.method() == axum::http::Method::POST
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if !json_body {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, state.config.max_body_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes.clone())))
        .await;
    if response.status() != StatusCode::UNSUPPORTED_MEDIA_TYPE {
        return response;
    }
    let (id, code, message) = match serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        Err(e) => (serde_json::Value::Null, -32700, format!("Parse error: {e}")),
        // A request whose id can be answered: its caller learns what is wrong with it.
        Ok(_) => match crate::request_shape::unreadable_request(&bytes) {
            Some((id, why)) => (
                id.into_json_value(),
                -32600,
                format!("Invalid Request: {why}"),
            ),
            None if bytes.trim_ascii_start().starts_with(b"[") => (
                serde_json::Value::Null,
                -32600,
                "Invalid Request: a JSON-RPC batch; over HTTP, send one message per request"
                    .to_string(),
            ),
            None => (
                serde_json::Value::Null,
                -32600,
                "Invalid Request: the body is JSON but not a JSON-RPC message".to_string(),
            ),
        },
    };
    rpc_error(StatusCode::BAD_REQUEST, id, code, message)
}

/// Middleware: a `DELETE` that ended an MCP session answers 200, as the official SDKs'
/// servers do (their clients treat anything but 200 and 204 as a failed termination); the
/// transport's own answer is 202.
async fn session_deleted_ok(req: Request<Body>, next: Next) -> Response {
    let delete = req.method() == axum::http::Method::DELETE;
    let mut response = next.run(req).await;
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// Middleware: when no run slot or queue place is free, answer a `tools/call` POST with 503
/// and `Retry-After` before the transport accepts it; when the caller's tenant is over a
/// quota that bounds runs (its runs at once and waiting, runs per minute, CPU per hour),
/// answer a `tools/call` of a tool that runs code with 429 and `Retry-After`. The server
/// still refuses with a tool error when the budget fills between this check and the call.
async fn shed_load(State(state): State<AppState>, req: Request<Body>, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let tenant = req
        .extensions()
        .get::<crate::Caller>()
        .map_or_else(|| "anonymous".to_string(), |c| c.tenant.clone());
    let Some(refusal) = state.server.would_refuse(&tenant) else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, state.config.max_body_bytes).await {
        Ok(b) => b,
        Err(too_large) => return too_large,
    };
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        let calls: Vec<&serde_json::Value> = match &v {
            serde_json::Value::Array(items) => items.iter().collect(),
            one => vec![one],
        };
        let quota = refusal.quota().is_some();
        if let Some(call) = calls.iter().find(|m| {
            m.get("method").and_then(|m| m.as_str()) == Some("tools/call")
                && (!quota
                    || m.pointer("/params/name")
                        .and_then(|n| n.as_str())
                        .is_some_and(|n| state.server.runs_code(n)))
        }) {
            if let Some(q) = refusal.quota() {
                state.server.metrics().error("quota");
                state.server.metrics().tenant_refusal(&tenant, q);
            } else {
                state.server.metrics().error("busy");
            }
            let id = call.get("id").cloned().unwrap_or(serde_json::Value::Null);
            return busy_response(&refusal, id);
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// Middleware for the SSE routes: the Host and Origin checks rmcp applies to `/mcp`.
async fn check_host_origin(
    State(state): State<AppState>,
    req: Request<Body>,
    next: Next,
) -> Response {
    if let Err(msg) = host_origin_ok(req.headers(), &state.config) {
        tracing::warn!(%msg, "refused a request (possible DNS rebinding or cross-origin)");
        return (StatusCode::FORBIDDEN, msg).into_response();
    }
    next.run(req).await
}

fn host_origin_ok(headers: &axum::http::HeaderMap, cfg: &HttpConfig) -> Result<(), String> {
    if !cfg.allowed_hosts.is_empty() {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .ok_or("Forbidden: missing Host header")?;
        let authority: axum::http::uri::Authority = host
            .parse()
            .map_err(|_| "Forbidden: invalid Host header".to_string())?;
        let name = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let ok = cfg.allowed_hosts.iter().any(|a| {
            let a = a.to_ascii_lowercase();
            a == name || a == host.to_ascii_lowercase()
        });
        if !ok {
            return Err("Forbidden: Host header is not allowed".into());
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin
            .to_str()
            .map_err(|_| "Forbidden: invalid Origin header".to_string())?;
        if !origin_allowed(origin, &cfg.allowed_origins) {
            return Err("Forbidden: Origin header is not allowed".into());
        }
    }
    Ok(())
}

/// `origin` (`scheme://host[:port]`) against entries with an exact port, `:*`, or no port.
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    fn split(o: &str) -> Option<(String, String, Option<String>)> {
        let (scheme, rest) = o.split_once("://")?;
        let rest = rest.trim_end_matches('/');
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            let (h, tail) = r.split_once(']')?;
            (format!("[{h}]"), tail.strip_prefix(':').map(str::to_string))
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p.to_string())),
                None => (rest.to_string(), None),
            }
        };
        Some((scheme.to_ascii_lowercase(), host.to_ascii_lowercase(), port))
    }
    let Some((scheme, host, port)) = split(origin) else {
        return false;
    };
    let port = port.unwrap_or_else(|| if scheme == "https" { "443" } else { "80" }.into());
    allowed.iter().any(|a| match split(a) {
        Some((s, h, p)) => {
            s == scheme && h == host && p.as_deref().is_none_or(|p| p == "*" || p == port)
        }
        None => a == origin,
    })
}

fn transport_layer(
    name: &'static str,
) -> impl Fn(Request<Body>, Next) -> std::pin::Pin<Box<dyn Future<Output = Response> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |mut req: Request<Body>, next: Next| {
        req.extensions_mut().insert(TransportName(name));
        Box::pin(next.run(req))
    }
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    let cfg = &state.config;
    let mut rmcp_cfg = StreamableHttpServerConfig::default()
        .with_cancellation_token(state.shutdown.child_token())
        .with_max_request_body_bytes(cfg.max_body_bytes)
        .with_allowed_origins(cfg.allowed_origins.clone())
        .enforce_origin_validation();
    rmcp_cfg = if cfg.allowed_hosts.is_empty() {
        rmcp_cfg.disable_allowed_hosts()
    } else {
        rmcp_cfg.with_allowed_hosts(cfg.allowed_hosts.clone())
    };
    let server = state.server.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(fleet::ReplicaSessions::new(state.fleet.replica())),
        rmcp_cfg,
    );
    let sse_state = sse::SseState {
        server: state.server.clone(),
        sessions: state.sse_sessions.clone(),
        shutdown: state.shutdown.child_token(),
        responding: state.responding.clone(),
    };
    let keyed = |r: Router| {
        r.layer(middleware::from_fn_with_state(
            state.auth.clone(),
            auth::require_key,
        ))
    };
    let mcp_routes = Router::new()
        .route_service("/mcp", any_service(mcp))
        .layer(middleware::from_fn(session_deleted_ok))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            unreadable_body_is_bad_request,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), shed_load))
        .layer(middleware::from_fn(transport_layer("http")))
        // After the key check, before load shedding: the owner sheds its own load.
        .layer(middleware::from_fn_with_state(
            state.fleet.clone(),
            fleet::route,
        ))
        .layer(middleware::from_fn_with_state(
            state.responding.clone(),
            track_responses,
        ));
    let sse_routes = Router::new()
        .route("/sse", get(sse::open))
        .route("/messages", post(sse::post))
        .with_state(sse_state)
        .layer(middleware::from_fn_with_state(state.clone(), shed_load))
        .layer(middleware::from_fn(transport_layer("sse")))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            check_host_origin,
        ));
    let metrics_routes = Router::new()
        .route("/metrics", get(metrics))
        .route("/approvals", get(approvals::list))
        .route(
            "/approvals/{id}",
            get(approvals::show).post(approvals::decide),
        )
        .with_state(state.clone());
    let open = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route(oauth::PRM_PATH, get(resource_metadata))
        .route(&format!("{}/mcp", oauth::PRM_PATH), get(resource_metadata))
        .with_state(state.clone());
    Router::new()
        .merge(keyed(mcp_routes.merge(sse_routes).merge(metrics_routes)))
        .merge(open)
        .fallback(any(|| async { (StatusCode::NOT_FOUND, "not found") }))
        .layer(middleware::from_fn_with_state(state.clone(), count_http))
        .layer(RequestBodyTimeoutLayer::new(Duration::from_millis(
            state.config.body_timeout_ms,
        )))
        .layer(RequestBodyLimitLayer::new(state.config.max_body_bytes))
}

fn any_service<S>(svc: S) -> axum::routing::MethodRouter
where
    S: tower::Service<Request<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Response: IntoResponse + 'static,
    S::Future: Send + 'static,
{
    axum::routing::any_service(svc)
}

/// Wait for SIGTERM or SIGINT.
async fn signalled() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// Serve `state` on `listener` until SIGTERM/SIGINT (or `stop` is cancelled), then shut
/// down: stop accepting, let running calls finish for `shutdown_grace_ms`, cancel the rest
/// (their sandboxes are killed), close the connections and flush the audit log.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    state.server.broker_startup()?;
    let cfg = state.config.clone();
    let router = app(state.clone());
    let connections = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let signal = signalled();
    tokio::pin!(signal);
    let why = loop {
        let permit = tokio::select! {
            p = connections.clone().acquire_owned() => p.context("connection limit closed")?,
            s = &mut signal => break s,
            () = stop.cancelled() => break "stop requested",
        };
        let (stream, peer) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            s = &mut signal => break s,
            () = stop.cancelled() => break "stop requested",
        };
        let _ = stream.set_nodelay(true);
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(cfg.header_timeout_ms))
            .max_buf_size(64 * 1024);
        let conn = builder.serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    };
    drop(listener);
    let started = Instant::now();
    tracing::info!(signal = why, "shutting down: no new connections or runs");
    let limiter = state.server.limiter().clone();
    limiter.close();
    let grace = Duration::from_millis(cfg.shutdown_grace_ms);
    if limiter.drained(grace).await {
        tracing::info!("every running call finished");
        // A run's slot is freed before its answer is written: let the answers go out
        // before the sessions end.
        if !state.responding.drained(SHUTDOWN_TAIL).await {
            tracing::warn!(
                responding = state.responding.open(),
                "answers still being written; ending the sessions"
            );
        }
    } else {
        tracing::warn!(
            running = limiter.running(),
            "grace period over; cancelling the calls still running (their sandboxes are killed)"
        );
    }
    state.shutdown.cancel();
    if !limiter.drained(Duration::from_secs(1)).await {
        tracing::warn!(
            running = limiter.running(),
            "runs still ending after cancellation"
        );
    }
    if tokio::time::timeout(SHUTDOWN_TAIL, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after shutdown; closing them");
    }
    if let Some(log) = state.server.audit()
        && let Err(e) = log.flush().await
    {
        tracing::error!(error = %e, "flushing the audit log at shutdown");
    }
    tracing::info!(took_ms = started.elapsed().as_millis() as u64, "shut down");
    Ok(())
}

/// Bind `addr`, say where on stderr, and serve until SIGTERM/SIGINT.
pub async fn run(
    server: GearboxServer,
    addr: SocketAddr,
    keys: ApiKeys,
    insecure_no_auth: bool,
) -> anyhow::Result<()> {
    let config = server.engine().config().http.clone();
    check_exposure(addr, &keys, config.oauth.is_some(), insecure_no_auth)?;
    let fleet = fleet::Fleet::from_config(
        &config,
        std::env::var(fleet::ENV_REPLICA).ok(),
        std::env::var(fleet::ENV_PEER_SECRET).ok(),
    )?;
    if let Some(name) = fleet.replica() {
        gearbox_sessions::set_replica(name).map_err(anyhow::Error::msg)?;
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let local = listener.local_addr().context("reading the bound address")?;
    tracing::info!(
        %local,
        keys = ?keys.names(),
        oauth_issuer = ?config.oauth.as_ref().map(|o| o.issuer.as_str()),
        tools = ?server.tool_names(),
        audit = ?server.audit().map(|a| a.path().to_path_buf()),
        max_running = server.limiter().max_running(),
        max_queued = server.limiter().max_queued(),
        replica = fleet.replica(),
        forwards = fleet.forwards(),
        "serving MCP over HTTP"
    );
    // One machine-readable line for scripts and tests, whatever the log filter.
    eprintln!("gearbox: listening on http://{local}/mcp");
    let state = AppState::new(server, keys, config).with_fleet(fleet);
    serve(listener, state, CancellationToken::new()).await
}

/// Refuse a bind that would expose an unauthenticated server.
pub fn check_exposure(
    addr: SocketAddr,
    keys: &ApiKeys,
    oauth: bool,
    insecure_no_auth: bool,
) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || !keys.is_empty() || oauth {
        return Ok(());
    }
    if insecure_no_auth {
        tracing::warn!(%addr, "serving without API keys on a non-loopback address (--insecure-no-auth)");
        return Ok(());
    }
    bail!(
        "refusing to serve on {addr} without API keys: set {}=name:key (or [http] \
         api_keys_file), bind a loopback address, or pass --insecure-no-auth",
        auth::ENV_API_KEYS
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_resolve_with_port_and_loopback_defaults() {
        let a = |s: &str, p: Option<&str>| resolve_addr(s, p).map(|a| a.to_string());
        assert_eq!(a("", None).expect("ok"), "127.0.0.1:8080");
        assert_eq!(a("", Some("9000")).expect("ok"), "127.0.0.1:9000");
        assert_eq!(a("0.0.0.0", Some("5000")).expect("ok"), "0.0.0.0:5000");
        assert_eq!(a("0.0.0.0:7000", Some("5000")).expect("ok"), "0.0.0.0:7000");
        assert_eq!(a(":7001", None).expect("ok"), "127.0.0.1:7001");
        assert_eq!(a("[::1]:7002", None).expect("ok"), "[::1]:7002");
        assert_eq!(a("::1", None).expect("ok"), "[::1]:8080");
        assert_eq!(a("localhost:7003", None).expect("ok"), "127.0.0.1:7003");
        assert!(a("example.com:80", None).is_err());
        assert!(a("", Some("http")).is_err());
    }

    #[test]
    fn exposure_needs_keys_or_consent() {
        let none = ApiKeys::default();
        let lo: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let any: SocketAddr = "0.0.0.0:1".parse().expect("addr");
        assert!(check_exposure(lo, &none, false, false).is_ok());
        let e = check_exposure(any, &none, false, false).expect_err("refused");
        assert!(e.to_string().contains("--insecure-no-auth"), "{e}");
        assert!(check_exposure(any, &none, false, true).is_ok());
        let mut keys = ApiKeys::default();
        keys.add_list("a:0123456789abcdef", "t").expect("key");
        assert!(check_exposure(any, &keys, false, false).is_ok());
        assert!(
            check_exposure(any, &none, true, false).is_ok(),
            "an OAuth issuer is authentication too"
        );
    }

    #[test]
    fn origins_match_scheme_host_and_port() {
        let allowed: Vec<String> = HttpConfig::default().allowed_origins;
        assert!(origin_allowed("http://localhost:3000", &allowed));
        assert!(origin_allowed("http://127.0.0.1", &allowed));
        assert!(origin_allowed("http://[::1]:9", &allowed));
        assert!(!origin_allowed("https://localhost:3000", &allowed));
        assert!(!origin_allowed("http://evil.example", &allowed));
        assert!(!origin_allowed("null", &allowed));
        let exact = vec!["https://app.example:8443".to_string()];
        assert!(origin_allowed("https://app.example:8443", &exact));
        assert!(!origin_allowed("https://app.example", &exact));
    }
}
