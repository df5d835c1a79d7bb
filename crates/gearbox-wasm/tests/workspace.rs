//! A run's private workspace (made when the call brings files besides the entrypoint) is
//! removed once the run is over, however it ended. Its own test binary: the workspaces are
//! named after the process (`gearbox-wasm-<pid>-…` under the temp dir), so nothing else in
//! this process makes one while it looks.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{job, run};
use gearbox_core::{Job, JobFile, Status};

/// This process's workspaces under the temp dir.
fn workspaces() -> Vec<PathBuf> {
    let prefix = format!("gearbox-wasm-{}-", std::process::id());
    std::fs::read_dir(std::env::temp_dir())
        .expect("read the temp dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Polls until `want` holds of this process's workspaces, for at most 10 s.
async fn until(what: &str, want: impl Fn(&[PathBuf]) -> bool) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = workspaces();
        if want(&found) {
            return found;
        }
        assert!(Instant::now() < deadline, "{what}: {found:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn with_module(code: &str) -> Job {
    let mut j = job(code);
    j.files.push(JobFile {
        path: "lib/math.js".into(),
        content: b"export function add(a, b) { return a + b; }".to_vec(),
    });
    j
}

#[tokio::test]
async fn the_workspace_is_removed_after_every_ending() {
    assert!(workspaces().is_empty(), "{:?}", workspaces());

    // A run that outlives its deadline: its workspace exists while it runs, then goes.
    let mut looping = with_module("import { add } from './lib/math.js'; for (;;) { add(1, 2); }");
    looping.limits.timeout_ms = 1_500;
    let running = tokio::spawn(run(looping));
    // Made, then filled with the call's files: waited for until it holds them.
    until(
        "no workspace with the call's files while the run was in flight",
        |w| w.len() == 1 && w[0].join("lib/math.js").is_file(),
    )
    .await;
    let o = running.await.expect("run task");
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    until("the timed-out run's workspace was left", |w| w.is_empty()).await;

    // A run that ends normally, one that throws, one killed for its memory.
    for (code, status) in [
        (
            "import { add } from './lib/math.js'; console.log(add(2, 3));",
            Status::Ok,
        ),
        (
            "import { add } from './lib/math.js'; throw new Error('no ' + add(1, 1));",
            Status::Error,
        ),
        (
            "import './lib/math.js'; const a = []; for (;;) a.push(new Array(100000).fill(1.5));",
            Status::Killed,
        ),
    ] {
        let mut j = with_module(code);
        j.limits.memory_mb = 64;
        let o = run(j).await;
        assert_eq!(o.status, status, "{code}: {o:?}");
        until("a finished run's workspace was left", |w| w.is_empty()).await;
    }
}
