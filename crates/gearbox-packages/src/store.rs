//! The layer store: content-addressed directories under the cache directory.
//!
//! ```text
//! CACHE/layers/KEY/        a finished layer (mounted read-only): meta.json, and site/
//!                          (Python, --target) or node_modules/ (npm --prefix)
//! CACHE/locks/KEY.lock     flock: shared while a layer is in use, exclusive to build or remove
//! CACHE/tmp/KEY.PID.N/     a build in progress; renamed to layers/KEY when complete
//! CACHE/cache/{uv,pip,npm} the installers' download caches
//! ```
//!
//! The directory's modification time is the layer's last use (LRU).

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::install::{Installers, npm_lock_packages, python_site_packages};
use crate::{Ecosystem, Layer, Package, PackageError, PackagesConfig, Target, reqs};

/// Bumped when the layout or the install command changes what a key means.
const FORMAT: &str = "gearbox-layer-1";
/// How often a waiter retries a lock held by another process.
const LOCK_POLL: Duration = Duration::from_millis(25);

/// A cached layer, as `list_packages` and the packages resource show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LayerInfo {
    pub key: String,
    pub ecosystem: Ecosystem,
    /// Interpreter version line the layer was built for.
    pub interpreter_version: String,
    pub platform: String,
    /// Normalized requirements it was built from.
    pub requirements: Vec<String>,
    /// Everything installed, dependencies included.
    pub packages: Vec<Package>,
    pub size_bytes: u64,
    /// Unix seconds.
    pub created: u64,
    /// Unix seconds of the last use.
    pub last_used: u64,
    /// The installer that built it.
    pub installer: String,
}

/// The shared lock a [`Layer`] holds while in use.
#[derive(Debug)]
pub(crate) struct UseGuard(#[allow(dead_code)] Flock<File>);

/// Cached, content-addressed package layers. One per process; cheap to share (`Arc`).
pub struct LayerStore {
    root: PathBuf,
    budget_bytes: u64,
    installers: Installers,
    building: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    seq: AtomicU64,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> PackageError + '_ {
    move |e| PackageError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn platform() -> String {
    format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS)
}

/// Create `dir` (and parents) searchable by everyone: the sandbox user reaches layers
/// through it.
fn make_dir(dir: &Path) -> Result<(), PackageError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(io_err(dir))
}

impl LayerStore {
    /// A store under `config.cache_dir()`. Creates the directories; fails when it cannot.
    pub fn new(config: PackagesConfig) -> Result<LayerStore, PackageError> {
        let root = config.cache_dir();
        for sub in ["", "layers", "tmp", "trash", "home"] {
            make_dir(&root.join(sub))?;
        }
        for sub in ["locks", "cache"] {
            let d = root.join(sub);
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err(&d))?;
        }
        Ok(LayerStore {
            budget_bytes: config.budget_mb.saturating_mul(1024 * 1024),
            installers: Installers {
                config,
                root: root.clone(),
                runs: AtomicU64::new(0),
            },
            root,
            building: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config(&self) -> &PackagesConfig {
        &self.installers.config
    }

    /// Installer processes this store has started (installs and resolutions).
    pub fn installer_runs(&self) -> u64 {
        self.installers.runs.load(Ordering::SeqCst)
    }

    /// Validate and normalize `reqs` for `eco` under this store's policy.
    pub fn validate(&self, eco: Ecosystem, reqs: &[String]) -> Result<Vec<String>, PackageError> {
        if !self.config().enabled {
            return Err(PackageError::Unsupported(
                "packages: installing packages is disabled on this server (packages.enabled \
                 = false)"
                    .into(),
            ));
        }
        let n =
            reqs::normalize(eco, reqs, self.config().allow_urls).map_err(PackageError::Invalid)?;
        if n.is_empty() {
            return Err(PackageError::Invalid("packages: the list is empty".into()));
        }
        Ok(n)
    }

    /// The key of the layer for `target` and normalized `reqs`.
    pub fn key(&self, target: &Target, normalized: &[String]) -> String {
        let cfg = self.config();
        let index: Vec<String> = match target.ecosystem {
            Ecosystem::Python => cfg.python_index_urls.clone(),
            Ecosystem::Node => cfg.npm_registry.iter().cloned().collect(),
        };
        let material = serde_json::json!([
            FORMAT,
            target.ecosystem,
            target.version,
            platform(),
            normalized,
            index,
            cfg.allow_sdist,
        ]);
        let digest = Sha256::digest(material.to_string().as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}-{}", target.ecosystem, &hex[..32])
    }

    fn layer_dir(&self, key: &str) -> PathBuf {
        self.root.join("layers").join(key)
    }

    fn lock_file(&self, key: &str) -> Result<File, PackageError> {
        let p = self.root.join("locks").join(format!("{key}.lock"));
        File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(io_err(&p))
    }

    /// Take `arg` on a fresh open of the key's lock file, waiting (without blocking a
    /// thread) until `deadline`.
    async fn lock(
        &self,
        key: &str,
        shared: bool,
        deadline: Instant,
    ) -> Result<Flock<File>, PackageError> {
        let arg = if shared {
            FlockArg::LockSharedNonblock
        } else {
            FlockArg::LockExclusiveNonblock
        };
        let mut file = self.lock_file(key)?;
        loop {
            match Flock::lock(file, arg) {
                Ok(l) => return Ok(l),
                Err((f, nix::errno::Errno::EWOULDBLOCK)) | Err((f, nix::errno::Errno::EINTR)) => {
                    if Instant::now() >= deadline {
                        return Err(PackageError::Timeout {
                            requirements: format!("layer {key} (waiting for another build)"),
                            timeout_ms: self.config().install_timeout_ms,
                        });
                    }
                    file = f;
                    tokio::time::sleep(LOCK_POLL).await;
                }
                Err((_, e)) => {
                    return Err(PackageError::Io {
                        path: self.root.join("locks"),
                        message: format!("flock: {e}"),
                    });
                }
            }
        }
    }

    fn read_meta(&self, key: &str) -> Option<LayerInfo> {
        let dir = self.layer_dir(key);
        let text = std::fs::read_to_string(dir.join("meta.json")).ok()?;
        let mut info: LayerInfo = serde_json::from_str(&text).ok()?;
        info.last_used = std::fs::metadata(&dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(info.created, |d| d.as_secs());
        Some(info)
    }

    fn touch(&self, key: &str) {
        let dir = self.layer_dir(key);
        if let Ok(f) = File::open(&dir) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    fn to_layer(
        &self,
        info: LayerInfo,
        guard: Flock<File>,
        cached: bool,
        started: Instant,
    ) -> Layer {
        let path = self.layer_dir(&info.key);
        let var_dir = match info.ecosystem {
            Ecosystem::Python => path.join("site"),
            Ecosystem::Node => path.join("node_modules"),
        };
        let env = BTreeMap::from([(
            info.ecosystem.path_var().to_string(),
            var_dir.display().to_string(),
        )]);
        Layer {
            path,
            env,
            packages: info.packages,
            requirements: info.requirements,
            cached,
            elapsed_ms: started.elapsed().as_millis() as u64,
            key: info.key,
            _guard: Arc::new(UseGuard(guard)),
        }
    }

    /// The layer for `reqs` on `target`: the cached one, or a new one installed now.
    pub async fn layer(&self, target: &Target, reqs: &[String]) -> Result<Layer, PackageError> {
        let started = Instant::now();
        let normalized = self.validate(target.ecosystem, reqs)?;
        let key = self.key(target, &normalized);
        // Waiting for another build may take as long as that build.
        let deadline = started
            + Duration::from_millis(self.config().install_timeout_ms)
            + Duration::from_secs(5);

        // Fast path: an existing layer, held shared.
        let shared = self.lock(&key, true, deadline).await?;
        if let Some(info) = self.read_meta(&key) {
            self.touch(&key);
            return Ok(self.to_layer(info, shared, true, started));
        }
        drop(shared);

        // One build per key in this process; flock serializes processes.
        let gate = {
            let mut map = self.building.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(key.clone()).or_default().clone()
        };
        let _in_process = gate.lock().await;
        let exclusive = self.lock(&key, false, deadline).await?;
        if let Some(info) = self.read_meta(&key) {
            // Built by someone else while this call waited.
            self.touch(&key);
            exclusive
                .relock(FlockArg::LockShared)
                .map_err(|e| PackageError::Io {
                    path: self.root.join("locks"),
                    message: format!("flock: {e}"),
                })?;
            return Ok(self.to_layer(info, exclusive, true, started));
        }
        let info = self.build(target, &key, &normalized).await?;
        exclusive
            .relock(FlockArg::LockShared)
            .map_err(|e| PackageError::Io {
                path: self.root.join("locks"),
                message: format!("flock: {e}"),
            })?;
        let layer = self.to_layer(info, exclusive, false, started);
        {
            let mut map = self.building.lock().unwrap_or_else(|p| p.into_inner());
            map.remove(&key);
        }
        if let Err(e) = self.gc(Some(&key)) {
            tracing::warn!(error = %e, "package layer garbage collection failed");
        }
        Ok(layer)
    }

    /// Install into a fresh temporary directory and rename it into place. The caller holds
    /// the key's exclusive lock.
    async fn build(
        &self,
        target: &Target,
        key: &str,
        normalized: &[String],
    ) -> Result<LayerInfo, PackageError> {
        // Leftovers of crashed builds of this key: only the lock holder builds it.
        self.remove_tmp(key);
        let tmp = self.root.join("tmp").join(format!(
            "{key}.{}.{}",
            std::process::id(),
            self.seq.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir(&tmp).map_err(io_err(&tmp))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(&tmp))?;
        let result = self.build_in(target, key, normalized, &tmp).await;
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }

    async fn build_in(
        &self,
        target: &Target,
        key: &str,
        normalized: &[String],
        tmp: &Path,
    ) -> Result<LayerInfo, PackageError> {
        tracing::info!(%key, requirements = ?normalized, "installing package layer");
        self.installers.install(target, normalized, tmp).await?;
        let packages = match target.ecosystem {
            Ecosystem::Python => {
                // uv leaves a world-writable lock file in the target.
                let _ = std::fs::remove_file(tmp.join("site/.lock"));
                python_site_packages(&tmp.join("site"))
            }
            Ecosystem::Node => npm_lock_packages(&tmp.join("node_modules/.package-lock.json")),
        };
        let size_bytes = seal(tmp).map_err(io_err(tmp))?;
        let info = LayerInfo {
            key: key.to_string(),
            ecosystem: target.ecosystem,
            interpreter_version: target.version.clone(),
            platform: platform(),
            requirements: normalized.to_vec(),
            packages,
            size_bytes,
            created: now_unix(),
            last_used: now_unix(),
            installer: self.installers.describe(target.ecosystem),
        };
        let meta = tmp.join("meta.json");
        let text = serde_json::to_string_pretty(&info).unwrap_or_default();
        std::fs::write(&meta, text).map_err(io_err(&meta))?;
        std::fs::set_permissions(&meta, std::fs::Permissions::from_mode(0o644))
            .map_err(io_err(&meta))?;
        std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(io_err(tmp))?;
        let dest = self.layer_dir(key);
        std::fs::rename(tmp, &dest).map_err(io_err(&dest))?;
        Ok(info)
    }

    fn remove_tmp(&self, key: &str) {
        let prefix = format!("{key}.");
        if let Ok(entries) = std::fs::read_dir(self.root.join("tmp")) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// What installing `reqs` would install (names and versions, dependencies included),
    /// for a human to approve before anything is installed. A cached layer answers without
    /// the network; otherwise the installer resolves without installing.
    pub async fn resolve(
        &self,
        target: &Target,
        reqs: &[String],
    ) -> Result<Vec<Package>, PackageError> {
        let normalized = self.validate(target.ecosystem, reqs)?;
        let key = self.key(target, &normalized);
        if let Some(info) = self.read_meta(&key) {
            return Ok(info.packages);
        }
        let scratch = self.root.join("tmp").join(format!(
            "resolve.{}.{}",
            std::process::id(),
            self.seq.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir(&scratch).map_err(io_err(&scratch))?;
        let r = self.installers.resolve(target, &normalized, &scratch).await;
        let _ = std::fs::remove_dir_all(&scratch);
        r
    }

    /// Whether the layer for `reqs` is already cached (no install would run).
    pub fn is_cached(&self, target: &Target, reqs: &[String]) -> bool {
        self.validate(target.ecosystem, reqs)
            .is_ok_and(|n| self.read_meta(&self.key(target, &n)).is_some())
    }

    /// Cached layers, most recently used first; `eco` filters.
    pub fn layers(&self, eco: Option<Ecosystem>) -> Vec<LayerInfo> {
        let Ok(entries) = std::fs::read_dir(self.root.join("layers")) else {
            return Vec::new();
        };
        let mut v: Vec<LayerInfo> = entries
            .flatten()
            .filter_map(|e| self.read_meta(&e.file_name().to_string_lossy()))
            .filter(|i| eco.is_none_or(|x| x == i.ecosystem))
            .collect();
        v.sort_by(|a, b| b.last_used.cmp(&a.last_used).then(a.key.cmp(&b.key)));
        v
    }

    /// Remove least recently used layers until the total fits the budget. Layers in use
    /// (shared lock held) and `keep` stay. Returns the keys removed.
    pub fn gc(&self, keep: Option<&str>) -> Result<Vec<String>, PackageError> {
        let mut layers = self.layers(None);
        let mut total: u64 = layers.iter().map(|l| l.size_bytes).sum();
        let mut removed = Vec::new();
        layers.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.key.cmp(&b.key)));
        for l in layers {
            if total <= self.budget_bytes {
                break;
            }
            if Some(l.key.as_str()) == keep {
                continue;
            }
            let Ok(file) = self.lock_file(&l.key) else {
                continue;
            };
            let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                continue; // in use or being built
            };
            let trash = self.root.join("trash").join(format!(
                "{}.{}.{}",
                l.key,
                std::process::id(),
                self.seq.fetch_add(1, Ordering::SeqCst)
            ));
            let dir = self.layer_dir(&l.key);
            std::fs::rename(&dir, &trash).map_err(io_err(&dir))?;
            drop(lock);
            let _ = std::fs::remove_dir_all(&trash);
            tracing::info!(key = %l.key, size = l.size_bytes, "removed package layer (LRU)");
            total = total.saturating_sub(l.size_bytes);
            removed.push(l.key);
        }
        Ok(removed)
    }
}

/// Make a built tree readable and never writable by anyone but its owner, with no set-id
/// bits; return its size in bytes. Symlinks are left as they are (they resolve inside the
/// sandbox's own view).
fn seal(dir: &Path) -> std::io::Result<u64> {
    let mut size = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let meta = std::fs::symlink_metadata(e.path())?;
            let ft = meta.file_type();
            if ft.is_symlink() {
                continue;
            }
            if ft.is_dir() {
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o755))?;
                stack.push(e.path());
            } else if ft.is_file() {
                let exec = meta.permissions().mode() & 0o111 != 0;
                let mode = if exec { 0o755 } else { 0o644 };
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(mode))?;
                size += meta.len();
            } else {
                // Sockets, fifos, devices have no place in a package.
                std::fs::remove_file(e.path())?;
            }
        }
    }
    Ok(size)
}
