//! Which helper a sandbox starts with: the lean `gearbox-jail` beside `gearbox` when it is
//! there, `gearbox __jail` when it is not, and never a helper of another build.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gearbox_core::Status;
use gearbox_engine::{Config, Engine, PoolConfig};

use crate::fork_server::exec;
use crate::support::{gearbox_bin, run};

/// A directory of its own (under `TMPDIR`, which the unprivileged pass points at a place
/// `nobody` owns) holding a link named `gearbox` to the binary under test.
fn install_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gearbox-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("install dir");
    std::os::unix::fs::symlink(gearbox_bin(), dir.join("gearbox")).expect("link gearbox");
    dir
}

fn cold_engine(gearbox: &Path) -> Arc<Engine> {
    let _g = crate::support::runtime().enter();
    let config = Config {
        pool: PoolConfig::only([]),
        ..Config::default()
    };
    Arc::new(Engine::new(config, gearbox.to_path_buf()))
}

#[tokio::test]
async fn the_lean_helper_beside_gearbox_serves_runs() {
    let lean = gearbox_bin().with_file_name("gearbox-jail");
    assert!(
        lean.is_file(),
        "{} is not built beside the binary under test",
        lean.display()
    );
    // The passes that install the helper as `scripts/setup.sh` does (linked statically by
    // `scripts/static-helper.sh`) say so: this suite then runs on that helper.
    if std::env::var_os("GEARBOX_EXPECT_STATIC_HELPER").is_some() {
        assert_eq!(
            dynamic_loader(&lean),
            None,
            "{} is not linked statically",
            lean.display()
        );
    }
    let engine = cold_engine(&gearbox_bin());
    assert_eq!(engine.helper(), lean);
    let o = exec(&engine, run("python", "print(6 * 7)").req).await;
    assert_eq!((o.status, o.stdout.as_str()), (Status::Ok, "42\n"), "{o:?}");
}

/// The dynamic loader an ELF64 executable names (its `PT_INTERP` program header), if any.
fn dynamic_loader(path: &Path) -> Option<String> {
    let elf = std::fs::read(path).expect("read the helper");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&elf[o..o + 8]);
        u64::from_le_bytes(b) as usize
    };
    assert_eq!(&elf[..5], b"\x7fELF\x02", "not an ELF64 file");
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    (0..phnum).find_map(|i| {
        let ph = phoff + i * phentsize;
        let kind = u32::from_le_bytes([elf[ph], elf[ph + 1], elf[ph + 2], elf[ph + 3]]);
        // PT_INTERP: p_offset at 8, p_filesz at 32.
        (kind == 3).then(|| {
            let (off, len) = (u64_at(ph + 8), u64_at(ph + 32));
            String::from_utf8_lossy(&elf[off..off + len])
                .trim_end_matches('\0')
                .to_string()
        })
    })
}

#[tokio::test]
async fn without_the_lean_helper_gearbox_is_its_own_helper() {
    let dir = install_dir("alone");
    let gearbox = dir.join("gearbox");
    let engine = cold_engine(&gearbox);
    assert_eq!(engine.helper(), gearbox);
    let o = exec(&engine, run("bash", "echo $((6 * 7))").req).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((o.status, o.stdout.as_str()), (Status::Ok, "42\n"), "{o:?}");
}

/// A `gearbox-jail` of another build (here the helper told another build's id) refuses the
/// job at its first step, with the remedy in the error, and no program runs.
#[tokio::test]
async fn a_helper_of_another_build_refuses_the_job() {
    use std::os::unix::fs::PermissionsExt;
    let dir = install_dir("mixed");
    let marker = dir.join("ran");
    let helper = dir.join("gearbox-jail");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\nexec {} __jail 0.0.0-another-build \"$@\"\n",
            gearbox_bin().display()
        ),
    )
    .expect("write helper");
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let engine = cold_engine(&dir.join("gearbox"));
    assert_eq!(engine.helper(), helper);
    let code = format!("open({:?}, 'w').write('x')", marker.display().to_string());
    let o = exec(&engine, run("python", &code).req).await;
    let ran = marker.exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(o.status, Status::Error, "{o:?}");
    let reason = o.reason.clone().unwrap_or_default();
    for part in [
        "check the helper's build",
        "0.0.0-another-build",
        gearbox_sandbox::HELPER_BUILD,
        "install gearbox and gearbox-jail together",
    ] {
        assert!(reason.contains(part), "{part:?} missing from {reason:?}");
    }
    assert!(!ran, "the program ran");
}

/// `gearbox run` exits once its helper has reported, without waiting for the helper to
/// clean up after the run (remove its cgroup, or in `process` mode its directory), and the
/// helper, no longer tied to the command by then, finishes that on its own: nothing kills
/// it (neither its death signal nor the command's runtime as it stops), so it exits 0 and
/// leaves nothing behind. A Python parent that adopts orphans (`PR_SET_CHILD_SUBREAPER`)
/// runs the command and waits for every helper that outlived it; the helpers' pids come
/// from the command's debug log. The `process` runs leave 5,000 files to remove, so their
/// helpers outlive the command by tens of milliseconds (the linux runs' clean-up is too
/// quick to lose to the command's exit reliably).
#[test]
fn a_one_shot_runs_helper_finishes_its_clean_up_after_the_command_exits() {
    const PARENT: &str = r#"
import ctypes, json, os, subprocess, sys
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
MANY = "import os\nfor i in range(5000): open(f'f{i}', 'w').close()\nprint(os.getcwd())"
runs = [([], f"print({i} * 7)", f"{i * 7}\n") for i in range(3)]
runs += [(["--backend", "process"], MANY, None) for _ in range(2)]
logs, dirs = [], []
for extra, code, want in runs:
    p = subprocess.run([sys.argv[1], "--log", "gearbox_sandbox=debug", "run", *extra,
                        "--language", "python", "-"], input=code.encode(), capture_output=True)
    assert p.returncode == 0 and (want is None or p.stdout.decode() == want), p
    if want is None:
        dirs.append(os.path.dirname(p.stdout.decode().strip()))
    logs.append(p.stderr.decode())
adopted = []
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    adopted.append([pid, status])
print(json.dumps({"logs": logs, "adopted": adopted, "dirs": dirs}))
"#;
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", PARENT])
        .arg(gearbox_bin())
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the parent's JSON");
    // Every helper that outlived its command ended by itself, with status 0.
    let adopted = v["adopted"].as_array().expect("adopted");
    for a in adopted {
        assert_eq!(
            a[1], 0,
            "an adopted helper did not exit 0: {a} (a wait status)"
        );
    }
    // Each `process` run's directory is gone.
    for d in v["dirs"].as_array().expect("dirs") {
        let d = d.as_str().expect("a directory");
        assert!(d.starts_with("/tmp/gearbox-run-"), "{d}");
        assert!(
            !Path::new(d).exists(),
            "a process run's directory was left: {d}"
        );
    }
    let helpers: Vec<String> = v["logs"]
        .as_array()
        .expect("logs")
        .iter()
        .filter_map(|log| {
            let line = log
                .as_str()?
                .lines()
                .find(|l| l.contains("sandbox helper started"))?;
            let pid = line.split("pid=").nth(1)?;
            Some(pid.chars().take_while(char::is_ascii_digit).collect())
        })
        .collect();
    assert_eq!(helpers.len(), 5, "the helpers' pids in the debug log: {v}");
    // The process runs' helpers were still removing files when their command exited.
    for h in &helpers[3..] {
        assert!(
            adopted.iter().any(|a| a[0].as_u64() == h.parse().ok()),
            "the helper {h} of a process run did not outlive its command: {v}"
        );
    }
    if !crate::cgroups::root_and_cgroups("a one-shot run's cgroup is removed") {
        return;
    }
    // Each linux run's helper names the run's cgroup after itself: all are gone (every
    // helper has exited: the Python parent waited for those that outlived their command).
    let left: Vec<PathBuf> = crate::cgroups::gearbox_roots()
        .iter()
        .filter_map(|root| std::fs::read_dir(root).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            helpers
                .iter()
                .any(|h| name.starts_with(&format!("run-{h}-")))
        })
        .collect();
    assert!(left.is_empty(), "cgroups left by one-shot runs: {left:?}");
}
