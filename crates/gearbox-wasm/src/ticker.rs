//! The epoch ticker: one thread that advances the engine's epoch every [`TICK`] while at least
//! one run is active, so each store's epoch-deadline callback can check its wall-clock deadline
//! and cancel flag. It parks when no run is active and exits when the sandbox is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Epoch period: the granularity of timeouts and of cancellation.
pub(crate) const TICK: Duration = Duration::from_millis(5);

struct Shared {
    active: AtomicUsize,
    stop: AtomicBool,
}

pub(crate) struct Ticker {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Keeps the ticker running while alive.
pub(crate) struct Active<'a>(&'a Ticker);

impl Ticker {
    pub(crate) fn start(engine: wasmtime::Engine) -> std::io::Result<Ticker> {
        let shared = Arc::new(Shared {
            active: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = thread::Builder::new()
            .name("gearbox-wasm-epoch".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Acquire) {
                    if s.active.load(Ordering::Acquire) == 0 {
                        thread::park();
                        continue;
                    }
                    thread::sleep(TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(Ticker {
            shared,
            thread: Some(thread),
        })
    }

    /// Mark a run as active until the returned guard drops.
    pub(crate) fn active(&self) -> Active<'_> {
        if self.shared.active.fetch_add(1, Ordering::AcqRel) == 0
            && let Some(t) = &self.thread
        {
            t.thread().unpark();
        }
        Active(self)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.shared.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
