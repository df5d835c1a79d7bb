//! The state of one granted run's proxy, shared by the plain proxy (`proxy.rs`) and the
//! TLS termination of secret-bound connections (`intercept.rs`): the settings, the grant,
//! the ledger as it fills, and the counters of each host's bytes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use gearbox_core::{EgressHost, EgressLedger, EgressRefusal, Network};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Response, StatusCode};
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

use crate::NetworkConfig;
use crate::ca::RunCa;
use crate::secrets::{RunSecrets, Secret};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type Body = BoxBody<Bytes, BoxError>;

/// Hosts listed one by one in a ledger; the rest are summed under `(other hosts)`.
pub(crate) const MAX_LEDGER_HOSTS: usize = 64;
/// Refusals listed one by one; `refused_total` counts them all.
pub(crate) const MAX_LEDGER_REFUSALS: usize = 64;
pub(crate) struct Settings {
    pub(crate) config: NetworkConfig,
    pub(crate) allow_private: Vec<IpNet>,
    pub(crate) root: PathBuf,
    /// `[[secrets]]`, read when the server starts.
    pub(crate) secrets: Vec<Secret>,
    /// The client side of connections re-encrypted for a secret (none without secrets).
    pub(crate) upstream_tls: Option<Arc<rustls::ClientConfig>>,
}

pub(crate) struct RunState {
    pub(crate) grant: Network,
    pub(crate) settings: Arc<Settings>,
    pub(crate) ledger: Mutex<Book>,
    /// Connections open at once (`max_connections`): each accepted connection holds one,
    /// and a tunnel takes over its connection's.
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) stop: tokio_util::sync::CancellationToken,
    /// The run's secrets with their placeholders, and the CA that signs for their hosts.
    pub(crate) secrets: Option<RunSecrets>,
    pub(crate) ca: Option<RunCa>,
}

impl RunState {
    pub(crate) fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn refuse(&self, host: &str, port: u16, reason: &str) {
        tracing::info!(host, port, reason, "egress refused");
        self.book()
            .refused(format!("{host}:{port}"), reason.to_string());
    }
}

pub(crate) fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut r = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// A stream that counts the bytes written to it (up) and read from it (down).
pub(crate) struct Counted<S> {
    pub(crate) inner: S,
    pub(crate) bytes: Arc<HostBytes>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.bytes.down.fetch_add(n as u64, Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &r {
            self.bytes.up.fetch_add(*n as u64, Ordering::Relaxed);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Bytes of one host, counted as they pass (a run's end reads them, whatever is in flight).
#[derive(Default)]
pub(crate) struct HostBytes {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
}

/// The ledger as it fills.
pub(crate) struct Book {
    granted: Vec<String>,
    hosts: Vec<(String, u64, Arc<HostBytes>)>,
    index: HashMap<String, usize>,
    refused: Vec<EgressRefusal>,
    refused_total: u64,
}

impl Book {
    pub(crate) fn new(grant: &Network) -> Book {
        Book {
            granted: grant.patterns(),
            hosts: Vec::new(),
            index: HashMap::new(),
            refused: Vec::new(),
            refused_total: 0,
        }
    }

    /// Count one request (or tunnel) to `key`; returns the host's byte counters.
    pub(crate) fn request(&mut self, key: &str) -> Arc<HostBytes> {
        let (i, bytes) = self.entry(key);
        self.hosts[i].1 += 1;
        bytes
    }

    /// The byte counters of `key`, counting no request (a connection whose requests are
    /// counted one by one as they pass).
    pub(crate) fn counters(&mut self, key: &str) -> Arc<HostBytes> {
        self.entry(key).1
    }

    fn entry(&mut self, key: &str) -> (usize, Arc<HostBytes>) {
        let key = if self.index.contains_key(key) || self.index.len() < MAX_LEDGER_HOSTS {
            key
        } else {
            "(other hosts)"
        };
        let i = match self.index.get(key) {
            Some(&i) => i,
            None => {
                self.hosts
                    .push((key.to_string(), 0, Arc::new(HostBytes::default())));
                self.index.insert(key.to_string(), self.hosts.len() - 1);
                self.hosts.len() - 1
            }
        };
        (i, self.hosts[i].2.clone())
    }

    pub(crate) fn refused(&mut self, host: String, reason: String) {
        self.refused_total += 1;
        if self.refused.len() < MAX_LEDGER_REFUSALS {
            self.refused.push(EgressRefusal { host, reason });
        }
    }

    pub(crate) fn snapshot(&self) -> EgressLedger {
        EgressLedger {
            granted: self.granted.clone(),
            hosts: self
                .hosts
                .iter()
                .map(|(host, requests, b)| EgressHost {
                    host: host.clone(),
                    requests: *requests,
                    bytes_up: b.up.load(Ordering::Relaxed),
                    bytes_down: b.down.load(Ordering::Relaxed),
                })
                .collect(),
            refused: self.refused.clone(),
            refused_total: self.refused_total,
        }
    }
}
