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

/// Property tests: an artifact id comes back from the code or a client; whatever it is, a
/// read never leaves the sink's directory, and a stored artifact's id is one plain file name.
/// `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use proptest::prelude::*;

    use super::*;

    /// A fresh directory per case: `<base>/secret.json` outside the sink, `<base>/sink/` the
    /// sink with one artifact `ok`.
    fn fresh() -> (PathBuf, FileArtifactSink) {
        static N: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir().join(format!(
            "gearbox-art-prop-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(base.join("sink")).expect("mkdir");
        std::fs::write(base.join("secret.json"), b"SECRET").expect("write");
        std::fs::write(base.join("sink/ok.json"), b"ok").expect("write");
        let sink = FileArtifactSink::new(base.join("sink"));
        (base, sink)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(128)))]

        #[test]
        fn reads_stay_in_the_directory(id in prop_oneof![
            any::<String>(),
            "(\\.\\./|/|\\.|secret|ok|sink){0,4}",
            Just("../secret".to_string()),
            Just("ok".to_string()),
        ]) {
            let (base, sink) = fresh();
            let got = sink.read(&id);
            let _ = std::fs::remove_dir_all(&base);
            match got {
                None => {}
                Some(bytes) => {
                    prop_assert_eq!(&bytes[..], b"ok");
                    prop_assert_eq!(id, "ok");
                }
            }
        }

        #[test]
        fn stored_ids_are_plain_names(hint in any::<String>()) {
            let (base, sink) = fresh();
            let id = sink.store(&hint, b"{}").expect("store");
            let back = sink.read(&id);
            let _ = std::fs::remove_dir_all(&base);
            prop_assert!(id.len() <= 200, "{}", id);
            prop_assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
            prop_assert_eq!(back.as_deref(), Some(&b"{}"[..]));
        }
    }
}
