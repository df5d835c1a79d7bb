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
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: BackendKind::Linux,
            limits: Limits::default(),
            languages: BTreeMap::new(),
            snippets_dir: None,
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
        let e = Config::from_toml(Path::new("x.toml"), "backend = \"vm\"\n").expect_err("bad");
        assert!(
            e.to_string().contains("backend") || e.to_string().contains("vm"),
            "{e}"
        );
    }
}
