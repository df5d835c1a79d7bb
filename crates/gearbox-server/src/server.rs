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
use crate::resources;
use crate::tools::{self, Prepared, ToolKind};

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
        GearboxServer {
            inner: Arc::new(Inner {
                engine,
                profiles,
                tools,
                progress_interval: opts.progress_interval.max(Duration::from_millis(50)),
                languages: OnceCell::new(),
            }),
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
        let language = req.language.clone();
        let timeout_ms = req
            .limits
            .timeout_ms
            .unwrap_or(self.inner.engine.config().limits.timeout_ms);
        let token = ctx.meta.get_progress_token();
        let started = Instant::now();
        let run = self.inner.engine.execute(req, backend);
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
        };
        let outcome = match prepared {
            Err(message) => {
                tracing::debug!(tool = %request.name, %message, "argument error");
                return Ok(tools::argument_error(kind, engine, message));
            }
            Ok(Prepared::Refused(outcome)) => outcome,
            Ok(Prepared::Run {
                request: req,
                backend,
            }) => match self.run(req, backend, ctx).await {
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
            ToolKind::ListPackages => tools::packages_result(&outcome),
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
        self.call(kind, &request, &ctx).await.map(Into::into)
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
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
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
        } else {
            resources::read_snippets(&self.inner.engine, uri)?
        };
        Ok(result.into())
    }
}
