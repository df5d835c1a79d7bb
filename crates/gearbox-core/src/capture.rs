//! Reading a program's output while it runs: capped, never blocking the writer, lossy UTF-8.

use std::future::Future;

use tokio::io::{AsyncRead, AsyncReadExt};

/// What was kept of one output stream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CappedOutput {
    /// The kept text, with a truncation marker appended when bytes were dropped.
    pub text: String,
    pub truncated: bool,
    /// Every byte the program wrote, kept or not.
    pub total_bytes: u64,
}

/// Read `reader` to EOF, keeping at most `cap` bytes. Reading continues past the cap (the
/// bytes are counted and dropped) so the writer never blocks on a full pipe. Invalid UTF-8 is
/// replaced; a multi-byte character cut by the cap is dropped whole.
pub async fn read_capped<R: AsyncRead + Unpin>(reader: R, cap: u64) -> CappedOutput {
    read_capped_until(reader, cap, std::future::pending::<()>()).await
}

/// Like [`read_capped`], but stop early (keeping what was read) once `stop` completes and no
/// data arrives. Used when the writer's process is gone but an escaped descendant might still
/// hold the pipe open.
pub async fn read_capped_until<R, S>(mut reader: R, cap: u64, stop: S) -> CappedOutput
where
    R: AsyncRead + Unpin,
    S: Future<Output = ()>,
{
    let mut stop = std::pin::pin!(stop);
    let mut stopped = false;
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    let mut kept: Vec<u8> = Vec::with_capacity(cap.min(64 * 1024));
    let mut total: u64 = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let read = if stopped {
            match tokio::time::timeout(std::time::Duration::from_millis(0), reader.read(&mut buf))
                .await
            {
                Ok(r) => r,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                r = reader.read(&mut buf) => r,
                _ = &mut stop => { stopped = true; continue; }
            }
        };
        match read {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    finish(kept, total)
}

/// Build the captured text from kept bytes and the total count.
pub fn finish(mut kept: Vec<u8>, total: u64) -> CappedOutput {
    let truncated = total > kept.len() as u64;
    if truncated {
        // Do not leave half a character at the cut.
        if let Err(e) = std::str::from_utf8(&kept)
            && e.error_len().is_none()
        {
            kept.truncate(e.valid_up_to());
        }
    }
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if truncated {
        let dropped = total - kept.len() as u64;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(&format!(
            "[gearbox: output truncated, {dropped} more bytes not shown]\n"
        ));
    }
    CappedOutput {
        text,
        truncated,
        total_bytes: total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keeps_everything_under_the_cap() {
        let out = read_capped(&b"hello\n"[..], 100).await;
        assert_eq!(out.text, "hello\n");
        assert!(!out.truncated);
        assert_eq!(out.total_bytes, 6);
    }

    #[tokio::test]
    async fn marks_truncation_and_counts_dropped_bytes() {
        let data = vec![b'x'; 1000];
        let out = read_capped(&data[..], 10).await;
        assert!(out.truncated);
        assert_eq!(out.total_bytes, 1000);
        assert!(
            out.text
                .starts_with("xxxxxxxxxx\n[gearbox: output truncated, 990 more bytes")
        );
    }

    #[tokio::test]
    async fn replaces_invalid_utf8_and_never_splits_a_character() {
        let out = read_capped(&b"a\xffb"[..], 100).await;
        assert_eq!(out.text, "a\u{fffd}b");
        // "é" is two bytes; a cap of 2 keeps "a" and drops the half character.
        let out = read_capped("aé".as_bytes(), 2).await;
        assert!(out.text.starts_with("a\n[gearbox"), "{:?}", out.text);
    }
}
