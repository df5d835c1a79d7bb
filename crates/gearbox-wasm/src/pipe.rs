//! In-memory stdout/stderr for the guest: keeps at most `cap` bytes, counts the rest.
//!
//! Unlike wasmtime-wasi's `MemoryOutputPipe`, a full pipe never fails the guest's write: the
//! program keeps running (as it would with a reader that drops bytes) and the outcome says
//! `*_truncated`. Only the kept bytes are ever held in memory.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use gearbox_core::CappedOutput;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// How many bytes one guest write may hand over at once.
const WRITE_PERMIT_BYTES: usize = 1024 * 1024;

#[derive(Default)]
struct Captured {
    kept: Vec<u8>,
    total: u64,
}

/// A capped output pipe; clones share the same buffer.
#[derive(Clone)]
pub(crate) struct CappedPipe {
    cap: usize,
    inner: Arc<Mutex<Captured>>,
}

impl CappedPipe {
    pub(crate) fn new(cap_bytes: u64) -> Self {
        CappedPipe {
            cap: usize::try_from(cap_bytes).unwrap_or(usize::MAX),
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Captured> {
        // A panic while holding the lock leaves a consistent buffer: keep using it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, bytes: &[u8]) {
        let mut c = self.lock();
        c.total += bytes.len() as u64;
        let room = self.cap.saturating_sub(c.kept.len());
        c.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The kept bytes, as written.
    pub(crate) fn take_bytes(&self) -> Vec<u8> {
        std::mem::take(&mut self.lock().kept)
    }

    /// What was kept, as text with the truncation marker of `gearbox_core::capture`.
    pub(crate) fn finish(&self) -> CappedOutput {
        let mut c = self.lock();
        let kept = std::mem::take(&mut c.kept);
        gearbox_core::capture::finish(kept, c.total)
    }
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl AsyncWrite for CappedPipe {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_cap_and_counts_the_rest() {
        let mut p = CappedPipe::new(4);
        p.write(Bytes::from_static(b"hello")).expect("write");
        p.write(Bytes::from_static(b" world")).expect("write");
        let out = p.finish();
        assert!(out.truncated);
        assert_eq!(out.total_bytes, 11);
        assert!(
            out.text
                .starts_with("hell\n[gearbox: output truncated, 7 more"),
            "{}",
            out.text
        );
    }
}
