//! File operations beneath a directory fd: create directories and files with `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), exchange two directories atomically.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use gearbox_core::tree::open_beneath;

/// Open a directory beneath `dir`.
pub fn open_dir_beneath(dir: BorrowedFd<'_>, path: &str) -> io::Result<OwnedFd> {
    open_beneath(
        dir,
        path,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        0,
    )
}

/// `mkdirat(dir, name)` for one component; an existing directory is fine.
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<()> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let r = unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
    }
    Ok(())
}

/// Write a new file at `path` (validated, relative) beneath `dir`, creating its parent
/// directories. Fails if anything on the way is a symlink or the file exists.
pub fn write_new_file(dir: BorrowedFd<'_>, path: &str, content: &[u8]) -> io::Result<()> {
    let (parent, name) = match path.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, path),
    };
    let parent_fd;
    let at = match parent {
        Some(p) => {
            let mut prefix = String::new();
            for comp in p.split('/') {
                let base = if prefix.is_empty() {
                    None
                } else {
                    Some(open_dir_beneath(dir, &prefix)?)
                };
                match &base {
                    Some(b) => mkdir_at(std::os::fd::AsFd::as_fd(b), comp, 0o700)?,
                    None => mkdir_at(dir, comp, 0o700)?,
                }
                if !prefix.is_empty() {
                    prefix.push('/');
                }
                prefix.push_str(comp);
            }
            parent_fd = open_dir_beneath(dir, p)?;
            std::os::fd::AsFd::as_fd(&parent_fd)
        }
        None => dir,
    };
    let fd = open_beneath(
        at,
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW,
        0o600,
    )?;
    let mut f = std::fs::File::from(fd);
    f.write_all(content)
}

/// Exchange the directory entries `a` and `b` of `dir` in one step.
pub fn exchange(dir: BorrowedFd<'_>, a: &str, b: &str) -> io::Result<()> {
    let ca = CString::new(a).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let cb = CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dir.as_raw_fd(),
            ca.as_ptr(),
            dir.as_raw_fd(),
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
