//! What the wasm backend's test binaries share: one backend per process, a JavaScript job.

#![allow(dead_code)]

use std::sync::OnceLock;

use gearbox_core::{Job, JobFile, Limits, Outcome, Sandbox};
use gearbox_wasm::{WasmConfig, WasmSandbox};

/// One backend per test process: the module is compiled (or loaded from the cache) once.
pub fn sandbox() -> &'static WasmSandbox {
    static SB: OnceLock<WasmSandbox> = OnceLock::new();
    SB.get_or_init(|| {
        let dir = std::env::temp_dir().join("gearbox-wasm-test-cache");
        WasmSandbox::new(WasmConfig {
            cache_dir: Some(dir),
        })
        .expect("wasm backend")
    })
}

pub fn job(code: &str) -> Job {
    Job {
        language: "javascript".into(),
        argv: vec!["/usr/bin/node".into(), "main.js".into()],
        program_argv: vec!["main.js".into()],
        files: vec![JobFile {
            path: "main.js".into(),
            content: code.as_bytes().to_vec(),
        }],
        limits: Limits {
            timeout_ms: 10_000,
            memory_mb: 128,
            ..Limits::default()
        },
        ..Job::default()
    }
}

pub async fn run(job: Job) -> Outcome {
    sandbox().run(job).await.expect("backend ran the job")
}
