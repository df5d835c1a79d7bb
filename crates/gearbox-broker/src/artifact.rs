//! Where a tool result too large for the code goes.

use std::path::{Path, PathBuf};

/// Stores the full text of a trimmed tool result and names it. Sessions store into their
/// workspace; [`FileArtifactSink`] serves runs without a session.
pub trait ArtifactSink: Send + Sync {
    /// Store `bytes` (a JSON document) and return the artifact's id. `hint` is a safe file
    /// name stem (`server-tool-N`).
    fn store(&self, hint: &str, bytes: &[u8]) -> Result<String, String>;
}

/// Artifacts as files `<dir>/<id>.json`, the id a fresh UUID prefixed with the hint.
#[derive(Debug, Clone)]
pub struct FileArtifactSink {
    dir: PathBuf,
}

impl FileArtifactSink {
    pub fn new(dir: impl Into<PathBuf>) -> FileArtifactSink {
        FileArtifactSink { dir: dir.into() }
    }

    /// A sink in `gearbox-artifacts-UID` under the system's temporary directory.
    pub fn in_temp_dir() -> FileArtifactSink {
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        FileArtifactSink::new(std::env::temp_dir().join(format!("gearbox-artifacts-{uid}")))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The stored bytes of `id`, if it is an id this sink could have made.
    pub fn read(&self, id: &str) -> Option<Vec<u8>> {
        if id.is_empty()
            || id.len() > 200
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return None;
        }
        std::fs::read(self.dir.join(format!("{id}.json"))).ok()
    }
}

impl ArtifactSink for FileArtifactSink {
    fn store(&self, hint: &str, bytes: &[u8]) -> Result<String, String> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| format!("creating {}: {e}", self.dir.display()))?;
        let stem: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(100)
            .collect();
        let id = format!("{stem}-{}", uuid::Uuid::new_v4().simple());
        let path = self.dir.join(format!("{id}.json"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("creating {}: {e}", path.display()))?;
        f.write_all(bytes)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_and_reads_back_and_refuses_odd_ids() {
        let dir = std::env::temp_dir().join(format!("gearbox-art-test-{}", std::process::id()));
        let sink = FileArtifactSink::new(&dir);
        let id = sink.store("every/thing ../x", b"{\"a\":1}").expect("store");
        assert!(id.starts_with("every_thing____x-"), "{id}");
        assert_eq!(sink.read(&id).as_deref(), Some(&b"{\"a\":1}"[..]));
        assert!(sink.read("../../etc/passwd").is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
