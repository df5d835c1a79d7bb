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
    /// `[quotas]`: what one tenant (an API key's name; `local` on stdio, `anonymous` over
    /// HTTP without keys) may use, by default and per tenant (`[quotas.tenants.NAME]`).
    /// Every quota is off (0) by default. See docs/HTTP.md.
    pub quotas: QuotasConfig,
    /// `gearbox serve --http`: keys, host and origin checks, connection limits.
    pub http: HttpConfig,
    /// The audit log: one JSON line per execution.
    pub audit: AuditConfig,
    /// Warm pool of the `linux` backend: sandboxes kept built and waiting, per language
    /// (`python = { min = 1, max = 4 }`, or `python = 1`: min 1, max 8). A run whose
    /// language, environment and limits match the defaults takes one (Python and JavaScript
    /// interpreters are already started); others start cold. The pool grows on misses up to
    /// `max` per language and shrinks back to `min` after `idle_secs` without a call
    /// (default 60; 0: never); a language with `min = 0` then also stops its fork server.
    /// All languages together hold at most `memory_budget_mb` worth of warm sandboxes
    /// (default 64) and never more than `[concurrency]` lets run and wait. Default
    /// `{ python = 1, javascript = 1, bash = 1 }`; `{}` disables it. `gearbox run` never
    /// uses it. The pool starts filling once the server's first run is over, or after
    /// `start_delay_ms` (default 100) at a moment with no run in flight, so that a call made
    /// right after launch does not share the cores with it. Also how long a fork server may
    /// serve before a fresh one replaces it (`fork_server_max_runs`,
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

/// `[quotas]`: per-tenant budgets. The top-level keys are every tenant's; a table
/// `[quotas.tenants.NAME]` overrides some of them for the tenant `NAME`. 0 means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct QuotasConfig {
    /// Runs of one tenant executing at once (count); its further calls wait in its queue.
    /// Default 0 (unlimited: only `[concurrency] max_running` bounds them).
    pub max_running: u64,
    /// Calls of one tenant waiting for a run slot (count); past it the call is refused
    /// (HTTP 429). Default 0 (unlimited: only `[concurrency] max_queued` bounds them).
    pub max_queued: u64,
    /// Runs one tenant may start in any 60 s (count, calls admitted to run). Default 0.
    pub runs_per_minute: u64,
    /// CPU seconds one tenant's runs may use in any hour (as the supervisor measured them,
    /// `usage.cpu_time_ms`; a run is charged when it ends). Default 0.
    pub cpu_seconds_per_hour: u64,
    /// Live sessions (`exec_open` with `stateful: true`) one tenant may hold open at once
    /// (count). Default 0 (only `[sessions] live_max` bounds them).
    pub live_sessions: u64,
    /// Bytes of all of one tenant's session files together, in MiB. Past it no session
    /// opens and a run's workspace is not saved. Default 0.
    pub session_storage_mb: u64,
    /// Overrides by tenant name: `[quotas.tenants.ci] runs_per_minute = 10`.
    pub tenants: BTreeMap<String, TenantQuotas>,
}

/// `[quotas.tenants.NAME]`: a key left out takes the `[quotas]` value; 0 is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TenantQuotas {
    pub max_running: Option<u64>,
    pub max_queued: Option<u64>,
    pub runs_per_minute: Option<u64>,
    pub cpu_seconds_per_hour: Option<u64>,
    pub live_sessions: Option<u64>,
    pub session_storage_mb: Option<u64>,
}

/// The quotas in force for one tenant; 0 is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    pub max_running: u64,
    pub max_queued: u64,
    pub runs_per_minute: u64,
    pub cpu_seconds_per_hour: u64,
    pub live_sessions: u64,
    pub session_storage_mb: u64,
}

impl QuotasConfig {
    /// The quotas of `tenant`: its overrides over the defaults.
    pub fn for_tenant(&self, tenant: &str) -> Quota {
        let o = self.tenants.get(tenant).cloned().unwrap_or_default();
        Quota {
            max_running: o.max_running.unwrap_or(self.max_running),
            max_queued: o.max_queued.unwrap_or(self.max_queued),
            runs_per_minute: o.runs_per_minute.unwrap_or(self.runs_per_minute),
            cpu_seconds_per_hour: o.cpu_seconds_per_hour.unwrap_or(self.cpu_seconds_per_hour),
            live_sessions: o.live_sessions.unwrap_or(self.live_sessions),
            session_storage_mb: o.session_storage_mb.unwrap_or(self.session_storage_mb),
        }
    }

    /// Tenant names are API key names (letters, digits, `-_.@`) or `local`/`anonymous`;
    /// sizes must fit in bytes.
    pub fn validate(&self) -> Result<(), String> {
        let too_big = |what: &str, mb: u64| {
            if mb > u64::MAX >> 20 {
                Err(format!(
                    "{what}: {mb} MiB is more than can be counted in bytes"
                ))
            } else {
                Ok(())
            }
        };
        too_big("quotas.session_storage_mb", self.session_storage_mb)?;
        for (name, t) in &self.tenants {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
            {
                return Err(format!(
                    "quotas.tenants.{name:?}: a tenant name is an API key's name (letters, \
                     digits, - _ . @), `local` or `anonymous`"
                ));
            }
            if name == QUOTA_OTHER_TENANTS {
                return Err(format!(
                    "quotas.tenants.{name}: reserved for the metrics of unnamed tenants"
                ));
            }
            too_big(
                &format!("quotas.tenants.{name}.session_storage_mb"),
                t.session_storage_mb.unwrap_or(0),
            )?;
        }
        Ok(())
    }
}

/// The `tenant` label of the tenants `/metrics` does not name (see docs/HTTP.md).
pub const QUOTA_OTHER_TENANTS: &str = "_other";

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
    /// Settings of named API keys (`[http.keys.NAME]`): the tenant a key belongs to, whether
    /// it is an admin, the highest gear its calls run at. A key without an entry is its own
    /// tenant, not admin, uncapped. An entry naming no configured key stops start-up.
    pub keys: BTreeMap<String, KeyConfig>,
    /// OAuth 2.1 resource server (`[http.oauth]`): JWT access tokens from one issuer,
    /// accepted beside the API keys. Default: off.
    pub oauth: Option<OAuthConfig>,
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

impl HttpConfig {
    /// Check `[http.oauth]` and `[http.keys]`: what a server cannot start with.
    pub fn validate(&self) -> Result<(), String> {
        for (name, k) in &self.keys {
            if let Some(t) = &k.tenant
                && (t.is_empty()
                    || !t
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.@:".contains(c)))
            {
                return Err(format!(
                    "[http.keys.{name}] tenant {t:?}: letters, digits, - _ . @ : only"
                ));
            }
        }
        let Some(o) = &self.oauth else {
            return Ok(());
        };
        if o.issuer.trim().is_empty() {
            return Err("[http.oauth] issuer: required (the authorization server's issuer)".into());
        }
        if o.audience.trim().is_empty() {
            return Err(
                "[http.oauth] audience: required (this server's resource URL, such as \
                 https://gearbox.example/mcp)"
                    .into(),
            );
        }
        for (what, url) in [
            ("issuer", Some(&o.issuer)),
            ("jwks_url", o.jwks_url.as_ref()),
        ] {
            if let Some(u) = url
                && !(u.starts_with("https://") || u.starts_with("http://"))
            {
                return Err(format!(
                    "[http.oauth] {what} {u:?}: expected an http(s) URL"
                ));
            }
        }
        if !["sub", "client_id", "azp"].contains(&o.tenant_claim.as_str()) {
            return Err(format!(
                "[http.oauth] tenant_claim {:?}: expected sub, client_id or azp",
                o.tenant_claim
            ));
        }
        Ok(())
    }
}

/// `[http.keys.NAME]`: what one API key may do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KeyConfig {
    /// The tenant the key's calls belong to (what owns sessions and approvals). Default: the
    /// key's name. Several keys may share a tenant (an agent's key and its human's).
    pub tenant: Option<String>,
    /// An admin key sees and decides every tenant's approvals. Default false.
    pub admin: bool,
    /// The highest gear the key's calls run at, whatever a call asks: `read_only`,
    /// `restricted`, `user_confirmed` or `full_trust`. Default: none (the server's gear).
    pub max_gear: Option<Gear>,
}

/// `[http.oauth]`: gearbox as an OAuth 2.1 resource server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct OAuthConfig {
    /// The authorization server's issuer identifier; a token's `iss` must equal it.
    pub issuer: String,
    /// Where its signing keys (JWKS) are. Default: read from the issuer's
    /// `/.well-known/oauth-authorization-server`, else `/.well-known/openid-configuration`.
    pub jwks_url: Option<String>,
    /// This server's resource identifier (RFC 8707), such as `https://gearbox.example/mcp`;
    /// a token's `aud` must contain it. Also the `resource` of the protected resource
    /// metadata.
    pub audience: String,
    /// The claim that names the tenant: `sub` (default), `client_id` or `azp`.
    pub tenant_claim: String,
    /// Prefix of the scopes gearbox reads: `PREFIX` + a gear name (`gearbox:restricted`, ...)
    /// caps the token's calls at that gear (the highest such scope counts), and
    /// `PREFIX` + `admin` makes it an admin. A token with no gear scope gets 403
    /// `insufficient_scope`. Default `gearbox:`.
    pub scope_prefix: String,
    /// Seconds of clock skew allowed on `exp` and `nbf`. Default 60.
    pub leeway_secs: u64,
    /// Seconds a fetched key set is kept. Default 300.
    pub jwks_ttl_secs: u64,
    /// A token naming a key id the cached set lacks (the issuer rotated its keys) fetches
    /// the set again, at most once per this many seconds. Default 10.
    pub jwks_refetch_secs: u64,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        OAuthConfig {
            issuer: String::new(),
            jwks_url: None,
            audience: String::new(),
            tenant_claim: "sub".into(),
            scope_prefix: "gearbox:".into(),
            leeway_secs: 60,
            jwks_ttl_secs: 300,
            jwks_refetch_secs: 10,
        }
    }
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
            keys: BTreeMap::new(),
            oauth: None,
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
            quotas: QuotasConfig::default(),
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

/// `[pool]`: warm sandboxes per language, how the pool grows and shrinks, its budget, and the
/// life of a fork server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(from = "RawPoolConfig")]
pub struct PoolConfig {
    /// Runs one fork server serves before a fresh one replaces it (off the request path).
    /// What a fork cannot renew — the interpreter's hash seed, the address layout — is shared
    /// by the runs of one fork server only (docs/SECURITY.md). Default 1000.
    pub fork_server_max_runs: u64,
    /// Seconds a fork server serves before a fresh one replaces it. Default 600.
    pub fork_server_max_age_secs: u64,
    /// Seconds without a call of a language after which its warm sandboxes above the minimum
    /// are dropped (and, with a minimum of 0, its fork server stopped). Default 60; 0: never;
    /// at most 86400.
    pub idle_secs: u64,
    /// Memory the warm sandboxes of all languages may take together, in MiB: the pool holds
    /// at most this divided by the estimated cost of one warm sandbox
    /// ([`WARM_SANDBOX_MB`]). Default 64.
    pub memory_budget_mb: u64,
    /// Milliseconds after start at which the pool starts filling if no run is in flight then
    /// (it starts at once when the server's first run is over, and at the latest
    /// [`POOL_START_LATEST_MS`] later). Default 100; 0: at once; at most
    /// [`POOL_MAX_START_DELAY_MS`].
    pub start_delay_ms: u64,
    /// Warm sandboxes per language: `python = { min = 1, max = 4 }`, or `python = 2` (min 2,
    /// max [`POOL_MAX_PER_LANGUAGE`]).
    #[serde(flatten)]
    pub languages: BTreeMap<String, PoolSize>,
}

/// Most warm sandboxes one language may grow to.
pub const POOL_MAX_PER_LANGUAGE: usize = gearbox_sandbox::MAX_PER_KEY;
/// The longest `[pool] idle_secs` (a day); longer is surely a typo, 0 means never.
pub const POOL_MAX_IDLE_SECS: u64 = 86_400;
/// The longest `[pool] start_delay_ms` (a minute).
pub const POOL_MAX_START_DELAY_MS: u64 = 60_000;
/// How long after `start_delay_ms` a run in flight (a long one) holds the pool's start back.
pub const POOL_START_LATEST_MS: u64 = 2_000;
/// What one warm sandbox is estimated to cost (PSS of its processes, MiB; bench/rest_memory.py).
pub const WARM_SANDBOX_MB: u64 = 8;

/// How many warm sandboxes one language keeps: `min` at rest, up to `max` under demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(from = "RawPoolSize")]
pub struct PoolSize {
    /// Kept warm at rest (0: none, and no fork server once idle).
    pub min: usize,
    /// Grown to while calls find the pool empty.
    pub max: usize,
}

impl From<usize> for PoolSize {
    /// `python = 2`: two at rest, growing under demand up to the per-language cap.
    fn from(min: usize) -> PoolSize {
        PoolSize {
            min,
            max: min.max(POOL_MAX_PER_LANGUAGE),
        }
    }
}

/// A language's pool size as written: a count, or a table with `min` and/or `max`.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
enum RawPoolSize {
    Count(usize),
    Range {
        /// Kept warm at rest. Default 0.
        min: Option<usize>,
        /// Grown to under demand. Default: `min`, at least 1.
        max: Option<usize>,
    },
}

impl From<RawPoolSize> for PoolSize {
    fn from(raw: RawPoolSize) -> PoolSize {
        match raw {
            RawPoolSize::Count(n) => PoolSize::from(n),
            RawPoolSize::Range { min, max } => {
                let min = min.unwrap_or(0);
                PoolSize {
                    min,
                    max: max.unwrap_or(min.max(1)),
                }
            }
        }
    }
}

/// `[pool]` as written: languages listed replace the default ones; a table that sets only
/// other keys keeps the default languages; an empty one (`pool = {}`) turns the pool off.
#[derive(Deserialize, JsonSchema)]
struct RawPoolConfig {
    /// Runs one fork server serves before a fresh one replaces it (off the request path).
    /// What a fork cannot renew — the interpreter's hash seed, the address layout — is shared
    /// by the runs of one fork server only (docs/SECURITY.md). Default 1000.
    fork_server_max_runs: Option<u64>,
    /// Seconds a fork server serves before a fresh one replaces it. Default 600.
    fork_server_max_age_secs: Option<u64>,
    /// Seconds without a call of a language after which its warm sandboxes above the minimum
    /// are dropped (and, with a minimum of 0, its fork server stopped). Default 60; 0: never;
    /// at most 86400.
    idle_secs: Option<u64>,
    /// Memory the warm sandboxes of all languages may take together, in MiB. Default 64.
    memory_budget_mb: Option<u64>,
    /// Milliseconds after start at which the pool starts filling when no run is in flight
    /// (at once when the first run is over). Default 100; 0: at once; at most 60000.
    start_delay_ms: Option<u64>,
    /// Warm sandboxes per language: `python = { min = 1, max = 4 }`, or `python = 2` (min 2,
    /// max 8). Default `python = 1, javascript = 1, bash = 1`.
    #[serde(flatten)]
    languages: BTreeMap<String, PoolSize>,
}

impl From<RawPoolConfig> for PoolConfig {
    fn from(raw: RawPoolConfig) -> Self {
        let default = PoolConfig::default();
        let others_only = raw.fork_server_max_runs.is_some()
            || raw.fork_server_max_age_secs.is_some()
            || raw.idle_secs.is_some()
            || raw.memory_budget_mb.is_some()
            || raw.start_delay_ms.is_some();
        PoolConfig {
            fork_server_max_runs: raw
                .fork_server_max_runs
                .unwrap_or(default.fork_server_max_runs),
            fork_server_max_age_secs: raw
                .fork_server_max_age_secs
                .unwrap_or(default.fork_server_max_age_secs),
            idle_secs: raw.idle_secs.unwrap_or(default.idle_secs),
            memory_budget_mb: raw.memory_budget_mb.unwrap_or(default.memory_budget_mb),
            start_delay_ms: raw.start_delay_ms.unwrap_or(default.start_delay_ms),
            languages: if raw.languages.is_empty() && others_only {
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
            idle_secs: 60,
            memory_budget_mb: 64,
            start_delay_ms: 100,
            languages: [("python", 1), ("javascript", 1), ("bash", 1)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), PoolSize::from(v)))
                .collect(),
        }
    }
}

impl PoolConfig {
    /// The default fork-server life with exactly these warm sandboxes (minimum per language).
    pub fn only(languages: impl IntoIterator<Item = (String, usize)>) -> PoolConfig {
        PoolConfig {
            languages: languages
                .into_iter()
                .map(|(l, n)| (l, PoolSize::from(n)))
                .collect(),
            ..PoolConfig::default()
        }
    }

    /// Warm sandboxes the budget allows in total: `memory_budget_mb` / [`WARM_SANDBOX_MB`].
    pub fn budget_sandboxes(&self) -> usize {
        usize::try_from(self.memory_budget_mb / WARM_SANDBOX_MB).unwrap_or(usize::MAX)
    }

    /// Most warm sandboxes (ready or being built) of all languages together: what the memory
    /// budget allows, and never more than `[concurrency]` lets run and wait at once
    /// (`max_running`, 0 meaning the cores, plus `max_queued`).
    pub fn max_total(&self, concurrency: &ConcurrencyConfig) -> usize {
        self.budget_sandboxes()
            .min(concurrency.running().saturating_add(concurrency.max_queued))
    }

    /// How long a language may go without a call before it shrinks to its minimum (`None`:
    /// never, `idle_secs = 0`).
    pub fn idle(&self) -> Option<std::time::Duration> {
        (self.idle_secs > 0).then(|| std::time::Duration::from_secs(self.idle_secs))
    }

    /// Sizes that make sense: min ≤ max ≤ the per-language cap, an idle time of at most a
    /// day, a start delay of at most a minute, and the minima within the memory budget.
    pub fn validate(&self) -> Result<(), String> {
        for (language, size) in &self.languages {
            if size.min > size.max {
                return Err(format!(
                    "[pool] {language}: min ({}) is above max ({})",
                    size.min, size.max
                ));
            }
            if size.max > POOL_MAX_PER_LANGUAGE {
                return Err(format!(
                    "[pool] {language}: max ({}) is above {POOL_MAX_PER_LANGUAGE}, the most one \
                     language may keep",
                    size.max
                ));
            }
        }
        if self.idle_secs > POOL_MAX_IDLE_SECS {
            return Err(format!(
                "[pool] idle_secs ({}) is above {POOL_MAX_IDLE_SECS} (a day); give 0 to never \
                 shrink",
                self.idle_secs
            ));
        }
        if self.start_delay_ms > POOL_MAX_START_DELAY_MS {
            return Err(format!(
                "[pool] start_delay_ms ({}) is above {POOL_MAX_START_DELAY_MS} (a minute)",
                self.start_delay_ms
            ));
        }
        let minima: usize = self.languages.values().map(|s| s.min).sum();
        if minima > self.budget_sandboxes() {
            return Err(format!(
                "[pool] the minima ({minima} warm sandboxes) do not fit memory_budget_mb = {} \
                 (about {WARM_SANDBOX_MB} MiB each)",
                self.memory_budget_mb
            ));
        }
        Ok(())
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
            .and_then(|()| config.http.validate())
            .and_then(|()| gearbox_egress::check_secrets(&config.secrets))
            .and_then(|()| config.quotas.validate())
            .and_then(|()| config.pool.validate())
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
        assert_eq!(only.languages["python"], PoolSize { min: 2, max: 8 });
        assert_eq!(only.fork_server_max_runs, 1000);
        let life = parse("[pool]\nfork_server_max_runs = 5\nfork_server_max_age_secs = 9\n");
        assert_eq!(life.languages, PoolConfig::default().languages);
        assert_eq!(
            (life.fork_server_max_runs, life.fork_server_max_age_secs),
            (5, 9)
        );
        assert!(parse("pool = {}\n").languages.is_empty());
        assert_eq!(PoolConfig::default().idle_secs, 60);
        let idle = parse("[pool]\nidle_secs = 1\n");
        assert_eq!(idle.languages, PoolConfig::default().languages);
        assert_eq!(idle.idle(), Some(std::time::Duration::from_secs(1)));
        assert_eq!(parse("[pool]\npython = 1\nidle_secs = 0\n").idle(), None);
        for bad in [
            "[pool]\nidle_secs = -1\n",
            "[pool]\nidle_secs = \"5m\"\n",
            "[pool]\nidle_secs = 1.5\n",
            "[pool]\nidle_secs = 99999999999\n",
        ] {
            let err = Config::from_toml(Path::new("x.toml"), bad).expect_err(bad);
            assert!(err.to_string().contains("idle_secs"), "{bad}: {err}");
        }
        assert!(Config::from_toml(Path::new("x.toml"), "[pool]\npython = -1\n").is_err());
        assert_eq!(PoolConfig::default().start_delay_ms, 100);
        let delayed = parse("[pool]\nstart_delay_ms = 0\n");
        assert_eq!(delayed.languages, PoolConfig::default().languages);
        assert_eq!(delayed.start_delay_ms, 0);
        for bad in [
            "[pool]\nstart_delay_ms = -1\n",
            "[pool]\nstart_delay_ms = \"1s\"\n",
            "[pool]\nstart_delay_ms = 60001\n",
        ] {
            let err = Config::from_toml(Path::new("x.toml"), bad).expect_err(bad);
            assert!(err.to_string().contains("start_delay_ms"), "{bad}: {err}");
        }
        let elastic =
            parse("[pool]\npython = { min = 0, max = 2 }\nbash = { max = 3 }\nidle_secs = 5\n");
        assert_eq!(elastic.languages["python"], PoolSize { min: 0, max: 2 });
        assert_eq!(elastic.languages["bash"], PoolSize { min: 0, max: 3 });
        assert_eq!(elastic.idle_secs, 5);
        assert_eq!(
            parse("[pool]\npython = { min = 2 }\n").languages["python"].max,
            2
        );
        let idle_only = parse("[pool]\nidle_secs = 9\n");
        assert_eq!(idle_only.languages, PoolConfig::default().languages);
        let bad = |t: &str| {
            Config::from_toml(Path::new("x.toml"), t)
                .expect_err(t)
                .to_string()
        };
        assert!(
            bad("[pool]\npython = { min = 3, max = 2 }\n").contains("min (3) is above max (2)")
        );
        assert!(bad("[pool]\npython = { max = 9 }\n").contains("max (9)"));
        assert_eq!(parse("[pool]\nidle_secs = 0\n").idle(), None);
        assert!(bad("[pool]\npython = 8\nmemory_budget_mb = 16\n").contains("memory_budget_mb"));
        assert!(
            Config::from_toml(Path::new("x.toml"), "[pool]\npython = { min = \"a\" }\n").is_err()
        );
        assert!(PoolConfig::default().validate().is_ok());
        let sandbox = Config::from_toml(Path::new("x.toml"), "[sandbox]\nrequire_limits = true\n")
            .expect("parses");
        assert!(sandbox.sandbox.require_limits);
        assert!(Config::from_toml(Path::new("x.toml"), "[sandbox]\nrequire = true\n").is_err());
    }

    #[test]
    fn key_settings_and_oauth_parse_and_are_checked() {
        let parse = |t: &str| Config::from_toml(Path::new("x.toml"), t);
        let c = parse(
            "[http.keys.ci]\nmax_gear = \"restricted\"\n[http.keys.ops]\nadmin = true\n\
             tenant = \"team-a\"\n",
        )
        .expect("keys parse");
        assert_eq!(c.http.keys["ci"].max_gear, Some(Gear::Restricted));
        assert!(!c.http.keys["ci"].admin);
        assert!(c.http.keys["ops"].admin);
        assert_eq!(c.http.keys["ops"].tenant.as_deref(), Some("team-a"));
        let e = parse("[http.keys.ci]\nmax_gear = \"turbo\"\n").expect_err("bad gear");
        assert!(e.to_string().contains("turbo"), "{e}");
        let e = parse("[http.keys.ci]\ntenant = \"a b\"\n").expect_err("bad tenant");
        assert!(e.to_string().contains("tenant"), "{e}");
        let c = parse(
            "[http.oauth]\nissuer = \"https://id.example\"\naudience = \"https://g.example/mcp\"\n",
        )
        .expect("oauth parses");
        let o = c.http.oauth.expect("oauth");
        assert_eq!(
            (o.tenant_claim.as_str(), o.scope_prefix.as_str()),
            ("sub", "gearbox:")
        );
        let e = parse("[http.oauth]\nissuer = \"https://id.example\"\n").expect_err("no aud");
        assert!(e.to_string().contains("audience"), "{e}");
        let e = parse(
            "[http.oauth]\nissuer = \"https://id.example\"\naudience = \"x\"\n\
             tenant_claim = \"email\"\n",
        )
        .expect_err("claim");
        assert!(e.to_string().contains("tenant_claim"), "{e}");
        let e = parse("[http.oauth]\nissuer = \"id.example\"\naudience = \"x\"\n")
            .expect_err("not a URL");
        assert!(e.to_string().contains("issuer"), "{e}");
    }

    #[test]
    fn quotas_take_tenant_overrides_over_defaults() {
        let c = Config::from_toml(
            Path::new("x.toml"),
            "[quotas]\nruns_per_minute = 60\nmax_running = 2\n\
             [quotas.tenants.ci]\nruns_per_minute = 5\nmax_running = 0\n",
        )
        .expect("parses");
        let ci = c.quotas.for_tenant("ci");
        assert_eq!((ci.runs_per_minute, ci.max_running), (5, 0));
        let other = c.quotas.for_tenant("alice");
        assert_eq!((other.runs_per_minute, other.max_running), (60, 2));
        assert_eq!(other.cpu_seconds_per_hour, 0);
        assert_eq!(Config::default().quotas.for_tenant("x"), Quota::default());
        for (text, needle) in [
            ("[quotas.tenants.\"a b\"]\nmax_running = 1\n", "tenant name"),
            ("[quotas.tenants._other]\nmax_running = 1\n", "reserved"),
            (
                "[quotas]\nsession_storage_mb = 18446744073709551615\n",
                "bytes",
            ),
            ("[quotas.tenants.ci]\nrpm = 1\n", "rpm"),
            ("[quotas]\nmax_running = -1\n", "max_running"),
        ] {
            let e = Config::from_toml(Path::new("x.toml"), text).expect_err(text);
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
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
