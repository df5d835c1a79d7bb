//! The tools of each profile: their definitions (name, schemas, annotations) and the mapping
//! from their arguments to an [`ExecRequest`], and from an [`Outcome`] to their result shape.

use gearbox_core::{BackendKind, Capability, ExecRequest, LimitOverrides, Outcome, Status};
use gearbox_engine::Engine;
use gearbox_engine::config::ToolProfile;
use rmcp::model::{CallToolResult, ContentBlock, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::approvals::OpView;
use crate::args::{
    ApprovalStatusArgs, CodeExecPythonArgs, ExecuteCodeArgs, NetworkArg, NoArgs, RunJavascriptArgs,
    SidecarExecuteArgs,
};
use crate::snippets;
use gearbox_engine::policy::PolicyReport;

/// What a tool name dispatches to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    ExecuteCode,
    RunJavascript,
    CodeExecPython,
    SidecarExecute,
    ListPackages,
    ApprovalStatus,
    /// `exec_open`, `exec_run`, `exec_close`, `exec_get_artifact` (see `sessions.rs`).
    Session,
    /// A discovery tool of the `broker` profile.
    Broker(crate::broker::BrokerTool),
}

/// The result of `code_exec_python` (heroku profile): the shape of `subprocess.run`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HerokuOutput {
    /// Exit status; `-N` when signal N ended the program, `-1` when it never ran.
    pub returncode: i32,
    pub stdout: String,
    /// Standard error, followed by gearbox's reason when the run was stopped or refused.
    pub stderr: String,
}

/// One installed Python distribution.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Distribution {
    pub name: String,
    pub version: String,
}

/// The result of `list_packages` (sidecar profile), gathered by running Python in the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PackageList {
    /// Version of the Python interpreter the sandbox runs.
    pub python: String,
    /// Installed distributions (`pip list`): name and version.
    pub distributions: Vec<Distribution>,
    /// Importable top-level modules, the standard library included.
    pub modules: Vec<String>,
    /// Package layers already installed on this server (calls with the same `packages`
    /// start without installing), most recently used first.
    #[serde(default)]
    pub layers: Vec<gearbox_engine::gearbox_packages::LayerInfo>,
}

const EXECUTE_CODE_DESCRIPTION: &str = "Run a program in a fresh, isolated sandbox and return \
its output. Give `language` (python, javascript, go or bash) and `code`, or the `snippet_name` \
of a stored snippet. The program runs with /work as its working directory (your \
`additional_files` are there), /tmp for scratch, no network, and time and memory limits; \
nothing persists between calls. Returns stdout, stderr, exit status and timing; \
the call is an error when the program fails, times out or is refused. \
The server's safety gear governs capabilities: when the code needs the network, pass \
`network` with the hosts it needs (e.g. [\"data.example.org\"]) or `true` for any public host (it goes \
through the server's egress proxy; HTTP_PROXY is set); depending on the gear the call is refused (with the analysis findings, so you can \
rewrite the code), run, or put to a human (`status: pending_approval` with an \
`operation_id`: once approved, call again with the same arguments plus `operation_id`, or \
call `approval_status`). Read the resource gearbox://env for versions and limits.";

/// The structured result of the tools whose output is an outcome: the outcome, and what the
/// safety gear decided.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ExecuteResult {
    #[serde(flatten)]
    pub outcome: Outcome,
    /// What the safety gear decided: gear, risk, capabilities asked for, detected and
    /// granted, who decided, analysis findings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyReport>,
    /// Set when `status` is `pending_approval`: approve it out of band, then call again
    /// with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// The tools `profiles` expose, in profile order, each name once.
pub fn tools_for(profiles: &[ToolProfile]) -> Vec<(ToolKind, Tool)> {
    let mut out: Vec<(ToolKind, Tool)> = Vec::new();
    let mut push = |kind: ToolKind, tool: Tool| {
        if !out.iter().any(|(_, t)| t.name == tool.name) {
            out.push((kind, standard_schemas(tool)));
        }
    };
    for p in profiles {
        match p {
            ToolProfile::Default => {
                push(ToolKind::ExecuteCode, execute_code_tool());
                push(ToolKind::ApprovalStatus, approval_status_tool());
            }
            ToolProfile::Isolator => {
                push(ToolKind::ExecuteCode, execute_code_tool());
            }
            ToolProfile::Quickjs => {
                push(ToolKind::RunJavascript, run_javascript_tool());
            }
            ToolProfile::Heroku => {
                push(ToolKind::CodeExecPython, code_exec_python_tool());
            }
            ToolProfile::Sessions => {
                let exec = execute_code_tool();
                push(ToolKind::ExecuteCode, exec.clone());
                for tool in crate::sessions::tools(&exec) {
                    push(ToolKind::Session, tool);
                }
            }
            ToolProfile::Sidecar => {
                push(ToolKind::SidecarExecute, sidecar_execute_tool());
                push(ToolKind::ListPackages, list_packages_tool());
            }
            ToolProfile::Broker => {
                for (b, tool) in crate::broker::tools() {
                    push(ToolKind::Broker(b), tool);
                }
            }
        }
    }
    out
}

fn runs_code() -> ToolAnnotations {
    // A run cannot change anything outside its own throw-away sandbox, has no network, and
    // its result depends on the code (time, randomness): not read-only, not destructive,
    // not idempotent, closed world.
    ToolAnnotations::new()
        .read_only(false)
        .destructive(false)
        .idempotent(false)
        .open_world(false)
}

fn execute_code_tool() -> Tool {
    Tool::new("execute_code", EXECUTE_CODE_DESCRIPTION, empty_schema())
        .with_title("Execute code in a sandbox")
        .with_input_schema::<ExecuteCodeArgs>()
        .with_output_schema::<ExecuteResult>()
        .with_annotations(runs_code().with_title_str("Execute code in a sandbox"))
}

fn approval_status_tool() -> Tool {
    Tool::new(
        "approval_status",
        "Check a run that waits for a human's approval (the `operation_id` of a \
         `pending_approval` result). Still pending: returns `pending_approval` again. Approved: \
         runs exactly the approved code once and returns its result. Rejected or expired: \
         returns `denied` with the human's answer.",
        empty_schema(),
    )
    .with_title("Approval status")
    .with_input_schema::<ApprovalStatusArgs>()
    .with_output_schema::<ExecuteResult>()
    .with_annotations(runs_code().with_title_str("Approval status"))
}

fn run_javascript_tool() -> Tool {
    Tool::new(
        "run_javascript_code",
        "Run JavaScript code and return what it printed on stdout and stderr: QuickJS in \
         WebAssembly where this server has the wasm backend, else Node.js in a Linux sandbox. \
         No network, nothing persists, time and memory limits.",
        empty_schema(),
    )
    .with_title("Run JavaScript")
    .with_input_schema::<RunJavascriptArgs>()
    .with_output_schema::<Outcome>()
    .with_annotations(runs_code().with_title_str("Run JavaScript"))
}

fn code_exec_python_tool() -> Tool {
    Tool::new(
        "code_exec_python",
        "Execute Python code in a fresh sandbox and return {returncode, stdout, stderr}. \
         `packages` (e.g. [\"requests\", \"numpy==2.*\"]) are installed before the run, \
         outside the sandbox, into a cached read-only layer on the import path (the first \
         install of a set takes seconds, later runs reuse it); the server's safety gear \
         decides whether installs are allowed. `use_temp_dir` is accepted and always true in \
         effect: every run gets a fresh private directory. No network during the run.",
        empty_schema(),
    )
    .with_title("Execute Python")
    .with_input_schema::<CodeExecPythonArgs>()
    .with_output_schema::<HerokuOutput>()
    .with_annotations(runs_code().with_title_str("Execute Python"))
}

fn sidecar_execute_tool() -> Tool {
    Tool::new(
        "execute",
        "Execute code (python by default; also javascript, go, bash) in a fresh sandbox and \
         return stdout, stderr and exit_code. No network; time and memory limits.",
        empty_schema(),
    )
    .with_title("Execute code")
    .with_input_schema::<SidecarExecuteArgs>()
    .with_output_schema::<Outcome>()
    .with_annotations(runs_code().with_title_str("Execute code"))
}

fn list_packages_tool() -> Tool {
    Tool::new(
        "list_packages",
        "List the Python distributions installed for the sandbox's interpreter (name and \
         version, like `pip list`) and its importable top-level modules, gathered by running \
         Python in the sandbox (exactly what runs without `packages` can import), and the \
         package layers cached on this server.",
        empty_schema(),
    )
    .with_title("List Python packages")
    .with_input_schema::<NoArgs>()
    .with_output_schema::<PackageList>()
    .with_annotations(
        ToolAnnotations::new()
            .read_only(true)
            .destructive(false)
            .idempotent(true)
            .open_world(false)
            .with_title_str("List Python packages"),
    )
}

/// The `format` values JSON Schema (draft 2020-12) defines.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Tool schemas in standard JSON Schema: schemars writes its own formats for Rust integer
/// types (`uint64`, `int32`...), which strict validators (the TypeScript SDK's) warn about or
/// refuse. They go; an unsigned integer keeps (or gets) `minimum: 0`. Then each schema is
/// compacted (`schema.rs`: documented enums as `enum`, `$ref`s inlined), meaning unchanged.
/// Last, every tool's input schema loses `null` (`schema::without_nulls`): optional
/// arguments are simply absent, and a single `type` maps onto every client's schema dialect
/// (Gemini's OpenAPI subset included). Output schemas keep theirs: those fields really are
/// `null` at times.
fn standard_schemas(mut tool: Tool) -> Tool {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(map) => {
                let custom = map
                    .get("format")
                    .and_then(|f| f.as_str())
                    .filter(|f| !STANDARD_FORMATS.contains(f))
                    .map(str::to_string);
                if let Some(format) = custom {
                    map.remove("format");
                    if format.starts_with("uint") && !map.contains_key("minimum") {
                        map.insert("minimum".into(), serde_json::json!(0));
                    }
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    fn fix(
        schema: &std::sync::Arc<rmcp::model::JsonObject>,
        input: bool,
    ) -> std::sync::Arc<rmcp::model::JsonObject> {
        let mut v = serde_json::Value::Object(schema.as_ref().clone());
        walk(&mut v);
        crate::schema::compact(&mut v);
        if input {
            crate::schema::without_nulls(&mut v);
        }
        match v {
            serde_json::Value::Object(map) => std::sync::Arc::new(map),
            _ => schema.clone(),
        }
    }
    tool.input_schema = fix(&tool.input_schema, true);
    tool.output_schema = tool.output_schema.as_ref().map(|s| fix(s, false));
    tool
}

fn empty_schema() -> std::sync::Arc<rmcp::model::JsonObject> {
    std::sync::Arc::new(rmcp::model::JsonObject::new())
}

trait WithTitle {
    fn with_title_str(self, title: &str) -> Self;
}

impl WithTitle for ToolAnnotations {
    fn with_title_str(mut self, title: &str) -> Self {
        self.title = Some(title.to_string());
        self
    }
}

/// A call turned into a run, or refused before anything ran.
pub enum Prepared {
    Run {
        request: ExecRequest,
        backend: Option<BackendKind>,
    },
    Refused(Outcome),
}

/// Validate `execute_code` arguments that the engine does not check itself: code or snippet,
/// the aliases, the language.
pub fn prepare_execute_code(engine: &Engine, a: ExecuteCodeArgs) -> Prepared {
    let backend_name = a.backend.unwrap_or(engine.config().backend).to_string();
    let lang_hint = a.language.clone().unwrap_or_default();
    let refuse =
        |reason: String| Prepared::Refused(Outcome::denied(&lang_hint, &backend_name, reason));
    let table = engine.language_table();

    if a.backend == Some(BackendKind::Process) && engine.config().backend != BackendKind::Process {
        return refuse(
            "backend: process gives no isolation; only the server's configuration can choose it"
                .into(),
        );
    }
    let code = match (a.code, a.entrypoint_code) {
        (Some(_), Some(_)) => {
            return refuse("give either code or entrypoint_code (its alias), not both".into());
        }
        (c, e) => c.or(e),
    };
    let files = match (a.additional_files, a.files) {
        (Some(_), Some(_)) => {
            return refuse("give either additional_files or files (its alias), not both".into());
        }
        (f, g) => f.or(g).unwrap_or_default(),
    };
    let (language, code, entrypoint) = match (a.snippet_name, code) {
        (Some(_), Some(_)) => {
            return refuse("snippet_name and code are mutually exclusive; give one".into());
        }
        (None, None) => {
            return refuse("code: missing; give language and code, or snippet_name".into());
        }
        (Some(name), None) => {
            let snippet =
                match snippets::load(engine.config().snippets_dir.as_deref(), table, &name) {
                    Ok(s) => s,
                    Err(e) => return refuse(e),
                };
            if let Some(l) = &a.language {
                match table.normalize(l) {
                    Ok(l) if l == snippet.info.language => {}
                    Ok(l) => {
                        return refuse(format!(
                            "language: {l} does not match snippet {:?}, which is {}",
                            snippet.info.filename, snippet.info.language
                        ));
                    }
                    Err(e) => return refuse(e),
                }
            }
            (
                snippet.info.language,
                snippet.content,
                Some(snippet.info.filename),
            )
        }
        (None, Some(code)) => {
            let Some(raw) = &a.language else {
                return refuse("language: missing; it is required with code".into());
            };
            match table.normalize(raw) {
                Ok(l) => (l, code, None),
                Err(e) => return refuse(e),
            }
        }
    };
    let network = match a.network.as_ref().map(NetworkArg::to_network) {
        None => gearbox_core::Network::Off,
        Some(Ok(n)) => n,
        Some(Err(e)) => return refuse(e),
    };
    Prepared::Run {
        request: ExecRequest {
            language,
            code,
            entrypoint: a.entrypoint_filename.or(entrypoint),
            files,
            stdin: a.stdin.unwrap_or_default().into_bytes(),
            args: a.args.unwrap_or_default(),
            env: a.env.unwrap_or_default(),
            limits: LimitOverrides {
                timeout_ms: a.timeout_ms,
                memory_mb: a.memory_mb,
                ..Default::default()
            },
            network,
            mounts: Vec::new(),
            packages: a.packages.unwrap_or_default(),
        },
        backend: a.backend,
    }
}

/// `run_javascript_code`: QuickJS-in-WASM when the engine has that backend, else Node.js on
/// the default backend.
pub fn prepare_run_javascript(engine: &Engine, a: RunJavascriptArgs) -> Prepared {
    let backend = engine
        .backend_kinds()
        .contains(&BackendKind::Wasm)
        .then_some(BackendKind::Wasm);
    Prepared::Run {
        request: simple_request("javascript", a.code),
        backend,
    }
}

/// `code_exec_python`: `packages` become the run's package layer (the gear decides).
pub fn prepare_code_exec_python(_engine: &Engine, a: CodeExecPythonArgs) -> Prepared {
    // Every run already gets a fresh, private directory and packages their own layer:
    // `use_temp_dir` changes nothing.
    let _ = a.use_temp_dir;
    let mut request = simple_request("python", a.code);
    request.packages = a.packages.unwrap_or_default();
    Prepared::Run {
        request,
        backend: None,
    }
}

/// `execute` of the sidecar profile.
pub fn prepare_sidecar_execute(engine: &Engine, a: SidecarExecuteArgs) -> Prepared {
    let raw = a.language.unwrap_or_else(|| "python".into());
    match engine.language_table().normalize(&raw) {
        Ok(language) => Prepared::Run {
            request: simple_request(&language, a.code),
            backend: None,
        },
        Err(e) => Prepared::Refused(Outcome::denied(&raw, engine.config().backend.as_str(), e)),
    }
}

/// The program `list_packages` runs: prints one JSON object shaped like [`PackageList`].
pub const LIST_PACKAGES_PY: &str = r#"import json, pkgutil, sys
import importlib.metadata as md
dists = {}
for d in md.distributions():
    name = d.metadata["Name"]
    if name:
        dists[name.lower()] = {"name": name, "version": d.version}
mods = set(sys.builtin_module_names)
mods.update(m.name for m in pkgutil.iter_modules() if not m.name.startswith("_"))
print(json.dumps({
    "python": sys.version.split()[0],
    "distributions": sorted(dists.values(), key=lambda d: d["name"].lower()),
    "modules": sorted(mods),
}))
"#;

pub fn prepare_list_packages() -> Prepared {
    Prepared::Run {
        request: simple_request("python", LIST_PACKAGES_PY.to_string()),
        backend: None,
    }
}

fn simple_request(language: &str, code: String) -> ExecRequest {
    ExecRequest {
        language: language.to_string(),
        code,
        ..Default::default()
    }
}

/// Add what the gear decided to a result whose structured output is an outcome.
pub fn with_policy(mut r: CallToolResult, policy: &PolicyReport) -> CallToolResult {
    if let Some(serde_json::Value::Object(map)) = r.structured_content.as_mut() {
        map.insert(
            "policy".into(),
            serde_json::to_value(policy).unwrap_or_default(),
        );
    }
    if !policy.granted.is_empty() || policy.decided_by != "gear" {
        let line = format!(
            "--- policy ---\ngear {}; granted: {}; decided by {}\n",
            policy.gear,
            if policy.granted.is_empty() {
                "nothing extra".to_string()
            } else {
                policy
                    .granted
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            policy.decided_by
        );
        r.content.push(ContentBlock::text(line));
    }
    // What analysis found in the code that the run was not given: say how to ask for it.
    let missing: Vec<&Capability> = policy
        .detected
        .iter()
        .filter(|c| !policy.granted.contains(c))
        .collect();
    if !missing.is_empty() {
        let asks: Vec<String> = missing
            .iter()
            .map(|c| match c {
                Capability::Network => "`network` (the hosts it needs, or `true`)".to_string(),
                Capability::Packages => "`packages`".to_string(),
                Capability::Tools => "`allow_tools`".to_string(),
                other => format!("`{}`", other.as_str()),
            })
            .collect();
        r.content.push(ContentBlock::text(format!(
            "--- policy ---\nthe code seems to use {}, which this run did not have; if it \
             needs it, call again with {}\n",
            missing
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            asks.join(" and ")
        )));
    }
    r
}

/// A run waiting for a human: `pending_approval`, the operation id, what was asked and how
/// to approve. Not an error: the agent should wait and call again.
pub fn pending_result(backend: &str, view: &OpView, policy: &PolicyReport) -> CallToolResult {
    let (o, how) = pending_outcome(backend, view);
    let id = &view.operation_id;
    let result = ExecuteResult {
        outcome: o,
        policy: Some(PolicyReport {
            operation_id: Some(id.clone()),
            ..policy.clone()
        }),
        operation_id: Some(id.clone()),
    };
    let text = format!(
        "Pending approval ({id}): {how}\n\nWhat the human is asked:\n{}\n",
        view.summary
    );
    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
    r.structured_content = serde_json::to_value(&result).ok();
    r
}

/// A `pending_approval` outcome for `view`, and the how-to-approve text it carries.
pub fn pending_outcome(backend: &str, view: &OpView) -> (Outcome, String) {
    let id = &view.operation_id;
    let how = format!(
        "Waiting for a human to approve operation {id} (expires in {} s). A human approves \
         it with `gearbox approve {id}` on the server's host, or `POST /approvals/{id}` on \
         its HTTP daemon. Then call execute_code again with the same arguments plus \
         operation_id {id:?}, or call approval_status with it.",
        view.expires_in_secs
    );
    let mut o = Outcome::denied(&view.language, backend, how.clone());
    o.status = Status::PendingApproval;
    (o, how)
}

/// The result of a tool whose structured output is the outcome itself.
pub fn outcome_result(o: &Outcome) -> CallToolResult {
    let mut text = vec![ContentBlock::text(o.render_text())];
    text.extend(
        o.pictures
            .iter()
            .map(|p| ContentBlock::image(p.data.clone(), p.mime.clone())),
    );
    // A link per output the server keeps (a run without a session); a picture's full size
    // is one of them.
    for f in &o.outputs {
        let Some(uri) = &f.uri else { continue };
        let full = o
            .pictures
            .iter()
            .any(|p| p.full.as_deref() == Some(&f.path));
        let mut res = rmcp::model::Resource::new(uri.clone(), f.path.clone())
            .with_mime_type(f.mime_type.clone())
            .with_size(f.size);
        if full {
            res = res.with_description("the full-size picture");
        }
        text.push(ContentBlock::resource_link(res));
    }
    let mut r = if o.is_ok() {
        CallToolResult::success(text)
    } else {
        CallToolResult::error(text)
    };
    r.structured_content = serde_json::to_value(o).ok();
    r
}

/// `code_exec_python`'s result: `{returncode, stdout, stderr}` as structured content and as
/// JSON text, like the original server.
pub fn heroku_result(o: &Outcome) -> CallToolResult {
    let mut stderr = o.stderr.clone();
    if o.status != Status::Ok && o.reason.is_some() {
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            stderr.push('\n');
        }
        stderr.push_str(&format!("gearbox: {}: {}\n", o.status, o.summary()));
    }
    let out = HerokuOutput {
        returncode: o.exit_code.or(o.signal.map(|s| -s)).unwrap_or(-1),
        stdout: o.stdout.clone(),
        stderr,
    };
    let value = serde_json::to_value(&out).unwrap_or_default();
    let text = vec![ContentBlock::text(value.to_string())];
    let mut r = if o.is_ok() {
        CallToolResult::success(text)
    } else {
        CallToolResult::error(text)
    };
    r.structured_content = Some(value);
    r
}

/// `list_packages`' result from the run of [`LIST_PACKAGES_PY`] and the cached layers.
pub fn packages_result(engine: &Engine, o: &Outcome) -> CallToolResult {
    if o.is_ok()
        && let Ok(mut list) = serde_json::from_str::<PackageList>(o.stdout.trim())
    {
        list.layers = engine.package_layers(Some("python"));
        let names: Vec<String> = list
            .distributions
            .iter()
            .map(|d| format!("{}=={}", d.name, d.version))
            .collect();
        let mut text = format!(
            "Python {}\ninstalled distributions ({}): {}\nimportable top-level modules: {}\n",
            list.python,
            names.len(),
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            },
            list.modules.len()
        );
        text.push_str(&format!("cached package layers: {}\n", list.layers.len()));
        for l in &list.layers {
            let pkgs: Vec<String> = l
                .packages
                .iter()
                .map(|p| format!("{}=={}", p.name, p.version))
                .collect();
            text.push_str(&format!(
                "  packages={:?}: {}\n",
                l.requirements,
                pkgs.join(", ")
            ));
        }
        let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
        r.structured_content = serde_json::to_value(&list).ok();
        return r;
    }
    let mut text = String::from("Could not list packages: the listing program failed.\n");
    text.push_str(&o.render_text());
    CallToolResult::error(vec![ContentBlock::text(text)])
}

/// An argument error of a tool whose output is the outcome: a `denied` outcome naming the
/// field, so that the structured result still matches the output schema.
pub fn argument_error(kind: ToolKind, engine: &Engine, message: String) -> CallToolResult {
    let o = Outcome::denied("", engine.config().backend.as_str(), message);
    match kind {
        ToolKind::CodeExecPython => heroku_result(&o),
        ToolKind::ListPackages => {
            CallToolResult::error(vec![ContentBlock::text(o.reason.unwrap_or_default())])
        }
        _ => outcome_result(&o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heroku_returncode_follows_subprocess() {
        let mut o = Outcome::failed_to_start("python", "linux", "no interpreter");
        let r = heroku_result(&o);
        assert_eq!(r.is_error, Some(true));
        let v = r.structured_content.expect("structured");
        assert_eq!(v["returncode"], -1);
        assert!(
            v["stderr"]
                .as_str()
                .unwrap_or("")
                .contains("no interpreter")
        );
        o.signal = Some(9);
        assert_eq!(
            heroku_result(&o).structured_content.expect("s")["returncode"],
            -9
        );
    }
}
