//! Session runs: the workspace comes back out of the sandbox (and goes in again), never
//! through a symlink, within the session's quota.

use gearbox_core::{BackendKind, CollectLimits, Collected, ExecRequest, JobFile, Outcome, Status};

use crate::support::{engine, runtime};

const LIMITS: CollectLimits = CollectLimits {
    max_files: 1000,
    max_bytes: 16 * 1024 * 1024,
};

async fn run_in(
    language: &str,
    code: &str,
    workspace: Vec<JobFile>,
    limits: CollectLimits,
    backend: Option<BackendKind>,
) -> (Outcome, Option<Collected>) {
    let req = ExecRequest {
        language: language.into(),
        code: code.into(),
        ..Default::default()
    };
    runtime()
        .spawn(engine().execute_collecting(req, backend, workspace, limits))
        .await
        .expect("run task")
}

fn paths(c: &Collected) -> Vec<&str> {
    c.files.iter().map(|f| f.path.as_str()).collect()
}

fn without_entrypoint(c: Collected, entry: &str) -> Vec<JobFile> {
    c.files.into_iter().filter(|f| f.path != entry).collect()
}

#[tokio::test]
async fn files_written_in_one_run_are_read_in_the_next() {
    for backend in [None, Some(BackendKind::Process)] {
        let (o, c) = run_in(
            "python",
            "import os\nos.makedirs('out', exist_ok=True)\nopen('out/data.txt','w').write('kept 42')\nopen('blob.bin','wb').write(bytes(range(256)))\n",
            vec![],
            LIMITS,
            backend,
        )
        .await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        let c = c.expect("collected");
        assert_eq!(paths(&c), ["blob.bin", "main.py", "out/data.txt"]);
        let ws = without_entrypoint(c, "main.py");
        let (o, c) = run_in(
            "bash",
            "cat out/data.txt; echo; od -An -tx1 -j255 blob.bin; rm blob.bin",
            ws,
            LIMITS,
            backend,
        )
        .await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "kept 42\n ff\n", "{backend:?}");
        // The deletion comes back too: the next workspace has no blob.bin.
        assert_eq!(paths(&c.expect("collected")), ["main.sh", "out/data.txt"]);
    }
}

#[tokio::test]
async fn symlinks_made_in_the_sandbox_are_never_followed_on_collection() {
    // A host file only the process backend can see; the Linux sandbox sees its own root.
    let planted = std::env::temp_dir().join(format!("gearbox-planted-{}", std::process::id()));
    std::fs::write(&planted, "PLANTED HOST SECRET").expect("plant");
    let code = format!(
        "ln -s /etc/passwd passwd\nln -s {p} planted\nln -s / root\nln -s .. up\nmkfifo fifo\n\
         mkdir d && ln -s {p} d/deep\necho ok > real.txt\n",
        p = planted.display()
    );
    for backend in [None, Some(BackendKind::Process)] {
        let (o, c) = run_in("bash", &code, vec![], LIMITS, backend).await;
        assert_eq!(o.status, Status::Ok, "{backend:?} {o:?}");
        let c = c.expect("collected");
        assert_eq!(paths(&c), ["main.sh", "real.txt"], "{backend:?}");
        assert_eq!(c.summary.skipped_count, 6, "{:?}", c.summary.skipped);
        for f in &c.files {
            let text = String::from_utf8_lossy(&f.content);
            assert!(
                !text.contains("root:") && !text.contains("PLANTED"),
                "{text}"
            );
        }
    }
    let _ = std::fs::remove_file(&planted);
}

#[tokio::test]
async fn quota_overflow_is_a_clear_error() {
    let small = CollectLimits {
        max_files: 5,
        max_bytes: 1024 * 1024,
    };
    // Bytes: the workspace's tmpfs is the quota, so the program sees ENOSPC.
    let (o, _) = run_in(
        "bash",
        "head -c 3000000 /dev/zero > big || exit 3",
        vec![],
        small,
        None,
    )
    .await;
    assert_eq!(o.exit_code, Some(3), "{o:?}");
    assert!(o.stderr.contains("No space left"), "{o:?}");
    // Files: over the count the collection is refused and the reason says so.
    let (o, c) = run_in(
        "bash",
        "for i in 1 2 3 4 5 6 7 8; do : > f$i; done",
        vec![],
        small,
        None,
    )
    .await;
    let said = o.reason.as_deref().unwrap_or_default().to_string()
        + &c.as_ref()
            .and_then(|c| c.summary.error.clone())
            .unwrap_or_default();
    assert!(c.is_none_or(|c| c.summary.error.is_some()), "{o:?}");
    assert!(said.contains("5 files"), "{said}");
    // Session files plus the call's over the quota: refused before running.
    let big = vec![JobFile {
        path: "big".into(),
        content: vec![0; 2 * 1024 * 1024],
    }];
    let (o, c) = run_in("bash", "true", big, small, None).await;
    assert_eq!(o.status, Status::Denied, "{o:?}");
    assert!(c.is_none());
}

#[tokio::test]
async fn hostile_names_and_ten_thousand_files() {
    let long = "n".repeat(250);
    let code = format!(
        "touch $'new\\nline' $'tab\\there' '{long}' 'sp ace' 'ünï'\nmkdir -p a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r && touch a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/deep\n"
    );
    let (o, c) = run_in("bash", &code, vec![], LIMITS, None).await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let c = c.expect("collected");
    let p = paths(&c);
    assert!(
        p.contains(&long.as_str()) && p.contains(&"sp ace") && p.contains(&"ünï"),
        "{p:?}"
    );
    assert!(
        !p.iter()
            .any(|x| x.contains('\n') || x.contains('\t') || x.ends_with("deep")),
        "{p:?}"
    );
    assert!(c.summary.skipped_count >= 3, "{:?}", c.summary);

    // 3000 files out and back in.
    let many = CollectLimits {
        max_files: 5000,
        max_bytes: 64 * 1024 * 1024,
    };
    let started = std::time::Instant::now();
    let (o, c) = run_in(
        "bash",
        "mkdir -p m && cd m && for i in $(seq 3000); do echo $i > f$i; done",
        vec![],
        many,
        None,
    )
    .await;
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let c = c.expect("collected");
    assert_eq!(c.files.len(), 3001);
    let first = started.elapsed();
    let ws = without_entrypoint(c, "main.sh");
    let started = std::time::Instant::now();
    let (o, c) = run_in("bash", "ls m | wc -l; cat m/f2999", ws, many, None).await;
    assert_eq!(o.stdout, "3000\n2999\n", "{o:?}");
    assert_eq!(c.expect("collected").files.len(), 3001);
    eprintln!(
        "3000 files: write+collect {:?}, copy in+collect {:?}",
        first,
        started.elapsed()
    );
    // 10 000 files against a limit of 2000: the tmpfs runs out of inodes (64 per MiB) and
    // the collection stops at the limit; the program ends and nothing is kept.
    let fewer = CollectLimits {
        max_files: 2000,
        ..many
    };
    let (o, c) = run_in(
        "bash",
        "mkdir -p m && cd m && for i in $(seq 10000); do : 2>/dev/null > f$i || break; done; echo done",
        vec![],
        fewer,
        None,
    )
    .await;
    assert_eq!(o.stdout, "done\n", "{o:?}");
    let said = o.reason.clone().unwrap_or_default()
        + &c.as_ref()
            .and_then(|c| c.summary.error.clone())
            .unwrap_or_default();
    assert!(
        c.is_none_or(|c| c.summary.error.is_some()) && said.contains("2000 files"),
        "{o:?} {said}"
    );
}

#[tokio::test]
async fn a_timed_out_run_brings_nothing_back() {
    let req = ExecRequest {
        language: "bash".into(),
        code: "echo x > f; sleep 10".into(),
        limits: gearbox_core::LimitOverrides {
            timeout_ms: Some(300),
            ..Default::default()
        },
        ..Default::default()
    };
    let (o, c) = runtime()
        .spawn(engine().execute_collecting(req, None, vec![], LIMITS))
        .await
        .expect("run task");
    assert_eq!(o.status, Status::Timeout, "{o:?}");
    assert!(c.is_none());
}

#[tokio::test]
async fn the_wasm_backend_refuses_session_runs() {
    let (o, c) = run_in(
        "javascript",
        "console.log(1)",
        vec![],
        LIMITS,
        Some(BackendKind::Wasm),
    )
    .await;
    assert_eq!(o.status, Status::Error, "{o:?}");
    assert!(
        o.reason
            .as_deref()
            .is_some_and(|r| r.contains("cannot keep a session workspace")),
        "{o:?}"
    );
    assert!(c.is_none());
}

/// What collecting costs: a trivial run with and without a session workspace, and a 1000-file
/// workspace copied in and out. `cargo test -p gearbox --test sandbox collect_overhead --
/// --ignored --nocapture`.
#[tokio::test]
#[ignore = "measurement"]
async fn collect_overhead() {
    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }
    let limits = CollectLimits {
        max_files: 5000,
        max_bytes: 64 * 1024 * 1024,
    };
    let (mut plain, mut coll, mut big) = (vec![], vec![], vec![]);
    let thousand: Vec<JobFile> = (0..1000)
        .map(|i| JobFile {
            path: format!("d/f{i}"),
            content: vec![b'x'; 1024],
        })
        .collect();
    for _ in 0..20 {
        let t = std::time::Instant::now();
        let req = ExecRequest {
            language: "bash".into(),
            code: "echo hi > f".into(),
            ..Default::default()
        };
        let o = runtime()
            .spawn(engine().execute(req, None))
            .await
            .expect("run");
        assert_eq!(o.status, Status::Ok);
        plain.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = std::time::Instant::now();
        let (o, c) = run_in("bash", "echo hi > f", vec![], limits, None).await;
        assert!(o.is_ok() && c.is_some());
        coll.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = std::time::Instant::now();
        let (o, c) = run_in("bash", "echo hi > f", thousand.clone(), limits, None).await;
        assert!(o.is_ok() && c.is_some_and(|c| c.files.len() == 1002));
        big.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    eprintln!(
        "median ms over 20: plain {:.1}, collecting {:.1}, 1000 files (1 MiB) in and out {:.1}",
        median(plain),
        median(coll),
        median(big)
    );
}
