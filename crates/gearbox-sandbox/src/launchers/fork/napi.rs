//! The Node-API entry: `node_zygote.js` loads the native loop with `process.dlopen` and calls
//! the functions below. Node-API's functions are looked up in the running process (dlsym), so
//! the same file also loads in Python, where they do not exist.

use std::ffi::{c_char, c_int, c_void};

use super::config::gb_config;
use super::entropy::fresh;
use super::message::{Fail, program_failed};
use super::serve::{Handed, gb_serve, set_name};
use super::sys::*;

type NapiEnv = *mut c_void;
type NapiValue = *mut c_void;
type NapiInfo = *mut c_void;
type NapiCallback = unsafe extern "C" fn(NapiEnv, NapiInfo) -> NapiValue;

/// The Node-API functions used here (`js_native_api.h`, `node_api.h`) and libuv's
/// `uv_loop_fork`, all exported by the node binary.
struct Napi {
    create_function: unsafe extern "C" fn(
        NapiEnv,
        *const c_char,
        usize,
        NapiCallback,
        *mut c_void,
        *mut NapiValue,
    ) -> c_int,
    set_named_property: unsafe extern "C" fn(NapiEnv, NapiValue, *const c_char, NapiValue) -> c_int,
    get_cb_info: unsafe extern "C" fn(
        NapiEnv,
        NapiInfo,
        *mut usize,
        *mut NapiValue,
        *mut NapiValue,
        *mut *mut c_void,
    ) -> c_int,
    get_value_int64: unsafe extern "C" fn(NapiEnv, NapiValue, *mut i64) -> c_int,
    create_int64: unsafe extern "C" fn(NapiEnv, i64, *mut NapiValue) -> c_int,
    create_array_with_length: unsafe extern "C" fn(NapiEnv, usize, *mut NapiValue) -> c_int,
    set_element: unsafe extern "C" fn(NapiEnv, NapiValue, u32, NapiValue) -> c_int,
    get_null: unsafe extern "C" fn(NapiEnv, *mut NapiValue) -> c_int,
    throw_error: unsafe extern "C" fn(NapiEnv, *const c_char, *const c_char) -> c_int,
    get_uv_event_loop: unsafe extern "C" fn(NapiEnv, *mut *mut c_void) -> c_int,
    uv_loop_fork: unsafe extern "C" fn(*mut c_void) -> c_int,
    /// `v8::Isolate::GetCurrent()`, `v8::Isolate::GetCurrentContext()` (a `Local` is one
    /// pointer), `node::GetCurrentEnvironment(Local<Context>)` and
    /// `node::AtExit(Environment*, void (*)(void*), void*)`: Node's C++ API, the only way to
    /// run code after Node has printed an uncaught exception and before it tears down its
    /// platform (whose threads a fork does not have).
    isolate_current: unsafe extern "C" fn() -> *mut c_void,
    isolate_context: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    current_environment: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    at_exit: unsafe extern "C" fn(*mut c_void, unsafe extern "C" fn(*mut c_void), *mut c_void),
    /// `node::GetMultiIsolatePlatform(Environment*)` and the two `NodePlatform` methods through which V8 hands work to the platform's
    /// worker threads (found in its vtable by address, see [`adopt_worker_tasks`]).
    platform_of: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    /// V8's generators, renewed in each program (see [`renew_v8`]):
    /// `v8::internal::Isolate::random_number_generator()`,
    /// `v8::base::RandomNumberGenerator::SetSeed(int64_t)`,
    /// `v8::base::OS::SetRandomMmapSeed(int64_t)` and
    /// `v8::internal::MathRandom::ResetContext(Context)` (a `Context` is one tagged pointer).
    isolate_rng: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    rng_set_seed: unsafe extern "C" fn(*mut c_void, i64),
    mmap_set_seed: unsafe extern "C" fn(i64),
    math_random_reset: unsafe extern "C" fn(usize),
    call_on_worker: *const c_void,
    call_delayed_on_worker: *const c_void,
}

// SAFETY: function addresses, read-only after they are found.
unsafe impl Sync for Napi {}
// SAFETY: as above: nothing in it is tied to the thread that found it.
unsafe impl Send for Napi {}

/// The function at `address`, as the function pointer type `F`.
///
/// # Safety
/// `address` is the address of a function whose C signature is `F`.
unsafe fn function<F: Copy>(address: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: `F` is a function pointer of the same size (checked above), and the caller
    // vouches for the signature.
    unsafe { std::mem::transmute_copy(&address) }
}

static NAPI: std::sync::OnceLock<Option<Napi>> = std::sync::OnceLock::new();

fn napi() -> Option<&'static Napi> {
    NAPI.get_or_init(|| {
        let find = |name: &std::ffi::CStr| {
            // SAFETY: dlsym with RTLD_DEFAULT (null) and a NUL-terminated name.
            let p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
            (!p.is_null()).then_some(p)
        };
        // SAFETY: each symbol is the Node-API (or libuv) function of that name, whose C
        // signature is the field's type.
        unsafe {
            Some(Napi {
                create_function: function(find(c"napi_create_function")?),
                set_named_property: function(find(c"napi_set_named_property")?),
                get_cb_info: function(find(c"napi_get_cb_info")?),
                get_value_int64: function(find(c"napi_get_value_int64")?),
                create_int64: function(find(c"napi_create_int64")?),
                create_array_with_length: function(find(
                    c"napi_create_array_with_length",
                )?),
                set_element: function(find(c"napi_set_element")?),
                get_null: function(find(c"napi_get_null")?),
                throw_error: function(find(c"napi_throw_error")?),
                get_uv_event_loop: function(find(c"napi_get_uv_event_loop")?),
                uv_loop_fork: function(find(c"uv_loop_fork")?),
                isolate_current: function(find(c"_ZN2v87Isolate10GetCurrentEv")?),
                isolate_context: function(find(c"_ZN2v87Isolate17GetCurrentContextEv")?),
                current_environment: function(find(
                    c"_ZN4node21GetCurrentEnvironmentEN2v85LocalINS0_7ContextEEE",
                )?),
                at_exit: function(find(c"_ZN4node6AtExitEPNS_11EnvironmentEPFvPvES2_")?),
                platform_of: function(find(
                    c"_ZN4node23GetMultiIsolatePlatformEPNS_11EnvironmentE",
                )?),
                isolate_rng: function(find(
                    c"_ZN2v88internal7Isolate23random_number_generatorEv",
                )?),
                rng_set_seed: function(find(
                    c"_ZN2v84base21RandomNumberGenerator7SetSeedEl",
                )?),
                mmap_set_seed: function(find(c"_ZN2v84base2OS17SetRandomMmapSeedEl")?),
                math_random_reset: function(find(
                    c"_ZN2v88internal10MathRandom12ResetContextENS0_7ContextE",
                )?),
                call_on_worker: find(
                    c"_ZN4node12NodePlatform18CallOnWorkerThreadESt10unique_ptrIN2v84TaskESt14default_deleteIS3_EE",
                )?,
                call_delayed_on_worker: find(
                    c"_ZN4node12NodePlatform25CallDelayedOnWorkerThreadESt10unique_ptrIN2v84TaskESt14default_deleteIS3_EEd",
                )?,
            })
        }
    })
    .as_ref()
}

/// The module's exports: `adopt`, `serve`, `handed`, `limits`, `exitCode` and `exit`.
///
/// # Safety
/// Called by Node with a valid environment and exports object.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn napi_register_module_v1(env: NapiEnv, exports: NapiValue) -> NapiValue {
    let Some(n) = napi() else {
        return exports;
    };
    let functions: [(&std::ffi::CStr, NapiCallback); 6] = [
        (c"adopt", node_adopt),
        (c"serve", node_serve),
        (c"handed", node_handed),
        (c"limits", node_limits),
        (c"exitCode", node_exit_code),
        (c"exit", node_exit),
    ];
    for (name, f) in functions {
        let mut value = std::ptr::null_mut();
        // SAFETY: Node-API calls on the environment Node passed in.
        unsafe {
            if (n.create_function)(
                env,
                name.as_ptr(),
                usize::MAX,
                f,
                std::ptr::null_mut(),
                &mut value,
            ) == 0
            {
                (n.set_named_property)(env, exports, name.as_ptr(), value);
            }
        }
    }
    exports
}

/// Up to four integer arguments of a call (missing or non-numbers are errors).
unsafe fn int_args<const N: usize>(env: NapiEnv, info: NapiInfo) -> Option<[i64; N]> {
    let n = napi()?;
    let mut argc = N;
    let mut argv = [std::ptr::null_mut(); N];
    let mut out = [0i64; N];
    // SAFETY: Node-API calls with buffers of N values on this frame.
    unsafe {
        if (n.get_cb_info)(
            env,
            info,
            &mut argc,
            argv.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        ) != 0
            || argc < N
        {
            return None;
        }
        for (v, o) in argv.iter().zip(out.iter_mut()) {
            if (n.get_value_int64)(env, *v, o) != 0 {
                return None;
            }
        }
    }
    Some(out)
}

unsafe fn throw(env: NapiEnv, message: &str) -> NapiValue {
    if let Some(n) = napi() {
        let text = std::ffi::CString::new(message.replace('\0', "")).unwrap_or_default();
        // SAFETY: throws a new Error in the calling environment.
        unsafe { (n.throw_error)(env, std::ptr::null(), text.as_ptr()) };
    }
    std::ptr::null_mut()
}

unsafe fn int_array(env: NapiEnv, values: &[i64]) -> NapiValue {
    let Some(n) = napi() else {
        return std::ptr::null_mut();
    };
    let mut array = std::ptr::null_mut();
    // SAFETY: Node-API calls on the calling environment.
    unsafe {
        (n.create_array_with_length)(env, values.len(), &mut array);
        for (i, v) in values.iter().enumerate() {
            let mut value = std::ptr::null_mut();
            (n.create_int64)(env, *v, &mut value);
            (n.set_element)(env, array, i as u32, value);
        }
    }
    array
}

/// This process's open fds (from /proc/self/fd), 3 and above.
fn open_fds() -> Vec<c_int> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd: &c_int| fd > 2)
        .collect()
}

/// Node's `Environment` of the calling thread (inside a Node-API call).
unsafe fn environment(n: &Napi) -> *mut c_void {
    // SAFETY: Node's C++ API on the calling thread, inside a call's handle scope.
    unsafe {
        let isolate = (n.isolate_current)();
        let context = (n.isolate_context)(isolate);
        (n.current_environment)(context)
    }
}

/// `adopt()`: from now on V8's worker tasks run on this file's pool (see [`Pool`]). Call
/// first, before the fork server runs anything.
unsafe extern "C" fn node_adopt(env: NapiEnv, _info: NapiInfo) -> NapiValue {
    let Some(n) = napi() else {
        return std::ptr::null_mut();
    };
    new_pool();
    // SAFETY: the calling thread's environment and its platform object.
    let adopted = unsafe {
        let environment = environment(n);
        !environment.is_null() && {
            let platform = (n.platform_of)(environment);
            !platform.is_null() && adopt_worker_tasks(n, platform)
        }
    };
    if !adopted {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "take over the platform's worker tasks") };
    }
    std::ptr::null_mut()
}

/// `serve(controlFd, diskMb, openFiles, cpuS)`: the fork server's loop. Returns `null` in the
/// fork server when the server closes the control socket; in a program, restricted, with a
/// fresh event loop and only its own fds, `[chan, pid, ppid]`.
unsafe extern "C" fn node_serve(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    let Some([control_fd, disk_mb, open_files, cpu_s]) = (unsafe { int_args::<4>(env, info) })
    else {
        // SAFETY: the calling environment.
        return unsafe {
            throw(
                env,
                "serve(controlFd, diskMb, openFiles, cpuS): four integers",
            )
        };
    };
    let Some(n) = napi() else {
        return std::ptr::null_mut();
    };
    // SAFETY: reads this process's files; the config lives as long as it.
    let config = unsafe {
        gb_config(
            control_fd as c_int,
            disk_mb as u64,
            open_files as u64,
            cpu_s as u64,
        )
    };
    if config.is_null() {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "read the seccomp filters") };
    }
    // Every fd this process has now is the fork server's: a program replaces those that are
    // still without close-on-exec after its event loop is rebuilt (Node and libuv open
    // theirs with it).
    for fd in open_fds() {
        // SAFETY: clears a flag of this process's own fd table entry.
        unsafe { fcntl(fd, F_SETFD, 0) };
    }
    // V8 maps its heap and code "do not copy on fork" (MADV_DONTFORK): a fork would have
    // none of it. The fork server runs no JavaScript from here on, so what is mapped now is
    // all a program needs.
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for range in maps.lines().filter_map(|l| l.split(' ').next()) {
            let mut ends = range.split('-').map(|x| usize::from_str_radix(x, 16));
            if let (Some(Ok(lo)), Some(Ok(hi))) = (ends.next(), ends.next()) {
                // SAFETY: changes only whether this process's own mapping is copied on fork
                // (errors, as for the kernel's special mappings, change nothing).
                unsafe { madvise(lo as *mut c_void, hi - lo, MADV_DOFORK) };
            }
        }
    }
    set_name(c"gb-zygote".as_ptr());
    // SAFETY: a signal disposition of this process.
    unsafe { signal(SIGCHLD, SIG_IGN) };
    quiesce();
    let mut handed = Handed { chan: -1 };
    // SAFETY: valid config and out; the other threads of Node (its platform's workers, all
    // idle: the fork server runs with --single-threaded) do not exist in the forks.
    let r = unsafe { gb_serve(config, &mut handed) };
    if r < 0 {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "install the fork server's seccomp filters") };
    }
    if r != 0 {
        let mut null = std::ptr::null_mut();
        // SAFETY: the calling environment.
        unsafe { (n.get_null)(env, &mut null) };
        return null;
    }
    // A program: worker tasks go to a pool of its own, and V8's generators start afresh.
    new_pool();
    // SAFETY: on the isolate's own thread, inside this call's handle scope.
    if let Err(fail) = unsafe { renew_v8(n) } {
        program_failed(handed.chan, fail);
    }
    // Its event loop's kernel objects (epoll, eventfd) are the fork server's: rebuild them,
    // then replace every fd it inherited. A step that fails is reported and ends the program
    // here: Node's own end would tear down a platform whose threads a fork lacks.
    let mut event_loop = std::ptr::null_mut();
    // SAFETY: the loop of the calling environment, on its own thread.
    let rebuilt = unsafe {
        (n.get_uv_event_loop)(env, &mut event_loop) == 0 && (n.uv_loop_fork)(event_loop) == 0
    };
    if !rebuilt {
        program_failed(handed.chan, Fail::new("rebuild the event loop", errno()));
    }
    // Every fd inherited from the fork server (those still without close-on-exec) now names
    // an eventfd of this program's own instead: Node's teardown still writes to its
    // platform's wake-up fd, which must not be the fork server's.
    // SAFETY: eventfd takes integers.
    let own = unsafe { eventfd(0, EFD_CLOEXEC) };
    if own < 0 {
        program_failed(handed.chan, Fail::new("create an eventfd", errno()));
    }
    for fd in open_fds() {
        // SAFETY: fcntl and dup2 on this process's own fds.
        unsafe {
            let flags = fcntl(fd, F_GETFD);
            if flags >= 0 && flags & FD_CLOEXEC == 0 && fd != handed.chan {
                dup3(own, fd, O_CLOEXEC);
            }
        }
    }
    // SAFETY: an fd of this process.
    unsafe { close(own) };
    // SAFETY: Node's C++ API on the calling thread, inside this call's handle scope.
    unsafe {
        let environment = environment(n);
        if environment.is_null() {
            program_failed(handed.chan, Fail::new("find the Node environment", ENOENT));
        }
        (n.at_exit)(environment, at_exit, std::ptr::null_mut());
    }
    // SAFETY: the calling environment; getpid and getppid take nothing.
    unsafe {
        int_array(
            env,
            &[handed.chan.into(), getpid().into(), getppid().into()],
        )
    }
}

/// Fresh seeds for V8's generators in a program: the isolate's generator (which seeds
/// `Math.random` in every context and V8's own randomized choices), the one behind the
/// addresses V8 asks for new memory at, and `Math.random`'s state and cache in the main
/// context, which refills from the isolate's generator on its next call.
unsafe fn renew_v8(n: &Napi) -> Result<(), Fail> {
    let seeds = fresh::<16>()?;
    let seed = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&seeds[i * 8..i * 8 + 8]);
        i64::from_ne_bytes(b)
    };
    // SAFETY: V8's functions on the calling thread's isolate and its current (native)
    // context; a `Local<Context>` points to the slot holding the context's tagged pointer.
    unsafe {
        let isolate = (n.isolate_current)();
        let rng = if isolate.is_null() {
            std::ptr::null_mut()
        } else {
            (n.isolate_rng)(isolate)
        };
        let context = if isolate.is_null() {
            std::ptr::null_mut()
        } else {
            (n.isolate_context)(isolate)
        };
        if rng.is_null() || context.is_null() {
            return Err(Fail::new("renew V8's random generators", ENOENT));
        }
        (n.rng_set_seed)(rng, seed(0));
        (n.mmap_set_seed)(seed(1));
        (n.math_random_reset)(*(context as *const usize));
    }
    Ok(())
}

/// `handed()`: whether the run's hand-over has begun to arrive on fd 0 (bytes waiting in
/// the pipe), so that a program rehearsing a run stops and serves it.
unsafe extern "C" fn node_handed(env: NapiEnv, _info: NapiInfo) -> NapiValue {
    let mut waiting: c_int = 0;
    // SAFETY: FIONREAD writes one int on this frame.
    let r = unsafe { ioctl(0, FIONREAD, &mut waiting) };
    // A pipe that cannot say counts as handed: the rehearsal stops.
    let handed = r != 0 || waiting > 0;
    let Some(n) = napi() else {
        return std::ptr::null_mut();
    };
    let mut value = std::ptr::null_mut();
    // SAFETY: a Node-API call on the calling environment.
    unsafe { (n.create_int64)(env, i64::from(handed), &mut value) };
    value
}

/// `limits(fileSizeBytes, openFiles, cpuS)`: the run's own rlimits.
unsafe extern "C" fn node_limits(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    let Some([fsize, nofile, cpu]) = (unsafe { int_args::<3>(env, info) }) else {
        // SAFETY: the calling environment.
        return unsafe {
            throw(
                env,
                "limits(fileSizeBytes, openFiles, cpuS): three integers",
            )
        };
    };
    let limit = |cur: i64, max: i64| RLimit {
        cur: cur.max(0) as u64,
        max: max.max(0) as u64,
    };
    // SAFETY: setrlimit with structures on this frame.
    let ok = unsafe {
        setrlimit(RLIMIT_FSIZE, &limit(fsize, fsize)) == 0
            && setrlimit(RLIMIT_NOFILE, &limit(nofile, nofile)) == 0
            && setrlimit(RLIMIT_CPU, &limit(cpu, cpu + 1)) == 0
    };
    if !ok {
        // SAFETY: the calling environment.
        return unsafe { throw(env, "set rlimits") };
    }
    std::ptr::null_mut()
}

/// The program's exit code, as its `exit` listeners left it.
static EXIT_CODE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);

/// `exitCode(code)`: the code to end with when Node reaches its at-exit callbacks (after it
/// printed an uncaught exception).
unsafe extern "C" fn node_exit_code(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    if let Some([code]) = unsafe { int_args::<1>(env, info) } {
        EXIT_CODE.store(code as c_int, std::sync::atomic::Ordering::Relaxed);
    }
    std::ptr::null_mut()
}

/// `exit(code)`: end the program now, as python_zygote.py's `_finish` does.
unsafe extern "C" fn node_exit(env: NapiEnv, info: NapiInfo) -> NapiValue {
    // SAFETY: the arguments of this call.
    let code = unsafe { int_args::<1>(env, info) }.map_or(1, |[c]| c as c_int);
    finish(code)
}

unsafe extern "C" fn at_exit(_arg: *mut c_void) {
    finish(EXIT_CODE.load(std::sync::atomic::Ordering::Relaxed))
}

/// Close the output (the server reads it to its end) and exit without Node's teardown: it
/// would join its platform's threads, which exist only in the fork server. The run's init
/// reports the exit from the wait status.
fn finish(code: c_int) -> ! {
    // SAFETY: closes this process's stdout and stderr, then ends it.
    unsafe {
        close(1);
        close(2);
        _exit(code & 0xff)
    }
}

/// Worker threads for V8's background tasks, in place of Node's platform's: those threads
/// exist in the fork server only, and a task left in their queue would keep a program's
/// event loop from ever ending (`NodePlatform::DrainTasks` waits for it). The fork server
/// hands its platform's worker tasks to this pool from its start; each program starts a
/// pool of its own (what the fork server's pool held stays with the fork server).
struct Pool {
    queue: std::sync::Mutex<Vec<(std::time::Instant, usize)>>,
    ready: std::sync::Condvar,
    idle: std::sync::Condvar,
    running: std::sync::atomic::AtomicUsize,
    started: std::sync::Once,
    /// Set in the fork server once it serves: no task runs while it forks.
    frozen: std::sync::atomic::AtomicBool,
}

static POOL: std::sync::atomic::AtomicPtr<Pool> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
const POOL_THREADS: usize = 2;

fn new_pool() {
    let pool = Box::leak(Box::new(Pool {
        queue: std::sync::Mutex::new(Vec::new()),
        ready: std::sync::Condvar::new(),
        idle: std::sync::Condvar::new(),
        running: std::sync::atomic::AtomicUsize::new(0),
        started: std::sync::Once::new(),
        frozen: std::sync::atomic::AtomicBool::new(false),
    }));
    POOL.store(pool, std::sync::atomic::Ordering::SeqCst);
}

fn pool() -> &'static Pool {
    // SAFETY: set by `new_pool` before the vtable sends any task here; never freed.
    unsafe { &*POOL.load(std::sync::atomic::Ordering::SeqCst) }
}

/// A `v8::Task`: its vtable is [complete destructor, deleting destructor, Run].
unsafe fn run_task(task: usize) {
    // SAFETY: `task` is a live v8::Task handed over with its ownership.
    unsafe {
        let vtable = *(task as *const *const unsafe extern "C" fn(usize));
        (*vtable.add(2))(task);
        (*vtable.add(1))(task);
    }
}

fn post(task: usize, delay_s: f64) {
    let pool = pool();
    pool.started.call_once(|| {
        for _ in 0..POOL_THREADS {
            std::thread::spawn(move || work(pool));
        }
    });
    let due =
        std::time::Instant::now() + std::time::Duration::from_secs_f64(delay_s.clamp(0.0, 1e6));
    pool.queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((due, task));
    pool.ready.notify_one();
}

fn work(pool: &'static Pool) {
    let mut queue = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = std::time::Instant::now();
        let next = queue
            .iter()
            .enumerate()
            .min_by_key(|(_, (due, _))| *due)
            .map(|(i, (due, _))| (i, *due));
        match next {
            _ if pool.frozen.load(std::sync::atomic::Ordering::SeqCst) => {
                queue = pool.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
            Some((i, due)) if due <= now => {
                let (_, task) = queue.swap_remove(i);
                pool.running
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(queue);
                // SAFETY: a task V8 posted, owned by this pool.
                unsafe { run_task(task) };
                queue = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
                pool.running
                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                pool.idle.notify_all();
            }
            Some((_, due)) => {
                queue = pool
                    .ready
                    .wait_timeout(queue, due - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            None => queue = pool.ready.wait(queue).unwrap_or_else(|e| e.into_inner()),
        }
    }
}

/// Wait until no task is due or running (delayed ones may stay queued), then run no more.
fn quiesce() {
    if POOL.load(std::sync::atomic::Ordering::SeqCst).is_null() {
        return;
    }
    let pool = pool();
    let mut queue = pool.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let now = std::time::Instant::now();
        let due = queue.iter().any(|(d, _)| *d <= now);
        if !due && pool.running.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            pool.frozen.store(true, std::sync::atomic::Ordering::SeqCst);
            return;
        }
        queue = pool
            .idle
            .wait_timeout(queue, std::time::Duration::from_millis(10))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// `NodePlatform::CallOnWorkerThread(std::unique_ptr<Task>)`: the `unique_ptr` is passed by
/// address (it has a destructor); taking the pointer out leaves the caller nothing to free.
unsafe extern "C" fn call_on_worker(_platform: *mut c_void, task: *mut usize) {
    // SAFETY: `task` points to the caller's unique_ptr.
    let t = unsafe { std::mem::replace(&mut *task, 0) };
    if t != 0 {
        post(t, 0.0);
    }
}

unsafe extern "C" fn call_delayed_on_worker(_platform: *mut c_void, task: *mut usize, delay: f64) {
    // SAFETY: `task` points to the caller's unique_ptr.
    let t = unsafe { std::mem::replace(&mut *task, 0) };
    if t != 0 {
        post(t, delay);
    }
}

/// Point the platform's vtable entries for worker tasks at this pool: the platform object
/// gets a copy of its vtable (with the ABI's two words before it) in which the entries
/// equal to the two exported methods are replaced. Fails when they are not found.
unsafe fn adopt_worker_tasks(n: &Napi, platform: *mut c_void) -> bool {
    const SLOTS: usize = 64;
    // SAFETY: `platform` is Node's platform object, whose first word is its vtable pointer;
    // the vtable lies in the binary's read-only data, readable for SLOTS entries.
    unsafe {
        let vptr = *(platform as *const *const usize);
        let mut table: Box<[usize; SLOTS + 2]> = Box::new([0; SLOTS + 2]);
        std::ptr::copy_nonoverlapping(vptr.sub(2), table.as_mut_ptr(), SLOTS + 2);
        let mut found = 0;
        for slot in table[2..].iter_mut() {
            if *slot == n.call_on_worker as usize {
                *slot = call_on_worker as *const () as usize;
                found |= 1;
            } else if *slot == n.call_delayed_on_worker as usize {
                *slot = call_delayed_on_worker as *const () as usize;
                found |= 2;
            }
        }
        if found != 3 {
            return false;
        }
        let table = Box::leak(table);
        *(platform as *mut *const usize) = table.as_ptr().add(2);
        true
    }
}
