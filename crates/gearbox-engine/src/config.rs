//! gearbox configuration: one TOML file, every field documented with its unit and default,
//! unknown keys refused. The JSON Schema is generated from these types.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gearbox_core::{BackendKind, LanguageSpec, Limits};
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
    /// MCP tool profiles `gearbox serve` exposes (default `["default"]`): `default`
    /// (`execute_code`), `isolator` (`execute_code` of isolator-mcp), `quickjs`
    /// (`run_javascript_code`), `heroku` (`code_exec_python`), `sidecar` (`execute`,
    /// `list_packages`). `--profile` on the command line replaces this list.
    pub profiles: Vec<ToolProfile>,
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
}

impl ToolProfile {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolProfile::Default => "default",
            ToolProfile::Isolator => "isolator",
            ToolProfile::Quickjs => "quickjs",
            ToolProfile::Heroku => "heroku",
            ToolProfile::Sidecar => "sidecar",
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
            other => Err(format!(
                "unknown profile {other:?} (expected default, isolator, quickjs, heroku or sidecar)"
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
            profiles: vec![ToolProfile::Default],
        }
    }
}

impl Config {
    /// Parse TOML text; errors name the offending key.
    pub fn from_toml(path: &Path, text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
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
    fn empty_file_gives_defaults() {
        let c = Config::from_toml(Path::new("x.toml"), "").expect("empty is valid");
        assert_eq!(c, Config::default());
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
