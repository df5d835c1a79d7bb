//! gearbox's QuickJS guest: a WASI command that runs one JavaScript program and exits.
//!
//! Usage (argv as the host passes it):
//!
//! ```text
//! quickjs [--module|--script] [--eval CODE] NAME [ARGS...]
//! ```
//!
//! - With `--eval CODE`, CODE is the program and NAME only names it in stack traces. This is how
//!   gearbox's host passes code when the call has no extra files: nothing touches a filesystem.
//! - Without `--eval`, NAME is read through WASI from the preopened directory (gearbox preopens a
//!   private workspace only when the call brings extra files); relative `import`s resolve there.
//! - `--module`/`--script` force the kind; otherwise a `.mjs` NAME or source with a line
//!   starting with `import`/`export` (or using `import.meta`) runs as an ES module, anything
//!   else as a sloppy-mode script. Both allow top-level `await`.
//! - `--prelude-bytecode HEX` gives prelude.js precompiled by `quickjs --emit-prelude` (the host
//!   does this once per process); without it the prelude is parsed in every run.
//! - The export `gearbox_snapshot` builds the runtime, the context and the prelude ahead of any
//!   run. The host calls it once, takes the instance's linear memory as the initial memory of a
//!   new module (a snapshot, like wizer's) and runs `_start` of that module for every call, so
//!   no run pays for the engine's set-up. What a context fixes at creation from the clock
//!   (`Math.random`'s seed, `performance`'s time origin) is made afresh in every run
//!   ([`per_run_state`]), so runs of one snapshot share nothing but the engine's initial state.
//! - The program's stdin is WASI stdin (read with `readStdin()`); ARGS become `scriptArgs[1..]`
//!   and `process.argv[2..]`; WASI environment variables become `process.env`.
//!
//! Globals: `console.*` (stdout for log/info/debug, stderr for error/warn/trace), `process.exit`,
//! `process.exitCode`, `process.argv`, `process.env`, `process.stdout.write`, `scriptArgs`,
//! `readStdin()`, and `setTimeout`/`setInterval` on virtual time (see prelude.js). There is no
//! `std` or `os` module: the guest has no file, network or process API beyond the above.
//!
//! Exit status: 0 when the program finishes; 1 after an uncaught exception or an unhandled
//! promise rejection (reported on stderr as `Uncaught <name>: <message>` plus the stack); 2 for
//! a usage error; `n` for `process.exit(n)`; `process.exitCode` otherwise.

use std::cell::RefCell;
use std::io::{Read, Write};
use std::rc::Rc;

use rquickjs::context::EvalOptions;
use rquickjs::function::Func;
use rquickjs::loader::{FileResolver, ScriptLoader};
use rquickjs::module::WriteOptions;
use rquickjs::{Context, Ctx, Function, Module, Object, Persistent, Promise, Runtime, Value};

const PRELUDE: &str = include_str!("prelude.js");

/// The runtime, context and prelude factory made by [`gearbox_snapshot`], taken by the run.
struct Warm {
    rt: Runtime,
    ctx: Context,
    factory: Persistent<Function<'static>>,
}

thread_local! {
    static WARM: RefCell<Option<Warm>> = const { RefCell::new(None) };
}

/// Called by the host once, before it snapshots linear memory (see the module docs). A failure
/// traps, and the host then runs this module as it is.
#[unsafe(export_name = "gearbox_snapshot")]
pub extern "C" fn gearbox_snapshot() {
    match warm_up() {
        Ok(w) => WARM.with(|c| *c.borrow_mut() = Some(w)),
        Err(e) => {
            eprintln!("quickjs: preparing the snapshot: {e}");
            std::process::abort()
        }
    }
}

fn warm_up() -> Result<Warm, String> {
    let (rt, ctx) = new_engine()?;
    let factory = ctx.with(|ctx| -> Result<_, String> {
        let f = prelude_from_source(&ctx).map_err(|e| format!("prelude: {e}"))?;
        Ok(Persistent::save(&ctx, f))
    })?;
    Ok(Warm { rt, ctx, factory })
}

/// A QuickJS runtime and a context with every intrinsic.
fn new_engine() -> Result<(Runtime, Context), String> {
    let rt = Runtime::new().map_err(|e| format!("creating the runtime: {e}"))?;
    let ctx = Context::full(&rt).map_err(|e| format!("creating the context: {e}"))?;
    Ok((rt, ctx))
}

/// prelude.js parsed and evaluated: its default export, the factory.
fn prelude_from_source<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Function<'js>> {
    Module::declare(ctx.clone(), "gearbox:prelude", prelude_module_source())
        .and_then(|m| m.eval())
        .and_then(|(m, _)| m.get("default"))
}

/// Exit status after an uncaught exception or an unhandled rejection.
const EXIT_UNCAUGHT: i32 = 1;
/// Exit status for a bad command line or an unreadable program.
const EXIT_USAGE: i32 = 2;

struct Args {
    /// QuickJS bytecode of prelude.js (hex), made by `--emit-prelude` of this same module.
    prelude: Option<Vec<u8>>,
    module: Option<bool>,
    code: Option<String>,
    name: String,
    rest: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut module = None;
    let mut code = None;
    let mut prelude = None;
    loop {
        let a = it
            .next()
            .ok_or("usage: quickjs [--module|--script] [--eval CODE] NAME [ARGS...]")?;
        match a.as_str() {
            "--module" => module = Some(true),
            "--script" => module = Some(false),
            "--eval" => code = Some(it.next().ok_or("--eval needs the code")?),
            "--prelude-bytecode" => {
                let hex = it.next().ok_or("--prelude-bytecode needs the bytes")?;
                prelude = Some(from_hex(&hex).ok_or("--prelude-bytecode: bad hex")?);
            }
            "--emit-prelude" => exit(emit_prelude()),
            _ => {
                return Ok(Args {
                    prelude,
                    module,
                    code,
                    name: a,
                    rest: it.collect(),
                });
            }
        }
    }
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(*p.get(1)?)?))
        .collect()
}

/// prelude.js as an ES module whose default export is the factory.
fn prelude_module_source() -> String {
    format!("export default {PRELUDE}")
}

/// Write prelude.js compiled to QuickJS bytecode, in hex, to stdout. The host does this once
/// per process and passes the result to every run with `--prelude-bytecode`: loading bytecode
/// costs far less than parsing the source again in every run.
fn emit_prelude() -> i32 {
    let result = (|| -> Result<Vec<u8>, String> {
        let (_rt, ctx) = new_engine()?;
        ctx.with(|ctx| {
            let m = Module::declare(ctx.clone(), "gearbox:prelude", prelude_module_source())
                .map_err(|e| e.to_string())?;
            m.write(WriteOptions::default()).map_err(|e| e.to_string())
        })
    })();
    match result {
        Ok(bytes) => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_fd(1, &hex);
            0
        }
        Err(e) => {
            eprintln!("quickjs: compiling the prelude: {e}");
            EXIT_UNCAUGHT
        }
    }
}

fn write_fd(fd: i32, s: &str) {
    // Unbuffered, so output printed before a deadline or a trap is never lost. A closed or
    // full pipe is not the program's problem: drop the bytes.
    let _ = if fd == 2 {
        std::io::stderr().write_all(s.as_bytes())
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(s.as_bytes()).and_then(|()| out.flush())
    };
}

fn exit(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("quickjs: {e}");
            exit(EXIT_USAGE)
        }
    };
    let code = match args.code.take_or_read(&args.name) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("quickjs: cannot read {}: {e}", args.name);
            exit(EXIT_USAGE)
        }
    };
    let status = match run(&args, code) {
        Ok(status) => status,
        Err(e) => {
            eprintln!("quickjs: {e}");
            EXIT_UNCAUGHT
        }
    };
    exit(status)
}

trait TakeOrRead {
    fn take_or_read(&self, name: &str) -> std::io::Result<String>;
}

impl TakeOrRead for Option<String> {
    fn take_or_read(&self, name: &str) -> std::io::Result<String> {
        match self {
            Some(c) => Ok(c.clone()),
            None => std::fs::read_to_string(name),
        }
    }
}

fn is_module(args: &Args, code: &str) -> bool {
    if let Some(m) = args.module {
        return m;
    }
    if args.name.ends_with(".mjs") {
        return true;
    }
    if args.name.ends_with(".cjs") {
        return false;
    }
    looks_like_module(code)
}

/// Whether `code` has a line starting with an `import`/`export` statement or uses
/// `import.meta`. (QuickJS's `JS_DetectModule` calls anything that compiles as a module a
/// module, which would run sloppy scripts such as `x = 1` in strict mode.)
fn looks_like_module(code: &str) -> bool {
    code.contains("import.meta")
        || code.lines().any(|line| {
            let l = line.trim_start();
            let after = |kw: &str| l.strip_prefix(kw).and_then(|r| r.chars().next());
            matches!(after("export"), Some(c) if c.is_whitespace() || c == '{' || c == '*')
                || matches!(after("import"), Some(c) if c.is_whitespace() || c == '{' || c == '*' || c == '"' || c == '\'')
                    && !l["import".len()..].trim_start().starts_with('(')
        })
}

type Rejections = Rc<RefCell<Vec<(Persistent<Value<'static>>, Persistent<Value<'static>>)>>>;

fn run(args: &Args, code: String) -> Result<i32, String> {
    let (rt, ctx, factory) = match WARM.with(|c| c.borrow_mut().take()) {
        Some(w) => (w.rt, w.ctx, Some(w.factory)),
        None => {
            let (rt, ctx) = new_engine()?;
            (rt, ctx, None)
        }
    };
    if args.code.is_none() {
        // Relative imports resolve in the preopened workspace.
        rt.set_loader(
            FileResolver::default().with_path("."),
            ScriptLoader::default().with_extension("mjs"),
        );
    }

    // Promises rejected with no handler (yet). An entry is removed when a handler is attached
    // later; what is left when the program finishes is reported.
    let rejections: Rejections = Rc::new(RefCell::new(Vec::new()));
    {
        let rejections = rejections.clone();
        rt.set_host_promise_rejection_tracker(Some(Box::new(
            move |ctx: Ctx<'_>, promise: Value<'_>, reason: Value<'_>, handled: bool| {
                let mut list = rejections.borrow_mut();
                if handled {
                    list.retain(|(p, _)| {
                        p.clone()
                            .restore(&ctx)
                            .map(|p| p != promise)
                            .unwrap_or(true)
                    });
                } else {
                    list.push((
                        Persistent::save(&ctx, promise),
                        Persistent::save(&ctx, reason),
                    ));
                }
            },
        )));
    }

    let module = is_module(args, &code);
    let status = ctx.with(|ctx| -> Result<i32, String> {
        per_run_state(&ctx)?;
        let hooks = install_prelude(&ctx, args, factory)?;
        let report = |v| report(&hooks, v);

        // Evaluate the program. Both paths yield a promise (top-level await is allowed).
        let evaluated: Result<Promise, rquickjs::Error> = if module {
            Module::declare(ctx.clone(), args.name.clone(), code)
                .and_then(|m| m.eval())
                .map(|(_, p)| p)
        } else {
            let mut opts = EvalOptions::default();
            opts.strict = false;
            opts.promise = true;
            opts.filename = Some(args.name.clone());
            ctx.eval_with_options(code, opts)
        };
        let main = match evaluated {
            Ok(p) => p,
            Err(rquickjs::Error::Exception) => {
                write_fd(2, &(report(ctx.catch()) + "\n"));
                return Ok(EXIT_UNCAUGHT);
            }
            Err(e) => return Err(e.to_string()),
        };

        // The event loop: drain jobs, then fire the next (virtual) timer, until neither is left
        // or the main promise rejected.
        let run_next_timer: Function = hooks.get("runNextTimer").map_err(|e| e.to_string())?;
        loop {
            while ctx.execute_pending_job() {}
            if main.state() == rquickjs::promise::PromiseState::Rejected {
                break;
            }
            if !rejections.borrow().is_empty() {
                break;
            }
            match run_next_timer.call::<_, bool>(()) {
                Ok(true) => {}
                Ok(false) => break,
                Err(rquickjs::Error::Exception) => {
                    write_fd(2, &(report(ctx.catch()) + "\n"));
                    return Ok(EXIT_UNCAUGHT);
                }
                Err(e) => return Err(e.to_string()),
            }
        }

        if main.state() == rquickjs::promise::PromiseState::Rejected {
            let reason = match main.result::<Value>() {
                Some(Err(rquickjs::Error::Exception)) => ctx.catch(),
                Some(Ok(v)) => v,
                _ => Value::new_undefined(ctx.clone()),
            };
            write_fd(2, &(report(reason) + "\n"));
            return Ok(EXIT_UNCAUGHT);
        }
        let leftover: Vec<_> = rejections.borrow_mut().drain(..).collect();
        if let Some((_, reason)) = leftover.into_iter().next() {
            let reason = reason
                .restore(&ctx)
                .unwrap_or_else(|_| Value::new_undefined(ctx.clone()));
            let text = report(reason).replacen("Uncaught ", "Uncaught (in promise) ", 1);
            write_fd(2, &(text + "\n"));
            return Ok(EXIT_UNCAUGHT);
        }
        let code: i32 = hooks
            .get::<_, Function>("exitCode")
            .and_then(|f| f.call(()))
            .unwrap_or(0);
        Ok(code)
    });
    // The process ends with the run: freeing every object, atom and shape (and a last garbage
    // collection) would only cost time, and the host discards the instance's memory anyway.
    std::mem::forget(ctx);
    std::mem::forget(rt);
    status
}

/// The text reported for an uncaught exception or rejection `v`.
fn report<'js>(hooks: &Object<'js>, v: Value<'js>) -> String {
    hooks
        .get::<_, Function>("report")
        .and_then(|f| f.call::<_, String>((v,)))
        .unwrap_or_else(|_| "Uncaught exception".to_string())
}

/// Give this run its own `Math.random` (seeded from WASI's random source) and its own
/// `performance` (time origin now). QuickJS fixes both when the context is made, which for a
/// snapshot is before the host serves any run.
fn per_run_state(ctx: &Ctx<'_>) -> Result<(), String> {
    let err = |e: rquickjs::Error| format!("setting up the run: {e}");
    let mut seed = [0u8; 8];
    // SAFETY: `seed` is 8 writable bytes; random_get writes at most that many.
    let rc = unsafe { wasi_random_get(seed.as_mut_ptr(), seed.len()) };
    if rc != 0 {
        return Err(format!("setting up the run: random_get failed ({rc})"));
    }
    let state = std::cell::Cell::new(u64::from_le_bytes(seed).max(1));
    // QuickJS's own generator (xorshift64*, 52 bits into [0, 1)), on a per-run seed.
    let random = Func::from(move || -> f64 {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        f64::from_bits((0x3ff << 52) | (v >> 12)) - 1.0
    });
    let math: Object = ctx.globals().get("Math").map_err(err)?;
    math.set("random", random).map_err(err)?;

    let origin = std::time::Instant::now();
    let origin_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0);
    let performance = Object::new(ctx.clone()).map_err(err)?;
    let now = Func::from(move || -> f64 { origin.elapsed().as_secs_f64() * 1e3 });
    performance
        .prop(
            "now",
            rquickjs::object::Property::from(now)
                .enumerable()
                .writable()
                .configurable(),
        )
        .map_err(err)?;
    performance
        .prop(
            "timeOrigin",
            rquickjs::object::Property::from(origin_ms).enumerable(),
        )
        .map_err(err)?;
    ctx.globals().set("performance", performance).map_err(err)?;
    Ok(())
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
unsafe extern "C" {
    #[link_name = "random_get"]
    fn wasi_random_get(buf: *mut u8, len: usize) -> u16;
}

/// Evaluate prelude.js (or take the snapshot's) and call it with the native functions;
/// returns its hooks object.
fn install_prelude<'js>(
    ctx: &Ctx<'js>,
    args: &Args,
    warm: Option<Persistent<Function<'static>>>,
) -> Result<Object<'js>, String> {
    let factory: Function = match (warm, &args.prelude) {
        (Some(f), _) => f
            .restore(ctx)
            .map_err(|e| format!("prelude from the snapshot: {e}"))?,
        (None, Some(bytes)) => {
            // The module keeps pointers into its bytecode (JS_READ_OBJ_ROM_DATA): leak it, the
            // process ends with the run anyway.
            let bytes: &'static [u8] = Box::leak(bytes.clone().into_boxed_slice());
            // SAFETY: the bytes are bytecode this very module wrote with `--emit-prelude` (the
            // host never passes anything else), and they live for the rest of the process.
            let m = unsafe { Module::load(ctx.clone(), bytes) };
            m.and_then(|m| m.eval())
                .and_then(|(m, _)| m.get("default"))
                .map_err(|e| format!("prelude bytecode: {e}"))?
        }
        (None, None) => prelude_from_source(ctx).map_err(|e| format!("prelude: {e}"))?,
    };
    let write = Func::from(|fd: i32, s: rquickjs::String<'_>| {
        if let Ok(s) = s.to_string() {
            write_fd(fd, &s);
        }
    });
    let exit_fn = Func::from(|code: i32| -> () { exit(code) });
    let read_stdin = Func::from(|| -> String {
        let mut buf = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    });
    let mut argv = vec!["quickjs".to_string(), args.name.clone()];
    argv.extend(args.rest.iter().cloned());
    let env = Object::new(ctx.clone()).map_err(|e| e.to_string())?;
    for (k, v) in std::env::vars() {
        env.set(k, v).map_err(|e| e.to_string())?;
    }
    factory
        .call((write, exit_fn, read_stdin, argv, env))
        .map_err(|e| match e {
            rquickjs::Error::Exception => format!("prelude: {:?}", ctx.catch()),
            e => format!("prelude: {e}"),
        })
}
