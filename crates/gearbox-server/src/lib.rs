//! gearbox-server: the MCP face of gearbox.
//!
//! It owns the tools (`execute_code` and the drop-in profiles that mimic the systems gearbox
//! replaces), their argument contract, the resources (`gearbox://env`, `env://info`,
//! `gearbox://snippets/...`) and the stdio transport. One handler type, [`GearboxServer`],
//! implements rmcp's `ServerHandler`, so the same value is served over stdio
//! ([`serve_stdio`]) and over HTTP ([`http`]: Streamable HTTP at `/mcp`, the 2024-11-05
//! HTTP+SSE transport at `/sse` + `/messages`, API keys, health, metrics). Every run passes
//! the shared [`limiter::Limiter`] (back-pressure), is counted in [`metrics::Metrics`] and
//! written to the [`audit::AuditLog`], then goes through
//! [`gearbox_engine::Engine::execute`]; this crate must not know how a backend isolates, and
//! over stdio it writes nothing to stdout but the protocol.

pub mod approvals;
mod args;
pub mod audit;
mod broker;
#[cfg(test)]
mod doc_check;
mod gate;
#[cfg(test)]
mod gate_tests;
pub mod http;
pub mod limiter;
pub mod metrics;
mod plan;
mod quotas;
mod request_shape;
mod resources;
mod runs;
mod schema;
mod server;
mod sessions;
mod snippets;
mod stdio;
mod tools;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gearbox_engine::Engine;
use gearbox_engine::config::ToolProfile;
use rmcp::ServiceExt;

pub use server::GearboxServer;
pub use sessions::end_all_live;

/// A commented configuration file whose every value is the default; `gearbox config init`
/// writes it.
pub const EXAMPLE_CONFIG: &str = include_str!("config_example.toml");

/// How often a running call reports progress to a client that sent a progress token.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// The caller of a request, put in the HTTP request's extensions by the authentication
/// layer: who presented (an API key's name, never the key; or a token's tenant claim), the
/// tenant that owns what its calls create, whether it is an admin, and the highest gear its
/// calls run at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The API key's name or the token's tenant claim; audited as `caller`.
    pub name: String,
    /// Owner of the sessions, live sessions and approvals its calls create.
    pub tenant: String,
    /// Sees and decides every tenant's approvals.
    pub admin: bool,
    /// The highest gear its calls run at, whatever they ask; `None`: the server's gear.
    pub max_gear: Option<gearbox_core::Gear>,
}

impl Caller {
    /// A caller that is its own tenant: not admin, uncapped.
    pub fn named(name: &str) -> Caller {
        Caller {
            name: name.to_string(),
            tenant: name.to_string(),
            admin: false,
            max_gear: None,
        }
    }

    /// The highest gear this caller's calls run at on a server of `server`.
    pub fn ceiling(&self, server: gearbox_core::Gear) -> gearbox_core::Gear {
        self.max_gear.map_or(server, |cap| cap.min(server))
    }
}

/// The transport a request came over (`http`, `sse`), in the HTTP request's extensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportName(pub &'static str);

/// Settings of one server, resolved from the configuration and the command line.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Tool profiles to expose; empty means the configuration's `profiles`.
    pub profiles: Vec<ToolProfile>,
    /// Interval of `notifications/progress` while a run goes on.
    pub progress_interval: Duration,
    /// Where each execution is recorded; `None` records nothing.
    pub audit: Option<Arc<audit::AuditLog>>,
    /// Transport and caller recorded when a request does not carry its own (stdio).
    pub transport: &'static str,
    pub caller: String,
    /// Safety gear overriding the configuration's (`--gear`).
    pub gear: Option<gearbox_core::Gear>,
    /// Serve the local approval socket (`gearbox approve`).
    pub local_approvals: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            profiles: Vec::new(),
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
            audit: None,
            transport: "stdio",
            caller: "local".into(),
            gear: None,
            local_approvals: false,
        }
    }
}

/// Serve MCP on this process's stdin and stdout until the client closes the connection.
///
/// Runs still going when the client leaves are cancelled, which kills their sandboxes.
/// Raise this process's soft limit on open files to its hard limit, as long-running servers
/// do: a server holds several descriptors per warm sandbox (pipes, control socket, pidfds,
/// open cgroup files), per running call and per connection, and the usual soft limit of 1024
/// is below what a busy one needs. Returns the soft limit now in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the structure on this frame.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads the structure on this frame.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

pub async fn serve_stdio(engine: Arc<Engine>, opts: ServeOptions) -> anyhow::Result<()> {
    let server = GearboxServer::new(engine, opts);
    server.broker_startup()?;
    tracing::info!(tools = ?server.tool_names(), "serving MCP over stdio");
    let running = server
        .clone()
        .serve({
            let (read, write) = rmcp::transport::stdio_pipes();
            stdio::StdioTransport::new(read, write)
        })
        .await
        .context("starting the MCP session on stdio")?;
    let reason = running.waiting().await.context("serving MCP on stdio")?;
    tracing::info!(?reason, "MCP session over stdio ended");
    if let Some(log) = server.audit()
        && let Err(e) = log.flush().await
    {
        tracing::warn!(error = %e, "flushing the audit log");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearbox_engine::Config;

    #[test]
    fn example_config_parses_to_the_defaults() {
        let c = Config::from_toml(std::path::Path::new("example.toml"), EXAMPLE_CONFIG)
            .expect("example parses");
        assert_eq!(c, Config::default());
    }

    #[test]
    fn example_config_values_are_the_defaults() {
        // Uncomment every `# key = value` line of the top level and [limits]: still defaults.
        let mut text = String::new();
        for line in EXAMPLE_CONFIG.lines() {
            if line.starts_with("# [languages") {
                break;
            }
            match line.strip_prefix("# ") {
                Some(kv)
                    if kv.split_once(" = ").is_some_and(|(k, _)| {
                        k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    }) && !kv.starts_with("snippets_dir") =>
                {
                    text.push_str(kv);
                }
                _ => text.push_str(line),
            }
            text.push('\n');
        }
        let c = Config::from_toml(std::path::Path::new("example.toml"), &text).expect("parses");
        assert_eq!(c, Config::default(), "{text}");
    }
}
