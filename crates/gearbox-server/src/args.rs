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
    pub allow_tools: Option<Vec<String>>,
    /// Milliseconds after which tool calls are refused; also caps the run's `timeout_ms`.
    /// Only with `allow_tools`; default and maximum from the server's `[broker]`.
    pub wall_clock_ms: Option<u64>,
    /// Milliseconds one tool call may take (it is cancelled past it). Only with `allow_tools`.
    pub per_call_ms: Option<u64>,
    /// Tool calls the code may make. Only with `allow_tools`.
    pub max_calls: Option<u32>,
    /// KiB of one tool result given to the code; a larger result becomes an artifact (the
    /// code gets a preview and its id). Only with `allow_tools`.
    pub max_output_kb: Option<u64>,
    /// Ask for a working network for this run. The server's safety gear decides:
    /// `restricted` refuses, `user_confirmed` asks a human, `full_trust` grants.
    pub network: Option<bool>,
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
