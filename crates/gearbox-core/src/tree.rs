//! A workspace as a set of regular files: reading a directory tree without ever following a
//! symlink, opening one file beneath a directory with `openat2`, and the framing that carries
//! a tree out of a sandbox.
//!
//! Every open here resolves relative to a directory fd, one component at a time with
//! `O_NOFOLLOW` (the walk) or with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` (a path), so a symlink planted in a workspace —
//! to `/etc/passwd` or anywhere else — is refused, never followed. Symlinks, fifos, sockets
//! and devices are skipped and counted; only regular files and directories are walked.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use serde::{Deserialize, Serialize};

use crate::names::{MAX_PATH_DEPTH, validate_relative_path};
use crate::request::JobFile;

/// The resolution flags of every [`open_beneath`]: stay under the directory, follow no
/// symlink (not even one inside it), no `/proc` magic links, no mount crossing.
pub const RESOLVE_SAFE: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

/// Most skipped names a summary lists (the count covers all of them).
pub const MAX_SKIPPED_LISTED: usize = 32;
/// Frame tag of one file.
const FRAME_FILE: u8 = b'F';
/// Frame tag of the closing summary.
const FRAME_END: u8 = b'E';
/// Bytes of framing per file besides its path and content.
pub const FRAME_OVERHEAD: u64 = 1 + 4 + 8;

/// Open `path` (relative, `/`-separated) beneath `dir` with `openat2` and [`RESOLVE_SAFE`].
/// `flags` are `open(2)` flags (`O_CLOEXEC` is always added); `mode` applies with `O_CREAT`.
pub fn open_beneath(dir: BorrowedFd<'_>, path: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: open_how is plain old data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        how.mode = u64::from(mode);
    }
    how.resolve = RESOLVE_SAFE;
    // openat2 returns EAGAIN when a rename raced the lookup; a few retries settle it.
    for _ in 0..16 {
        // SAFETY: `c` is a NUL-terminated string and `how` an open_how that both outlive the
        // call; the size passed is the size of the struct.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel just returned this fd to us.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// Bounds of one collection (a session's quota).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectLimits {
    /// Most regular files.
    pub max_files: usize,
    /// Most bytes of content, all files together.
    pub max_bytes: u64,
}

impl CollectLimits {
    /// Largest framed stream these limits allow (paths, content, summary).
    pub fn max_stream_bytes(&self) -> u64 {
        let per_file = FRAME_OVERHEAD + crate::names::MAX_PATH_BYTES as u64;
        self.max_bytes + per_file * self.max_files as u64 + 64 * 1024
    }
}

/// Bounds of a run's outputs (`/work/outputs/` of a run without a session): at most 16
/// files and 8 MiB. Unlike a session's workspace, a file past them is skipped with a note and
/// the others still come back ([`collect_outputs_into`]).
pub const OUTPUT_LIMITS: CollectLimits = CollectLimits {
    max_files: 16,
    max_bytes: 8 * 1024 * 1024,
};

/// The directory, relative to `/work`, whose files a run without a session brings back.
pub const OUTPUTS_DIR: &str = "outputs";

/// What a walk saw besides the files it handed over.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WalkSummary {
    pub files: usize,
    pub bytes: u64,
    /// Entries not collected (symlinks, fifos, sockets, devices, names that are not valid
    /// workspace paths, directories too deep), how many.
    pub skipped_count: usize,
    /// The first [`MAX_SKIPPED_LISTED`] of them, with why.
    pub skipped: Vec<String>,
    /// Set when a limit stopped the walk: the collection is incomplete and must not be used.
    pub error: Option<String>,
}

impl WalkSummary {
    fn skip(&mut self, path: &str, why: &str) {
        self.skipped_count += 1;
        if self.skipped.len() < MAX_SKIPPED_LISTED {
            let shown: String = path.chars().take(200).collect();
            self.skipped.push(format!("{shown:?}: {why}"));
        }
    }
}

/// A file found by [`walk`]: its workspace path, an open handle (regular, not a symlink) and
/// its size when opened.
pub type Visit<'a> = dyn FnMut(&str, &mut File, u64) -> io::Result<()> + 'a;

/// Walk the tree under `root` (a directory fd), calling `visit` for every regular file in
/// path order, within `limits`. Never follows a symlink: every directory and file is opened
/// by one name relative to its parent's fd with `O_NOFOLLOW`, and checked with `fstat` on the
/// opened fd. A limit crossed ends the walk with `error` set; an I/O error of `visit` is
/// returned.
pub fn walk(
    root: BorrowedFd<'_>,
    limits: &CollectLimits,
    visit: &mut Visit<'_>,
) -> io::Result<WalkSummary> {
    walk_with(root, limits, false, visit)
}

/// [`walk`]; with `skip_over`, a file past `limits` is skipped with a note instead of ending
/// the walk with `error` (a run's outputs: what fits comes back).
pub fn walk_with(
    root: BorrowedFd<'_>,
    limits: &CollectLimits,
    skip_over: bool,
    visit: &mut Visit<'_>,
) -> io::Result<WalkSummary> {
    let mut summary = WalkSummary::default();
    let dir = Dir::openat(
        root,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    let bounds = Bounds { limits, skip_over };
    walk_dir(dir, "", 1, &bounds, &mut summary, visit)?;
    Ok(summary)
}

/// A walk's limits, and what crossing one does.
struct Bounds<'a> {
    limits: &'a CollectLimits,
    skip_over: bool,
}

fn walk_dir(
    mut dir: Dir,
    prefix: &str,
    depth: usize,
    bounds: &Bounds<'_>,
    summary: &mut WalkSummary,
    visit: &mut Visit<'_>,
) -> io::Result<()> {
    let limits = bounds.limits;
    let mut names: Vec<Vec<u8>> = dir
        .iter()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_bytes().to_vec())
        .filter(|n| n != b"." && n != b"..")
        .collect();
    names.sort();
    for raw in names {
        if summary.error.is_some() {
            return Ok(());
        }
        let lossy = String::from_utf8_lossy(&raw).into_owned();
        let rel = if prefix.is_empty() {
            lossy.clone()
        } else {
            format!("{prefix}/{lossy}")
        };
        let Ok(name) = String::from_utf8(raw.clone()) else {
            summary.skip(&rel, "name is not UTF-8");
            continue;
        };
        if validate_relative_path("path", &rel).is_err() {
            summary.skip(&rel, "not a valid workspace path");
            continue;
        }
        let Ok(st) =
            nix::sys::stat::fstatat(dir.as_fd(), name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        else {
            summary.skip(&rel, "vanished");
            continue;
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFDIR {
            if depth >= MAX_PATH_DEPTH {
                summary.skip(&rel, "directory too deep");
                continue;
            }
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            match Dir::openat(dir.as_fd(), name.as_str(), flags, Mode::empty()) {
                Ok(sub) => walk_dir(sub, &rel, depth + 1, bounds, summary, visit)?,
                Err(_) => summary.skip(&rel, "directory could not be opened"),
            }
            continue;
        }
        if kind != SFlag::S_IFREG {
            let what = match kind {
                SFlag::S_IFLNK => "symlink (never followed)",
                SFlag::S_IFIFO => "fifo",
                SFlag::S_IFSOCK => "socket",
                _ => "device or special file",
            };
            summary.skip(&rel, what);
            continue;
        }
        // O_NOFOLLOW: a symlink swapped in since the fstatat fails with ELOOP; O_NONBLOCK: a
        // fifo swapped in does not block the open. The fstat below decides.
        let flags = OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let fd = match nix::fcntl::openat(dir.as_fd(), name.as_str(), flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(_) => {
                summary.skip(&rel, "could not be opened");
                continue;
            }
        };
        let mut file = File::from(fd);
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            summary.skip(&rel, "not a regular file");
            continue;
        }
        let size = meta.len();
        if bounds.skip_over && summary.files + 1 > limits.max_files {
            summary.skip(
                &rel,
                &format!("past the limit of {} files", limits.max_files),
            );
            continue;
        }
        if bounds.skip_over && summary.bytes + size > limits.max_bytes {
            summary.skip(
                &rel,
                &format!(
                    "{size} bytes, past the limit of {} bytes in all",
                    limits.max_bytes
                ),
            );
            continue;
        }
        if summary.files + 1 > limits.max_files {
            summary.error = Some(format!(
                "the workspace holds more than {} files (the session's limit)",
                limits.max_files
            ));
            return Ok(());
        }
        if summary.bytes + size > limits.max_bytes {
            summary.error = Some(format!(
                "the workspace holds more than {} bytes (the session's quota)",
                limits.max_bytes
            ));
            return Ok(());
        }
        summary.files += 1;
        summary.bytes += size;
        visit(&rel, &mut file, size)?;
    }
    Ok(())
}

/// Write one file frame: tag, path length (`u32` LE), path, size (`u64` LE), then exactly
/// `size` bytes read from `content` (zero-padded if it ends early).
pub fn write_file_frame(
    out: &mut dyn Write,
    path: &str,
    size: u64,
    content: &mut dyn Read,
) -> io::Result<()> {
    out.write_all(&[FRAME_FILE])?;
    out.write_all(&(path.len() as u32).to_le_bytes())?;
    out.write_all(path.as_bytes())?;
    out.write_all(&size.to_le_bytes())?;
    let copied = io::copy(&mut content.take(size), out)?;
    if copied < size {
        io::copy(&mut io::repeat(0).take(size - copied), out)?;
    }
    Ok(())
}

/// Write the closing frame: tag, length (`u32` LE), the summary as JSON.
pub fn write_end_frame(out: &mut dyn Write, summary: &WalkSummary) -> io::Result<()> {
    let json = serde_json::to_vec(summary).map_err(io::Error::other)?;
    out.write_all(&[FRAME_END])?;
    out.write_all(&(json.len() as u32).to_le_bytes())?;
    out.write_all(&json)
}

/// Walk `root` and write every file, then the summary, as frames to `out`.
pub fn collect_into(
    root: BorrowedFd<'_>,
    limits: &CollectLimits,
    out: &mut dyn Write,
) -> io::Result<WalkSummary> {
    let summary = walk(root, limits, &mut |path, file, size| {
        write_file_frame(out, path, size, file)
    })?;
    write_end_frame(out, &summary)?;
    Ok(summary)
}

/// [`collect_into`] for a run's outputs: `root` is `/work/outputs`, a file past
/// [`OUTPUT_LIMITS`] is skipped with a note.
pub fn collect_outputs_into(root: BorrowedFd<'_>, out: &mut dyn Write) -> io::Result<WalkSummary> {
    let summary = walk_with(root, &OUTPUT_LIMITS, true, &mut |path, file, size| {
        write_file_frame(out, path, size, file)
    })?;
    write_end_frame(out, &summary)?;
    Ok(summary)
}

/// Whether the directory `path` exists and holds at least one entry (a symlink in its place
/// counts as absent). Costs one `open` when it does not exist.
pub fn dir_has_entries(path: &std::path::Path) -> bool {
    let Ok(fd) = open_dir(path) else {
        return false;
    };
    let Ok(mut dir) = Dir::from_fd(fd) else {
        return false;
    };
    dir.iter()
        .filter_map(Result::ok)
        .any(|e| !matches!(e.file_name().to_bytes(), b"." | b".."))
}

/// The files a run left in its workspace, decoded and checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Collected {
    pub files: Vec<JobFile>,
    pub summary: WalkSummary,
}

/// Decode frames written by [`collect_into`], checking every path with
/// [`validate_relative_path`], duplicates and `limits` again: the stream comes from a
/// sandbox and is not trusted.
pub fn decode_frames(mut bytes: &[u8], limits: &CollectLimits) -> Result<Collected, String> {
    fn take<'a>(b: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err(format!("workspace stream ends inside {what}"));
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    let mut out = Collected::default();
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    loop {
        let tag = take(&mut bytes, 1, "a frame tag")?[0];
        let len = u32::from_le_bytes(
            take(&mut bytes, 4, "a length")?
                .try_into()
                .map_err(|_| "length")?,
        ) as usize;
        match tag {
            FRAME_END => {
                let json = take(&mut bytes, len, "the summary")?;
                out.summary =
                    serde_json::from_slice(json).map_err(|e| format!("workspace summary: {e}"))?;
                if !bytes.is_empty() {
                    return Err("workspace stream has bytes after its summary".into());
                }
                if out.summary.error.is_none() && out.summary.files != out.files.len() {
                    return Err("workspace summary does not match its files".into());
                }
                return Ok(out);
            }
            FRAME_FILE => {
                let path = take(&mut bytes, len, "a path")?;
                let path = std::str::from_utf8(path)
                    .map_err(|_| "workspace path is not UTF-8".to_string())?;
                validate_relative_path("workspace path", path).map_err(|e| e.to_string())?;
                if !seen.insert(path.to_string()) {
                    return Err(format!("workspace path {path:?} appears twice"));
                }
                let size = u64::from_le_bytes(
                    take(&mut bytes, 8, "a size")?
                        .try_into()
                        .map_err(|_| "size")?,
                );
                total = total.saturating_add(size);
                if out.files.len() + 1 > limits.max_files || total > limits.max_bytes {
                    return Err(format!(
                        "workspace stream exceeds the limits ({} files, {} bytes)",
                        limits.max_files, limits.max_bytes
                    ));
                }
                let content = take(
                    &mut bytes,
                    usize::try_from(size).map_err(|e| e.to_string())?,
                    "a file",
                )?;
                out.files.push(JobFile {
                    path: path.to_string(),
                    content: content.to_vec(),
                });
            }
            other => return Err(format!("workspace stream has an unknown frame tag {other}")),
        }
    }
}

/// Read a whole regular file `path` beneath `dir` (see [`open_beneath`]), at most `max` bytes.
pub fn read_beneath(dir: BorrowedFd<'_>, path: &str, max: u64) -> io::Result<Vec<u8>> {
    let fd = open_beneath(
        dir,
        path,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
        0,
    )?;
    let mut f = File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut buf = Vec::new();
    (&mut f).take(max).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Open a directory for [`walk`] and [`open_beneath`] (itself not through a symlink).
pub fn open_dir(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tmp() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gearbox-tree-{}", uuid_like()));
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn uuid_like() -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        format!(
            "{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )
    }

    const LIMITS: CollectLimits = CollectLimits {
        max_files: 100,
        max_bytes: 1 << 20,
    };

    #[test]
    fn walk_collects_files_and_never_follows_symlinks() {
        let d = tmp();
        let secret = d.join("secret");
        std::fs::write(&secret, "host secret").expect("plant");
        let ws = d.join("ws");
        std::fs::create_dir_all(ws.join("sub")).expect("mkdir");
        std::fs::write(ws.join("a.txt"), "A").expect("w");
        std::fs::write(ws.join("sub/b.bin"), [0u8, 1, 2]).expect("w");
        symlink(&secret, ws.join("link")).expect("symlink");
        symlink("/etc/passwd", ws.join("sub/passwd")).expect("symlink");
        symlink(&d, ws.join("updir")).expect("symlink");
        nix::unistd::mkfifo(&ws.join("fifo"), Mode::from_bits_truncate(0o600)).expect("fifo");
        let root = open_dir(&ws).expect("open");
        let mut out = Vec::new();
        let summary = collect_into(root.as_fd(), &LIMITS, &mut out).expect("collect");
        let c = decode_frames(&out, &LIMITS).expect("decode");
        let paths: Vec<&str> = c.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a.txt", "sub/b.bin"]);
        assert_eq!(c.files[1].content, [0, 1, 2]);
        assert_eq!(summary.skipped_count, 4, "{:?}", summary.skipped);
        assert!(!out.windows(11).any(|w| w == b"host secret"));

        for p in [
            "link",
            "sub/passwd",
            "updir/secret",
            "../secret",
            "/etc/passwd",
        ] {
            assert!(
                read_beneath(root.as_fd(), p, 1 << 20).is_err(),
                "{p} was read"
            );
        }
        assert_eq!(
            read_beneath(root.as_fd(), "sub/b.bin", 10).expect("read"),
            [0, 1, 2]
        );
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn limits_stop_the_walk_with_an_error() {
        let d = tmp();
        for i in 0..5 {
            std::fs::write(d.join(format!("f{i}")), "xx").expect("w");
        }
        let root = open_dir(&d).expect("open");
        let small = CollectLimits {
            max_files: 3,
            max_bytes: 100,
        };
        let mut out = Vec::new();
        let s = collect_into(root.as_fd(), &small, &mut out).expect("collect");
        assert!(
            s.error.as_deref().is_some_and(|e| e.contains("3 files")),
            "{s:?}"
        );
        let bytes = CollectLimits {
            max_files: 10,
            max_bytes: 5,
        };
        let s = walk(root.as_fd(), &bytes, &mut |_, _, _| Ok(())).expect("walk");
        assert!(
            s.error.as_deref().is_some_and(|e| e.contains("5 bytes")),
            "{s:?}"
        );
        std::fs::remove_dir_all(&d).expect("rm");
    }

    #[test]
    fn hostile_streams_are_refused() {
        let mut out = Vec::new();
        write_file_frame(&mut out, "../../etc/passwd", 1, &mut &b"x"[..]).expect("w");
        write_end_frame(&mut out, &WalkSummary::default()).expect("w");
        assert!(
            decode_frames(&out, &LIMITS)
                .expect_err("traversal")
                .contains("'..'")
        );
        let mut out = Vec::new();
        write_file_frame(&mut out, "a", 1, &mut &b"x"[..]).expect("w");
        write_file_frame(&mut out, "a", 1, &mut &b"y"[..]).expect("w");
        write_end_frame(&mut out, &WalkSummary::default()).expect("w");
        assert!(
            decode_frames(&out, &LIMITS)
                .expect_err("dup")
                .contains("twice")
        );
        let mut out = Vec::new();
        write_file_frame(&mut out, "a", 5000, &mut &b"x"[..]).expect("w");
        let small = CollectLimits {
            max_files: 10,
            max_bytes: 100,
        };
        assert!(
            decode_frames(&out, &small)
                .expect_err("big")
                .contains("limits")
        );
        assert!(decode_frames(&out[..3], &LIMITS).is_err());
    }
}

/// Property tests of the workspace stream, which comes from a sandbox and is hostile:
/// arbitrary, truncated and mutated streams never panic the decoder, and whatever it accepts
/// keeps its promises (valid, unique paths within the limits). `PROPTEST_CASES` raises the
/// case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;

    use super::*;
    use crate::names::proptests::{assert_stays_inside, hostile_name};

    const LIMITS: CollectLimits = CollectLimits {
        max_files: 16,
        max_bytes: 4096,
    };

    /// What the decoder promises about anything it returns.
    fn assert_kept_promises(c: &Collected, limits: &CollectLimits) {
        assert!(c.files.len() <= limits.max_files);
        let total: u64 = c.files.iter().map(|f| f.content.len() as u64).sum();
        assert!(total <= limits.max_bytes);
        let mut seen = HashSet::new();
        for f in &c.files {
            assert_stays_inside(&f.path);
            assert!(seen.insert(f.path.as_str()), "{:?} twice", f.path);
        }
    }

    fn valid_files() -> impl Strategy<Value = BTreeMap<String, Vec<u8>>> {
        proptest::collection::btree_map(
            "[a-z0-9_.-]{0,6}[a-z0-9](/[a-zé0-9_-]{1,6}){0,3}",
            proptest::collection::vec(any::<u8>(), 0..200),
            0..=LIMITS.max_files,
        )
    }

    fn summary() -> impl Strategy<Value = WalkSummary> {
        (
            0usize..100,
            proptest::collection::vec(any::<String>(), 0..3),
        )
            .prop_map(|(skipped_count, skipped)| WalkSummary {
                skipped_count,
                skipped,
                ..WalkSummary::default()
            })
    }

    fn encode(files: &BTreeMap<String, Vec<u8>>, summary: &WalkSummary) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, content) in files {
            write_file_frame(
                &mut out,
                path,
                content.len() as u64,
                &mut content.as_slice(),
            )
            .expect("write to a Vec");
        }
        let summary = WalkSummary {
            files: files.len(),
            bytes: files.values().map(|c| c.len() as u64).sum(),
            ..summary.clone()
        };
        write_end_frame(&mut out, &summary).expect("write to a Vec");
        out
    }

    /// A frame whose path is hostile: the decoder must check it.
    fn hostile_frame(path: &str, content: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_file_frame(&mut out, path, content.len() as u64, &mut &content[..])
            .expect("write to a Vec");
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases(256)))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(c) = decode_frames(&bytes, &LIMITS) {
                assert_kept_promises(&c, &LIMITS);
            }
        }

        #[test]
        fn valid_streams_round_trip(files in valid_files(), summary in summary()) {
            prop_assume!(files.values().map(Vec::len).sum::<usize>() as u64 <= LIMITS.max_bytes);
            let bytes = encode(&files, &summary);
            let c = decode_frames(&bytes, &LIMITS).expect("a valid stream decodes");
            let got: BTreeMap<String, Vec<u8>> =
                c.files.iter().map(|f| (f.path.clone(), f.content.clone())).collect();
            prop_assert_eq!(got, files.clone());
            prop_assert_eq!(c.summary.skipped_count, summary.skipped_count);
            prop_assert_eq!(&c.summary.skipped, &summary.skipped);
        }

        #[test]
        fn truncated_streams_are_refused(
            files in valid_files(),
            summary in summary(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 1..8),
        ) {
            let bytes = encode(&files, &summary);
            for cut in cuts {
                let cut = cut.index(bytes.len());
                prop_assert!(decode_frames(&bytes[..cut], &LIMITS).is_err(), "cut at {}", cut);
            }
        }

        #[test]
        fn mutated_streams_never_panic(
            files in valid_files(),
            summary in summary(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
        ) {
            let mut bytes = encode(&files, &summary);
            for (at, byte, how) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = at.index(bytes.len());
                match how {
                    0 => bytes[i] = byte,
                    1 => bytes.insert(i, byte),
                    _ => {
                        bytes.remove(i);
                    }
                }
            }
            if let Ok(c) = decode_frames(&bytes, &LIMITS) {
                assert_kept_promises(&c, &LIMITS);
            }
        }

        #[test]
        fn hostile_paths_in_frames_never_pass_unchecked(
            path in hostile_name(),
            content in proptest::collection::vec(any::<u8>(), 0..16),
            summary in summary(),
        ) {
            let mut bytes = hostile_frame(&path, &content);
            let summary = WalkSummary { files: 1, bytes: content.len() as u64, ..summary };
            write_end_frame(&mut bytes, &summary).expect("write to a Vec");
            match decode_frames(&bytes, &LIMITS) {
                Ok(c) => {
                    assert_kept_promises(&c, &LIMITS);
                    prop_assert_eq!(&c.files[0].path, &path);
                }
                Err(_) => prop_assert!(validate_relative_path("p", &path).is_err()),
            }
        }

        #[test]
        fn limits_hold_for_any_sizes(
            sizes in proptest::collection::vec(any::<u64>(), 1..4),
            max_files in 0usize..4,
            max_bytes in any::<u64>(),
        ) {
            // Frames that announce sizes far beyond what follows, or beyond the limits.
            let mut bytes = Vec::new();
            for (i, size) in sizes.iter().enumerate() {
                bytes.push(FRAME_FILE);
                let path = format!("f{i}");
                bytes.extend_from_slice(&(path.len() as u32).to_le_bytes());
                bytes.extend_from_slice(path.as_bytes());
                bytes.extend_from_slice(&size.to_le_bytes());
                bytes.extend_from_slice(&[0u8; 8]);
            }
            let limits = CollectLimits { max_files, max_bytes };
            if let Ok(c) = decode_frames(&bytes, &limits) {
                assert_kept_promises(&c, &limits);
            }
        }
    }
}
