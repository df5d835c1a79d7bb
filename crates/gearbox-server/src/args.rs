//! The arguments of each tool, as the wire carries them, and their parsing.
//!
//! Every struct refuses unknown fields and its JSON Schema is the tool's `inputSchema`.
//! Parsing never fails the request: an error is a message naming the field, which the server
//! returns as a tool-execution error (`isError: true`, SEP-1303) so the model can correct
//! itself.

use std::collections::BTreeMap;

use gearbox_core::{BackendKind, FileInput, Gear};
use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// `network`: a yes/no, or the host patterns a run may reach.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum NetworkArg {
    /// `true`: any public host; `false`: none.
    Any(bool),
    /// Only these hosts (`host`, `*.domain`, `host:port`).
    Hosts(Vec<String>),
}

impl NetworkArg {
    /// The network asked for; a bad pattern is an error naming it.
    pub fn to_network(&self) -> Result<gearbox_core::Network, String> {
        match self {
            NetworkArg::Any(false) => Ok(gearbox_core::Network::Off),
            NetworkArg::Any(true) => Ok(gearbox_core::Network::Any),
            NetworkArg::Hosts(list) => gearbox_core::Network::hosts(list),
        }
    }
}

/// Arguments of `execute_code` (default and isolator profiles).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteCodeArgs {
    /// Language of the code: `python`, `javascript`, `go` or `bash` (case-insensitive; a file
    /// extension such as `py` also works). Required unless `snippet_name` is given.
    pub language: Option<String>,
    /// Source of the entrypoint file. Required unless `snippet_name` is given.
    pub code: Option<String>,
    /// Alias of `code` (the name isolator-mcp uses).
    pub entrypoint_code: Option<String>,
    /// Name (without extension) of a snippet in the server's snippets directory; its language
    /// comes from its extension. Excludes `code`. Names with `/`, `..` or NUL are refused.
    pub snippet_name: Option<String>,
    /// File name of the entrypoint in the workspace (default per language: `main.py`,
    /// `main.js`, `main.go`, `main.sh`).
    pub entrypoint_filename: Option<String>,
    /// Extra files written into the workspace (`/work`) before the run.
    pub additional_files: Option<Vec<FileInput>>,
    /// Alias of `additional_files`.
    pub files: Option<Vec<FileInput>>,
    /// Text given to the program on standard input (default: empty).
    pub stdin: Option<String>,
    /// Command-line arguments passed to the program.
    pub args: Option<Vec<String>>,
    /// Environment variables for the program (nothing of the server's environment is passed).
    pub env: Option<BTreeMap<String, String>>,
    /// Wall-clock limit in milliseconds; may only lower the configured maximum.
    pub timeout_ms: Option<u64>,
    /// Memory limit in MiB; may only lower the configured maximum.
    pub memory_mb: Option<u64>,
    /// Packages the code imports, installed before the run (outside the sandbox, cached):
    /// Python requirements such as `numpy==2.*` or `attrs>=22`, npm packages such as
    /// `is-number@^7`. Names and versions only: URLs, paths and installer options are
    /// refused. The server's safety gear decides whether packages may be installed.
    pub packages: Option<Vec<String>>,
    /// Isolation backend (default: the configured one).
    pub backend: Option<BackendKind>,
    /// Let the code call these downstream tools: `server/tool` names, globs allowed
    /// (`everything/*`). Python: `import gearbox; gearbox.call_tool(server, tool, {...})` or
    /// `from tools import SERVER` (typed stubs); Node: `require("gearbox").callTool(...)`.
    /// See `servers_list` and `tool_stubs`. The run's result lists the calls (`tool_calls`).
    #[allow(
        dead_code,
        reason = "schema only: broker::access reads the tool fields"
    )]
    pub allow_tools: Option<Vec<String>>,
    /// Milliseconds after which tool calls are refused; also caps the run's `timeout_ms`.
    /// Only with `allow_tools`; default and maximum from the server's `[broker]`.
    #[allow(
        dead_code,
        reason = "schema only: broker::access reads the tool fields"
    )]
    pub wall_clock_ms: Option<u64>,
    /// Milliseconds one tool call may take (it is cancelled past it). Only with `allow_tools`.
    #[allow(
        dead_code,
        reason = "schema only: broker::access reads the tool fields"
    )]
    pub per_call_ms: Option<u64>,
    /// Tool calls the code may make. Only with `allow_tools`.
    #[allow(
        dead_code,
        reason = "schema only: broker::access reads the tool fields"
    )]
    pub max_calls: Option<u32>,
    /// KiB of one tool result given to the code; a larger result becomes an artifact (the
    /// code gets a preview and its id). Only with `allow_tools`.
    #[allow(
        dead_code,
        reason = "schema only: broker::access reads the tool fields"
    )]
    pub max_output_kb: Option<u64>,
    /// Network for this run: `true` (any public host), or the hosts the code needs
    /// (`["data.example.org", "*.cdn.example.org", "api.example.com:8443"]`; without a port, 80 and
    /// 443). Traffic goes through the server's egress proxy (`HTTP_PROXY`/`HTTPS_PROXY` are
    /// set); the host's loopback and private networks are never reachable. The safety gear
    /// decides: `restricted` refuses, `user_confirmed` asks a human with the exact list,
    /// `full_trust` grants.
    pub network: Option<NetworkArg>,
    /// Run under a lower safety gear than the server's (`read_only`, `restricted`,
    /// `user_confirmed`, `full_trust`); a higher one is refused.
    #[allow(
        dead_code,
        reason = "read by the server's gate from the validated arguments"
    )]
    pub gear: Option<Gear>,
    /// Resume a run a human approved: the `operation_id` of an earlier `pending_approval`
    /// result, with exactly the same other arguments as that call.
    #[allow(
        dead_code,
        reason = "read by the server's gate from the validated arguments"
    )]
    pub operation_id: Option<String>,
}

/// Arguments of `approval_status`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalStatusArgs {
    /// The `operation_id` of a `pending_approval` result.
    pub operation_id: String,
}

/// Arguments of `run_javascript_code` (quickjs profile).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunJavascriptArgs {
    /// JavaScript source to run. Output printed with `console.log` is returned.
    pub code: String,
}

/// Arguments of `code_exec_python` (heroku profile).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeExecPythonArgs {
    /// Python source to run.
    pub code: String,
    /// Packages to install before the run (`requests`, `numpy==2.*`): installed outside the
    /// sandbox into a cached, read-only layer on the import path. Names and versions only.
    pub packages: Option<Vec<String>>,
    /// Accepted for compatibility and always true in effect: every run gets a fresh, private
    /// working directory, and packages go to their own layer, never into a shared
    /// environment.
    pub use_temp_dir: Option<bool>,
}

/// Arguments of `execute` (sidecar profile).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SidecarExecuteArgs {
    /// Source to run.
    pub code: String,
    /// Language of the code (default `python`): `python`, `javascript`, `go` or `bash`.
    pub language: Option<String>,
}

/// Arguments of `list_packages` (sidecar profile): none.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// Parse a tool's `arguments` object into `T`. The error names the offending field.
pub fn parse<T: DeserializeOwned>(args: Option<&JsonObject>) -> Result<T, String> {
    let value = serde_json::Value::Object(args.cloned().unwrap_or_default());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path.is_empty() || path == "." {
            format!("invalid arguments: {inner}")
        } else {
            format!("invalid arguments: {path}: {inner}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: serde_json::Value) -> JsonObject {
        match v {
            serde_json::Value::Object(o) => o,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse::<ExecuteCodeArgs>(Some(&obj(json!({"code": 5})))).expect_err("type");
        assert!(e.contains("code") && e.contains("invalid type"), "{e}");
        let e = parse::<ExecuteCodeArgs>(Some(&obj(json!({"cod": "x"})))).expect_err("unknown");
        assert!(e.contains("unknown field `cod`"), "{e}");
        let e = parse::<ExecuteCodeArgs>(Some(&obj(
            json!({"files": [{"filename": "a", "content": 1}]}),
        )))
        .expect_err("nested");
        assert!(e.contains("files[0].content"), "{e}");
        let e = parse::<RunJavascriptArgs>(None).expect_err("missing");
        assert!(e.contains("missing field `code`"), "{e}");
    }

    #[test]
    fn no_arguments_is_an_empty_object() {
        parse::<NoArgs>(None).expect("empty");
        let a = parse::<ExecuteCodeArgs>(None).expect("all optional");
        assert!(a.code.is_none());
    }
}

/// Property tests: a tool's `arguments` are whatever a client sends. Arbitrary JSON trees,
/// wrong types, huge strings and odd Unicode are parsed into a value or an error naming the
/// field, never a panic; what parses goes through the same preparation and validation as a
/// real call, and a run that validates writes nothing outside its workspace.
/// `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
pub(crate) mod proptests {
    use std::path::{Component, Path, PathBuf};
    use std::sync::OnceLock;

    use gearbox_core::{Job, LanguageTable, Limits, ResolvedLanguage};
    use gearbox_engine::{Config, Engine};
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    use super::*;
    use crate::sessions::{ExecCloseArgs, ExecGetArtifactArgs, ExecOpenArgs};
    use crate::tools::{self, Prepared};

    /// Every field name of every tool's arguments, so generated objects hit real fields.
    const FIELDS: &[&str] = &[
        "language",
        "code",
        "entrypoint_code",
        "snippet_name",
        "entrypoint_filename",
        "additional_files",
        "files",
        "filename",
        "content",
        "encoding",
        "stdin",
        "args",
        "env",
        "timeout_ms",
        "memory_mb",
        "packages",
        "backend",
        "allow_tools",
        "wall_clock_ms",
        "per_call_ms",
        "max_calls",
        "max_output_kb",
        "network",
        "gear",
        "operation_id",
        "use_temp_dir",
        "session_id",
        "persist",
        "path",
        "offset",
        "max_bytes",
    ];

    /// Strings a client might send: plain, any Unicode, escapes, very long.
    pub(crate) fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => "[a-zA-Z0-9_ ./-]{0,16}",
            4 => any::<String>(),
            1 => prop::sample::select(vec![
                "", "..", "../../etc/passwd", "/etc/passwd", "a\0b", "\u{FEFF}", "\u{202E}x",
                "python", "Python", "js", "bash", "linux", "process", "base64", "full_trust",
                "main.py", "x=1", "%2e%2e", "\\\\?\\C:",
            ])
            .prop_map(String::from),
            1 => (0usize..100_000, any::<char>()).prop_map(|(n, c)| c.to_string().repeat(n)),
        ]
    }

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select(FIELDS).prop_map(String::from),
            1 => text(),
        ]
    }

    /// Any JSON value, nested a few levels.
    pub(crate) fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 8, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                proptest::collection::btree_map(key(), inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arguments() -> impl Strategy<Value = JsonObject> {
        proptest::collection::btree_map(key(), json_value(), 0..10)
            .prop_map(|m| m.into_iter().collect::<Map<String, Value>>())
    }

    /// A path a caller might give: mostly plain, sometimes hostile.
    fn filename() -> impl Strategy<Value = String> {
        prop_oneof![
            2 => "[a-z]{1,6}(/[a-z]{1,6}){0,2}\\.(py|txt|sh)",
            1 => text(),
        ]
    }

    /// A limit: mostly one the configuration allows, sometimes any number.
    fn limit(max: u64) -> impl Strategy<Value = u64> {
        prop_oneof![2 => 1..=max, 1 => any::<u64>()]
    }

    /// Arguments of `execute_code` with every field of the right type (values still
    /// hostile): a language (mostly a known one) and code, then any subset of the others.
    fn typed_execute_code() -> impl Strategy<Value = JsonObject> {
        let file = || {
            (
                filename(),
                text(),
                prop::sample::select(vec!["utf8", "base64"]),
            )
                .prop_map(|(f, c, e)| json!({"filename": f, "content": c, "encoding": e}))
        };
        let strings = || proptest::collection::vec(text(), 0..4);
        let language = prop_oneof![
            3 => prop::sample::select(vec!["bash", "python", "Python", "js", "go", "sh"])
                .prop_map(String::from),
            1 => text(),
        ];
        let fields: Vec<BoxedStrategy<(&'static str, Value)>> = vec![
            text().prop_map(|s| ("entrypoint_code", json!(s))).boxed(),
            text().prop_map(|s| ("snippet_name", json!(s))).boxed(),
            filename()
                .prop_map(|s| ("entrypoint_filename", json!(s)))
                .boxed(),
            proptest::collection::vec(file(), 0..4)
                .prop_map(|f| ("additional_files", json!(f)))
                .boxed(),
            proptest::collection::vec(file(), 0..4)
                .prop_map(|f| ("files", json!(f)))
                .boxed(),
            text().prop_map(|s| ("stdin", json!(s))).boxed(),
            strings().prop_map(|v| ("args", json!(v))).boxed(),
            proptest::collection::btree_map(
                prop_oneof![2 => "[A-Z_][A-Z0-9_]{0,6}", 1 => text()],
                text(),
                0..4,
            )
            .prop_map(|m| ("env", json!(m)))
            .boxed(),
            limit(30_000).prop_map(|n| ("timeout_ms", json!(n))).boxed(),
            limit(512).prop_map(|n| ("memory_mb", json!(n))).boxed(),
            strings().prop_map(|v| ("packages", json!(v))).boxed(),
            prop::sample::select(vec!["linux", "process", "wasm", "docker"])
                .prop_map(|b| ("backend", json!(b)))
                .boxed(),
            any::<bool>().prop_map(|b| ("network", json!(b))).boxed(),
            strings().prop_map(|v| ("network", json!(v))).boxed(),
            prop::sample::select(vec![
                "read_only",
                "restricted",
                "user_confirmed",
                "full_trust",
            ])
            .prop_map(|g| ("gear", json!(g)))
            .boxed(),
            any::<u32>().prop_map(|n| ("max_calls", json!(n))).boxed(),
        ];
        let n = fields.len();
        (
            language,
            text(),
            proptest::sample::subsequence(fields, 0..=n).prop_flat_map(|chosen| chosen),
        )
            .prop_map(|(language, code, pairs)| {
                let mut args: JsonObject =
                    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                args.insert("language".into(), json!(language));
                args.insert("code".into(), json!(code));
                args
            })
    }

    fn engine() -> &'static Engine {
        static ENGINE: OnceLock<Engine> = OnceLock::new();
        ENGINE.get_or_init(|| Engine::new(Config::default(), PathBuf::from("/nonexistent")))
    }

    /// Job::build's checks of files, environment and args do not depend on the language.
    fn bash() -> &'static ResolvedLanguage {
        static BASH: OnceLock<ResolvedLanguage> = OnceLock::new();
        BASH.get_or_init(|| LanguageTable::builtin().resolve("bash").expect("bash"))
    }

    /// Parse with every argument type; none may panic, each error names the arguments.
    fn parse_all(args: &JsonObject) {
        fn one<T: DeserializeOwned>(args: &JsonObject) {
            if let Err(e) = parse::<T>(Some(args)) {
                assert!(e.starts_with("invalid arguments"), "{e}");
            }
        }
        one::<ApprovalStatusArgs>(args);
        one::<RunJavascriptArgs>(args);
        one::<CodeExecPythonArgs>(args);
        one::<SidecarExecuteArgs>(args);
        one::<NoArgs>(args);
        one::<ExecOpenArgs>(args);
        one::<ExecCloseArgs>(args);
        one::<ExecGetArtifactArgs>(args);
    }

    /// How far a call got.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Reached {
        ParseError,
        Refused,
        InvalidJob,
        Job,
    }

    /// `execute_code` as the server handles it: parse, prepare, then the engine's
    /// validation into a job. A job's files must all land inside the workspace.
    fn execute_code(args: &JsonObject) -> Reached {
        let Ok(a) = parse::<ExecuteCodeArgs>(Some(args)) else {
            return Reached::ParseError;
        };
        let Prepared::Run { request, .. } = tools::prepare_execute_code(engine(), a) else {
            return Reached::Refused;
        };
        let Ok(job) = Job::build(&request, bash(), &Limits::default()) else {
            return Reached::InvalidJob;
        };
        for f in &job.files {
            let p = Path::new(&f.path);
            assert!(
                !f.path.is_empty()
                    && !f.path.contains('\0')
                    && p.components().all(|c| matches!(c, Component::Normal(_))),
                "{:?} accepted",
                f.path
            );
        }
        for (k, v) in &request.env {
            assert!(!k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0'));
        }
        assert!(request.args.iter().all(|a| !a.contains('\0')));
        Reached::Job
    }

    /// The generator is not vacuous: a good share of well-typed calls become jobs, so the
    /// checks on a job's files run.
    #[test]
    fn well_typed_arguments_often_become_jobs() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = typed_execute_code();
        let jobs = (0..200)
            .filter(|_| {
                let args = strategy.new_tree(&mut runner).expect("value").current();
                execute_code(&args) == Reached::Job
            })
            .count();
        assert!(jobs >= 20, "only {jobs} of 200 calls became jobs");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(256)))]

        #[test]
        fn arbitrary_arguments_never_panic(args in arguments()) {
            parse_all(&args);
            execute_code(&args);
        }

        #[test]
        fn well_typed_arguments_parse_and_prepare(args in typed_execute_code()) {
            let a = parse::<ExecuteCodeArgs>(Some(&args));
            prop_assert!(a.is_ok(), "{:?}", a.err());
            execute_code(&args);
        }

        #[test]
        fn a_wrong_value_is_an_error_naming_its_field(
            field in prop::sample::select(FIELDS),
            value in json_value(),
        ) {
            let args: JsonObject = [(field.to_string(), value)].into_iter().collect();
            if let Err(e) = parse::<ExecuteCodeArgs>(Some(&args)) {
                prop_assert!(e.contains(field), "{}", e);
            }
        }
    }
}
