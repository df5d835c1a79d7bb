//! Back-pressure: at most `max_running` runs at once, at most `max_queued` calls waiting for a
//! slot, and a clear refusal past that. Every transport's calls pass through one [`Limiter`],
//! so stdio and HTTP clients share the same budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a call did not get a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is taken and the queue is full.
    Busy {
        running: usize,
        queued: usize,
        retry_after_s: u64,
    },
    /// The server is shutting down and starts no new run.
    ShuttingDown,
}

impl Refusal {
    /// Seconds a client should wait before it tries again.
    pub fn retry_after_s(&self) -> u64 {
        match self {
            Refusal::Busy { retry_after_s, .. } => *retry_after_s,
            Refusal::ShuttingDown => 5,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Busy {
                running,
                queued,
                retry_after_s,
            } => write!(
                f,
                "busy: {running} runs in progress and {queued} waiting (the most this server \
                 queues); retry after {retry_after_s} s"
            ),
            Refusal::ShuttingDown => {
                f.write_str("server shutting down: no new runs are started; retry after 5 s")
            }
        }
    }
}

/// The shared run budget.
#[derive(Debug)]
pub struct Limiter {
    slots: Arc<Semaphore>,
    max_running: usize,
    max_queued: usize,
    queued: AtomicUsize,
    running: Arc<AtomicUsize>,
    closed: AtomicBool,
    /// Exponentially weighted mean run time in ms, for the retry hint.
    mean_ms: Arc<AtomicU64>,
}

/// A held slot; the run may go on while it lives.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    running: Arc<AtomicUsize>,
    mean_ms: Arc<AtomicU64>,
    started: std::time::Instant,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
        let took = self.started.elapsed().as_millis() as u64;
        let old = self.mean_ms.load(Ordering::Relaxed);
        let new = if old == 0 { took } else { (old * 7 + took) / 8 };
        self.mean_ms.store(new.max(1), Ordering::Relaxed);
    }
}

struct QueuedGuard<'a>(&'a AtomicUsize);

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Limiter {
    pub fn new(max_running: usize, max_queued: usize) -> Limiter {
        let max_running = max_running.max(1);
        Limiter {
            slots: Arc::new(Semaphore::new(max_running)),
            max_running,
            max_queued,
            queued: AtomicUsize::new(0),
            running: Arc::new(AtomicUsize::new(0)),
            closed: AtomicBool::new(false),
            mean_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn max_running(&self) -> usize {
        self.max_running
    }

    pub fn max_queued(&self) -> usize {
        self.max_queued
    }

    /// Runs executing now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Calls waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Refuse every later call (shutdown); calls already waiting are refused too.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.slots.close();
    }

    /// What a call arriving now would get, without taking anything: `Some` when it would be
    /// refused. Lets a transport answer 503 before it accepts the request.
    pub fn would_refuse(&self) -> Option<Refusal> {
        if self.closed.load(Ordering::SeqCst) {
            return Some(Refusal::ShuttingDown);
        }
        if self.slots.available_permits() == 0 && self.queued() >= self.max_queued {
            return Some(self.busy());
        }
        None
    }

    fn busy(&self) -> Refusal {
        let mean = self.mean_ms.load(Ordering::Relaxed).max(100);
        let queued = self.queued();
        // Time for the queue ahead to drain through the slots, rounded up, at least 1 s.
        let wait_ms = mean.saturating_mul(queued as u64 + 1) / self.max_running as u64;
        Refusal::Busy {
            running: self.running(),
            queued,
            retry_after_s: wait_ms.div_ceil(1000).clamp(1, 300),
        }
    }

    /// Take a slot, waiting in the queue when every slot is busy; refused at once when the
    /// queue is full or the server is closing. Dropping the future leaves the queue.
    pub async fn acquire(&self) -> Result<Slot, Refusal> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Refusal::ShuttingDown);
        }
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Refusal::ShuttingDown),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                // Reserve a place in the queue, or refuse.
                let mut cur = self.queued.load(Ordering::SeqCst);
                loop {
                    if cur >= self.max_queued {
                        return Err(self.busy());
                    }
                    match self.queued.compare_exchange(
                        cur,
                        cur + 1,
                        Ordering::SeqCst,
                        Ordering::SeqCst,
                    ) {
                        Ok(_) => break,
                        Err(now) => cur = now,
                    }
                }
                let _queued = QueuedGuard(&self.queued);
                self.slots
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| Refusal::ShuttingDown)?
            }
        };
        self.running.fetch_add(1, Ordering::SeqCst);
        Ok(Slot {
            _permit: permit,
            running: self.running.clone(),
            mean_ms: self.mean_ms.clone(),
            started: std::time::Instant::now(),
        })
    }

    /// Wait until no run is in progress, or `limit` passed; true when none is left.
    pub async fn drained(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if self.running() == 0 && self.queued() == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slots_then_queue_then_busy() {
        let l = Arc::new(Limiter::new(2, 1));
        let a = l.acquire().await.expect("slot 1");
        let _b = l.acquire().await.expect("slot 2");
        assert_eq!(l.running(), 2);
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.acquire().await.map(|_| ()) });
        for _ in 0..100 {
            if l.queued() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(l.queued(), 1);
        let refused = l.acquire().await.expect_err("queue full");
        assert!(matches!(refused, Refusal::Busy { .. }), "{refused}");
        assert!(refused.to_string().contains("retry after"), "{refused}");
        assert!(l.would_refuse().is_some());
        drop(a);
        waiter
            .await
            .expect("join")
            .expect("the waiter gets the freed slot");
        assert_eq!(l.queued(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_waiter_leaves_the_queue() {
        let l = Limiter::new(1, 4);
        let _a = l.acquire().await.expect("slot");
        let r = tokio::time::timeout(Duration::from_millis(20), l.acquire()).await;
        assert!(r.is_err(), "waits while the slot is held");
        assert_eq!(l.queued(), 0);
    }

    #[tokio::test]
    async fn closing_refuses_new_and_waiting_calls() {
        let l = Arc::new(Limiter::new(1, 4));
        let a = l.acquire().await.expect("slot");
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.acquire().await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        l.close();
        assert_eq!(
            waiter.await.expect("join").expect_err("refused"),
            Refusal::ShuttingDown
        );
        assert_eq!(
            l.acquire().await.expect_err("refused"),
            Refusal::ShuttingDown
        );
        assert!(!l.drained(Duration::from_millis(10)).await);
        drop(a);
        assert!(l.drained(Duration::from_millis(100)).await);
    }
}
