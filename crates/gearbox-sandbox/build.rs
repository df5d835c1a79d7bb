//! Builds the fork server's native loop (`src/launchers/fork/`, crate root `mod.rs`) as a
//! shared object that the sandbox helper writes into each fork server's root (see
//! `jail/mount.rs`). A cdylib of the workspace cannot be a build dependency on stable Cargo,
//! so it is a crate of its own compiled here with the same compiler, for the same target,
//! with no dependencies. Its modules are named by `#[path]` (among them the restriction
//! policy the crate shares, `src/restriction.rs`); the crate's `fork` example compiles the
//! same root again, so that clippy lints it.

use std::path::PathBuf;
use std::process::Command;

/// The seccomp policy's compiler, shared with the crate's unit tests.
#[path = "src/jail/seccomp_compile.rs"]
#[allow(dead_code)]
mod seccomp_compile;

fn main() {
    let src = "src/launchers/fork/mod.rs";
    let dir = std::fs::read_dir("src/launchers/fork").expect("read src/launchers/fork");
    for entry in dir {
        let path = entry.expect("list src/launchers/fork").path();
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=src/launchers/fork");
    println!("cargo:rerun-if-changed=src/restriction.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let status = Command::new(rustc)
        .args([
            "--crate-type=cdylib",
            "--crate-name=gearbox_fork",
            "--edition=2024",
            "-C",
            "opt-level=2",
            "-C",
            "panic=abort",
            "-C",
            "debuginfo=0",
            "-C",
            "strip=symbols",
            "-D",
            "warnings",
            "--target",
            &target,
            "-o",
        ])
        .arg(out.join("fork.so"))
        .arg(src)
        .status()
        .expect("run rustc for the fork server's native loop");
    assert!(status.success(), "building {src} failed");
    seccomp_filters(&out);
    helper_build_id();
}

/// The seccomp policy compiled once, here, for the target: `seccomp-cold.bin` (the filters
/// every program runs under) and `seccomp-split.bin` (a fork server's own, then its
/// programs'), embedded by `src/jail/seccomp.rs`. A policy that does not compile fails the
/// build.
fn seccomp_filters(out: &std::path::Path) {
    println!("cargo:rerun-if-changed=src/jail/seccomp.json");
    println!("cargo:rerun-if-changed=src/jail/seccomp_compile.rs");
    let target = std::env::var("CARGO_CFG_TARGET_ARCH").expect("CARGO_CFG_TARGET_ARCH");
    let Ok(arch) = seccomp_compile::arch_named(&target) else {
        // No reviewed policy for this target: empty files, and the helper refuses to run
        // (`seccomp.rs` checks the filters it embeds).
        std::fs::write(out.join("seccomp-cold.bin"), []).expect("write seccomp-cold.bin");
        std::fs::write(out.join("seccomp-split.bin"), []).expect("write seccomp-split.bin");
        return;
    };
    let cold = seccomp_compile::compile(arch).expect("compile the seccomp policy");
    let (mut server, program) =
        seccomp_compile::compile_split(arch).expect("compile the split seccomp policy");
    server.extend(program);
    std::fs::write(out.join("seccomp-cold.bin"), seccomp_compile::encode(&cold))
        .expect("write seccomp-cold.bin");
    std::fs::write(
        out.join("seccomp-split.bin"),
        seccomp_compile::encode(&server),
    )
    .expect("write seccomp-split.bin");
}

/// `GEARBOX_HELPER_BUILD`: a digest of everything the sandbox helper is built from (this
/// crate's sources, gearbox-core's, the lock file and the compiler's version). The server
/// passes it to the helper, which refuses to serve another build's server: a `gearbox-jail`
/// left beside a newer `gearbox` must fail clearly, not run an older sandbox.
fn helper_build_id() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let roots = [
        manifest.join("src"),
        manifest.join("../gearbox-core/src"),
        manifest.join("../../Cargo.lock"),
    ];
    let mut files = Vec::new();
    for root in &roots {
        println!("cargo:rerun-if-changed={}", root.display());
        collect(root, &mut files);
    }
    files.sort();
    // FNV-1a, 64 bits: a change detector, not a defence against a forged helper (whoever can
    // replace the helper can replace the server).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for f in &files {
        eat(f
            .strip_prefix(&manifest)
            .unwrap_or(f)
            .to_string_lossy()
            .as_bytes());
        eat(&std::fs::read(f).unwrap_or_default());
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    if let Ok(out) = Command::new(rustc).arg("-V").output() {
        eat(&out.stdout);
    }
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!("cargo:rustc-env=GEARBOX_HELPER_BUILD={version}-{h:016x}");
}

/// Every file under `path`, or `path` itself when it is a file.
fn collect(path: &std::path::Path, out: &mut Vec<PathBuf>) {
    match std::fs::read_dir(path) {
        Ok(dir) => {
            for entry in dir.flatten() {
                collect(&entry.path(), out);
            }
        }
        Err(_) if path.is_file() => out.push(path.to_path_buf()),
        Err(_) => {}
    }
}
