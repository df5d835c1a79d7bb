//! Builds the fork server's native loop (`src/launchers/fork/`, crate root `mod.rs`) as a
//! shared object that the sandbox helper writes into each fork server's root (see
//! `jail/mount.rs`). A cdylib of the workspace cannot be a build dependency on stable Cargo,
//! so it is a crate of its own compiled here with the same compiler, for the same target,
//! with no dependencies. Its modules are named by `#[path]` (among them the restriction
//! policy the crate shares, `src/restriction.rs`); the crate's `fork` example compiles the
//! same root again, so that clippy lints it.

use std::path::PathBuf;
use std::process::Command;

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
}
