//! gearbox-sessions: workspaces that persist across runs.
//!
//! A session is a directory on the host, `DIR/<uuid>/`, holding `meta.json` (times, TTL,
//! the manifest of its files) and `files/` (the workspace). Each run is still a fresh
//! sandbox: the session's files are copied in as the job's files, and the files the program
//! leaves in `/work` are copied out (`gearbox_core::tree`) and replace `files/` atomically
//! (`renameat2(RENAME_EXCHANGE)`). Every read and write under `DIR` resolves with `openat2`
//! and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, and a session id is a UUID v4 checked by
//! [`SessionId::parse`] before it is ever used as a path component.
//!
//! This crate owns the store (open, close, expiry, start-up cleanup, quota, reads). It must
//! not run code nor speak MCP.

mod fsops;
mod id;
mod store;

pub use id::{SessionId, set_replica};
pub use store::{
    Artifact, ChangeKind, FileChange, FileEntry, RunGuard, SessionInfo, SessionStore, StoreError,
    StoreOptions,
};
