//! Package layers: what a run may import beyond the interpreter's standard library.
//!
//! A call's requirements (`numpy==2.*`, `is-number@^7`) are validated ([`reqs`]), installed
//! by gearbox outside the sandbox — `uv` (or pip) for Python, npm for JavaScript, with network
//! access the run never gets — into a directory keyed by everything that determines its
//! content: language, interpreter version, platform, normalized requirement set, package
//! index and build policy. Layers are built in a temporary directory and renamed into place,
//! so a crashed build leaves no half layer; concurrent identical requests build once (an
//! in-process lock plus `flock` across processes); the sandbox mounts a layer read-only and
//! finds it through `PYTHONPATH` or `NODE_PATH`. Least recently used layers are removed when
//! the cache grows past its budget. See `docs/PACKAGES.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod install;
pub mod reqs;
mod store;

pub use store::{LayerInfo, LayerStore};

/// Which package world a language draws from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    /// PyPI, installed with uv or pip.
    Python,
    /// The npm registry, installed with npm.
    Node,
}

impl Ecosystem {
    /// The ecosystem of a configured language name, if it has one.
    pub fn for_language(language: &str) -> Option<Ecosystem> {
        match language {
            "python" => Some(Ecosystem::Python),
            "javascript" => Some(Ecosystem::Node),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Ecosystem::Python => "python",
            Ecosystem::Node => "node",
        }
    }

    /// The environment variable that puts a layer on the import path.
    pub fn path_var(self) -> &'static str {
        match self {
            Ecosystem::Python => "PYTHONPATH",
            Ecosystem::Node => "NODE_PATH",
        }
    }
}

impl std::fmt::Display for Ecosystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The interpreter a layer is built for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub ecosystem: Ecosystem,
    /// The real interpreter binary (`/usr/bin/python3`); uv and pip install for it.
    pub interpreter: PathBuf,
    /// Its version line (`Python 3.11.2`, `v20.20.2`): part of the layer's key.
    pub version: String,
}

/// One installed distribution.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// A layer ready to mount. Holding it keeps the garbage collector away from its directory
/// (a shared `flock` on the layer's lock file): keep it until the run has finished.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The layer's directory: mount it read-only at the same path.
    pub path: PathBuf,
    /// What to add to the run's environment (`PYTHONPATH` or `NODE_PATH`).
    pub env: BTreeMap<String, String>,
    /// Everything installed, dependencies included, sorted by name.
    pub packages: Vec<Package>,
    /// The normalized requirements the layer was built from.
    pub requirements: Vec<String>,
    /// True when the layer already existed: no installer ran.
    pub cached: bool,
    /// Time spent getting the layer (install, or lookup when cached), in milliseconds.
    pub elapsed_ms: u64,
    pub key: String,
    _guard: std::sync::Arc<store::UseGuard>,
}

/// Why no layer could be had. Every message is meant for the caller.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    /// A requirement failed validation; the message names the entry.
    #[error("{0}")]
    Invalid(String),
    /// The language has no package support, or its installer is missing.
    #[error("{0}")]
    Unsupported(String),
    /// The installer ran and failed; `stderr` is its trimmed error output.
    #[error("installing {requirements} failed ({status}):\n{stderr}")]
    InstallFailed {
        requirements: String,
        status: String,
        stderr: String,
    },
    /// The installer did not finish in time and was killed.
    #[error(
        "installing {requirements} took longer than {timeout_ms} ms; the installer was stopped"
    )]
    Timeout {
        requirements: String,
        timeout_ms: u64,
    },
    /// The cache directory could not be used.
    #[error("package cache {path}: {message}")]
    Io { path: PathBuf, message: String },
}

/// Which program installs Python packages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PythonInstaller {
    /// uv when it is found (`uv` below, the tools directory, then PATH), else pip.
    #[default]
    Auto,
    Uv,
    /// `INTERPRETER -m pip`.
    Pip,
}

/// `[packages]`: how call-supplied packages are installed and cached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PackagesConfig {
    /// Accept `packages` at all. Default true (gears still decide per call).
    pub enabled: bool,
    /// Where layers live. Default: `/var/cache/gearbox/packages` when running as root, else
    /// `$XDG_CACHE_HOME/gearbox/packages` (or `~/.cache/gearbox/packages`). Every directory
    /// above it must be searchable by the sandbox user.
    pub cache_dir: Option<PathBuf>,
    /// Size budget of all layers, in MiB; least recently used layers are removed past it.
    /// Default 4096.
    pub budget_mb: u64,
    /// Time one install (or resolution) may take, in milliseconds; the installer's process
    /// group is killed past it. Default 300000.
    pub install_timeout_ms: u64,
    /// Python package indexes (`--index-url` then `--extra-index-url`). Default: none (PyPI).
    pub python_index_urls: Vec<String>,
    /// npm registry URL. Default: npm's own (the registry configured for npm on the host).
    pub npm_registry: Option<String>,
    /// Accept URL and VCS requirements (`name @ https://...`). Default false.
    pub allow_urls: bool,
    /// Accept Python source distributions, which run their build code on the host at install
    /// time. Default false: wheels only (`--only-binary :all:`).
    pub allow_sdist: bool,
    /// `auto` (default), `uv` or `pip`.
    pub python_installer: PythonInstaller,
    /// Path of uv. Default: `$GEARBOX_TOOLS_DIR/bin/uv`, `~/.cache/gearbox/tools/bin/uv`
    /// (where `scripts/setup-packages.sh` puts it), then `uv` on PATH.
    pub uv: Option<PathBuf>,
    /// Path of npm. Default: `npm` on PATH.
    pub npm: Option<PathBuf>,
}

impl Default for PackagesConfig {
    fn default() -> Self {
        PackagesConfig {
            enabled: true,
            cache_dir: None,
            budget_mb: 4096,
            install_timeout_ms: 300_000,
            python_index_urls: Vec::new(),
            npm_registry: None,
            allow_urls: false,
            allow_sdist: false,
            python_installer: PythonInstaller::Auto,
            uv: None,
            npm: None,
        }
    }
}

impl PackagesConfig {
    /// The cache directory in effect.
    pub fn cache_dir(&self) -> PathBuf {
        if let Some(d) = &self.cache_dir {
            return d.clone();
        }
        if nix::unistd::geteuid().is_root() {
            return PathBuf::from("/var/cache/gearbox/packages");
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from("/tmp"));
        base.join("gearbox/packages")
    }
}
