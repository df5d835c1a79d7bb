//! The engine configuration and the compiled QuickJS module: compiled once per process, or
//! loaded from a `.cwasm` cache file that gearbox itself wrote.
//!
//! The cache key is the SHA-256 of the guest module plus wasmtime's version and the engine's
//! compatibility hash (configuration and host CPU features), so a file written by another
//! wasmtime or another configuration is never loaded; wasmtime re-checks the header as well.
//! Deserializing native code is `unsafe`: a file in the cache directory is trusted as much as
//! the gearbox binary itself, so the directory is created with mode 0700 and files are written
//! atomically with mode 0600. A file that fails to load is recompiled and replaced.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, Module, OptLevel};

use crate::WasmError;

/// The QuickJS guest, built from `guest/quickjs` by `scripts/build-guest.sh`.
pub const GUEST_WASM: &[u8] = include_bytes!("../guest/quickjs.wasm");

/// Largest native stack the guest may use, in bytes. quickjs-ng turns its own stack check off
/// on WASI, so deep recursion ends in a trap at this depth (or earlier, when QuickJS's shadow
/// stack in linear memory runs out).
pub const MAX_WASM_STACK_BYTES: usize = 1024 * 1024;

/// Instances wasmtime's pooling allocator holds at once. A run beyond this many at once waits
/// for a slot (`sandbox.rs`); `[concurrency]` keeps far fewer runs going by default.
pub const INSTANCE_SLOTS: u32 = 64;

/// Bytes at the start of each slot's linear memory that stay mapped between runs and are
/// reset with `memset` (the rest is reset with `madvise`, as without the pool): a QuickJS run
/// touches ~2-4 MiB, which otherwise costs a page fault per page on every run
/// (`docs/PERFORMANCE.md`). Held only by slots that have served a run.
const KEEP_RESIDENT_BYTES: usize = 4 << 20;

pub(crate) fn engine() -> Result<Engine, WasmError> {
    let mut config = Config::new();
    config
        .epoch_interruption(true)
        .max_wasm_stack(MAX_WASM_STACK_BYTES)
        .cranelift_opt_level(OptLevel::Speed)
        .parallel_compilation(true)
        // No wasm backtrace on errors: every run ends in one (`proc_exit` is an error that
        // unwinds the guest), and a run's outcome names a trap by its kind, never by frames.
        .wasm_backtrace_max_frames(None);
    // Instances come from a pool of slots reused from run to run instead of fresh mappings.
    // Wasmtime resets a slot's memory and tables to the module's initial image before it is
    // reused, so a run finds nothing of the one before (tests/wasm.rs checks).
    let mut pool = wasmtime::PoolingAllocationConfig::default();
    pool.total_core_instances(INSTANCE_SLOTS)
        .total_memories(INSTANCE_SLOTS)
        .total_tables(INSTANCE_SLOTS)
        // The largest memory wasm32 can address: each run's own limit (`memory_mb`) is the
        // store's limiter's to enforce, as it was without the pool.
        .max_memory_size(1 << 32)
        .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
        .table_keep_resident(64 << 10);
    config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config).map_err(|e| WasmError::Engine(e.to_string()))
}

/// How the module was obtained, for `doctor` and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleSource {
    Compiled { ms: u64 },
    Cache { path: PathBuf, ms: u64 },
    CompiledAndCached { path: PathBuf, ms: u64 },
}

/// The compiled guest: from `cache_dir` under `name` when it is there and loads, otherwise
/// compiled (and cached there).
pub(crate) fn load(
    engine: &Engine,
    wasm: &[u8],
    cache_dir: Option<&Path>,
    name: &str,
) -> Result<(Module, ModuleSource), WasmError> {
    let start = Instant::now();
    if let Some(found) = cache_dir.and_then(|dir| cached(engine, dir, name)) {
        return Ok(found);
    }
    compile_and_cache(engine, wasm, cache_dir, name, start)
}

/// The module cached in `dir` under `name`, if there is one that loads.
pub(crate) fn cached(engine: &Engine, dir: &Path, name: &str) -> Option<(Module, ModuleSource)> {
    let start = Instant::now();
    let path = dir.join(name);
    if !path.is_file() {
        return None;
    }
    // SAFETY: the file sits in gearbox's private cache directory (mode 0700) and was
    // written by `store` below from `Module::serialize` of this very engine configuration;
    // its name carries the guest's hash, the wasmtime version and the engine's
    // compatibility hash, and wasmtime validates the header before using it.
    match unsafe { Module::deserialize_file(engine, &path) } {
        Ok(module) => {
            mark_used(&path);
            Some((
                module,
                ModuleSource::Cache {
                    path,
                    ms: start.elapsed().as_millis() as u64,
                },
            ))
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), "ignoring unusable wasm cache: {e}");
            None
        }
    }
}

/// Compile `wasm` and, with a cache directory, keep it there under `name`. `start` is when the
/// work began, for the reported time.
pub(crate) fn compile_and_cache(
    engine: &Engine,
    wasm: &[u8],
    cache_dir: Option<&Path>,
    name: &str,
    start: Instant,
) -> Result<(Module, ModuleSource), WasmError> {
    let ms = |start: Instant| start.elapsed().as_millis() as u64;
    let module = compile(engine, wasm)?;
    let Some(dir) = cache_dir else {
        return Ok((module, ModuleSource::Compiled { ms: ms(start) }));
    };
    let path = dir.join(name);
    match store(&module, dir, &path) {
        Ok(()) => Ok((
            module,
            ModuleSource::CompiledAndCached {
                path,
                ms: ms(start),
            },
        )),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot write the wasm cache: {e}");
            Ok((module, ModuleSource::Compiled { ms: ms(start) }))
        }
    }
}

fn compile(engine: &Engine, wasm: &[u8]) -> Result<Module, WasmError> {
    Module::new(engine, wasm).map_err(|e| WasmError::Compile(e.to_string()))
}

/// The names of the cache files made from one guest under one engine configuration (the
/// guest's SHA-256 taken once).
pub(crate) struct CacheNames {
    hex: String,
    tail: String,
}

impl CacheNames {
    pub(crate) fn new(engine: &Engine, wasm: &[u8]) -> CacheNames {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let digest = Sha256::digest(wasm);
        CacheNames {
            hex: digest[..12].iter().map(|b| format!("{b:02x}")).collect(),
            tail: format!("-wasmtime{}-{:016x}.cwasm", wasmtime_version(), h.finish()),
        }
    }

    /// The file of the compiled guest (`kind` empty) or of something made from it (`kind`
    /// names what, with its format's version).
    pub(crate) fn file(&self, kind: &str) -> String {
        format!("quickjs-{}{kind}{}", self.hex, self.tail)
    }
}

fn wasmtime_version() -> &'static str {
    // Pinned in the workspace Cargo.toml; keep in step.
    "48.0.8"
}

fn store(module: &Module, dir: &Path, path: &Path) -> std::io::Result<()> {
    create_private_dir(dir)?;
    let bytes = module.serialize().map_err(std::io::Error::other)?;
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), unique()));
    let mut f = private_file(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })?;
    prune(dir, SystemTime::now());
    Ok(())
}

/// A cache file no start has loaded for this long is removed when a new one is written: each
/// guest or wasmtime upgrade leaves its files behind (~3 MB each), while two builds that share
/// the directory keep theirs, since each start marks the file it loads.
const UNUSED_FOR: Duration = Duration::from_secs(14 * 24 * 3600);
/// A temporary file this old was left by a process that died while writing.
const ABANDONED_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Note that `path` was used now (its modification time), for [`prune`].
fn mark_used(path: &Path) {
    let touched = std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!(path = %path.display(), "cannot mark the wasm cache file used: {e}");
    }
}

/// Remove gearbox's own cache files in `dir` that were last used longer ago than
/// [`UNUSED_FOR`] (temporary files: [`ABANDONED_AFTER`]) before `now`. Other files are left.
fn prune(dir: &Path, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let limit = if name.starts_with("quickjs-") && name.ends_with(".cwasm") {
            UNUSED_FOR
        } else if name.starts_with(".tmp-") {
            ABANDONED_AFTER
        } else {
            continue;
        };
        let Ok(meta) = entry.metadata() else { continue };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age > limit);
        if meta.is_file() && old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)
}

#[cfg(unix)]
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn private_file(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// The default cache directory: `$XDG_CACHE_HOME/gearbox/wasm` or `~/.cache/gearbox/wasm`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("gearbox").join("wasm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path, name: &str, age: Duration) {
        let path = dir.join(name);
        std::fs::write(&path, b"x").expect("write");
        let f = std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_modified(SystemTime::now() - age).expect("set mtime");
    }

    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// An empty directory of this test's own.
    fn fresh_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gearbox-wasm-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[test]
    fn prune_removes_only_its_own_long_unused_files() {
        let dir = fresh_dir("prune");
        file(&dir, "quickjs-old-wasmtime48.cwasm", 30 * DAY);
        file(&dir, "quickjs-recent-wasmtime48.cwasm", 3 * DAY);
        file(&dir, ".tmp-1-2", 2 * DAY);
        file(&dir, ".tmp-3-4", Duration::from_secs(60));
        file(&dir, "notes.txt", 300 * DAY);
        file(&dir, "other-old.cwasm", 300 * DAY);
        prune(&dir, SystemTime::now());
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".tmp-3-4",
                "notes.txt",
                "other-old.cwasm",
                "quickjs-recent-wasmtime48.cwasm"
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A start that loads a cached module marks its file used, so that the next prune keeps
    /// it however old it was.
    #[test]
    fn loading_a_cached_module_marks_it_used() {
        let dir = fresh_dir("cached");
        let engine = engine().expect("engine");
        let name = "quickjs-empty-test.cwasm";
        compile_and_cache(
            &engine,
            b"\0asm\x01\0\0\0",
            Some(&dir),
            name,
            Instant::now(),
        )
        .expect("compile");
        std::fs::File::options()
            .write(true)
            .open(dir.join(name))
            .and_then(|f| f.set_modified(SystemTime::now() - 30 * DAY))
            .expect("age the file");
        let (_, source) = cached(&engine, &dir, name).expect("the cached module loads");
        assert!(matches!(source, ModuleSource::Cache { .. }), "{source:?}");
        prune(&dir, SystemTime::now());
        assert!(dir.join(name).is_file(), "a loaded file was pruned");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_loaded_file_counts_as_used() {
        let dir = fresh_dir("mark");
        file(&dir, "quickjs-a.cwasm", 30 * DAY);
        mark_used(&dir.join("quickjs-a.cwasm"));
        prune(&dir, SystemTime::now());
        assert!(dir.join("quickjs-a.cwasm").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
