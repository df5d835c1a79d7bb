//! Command-line parsing (as given) and dispatch (resolved settings).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use clap::{Parser, Subcommand};
use gearbox_core::{
    BackendKind, Capability, Encoding, ExecRequest, FileInput, Gear, LimitOverrides, Outcome,
    Status,
};
use gearbox_engine::config::ToolProfile;
use gearbox_engine::policy::{self, Verdict};
use gearbox_engine::{Config, Engine};
use gearbox_server::approvals::{LocalRequest, OpState, OpView, ask_local};

/// Exit status of `gearbox run` when the wall-clock limit expired.
pub const EXIT_TIMEOUT: u8 = 124;
/// Exit status when a resource limit killed the program.
pub const EXIT_KILLED: u8 = 125;
/// Exit status when policy refused the run.
pub const EXIT_DENIED: u8 = 126;
/// Exit status when the sandbox itself failed (the program never ran).
pub const EXIT_SANDBOX_FAILED: u8 = 70;

#[derive(Parser)]
#[command(
    name = "gearbox",
    version,
    about = "Run untrusted code in sandboxes chosen by policy"
)]
struct Cli {
    /// Configuration file (TOML). Defaults are used when absent.
    #[arg(long, global = true, env = "GEARBOX_CONFIG")]
    config: Option<PathBuf>,
    /// Log filter (tracing syntax), e.g. `info` or `gearbox=debug`. Logs go to stderr.
    #[arg(long, global = true, env = "GEARBOX_LOG", default_value = "warn")]
    log: String,
    /// Log format on stderr: `text` or `json` (one JSON object per line).
    #[arg(
        long,
        global = true,
        env = "GEARBOX_LOG_FORMAT",
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a file (or `-` for stdin) in a fresh sandbox and exit with the program's status.
    Run(RunArgs),
    /// Report which backends and languages work on this host, and why not.
    Doctor {
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of the configuration file.
    ConfigSchema,
    /// Serve MCP over stdin and stdout (MCP clients start it as
    /// `{"command": "gearbox", "args": ["serve"]}`), or over HTTP with `--http ADDR`.
    Serve(ServeArgs),
    /// Configuration file helpers.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Approve a run waiting for a human (`pending_approval`) on a running server.
    Approve {
        /// The operation id of the pending run.
        id: String,
        /// Words for the agent.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a run waiting for a human on a running server.
    Reject {
        /// The operation id of the pending run.
        id: String,
        /// Why (the agent reads it).
        #[arg(long)]
        reason: Option<String>,
    },
    /// List the runs waiting for a human on the running servers of this user (every
    /// tenant's: the local socket is the operator's).
    Approvals {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Only the operations of this tenant (an API key's tenant, a token's subject).
        #[arg(long)]
        tenant: Option<String>,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Tool profile to expose (repeatable): default, isolator, quickjs, heroku, sidecar,
    /// sessions, broker.
    /// Replaces the configuration's `profiles`.
    #[arg(long = "profile")]
    profiles: Vec<ToolProfile>,
    /// Serve over HTTP on ADDR instead of stdio: `127.0.0.1:8080`, `0.0.0.0` (port from
    /// `PORT`, else 8080), `:8080`; alone, loopback. Streamable HTTP at `/mcp`, the
    /// 2024-11-05 SSE transport at `/sse`, plus `/healthz`, `/readyz`, `/metrics`. API keys
    /// come from GEARBOX_API_KEYS=name:key,... and `[http] api_keys_file`.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "")]
    http: Option<String>,
    /// Allow a non-loopback `--http` address without API keys.
    #[arg(long, requires = "http")]
    insecure_no_auth: bool,
    /// Audit log file (one JSON line per execution); overrides `[audit] path`.
    #[arg(long, value_name = "FILE")]
    audit_log: Option<PathBuf>,
    /// Safety gear: read_only, restricted, user_confirmed, full_trust; overrides `gear`.
    #[arg(long)]
    gear: Option<Gear>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Write a commented example configuration (every value the default) to FILE, or stdout.
    Init {
        /// Destination; stdout when omitted.
        file: Option<PathBuf>,
        /// Overwrite FILE if it exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Program file, or `-` to read the program from stdin.
    file: String,
    /// Arguments passed to the program.
    #[arg(last = true)]
    args: Vec<String>,
    /// Language; taken from the file extension when omitted.
    #[arg(long, short)]
    language: Option<String>,
    /// Backend: linux (default), wasm (JavaScript in QuickJS), docker (a container per run,
    /// images from `[docker]` in the config), process (no isolation).
    #[arg(long)]
    backend: Option<BackendKind>,
    /// Wall-clock limit, e.g. `2s`, `500ms`, `1m`.
    #[arg(long, value_parser = parse_duration_ms)]
    timeout: Option<u64>,
    /// Memory limit, e.g. `128M`, `1G` (MiB when no unit).
    #[arg(long, value_parser = parse_size_mb)]
    memory: Option<u64>,
    /// Extra files or directories copied into the workspace (repeatable): regular files only,
    /// named relative to the directory given; at most 256, within the workspace size.
    #[arg(long = "files", short = 'f')]
    files: Vec<PathBuf>,
    /// File whose content is the program's stdin (default: none, the program reads EOF).
    #[arg(long)]
    stdin: Option<PathBuf>,
    /// Environment variable for the program, `NAME=VALUE` (repeatable).
    #[arg(long = "env", short = 'e')]
    env: Vec<String>,
    /// Print the outcome as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Write the files the program leaves under `/work/outputs/` into DIR (created if
    /// missing; an existing file is never overwritten). Without it they are only listed.
    #[arg(long, value_name = "DIR")]
    outputs: Option<PathBuf>,
    /// Safety gear: read_only, restricted, user_confirmed (asks at the terminal),
    /// full_trust; overrides the configuration's `gear`.
    #[arg(long)]
    gear: Option<Gear>,
    /// Ask for network for this run (the gear decides): `--network` alone for any public
    /// host, or `--network=data.example.org,*.cdn.example.org` for those hosts only (a port with
    /// `host:port`; without one, 80 and 443). Traffic goes through gearbox's egress proxy.
    #[arg(long, value_name = "HOSTS", num_args = 0..=1, require_equals = true, default_missing_value = "*any*")]
    network: Option<String>,
    /// A package the program imports, installed outside the sandbox into a cached layer
    /// (repeatable): `--package six`, `--package 'numpy==2.*'`, `--package is-number@^7`.
    #[arg(long = "package", short = 'p')]
    packages: Vec<String>,
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(&cli.log, cli.log_format);
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gearbox: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn init_tracing(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // Colours only for a terminal: a log file or a collector gets plain `key=value` text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

fn load_config(path: Option<&Path>) -> Result<Config> {
    match path {
        Some(p) => Ok(Config::load(p)?),
        None => Ok(Config::default()),
    }
}

fn engine(config: Config) -> Result<Engine> {
    let exe = std::env::current_exe().context("locating the gearbox binary")?;
    Ok(Engine::new(config, exe))
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    let config = load_config(cli.config.as_deref())?;
    match cli.command {
        // A one-shot run cannot use a warm pool.
        Command::Run(args) => run(
            engine(Config {
                pool: gearbox_engine::PoolConfig::only([]),
                ..config
            })?,
            args,
        ),
        Command::Doctor { json } => doctor(engine(config)?, json),
        Command::ConfigSchema => {
            println!("{}", serde_json::to_string_pretty(&Config::json_schema())?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => serve(engine(config)?, args),
        Command::Config(ConfigCommand::Init { file, force }) => config_init(file, force),
        Command::Approve { id, reason } => decide(&config, LocalRequest::Approve { id, reason }),
        Command::Reject { id, reason } => decide(&config, LocalRequest::Reject { id, reason }),
        Command::Approvals { json, tenant } => list_approvals(&config, json, tenant.as_deref()),
    }
}

fn print_op(v: &OpView) {
    let state = serde_json::to_value(v.state).unwrap_or_default();
    println!(
        "{}  {}  tenant {}  {} at {}  wants: {}  expires in {} s",
        v.operation_id,
        state.as_str().unwrap_or("?"),
        v.tenant,
        v.language,
        v.gear,
        if v.capabilities.is_empty() {
            "no capabilities (high risk)".to_string()
        } else {
            v.capabilities
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        },
        v.expires_in_secs
    );
    for line in v.summary.lines() {
        println!("    {line}");
    }
}

fn decide(config: &Config, req: LocalRequest) -> Result<ExitCode> {
    let dir = config.approvals.socket_dir();
    let views = ask_local(&dir, &req).map_err(anyhow::Error::msg)?;
    for v in &views {
        print_op(v);
    }
    let want = match req {
        LocalRequest::Approve { .. } => OpState::Approved,
        _ => OpState::Rejected,
    };
    Ok(if views.iter().any(|v| v.state == want) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn list_approvals(config: &Config, json: bool, tenant: Option<&str>) -> Result<ExitCode> {
    let dir = config.approvals.socket_dir();
    let mut views = ask_local(&dir, &LocalRequest::List).map_err(anyhow::Error::msg)?;
    if let Some(t) = tenant {
        views.retain(|v| v.tenant == t);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&views)?);
    } else if views.is_empty() {
        println!("no runs are waiting for a human");
    } else {
        for v in &views {
            print_op(v);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn serve(engine: Engine, args: ServeArgs) -> Result<ExitCode> {
    match gearbox_server::raise_open_files_limit() {
        Ok(n) => tracing::debug!(open_files = n, "open files limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open files limit"),
    }
    // Run cgroups that a killed server or helper left behind.
    gearbox_sandbox::sweep_stale_cgroups();
    let rt = runtime()?;
    let engine = std::sync::Arc::new(engine);
    {
        // The pool fills while the server starts, not at its first call.
        let _runtime = rt.enter();
        engine.start_pool();
    }
    let audit_path = args
        .audit_log
        .clone()
        .or_else(|| engine.config().audit.path.clone())
        .or_else(|| {
            args.http
                .is_some()
                .then(gearbox_server::audit::default_path)
        });
    let audit = audit_path.map(|p| {
        std::sync::Arc::new(gearbox_server::audit::AuditLog::open(
            p,
            &engine.config().audit,
        ))
    });
    let mut opts = gearbox_server::ServeOptions {
        profiles: args.profiles,
        audit,
        gear: args.gear,
        local_approvals: true,
        ..Default::default()
    };
    let result = match &args.http {
        None => rt.block_on(gearbox_server::serve_stdio(
            std::sync::Arc::clone(&engine),
            opts,
        )),
        Some(given) => {
            let addr =
                gearbox_server::http::resolve_addr(given, std::env::var("PORT").ok().as_deref())?;
            let mut keys = gearbox_server::http::ApiKeys::load(
                std::env::var(gearbox_server::http::auth::ENV_API_KEYS)
                    .ok()
                    .as_deref(),
                engine.config().http.api_keys_file.as_deref(),
            )
            .map_err(anyhow::Error::msg)?;
            keys.set_settings(&engine.config().http.keys)
                .map_err(anyhow::Error::msg)?;
            opts.transport = "http";
            opts.caller = "anonymous".into();
            let server = {
                let _runtime = rt.enter();
                gearbox_server::GearboxServer::new(std::sync::Arc::clone(&engine), opts)
            };
            rt.block_on(gearbox_server::http::run(
                server,
                addr,
                keys,
                args.insecure_no_auth,
            ))
        }
    };
    // The fork servers end and remove their cgroups; runs of a client that left were
    // cancelled, so do not wait on stragglers; then remove the run cgroups kept for reuse.
    rt.block_on(async {
        gearbox_server::end_all_live().await;
        engine.stop().await;
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    gearbox_sandbox::remove_spare_cgroups();
    result?;
    Ok(ExitCode::SUCCESS)
}

fn config_init(file: Option<PathBuf>, force: bool) -> Result<ExitCode> {
    let Some(path) = file else {
        print!("{}", gearbox_server::EXAMPLE_CONFIG);
        return Ok(ExitCode::SUCCESS);
    };
    if path.exists() && !force {
        bail!("{} exists; pass --force to overwrite it", path.display());
    }
    std::fs::write(&path, gearbox_server::EXAMPLE_CONFIG)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("gearbox: wrote {}", path.display());
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// The safety gear for `gearbox run`: `Some(outcome)` when the run is refused. The human
/// of `user_confirmed` is whoever sits at the terminal; without one, the run is refused.
fn apply_gear(engine: &Engine, req: &mut ExecRequest, args: &RunArgs) -> Result<Option<Outcome>> {
    let gear = args.gear.unwrap_or(engine.config().gear);
    let backend = args.backend.unwrap_or(engine.config().backend);
    if let Err(reason) = policy::network_within_gear(gear, &req.network, &engine.config().network) {
        return Ok(Some(Outcome::denied(
            &req.language,
            backend.as_str(),
            reason,
        )));
    }
    let eval = policy::evaluate(
        gear,
        policy::requested(req),
        policy::analyse(engine.language_table(), req),
        engine.config().approvals.ask_on_high_risk,
    );
    let caps = match eval.verdict {
        Verdict::Allow(caps) => caps,
        Verdict::Deny(reason) => {
            return Ok(Some(Outcome::denied(
                &req.language,
                backend.as_str(),
                reason,
            )));
        }
        Verdict::Ask(caps) => {
            let question = policy::question(
                &req.language,
                &req.packages,
                &req.network,
                &caps,
                &eval.report,
            );
            match ask_terminal(&question)? {
                Some(true) => caps,
                Some(false) => {
                    return Ok(Some(Outcome::denied(
                        &req.language,
                        backend.as_str(),
                        "declined at the terminal",
                    )));
                }
                None => {
                    return Ok(Some(Outcome::denied(
                        &req.language,
                        backend.as_str(),
                        format!(
                            "the {gear} gear asks a human about this run and no terminal is \
                             attached. {question}\nRun it interactively, or pass --gear \
                             full_trust{}",
                            if caps.contains(&Capability::Network) {
                                " --network"
                            } else {
                                ""
                            }
                        ),
                    )));
                }
            }
        }
    };
    if !caps.contains(&Capability::Network) {
        req.network = gearbox_core::Network::Off;
    }
    Ok(None)
}

/// Ask yes/no on the controlling terminal; `None` without one.
fn ask_terminal(question: &str) -> Result<Option<bool>> {
    use std::io::BufRead;
    let Ok(tty) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    else {
        return Ok(None);
    };
    let mut w = &tty;
    write!(w, "{question}\nRun it? [y/N] ")?;
    w.flush()?;
    let mut line = String::new();
    std::io::BufReader::new(&tty).read_line(&mut line)?;
    Ok(Some(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    )))
}

fn run(engine: Engine, args: RunArgs) -> Result<ExitCode> {
    let (code, from_name) = if args.file == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("reading the program from stdin")?;
        (s, None)
    } else {
        let p = PathBuf::from(&args.file);
        let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        (s, Some(p))
    };
    // The language is settled before the gear looks at the code: an unknown one is an
    // error of its own, not code the analysis could not read ("high risk").
    let language = match (&args.language, &from_name) {
        (Some(l), _) => engine
            .language_table()
            .normalize(l)
            .map_err(|e| anyhow::anyhow!("--{e}"))?,
        (None, Some(p)) => {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
            engine
                .language_table()
                .by_extension(ext)
                .map(str::to_string)
                .with_context(|| format!("no language for extension {ext:?}; pass --language"))?
        }
        (None, None) => bail!("reading the program from stdin needs --language"),
    };
    let entrypoint = from_name
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let mut collected = Collected {
        files: Vec::new(),
        bytes: 0,
        max_bytes: engine.config().limits.disk_mb.saturating_mul(1 << 20),
    };
    for f in &args.files {
        collected.add_path(f)?;
    }
    let files = collected.files;
    let mut env = BTreeMap::new();
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--env {kv:?} is not NAME=VALUE"))?;
        env.insert(k.to_string(), v.to_string());
    }
    let stdin = match &args.stdin {
        Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        None => Vec::new(),
    };
    let network = match args.network.as_deref() {
        None => gearbox_core::Network::Off,
        Some("*any*") => gearbox_core::Network::Any,
        Some(list) => {
            let hosts: Vec<&str> = list
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .collect();
            gearbox_core::Network::hosts(&hosts).map_err(|e| anyhow::anyhow!("--{e}"))?
        }
    };
    let req = ExecRequest {
        language,
        code,
        entrypoint,
        files,
        stdin,
        args: args.args.clone(),
        env,
        limits: LimitOverrides {
            timeout_ms: args.timeout,
            memory_mb: args.memory,
            ..Default::default()
        },
        network,
        mounts: Vec::new(),
        packages: args.packages.clone(),
    };
    let mut req = req;
    if let Some(o) = apply_gear(&engine, &mut req, &args)? {
        report(&o, args.json)?;
        return Ok(ExitCode::from(exit_status(&o)));
    }
    // One run, one thread: no worker threads to start and to join at the end.
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(engine.execute(req, args.backend));
    report(&outcome, args.json)?;
    save_outputs(&outcome, args.outputs.as_deref(), args.json)?;
    Ok(ExitCode::from(exit_status(&outcome)))
}

/// Write a run's outputs into `dir` (their paths under `outputs/`), or list them on stderr.
/// The paths were checked when they left the sandbox (relative, no `..`); each file is
/// created new, never through a symlink.
fn save_outputs(outcome: &Outcome, dir: Option<&Path>, json: bool) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    for note in &outcome.outputs_skipped {
        eprintln!("gearbox: output not kept: {note}");
    }
    let Some(dir) = dir else {
        if !json {
            for f in &outcome.outputs {
                eprintln!(
                    "gearbox: output /work/{} ({} bytes; --outputs DIR writes it)",
                    f.path, f.size
                );
            }
        }
        return Ok(());
    };
    for f in &outcome.outputs {
        let rel = f.path.strip_prefix("outputs/").unwrap_or(&f.path);
        gearbox_core::validate_relative_path("output", rel).map_err(|e| anyhow::anyhow!("{e}"))?;
        let dest = dir.join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dest)
            .and_then(|mut out| out.write_all(&f.content))
            .with_context(|| format!("writing {}", dest.display()))?;
    }
    Ok(())
}

fn report(outcome: &Outcome, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(outcome)?);
        return Ok(());
    }
    std::io::stdout().write_all(outcome.stdout.as_bytes())?;
    std::io::stdout().flush()?;
    std::io::stderr().write_all(outcome.stderr.as_bytes())?;
    if !matches!(outcome.status, Status::Ok | Status::Error) || outcome.reason.is_some() {
        eprintln!("gearbox: {}: {}", outcome.status, outcome.summary());
    }
    Ok(())
}

/// The exit status that mirrors an outcome.
fn exit_status(o: &Outcome) -> u8 {
    match o.status {
        Status::Ok => 0,
        Status::Timeout => EXIT_TIMEOUT,
        Status::Killed => EXIT_KILLED,
        Status::Denied | Status::PendingApproval => EXIT_DENIED,
        Status::Error => match (o.exit_code, o.signal) {
            (_, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
            (Some(code), None) => u8::try_from(code & 0xff).unwrap_or(1).max(1),
            (None, None) => EXIT_SANDBOX_FAILED,
        },
    }
}

/// The files of `--files`, collected.
struct Collected {
    files: Vec<FileInput>,
    /// Their bytes (as read, not as encoded), against `max_bytes`.
    bytes: u64,
    max_bytes: u64,
}

impl Collected {
    /// Add `path` (a file, or a directory walked recursively), named relative to it. The
    /// walk stops as soon as the files could not be taken anyway: more than a run takes
    /// ([`gearbox_core::request::MAX_FILES`]) or more bytes than its workspace holds
    /// (`max_bytes`), so that `--files ~` is a clear error, not a read of the whole tree into
    /// memory. Every error names the path it is about; what is neither a file nor a
    /// directory (a FIFO, a socket, a device, a symlink) is left out.
    fn add_path(&mut self, path: &Path) -> Result<()> {
        let meta =
            std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        if meta.is_file() {
            let name = path
                .file_name()
                .context("file without a name")?
                .to_string_lossy()
                .into_owned();
            return self.add_file(name, path);
        }
        self.walk(path, path)
    }

    fn walk(&mut self, root: &Path, dir: &Path) -> Result<()> {
        let listing = |e| anyhow::Error::new(e).context(format!("listing {}", dir.display()));
        for entry in std::fs::read_dir(dir).map_err(listing)? {
            let p = entry.map_err(listing)?.path();
            let ft = std::fs::symlink_metadata(&p)
                .with_context(|| format!("reading {}", p.display()))?
                .file_type();
            if ft.is_dir() {
                self.walk(root, &p)?;
            } else if ft.is_file() {
                let rel = p.strip_prefix(root)?.to_string_lossy().into_owned();
                self.add_file(rel, &p)?;
            }
        }
        Ok(())
    }

    fn add_file(&mut self, name: String, file: &Path) -> Result<()> {
        let max_files = gearbox_core::request::MAX_FILES;
        if self.files.len() >= max_files {
            bail!(
                "--files: more than {max_files} files (at {}); a run takes at most {max_files}",
                file.display()
            );
        }
        let size = std::fs::metadata(file)
            .with_context(|| format!("reading {}", file.display()))?
            .len();
        if self.bytes + size > self.max_bytes {
            bail!(
                "--files: more than {} MiB (at {}); the files must fit the run's workspace",
                self.max_bytes >> 20,
                file.display()
            );
        }
        let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        self.bytes += bytes.len() as u64;
        self.files.push(file_input(name, &bytes));
        Ok(())
    }
}

fn file_input(filename: String, bytes: &[u8]) -> FileInput {
    match std::str::from_utf8(bytes) {
        Ok(s) => FileInput {
            filename,
            content: s.to_string(),
            encoding: Encoding::Utf8,
        },
        Err(_) => FileInput {
            filename,
            content: base64::engine::general_purpose::STANDARD.encode(bytes),
            encoding: Encoding::Base64,
        },
    }
}

fn doctor(engine: Engine, json: bool) -> Result<ExitCode> {
    let backends = engine.probe();
    let languages = engine.languages(true);
    if json {
        let unenforced = gearbox_sandbox::unenforced_limits();
        let limits = serde_json::json!({
            "whole_run": unenforced.is_none(),
            "cgroups": unenforced,
            "require_limits": engine.config().sandbox.require_limits,
        });
        let v = serde_json::json!({
            "backends": backends,
            "languages": languages,
            "limits": limits,
            "helper": engine.helper(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("helper: {}", engine.helper().display());
    println!("backends:");
    for b in &backends {
        let mark = if b.available { "ok " } else { "NO " };
        println!("  [{mark}] {}", b.backend);
        for d in &b.details {
            println!("        {d}");
        }
    }
    let require = engine.config().sandbox.require_limits;
    match (gearbox_sandbox::unenforced_limits(), require) {
        (None, _) => println!("limits: each linux run bounded as a whole by its own cgroup"),
        (Some(why), false) => println!(
            "limits: WEAKER on this host, cgroups {why}: memory sampled, CPU time per process \
             (set [sandbox] require_limits = true to refuse runs here)"
        ),
        (Some(why), true) => {
            println!("limits: cgroups {why}: linux runs REFUSED ([sandbox] require_limits = true)")
        }
    }
    let pool = &engine.config().pool.languages;
    if pool.is_empty() {
        println!("warm pool (gearbox serve): off");
    } else {
        let sizes: Vec<String> = pool
            .iter()
            .map(|(l, n)| format!("{l} {}..{}", n.min, n.max))
            .collect();
        println!(
            "warm pool (gearbox serve): {} (live sizes, hits and refill times: /metrics)",
            sizes.join(", ")
        );
    }
    println!("languages:");
    for l in &languages {
        match (&l.interpreter, &l.unavailable) {
            (Some(i), _) => println!(
                "  [ok ] {:<11} {} ({})",
                l.name,
                i,
                l.version.as_deref().unwrap_or("version unknown")
            ),
            (None, Some(why)) => println!("  [NO ] {:<11} {why}", l.name),
            (None, None) => println!("  [NO ] {}", l.name),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `2s`, `500ms`, `1m`, `1.5s`; a bare number is seconds.
fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (s, 1000.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 2s or 500ms"))?;
    if v.is_nan() || v <= 0.0 {
        return Err(format!("{s:?} must be positive"));
    }
    Ok((v * mult).round() as u64)
}

/// `128M`, `1G`, `512` (MiB), `64MiB`.
fn parse_size_mb(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.trim_end_matches("IB").trim_end_matches('B');
    let (num, mult) = if let Some(n) = t.strip_suffix('G') {
        (n, 1024.0)
    } else if let Some(n) = t.strip_suffix('M') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('K') {
        (n, 1.0 / 1024.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 128M or 1G"))?;
    let mb = (v * mult).ceil();
    if mb.is_nan() || mb < 1.0 {
        return Err(format!("{s:?} is below 1 MiB"));
    }
    Ok(mb as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(parse_duration_ms("2s"), Ok(2000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("1m"), Ok(60_000));
        assert_eq!(parse_duration_ms("3"), Ok(3000));
        assert!(parse_duration_ms("soon").is_err());
        assert!(parse_duration_ms("0s").is_err());
        assert_eq!(parse_size_mb("128M"), Ok(128));
        assert_eq!(parse_size_mb("1G"), Ok(1024));
        assert_eq!(parse_size_mb("64MiB"), Ok(64));
        assert!(parse_size_mb("lots").is_err());
    }
}
