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

/// Property tests: file operations beneath a directory, given any path at all (the store
/// validates first; these tests do not), never create or change anything outside that
/// directory, even through symlinks planted in it. `PROPTEST_CASES` raises the case count
/// (`scripts/fuzz.sh`).
#[cfg(test)]
pub(crate) mod proptests {
    use std::collections::BTreeMap;
    use std::os::fd::AsFd;
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU64, Ordering};

    use proptest::prelude::*;

    use super::*;

    /// Paths made of separators, dot components, names the fixture uses (`link`, `abs`,
    /// `sub`), NUL, backslashes and odd characters.
    pub(crate) fn hostile_path() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("..".to_string()),
            Just(".".to_string()),
            Just("/".to_string()),
            Just("link".to_string()),
            Just("abs".to_string()),
            Just("sub".to_string()),
            Just("outside.txt".to_string()),
            Just("meta.json".to_string()),
            Just("\0".to_string()),
            Just("\\".to_string()),
            Just("%2e%2e".to_string()),
            "[a-z]{1,4}",
            any::<char>().prop_map(String::from),
        ];
        prop_oneof![
            8 => proptest::collection::vec(piece, 1..10).prop_map(|v| v.concat()),
            1 => any::<String>(),
        ]
    }

    /// `base/` holds `outside.txt` and `outer/`; `base/inside/` is the directory the
    /// operations are given, with `sub/`, `link -> ..` and `abs -> base/outer`.
    pub(crate) struct Fixture {
        pub(crate) base: PathBuf,
    }

    impl Fixture {
        pub(crate) fn new() -> Fixture {
            static N: AtomicU64 = AtomicU64::new(0);
            let base = std::env::temp_dir().join(format!(
                "gearbox-fsops-prop-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(base.join("inside/sub")).expect("mkdir");
            std::fs::create_dir_all(base.join("outer")).expect("mkdir");
            std::fs::write(base.join("outside.txt"), "OUTSIDE").expect("write");
            std::os::unix::fs::symlink("..", base.join("inside/link")).expect("symlink");
            std::os::unix::fs::symlink(base.join("outer"), base.join("inside/abs"))
                .expect("symlink");
            Fixture { base }
        }

        pub(crate) fn inside(&self) -> OwnedFd {
            gearbox_core::tree::open_dir(&self.base.join("inside")).expect("open")
        }

        /// Everything under `base` except `inside/`: kind and content of each entry,
        /// symlinks not followed.
        pub(crate) fn outside(&self) -> BTreeMap<PathBuf, String> {
            fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<PathBuf, String>) {
                for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
                    let p = e.path();
                    let rel = p.strip_prefix(base).expect("below base").to_path_buf();
                    if rel == Path::new("inside") {
                        continue;
                    }
                    let m = std::fs::symlink_metadata(&p).expect("lstat");
                    let what = if m.is_symlink() {
                        format!("link {:?}", std::fs::read_link(&p).expect("readlink"))
                    } else if m.is_dir() {
                        walk(&p, base, out);
                        "dir".to_string()
                    } else {
                        format!("file {:?}", std::fs::read(&p).expect("read"))
                    };
                    out.insert(rel, what);
                }
            }
            let mut out = BTreeMap::new();
            walk(&self.base, &self.base, &mut out);
            out
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(256)))]

        #[test]
        fn writes_stay_beneath_the_directory(path in hostile_path()) {
            let fx = Fixture::new();
            let before = fx.outside();
            let dir = fx.inside();
            let written = write_new_file(dir.as_fd(), &path, b"WRITTEN");
            prop_assert_eq!(fx.outside(), before, "{:?} changed the outside", path);
            if written.is_ok() {
                // The file is where the path says, below `inside`, reached without a symlink.
                let mut at = fx.base.join("inside");
                for comp in Path::new(&path).components() {
                    at.push(comp);
                    let m = std::fs::symlink_metadata(&at).expect("exists");
                    prop_assert!(!m.is_symlink(), "{:?} went through {:?}", path, at);
                }
                prop_assert_eq!(std::fs::read(&at).expect("read"), b"WRITTEN".to_vec());
            }
        }

        #[test]
        fn mkdir_and_exchange_stay_beneath_the_directory(
            a in hostile_path(),
            b in hostile_path(),
        ) {
            let fx = Fixture::new();
            let before = fx.outside();
            let dir = fx.inside();
            // mkdir_at takes one component: the store never gives it a `/`.
            if !a.contains('/') {
                let _ = mkdir_at(dir.as_fd(), &a, 0o700);
            }
            let _ = open_dir_beneath(dir.as_fd(), &b);
            if !a.contains('/') && !b.contains('/') {
                let _ = exchange(dir.as_fd(), &a, &b);
            }
            prop_assert_eq!(fx.outside(), before, "{:?} / {:?} changed the outside", a, b);
        }
    }
}
