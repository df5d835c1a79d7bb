//! Back-pressure and fairness: at most `max_running` runs at once, at most `max_queued`
//! calls waiting for a slot, and a clear refusal past that. Every transport's calls pass
//! through one [`Limiter`], so stdio and HTTP clients share the same budget.
//!
//! Each tenant has a queue of its own (first in, first out) and may have a budget of its own
//! ([`TenantLimits`]: runs at once, calls waiting). When a slot frees, the tenants with a
//! waiting call are served in turn (round-robin): the tenant served goes to the back of the
//! line, so a tenant with one waiting call waits at most one run of each other waiting
//! tenant, however many calls those queued. A tenant at its own `max_running` is passed over
//! until one of its runs ends.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// Why a call did not get a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Every slot is taken and the queue is full.
    Busy {
        running: usize,
        queued: usize,
        retry_after_s: u64,
    },
    /// The tenant is over one of its quotas (`quota` is its configuration key).
    Quota {
        tenant: String,
        quota: &'static str,
        limit: u64,
        /// What the tenant uses now, in the quota's unit (bytes for `session_storage_mb`).
        used: u64,
        retry_after_s: u64,
    },
    /// The server is shutting down and starts no new run.
    ShuttingDown,
}

impl Refusal {
    /// Seconds a client should wait before it tries again.
    pub fn retry_after_s(&self) -> u64 {
        match self {
            Refusal::Busy { retry_after_s, .. } | Refusal::Quota { retry_after_s, .. } => {
                *retry_after_s
            }
            Refusal::ShuttingDown => 5,
        }
    }

    /// The quota refused, when it is a tenant's quota.
    pub fn quota(&self) -> Option<&'static str> {
        match self {
            Refusal::Quota { quota, .. } => Some(quota),
            _ => None,
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
            Refusal::Quota {
                tenant,
                quota: "live_sessions",
                limit,
                used,
                ..
            } => write!(
                f,
                "quota exceeded: tenant {tenant:?} has {used} of {limit} live sessions open \
                 ([quotas] live_sessions); one frees when the tenant closes one (exec_close) \
                 or it expires"
            ),
            Refusal::Quota {
                tenant,
                quota: "session_storage_mb",
                limit,
                used,
                ..
            } => write!(
                f,
                "quota exceeded: tenant {tenant:?} would hold {used} bytes of its {limit} MiB \
                 of session files ([quotas] session_storage_mb); space frees when the tenant \
                 closes sessions (exec_close) or they expire"
            ),
            Refusal::Quota {
                tenant,
                quota,
                limit,
                used,
                retry_after_s,
            } => write!(
                f,
                "quota exceeded: tenant {tenant:?} is at its {quota} quota ({used} of \
                 {limit}, [quotas] {quota}); it resets in about {retry_after_s} s: retry \
                 after {retry_after_s} s"
            ),
            Refusal::ShuttingDown => {
                f.write_str("server shutting down: no new runs are started; retry after 5 s")
            }
        }
    }
}

/// One tenant's share of the run budget; 0 is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    pub max_running: u64,
    pub max_queued: u64,
}

/// Runs and waiting calls of one tenant, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantLoad {
    pub tenant: String,
    pub running: usize,
    pub queued: usize,
}

/// A waiting call: its ticket and where its slot is sent.
struct Waiter {
    ticket: u64,
    tx: oneshot::Sender<Slot>,
}

#[derive(Default)]
struct Tenant {
    running: usize,
    queue: VecDeque<Waiter>,
    limits: TenantLimits,
}

impl Tenant {
    fn at_cap(&self) -> bool {
        self.limits.max_running > 0 && self.running as u64 >= self.limits.max_running
    }
}

#[derive(Default)]
struct State {
    running: usize,
    queued: usize,
    tenants: HashMap<String, Tenant>,
    /// Tenants with a waiting call, in the order they are served.
    turn: VecDeque<String>,
    closed: bool,
    next_ticket: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    max_running: usize,
    max_queued: usize,
    /// Exponentially weighted mean run time in ms, for the retry hint.
    mean_ms: AtomicU64,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("running", &self.running)
            .field("queued", &self.queued)
            .field("closed", &self.closed)
            .finish()
    }
}

/// The shared run budget.
#[derive(Debug)]
pub struct Limiter {
    shared: Arc<Shared>,
}

/// A held slot; the run may go on while it lives. Dropping it gives the slot to the next
/// waiting call (round-robin across tenants).
#[derive(Debug)]
pub struct Slot {
    shared: Arc<Shared>,
    tenant: String,
    started: std::time::Instant,
    /// False for a slot that was never handed out (its waiter had gone).
    armed: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let took = self.started.elapsed().as_millis() as u64;
        let old = self.shared.mean_ms.load(Ordering::Relaxed);
        let new = if old == 0 { took } else { (old * 7 + took) / 8 };
        self.shared.mean_ms.store(new.max(1), Ordering::Relaxed);
        let mut st = self.shared.lock();
        st.running = st.running.saturating_sub(1);
        if let Some(t) = st.tenants.get_mut(&self.tenant) {
            t.running = t.running.saturating_sub(1);
        }
        forget_if_idle(&mut st, &self.tenant);
        Shared::dispatch(&self.shared, &mut st);
    }
}

/// Drop a tenant's entry once it has nothing running or waiting.
fn forget_if_idle(st: &mut State, tenant: &str) {
    if st
        .tenants
        .get(tenant)
        .is_some_and(|t| t.running == 0 && t.queue.is_empty())
    {
        st.tenants.remove(tenant);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand free slots to waiting calls, one tenant at a time in turn.
    fn dispatch(shared: &Arc<Shared>, st: &mut State) {
        let mut passed = 0;
        while st.running < shared.max_running && passed < st.turn.len() {
            let Some(name) = st.turn.pop_front() else {
                break;
            };
            let Some(t) = st.tenants.get_mut(&name) else {
                continue;
            };
            if t.queue.is_empty() {
                continue;
            }
            if t.at_cap() {
                st.turn.push_back(name);
                passed += 1;
                continue;
            }
            let Some(w) = t.queue.pop_front() else {
                continue;
            };
            let slot = Slot {
                shared: shared.clone(),
                tenant: name.clone(),
                started: std::time::Instant::now(),
                armed: true,
            };
            let more = !t.queue.is_empty();
            st.queued = st.queued.saturating_sub(1);
            match w.tx.send(slot) {
                Ok(()) => {
                    t.running += 1;
                    st.running += 1;
                }
                Err(mut slot) => slot.armed = false,
            }
            if more {
                st.turn.push_back(name);
            }
            passed = 0;
        }
    }
}

/// A call in a tenant's queue: leaving it (the call was cancelled) takes its place out.
struct Waiting {
    shared: Arc<Shared>,
    tenant: String,
    ticket: u64,
    rx: Option<oneshot::Receiver<Slot>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let rx = self.rx.take();
        {
            let mut st = self.shared.lock();
            let mut removed = false;
            if let Some(t) = st.tenants.get_mut(&self.tenant)
                && let Some(i) = t.queue.iter().position(|w| w.ticket == self.ticket)
            {
                t.queue.remove(i);
                removed = true;
            }
            if removed {
                st.queued = st.queued.saturating_sub(1);
                forget_if_idle(&mut st, &self.tenant);
            }
        }
        // A slot sent but not taken is released here, outside the lock.
        drop(rx);
    }
}

impl Limiter {
    pub fn new(max_running: usize, max_queued: usize) -> Limiter {
        Limiter {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                max_running: max_running.max(1),
                max_queued,
                mean_ms: AtomicU64::new(0),
            }),
        }
    }

    pub fn max_running(&self) -> usize {
        self.shared.max_running
    }

    pub fn max_queued(&self) -> usize {
        self.shared.max_queued
    }

    /// Runs executing now.
    pub fn running(&self) -> usize {
        self.shared.lock().running
    }

    /// Calls waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.shared.lock().queued
    }

    /// Runs and waiting calls of each tenant that has some, by name.
    pub fn tenants(&self) -> Vec<TenantLoad> {
        let st = self.shared.lock();
        let mut out: Vec<TenantLoad> = st
            .tenants
            .iter()
            .map(|(name, t)| TenantLoad {
                tenant: name.clone(),
                running: t.running,
                queued: t.queue.len(),
            })
            .collect();
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }

    /// Whether the server is closing.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }

    /// Refuse every later call (shutdown); calls already waiting are refused too.
    pub fn close(&self) {
        let waiters: Vec<Waiter> = {
            let mut st = self.shared.lock();
            st.closed = true;
            st.turn.clear();
            st.queued = 0;
            let mut all = Vec::new();
            for t in st.tenants.values_mut() {
                all.extend(t.queue.drain(..));
            }
            st.tenants.retain(|_, t| t.running > 0);
            all
        };
        // Their senders dropped: each waiting call wakes refused.
        drop(waiters);
    }

    /// What a call of `tenant` arriving now would get, without taking anything: `Some` when
    /// it would be refused. Lets a transport answer before it accepts the request.
    pub fn would_refuse(&self, tenant: &str, limits: TenantLimits) -> Option<Refusal> {
        let st = self.shared.lock();
        self.refusal(&st, tenant, limits)
    }

    /// The refusal of a call of `tenant` in state `st`, if any.
    fn refusal(&self, st: &State, tenant: &str, limits: TenantLimits) -> Option<Refusal> {
        if st.closed {
            return Some(Refusal::ShuttingDown);
        }
        let (running, waiting) = st
            .tenants
            .get(tenant)
            .map_or((0, 0), |t| (t.running, t.queue.len()));
        let at_cap = limits.max_running > 0 && running as u64 >= limits.max_running;
        if st.running < self.shared.max_running && !at_cap {
            return None;
        }
        if limits.max_queued > 0 && waiting as u64 >= limits.max_queued {
            let per = limits.max_running.max(1);
            return Some(Refusal::Quota {
                tenant: tenant.to_string(),
                quota: "max_queued",
                limit: limits.max_queued,
                used: waiting as u64,
                retry_after_s: self.wait_s(waiting as u64 + 1, per),
            });
        }
        if st.queued >= self.shared.max_queued {
            return Some(Refusal::Busy {
                running: st.running,
                queued: st.queued,
                retry_after_s: self.wait_s(st.queued as u64 + 1, self.shared.max_running as u64),
            });
        }
        None
    }

    /// Seconds for `ahead` runs to drain through `slots` slots, rounded up, 1 to 300.
    fn wait_s(&self, ahead: u64, slots: u64) -> u64 {
        let mean = self.shared.mean_ms.load(Ordering::Relaxed).max(100);
        let wait_ms = mean.saturating_mul(ahead) / slots.max(1);
        wait_ms.div_ceil(1000).clamp(1, 300)
    }

    /// Take a slot for a call of `tenant`, waiting in the tenant's queue when no slot is
    /// free for it; refused at once when a queue is full or the server is closing. Dropping
    /// the future leaves the queue.
    pub async fn acquire(&self, tenant: &str, limits: TenantLimits) -> Result<Slot, Refusal> {
        let waiting = {
            let mut st = self.shared.lock();
            if let Some(r) = self.refusal(&st, tenant, limits) {
                return Err(r);
            }
            let free = st.running < self.shared.max_running;
            let t = st.tenants.entry(tenant.to_string()).or_default();
            t.limits = limits;
            if free && !t.at_cap() {
                t.running += 1;
                st.running += 1;
                return Ok(Slot {
                    shared: self.shared.clone(),
                    tenant: tenant.to_string(),
                    started: std::time::Instant::now(),
                    armed: true,
                });
            }
            let ticket = st.next_ticket;
            st.next_ticket += 1;
            let (tx, rx) = oneshot::channel();
            let Some(t) = st.tenants.get_mut(tenant) else {
                return Err(Refusal::ShuttingDown);
            };
            let first = t.queue.is_empty();
            t.queue.push_back(Waiter { ticket, tx });
            st.queued += 1;
            if first && !st.turn.iter().any(|n| n == tenant) {
                st.turn.push_back(tenant.to_string());
            }
            Waiting {
                shared: self.shared.clone(),
                tenant: tenant.to_string(),
                ticket,
                rx: Some(rx),
            }
        };
        let mut waiting = waiting;
        let Some(rx) = waiting.rx.as_mut() else {
            return Err(Refusal::ShuttingDown);
        };
        match rx.await {
            Ok(slot) => Ok(slot),
            Err(_) => Err(Refusal::ShuttingDown),
        }
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

    const NONE: TenantLimits = TenantLimits {
        max_running: 0,
        max_queued: 0,
    };

    /// Let spawned tasks run until they block.
    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn slots_then_queue_then_busy() {
        let l = Arc::new(Limiter::new(2, 1));
        let a = l.acquire("t", NONE).await.expect("slot 1");
        let _b = l.acquire("t", NONE).await.expect("slot 2");
        assert_eq!(l.running(), 2);
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.acquire("t", NONE).await.map(|_| ()) });
        for _ in 0..100 {
            if l.queued() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(l.queued(), 1);
        let refused = l.acquire("t", NONE).await.expect_err("queue full");
        assert!(matches!(refused, Refusal::Busy { .. }), "{refused}");
        assert!(refused.to_string().contains("retry after"), "{refused}");
        assert!(l.would_refuse("u", NONE).is_some());
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
        let _a = l.acquire("t", NONE).await.expect("slot");
        let r = tokio::time::timeout(Duration::from_millis(20), l.acquire("t", NONE)).await;
        assert!(r.is_err(), "waits while the slot is held");
        assert_eq!(l.queued(), 0);
        assert_eq!(
            l.tenants(),
            vec![TenantLoad {
                tenant: "t".into(),
                running: 1,
                queued: 0
            }]
        );
    }

    #[tokio::test]
    async fn closing_refuses_new_and_waiting_calls() {
        let l = Arc::new(Limiter::new(1, 4));
        let a = l.acquire("t", NONE).await.expect("slot");
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.acquire("t", NONE).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        l.close();
        assert_eq!(
            waiter.await.expect("join").expect_err("refused"),
            Refusal::ShuttingDown
        );
        assert_eq!(
            l.acquire("t", NONE).await.expect_err("refused"),
            Refusal::ShuttingDown
        );
        assert!(l.is_closed());
        assert!(!l.drained(Duration::from_millis(10)).await);
        drop(a);
        assert!(l.drained(Duration::from_millis(100)).await);
        assert!(l.tenants().is_empty());
    }

    /// Queue `n` calls of `tenant`, each reporting `(tenant, i)` on `order` when it gets
    /// its slot and holding it until told; returns the release handles in order.
    async fn queue(
        l: &Arc<Limiter>,
        tenant: &'static str,
        n: usize,
        order: &tokio::sync::mpsc::UnboundedSender<(&'static str, usize)>,
        limits: TenantLimits,
    ) -> Vec<oneshot::Sender<()>> {
        let mut releases = Vec::new();
        for i in 0..n {
            let (tx, rx) = oneshot::channel::<()>();
            releases.push(tx);
            let l = l.clone();
            let order = order.clone();
            tokio::spawn(async move {
                let slot = l.acquire(tenant, limits).await;
                if let Ok(slot) = slot {
                    let _ = order.send((tenant, i));
                    let _ = rx.await;
                    drop(slot);
                }
            });
            // Each call is in its queue before the next is made.
            settle().await;
        }
        releases
    }

    #[tokio::test]
    async fn a_flood_does_not_hold_back_another_tenants_call() {
        let l = Arc::new(Limiter::new(1, 64));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut a = queue(&l, "a", 5, &tx, NONE).await;
        let mut b = queue(&l, "b", 1, &tx, NONE).await;
        let mut c = queue(&l, "c", 2, &tx, NONE).await;
        assert_eq!((l.running(), l.queued()), (1, 7));
        let mut grants = Vec::new();
        for _ in 0..8 {
            let (tenant, i) = rx.recv().await.expect("a grant");
            grants.push(format!("{tenant}{i}"));
            let release = match tenant {
                "a" => &mut a[i],
                "b" => &mut b[i],
                _ => &mut c[i],
            };
            let (done, _) = oneshot::channel();
            let _ = std::mem::replace(release, done).send(());
            settle().await;
        }
        // a0 held the slot; then each waiting tenant in turn, a's flood last.
        assert_eq!(
            grants,
            ["a0", "a1", "b0", "c0", "a2", "c1", "a3", "a4"],
            "round-robin across tenants"
        );
        assert_eq!((l.running(), l.queued()), (0, 0));
        assert!(l.tenants().is_empty());
    }

    #[tokio::test]
    async fn a_tenant_at_its_running_quota_waits_while_others_run() {
        let one = TenantLimits {
            max_running: 1,
            max_queued: 2,
        };
        let l = Arc::new(Limiter::new(3, 64));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut a = queue(&l, "a", 3, &tx, one).await;
        // a0 runs; a1 and a2 wait for a's own slot although the server has two free.
        assert_eq!((l.running(), l.queued()), (1, 2));
        let refused = l.would_refuse("a", one).expect("a's queue is full");
        assert_eq!(refused.quota(), Some("max_queued"));
        assert!(refused.to_string().contains("max_queued"), "{refused}");
        assert!(refused.to_string().contains("2 of 2"), "{refused}");
        let e = l.acquire("a", one).await.expect_err("refused");
        assert_eq!(e.quota(), Some("max_queued"));
        // Another tenant takes a free slot at once.
        assert!(l.would_refuse("b", one).is_none());
        let _b = l.acquire("b", one).await.expect("b runs");
        assert_eq!(rx.recv().await, Some(("a", 0)));
        let _ = std::mem::replace(&mut a[0], oneshot::channel().0).send(());
        assert_eq!(rx.recv().await, Some(("a", 1)));
        assert_eq!(
            l.tenants(),
            vec![
                TenantLoad {
                    tenant: "a".into(),
                    running: 1,
                    queued: 1
                },
                TenantLoad {
                    tenant: "b".into(),
                    running: 1,
                    queued: 0
                }
            ]
        );
    }

    #[tokio::test]
    async fn a_slot_sent_to_a_call_that_left_is_given_back() {
        let l = Arc::new(Limiter::new(1, 4));
        let a = l.acquire("t", NONE).await.expect("slot");
        let l2 = l.clone();
        let waiter = tokio::spawn(async move { l2.acquire("u", NONE).await.map(|_| ()) });
        settle().await;
        assert_eq!(l.queued(), 1);
        // The freed slot goes to the waiting call, which leaves before it takes it.
        drop(a);
        assert_eq!((l.running(), l.queued()), (1, 0));
        waiter.abort();
        let _ = waiter.await;
        assert_eq!((l.running(), l.queued()), (0, 0));
        let _again = l.acquire("v", NONE).await.expect("the slot is free");
        assert_eq!(l.running(), 1);
    }
}
