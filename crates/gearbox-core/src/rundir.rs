//! Per-run directories on the host that a sandbox reaches through a bind mount (the broker's
//! tool-call channel, the egress proxy's socket): who may walk down to them and connect.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// gearbox's runtime directory for `name` (`broker`, `egress`, `approvals`): under
/// `$RUNTIME_DIRECTORY` (systemd), else `/run/gearbox` as root, else
/// `$XDG_RUNTIME_DIR/gearbox`, else `/tmp/gearbox-UID`.
pub fn runtime_dir(name: &str) -> std::path::PathBuf {
    use std::path::PathBuf;
    if let Some(d) = std::env::var_os("RUNTIME_DIRECTORY") {
        return PathBuf::from(d).join(name);
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from("/run/gearbox").join(name);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("gearbox").join(name);
    }
    PathBuf::from(format!("/tmp/gearbox-{uid}")).join(name)
}

/// Who may reach a run's socket: the server's uid, and the sandbox's host uid (as root,
/// where the sandbox runs as [`crate::SANDBOX_HOST_ID`]). Unprivileged, the sandbox user
/// is the server's own uid.
#[derive(Debug, Clone, Copy)]
pub struct RunAccess {
    server_uid: u32,
    /// The sandbox's host uid and gid when it differs from the server's (root).
    sandbox: Option<u32>,
}

impl RunAccess {
    pub fn of_server() -> RunAccess {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let server_uid = unsafe { libc::geteuid() };
        RunAccess {
            server_uid,
            sandbox: (server_uid == 0).then_some(crate::SANDBOX_HOST_ID),
        }
    }

    /// Give `path` `owner_mode` for the server and, as root, the same minus write-on-dirs
    /// for the sandbox's group (a directory `0700` becomes `0710`, a socket `0600` `0660`).
    pub fn restrict(&self, path: &Path, owner_mode: u32) -> std::io::Result<()> {
        let mode = match self.sandbox {
            Some(gid) => {
                std::os::unix::fs::chown(path, None, Some(gid))?;
                let group = if path.is_dir() { 0o010 } else { 0o060 };
                owner_mode | group
            }
            None => owner_mode,
        };
        // Modes from DirBuilder/bind are masked by the umask; set them exactly.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }

    /// Whether a peer with this uid (`SO_PEERCRED`) may use the socket.
    pub fn admits(&self, uid: u32) -> bool {
        uid == self.server_uid || Some(uid) == self.sandbox
    }
}

/// The sandbox user must be able to walk down to `root` to reach what a run's mount
/// exposes. `root`'s parent, when this server owns it (the shared state directory,
/// `/run/gearbox` as root), is made traversable (0711) if something created it private;
/// any other ancestor that is not traversable is a clear error (`what` names the feature),
/// not a program that fails obscurely. Only as root: unprivileged, the sandbox user is this
/// server's own uid.
pub fn reachable_by_sandbox(root: &Path, what: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let inspect = |dir: &Path| {
        std::fs::metadata(dir).map_err(|e| format!("inspecting {}: {e}", dir.display()))
    };
    if let Some(parent) = root.parent() {
        let meta = inspect(parent)?;
        if meta.uid() == 0 && meta.mode() & 0o011 != 0o011 {
            let mode = (meta.mode() & 0o7777) | 0o711;
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("chmod {}: {e}", parent.display()))?;
        }
    }
    for dir in root.ancestors() {
        let meta = inspect(dir)?;
        if meta.mode() & 0o001 == 0 {
            return Err(format!(
                "{} (mode {:o}) cannot be traversed by the sandbox user, so runs could not \
                 reach {what} under {}; allow it (chmod o+x) or set the runtime directory \
                 elsewhere",
                dir.display(),
                meta.mode() & 0o7777,
                root.display()
            ));
        }
    }
    Ok(())
}
