//! The private, read-only workspace a run gets when the call brings files besides the
//! entrypoint: a fresh directory under the system temp dir (mode 0700), removed on drop.
//! The guest sees it as its current directory, read-only; there is no other preopen.

use std::path::{Path, PathBuf};

use gearbox_core::{JobFile, validate_relative_path};

pub(crate) struct Workspace {
    path: PathBuf,
}

impl Workspace {
    pub(crate) fn create(files: &[JobFile]) -> std::io::Result<Workspace> {
        let path = std::env::temp_dir().join(format!("gearbox-wasm-{}", random_suffix()));
        create_private_dir(&path)?;
        let ws = Workspace { path };
        for f in files {
            // Job::build validated these already; checking again costs nothing.
            validate_relative_path("files", &f.path).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
            })?;
            let target = ws.path.join(&f.path);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&target, &f.content)?;
        }
        Ok(ws)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            tracing::warn!(path = %self.path.display(), "removing the wasm workspace failed: {e}");
        }
    }
}

fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS per process and varies per instance.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{}-{:016x}", std::process::id(), h.finish())
}

#[cfg(unix)]
fn create_private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    // Not recursive: fails if the name exists, so nobody can pre-plant it.
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

#[cfg(not(unix))]
fn create_private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir(path)
}
