//! One downstream server: its connection (started on first use, restarted with back-off after
//! a crash), its cached tool list (dropped on `notifications/tools/list_changed`) and calls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, JsonObject, Tool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::config::{ResolvedTarget, Transport};
use crate::glob;

/// Variables of gearbox's environment a stdio target inherits; everything else it gets from
/// its own `env`.
const INHERITED_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "NODE_PATH"];

/// Longest wait before reconnecting a target whose start keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The client side of one connection: marks the tool cache stale when the server says so.
#[derive(Clone)]
struct Handler {
    stale: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _ctx: NotificationContext<RoleClient>) {
        self.stale.store(true, Ordering::SeqCst);
    }
}

type Service = RunningService<RoleClient, Handler>;

/// Whether the connection is gone: the service loop ended (the transport closed) or was
/// cancelled.
fn closed(s: &Service) -> bool {
    s.is_closed() || s.peer().is_transport_closed()
}

enum Conn {
    /// Not started yet.
    Idle,
    Up {
        service: Arc<Service>,
        pid: Option<u32>,
        since: Instant,
    },
    Down {
        error: String,
        /// Consecutive failed starts.
        failures: u32,
        retry_at: Instant,
    },
}

/// What `servers_list` shows of a target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Not started yet (targets start on first use).
    Idle,
    Up,
    Down,
}

/// Why a call did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The target could not be started or reached.
    Unavailable(String),
    /// The call took longer than its deadline; the request was cancelled.
    Timeout(Duration),
    /// The connection broke during the call (the server exited or the stream closed).
    ConnectionLost(String),
    /// The server answered with a protocol error (unknown tool, invalid arguments, ...).
    Protocol(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unavailable(e) => write!(f, "unavailable: {e}"),
            CallError::Timeout(d) => write!(f, "no answer within {} ms", d.as_millis()),
            CallError::ConnectionLost(e) => write!(f, "connection lost during the call: {e}"),
            CallError::Protocol(e) => write!(f, "{e}"),
        }
    }
}

pub struct Target {
    pub cfg: ResolvedTarget,
    connect_timeout: Duration,
    conn: Mutex<Conn>,
    stale: Arc<AtomicBool>,
    tools: StdMutex<Option<Arc<Vec<Tool>>>>,
    /// Times the target was (re)started successfully.
    starts: StdMutex<u32>,
}

impl Target {
    pub fn new(cfg: ResolvedTarget, connect_timeout: Duration) -> Target {
        Target {
            cfg,
            connect_timeout,
            conn: Mutex::new(Conn::Idle),
            stale: Arc::new(AtomicBool::new(true)),
            tools: StdMutex::new(None),
            starts: StdMutex::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Status, last error, pid of a stdio target, times started.
    pub async fn status(&self) -> (Status, Option<String>, Option<u32>, u32) {
        let starts = self.starts.lock().map(|s| *s).unwrap_or(0);
        match &*self.conn.lock().await {
            Conn::Idle => (Status::Idle, None, None, starts),
            Conn::Up { service, pid, .. } if !closed(service) => (Status::Up, None, *pid, starts),
            Conn::Up { .. } => (
                Status::Down,
                Some("the connection closed (the server exited?); restarted on next use".into()),
                None,
                starts,
            ),
            Conn::Down { error, .. } => (Status::Down, Some(error.clone()), None, starts),
        }
    }

    /// The live connection, starting the server when there is none (at once after a crash,
    /// with exponential back-off after failed starts).
    async fn service(&self) -> Result<Arc<Service>, CallError> {
        let mut conn = self.conn.lock().await;
        let failures = match &*conn {
            Conn::Up { service, .. } if !closed(service) => return Ok(service.clone()),
            Conn::Up { since, .. } => {
                tracing::warn!(
                    target_name = %self.cfg.name,
                    up_for_s = since.elapsed().as_secs(),
                    "downstream connection closed; restarting"
                );
                0
            }
            Conn::Idle => 0,
            Conn::Down {
                error,
                failures,
                retry_at,
            } => {
                let now = Instant::now();
                if now < *retry_at {
                    return Err(CallError::Unavailable(format!(
                        "{error} (next start attempt in {} ms)",
                        (*retry_at - now).as_millis()
                    )));
                }
                *failures
            }
        };
        self.stale.store(true, Ordering::SeqCst);
        match tokio::time::timeout(self.connect_timeout, self.connect()).await {
            Ok(Ok((service, pid))) => {
                let service = Arc::new(service);
                *conn = Conn::Up {
                    service: service.clone(),
                    pid,
                    since: Instant::now(),
                };
                if let Ok(mut s) = self.starts.lock() {
                    *s += 1;
                }
                tracing::info!(target_name = %self.cfg.name, ?pid, "downstream server started");
                Ok(service)
            }
            result => {
                let error = match result {
                    Ok(Err(e)) => e,
                    _ => format!(
                        "no answer to initialize within {} ms",
                        self.connect_timeout.as_millis()
                    ),
                };
                let failures = failures + 1;
                let backoff = Duration::from_millis(500)
                    .saturating_mul(1 << (failures - 1).min(10))
                    .min(MAX_BACKOFF);
                tracing::warn!(target_name = %self.cfg.name, %error, failures, "downstream server did not start");
                *conn = Conn::Down {
                    error: error.clone(),
                    failures,
                    retry_at: Instant::now() + backoff,
                };
                Err(CallError::Unavailable(error))
            }
        }
    }

    async fn connect(&self) -> Result<(Service, Option<u32>), String> {
        let handler = Handler {
            stale: self.stale.clone(),
        };
        match &self.cfg.transport {
            Transport::Stdio {
                command,
                args,
                cwd,
                env,
            } => {
                let cmd = tokio::process::Command::new(command).configure(|c| {
                    c.args(args).env_clear();
                    for k in INHERITED_ENV {
                        if let Some(v) = std::env::var_os(k) {
                            c.env(k, v);
                        }
                    }
                    c.envs(env);
                    if let Some(d) = cwd {
                        c.current_dir(d);
                    }
                });
                let (transport, _stderr) = TokioChildProcess::builder(cmd)
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|e| format!("starting {command:?}: {e}"))?;
                let pid = transport.id();
                let service = handler
                    .serve(transport)
                    .await
                    .map_err(|e| format!("initialize failed: {e}"))?;
                Ok((service, pid))
            }
            Transport::Http { url, headers } => {
                let mut map = std::collections::HashMap::new();
                for (k, v) in headers {
                    let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                        .map_err(|_| format!("header {k:?} is not a valid name"))?;
                    let value = reqwest::header::HeaderValue::from_str(v)
                        .map_err(|_| format!("header {k}: not a valid value"))?;
                    map.insert(name, value);
                }
                let config =
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(map);
                let transport = StreamableHttpClientTransport::from_config(config);
                let service = handler
                    .serve(transport)
                    .await
                    .map_err(|e| format!("initialize failed at {url}: {e}"))?;
                Ok((service, None))
            }
        }
    }

    /// Whether `tool` is among the tools this target may expose (`tools_allow`).
    pub fn exposes(&self, tool: &str) -> bool {
        self.cfg.tools_allow.is_empty()
            || self.cfg.tools_allow.iter().any(|g| glob::matches(g, tool))
    }

    /// The server's tools that `tools_allow` lets through, from the cache when it is fresh.
    pub async fn tools(&self) -> Result<Arc<Vec<Tool>>, CallError> {
        let service = self.service().await?;
        if !self.stale.load(Ordering::SeqCst)
            && let Some(t) = self.tools.lock().ok().and_then(|t| t.clone())
        {
            return Ok(t);
        }
        self.stale.store(false, Ordering::SeqCst);
        let listed = tokio::time::timeout(self.connect_timeout, service.peer().list_all_tools())
            .await
            .map_err(|_| CallError::Timeout(self.connect_timeout))?
            .map_err(|e| self.service_error(e))?;
        let tools: Arc<Vec<Tool>> = Arc::new(
            listed
                .into_iter()
                .filter(|t| self.exposes(&t.name))
                .collect(),
        );
        if let Ok(mut cache) = self.tools.lock() {
            *cache = Some(tools.clone());
        }
        Ok(tools)
    }

    fn service_error(&self, e: rmcp::ServiceError) -> CallError {
        match e {
            rmcp::ServiceError::McpError(e) => CallError::Protocol(e.message.to_string()),
            rmcp::ServiceError::Timeout { timeout } => CallError::Timeout(timeout),
            rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_) => {
                CallError::ConnectionLost(format!(
                    "the connection to {:?} closed (the server exited?); it is restarted on next use",
                    self.cfg.name
                ))
            }
            other => CallError::Protocol(other.to_string()),
        }
    }

    /// Call `tool` with `args`, giving up after `deadline` (the request is then cancelled).
    pub async fn call(
        &self,
        tool: &str,
        args: Option<JsonObject>,
        deadline: Duration,
    ) -> Result<CallToolResult, CallError> {
        let started = Instant::now();
        let service = tokio::time::timeout(deadline, self.service())
            .await
            .map_err(|_| CallError::Timeout(deadline))??;
        let left = deadline.saturating_sub(started.elapsed());
        let mut params = CallToolRequestParams::new(tool.to_string());
        if let Some(a) = args {
            params = params.with_arguments(a);
        }
        let response = tokio::time::timeout(left, service.peer().call_tool_once(params))
            .await
            .map_err(|_| CallError::Timeout(deadline))?;
        match response {
            Ok(CallToolResponse::Complete(r)) => Ok(r),
            Ok(_) => Err(CallError::Protocol(
                "the server answered with a task or an input request, which the broker does not drive"
                    .into(),
            )),
            Err(e) => {
                let e = self.service_error(e);
                if matches!(e, CallError::ConnectionLost(_)) {
                    self.mark_lost().await;
                }
                Err(e)
            }
        }
    }

    /// Forget a connection that broke, so the next use restarts the server at once.
    async fn mark_lost(&self) {
        let mut conn = self.conn.lock().await;
        if let Conn::Up { service, .. } = &*conn
            && closed(service)
        {
            *conn = Conn::Down {
                error: "the server exited or closed the connection; restarted on next use".into(),
                failures: 0,
                retry_at: Instant::now(),
            };
        }
    }

    /// Close the connection (a stdio server is killed with it).
    pub async fn shutdown(&self) {
        let mut conn = self.conn.lock().await;
        if let Conn::Up { service, .. } = std::mem::replace(&mut *conn, Conn::Idle) {
            service.cancellation_token().cancel();
        }
    }
}
