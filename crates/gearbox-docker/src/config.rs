//! The `[docker]` section of gearbox.toml: where the engine is, which image runs which
//! language, and what the container's user and CPU share are.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The engine address used when none is configured.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";
/// The image of the default Python and Bash entries; `scripts/setup-docker.sh` builds it.
pub const DEFAULT_PYTHON_IMAGE: &str = "gearbox/python:bookworm";
/// The image of the default JavaScript (Node) and Go entries; `scripts/setup-docker.sh`
/// builds it.
pub const DEFAULT_RUNTIMES_IMAGE: &str = "gearbox/runtimes:bookworm";
/// Where the workspace (a tmpfs volume) is mounted and the program starts, by default.
pub const DEFAULT_WORKDIR: &str = "/workspace";
/// `nobody` on Debian: the default user inside the container.
pub const DEFAULT_UID: u32 = 65534;

/// The docker backend: one fresh container per run through the Docker Engine API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DockerConfig {
    /// Engine address: `unix:///PATH` or `tcp://HOST:PORT`. Default
    /// `unix:///var/run/docker.sock`. The API version is negotiated with the engine.
    pub host: String,
    /// One entry per language the backend runs (`python`, `javascript`, ...), each naming an
    /// image that must already exist on the engine (gearbox never pulls). Default: every
    /// built-in language, `python` and `bash` in `gearbox/python:bookworm`, `javascript` and
    /// `go` in `gearbox/runtimes:bookworm` (both built by `scripts/setup-docker.sh`).
    pub images: BTreeMap<String, DockerImage>,
    /// User id the program runs as inside the container; 0 (root) is refused. Default 65534.
    pub uid: u32,
    /// Group id the program runs as inside the container. Default 65534.
    pub gid: u32,
    /// CPU share of one run in thousandths of a core (CFS quota). Default 1000: one core.
    pub cpu_millicores: u64,
    /// Run `docker-init` (tini) as PID 1 so signals and orphans behave as on a host.
    /// Default true.
    pub init: bool,
}

/// The image of one language and how a run is started in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DockerImage {
    /// Image reference on the engine, e.g. `gearbox/python:bookworm`. It must contain
    /// `/bin/sh` (the program is started once its files are in place).
    pub image: String,
    /// Command line inside the container; `{entrypoint}` is replaced by the entrypoint file
    /// (relative to `workdir`) and the call's `args` are appended.
    pub command: Vec<String>,
    /// Working directory, where the run's files are placed (a tmpfs of `disk_mb`). Default
    /// `/workspace`.
    #[serde(default = "default_workdir")]
    pub workdir: String,
}

fn default_workdir() -> String {
    DEFAULT_WORKDIR.to_string()
}

impl Default for DockerConfig {
    fn default() -> Self {
        let entry = |image: &str, command: &[&str]| DockerImage {
            image: image.to_string(),
            command: command.iter().map(|s| s.to_string()).collect(),
            workdir: default_workdir(),
        };
        let images = BTreeMap::from([
            (
                "python".to_string(),
                entry(DEFAULT_PYTHON_IMAGE, &["python3", "-s", "{entrypoint}"]),
            ),
            (
                "bash".to_string(),
                entry(DEFAULT_PYTHON_IMAGE, &["bash", "{entrypoint}"]),
            ),
            (
                "javascript".to_string(),
                entry(DEFAULT_RUNTIMES_IMAGE, &["node", "{entrypoint}"]),
            ),
            (
                "go".to_string(),
                entry(DEFAULT_RUNTIMES_IMAGE, &["go", "run", "{entrypoint}"]),
            ),
        ]);
        DockerConfig {
            host: DEFAULT_HOST.to_string(),
            images,
            uid: DEFAULT_UID,
            gid: DEFAULT_UID,
            cpu_millicores: 1000,
            init: true,
        }
    }
}

impl DockerConfig {
    /// Check what serde cannot: every error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.host.starts_with("unix://")
            || self.host.starts_with("tcp://")
            || self.host.starts_with("http://"))
        {
            return Err(format!(
                "docker.host = {:?}: expected unix:///PATH or tcp://HOST:PORT",
                self.host
            ));
        }
        if self.uid == 0 {
            return Err("docker.uid = 0: the program must not run as root in the container".into());
        }
        if self.cpu_millicores == 0 {
            return Err("docker.cpu_millicores must be greater than 0".into());
        }
        for (lang, img) in &self.images {
            if img.image.trim().is_empty() {
                return Err(format!("docker.images.{lang}.image is empty"));
            }
            if img.command.is_empty() {
                return Err(format!("docker.images.{lang}.command is empty"));
            }
            if !img.command.iter().any(|a| a.contains("{entrypoint}")) {
                return Err(format!(
                    "docker.images.{lang}.command never names {{entrypoint}}"
                ));
            }
            if !img.workdir.starts_with('/') || img.workdir.contains("..") || img.workdir == "/" {
                return Err(format!(
                    "docker.images.{lang}.workdir = {:?}: expected an absolute path below /",
                    img.workdir
                ));
            }
            if img
                .command
                .iter()
                .chain([&img.image, &img.workdir])
                .any(|s| s.contains('\0'))
            {
                return Err(format!("docker.images.{lang} contains a NUL byte"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_runs_python() {
        let c = DockerConfig::default();
        c.validate().expect("default valid");
        assert_eq!(c.images["python"].image, DEFAULT_PYTHON_IMAGE);
        // Every built-in language has a default entry.
        let table = gearbox_core::LanguageTable::builtin();
        for lang in table.names() {
            assert!(c.images.contains_key(lang), "no default image for {lang}");
        }
    }

    #[test]
    fn bad_values_name_the_field() {
        let mut c = DockerConfig {
            uid: 0,
            ..Default::default()
        };
        assert!(c.validate().expect_err("root").contains("docker.uid"));
        c.uid = 1000;
        c.images.insert(
            "go".into(),
            DockerImage {
                image: "golang:1.22".into(),
                command: vec!["go".into(), "run".into()],
                workdir: "/w".into(),
            },
        );
        let e = c.validate().expect_err("no entrypoint");
        assert!(e.contains("docker.images.go.command"), "{e}");
        c.host = "ssh://x".into();
        assert!(c.validate().expect_err("host").contains("docker.host"));
    }
}
