//! The sandbox's filesystem: a fresh tmpfs root holding read-only binds of what interpreters
//! need, a small generated /etc, a fresh /proc, a minimal /dev, and one size-limited tmpfs
//! that backs /work, /tmp and /dev/shm. Nothing else of the host is reachable after
//! pivot_root.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statvfs::{FsFlags, statvfs};

use crate::restriction::{DEVICES, PROC_READONLY, SCRATCH, USER_LIMITS, scratch_inodes};
use crate::step::{AtStep, Step, StepError};
use crate::wire::{JailSpec, Pooled};

/// Where the new root is assembled, inside our private mount namespace only.
const NEWROOT: &str = "/tmp";
/// Host system directories mirrored into the sandbox (bound read-only, or re-created as the
/// same symlink on merged-/usr systems).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
/// Host /etc entries the dynamic loader and interpreters read; everything else in /etc stays
/// out. Directories are bound read-only, files copied, symlinks re-created.
const ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "os-release",
    "mime.types",
    // fontconfig's configuration (matplotlib and PIL find fonts through it; the fonts
    // themselves are under /usr).
    "fonts",
];
/// Extra /etc entries a run with network access needs (DNS, TLS roots).
/// Added for a granted run: the trust store, for TLS through the egress proxy. No resolver
/// configuration: names are resolved by the proxy, never inside the sandbox.
const ETC_NETWORK_ENTRIES: &[&str] = &["ssl", "ca-certificates"];

/// The root's mounts, before anything of the request is written into them: the host's
/// directories, /etc, /proc, /dev and the scratch tmpfs. [`finish_root`] completes it.
pub struct Mounts {
    /// The server's mounts, opened before the new root covered their paths.
    sources: Vec<(PathBuf, fs::File)>,
}

/// Mount the new root's file systems (the first half of building it; see [`finish_root`]).
pub fn build_mounts(spec: &JailSpec) -> Result<Mounts, StepError> {
    let none: Option<&str> = None;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .step(Step::MakeMountsPrivate)?;
    // The server's mounts (package layers, the broker's run directory) are opened before the
    // new root covers NEWROOT (/tmp): one under /tmp, as the broker's is by default when the
    // server is unprivileged, would be hidden otherwise. They are bound through these
    // descriptors below. A path that does not exist is skipped, as before.
    let sources: Vec<(PathBuf, fs::File)> = spec
        .mounts
        .iter()
        .filter_map(|m| {
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(m)
                .ok()
                .map(|f| (m.clone(), f))
        })
        .collect();
    mount(
        Some("tmpfs"),
        NEWROOT,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=8m,nr_inodes=4096,mode=0755"),
    )
    .step(Step::MountRootTmpfs)?;
    let root = Path::new(NEWROOT);

    for dir in SYSTEM_DIRS {
        mirror(Path::new(dir), &inside(root, Path::new(dir)))?;
    }
    build_etc(root, spec.egress.is_some())?;
    build_proc(root, spec.pooled.as_ref().is_some_and(|p| p.fork_server))?;
    build_dev(root)?;
    build_scratch(root, spec.limits.disk_mb)?;
    Ok(Mounts { sources })
}

/// Write the request's files and the launchers, bind the server's mounts, and switch to the
/// new root, read-only.
pub fn finish_root(spec: &JailSpec, mounts: Mounts, files: &[Vec<u8>]) -> Result<(), StepError> {
    let none: Option<&str> = None;
    let root = Path::new(NEWROOT);
    let sources = mounts.sources;
    write_files(&root.join("work"), &spec.files, files)?;
    let node = inside(root, Path::new(crate::wire::NODE_HELPERS));
    fs::create_dir_all(&node).step(Step::WritePythonHelpers)?;
    fs::write(
        node.join("gearbox_display.js"),
        include_str!("../launchers/gearbox_display.js"),
    )
    .step(Step::WritePythonHelpers)?;
    let helpers = inside(root, Path::new(crate::wire::PYTHON_HELPERS));
    fs::create_dir_all(&helpers).step(Step::WritePythonHelpers)?;
    for (name, text) in [
        (
            "gearbox_display.py",
            include_str!("../launchers/gearbox_display.py"),
        ),
        (
            "gearbox_mpl_backend.py",
            include_str!("../launchers/gearbox_mpl_backend.py"),
        ),
    ] {
        fs::write(helpers.join(name), text).step(Step::WritePythonHelpers)?;
    }
    // The server's mounts come after the scratch tmpfs, so one under /tmp is bound on top
    // of the run's /tmp instead of hidden by it.
    for (m, file) in &sources {
        use std::os::fd::AsRawFd;
        let via = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        bind_ro_named(&via, &inside(root, m), m)?;
    }
    drop(sources);
    let launcher = match &spec.pooled {
        Some(Pooled {
            launcher: Some((name, _)),
            fork_server,
        }) => {
            if *fork_server {
                write_fork_server_files(root, spec, name)?;
            }
            // The exec fork server runs the binary's own code: no script.
            Some(name).filter(|n| n.as_str() != crate::fork_server::EXEC_FORK_SERVER)
        }
        _ => spec.live.as_ref(),
    };
    if let Some(name) = launcher {
        let script = super::launcher_script(name).ok_or_else(|| {
            StepError::new(
                Step::WriteLauncher,
                format!("no built-in launcher {name:?}"),
            )
        })?;
        let path = inside(root, Path::new(gearbox_core::LAUNCHER_PATH));
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).step(Step::CreateLauncherDirectory)?;
        }
        fs::write(&path, script).step(Step::WriteLauncher)?;
    }

    nix::unistd::chdir(root).step(Step::EnterNewRoot)?;
    nix::unistd::pivot_root(".", ".").step(Step::PivotRoot)?;
    umount2(".", MntFlags::MNT_DETACH).step(Step::DetachOldRoot)?;
    nix::unistd::chdir("/").step(Step::EnterRoot)?;
    mount(
        none,
        "/",
        none,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        none,
    )
    .step(Step::MakeRootReadOnly)?;
    Ok(())
}

/// The fork server's native loop (`launchers/fork/`, built by `build.rs`).
const FORK_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fork.so"));

/// The module Node's fork server and its programs load in their rehearsal of a run
/// (`node_zygote.js`), from the read-only root: the loader caches by path what it finds on
/// its way up from a module, and no run can change a path above this one.
const NODE_REHEARSED_MODULE: &str = "module.exports = [1].map((x) => x + 1);\n";

/// What a fork server needs beside its script (`launchers/python_zygote.py`, `node_zygote.js`): its
/// native loop, empty mount points for each run's scratch and /proc, the seccomp policy in
/// two parts (`seccomp-server-N.bpf`, which the fork server installs in itself, and
/// `seccomp-N.bpf`, which each program adds: together the cold path's filters, see
/// `seccomp::compile_split`), the limits its programs apply to themselves, the environment
/// each run of its key is handed (its programs rehearse a run with it), and for Node's the
/// module its rehearsal loads (`rehearsed.js`, [`NODE_REHEARSED_MODULE`]).
fn write_fork_server_files(root: &Path, spec: &JailSpec, launcher: &str) -> Result<(), StepError> {
    let dir = root.join(".gearbox");
    if launcher == crate::fork_server::NODE_FORK_SERVER {
        fs::write(dir.join("rehearsed.js"), NODE_REHEARSED_MODULE).step(Step::WriteLauncher)?;
    }
    for sub in ["stage", "proc"] {
        fs::create_dir_all(dir.join(sub)).step(Step::CreateForkServerMountPoints)?;
    }
    fs::write(dir.join("fork.so"), FORK_SO).step(Step::WriteForkServerLoop)?;
    let (server, program) = super::seccomp::compile_split().step(Step::LoadSeccompFilters)?;
    for (prefix, filters) in [("seccomp-server-", server), ("seccomp-", program)] {
        for (i, filter) in filters.iter().enumerate() {
            let mut bytes = Vec::with_capacity(filter.len() * 8);
            for insn in filter {
                bytes.extend_from_slice(&insn.code.to_ne_bytes());
                bytes.push(insn.jt);
                bytes.push(insn.jf);
                bytes.extend_from_slice(&insn.k.to_ne_bytes());
            }
            fs::write(dir.join(format!("{prefix}{i}.bpf")), bytes)
                .step(Step::WriteSeccompFilters)?;
        }
    }
    let l = &spec.limits;
    // The key's runs share its environment (`pool.rs`, `key`): what `fork_server.rs` hands
    // each of them.
    let run_env: serde_json::Map<String, serde_json::Value> =
        crate::wire::with_display_env(crate::wire::program_env(&spec.env, "/work", "/tmp"))
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
    let config = serde_json::json!({
        "disk_mb": l.disk_mb,
        "open_files": l.open_files,
        "file_size_mb": l.file_size_mb,
        "cpu_s": l.cpu_rlimit_secs(),
        "run_env": run_env,
    });
    fs::write(dir.join("zygote.json"), config.to_string()).step(Step::WriteForkServerLimits)
}

fn inside(root: &Path, host: &Path) -> PathBuf {
    root.join(host.strip_prefix("/").unwrap_or(host))
}

/// Bind `src` at `dst` (symlinks re-created as symlinks).
fn mirror(src: &Path, dst: &Path) -> Result<(), StepError> {
    let Ok(meta) = fs::symlink_metadata(src) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() {
        let target = fs::read_link(src).step(Step::ReadLink(src.to_path_buf()))?;
        return symlink(&target, dst).step(Step::Link(dst.to_path_buf()));
    }
    bind_ro(src, dst)
}

/// Bind `src` read-only at `dst`, creating the mount point, keeping the flags the kernel
/// locks in a user namespace (nosuid, nodev, noexec, atime).
fn bind_ro(src: &Path, dst: &Path) -> Result<(), StepError> {
    bind_ro_named(src, dst, src)
}

/// [`bind_ro`] of `src`, named `name` in errors (`src` may be a `/proc/self/fd` link).
fn bind_ro_named(src: &Path, dst: &Path, name: &Path) -> Result<(), StepError> {
    let what = || Step::Bind(name.to_path_buf());
    let meta = fs::metadata(src).step(what())?;
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).step(what())?;
    }
    if meta.is_dir() {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(dst)
            .or_else(ignore_exists)
            .step(what())?;
    } else if fs::symlink_metadata(dst).is_err() {
        fs::File::create(dst).step(what())?;
    }
    let none: Option<&str> = None;
    mount(
        Some(src),
        dst,
        none,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        none,
    )
    .step(what())?;
    remount_ro(dst).step(Step::MakeReadOnly(dst.to_path_buf()))
}

fn remount_ro(path: &Path) -> nix::Result<()> {
    let mut flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    let have = statvfs(path)?.flags();
    for (st, ms) in [
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if have.contains(st) {
            flags |= ms;
        }
    }
    let none: Option<&str> = None;
    mount(none, path, none, flags, none)
}

fn ignore_exists(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::AlreadyExists {
        Ok(())
    } else {
        Err(e)
    }
}

fn build_etc(root: &Path, network: bool) -> Result<(), StepError> {
    let etc = root.join("etc");
    fs::create_dir(&etc).step(Step::CreateEtc)?;
    let generated: &[(&str, &str)] = &[
        (
            "passwd",
            "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:1000:1000:sandbox:/work:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        ),
        ("group", "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n"),
        (
            "hosts",
            "127.0.0.1\tlocalhost gearbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        ),
        ("hostname", "gearbox\n"),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files dns\n",
        ),
    ];
    for (name, content) in generated {
        fs::write(etc.join(name), content).step(Step::WriteEtc(name))?;
    }
    let extra: &[&str] = if network { ETC_NETWORK_ENTRIES } else { &[] };
    for name in ETC_ENTRIES.iter().chain(extra) {
        let src = Path::new("/etc").join(name);
        let dst = etc.join(name);
        let Ok(meta) = fs::symlink_metadata(&src) else {
            continue;
        };
        if meta.file_type().is_symlink() && !network {
            let target = fs::read_link(&src).step(Step::ReadLink(src.clone()))?;
            symlink(&target, &dst).step(Step::Link(dst.clone()))?;
        } else if fs::metadata(&src).map(|m| m.is_dir()).unwrap_or(false) {
            bind_ro(&src, &dst)?;
        } else if let Ok(content) = fs::read(&src) {
            // Copy (following links): resolv.conf often points into /run.
            fs::write(&dst, content).step(Step::Copy(src.clone()))?;
        }
    }
    Ok(())
}

/// A fork server's /proc is its own (it runs no program) and stays without read-only binds:
/// each run mounts a /proc of its own over it, which the kernel allows in the run's user
/// namespace only while the fork server's /proc has nothing mounted on it.
fn build_proc(root: &Path, fork_server: bool) -> Result<(), StepError> {
    let proc_dir = root.join("proc");
    fs::create_dir(&proc_dir).step(Step::CreateProc)?;
    mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .step(Step::MountProc)?;
    for (name, value) in USER_LIMITS {
        fs::write(proc_dir.join("sys/user").join(name), value).step(Step::LimitKernelCounters)?;
    }
    if fork_server {
        return Ok(());
    }
    for sub in PROC_READONLY {
        let p = proc_dir.join(sub);
        if p.exists() {
            bind_ro(&p, &p)?;
        }
    }
    Ok(())
}

fn build_dev(root: &Path) -> Result<(), StepError> {
    let dev = root.join("dev");
    fs::create_dir(&dev).step(Step::CreateDev)?;
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("size=64k,nr_inodes=64,mode=0755"),
    )
    .step(Step::MountDev)?;
    for path in DEVICES {
        let name = path.strip_prefix("/dev/").unwrap_or(path);
        let src = Path::new(path);
        let dst = dev.join(name);
        fs::File::create(&dst).step(Step::CreateDevice(name.to_string()))?;
        mount(
            Some(src),
            &dst,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .step(Step::BindDevice(name.to_string()))?;
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(name)).step(Step::LinkDevice(name))?;
    }
    fs::create_dir(dev.join("shm")).step(Step::CreateDevShm)?;
    Ok(())
}

/// One tmpfs of `disk_mb` MiB backs /work, /tmp and /dev/shm, so one limit covers all the
/// program can write.
fn build_scratch(root: &Path, disk_mb: u64) -> Result<(), StepError> {
    let stage = root.join(".scratch");
    fs::create_dir(&stage).step(Step::CreateScratch)?;
    let inodes = scratch_inodes(disk_mb);
    mount(
        Some("tmpfs"),
        &stage,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("size={disk_mb}m,nr_inodes={inodes},mode=0755").as_str()),
    )
    .step(Step::MountScratchTmpfs)?;
    for area in &SCRATCH {
        let (sub, mode) = (area.stage, area.mode);
        let target = inside(root, Path::new(area.target));
        let src = stage.join(sub);
        fs::create_dir(&src).step(Step::CreateScratchDir)?;
        fs::set_permissions(&src, fs::Permissions::from_mode(mode)).step(Step::ChmodScratchDir)?;
        if !target.exists() {
            fs::create_dir(&target).step(Step::CreateScratchTarget(sub.to_string()))?;
        }
        mount(
            Some(&src),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .step(Step::BindScratch(sub.to_string()))?;
    }
    umount2(&stage, MntFlags::MNT_DETACH).step(Step::DetachScratchStage)?;
    fs::remove_dir(&stage).step(Step::RemoveScratchStage)?;
    Ok(())
}

/// Write the job's files under `work`. Names were validated by the server and the tmpfs is
/// fresh, so no existing symlink can redirect a write; `create_new` makes sure of it.
pub fn write_files(
    work: &Path,
    names: &[(String, u64)],
    files: &[Vec<u8>],
) -> Result<(), StepError> {
    for ((name, _), content) in names.iter().zip(files) {
        // The server validated every name; the helper checks again with the same rule
        // before writing as the sandbox user.
        gearbox_core::validate_relative_path("file name", name).step(Step::WriteFiles)?;
        let path = work.join(name);
        if let Some(parent) = path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .step(Step::CreateDirectoryFor(name.clone()))?;
        }
        let mode = if content.starts_with(b"#!") {
            0o755
        } else {
            0o644
        };
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, content))
            .step(Step::WriteFile(name.clone()))?;
    }
    Ok(())
}
