//! The session store: the directory of sessions, their lifetimes and their files.
//!
//! The disk is the truth: every operation reads `meta.json`, so several servers sharing a
//! directory (one stdio server per client, say) see the same sessions, and a server that
//! starts after a crash finds what it needs to clean up.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gearbox_core::tree::{self, open_beneath};
use gearbox_core::{CollectLimits, Collected, JobFile, validate_relative_path};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::fsops::{exchange, mkdir_at, open_dir_beneath, write_new_file};
use crate::id::SessionId;

/// Name of a session's metadata file.
const META: &str = "meta.json";
/// Name of a session's workspace directory.
const FILES: &str = "files";
/// Name of the workspace being written before it replaces `files`.
const FILES_NEW: &str = "files.new";
/// Prefix of a session directory being created (renamed into place when complete).
const CREATING: &str = ".creating-";
/// Prefix of a session directory being deleted.
const DELETING: &str = ".deleting-";
/// Age after which a `.creating-` directory is a crash's leftover.
const STALE_CREATING: Duration = Duration::from_secs(60);

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("session {0} does not exist (closed, expired or never opened)")]
    NotFound(SessionId),
    #[error("session {0} is closed (kept with persist: its files can be read, not changed)")]
    Closed(SessionId),
    #[error("too many open sessions ({0}); close one with exec_close or wait for one to expire")]
    TooMany(usize),
    #[error("session workspace over its limits: {0}")]
    Quota(String),
    #[error("{path}: {what} does not exist or is not a regular file in the session")]
    NoSuchFile { path: String, what: &'static str },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

/// Settings of a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Directory holding one sub-directory per session (created 0700).
    pub dir: PathBuf,
    /// Idle time after which a session expires.
    pub ttl: Duration,
    /// Most bytes of a session's files.
    pub quota_bytes: u64,
    /// Most files in a session.
    pub max_files: usize,
    /// Most sessions open at once.
    pub max_sessions: usize,
}

/// One file of a session's manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    pub size: u64,
    /// SHA-256 of the content, hex.
    pub sha256: String,
}

/// How a file changed in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Created,
    Modified,
    Deleted,
}

/// A file a run created, changed or deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    pub path: String,
    pub change: ChangeKind,
    /// Size after the run (0 when deleted).
    pub size: u64,
    /// SHA-256 after the run (absent when deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// What a caller learns about a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: String,
    /// Where the files are inside the sandbox.
    pub workspace: String,
    /// When the session expires if unused (RFC 3339); absent for a closed, persisted one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    pub files: usize,
    pub bytes: u64,
    pub quota_bytes: u64,
    pub max_files: usize,
    pub closed: bool,
    pub persist: bool,
    /// The tenant that opened it (an API key's name, `stdio` on a local server); others
    /// are told it does not exist.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub owner: String,
}

/// A slice of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    pub path: String,
    /// Size of the whole file.
    pub size: u64,
    pub offset: u64,
    pub content: Vec<u8>,
}

impl Artifact {
    /// Whether bytes remain after this slice.
    pub fn more(&self) -> bool {
        self.offset + (self.content.len() as u64) < self.size
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    id: String,
    created: u64,
    last_used: u64,
    ttl_secs: u64,
    #[serde(default)]
    closed: bool,
    #[serde(default)]
    persist: bool,
    #[serde(default)]
    manifest: BTreeMap<String, FileEntry>,
    /// The tenant that opened the session (empty: made before sessions had owners, anyone's).
    #[serde(default)]
    owner: String,
}

impl Meta {
    /// When it expires, in whole seconds. `last_used` is floored to its second, so the
    /// expiry is one second past `last_used + ttl_secs`: a session idle for less than its
    /// TTL is never expired (it could be by up to a second, and a check of the TTL caught it).
    fn expires(&self) -> Option<u64> {
        (!(self.closed && self.persist)).then(|| {
            self.last_used
                .saturating_add(self.ttl_secs)
                .saturating_add(1)
        })
    }
    fn expired(&self, now: u64) -> bool {
        self.expires().is_some_and(|e| e <= now)
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn rfc3339(secs: u64) -> String {
    chrono::DateTime::from_timestamp(secs as i64, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The store. Cheap to share behind an `Arc`.
pub struct SessionStore {
    opts: StoreOptions,
    root: OwnedFd,
    /// One run at a time per session (in this process).
    run_locks: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
}

impl SessionStore {
    /// Open (creating) the store's directory and clean what a crash left: expired sessions,
    /// half-created and half-deleted directories, half-written workspaces.
    pub fn open(opts: StoreOptions) -> Result<Arc<SessionStore>, StoreError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&opts.dir)
            .map_err(io_err(format!("creating {}", opts.dir.display())))?;
        let root =
            tree::open_dir(&opts.dir).map_err(io_err(format!("opening {}", opts.dir.display())))?;
        let store = Arc::new(SessionStore {
            opts,
            root,
            run_locks: Mutex::new(HashMap::new()),
        });
        let removed = store.cleanup(true);
        if removed > 0 {
            tracing::info!(removed, dir = %store.opts.dir.display(), "removed expired or half-written sessions");
        }
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    /// The limits a session's runs collect within.
    pub fn limits(&self) -> CollectLimits {
        CollectLimits {
            max_files: self.opts.max_files,
            max_bytes: self.opts.quota_bytes,
        }
    }

    /// Remove expired sessions and leftovers; with `startup`, also stale half-created
    /// directories and half-written workspaces. Returns how many entries were removed.
    pub fn cleanup(&self, startup: bool) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.opts.dir) else {
            return 0;
        };
        let now = now_secs();
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(DELETING) {
                removed += usize::from(std::fs::remove_dir_all(&path).is_ok());
                continue;
            }
            if name.starts_with(CREATING) {
                let stale = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= STALE_CREATING);
                if startup && stale {
                    removed += usize::from(std::fs::remove_dir_all(&path).is_ok());
                }
                continue;
            }
            // Only directories named by a valid id are sessions; anything else is left alone.
            let Ok(id) = SessionId::from_dir_name(&name) else {
                continue;
            };
            let meta = self.read_meta(&id);
            let dead = match &meta {
                Ok(m) => m.expired(now),
                // A session directory without readable metadata is a crash's leftover.
                Err(_) => startup,
            };
            if dead && self.try_remove(&id) {
                removed += 1;
                continue;
            }
            if startup && meta.is_ok() {
                // A workspace being written when the server died.
                let _ = std::fs::remove_dir_all(path.join(FILES_NEW));
            }
        }
        removed
    }

    /// Start a task that removes expired sessions every `period` while the store lives.
    pub fn spawn_sweeper(self: &Arc<Self>, period: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<SessionStore> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period.max(Duration::from_millis(100)));
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(store) = weak.upgrade() else { return };
                let removed = tokio::task::spawn_blocking(move || store.cleanup(false))
                    .await
                    .unwrap_or(0);
                if removed > 0 {
                    tracing::info!(removed, "expired sessions removed");
                }
            }
        })
    }

    /// Remove a session unless a run holds it; true when it is gone.
    fn try_remove(&self, id: &SessionId) -> bool {
        let lock = self.run_lock(id);
        let Ok(_held) = lock.try_lock() else {
            return false;
        };
        let from = self.opts.dir.join(id.dir_name());
        let to = self
            .opts
            .dir
            .join(format!("{DELETING}{}-{}", id.dir_name(), SessionId::new()));
        if std::fs::rename(&from, &to).is_err() {
            return false;
        }
        let _ = std::fs::remove_dir_all(&to);
        self.run_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        true
    }

    fn run_lock(&self, id: &SessionId) -> Arc<tokio::sync::Mutex<()>> {
        self.run_locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(*id)
            .or_default()
            .clone()
    }

    fn read_meta(&self, id: &SessionId) -> Result<Meta, StoreError> {
        let path = format!("{}/{META}", id.dir_name());
        let bytes = tree::read_beneath(self.root.as_fd(), &path, 64 << 20).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                StoreError::NotFound(*id)
            } else {
                StoreError::Io {
                    what: format!("reading the metadata of session {id}"),
                    source: e,
                }
            }
        })?;
        let meta: Meta = serde_json::from_slice(&bytes).map_err(|e| StoreError::Io {
            what: format!("parsing the metadata of session {id}"),
            source: io::Error::other(e),
        })?;
        if meta.id != id.dir_name() {
            return Err(StoreError::NotFound(*id));
        }
        Ok(meta)
    }

    fn write_meta(&self, dir: &str, meta: &Meta) -> Result<(), StoreError> {
        let what = || format!("writing the metadata of session {}", meta.id);
        let json = serde_json::to_vec_pretty(meta).map_err(|e| StoreError::Io {
            what: what(),
            source: io::Error::other(e),
        })?;
        let d = open_dir_beneath(self.root.as_fd(), dir).map_err(io_err(what()))?;
        let tmp = format!("{META}.new");
        let _ = unlinkat(d.as_fd(), &tmp);
        let fd = open_beneath(
            d.as_fd(),
            &tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
            0o600,
        )
        .map_err(io_err(what()))?;
        std::fs::File::from(fd)
            .write_all(&json)
            .map_err(io_err(what()))?;
        renameat(d.as_fd(), &tmp, META).map_err(io_err(what()))
    }

    /// The metadata of an open, unexpired session.
    fn live_meta(&self, id: &SessionId) -> Result<Meta, StoreError> {
        let meta = self.read_meta(id)?;
        if meta.expired(now_secs()) {
            self.try_remove(id);
            return Err(StoreError::NotFound(*id));
        }
        Ok(meta)
    }

    fn info_of(&self, meta: &Meta) -> SessionInfo {
        SessionInfo {
            // As clients see it: `REPLICA.UUID` on a replica of a fleet.
            session_id: SessionId::from_dir_name(&meta.id)
                .map(|id| id.to_string())
                .unwrap_or_else(|_| meta.id.clone()),
            workspace: "/work".into(),
            expires_at: meta.expires().map(rfc3339),
            files: meta.manifest.len(),
            bytes: meta.manifest.values().map(|f| f.size).sum(),
            quota_bytes: self.opts.quota_bytes,
            max_files: self.opts.max_files,
            closed: meta.closed,
            persist: meta.persist,
            owner: meta.owner.clone(),
        }
    }

    /// `id` is a session `tenant` may use: open or persisted, unexpired, and its own.
    /// Another tenant's session does not exist, as far as `tenant` is told: the ids of
    /// others are never confirmed.
    pub fn check_owner(&self, id: &SessionId, tenant: &str) -> Result<(), StoreError> {
        let meta = self.live_meta(id)?;
        if meta.owner.is_empty() || meta.owner == tenant {
            Ok(())
        } else {
            Err(StoreError::NotFound(*id))
        }
    }

    /// The sessions `tenant` may see ([`SessionStore::list`], its own only).
    pub fn list_for(&self, tenant: &str) -> Vec<SessionInfo> {
        self.list()
            .into_iter()
            .filter(|s| s.owner.is_empty() || s.owner == tenant)
            .collect()
    }

    /// Open a new session with an empty workspace, owned by `owner` (a tenant).
    pub fn create(&self, owner: &str) -> Result<SessionInfo, StoreError> {
        let open = self.list().iter().filter(|s| !s.closed).count();
        if open >= self.opts.max_sessions {
            self.cleanup(false);
            if self.list().iter().filter(|s| !s.closed).count() >= self.opts.max_sessions {
                return Err(StoreError::TooMany(self.opts.max_sessions));
            }
        }
        let id = SessionId::new();
        let now = now_secs();
        let meta = Meta {
            id: id.dir_name(),
            created: now,
            last_used: now,
            ttl_secs: self.opts.ttl.as_secs().max(1),
            closed: false,
            persist: false,
            manifest: BTreeMap::new(),
            owner: owner.to_string(),
        };
        // Built under a temporary name and renamed into place: a crash leaves no half
        // session under a valid id.
        let tmp = format!("{CREATING}{}", id.dir_name());
        let what = || format!("creating session {id}");
        mkdir_at(self.root.as_fd(), &tmp, 0o700).map_err(io_err(what()))?;
        let d = open_dir_beneath(self.root.as_fd(), &tmp).map_err(io_err(what()))?;
        mkdir_at(d.as_fd(), FILES, 0o700).map_err(io_err(what()))?;
        drop(d);
        self.write_meta(&tmp, &meta)?;
        renameat(self.root.as_fd(), &tmp, &id.dir_name()).map_err(io_err(what()))?;
        Ok(self.info_of(&meta))
    }

    /// What a session looks like now.
    pub fn info(&self, id: &SessionId) -> Result<SessionInfo, StoreError> {
        Ok(self.info_of(&self.live_meta(id)?))
    }

    /// Every session in the directory that has not expired.
    pub fn list(&self) -> Vec<SessionInfo> {
        let Ok(entries) = std::fs::read_dir(&self.opts.dir) else {
            return Vec::new();
        };
        let now = now_secs();
        let mut out: Vec<SessionInfo> = entries
            .flatten()
            .filter_map(|e| SessionId::from_dir_name(&e.file_name().to_string_lossy()).ok())
            .filter_map(|id| self.read_meta(&id).ok())
            .filter(|m| !m.expired(now))
            .map(|m| self.info_of(&m))
            .collect();
        out.sort_by(|a, b| a.session_id.cmp(&b.session_id));
        out
    }

    /// Take a session for a run: waits for the session's previous run, checks it is open,
    /// and renews its lease. The guard holds the session until the run's files are applied.
    pub async fn begin_run(&self, id: &SessionId) -> Result<RunGuard, StoreError> {
        let lock = self.run_lock(id);
        let guard = lock.lock_owned().await;
        let mut meta = self.live_meta(id)?;
        if meta.closed {
            return Err(StoreError::Closed(*id));
        }
        meta.last_used = now_secs();
        self.write_meta(&id.dir_name(), &meta)?;
        Ok(RunGuard {
            id: *id,
            stamped: meta.last_used,
            _guard: guard,
        })
    }

    /// Renew the lease of the session `run` holds as its use ends (a live cell), so that its
    /// idle time counts from the end of its last use, not the start. Writes at most once a
    /// second per session (times are whole seconds).
    pub fn renew(&self, run: &RunGuard) -> Result<(), StoreError> {
        if now_secs() <= run.stamped {
            return Ok(());
        }
        let mut meta = self.live_meta(&run.id)?;
        meta.last_used = now_secs();
        self.write_meta(&run.id.dir_name(), &meta)
    }

    /// The session's files, to be copied into a run's workspace.
    pub fn workspace_files(&self, run: &RunGuard) -> Result<Vec<JobFile>, StoreError> {
        let id = run.id;
        let what = || format!("reading the files of session {id}");
        let dir = open_dir_beneath(self.root.as_fd(), &format!("{}/{FILES}", id.dir_name()))
            .map_err(io_err(what()))?;
        let mut files = Vec::new();
        let summary = tree::walk(dir.as_fd(), &self.limits(), &mut |path, file, size| {
            let mut content = Vec::with_capacity(size as usize);
            file.take(size).read_to_end(&mut content)?;
            files.push(JobFile {
                path: path.to_string(),
                content,
            });
            Ok(())
        })
        .map_err(io_err(what()))?;
        if let Some(e) = summary.error {
            return Err(StoreError::Quota(e));
        }
        Ok(files)
    }

    /// Replace the session's files with what a run left, and say what changed. The
    /// collection is checked again (paths, count, bytes); nothing is changed when it fails.
    pub fn apply(
        &self,
        run: &RunGuard,
        collected: &Collected,
    ) -> Result<Vec<FileChange>, StoreError> {
        let id = run.id;
        if let Some(e) = &collected.summary.error {
            return Err(StoreError::Quota(e.clone()));
        }
        let total: u64 = collected.files.iter().map(|f| f.content.len() as u64).sum();
        if collected.files.len() > self.opts.max_files || total > self.opts.quota_bytes {
            return Err(StoreError::Quota(format!(
                "{} files, {total} bytes; the limits are {} files, {} bytes",
                collected.files.len(),
                self.opts.max_files,
                self.opts.quota_bytes
            )));
        }
        let mut meta = self.live_meta(&id)?;
        let what = || format!("saving the files of session {id}");
        let sdir = open_dir_beneath(self.root.as_fd(), &id.dir_name()).map_err(io_err(what()))?;
        remove_beneath(&self.opts.dir.join(id.dir_name()).join(FILES_NEW));
        mkdir_at(sdir.as_fd(), FILES_NEW, 0o700).map_err(io_err(what()))?;
        let new_dir = open_dir_beneath(sdir.as_fd(), FILES_NEW).map_err(io_err(what()))?;
        let mut manifest = BTreeMap::new();
        for f in &collected.files {
            validate_relative_path("collected file", &f.path)
                .map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
            if let Err(e) = write_new_file(new_dir.as_fd(), &f.path, &f.content) {
                remove_beneath(&self.opts.dir.join(id.dir_name()).join(FILES_NEW));
                return Err(StoreError::Io {
                    what: format!("saving {:?} in session {id}", f.path),
                    source: e,
                });
            }
            manifest.insert(
                f.path.clone(),
                FileEntry {
                    size: f.content.len() as u64,
                    sha256: sha256_hex(&f.content),
                },
            );
        }
        exchange(sdir.as_fd(), FILES_NEW, FILES).map_err(io_err(what()))?;
        remove_beneath(&self.opts.dir.join(id.dir_name()).join(FILES_NEW));
        let changes = diff(&meta.manifest, &manifest);
        meta.manifest = manifest;
        meta.last_used = now_secs();
        self.write_meta(&id.dir_name(), &meta)?;
        Ok(changes)
    }

    /// Close a session: delete it, or with `persist` keep its files (readable, no longer
    /// runnable, never expiring).
    pub fn close(&self, id: &SessionId, persist: bool) -> Result<SessionInfo, StoreError> {
        let mut meta = self.live_meta(id)?;
        meta.closed = true;
        meta.persist = persist;
        let info = self.info_of(&meta);
        if persist {
            self.write_meta(&id.dir_name(), &meta)?;
        } else {
            // A run in progress keeps the session until it ends; then it is removed here
            // or, failing that, by the sweeper (closed sessions are written as expired).
            meta.ttl_secs = 0;
            self.write_meta(&id.dir_name(), &meta)?;
            self.try_remove(id);
        }
        Ok(info)
    }

    /// The manifest of a session's files (path, size, SHA-256).
    pub fn files(&self, id: &SessionId) -> Result<BTreeMap<String, FileEntry>, StoreError> {
        Ok(self.live_meta(id)?.manifest)
    }

    /// Read `max` bytes from `offset` of the session file `path`. The path is validated and
    /// opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: a symlink anywhere on
    /// the way, even one planted in the session's directory on the host, is refused.
    pub fn read(
        &self,
        id: &SessionId,
        path: &str,
        offset: u64,
        max: u64,
    ) -> Result<Artifact, StoreError> {
        validate_relative_path("path", path)
            .map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
        self.live_meta(id)?;
        let dir = open_dir_beneath(self.root.as_fd(), &format!("{}/{FILES}", id.dir_name()))
            .map_err(io_err(format!("opening the files of session {id}")))?;
        let no_file = || StoreError::NoSuchFile {
            path: path.chars().take(200).collect(),
            what: "it",
        };
        let fd = open_beneath(
            dir.as_fd(),
            path,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(|_| no_file())?;
        let mut f = std::fs::File::from(fd);
        let m = f.metadata().map_err(|_| no_file())?;
        if !m.is_file() {
            return Err(no_file());
        }
        let size = m.len();
        let offset = offset.min(size);
        f.seek(SeekFrom::Start(offset))
            .map_err(io_err(format!("reading {path:?}")))?;
        let mut content = Vec::new();
        f.take(max)
            .read_to_end(&mut content)
            .map_err(io_err(format!("reading {path:?}")))?;
        Ok(Artifact {
            path: path.to_string(),
            size,
            offset,
            content,
        })
    }
}

/// Held while a run uses a session.
pub struct RunGuard {
    id: SessionId,
    /// The `last_used` it stamped.
    stamped: u64,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl RunGuard {
    pub fn id(&self) -> SessionId {
        self.id
    }
}

fn diff(old: &BTreeMap<String, FileEntry>, new: &BTreeMap<String, FileEntry>) -> Vec<FileChange> {
    let mut out = Vec::new();
    for (path, entry) in new {
        let change = match old.get(path) {
            None => ChangeKind::Created,
            Some(o) if o != entry => ChangeKind::Modified,
            Some(_) => continue,
        };
        out.push(FileChange {
            path: path.clone(),
            change,
            size: entry.size,
            sha256: Some(entry.sha256.clone()),
        });
    }
    for path in old.keys().filter(|p| !new.contains_key(*p)) {
        out.push(FileChange {
            path: path.clone(),
            change: ChangeKind::Deleted,
            size: 0,
            sha256: None,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Remove a directory tree of the store (never follows symlinks: `remove_dir_all` unlinks
/// them).
fn remove_beneath(path: &Path) {
    let _ = std::fs::remove_dir_all(path);
}

fn unlinkat(dir: std::os::fd::BorrowedFd<'_>, name: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let r = unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn renameat(dir: std::os::fd::BorrowedFd<'_>, from: &str, to: &str) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let a = std::ffi::CString::new(from).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let b = std::ffi::CString::new(to).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let r = unsafe { libc::renameat(dir.as_raw_fd(), a.as_ptr(), dir.as_raw_fd(), b.as_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearbox_core::WalkSummary;

    fn opts(dir: &Path) -> StoreOptions {
        StoreOptions {
            dir: dir.to_path_buf(),
            ttl: Duration::from_secs(3600),
            quota_bytes: 1 << 20,
            max_files: 100,
            max_sessions: 4,
        }
    }

    fn tmpdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("gearbox-sessions-test-{}", SessionId::new()));
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn collected(files: &[(&str, &[u8])]) -> Collected {
        Collected {
            files: files
                .iter()
                .map(|(p, c)| JobFile {
                    path: p.to_string(),
                    content: c.to_vec(),
                })
                .collect(),
            summary: WalkSummary {
                files: files.len(),
                ..Default::default()
            },
        }
    }

    fn id_of(info: &SessionInfo) -> SessionId {
        SessionId::parse("id", &info.session_id).expect("valid id")
    }

    #[tokio::test]
    async fn files_persist_and_changes_are_listed() {
        let d = tmpdir();
        let store = SessionStore::open(opts(&d)).expect("store");
        let info = store.create("t").expect("create");
        let id = id_of(&info);
        let run = store.begin_run(&id).await.expect("run");
        assert!(store.workspace_files(&run).expect("files").is_empty());
        let ch = store
            .apply(&run, &collected(&[("a.txt", b"one"), ("d/b.bin", &[0, 1])]))
            .expect("apply");
        assert_eq!(ch.len(), 2);
        assert!(ch.iter().all(|c| c.change == ChangeKind::Created));
        drop(run);
        let run = store.begin_run(&id).await.expect("run 2");
        let files = store.workspace_files(&run).expect("files");
        assert_eq!(files.len(), 2);
        let ch = store
            .apply(&run, &collected(&[("a.txt", b"two"), ("c", b"")]))
            .expect("apply 2");
        let kinds: Vec<_> = ch.iter().map(|c| (c.path.as_str(), c.change)).collect();
        assert_eq!(
            kinds,
            [
                ("a.txt", ChangeKind::Modified),
                ("c", ChangeKind::Created),
                ("d/b.bin", ChangeKind::Deleted)
            ]
        );
        drop(run);
        let a = store.read(&id, "a.txt", 1, 10).expect("read");
        assert_eq!(
            (a.content.as_slice(), a.size, a.more()),
            (&b"wo"[..], 3, false)
        );
        let a = store.read(&id, "a.txt", 0, 1).expect("read");
        assert!(a.more());
        store.close(&id, false).expect("close");
        assert!(matches!(store.info(&id), Err(StoreError::NotFound(_))));
        assert!(!d.join(id.dir_name()).exists());
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[tokio::test]
    async fn planted_symlinks_and_traversal_are_never_followed() {
        let d = tmpdir();
        let secret = d.join("host-secret.txt");
        std::fs::write(&secret, "HOST SECRET").expect("plant");
        let store = SessionStore::open(opts(&d)).expect("store");
        let id = id_of(&store.create("t").expect("create"));
        let files = d.join(id.dir_name()).join(FILES);
        std::os::unix::fs::symlink(&secret, files.join("link.txt")).expect("symlink");
        std::os::unix::fs::symlink("/etc", files.join("etc")).expect("symlink");
        std::os::unix::fs::symlink("..", files.join("up")).expect("symlink");
        for p in [
            "link.txt",
            "etc/passwd",
            "up/meta.json",
            "up/../host-secret.txt",
            "../../host-secret.txt",
            "../meta.json",
            "/etc/passwd",
            "%2e%2e/meta.json",
        ] {
            match store.read(&id, p, 0, 100) {
                Err(StoreError::InvalidArgument(_) | StoreError::NoSuchFile { .. }) => {}
                other => panic!("{p}: {other:?}"),
            }
        }
        // The session's own directory as a symlink to elsewhere: refused as well.
        let other = id_of(&store.create("t").expect("create"));
        let other_files = d.join(other.dir_name()).join(FILES);
        std::fs::remove_dir(&other_files).expect("rmdir");
        std::os::unix::fs::symlink("/etc", &other_files).expect("symlink");
        assert!(store.read(&other, "passwd", 0, 100).is_err());
        // A run's copy-in skips the planted links.
        let run = store.begin_run(&id).await.expect("run");
        assert!(store.workspace_files(&run).expect("walk").is_empty());
        // Bad ids never reach the filesystem.
        for bad in ["../../etc", "%2e%2e", &id.to_string().to_uppercase()] {
            assert!(SessionId::parse("session_id", bad).is_err());
        }
        assert_eq!(
            std::fs::read_to_string(&secret).expect("intact"),
            "HOST SECRET"
        );
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[tokio::test]
    async fn quota_is_checked_and_leaves_files_unchanged() {
        let d = tmpdir();
        let mut o = opts(&d);
        o.quota_bytes = 10;
        o.max_files = 2;
        let store = SessionStore::open(o).expect("store");
        let id = id_of(&store.create("t").expect("create"));
        let run = store.begin_run(&id).await.expect("run");
        store
            .apply(&run, &collected(&[("a", b"12345")]))
            .expect("fits");
        let e = store
            .apply(&run, &collected(&[("a", b"123456789012")]))
            .expect_err("too big");
        assert!(matches!(e, StoreError::Quota(_)), "{e}");
        let e = store
            .apply(&run, &collected(&[("a", b""), ("b", b""), ("c", b"")]))
            .expect_err("too many");
        assert!(matches!(e, StoreError::Quota(_)), "{e}");
        let bad = collected(&[("../x", b"")]);
        assert!(store.apply(&run, &bad).is_err());
        assert!(!d.join(id.dir_name()).join("x").exists());
        drop(run);
        assert_eq!(
            store.read(&id, "a", 0, 100).expect("read").content,
            b"12345"
        );
        std::fs::remove_dir_all(&d).expect("rm");
    }

    /// Last use is kept in whole seconds (floored): a session used at 1000.9 s with a TTL of
    /// 2 s has been idle for its TTL only from 1002.9 s, so it may not expire at 1002.
    #[test]
    fn a_session_never_expires_before_its_ttl() {
        let meta = Meta {
            id: "x".into(),
            created: 1000,
            last_used: 1000,
            ttl_secs: 2,
            closed: false,
            persist: false,
            manifest: BTreeMap::new(),
            owner: String::new(),
        };
        assert!(!meta.expired(1002));
        assert!(meta.expired(1003));
    }

    #[tokio::test]
    async fn sessions_expire_and_startup_cleans_crash_leftovers() {
        let d = tmpdir();
        let mut o = opts(&d);
        o.ttl = Duration::from_secs(1);
        let store = SessionStore::open(o.clone()).expect("store");
        let id = id_of(&store.create("t").expect("create"));
        let kept = id_of(&store.create("t").expect("create"));
        store.close(&kept, true).expect("persist");
        tokio::time::sleep(Duration::from_millis(2100)).await;
        assert!(matches!(store.info(&id), Err(StoreError::NotFound(_))));
        assert!(
            store
                .read(&kept, "x", 0, 1)
                .is_err_and(|e| matches!(e, StoreError::NoSuchFile { .. }))
        );
        assert!(store.info(&kept).expect("persisted").closed);
        drop(store);

        // Crash leftovers: an expired session, one without metadata, a half-written
        // workspace, a half-deleted directory; and a stranger's file, left alone.
        let store = SessionStore::open(opts(&d)).expect("store");
        let expired = id_of(&store.create("t").expect("create"));
        let meta_path = d.join(expired.dir_name()).join(META);
        let mut meta: Meta =
            serde_json::from_slice(&std::fs::read(&meta_path).expect("meta")).expect("json");
        meta.last_used = 1000;
        std::fs::write(&meta_path, serde_json::to_vec(&meta).expect("json")).expect("write");
        let live = id_of(&store.create("t").expect("create"));
        std::fs::create_dir_all(d.join(live.dir_name()).join(FILES_NEW)).expect("mkdir");
        let orphan = SessionId::new();
        std::fs::create_dir_all(d.join(orphan.dir_name()).join(FILES)).expect("mkdir");
        std::fs::create_dir_all(d.join(format!("{DELETING}x"))).expect("mkdir");
        std::fs::write(d.join("README"), "not ours").expect("write");
        drop(store);
        let store = SessionStore::open(opts(&d)).expect("restart");
        assert!(!d.join(expired.dir_name()).exists());
        assert!(!d.join(orphan.dir_name()).exists());
        assert!(!d.join(format!("{DELETING}x")).exists());
        assert!(!d.join(live.dir_name()).join(FILES_NEW).exists());
        assert!(store.info(&live).is_ok());
        assert!(d.join("README").exists());
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[tokio::test]
    async fn max_sessions_and_closed_sessions() {
        let d = tmpdir();
        let store = SessionStore::open(opts(&d)).expect("store");
        let ids: Vec<_> = (0..4)
            .map(|_| id_of(&store.create("t").expect("create")))
            .collect();
        assert!(matches!(store.create("t"), Err(StoreError::TooMany(4))));
        store.close(&ids[0], true).expect("close");
        assert!(matches!(
            store.begin_run(&ids[0]).await,
            Err(StoreError::Closed(_))
        ));
        store
            .create("t")
            .expect("a persisted session does not count as open");
        std::fs::remove_dir_all(&d).expect("rm");
    }
}

/// Property tests of the store's read and write paths with hostile paths: a read returns
/// the content of one of the session's own files or an error, never a byte from elsewhere
/// (the session's metadata, another directory, a planted symlink's target); saving a run's
/// files refuses what is not a valid workspace path and never writes outside the session.
/// `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner, contextualize_config};

    use super::*;
    use crate::fsops::proptests::hostile_path;
    use gearbox_core::WalkSummary;

    fn runner(cases: u32) -> TestRunner {
        TestRunner::new(contextualize_config(Config::with_cases(
            gearbox_core::fuzz_cases(cases),
        )))
    }

    fn tmpdir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("gearbox-sessions-prop-{}", SessionId::new()));
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn opts(dir: &Path) -> StoreOptions {
        StoreOptions {
            dir: dir.to_path_buf(),
            ttl: Duration::from_secs(3600),
            quota_bytes: 1 << 20,
            max_files: 100,
            max_sessions: 4,
        }
    }

    fn collected(files: &[(&str, &[u8])]) -> Collected {
        Collected {
            files: files
                .iter()
                .map(|(p, c)| JobFile {
                    path: p.to_string(),
                    content: c.to_vec(),
                })
                .collect(),
            summary: WalkSummary {
                files: files.len(),
                ..Default::default()
            },
        }
    }

    /// Every entry under `dir` but those in `skip`, with the content of regular files,
    /// symlinks not followed.
    fn snapshot(dir: &Path, skip: &[PathBuf]) -> BTreeMap<PathBuf, Vec<u8>> {
        fn walk(dir: &Path, skip: &[PathBuf], out: &mut BTreeMap<PathBuf, Vec<u8>>) {
            for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
                let p = e.path();
                if skip.contains(&p) {
                    continue;
                }
                out.insert(p.clone(), Vec::new());
                let m = std::fs::symlink_metadata(&p).expect("lstat");
                if m.is_dir() {
                    walk(&p, skip, out);
                } else if m.is_file() {
                    out.insert(p.clone(), std::fs::read(&p).expect("read"));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(dir, skip, &mut out);
        out
    }

    #[test]
    fn reads_return_only_the_sessions_own_files() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let d = tmpdir();
        std::fs::write(d.join("host-secret.txt"), "SECRET").expect("plant");
        let store = SessionStore::open(opts(&d)).expect("store");
        let info = store.create("t").expect("create");
        let id = SessionId::parse("id", &info.session_id).expect("id");
        let run = rt.block_on(store.begin_run(&id)).expect("run");
        store
            .apply(
                &run,
                &collected(&[("a.txt", b"INSIDE a"), ("sub/b.txt", b"INSIDE b")]),
            )
            .expect("apply");
        drop(run);
        let files = d.join(id.dir_name()).join(FILES);
        std::os::unix::fs::symlink(d.join("host-secret.txt"), files.join("link")).expect("ln");
        std::os::unix::fs::symlink("..", files.join("abs")).expect("ln");
        std::os::unix::fs::symlink("/etc", files.join("outside.txt")).expect("ln");
        runner(256)
            .run(&hostile_path(), |path| {
                match store.read(&id, &path, 0, 1 << 16) {
                    Ok(art) => {
                        prop_assert!(art.content.starts_with(b"INSIDE"), "{:?}", path);
                        prop_assert!(validate_relative_path("p", &path).is_ok());
                    }
                    Err(StoreError::InvalidArgument(_) | StoreError::NoSuchFile { .. }) => {}
                    Err(e) => {
                        return Err(TestCaseError::fail(format!("{path:?}: {e}")));
                    }
                }
                Ok(())
            })
            .expect("property");
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn saving_hostile_paths_writes_nothing_outside_the_session() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let d = tmpdir();
        std::fs::write(d.join("host-secret.txt"), "SECRET").expect("plant");
        let store = SessionStore::open(opts(&d)).expect("store");
        let info = store.create("t").expect("create");
        let id = SessionId::parse("id", &info.session_id).expect("id");
        let session = d.join(id.dir_name());
        // What a save may change: the files, the metadata, the scratch copy it builds.
        let skip = [FILES, META, FILES_NEW].map(|n| session.join(n));
        let strategy = proptest::collection::vec(hostile_path(), 1..4);
        runner(64)
            .run(&strategy, |paths| {
                let before = snapshot(&d, &skip);
                let run = rt.block_on(store.begin_run(&id)).expect("run");
                let mut unique = paths.clone();
                unique.sort();
                unique.dedup();
                let files: Vec<(&str, &[u8])> =
                    unique.iter().map(|p| (p.as_str(), &b"W"[..])).collect();
                let result = store.apply(&run, &collected(&files));
                drop(run);
                prop_assert_eq!(snapshot(&d, &skip), before);
                let all_valid = unique
                    .iter()
                    .all(|p| validate_relative_path("p", p).is_ok());
                if result.is_ok() {
                    prop_assert!(all_valid, "{:?} saved", unique);
                    // Each saved file is readable back at its path.
                    for p in &unique {
                        let art = store.read(&id, p, 0, 16);
                        prop_assert!(art.is_ok(), "{:?}: {:?}", p, art.err());
                    }
                } else if all_valid {
                    // Valid paths may still clash (a file where another needs a directory)
                    // or have a component longer than the filesystem allows.
                    let clash = unique
                        .iter()
                        .any(|p| unique.iter().any(|q| q.starts_with(&format!("{p}/"))));
                    let too_long = unique.iter().any(|p| p.split('/').any(|c| c.len() > 255));
                    prop_assert!(
                        clash || too_long,
                        "{:?} refused: {:?}",
                        unique,
                        result.err()
                    );
                }
                Ok(())
            })
            .expect("property");
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn another_tenants_session_does_not_exist_for_you() {
        let d = std::env::temp_dir().join(format!("gearbox-sessions-owner-{}", SessionId::new()));
        std::fs::create_dir_all(&d).expect("mkdir");
        let store = SessionStore::open(StoreOptions {
            dir: d.clone(),
            ttl: Duration::from_secs(3600),
            quota_bytes: 1 << 20,
            max_files: 100,
            max_sessions: 4,
        })
        .expect("open");
        let id = |i: SessionInfo| SessionId::parse("id", &i.session_id).expect("id");
        let a = id(store.create("alice").expect("create"));
        store.check_owner(&a, "alice").expect("alice's own");
        assert!(matches!(
            store.check_owner(&a, "bob"),
            Err(StoreError::NotFound(_))
        ));
        assert_eq!(store.list_for("alice").len(), 1);
        assert!(store.list_for("bob").is_empty());
        let legacy = id(store.create("").expect("create"));
        store
            .check_owner(&legacy, "bob")
            .expect("a session without an owner is anyone's");
        std::fs::remove_dir_all(&d).expect("rm");
    }
}
