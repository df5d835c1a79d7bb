//! Packages of a request: the layer is fetched (or installed) outside the sandbox before the
//! job is built, mounted read-only and put on the import path. See `docs/PACKAGES.md`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use gearbox_core::{ExecRequest, Outcome, ResolvedLanguage};
use gearbox_packages::{Ecosystem, Layer, LayerStore, PackageError, PackagesConfig, Target};

/// The engine's package layers: the store (created on first use) and the interpreter each
/// language installs for.
pub struct Packages {
    config: PackagesConfig,
    store: OnceLock<Result<Arc<LayerStore>, String>>,
    targets: Mutex<HashMap<String, Result<Target, String>>>,
}

impl Packages {
    pub fn new(config: PackagesConfig) -> Packages {
        Packages {
            config,
            store: OnceLock::new(),
            targets: Mutex::new(HashMap::new()),
        }
    }

    /// The layer store, created on first use.
    pub fn store(&self) -> Result<Arc<LayerStore>, String> {
        self.store
            .get_or_init(|| {
                let dir = self.config.cache_dir();
                // The sandbox builds its own root in /tmp and its own /work, /dev and /proc:
                // a layer below one of them could not be mounted.
                if !dir.is_absolute()
                    || ["/tmp", "/work", "/dev", "/proc", "/sys"]
                        .iter()
                        .any(|p| dir.starts_with(p))
                {
                    return Err(format!(
                        "packages.cache_dir {} must be an absolute path outside /tmp, /work, \
                         /dev, /proc and /sys",
                        dir.display()
                    ));
                }
                LayerStore::new(self.config.clone())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    /// What layers of `language` are installed for: its ecosystem and interpreter.
    pub fn target(&self, resolved: &ResolvedLanguage) -> Result<Target, String> {
        let mut cache = self.targets.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .entry(resolved.name.clone())
            .or_insert_with(|| {
                let ecosystem = Ecosystem::for_language(&resolved.name).ok_or_else(|| {
                    format!(
                        "packages: {} has no package support (python and javascript do)",
                        resolved.name
                    )
                })?;
                let version = resolved.version().ok_or_else(|| {
                    format!(
                        "packages: cannot tell the version of {}",
                        resolved.interpreter.display()
                    )
                })?;
                Ok(Target {
                    ecosystem,
                    interpreter: resolved.interpreter.clone(),
                    version,
                })
            })
            .clone()
    }

    /// Get the layer for `req.packages` (when there are any) and wire it into the request:
    /// its directory joins `mounts`, its import-path variable is prepended to the call's.
    /// Refusals are `denied` outcomes, install failures `error` outcomes with the installer's
    /// trimmed error.
    pub(crate) async fn attach(
        &self,
        req: &mut ExecRequest,
        resolved: &ResolvedLanguage,
        backend: &str,
    ) -> Result<Option<Layer>, Outcome> {
        if req.packages.is_empty() {
            return Ok(None);
        }
        let lang = req.language.clone();
        if backend == "docker" || backend == "wasm" {
            // Layers are built for the host's interpreter and mounted from the host; the
            // docker image's interpreter and QuickJS could not use them.
            return Err(Outcome::denied(
                &lang,
                backend,
                format!("packages: not available on the {backend} backend (use linux)"),
            ));
        }
        let denied = |m: String| Outcome::denied(&lang, backend, m);
        let target = self.target(resolved).map_err(denied)?;
        let store = self
            .store()
            .map_err(|e| Outcome::failed_to_start(&lang, backend, e))?;
        let layer = store
            .layer(&target, &req.packages)
            .await
            .map_err(|e| match e {
                PackageError::Invalid(_) | PackageError::Unsupported(_) => {
                    Outcome::denied(&lang, backend, e.to_string())
                }
                _ => Outcome::failed_to_start(&lang, backend, e.to_string()),
            })?;
        for (k, v) in &layer.env {
            let value = match req.env.get(k) {
                Some(old) if !old.is_empty() => format!("{v}:{old}"),
                _ => v.clone(),
            };
            req.env.insert(k.clone(), value);
        }
        req.mounts.push(layer.path.clone());
        tracing::info!(
            language = %lang,
            layer = %layer.key,
            cached = layer.cached,
            ms = layer.elapsed_ms,
            packages = ?layer.packages,
            "package layer attached"
        );
        Ok(Some(layer))
    }
}

/// Add the time spent getting the layer to the outcome's set-up time.
pub(crate) fn account(outcome: &mut Outcome, layer: Option<&Layer>) {
    if let Some(l) = layer {
        let us = l.elapsed_ms.saturating_mul(1000);
        outcome.usage.setup_us = Some(outcome.usage.setup_us.unwrap_or(0).saturating_add(us));
    }
}
