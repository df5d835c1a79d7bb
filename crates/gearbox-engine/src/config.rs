//! gearbox configuration: one TOML file, every field documented with its unit and default,
//! unknown keys refused. The JSON Schema is generated from these types.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gearbox_core::{BackendKind, Gear, LanguageSpec, Limits};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
}

/// The whole configuration. Every field has a safe default, so no file is needed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Backend used when a call does not choose one: `linux` (default), `process`, `wasm`,
    /// `docker`. `process` gives no isolation and is never chosen implicitly.
    pub backend: BackendKind,
    /// Maximum limits of a run; a call may only lower them.
    pub limits: Limits,
    /// Languages added to or replacing the built-in table (python, javascript, go, bash).
    pub languages: BTreeMap<String, LanguageSpec>,
    /// Directory of named snippets (`NAME.py`, `NAME.js`, ...) that calls may run by name.
    pub snippets_dir: Option<PathBuf>,
    /// Downstream MCP servers (`[[targets]]`) whose tools sandboxed code may call
    /// (`execute_code` with `allow_tools`) and the `broker` profile lists. See docs/BROKER.md.
    pub targets: Vec<gearbox_broker::TargetConfig>,
    /// `[broker]`: limits (defaults and maxima) of code-mode runs, the channels' directory.
    pub broker: gearbox_broker::BrokerConfig,
    /// MCP tool profiles `gearbox serve` exposes (default `["default"]`): `default`
    /// (`execute_code`), `isolator` (`execute_code` of isolator-mcp), `quickjs`
    /// (`run_javascript_code`), `heroku` (`code_exec_python`), `sidecar` (`execute`,
    /// `list_packages`), `sessions` (`execute_code` and the session tools), `broker`
    /// (discovery of `[[targets]]`). `--profile` on the command line replaces this list.
    pub profiles: Vec<ToolProfile>,
    /// How many runs may execute at once and how many may wait (every transport).
    pub concurrency: ConcurrencyConfig,
    /// `gearbox serve --http`: keys, host and origin checks, connection limits.
    pub http: HttpConfig,
    /// The audit log: one JSON line per execution.
    pub audit: AuditConfig,
    /// Warm pool of the `linux` backend: sandboxes kept built and waiting, per language
    /// (count). A run whose language, environment and limits match the defaults takes one
    /// (Python and JavaScript interpreters are already started); others start cold. The pool
    /// grows on misses up to 8 per language. Default `{ python = 1, javascript = 1,
    /// bash = 1 }`; `{}` disables it. `gearbox run` never uses it. Also how long a fork
    /// server may serve before a fresh one replaces it (`fork_server_max_runs`,
    /// `fork_server_max_age_secs`).
    pub pool: PoolConfig,
    /// The `docker` backend: engine address, and per language the image (which must exist:
    /// gearbox never pulls), command (`{entrypoint}` replaced) and workdir. Default: the
    /// local engine's socket and every built-in language (`gearbox/python:bookworm`,
    /// `gearbox/runtimes:bookworm`).
    pub docker: gearbox_docker::DockerConfig,
    /// Packages a call may ask for (`packages`): installed outside the sandbox by uv, pip or
    /// npm into cached read-only layers. See `docs/PACKAGES.md`.
    pub packages: gearbox_packages::PackagesConfig,
    /// Safety gear: how much a run may do without a human. `read_only` (nothing executes),
    /// `restricted` (no capabilities; code that analysis shows needs one is refused with the
    /// findings), `user_confirmed` (default: a human decides when a run needs a capability
    /// or looks risky), `full_trust` (capabilities granted without asking; still sandboxed).
    /// A call may pass a lower gear, never a higher one. `--gear` overrides this.
    pub gear: Gear,
    /// Human approval of runs the gear asks about.
    pub approvals: ApprovalsConfig,
    /// Sessions (`sessions` profile): workspaces whose files persist across runs.
    pub sessions: SessionsConfig,
    /// `[sandbox]`: what the host must enforce for a run to start.
    pub sandbox: SandboxConfig,
    /// `[network]`: how granted runs reach out (the egress proxy), which private ranges
    /// they may reach, pinned names, and the most each gear may grant. See docs/NETWORK.md.
    pub network: gearbox_egress::NetworkConfig,
    /// `[[secrets]]`: credentials granted runs use without holding them. The program sees a
    /// placeholder in the variable `name`; the egress proxy presents the value (from the
    /// server's environment, `value_env`, or a file, `value_file`) only on TLS connections
    /// to the secret's `hosts`, terminating them with a CA of the run's own. See
    /// docs/NETWORK.md.
    pub secrets: Vec<gearbox_egress::SecretConfig>,
}

/// `[sandbox]`: what a host must enforce before a run starts on it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    /// Refuse runs where the kernel cannot bound each run as a whole: the `linux` backend
    /// without a cgroup per run (not root, or no writable cgroups: memory is then sampled,
    /// CPU time bounded per process; `gearbox doctor` says which) and the `process` backend.
    /// Default false: such hosts run with the weaker limits, and each outcome says how
    /// memory was held (`usage.memory_limit`).
    pub require_limits: bool,
}

/// Session workspaces: where they live, how long an idle one lasts, how big one may get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Directory of the session workspaces (created 0700). Default
    /// `$STATE_DIRECTORY/sessions`, else `/var/lib/gearbox/sessions` as root, else
    /// `$XDG_STATE_HOME/gearbox/sessions`, else `~/.local/state/gearbox/sessions`.
    pub dir: Option<PathBuf>,
    /// Seconds a session may stay unused before it expires and its files are deleted (also
    /// after a restart). Each run renews it. Default 3600.
    pub ttl_secs: u64,
    /// Disk quota of one session in MiB: its files together, and the size of the sandbox's
    /// workspace in its runs. Default 64.
    pub quota_mb: u64,
    /// Most files in one session (count). Default 3000 (the workspace's tmpfs has 64
    /// inodes per MiB of quota, directories included).
    pub max_files: usize,
    /// Most sessions open at once (count). Default 32.
    pub max_sessions: usize,
    /// Most live sessions (`exec_open` with `stateful: true`: an interpreter kept running in
    /// a sandbox of its own) at once. Default 4.
    pub live_max: usize,
    /// Seconds a live session's interpreter may live, used or not; then its sandbox ends
    /// (the session's idle expiry, `ttl_secs`, ends it earlier). Default 3600.
    pub live_max_age_secs: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            dir: None,
            ttl_secs: 3600,
            quota_mb: 64,
            max_files: 3000,
            max_sessions: 32,
            live_max: 4,
            live_max_age_secs: 3600,
        }
    }
}

impl SessionsConfig {
    /// The directory this configuration names.
    pub fn dir(&self) -> PathBuf {
        if let Some(d) = &self.dir {
            return d.clone();
        }
        if let Some(d) = std::env::var_os("STATE_DIRECTORY") {
            return PathBuf::from(d).join("sessions");
        }
        // The owner of /proc/self is this process's effective uid.
        let root = std::fs::metadata("/proc/self")
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
            .unwrap_or(false);
        if root {
            return PathBuf::from("/var/lib/gearbox/sessions");
        }
        if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
            return PathBuf::from(d).join("gearbox/sessions");
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        home.join(".local/state/gearbox/sessions")
    }
}

/// How `user_confirmed` asks a human: MCP elicitation when the client supports it, else a
/// pending operation approved out of band (`gearbox approve ID`, `POST /approvals/ID`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalsConfig {
    /// Seconds a pending approval (and an approved, not yet run operation) stays valid.
    /// Default 600.
    pub ttl_secs: u64,
    /// Ask through MCP elicitation when the client declared it. Default true.
    pub elicitation: bool,
    /// Seconds to wait for the human to answer an elicitation before the run is denied.
    /// Default 300.
    pub elicitation_timeout_secs: u64,
    /// Also ask when analysis rates the code high risk (dynamic evaluation, native code)
    /// although it needs no capability. Default true.
    pub ask_on_high_risk: bool,
    /// Directory of the local approval sockets (`gearbox approve` talks to every server
    /// there). Default `$RUNTIME_DIRECTORY`, else `/run/gearbox` as root, else
    /// `$XDG_RUNTIME_DIR/gearbox`, else `/tmp/gearbox-UID`.
    pub socket_dir: Option<PathBuf>,
    /// Names of the API keys (see `[http]`) that may approve or reject over HTTP
    /// (`POST /approvals/ID`). Default none: approvals over HTTP are refused, so an agent
    /// holding the key it calls `/mcp` with cannot approve its own runs.
    pub http_approvers: Vec<String>,
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        ApprovalsConfig {
            ttl_secs: 600,
            elicitation: true,
            elicitation_timeout_secs: 300,
            ask_on_high_risk: true,
            socket_dir: None,
            http_approvers: Vec::new(),
        }
    }
}

impl ApprovalsConfig {
    /// The directory of approval sockets this configuration names.
    pub fn socket_dir(&self) -> PathBuf {
        if let Some(d) = &self.socket_dir {
            return d.clone();
        }
        gearbox_core::rundir::runtime_dir("approvals")
    }
}

/// Back-pressure: a bounded number of concurrent runs and a bounded queue behind them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    /// Runs executing at once (count); 0 means the number of CPU cores. Default 0.
    pub max_running: usize,
    /// Calls that may wait for a free slot (count); past it a call is refused with
    /// "busy, retry after N s" (HTTP 503 where the transport allows). Default 64.
    pub max_queued: usize,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig {
            max_running: 0,
            max_queued: 64,
        }
    }
}

impl ConcurrencyConfig {
    /// `max_running` with 0 resolved to the number of CPU cores (at least 1).
    pub fn running(&self) -> usize {
        if self.max_running > 0 {
            return self.max_running;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

/// The HTTP transports of `gearbox serve --http`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// File of API keys, one `name:key` per line (`#` starts a comment). Keys also come from
    /// the environment variable `GEARBOX_API_KEYS=name:key,name2:key2`. Default: none. With
    /// no key at all, HTTP is unauthenticated and only a loopback bind is allowed.
    pub api_keys_file: Option<PathBuf>,
    /// Accepted `Host` header values (`name` or `name:port`), against DNS rebinding.
    /// Default: `localhost`, `127.0.0.1`, `::1`. An empty list turns the check off (a
    /// server behind a proxy that checks hosts itself).
    pub allowed_hosts: Vec<String>,
    /// Accepted browser `Origin` values (`scheme://host[:port]`, `:*` for any port); a request
    /// with any other `Origin` gets 403. A request without `Origin` (not a browser) passes.
    /// Default: the loopback origins on any port.
    pub allowed_origins: Vec<String>,
    /// Largest request body in bytes; larger requests get 413. Default 4194304 (4 MiB).
    pub max_body_bytes: usize,
    /// Time a client has to send a request's headers, in milliseconds (slowloris). Default
    /// 10000.
    pub header_timeout_ms: u64,
    /// Time a client has to send a request's body, in milliseconds. Default 30000.
    pub body_timeout_ms: u64,
    /// Open TCP connections at once (count); more wait in the kernel's backlog. Default 1024.
    pub max_connections: usize,
    /// On SIGTERM/SIGINT, how long running calls may take to finish before they are
    /// killed, in milliseconds. Default 6000 (the whole shutdown stays under 10 s).
    pub shutdown_grace_ms: u64,
    /// This replica's name in a fleet (letters, digits, `-`; at most 63). The ids of the MCP
    /// sessions it opens start with it, so any replica can tell which one owns a session.
    /// The environment variable `GEARBOX_REPLICA` overrides it (a pod's name). Default: none
    /// (a single server: ids carry no owner and nothing is forwarded).
    pub replica_id: Option<String>,
    /// Where the other replicas are, as a URL template with `{replica}` for the owner's
    /// name, e.g. `http://{replica}.gearbox-headless:8080`. A request for a session another
    /// replica owns is forwarded there unchanged (the owner checks the API key again). Needs
    /// `replica_id` and a peer secret (`GEARBOX_PEER_SECRET` or `peer_secret_file`).
    /// Default: none.
    pub peers: Option<String>,
    /// File holding the secret replicas share to prove a forwarded request comes from a
    /// peer (at least 16 characters; the environment variable `GEARBOX_PEER_SECRET`
    /// overrides it). Default: none.
    pub peer_secret_file: Option<PathBuf>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            api_keys_file: None,
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: vec![
                "http://localhost:*".into(),
                "http://127.0.0.1:*".into(),
                "http://[::1]:*".into(),
            ],
            max_body_bytes: 4 * 1024 * 1024,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            max_connections: 1024,
            shutdown_grace_ms: 6_000,
            replica_id: None,
            peers: None,
            peer_secret_file: None,
        }
    }
}

/// The audit log: one JSON line per execution (time, caller, transport, tool, language, code
/// hash and code, files, outcome, durations, resource use). When it cannot be written,
/// executions are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// File the lines are appended to. Default: none for stdio; `gearbox serve --http` then
    /// uses `$STATE_DIRECTORY/audit.jsonl`, else `$XDG_STATE_HOME/gearbox/audit.jsonl`, else
    /// `~/.local/state/gearbox/audit.jsonl`.
    pub path: Option<PathBuf>,
    /// Record only the SHA-256 of the code, not the code itself. Default false.
    pub hash_only: bool,
    /// Size in bytes past which the file is rotated to `FILE.1` (older ones shift to `.2`,
    /// ...). Default 104857600 (100 MiB).
    pub max_bytes: u64,
    /// Rotated files kept (count). Default 5.
    pub keep: usize,
    /// Lines that arrive while an fsync is under way share the next one (group commit); a
    /// value above 0 also waits up to this many milliseconds for more lines before syncing,
    /// which delays every answer by as much. Default 0.
    pub fsync_interval_ms: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            path: None,
            hash_only: false,
            max_bytes: 100 * 1024 * 1024,
            keep: 5,
            fsync_interval_ms: 0,
        }
    }
}

/// A set of MCP tools named and shaped like those of a system gearbox replaces, so prompts
/// written for it keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolProfile {
    /// `execute_code` with every gearbox argument.
    Default,
    /// isolator-mcp: `execute_code` (`language`, `entrypoint_code`, `snippet_name`, ...).
    Isolator,
    /// MCP QuickJS runner: `run_javascript_code` (`code`).
    Quickjs,
    /// mcp-code-exec-python: `code_exec_python` (`code`, `packages`, `use_temp_dir`).
    Heroku,
    /// The Python sidecar: `execute` (`code`, `language`) and `list_packages`.
    Sidecar,
    /// `execute_code` plus sessions: `exec_open`, `exec_run`, `exec_close`,
    /// `exec_get_artifact` (files that persist across runs; see `[sessions]`).
    Sessions,
    /// Discovery of the downstream servers of `[[targets]]`: `servers_list`,
    /// `server_tools_list`, `tool_info`, `tool_stubs`.
    Broker,
}

impl ToolProfile {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolProfile::Default => "default",
            ToolProfile::Isolator => "isolator",
            ToolProfile::Quickjs => "quickjs",
            ToolProfile::Heroku => "heroku",
            ToolProfile::Sidecar => "sidecar",
            ToolProfile::Sessions => "sessions",
            ToolProfile::Broker => "broker",
        }
    }
}

impl std::fmt::Display for ToolProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ToolProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(ToolProfile::Default),
            "isolator" => Ok(ToolProfile::Isolator),
            "quickjs" => Ok(ToolProfile::Quickjs),
            "heroku" => Ok(ToolProfile::Heroku),
            "sidecar" => Ok(ToolProfile::Sidecar),
            "sessions" => Ok(ToolProfile::Sessions),
            "broker" => Ok(ToolProfile::Broker),
            other => Err(format!(
                "unknown profile {other:?} (expected default, isolator, quickjs, heroku, sidecar, \
                 sessions or broker)"
            )),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Linux,
            limits: Limits::default(),
            languages: BTreeMap::new(),
            snippets_dir: None,
            targets: Vec::new(),
            broker: gearbox_broker::BrokerConfig::default(),
            profiles: vec![ToolProfile::Default],
            concurrency: ConcurrencyConfig::default(),
            http: HttpConfig::default(),
            audit: AuditConfig::default(),
            pool: PoolConfig::default(),
            docker: gearbox_docker::DockerConfig::default(),
            packages: Default::default(),
            gear: Gear::default(),
            approvals: ApprovalsConfig::default(),
            sessions: SessionsConfig::default(),
            sandbox: SandboxConfig::default(),
            network: gearbox_egress::NetworkConfig::default(),
            secrets: Vec::new(),
        }
    }
}

/// `[pool]`: warm sandboxes per language, and the life of a fork server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(from = "RawPoolConfig")]
pub struct PoolConfig {
    /// Runs one fork server serves before a fresh one replaces it (off the request path).
    /// What a fork cannot renew — the interpreter's hash seed, the address layout — is shared
    /// by the runs of one fork server only (docs/SECURITY.md). Default 1000.
    pub fork_server_max_runs: u64,
    /// Seconds a fork server serves before a fresh one replaces it. Default 600.
    pub fork_server_max_age_secs: u64,
    /// Warm sandboxes per language (`python = 2`).
    #[serde(flatten)]
    pub languages: BTreeMap<String, usize>,
}

/// `[pool]` as written: languages listed replace the default ones; a table that sets only
/// the fork servers' life keeps the default languages; an empty one (`pool = {}`) turns the
/// pool off.
#[derive(Deserialize, JsonSchema)]
struct RawPoolConfig {
    /// Runs one fork server serves before a fresh one replaces it (off the request path).
    /// What a fork cannot renew — the interpreter's hash seed, the address layout — is shared
    /// by the runs of one fork server only (docs/SECURITY.md). Default 1000.
    fork_server_max_runs: Option<u64>,
    /// Seconds a fork server serves before a fresh one replaces it. Default 600.
    fork_server_max_age_secs: Option<u64>,
    /// Warm sandboxes per language (`python = 2`). Default `python = 1, javascript = 1,
    /// bash = 1`.
    #[serde(flatten)]
    languages: BTreeMap<String, usize>,
}

impl From<RawPoolConfig> for PoolConfig {
    fn from(raw: RawPoolConfig) -> Self {
        let default = PoolConfig::default();
        let life_only =
            raw.fork_server_max_runs.is_some() || raw.fork_server_max_age_secs.is_some();
        PoolConfig {
            fork_server_max_runs: raw
                .fork_server_max_runs
                .unwrap_or(default.fork_server_max_runs),
            fork_server_max_age_secs: raw
                .fork_server_max_age_secs
                .unwrap_or(default.fork_server_max_age_secs),
            languages: if raw.languages.is_empty() && life_only {
                default.languages
            } else {
                raw.languages
            },
        }
    }
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            fork_server_max_runs: 1000,
            fork_server_max_age_secs: 600,
            languages: [("python", 1), ("javascript", 1), ("bash", 1)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }
    }
}

impl PoolConfig {
    /// The default fork-server life with exactly these warm sandboxes.
    pub fn only(languages: impl IntoIterator<Item = (String, usize)>) -> PoolConfig {
        PoolConfig {
            languages: languages.into_iter().collect(),
            ..PoolConfig::default()
        }
    }
}

impl Config {
    /// Parse TOML text; errors name the offending key.
    pub fn from_toml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        config
            .docker
            .validate()
            .and_then(|()| config.network.validate())
            .and_then(|()| gearbox_egress::check_secrets(&config.secrets))
            .map_err(|message| ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            })?;
        Ok(config)
    }

    /// Read and parse a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(path, &text)
    }

    /// The JSON Schema of the configuration file.
    pub fn json_schema() -> serde_json::Value {
        serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_languages_replace_the_defaults_and_life_keys_keep_them() {
        let parse = |t: &str| Config::from_toml(Path::new("x.toml"), t).expect(t).pool;
        let only = parse("[pool]\npython = 2\n");
        assert_eq!(only.languages.len(), 1);
        assert_eq!(only.languages["python"], 2);
        assert_eq!(only.fork_server_max_runs, 1000);
        let life = parse("[pool]\nfork_server_max_runs = 5\nfork_server_max_age_secs = 9\n");
        assert_eq!(life.languages, PoolConfig::default().languages);
        assert_eq!(
            (life.fork_server_max_runs, life.fork_server_max_age_secs),
            (5, 9)
        );
        assert!(parse("pool = {}\n").languages.is_empty());
        assert!(Config::from_toml(Path::new("x.toml"), "[pool]\npython = -1\n").is_err());
        let sandbox = Config::from_toml(Path::new("x.toml"), "[sandbox]\nrequire_limits = true\n")
            .expect("parses");
        assert!(sandbox.sandbox.require_limits);
        assert!(Config::from_toml(Path::new("x.toml"), "[sandbox]\nrequire = true\n").is_err());
    }

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::from_toml(Path::new("x.toml"), "").expect("empty is valid");
        assert_eq!(c, Config::default());
    }

    #[test]
    fn docker_section_parses_and_is_checked() {
        let c = Config::from_toml(
            Path::new("x.toml"),
            "backend = \"docker\"\n[docker]\nhost = \"unix:///run/docker.sock\"\n\
             [docker.images.javascript]\nimage = \"node:20\"\n\
             command = [\"node\", \"{entrypoint}\"]\n",
        )
        .expect("valid docker section");
        assert_eq!(c.backend, BackendKind::Docker);
        assert_eq!(c.docker.images["javascript"].workdir, "/workspace");
        assert!(
            !c.docker.images.contains_key("python"),
            "images replace the default"
        );
        let e = Config::from_toml(Path::new("x.toml"), "[docker]\nsocket = \"/x\"\n")
            .expect_err("unknown key");
        assert!(e.to_string().contains("socket"), "{e}");
        let e = Config::from_toml(Path::new("x.toml"), "[docker]\nuid = 0\n").expect_err("root");
        assert!(e.to_string().contains("docker.uid"), "{e}");
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let e = Config::from_toml(Path::new("x.toml"), "[limits]\ntimeout_sec = 3\n")
            .expect_err("unknown key");
        assert!(e.to_string().contains("timeout_sec"), "{e}");
        let e = Config::from_toml(Path::new("x.toml"), "profiles = [\"e2b\"]\n").expect_err("bad");
        assert!(e.to_string().contains("e2b"), "{e}");
        let e = Config::from_toml(Path::new("x.toml"), "backend = \"vm\"\n").expect_err("bad");
        assert!(
            e.to_string().contains("backend") || e.to_string().contains("vm"),
            "{e}"
        );
    }
}
