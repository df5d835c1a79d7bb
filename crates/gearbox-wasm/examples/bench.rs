//! `console.log(1)` through the wasm backend vs a bare `node -e 'console.log(1)'`, in one run.
//!
//!     cargo run --release -p gearbox-wasm --example bench [-- RUNS]
//!
//! Prints median and p90 over RUNS (default 300) of: `Sandbox::run` awaited on a tokio runtime
//! (what the engine does), `WasmSandbox::run_blocking` on the calling thread (the backend
//! alone), and node spawned as a child process with a clean environment.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use gearbox_core::{Job, JobFile, Sandbox, Status};
use gearbox_wasm::{WasmConfig, WasmSandbox};

fn job() -> Job {
    Job {
        language: "javascript".into(),
        argv: vec!["main.js".into()],
        program_argv: vec!["main.js".into()],
        files: vec![JobFile {
            path: "main.js".into(),
            content: b"console.log(1)".to_vec(),
        }],
        ..Job::default()
    }
}

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(v[v.len() / 2]), ms(v[(v.len() * 9) / 10]))
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let t = Instant::now();
    let sb = WasmSandbox::new(WasmConfig::with_default_cache()).expect("wasm backend");
    println!(
        "backend ready in {:.1} ms ({:?})",
        t.elapsed().as_secs_f64() * 1000.0,
        sb.module_source()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");

    let check = sb.run_blocking(&job(), Arc::new(AtomicBool::new(false)));
    assert!(
        check.status == Status::Ok && check.stdout == "1\n",
        "{check:?}"
    );
    for _ in 0..20 {
        sb.run_blocking(&job(), Arc::new(AtomicBool::new(false)));
    }

    let mut via_trait = Vec::with_capacity(runs);
    let mut blocking = Vec::with_capacity(runs);
    let mut node = Vec::with_capacity(runs);
    let node_ok = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok();
    for _ in 0..runs {
        let t = Instant::now();
        let o = rt.block_on(sb.run(job())).expect("run");
        via_trait.push(t.elapsed());
        assert_eq!(o.stdout, "1\n");

        let t = Instant::now();
        let o = sb.run_blocking(&job(), Arc::new(AtomicBool::new(false)));
        blocking.push(t.elapsed());
        assert_eq!(o.stdout, "1\n");

        if node_ok {
            let t = Instant::now();
            let o = std::process::Command::new("node")
                .args(["-e", "console.log(1)"])
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .output()
                .expect("node");
            node.push(t.elapsed());
            assert_eq!(o.stdout, b"1\n");
        }
    }

    let (tm, tp) = stats(via_trait);
    let (bm, bp) = stats(blocking);
    println!("{runs} runs of console.log(1), interleaved\n");
    println!("| path | median ms | p90 ms | vs node (median) |");
    println!("|---|---|---|---|");
    let (nm, np) = if node.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        stats(node)
    };
    println!(
        "| wasm: Sandbox::run (tokio spawn_blocking) | {tm:.3} | {tp:.3} | {:.0}x faster |",
        nm / tm
    );
    println!(
        "| wasm: WasmSandbox::run_blocking | {bm:.3} | {bp:.3} | {:.0}x faster |",
        nm / bm
    );
    println!("| bare node -e (child process) | {nm:.3} | {np:.3} | 1x |");
}
