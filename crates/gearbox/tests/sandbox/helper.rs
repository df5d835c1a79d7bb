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
    let engine = cold_engine(&gearbox_bin());
    assert_eq!(engine.helper(), lean);
    let o = exec(&engine, run("python", "print(6 * 7)").req).await;
    assert_eq!((o.status, o.stdout.as_str()), (Status::Ok, "42\n"), "{o:?}");
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
