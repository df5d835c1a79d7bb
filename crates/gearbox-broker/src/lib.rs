//! gearbox-broker: other MCP servers' tools for sandboxed code ("code mode").
//!
//! The broker holds the downstream servers of `[[targets]]` ([`TargetConfig`]): each is a
//! child process over stdio or a Streamable HTTP endpoint, reached with rmcp's client, started
//! on first use, restarted after a crash (with back-off when starts keep failing) and reported
//! `down`, never fatal, when it cannot be reached. Discovery ([`Broker::servers`],
//! [`Broker::tools`], [`Broker::tool_info`], [`Broker::stubs`]) reads a per-target cache of
//! `tools/list`, dropped when the server sends `notifications/tools/list_changed`.
//!
//! A code-mode run gets a [`RunChannel`] ([`Broker::open_run`]): a private directory holding a
//! Unix socket and the SDK (`gearbox.py`, `gearbox.js`, typed stubs under `tools/`). The
//! server bind-mounts the directory read-only into the sandbox and sets [`RunChannel::env`];
//! code calls `gearbox.call_tool("server", "tool", {...})`, which writes one JSON line to the
//! socket. The broker checks every call against the run's [`CallPolicy`] (allowlist of
//! `server/tool` globs, per-call deadline, call count, wall clock), trims results larger than
//! `max_output_kb` into an artifact ([`ArtifactSink`]) and records each call
//! ([`ToolCallRecord`]). Secrets of a target (its `env` and `headers` values) stay in this
//! process: the sandbox sees only the socket, and any secret value found in a result is
//! replaced by `[redacted]` before the code sees it. See `docs/BROKER.md`.

mod artifact;
mod channel;
pub mod config;
pub mod glob;
mod stubs;
mod target;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::Tool;
use schemars::JsonSchema;
use serde::Serialize;

pub use artifact::{ArtifactSink, FileArtifactSink};
pub use channel::{CallOutcome, CallPolicy, RunChannel, ToolCallRecord};
pub use config::{BrokerConfig, CallLimitOverrides, CallLimits, ResolvedTarget, TargetConfig};
pub use stubs::StubLanguage;
pub use target::{CallError, Status};

use target::Target;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BrokerError {
    #[error("target {target:?}: {message}")]
    Config { target: String, message: String },
    #[error(
        "target {target:?}: {field} uses ${{{variable}}}, but {variable} is not set in gearbox's environment"
    )]
    MissingVariable {
        target: String,
        field: String,
        variable: String,
    },
    #[error("target {0:?} is configured twice")]
    DuplicateTarget(String),
    #[error("server: no target named {name:?}; configured: {available}")]
    UnknownServer { name: String, available: String },
    #[error("tool: {server:?} has no tool {tool:?} (or its tools_allow hides it)")]
    UnknownTool { server: String, tool: String },
    #[error("server {server:?} is unavailable: {message}")]
    Unavailable { server: String, message: String },
    #[error("{0}")]
    Io(String),
}

/// What `servers_list` reports of one target.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ServerInfo {
    pub name: String,
    pub tags: Vec<String>,
    /// `stdio` or `http`.
    pub transport: String,
    pub status: Status,
    /// Tools exposed (after `tools_allow`); absent when the server is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<usize>,
    /// Why the server is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Successful starts so far (more than one means it was restarted).
    pub starts: u32,
}

/// One line per tool, what `server_tools_list` reports.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ToolSummary {
    pub server: String,
    pub name: String,
    /// The first sentence of the description, at most 120 characters.
    pub description: String,
}

/// The downstream servers and their cached tools. Cheap to clone.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    config: BrokerConfig,
    targets: BTreeMap<String, Arc<Target>>,
    /// Every secret value of every target, longest first, for scrubbing results.
    secrets: Vec<String>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("targets", &self.inner.targets.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The first sentence or line of `s`, at most 120 characters.
fn one_line(s: &str) -> String {
    let s = s.trim();
    let mut end = s.find('\n').unwrap_or(s.len());
    if let Some(i) = s.find(". ")
        && i < end
    {
        end = i + 1;
    }
    let line = &s[..end];
    if line.chars().count() > 120 {
        let cut: String = line.chars().take(117).collect();
        format!("{cut}...")
    } else {
        line.to_string()
    }
}

impl Broker {
    /// A broker over `targets`, `${VAR}` taken from this process's environment. Starts no
    /// server: each starts on first use.
    pub fn new(targets: &[TargetConfig], config: BrokerConfig) -> Result<Broker, BrokerError> {
        Self::with_lookup(targets, config, &|k| std::env::var(k).ok())
    }

    /// As [`Broker::new`], with `${VAR}` taken from `lookup`.
    pub fn with_lookup(
        targets: &[TargetConfig],
        config: BrokerConfig,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Broker, BrokerError> {
        let mut map = BTreeMap::new();
        let mut secrets = Vec::new();
        let connect = Duration::from_millis(config.connect_timeout_ms.max(1));
        for t in targets {
            let resolved = t.resolve(lookup)?;
            secrets.extend(
                resolved
                    .secret_values()
                    .into_iter()
                    .filter(|s| s.len() >= 4),
            );
            if map.contains_key(&resolved.name) {
                return Err(BrokerError::DuplicateTarget(resolved.name));
            }
            map.insert(
                resolved.name.clone(),
                Arc::new(Target::new(resolved, connect)),
            );
        }
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Ok(Broker {
            inner: Arc::new(Inner {
                config,
                targets: map,
                secrets,
            }),
        })
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    pub fn is_empty(&self) -> bool {
        self.inner.targets.is_empty()
    }

    pub fn target_names(&self) -> Vec<String> {
        self.inner.targets.keys().cloned().collect()
    }

    fn target(&self, name: &str) -> Result<&Arc<Target>, BrokerError> {
        self.inner
            .targets
            .get(name)
            .ok_or_else(|| BrokerError::UnknownServer {
                name: name.to_string(),
                available: if self.inner.targets.is_empty() {
                    "none".into()
                } else {
                    self.target_names().join(", ")
                },
            })
    }

    /// Every target with its status and tool count; starts the targets not yet started.
    pub async fn servers(&self) -> Vec<ServerInfo> {
        let futures = self.inner.targets.values().map(|t| async move {
            let tools = t.tools().await;
            let (status, error, _, starts) = t.status().await;
            ServerInfo {
                name: t.name().to_string(),
                tags: t.cfg.tags.clone(),
                transport: match t.cfg.transport {
                    config::Transport::Stdio { .. } => "stdio".into(),
                    config::Transport::Http { .. } => "http".into(),
                },
                status,
                tool_count: tools.as_ref().ok().map(|t| t.len()),
                error: error.or_else(|| tools.err().map(|e| e.to_string())),
                starts,
            }
        });
        futures::future::join_all(futures).await
    }

    /// Process id of a stdio target's server while it is up.
    pub async fn target_pid(&self, name: &str) -> Option<u32> {
        let t = self.inner.targets.get(name)?;
        t.status().await.2
    }

    async fn tools_of(&self, server: &str) -> Result<Arc<Vec<Tool>>, BrokerError> {
        self.target(server)?
            .tools()
            .await
            .map_err(|e| BrokerError::Unavailable {
                server: server.to_string(),
                message: e.to_string(),
            })
    }

    /// Names and one-line descriptions of the tools of `server` (every server when `None`),
    /// keeping those whose name or description contains `filter` (case-insensitive), or whose
    /// `server/name` matches it when it has `*` or `?`. Servers that are down are skipped when
    /// listing every server.
    pub async fn tools(
        &self,
        server: Option<&str>,
        filter: Option<&str>,
    ) -> Result<Vec<ToolSummary>, BrokerError> {
        let servers: Vec<String> = match server {
            Some(s) => {
                self.target(s)?;
                vec![s.to_string()]
            }
            None => self.target_names(),
        };
        let needle = filter.map(|f| f.to_lowercase());
        let mut out = Vec::new();
        for s in servers {
            let tools = match self.tools_of(&s).await {
                Ok(t) => t,
                Err(e) if server.is_some() => return Err(e),
                Err(_) => continue,
            };
            for t in tools.iter() {
                let description = one_line(t.description.as_deref().unwrap_or(""));
                let keep = match &needle {
                    None => true,
                    Some(f) if f.contains('*') || f.contains('?') => {
                        glob::matches(f, &format!("{s}/{}", t.name).to_lowercase())
                    }
                    Some(f) => {
                        t.name.to_lowercase().contains(f.as_str())
                            || description.to_lowercase().contains(f.as_str())
                    }
                };
                if keep {
                    out.push(ToolSummary {
                        server: s.clone(),
                        name: t.name.to_string(),
                        description,
                    });
                }
            }
        }
        Ok(out)
    }

    /// The full definition of one tool: description, input and output schemas, annotations.
    pub async fn tool_info(&self, server: &str, tool: &str) -> Result<Tool, BrokerError> {
        self.tools_of(server)
            .await?
            .iter()
            .find(|t| t.name == tool)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownTool {
                server: server.to_string(),
                tool: tool.to_string(),
            })
    }

    /// Call a tool directly (no run policy, no scrubbing): for the server's own use.
    pub async fn call(
        &self,
        server: &str,
        tool: &str,
        args: Option<rmcp::model::JsonObject>,
        timeout: Duration,
    ) -> Result<rmcp::model::CallToolResult, BrokerError> {
        let target = self.target(server)?;
        if !target.exposes(tool) {
            return Err(BrokerError::UnknownTool {
                server: server.to_string(),
                tool: tool.to_string(),
            });
        }
        target
            .call(tool, args, timeout)
            .await
            .map_err(|e| BrokerError::Unavailable {
                server: server.to_string(),
                message: e.to_string(),
            })
    }

    /// The typed stub module of `server`'s tools.
    pub async fn stubs(&self, server: &str, language: StubLanguage) -> Result<String, BrokerError> {
        let tools = self.tools_of(server).await?;
        Ok(match language {
            StubLanguage::Python => stubs::python(server, &tools),
            StubLanguage::Javascript => stubs::javascript(server, &tools),
        })
    }

    /// `text` with every secret value of every target replaced by `[redacted]`, in its raw
    /// and its JSON-escaped form.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.inner.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "[redacted]");
            }
            let escaped = serde_json::to_string(s).unwrap_or_default();
            let escaped = escaped.trim_matches('"');
            if escaped != s && out.contains(escaped) {
                out = out.replace(escaped, "[redacted]");
            }
        }
        out
    }

    /// Open the tool-call channel of one run, with artifacts stored in a temporary directory.
    pub async fn open_run(&self, policy: CallPolicy) -> Result<RunChannel, BrokerError> {
        self.open_run_with_sink(policy, Arc::new(FileArtifactSink::in_temp_dir()))
            .await
    }

    /// Open the tool-call channel of one run, storing trimmed results in `sink`.
    pub async fn open_run_with_sink(
        &self,
        policy: CallPolicy,
        sink: Arc<dyn ArtifactSink>,
    ) -> Result<RunChannel, BrokerError> {
        channel::open(self.clone(), policy, sink).await
    }

    /// Stop every target (stdio servers are killed).
    pub async fn shutdown(&self) {
        for t in self.inner.targets.values() {
            t.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_cuts_at_the_first_sentence() {
        assert_eq!(one_line("Adds. Then more."), "Adds.");
        assert_eq!(one_line("First line\nsecond"), "First line");
        assert_eq!(one_line(&"x".repeat(200)).chars().count(), 120);
    }

    #[test]
    fn missing_variable_is_a_start_up_error_naming_target_and_variable() {
        let t = TargetConfig {
            name: "mem".into(),
            command: Some("node".into()),
            env: [("KEY".to_string(), "${GEARBOX_TEST_UNSET_VAR_X}".to_string())].into(),
            ..Default::default()
        };
        let e = Broker::with_lookup(&[t], BrokerConfig::default(), &|_| None).expect_err("missing");
        assert_eq!(
            e.to_string(),
            "target \"mem\": env.KEY uses ${GEARBOX_TEST_UNSET_VAR_X}, but \
             GEARBOX_TEST_UNSET_VAR_X is not set in gearbox's environment"
        );
    }

    #[test]
    fn scrub_hides_raw_and_escaped_secrets() {
        let t = TargetConfig {
            name: "s".into(),
            command: Some("node".into()),
            env: [("K".to_string(), "${V}".to_string())].into(),
            ..Default::default()
        };
        let b = Broker::with_lookup(&[t], BrokerConfig::default(), &|_| {
            Some("tok\"en-123".into())
        })
        .expect("broker");
        assert_eq!(b.scrub("a tok\"en-123 b"), "a [redacted] b");
        assert_eq!(b.scrub(r#"{"x":"tok\"en-123"}"#), r#"{"x":"[redacted]"}"#);
    }
}
