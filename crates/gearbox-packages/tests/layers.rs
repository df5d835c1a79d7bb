//! Real installs from PyPI and npm into layer stores under temporary directories.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use gearbox_packages::{
    Ecosystem, LayerStore, PackageError, PackagesConfig, PythonInstaller, Target,
};

const PYTHON: &str = "/usr/bin/python3";

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "gearbox-packages-test-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn version(bin: &str) -> String {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .expect("interpreter");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
        + String::from_utf8_lossy(&out.stderr).trim()
}

fn python() -> Target {
    Target {
        ecosystem: Ecosystem::Python,
        interpreter: PYTHON.into(),
        version: version(PYTHON),
    }
}

fn node() -> Target {
    Target {
        ecosystem: Ecosystem::Node,
        interpreter: "/usr/bin/node".into(),
        version: version("/usr/bin/node"),
    }
}

fn config(dir: &Path) -> PackagesConfig {
    PackagesConfig {
        cache_dir: Some(dir.to_path_buf()),
        install_timeout_ms: 180_000,
        ..Default::default()
    }
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// An installer wrapper that appends a line to `log` for every run, then runs the real one.
fn counting_wrapper(dir: &Path, name: &str, real: &Path, log: &Path) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\necho run >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

fn runs(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |t| t.lines().count())
}

fn real_uv() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let candidates = [
        std::env::var("GEARBOX_TOOLS_DIR")
            .map(|t| PathBuf::from(t).join("bin/uv"))
            .ok(),
        Some(PathBuf::from(home).join(".cache/gearbox/tools/bin/uv")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .expect("uv is installed by scripts/setup-packages.sh")
}

/// Every file and directory under `dir` is writable by its owner only.
fn assert_sealed(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read layer") {
        let entry = entry.expect("entry");
        let meta = std::fs::symlink_metadata(entry.path()).expect("meta");
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        assert_eq!(
            mode & 0o022,
            0,
            "{} is group/other writable",
            entry.path().display()
        );
        assert_eq!(mode & 0o6000, 0, "{} is set-id", entry.path().display());
        assert_ne!(
            mode & 0o004,
            0,
            "{} is not world-readable",
            entry.path().display()
        );
        if meta.is_dir() {
            assert_sealed(&entry.path());
        }
    }
}

#[tokio::test]
async fn python_layer_installs_once_then_hits_the_cache() {
    let dir = tempdir("py");
    let log = dir.join("runs.log");
    let uv = counting_wrapper(&dir, "uv", &real_uv(), &log);
    let store = LayerStore::new(PackagesConfig {
        uv: Some(uv),
        ..config(&dir.join("cache"))
    })
    .expect("store");
    let reqs = s(&["six", "attrs>=22"]);

    let resolved = store.resolve(&python(), &reqs).await.expect("resolve");
    assert!(resolved.iter().any(|p| p.name == "six"), "{resolved:?}");
    assert_eq!(runs(&log), 1, "resolve runs the installer once");
    assert!(!store.is_cached(&python(), &reqs));

    let first = store.layer(&python(), &reqs).await.expect("install");
    assert!(!first.cached);
    assert_eq!(runs(&log), 2);
    let names: Vec<&str> = first.packages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["attrs", "six"], "{:?}", first.packages);
    assert_eq!(first.requirements, s(&["attrs>=22", "six"]));
    let pythonpath = first.env.get("PYTHONPATH").expect("PYTHONPATH").clone();
    assert!(pythonpath.starts_with(&first.path.display().to_string()));
    assert_sealed(&first.path);

    // The layer works for the interpreter it was built for.
    let out = Command::new(PYTHON)
        .args([
            "-c",
            "import six, attr; print(six.__version__, attr.__version__ != '')",
        ])
        .env("PYTHONPATH", &pythonpath)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("1."));

    // Same set, other order and spelling: cached, no installer.
    let second = store
        .layer(&python(), &s(&["ATTRS >= 22", "six", "six"]))
        .await
        .expect("cached");
    assert!(second.cached);
    assert_eq!(second.path, first.path);
    assert_eq!(runs(&log), 2, "a cached layer runs no installer");
    assert!(
        second.elapsed_ms < 1000,
        "cached lookup took {} ms",
        second.elapsed_ms
    );
    // resolve of a cached set answers from the layer.
    store
        .resolve(&python(), &reqs)
        .await
        .expect("resolve cached");
    assert_eq!(runs(&log), 2);

    let listed = store.layers(Some(Ecosystem::Python));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].requirements, s(&["attrs>=22", "six"]));
    assert!(listed[0].size_bytes > 10_000);
    assert!(store.layers(Some(Ecosystem::Node)).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn pip_is_the_fallback_installer() {
    let dir = tempdir("pip");
    let store = LayerStore::new(PackagesConfig {
        python_installer: PythonInstaller::Pip,
        ..config(&dir)
    })
    .expect("store");
    let layer = store
        .layer(&python(), &s(&["six"]))
        .await
        .expect("pip install");
    assert!(!layer.cached);
    assert_eq!(layer.packages.len(), 1);
    assert_eq!(layer.packages[0].name, "six");
    assert_sealed(&layer.path);
    let resolved = store
        .resolve(&python(), &s(&["attrs"]))
        .await
        .expect("pip dry run");
    assert_eq!(
        resolved.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
        vec!["attrs"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn npm_layer_installs_without_scripts_and_is_cached() {
    let dir = tempdir("npm");
    let log = dir.join("runs.log");
    let npm = counting_wrapper(&dir, "npm", Path::new("/usr/bin/npm"), &log);
    let store = LayerStore::new(PackagesConfig {
        npm: Some(npm),
        ..config(&dir.join("cache"))
    })
    .expect("store");
    let resolved = store
        .resolve(&node(), &s(&["is-number@^7"]))
        .await
        .expect("resolve");
    assert_eq!(resolved.len(), 1, "{resolved:?}");
    assert!(resolved[0].version.starts_with("7."));

    let layer = store
        .layer(&node(), &s(&["is-number@^7"]))
        .await
        .expect("npm install");
    assert!(!layer.cached);
    assert_eq!(layer.packages[0].name, "is-number");
    let node_path = layer.env.get("NODE_PATH").expect("NODE_PATH");
    assert_sealed(&layer.path);
    let out = Command::new("/usr/bin/node")
        .args([
            "-e",
            "console.log(require('is-number')(5), require('is-number')('x'))",
        ])
        .env("NODE_PATH", node_path)
        .output()
        .expect("node");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "true false");
    let n = runs(&log);
    let again = store
        .layer(&node(), &s(&["is-number@^7"]))
        .await
        .expect("cached");
    assert!(again.cached);
    assert_eq!(runs(&log), n);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn concurrent_identical_requests_build_once() {
    let dir = tempdir("conc");
    let log = dir.join("runs.log");
    let uv = counting_wrapper(&dir, "uv", &real_uv(), &log);
    let store = std::sync::Arc::new(
        LayerStore::new(PackagesConfig {
            uv: Some(uv),
            ..config(&dir.join("cache"))
        })
        .expect("store"),
    );
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.layer(&python(), &s(&["six"])).await })
        })
        .collect();
    let mut built = 0;
    let mut paths = Vec::new();
    for t in tasks {
        let layer = t.await.expect("join").expect("layer");
        built += usize::from(!layer.cached);
        paths.push(layer.path.clone());
    }
    assert_eq!(built, 1, "exactly one task built");
    assert_eq!(runs(&log), 1, "one installer run for four requests");
    paths.dedup();
    assert_eq!(paths.len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run by `concurrent_processes_build_once` in child processes (ignored otherwise).
#[tokio::test]
#[ignore = "helper of concurrent_processes_build_once"]
async fn child_builds_six() {
    let Ok(cache) = std::env::var("GEARBOX_PACKAGES_TEST_CACHE") else {
        return;
    };
    let uv = std::env::var("GEARBOX_PACKAGES_TEST_UV").expect("uv");
    let store = LayerStore::new(PackagesConfig {
        uv: Some(uv.into()),
        ..config(Path::new(&cache))
    })
    .expect("store");
    let layer = store.layer(&python(), &s(&["six"])).await.expect("layer");
    println!("CACHED={}", layer.cached);
}

#[test]
fn concurrent_processes_build_once() {
    let dir = tempdir("procs");
    let log = dir.join("runs.log");
    let uv = counting_wrapper(&dir, "uv", &real_uv(), &log);
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "child_builds_six", "--ignored", "--nocapture"])
                .env("GEARBOX_PACKAGES_TEST_CACHE", dir.join("cache"))
                .env("GEARBOX_PACKAGES_TEST_UV", &uv)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("child")
        })
        .collect();
    let mut cached = Vec::new();
    for c in children {
        let out = c.wait_with_output().expect("wait");
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(text.contains("CACHED="), "{text}");
        cached.push(text.contains("CACHED=true"));
    }
    cached.sort();
    assert_eq!(
        cached,
        vec![false, true],
        "one process built, the other reused"
    );
    assert_eq!(runs(&log), 1, "one installer run across two processes");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_names_urls_and_options_fail_clearly() {
    let dir = tempdir("bad");
    let store = LayerStore::new(config(&dir)).expect("store");

    let e = store
        .layer(&python(), &s(&["gearbox-no-such-package-4b1f9c"]))
        .await
        .expect_err("no such package");
    let msg = e.to_string();
    assert!(matches!(e, PackageError::InstallFailed { .. }), "{msg}");
    assert!(msg.contains("gearbox-no-such-package-4b1f9c"), "{msg}");
    assert!(msg.len() < 5000, "trimmed: {} bytes", msg.len());

    let e = store
        .layer(&node(), &s(&["gearbox-no-such-package-4b1f9c"]))
        .await
        .expect_err("no such npm package");
    assert!(
        e.to_string().contains("404") || e.to_string().contains("Not found"),
        "{e}"
    );

    let before = store.installer_runs();
    for (eco, bad) in [
        (python(), "six @ https://evil.example/six.whl"),
        (python(), "git+https://github.com/benjaminp/six"),
        (python(), "--index-url=https://evil.example/simple"),
        (python(), "-e ."),
        (node(), "is-number@https://evil.example/x.tgz"),
        (node(), "jonschlinkert/is-number"),
    ] {
        let e = store.layer(&eco, &s(&[bad])).await.expect_err(bad);
        assert!(matches!(e, PackageError::Invalid(_)), "{bad}: {e}");
        assert!(e.to_string().starts_with("packages[0]"), "{e}");
    }
    assert_eq!(store.installer_runs(), before, "refusals run no installer");
    assert!(store.layers(None).is_empty(), "failures leave no layer");
    let tmp: Vec<_> = std::fs::read_dir(dir.join("tmp")).expect("tmp").collect();
    assert!(tmp.is_empty(), "failures leave no build directory");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_stopped_install_leaves_no_half_layer() {
    let dir = tempdir("timeout");
    // A "uv" that never finishes: the store must stop it and clean up.
    let hang = dir.join("hang-uv");
    let child_pid = dir.join("sleep.pid");
    std::fs::write(
        &hang,
        format!(
            "#!/bin/sh\nsleep 600 &\necho $! > '{}'\nwait\n",
            child_pid.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let store = LayerStore::new(PackagesConfig {
        uv: Some(hang),
        install_timeout_ms: 1500,
        ..config(&dir.join("cache"))
    })
    .expect("store");
    let t = std::time::Instant::now();
    let e = store
        .layer(&python(), &s(&["six"]))
        .await
        .expect_err("timeout");
    assert!(matches!(e, PackageError::Timeout { .. }), "{e}");
    assert!(t.elapsed().as_secs() < 10, "took {:?}", t.elapsed());
    assert!(store.layers(None).is_empty());
    let tmp: Vec<_> = std::fs::read_dir(dir.join("cache/tmp"))
        .expect("tmp")
        .collect();
    assert!(tmp.is_empty(), "no build directory left: {tmp:?}");
    // The installer's whole process group is gone, its background child included.
    let pid = std::fs::read_to_string(&child_pid).expect("the hanging installer ran");
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    let gone = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        !proc_dir.exists()
    });
    assert!(
        gone,
        "the installer's child {} survived the timeout",
        pid.trim()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn lru_gc_removes_old_unused_layers_past_the_budget() {
    let dir = tempdir("gc");
    let store = LayerStore::new(PackagesConfig {
        budget_mb: 0,
        ..config(&dir)
    })
    .expect("store");
    let a = store.layer(&python(), &s(&["six"])).await.expect("six");
    let a_path = a.path.clone();
    // `a` is in use: building `b` past the budget must not remove it.
    let b = store.layer(&python(), &s(&["attrs"])).await.expect("attrs");
    assert!(a_path.exists(), "a layer in use is kept");
    drop(a);
    let b_path = b.path.clone();
    drop(b);
    // Both unused now; a third build removes them (the oldest first), keeping itself.
    let c = store
        .layer(&node(), &s(&["is-number"]))
        .await
        .expect("is-number");
    assert!(!a_path.exists(), "least recently used layer removed");
    assert!(!b_path.exists(), "still over budget: next one removed too");
    assert!(c.path.exists(), "the new layer stays");
    assert_eq!(store.layers(None).len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
