//! Integration tests of the wasm backend: one binary, a module per topic. Every test runs real
//! JavaScript in the real QuickJS guest through `Sandbox::run`.

mod common;

use std::sync::Arc;

use common::{job, run, sandbox};
use gearbox_core::{JobFile, Outcome, Sandbox, Status};
use gearbox_wasm::{WasmConfig, WasmSandbox};

async fn js(code: &str) -> Outcome {
    run(job(code)).await
}

mod outputs {
    use super::*;

    #[tokio::test]
    async fn console_log_reaches_stdout() {
        let o = js("console.log(1 + 1); console.log('a', 'b', {x: [1, 2]}, null, undefined)").await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.exit_code, Some(0));
        assert_eq!(o.stdout, "2\na b { x: [ 1, 2 ] } null undefined\n");
        assert_eq!(o.stderr, "");
        assert_eq!(o.backend, "wasm");
        assert_eq!(o.language, "javascript");
    }

    #[tokio::test]
    async fn console_error_and_warn_reach_stderr() {
        let o = js("console.error('bad'); console.warn('careful'); console.info('fine')").await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "fine\n");
        assert_eq!(o.stderr, "bad\ncareful\n");
    }

    #[tokio::test]
    async fn stdin_args_and_env_are_visible() {
        let mut j = job(
            "console.log(readStdin().toUpperCase(), scriptArgs.slice(1).join(','), process.argv.length, process.env.GREETING)",
        );
        j.stdin = b"hello".to_vec();
        j.argv.extend(["x".to_string(), "y".to_string()]);
        j.program_argv.extend(["x".to_string(), "y".to_string()]);
        j.env.insert("GREETING".into(), "hi".into());
        let o = run(j).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "HELLO x,y 4 hi\n");
    }

    #[tokio::test]
    async fn timers_and_promises_run_to_completion() {
        let o = js(r#"
            setTimeout(() => console.log("late"), 50);
            setTimeout(() => console.log("early"), 10);
            await new Promise((r) => setTimeout(r, 20));
            console.log("awaited");
            Promise.resolve().then(() => console.log("micro"));
        "#)
        .await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "early\nawaited\nmicro\nlate\n");
    }

    #[tokio::test]
    async fn es_modules_run() {
        let o =
            js("export const x = 1; const y = await Promise.resolve(41); console.log(x + y)").await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "42\n");
    }

    #[tokio::test]
    async fn plain_scripts_are_sloppy_and_may_use_dynamic_import() {
        // Not a module: an undeclared assignment works, as in node.
        let o = js("x = 5; console.log(x, typeof import('./nope.js').catch(() => {}))").await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "5 object\n");
    }

    #[tokio::test]
    async fn extra_files_are_importable_and_read_only() {
        let mut j = job("import { add } from './lib/math.js'; console.log(add(2, 3));");
        j.files.push(JobFile {
            path: "lib/math.js".into(),
            content: b"export function add(a, b) { return a + b; }".to_vec(),
        });
        let o = run(j).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "5\n");
    }
}

mod errors {
    use super::*;

    #[tokio::test]
    async fn uncaught_exception_is_an_error_with_message_and_stack() {
        let o = js("function inner() { throw new TypeError('boom'); }\nfunction outer() { inner(); }\nouter();").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert_eq!(o.exit_code, Some(1));
        assert!(
            o.stderr.contains("Uncaught TypeError: boom"),
            "{}",
            o.stderr
        );
        assert!(o.stderr.contains("at inner (main.js:1"), "{}", o.stderr);
        assert!(o.stderr.contains("at outer (main.js:2"), "{}", o.stderr);
    }

    #[tokio::test]
    async fn syntax_error_is_an_error() {
        let o = js("let = ;").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert!(o.stderr.contains("SyntaxError"), "{}", o.stderr);
    }

    #[tokio::test]
    async fn thrown_non_errors_are_reported() {
        let o = js("throw {code: 7}").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert!(o.stderr.contains("Uncaught { code: 7 }"), "{}", o.stderr);
    }

    #[tokio::test]
    async fn unhandled_rejection_is_an_error() {
        let o = js("console.log('before'); Promise.reject(new Error('nope'));").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert_eq!(o.stdout, "before\n");
        assert!(
            o.stderr.contains("Uncaught (in promise) Error: nope"),
            "{}",
            o.stderr
        );
    }

    #[tokio::test]
    async fn async_function_rejection_is_an_error() {
        let o = js("async function f() { await null; throw new RangeError('late'); } f();").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert!(o.stderr.contains("RangeError: late"), "{}", o.stderr);
    }

    #[tokio::test]
    async fn handled_rejection_is_fine() {
        let o = js("const p = Promise.reject(new Error('x')); p.catch(e => console.log('caught', e.message));").await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "caught x\n");
    }

    #[tokio::test]
    async fn top_level_await_rejection_is_an_error() {
        let o = js("await Promise.reject(new Error('tla'));").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert!(o.stderr.contains("Error: tla"), "{}", o.stderr);
    }
}

mod exit_codes {
    use super::*;

    #[tokio::test]
    async fn process_exit_sets_the_code_and_keeps_output() {
        let o = js("console.log('out'); process.exit(3); console.log('never')").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert_eq!(o.exit_code, Some(3));
        assert_eq!(o.stdout, "out\n");
    }

    #[tokio::test]
    async fn process_exit_zero_is_ok() {
        let o = js("process.exit(0)").await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.exit_code, Some(0));
    }

    #[tokio::test]
    async fn exit_code_property_is_honoured() {
        let o = js("process.exitCode = 5").await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert_eq!(o.exit_code, Some(5));
    }
}

mod limits {
    use super::*;

    #[tokio::test]
    async fn infinite_loop_times_out() {
        let mut j = job("console.log('start'); for (;;) {}");
        j.limits.timeout_ms = 300;
        let t = std::time::Instant::now();
        let o = run(j).await;
        assert_eq!(o.status, Status::Timeout, "{o:?}");
        assert_eq!(o.stdout, "start\n", "output before the deadline is kept");
        assert!(t.elapsed().as_millis() < 2_000, "took {:?}", t.elapsed());
        assert!(
            o.reason.as_deref().unwrap_or("").contains("300 ms"),
            "{o:?}"
        );
    }

    #[tokio::test]
    async fn infinite_interval_times_out() {
        let mut j = job("setInterval(() => {}, 1)");
        j.limits.timeout_ms = 300;
        let o = run(j).await;
        assert_eq!(o.status, Status::Timeout, "{o:?}");
    }

    #[tokio::test]
    async fn memory_bomb_is_killed() {
        let mut j = job("const a = []; for (;;) a.push(new Array(100000).fill(1.5));");
        j.limits.memory_mb = 64;
        let o = run(j).await;
        assert_eq!(o.status, Status::Killed, "{o:?}");
        assert!(
            o.reason.as_deref().unwrap_or("").contains("64 MiB"),
            "{o:?}"
        );
    }

    #[tokio::test]
    async fn one_big_allocation_is_killed() {
        let mut j = job("const b = new ArrayBuffer(1024 * 1024 * 1024); console.log(b.byteLength)");
        j.limits.memory_mb = 64;
        let o = run(j).await;
        assert_eq!(o.status, Status::Killed, "{o:?}");
    }

    #[tokio::test]
    async fn output_flood_is_truncated() {
        let mut j = job(
            "for (let i = 0; i < 100000; i++) console.log('0123456789'); console.error('done')",
        );
        j.limits.output_bytes = 1000;
        let o = run(j).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert!(o.stdout_truncated);
        assert!(!o.stderr_truncated);
        assert!(o.stdout.starts_with("0123456789\n"));
        assert!(
            o.stdout
                .contains("[gearbox: output truncated, 1099000 more bytes not shown]"),
            "{}",
            &o.stdout[o.stdout.len() - 80..]
        );
        assert_eq!(o.stderr, "done\n");
    }

    #[tokio::test]
    async fn deep_recursion_is_an_error_not_a_crash() {
        let o =
            js("function f(n) { return n === 0 ? 0 : 1 + f(n - 1); } console.log('go'); f(1e7);")
                .await;
        assert_eq!(o.status, Status::Error, "{o:?}");
        assert_eq!(o.stdout, "go\n");
        assert!(
            o.reason.as_deref().unwrap_or("").contains("recursion"),
            "{o:?}"
        );
        // The backend still works afterwards.
        let again = js("console.log('alive')").await;
        assert_eq!(again.stdout, "alive\n");
    }

    #[tokio::test]
    async fn dropping_the_future_stops_the_run() {
        let mut j = job("for (;;) {}");
        j.limits.timeout_ms = 60_000;
        let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let c = cancel.clone();
        let handle = std::thread::spawn(move || sandbox().run_blocking(&j, c));
        std::thread::sleep(std::time::Duration::from_millis(100));
        cancel.store(true, std::sync::atomic::Ordering::Release);
        let t = std::time::Instant::now();
        let o = handle.join().expect("run thread");
        assert_eq!(o.status, Status::Timeout, "{o:?}");
        assert!(t.elapsed().as_millis() < 1_000);

        // And through the future: a timeout on the future drops it.
        let mut j = job("for (;;) {}");
        j.limits.timeout_ms = 60_000;
        let r = tokio::time::timeout(std::time::Duration::from_millis(100), sandbox().run(j)).await;
        assert!(r.is_err(), "the run cannot finish by itself");
    }
}

mod containment {
    use super::*;

    #[tokio::test]
    async fn std_and_os_modules_are_absent() {
        for code in [
            "import * as std from 'std'; console.log(typeof std.open)",
            "import * as os from 'os'; console.log(typeof os.exec)",
        ] {
            let o = js(code).await;
            assert_eq!(o.status, Status::Error, "{code}: {o:?}");
            assert!(o.stdout.is_empty(), "{code}: {o:?}");
        }
    }

    #[tokio::test]
    async fn no_host_apis_exist() {
        let o = js(r#"
            const names = ["require", "fetch", "XMLHttpRequest", "WebSocket", "std", "os", "Deno", "Bun"];
            console.log(names.filter((n) => typeof globalThis[n] !== "undefined").join(",") || "none");
            console.log(typeof process.binding, typeof process.dlopen);
        "#)
        .await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "none\nundefined undefined\n");
    }

    #[tokio::test]
    async fn filesystem_is_unreachable_without_files() {
        let o = js(
            "import('/etc/passwd').then(() => console.log('read!'), (e) => console.log('refused'))",
        )
        .await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "refused\n");
    }

    #[tokio::test]
    async fn workspace_does_not_reach_outside() {
        let mut j = job(
            "import('../../../../etc/passwd').then(() => console.log('read!'), () => console.log('refused'))",
        );
        j.files.push(JobFile {
            path: "data.txt".into(),
            content: b"x".to_vec(),
        });
        let o = run(j).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "refused\n");
    }
}

mod concurrency {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn fifty_concurrent_runs_get_their_own_output() {
        let runs = (0..50).map(|i| {
            tokio::spawn(async move {
                let code = format!(
                    "for (let k = 0; k < 20; k++) console.log('run-{i}-' + k); console.error('err-{i}')"
                );
                (i, sandbox().run(job(&code)).await.expect("run"))
            })
        });
        for r in runs.collect::<Vec<_>>() {
            let (i, o) = r.await.expect("task");
            assert_eq!(o.status, Status::Ok, "{o:?}");
            let want: String = (0..20).map(|k| format!("run-{i}-{k}\n")).collect();
            assert_eq!(o.stdout, want);
            assert_eq!(o.stderr, format!("err-{i}\n"));
        }
    }
}

/// Instances come from wasmtime's pooling allocator: slots reused from run to run.
mod reused_slots {
    use super::*;

    /// A run leaves globals, a module-scope binding, a prototype change and a large buffer
    /// behind; the next runs, served by the slot it freed, find none of it and memory no
    /// bigger than a fresh run's.
    #[tokio::test]
    async fn a_run_finds_nothing_of_the_run_before() {
        let fresh = js("console.log('x')").await;
        let leave = js("globalThis.left = 'secret-1'; var v = 'secret-2'; \
             Object.prototype.leak = 'secret-3'; Array.prototype.extra = () => 1; \
             globalThis.big = new Uint8Array(64 << 20).fill(7); console.log(big[12345])")
        .await;
        assert_eq!(
            (leave.status, leave.stdout.as_str()),
            (Status::Ok, "7\n"),
            "{leave:?}"
        );
        for _ in 0..3 {
            let o =
                js("console.log(typeof left, typeof v, ({}).leak, typeof big, typeof [].extra)")
                    .await;
            assert_eq!(
                (o.status, o.stdout.as_str()),
                (
                    Status::Ok,
                    "undefined undefined undefined undefined undefined\n"
                ),
                "{o:?}"
            );
            let (peak, base) = (o.usage.peak_memory_kb, fresh.usage.peak_memory_kb);
            assert!(
                peak <= base,
                "peak {peak:?} KiB after a big run, {base:?} fresh"
            );
        }
    }

    /// More runs at once than the pool has slots: the ones beyond wait for a slot instead of
    /// failing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn more_runs_at_once_than_slots_all_run() {
        let n = gearbox_wasm::INSTANCE_SLOTS as usize + 16;
        let runs: Vec<_> = (0..n)
            .map(|i| {
                tokio::spawn(async move {
                    let code = format!(
                        "let t = Date.now(); while (Date.now() - t < 50); console.log({i})"
                    );
                    (i, sandbox().run(job(&code)).await.expect("run"))
                })
            })
            .collect();
        for r in runs {
            let (i, o) = r.await.expect("task");
            assert_eq!(
                (o.status, o.stdout.clone()),
                (Status::Ok, format!("{i}\n")),
                "{o:?}"
            );
        }
    }
}

/// Runs start from a snapshot of the guest with QuickJS set up (`src/snapshot.rs`).
mod snapshot {
    use super::*;

    #[test]
    fn the_guest_runs_from_a_snapshot() {
        assert_eq!(sandbox().snapshot(), Ok(()));
    }

    fn numbers(o: &Outcome) -> Vec<f64> {
        assert_eq!(o.status, Status::Ok, "{o:?}");
        o.stdout
            .split_whitespace()
            .map(|w| w.parse().expect("a number"))
            .collect()
    }

    /// QuickJS seeds `Math.random` when the context is made, which for a snapshot is once:
    /// every run must draw its own sequence all the same.
    #[tokio::test]
    async fn each_run_draws_its_own_random_numbers() {
        let code = "console.log(Math.random(), Math.random(), Math.random())";
        let a = numbers(&js(code).await);
        let b = numbers(&js(code).await);
        assert_eq!(a.len(), 3);
        assert!(
            a.iter().chain(&b).all(|x| (0.0..1.0).contains(x)),
            "{a:?} {b:?}"
        );
        assert_ne!(a, b, "two runs drew the same numbers");
        assert_ne!(a[0], a[1]);
    }

    /// `performance` counts from the run's start, not from when the snapshot was taken.
    #[tokio::test]
    async fn performance_counts_from_the_run_start() {
        sandbox();
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let t = numbers(
            &js("console.log(performance.now(), Date.now() - performance.timeOrigin)").await,
        );
        assert!(t[0] >= 0.0 && t[0] < 1000.0, "performance.now() = {}", t[0]);
        assert!(
            t[1] > -50.0 && t[1] < 1000.0,
            "since timeOrigin: {} ms",
            t[1]
        );
    }

    /// A run that replaces what the snapshot holds (the prelude's console, Math, the global
    /// object's builtins) leaves the next run the snapshot's own.
    #[tokio::test]
    async fn a_run_that_replaces_builtins_leaves_the_next_run_untouched() {
        let spoil = js(
            "console.log('spoiling'); globalThis.console = { log() {} }; \
             Math.random = () => 0.5; JSON.stringify = () => 'forged'; \
             performance.now = () => -1; delete globalThis.Promise",
        )
        .await;
        assert_eq!(spoil.stdout, "spoiling\n", "{spoil:?}");
        for _ in 0..3 {
            let o = js(
                "console.log(JSON.stringify({a: 1}), Math.random() !== 0.5, \
                 performance.now() >= 0, typeof Promise)",
            )
            .await;
            assert_eq!(o.stdout, "{\"a\":1} true true function\n", "{o:?}");
        }
    }

    /// A guest without the snapshot export still runs, as it is (with its prelude
    /// precompiled), and says why there is no snapshot.
    #[tokio::test]
    async fn a_guest_without_the_snapshot_export_runs_as_it_is() {
        let mut wasm = gearbox_wasm::module::GUEST_WASM.to_vec();
        let (from, to) = (b"gearbox_snapshot", b"gearbox_snapshoX");
        let mut renamed = 0;
        for i in 0..wasm.len() - from.len() {
            if &wasm[i..i + from.len()] == from {
                wasm[i..i + from.len()].copy_from_slice(to);
                renamed += 1;
            }
        }
        assert!(renamed > 0);
        let dir = std::env::temp_dir().join("gearbox-wasm-test-cache");
        let sb = WasmSandbox::with_module_bytes(
            WasmConfig {
                cache_dir: Some(dir),
            },
            &wasm,
        )
        .expect("the backend builds without a snapshot");
        let why = sb.snapshot().expect_err("no snapshot without the export");
        assert!(why.contains("gearbox_snapshot"), "{why}");
        let code = "console.log(Math.random(), typeof process.env, 6 * 7)";
        let a = sb.run(job(code)).await.expect("run");
        let b = sb.run(job(code)).await.expect("run");
        assert_eq!(a.status, Status::Ok, "{a:?}");
        assert!(a.stdout.ends_with(" object 42\n"), "{a:?}");
        assert_ne!(a.stdout, b.stdout);
    }
}

mod unicode {
    use super::*;

    #[tokio::test]
    async fn unicode_round_trips() {
        let mut j = job(
            "console.log('héllo wörld ✓ 日本語 🦀', readStdin(), [...'🦀'].length, '🦀'.length)",
        );
        j.stdin = "ünïcödé 🎉".as_bytes().to_vec();
        let o = run(j).await;
        assert_eq!(o.status, Status::Ok, "{o:?}");
        assert_eq!(o.stdout, "héllo wörld ✓ 日本語 🦀 ünïcödé 🎉 1 2\n");
    }

    #[tokio::test]
    async fn truncation_never_splits_a_character() {
        let mut j = job("console.log('é'.repeat(100))");
        j.limits.output_bytes = 11;
        let o = run(j).await;
        assert!(o.stdout_truncated);
        assert!(o.stdout.starts_with("ééééé\n[gearbox"), "{:?}", o.stdout);
    }
}
