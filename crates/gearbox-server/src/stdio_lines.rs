//! The stdio transport's reader: lines up to [`MAX_LINE`] pass unchanged; a longer one never
//! reaches the MCP layer, and if it was a request, its id is answered with a clear error.
//!
//! rmcp's stdio transport drops a line over its limit (16 MiB) with a log line and nothing
//! else: the client that sent it waits for an answer that never comes. This reader holds
//! each line until its newline (rmcp holds it too, to parse it), passes it on whole when it
//! fits, and replaces one that does not by a small request of the reserved method
//! [`OVERSIZED_METHOD`] with the dropped request's id, which the server answers with an
//! error (`server.rs`). The id is read from the line's top level (strings and nesting
//! tracked, so an `"id"` inside the params is not taken for it), wherever it comes in the
//! line; a line without one (a notification, or not JSON) is dropped, as before, and logged.
//!
//! Written by hand: no crate frames JSON-RPC lines with a limit and an answer; the scan
//! is a few dozen lines of state over bytes.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The longest line passed on, its newline not counted: rmcp's own limit
/// (`DEFAULT_MAX_LINE_LENGTH`, 16 MiB with the newline), so that every line it would have
/// read is read, and none reaches it that it would drop.
pub const MAX_LINE: usize = 16 * 1024 * 1024 - 1;

/// The method of the request that stands for a dropped one; answered with an error only.
pub const OVERSIZED_METHOD: &str = "gearbox/oversized_request";

/// The buffer space kept between lines.
const KEEP: usize = 64 * 1024;

/// The longest id taken back from a dropped line (a longer one is not echoed).
const MAX_ID: usize = 1024;

/// Reads lines from `inner`, at most `limit` bytes each (the newline not counted).
pub struct BoundedLines<R> {
    inner: R,
    limit: usize,
    /// The current line, while it fits.
    line: Vec<u8>,
    /// Bytes ready for the reader, from `out_pos`.
    out: Vec<u8>,
    out_pos: usize,
    /// The line being dropped: its length so far and the scan for its id.
    dropping: Option<(usize, IdScan)>,
    scratch: Box<[u8]>,
}

impl<R> BoundedLines<R> {
    pub fn new(inner: R, limit: usize) -> Self {
        BoundedLines {
            inner,
            limit,
            line: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            dropping: None,
            scratch: vec![0; 64 * 1024].into_boxed_slice(),
        }
    }

    /// Take in `bytes` read from the inner reader.
    fn take_in(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let newline = bytes.iter().position(|&b| b == b'\n');
            let (part, rest) = match newline {
                Some(i) => (&bytes[..i], &bytes[i + 1..]),
                None => (bytes, &[][..]),
            };
            bytes = rest;
            if let Some((len, scan)) = &mut self.dropping {
                *len += part.len();
                scan.feed(part);
            } else if self.line.len() + part.len() > self.limit {
                let mut scan = IdScan::default();
                scan.feed(&self.line);
                scan.feed(part);
                self.dropping = Some((self.line.len() + part.len(), scan));
                self.line = Vec::new();
            } else {
                self.line.extend_from_slice(part);
            }
            if newline.is_some() {
                self.end_line();
            }
        }
    }

    /// The current line ended: pass it on, or what stands for it.
    fn end_line(&mut self) {
        match self.dropping.take() {
            None => {
                if self.out.is_empty() {
                    // The usual case: the line becomes the output without a copy.
                    std::mem::swap(&mut self.out, &mut self.line);
                } else {
                    self.out.append(&mut self.line);
                }
                self.out.push(b'\n');
            }
            Some((len, scan)) => match scan.finish() {
                Some(id) => {
                    tracing::warn!(
                        bytes = len,
                        limit = self.limit,
                        "a request on stdio is over the line limit: dropped, its id answered with an error"
                    );
                    let id = String::from_utf8_lossy(&id);
                    let stand_in = format!(
                        r#"{{"jsonrpc":"2.0","id":{id},"method":"{OVERSIZED_METHOD}","params":{{"bytes":{len},"limit":{}}}}}"#,
                        self.limit
                    );
                    self.out.extend_from_slice(stand_in.as_bytes());
                    self.out.push(b'\n');
                }
                None => tracing::warn!(
                    bytes = len,
                    limit = self.limit,
                    "a message on stdio without an id is over the line limit: dropped"
                ),
            },
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for BoundedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                    // What one long line needed is not kept for the short ones after it.
                    this.out.shrink_to(KEEP);
                    this.line.shrink_to(KEEP);
                }
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 {
                        // The end of input. A last line without its newline is not passed
                        // on: rmcp delivers no line without one either.
                        return Poll::Ready(Ok(()));
                    }
                    let scratch = std::mem::take(&mut this.scratch);
                    this.take_in(&scratch[..n]);
                    this.scratch = scratch;
                }
            }
        }
    }
}

/// Finds the value of a JSON object's top-level `"id"` member in a stream of bytes: a
/// number or a string, kept as its JSON text (`null`, an object or a key written with
/// escapes are not taken: the line is then dropped unanswered, as a notification is).
#[derive(Default)]
struct IdScan {
    depth: u32,
    /// Inside a string (at any depth); `escaped` right after a backslash in one.
    in_string: bool,
    escaped: bool,
    /// At the top level: the first bytes of the key being read, whether the last key read
    /// was `id`, and whether its colon has been read.
    key: Vec<u8>,
    key_is_id: bool,
    after_colon: bool,
    /// The id's text while it is read; `id` once it is whole.
    value: Option<Vec<u8>>,
    id: Option<Vec<u8>>,
}

impl IdScan {
    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.id.is_some() {
                return;
            }
            if let Some(v) = self.value.as_mut() {
                v.push(b);
                if v[0] == b'"' {
                    if self.escaped {
                        self.escaped = false;
                    } else if b == b'\\' {
                        self.escaped = true;
                    } else if b == b'"' {
                        self.id = self.value.take();
                        continue;
                    }
                } else if !(b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')) {
                    // The number ended at this byte.
                    v.pop();
                    self.id = self.value.take();
                    return;
                }
                if v.len() > MAX_ID {
                    // Too long to echo: the rest of it is read as any other value.
                    self.in_string = v[0] == b'"';
                    self.value = None;
                    self.key_is_id = false;
                }
                continue;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                    if self.depth == 1 && !self.after_colon {
                        self.key_is_id = self.key == b"id";
                    }
                    continue;
                }
                if self.depth == 1 && !self.after_colon && self.key.len() <= 2 {
                    self.key.push(b);
                }
                continue;
            }
            let id_value_next = self.depth == 1 && self.after_colon && self.key_is_id;
            match b {
                b'"' if id_value_next => {
                    self.value = Some(vec![b]);
                    self.escaped = false;
                }
                b'-' | b'0'..=b'9' if id_value_next => self.value = Some(vec![b]),
                b'"' => {
                    self.in_string = true;
                    self.escaped = false;
                    self.key.clear();
                }
                b'{' | b'[' => {
                    if self.depth == 1 && self.after_colon {
                        self.key_is_id = false;
                    }
                    self.depth += 1;
                }
                b'}' | b']' => self.depth = self.depth.saturating_sub(1),
                b':' if self.depth == 1 => self.after_colon = true,
                b',' if self.depth == 1 => {
                    self.after_colon = false;
                    self.key_is_id = false;
                }
                b' ' | b'\t' | b'\r' => {}
                _ => {
                    if self.depth == 1 && self.after_colon {
                        self.key_is_id = false;
                    }
                }
            }
        }
    }

    /// The id, once the line is over (a number may end with it).
    fn finish(self) -> Option<Vec<u8>> {
        match (self.id, self.value) {
            (Some(id), _) => Some(id),
            (None, Some(v)) if v[0] != b'"' => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn through(input: &[u8], limit: usize) -> String {
        let mut out = String::new();
        BoundedLines::new(input, limit)
            .read_to_string(&mut out)
            .await
            .expect("read");
        out
    }

    fn id_of(line: &str) -> Option<String> {
        let mut scan = IdScan::default();
        // Fed in small pieces, as reads come.
        for chunk in line.as_bytes().chunks(3) {
            scan.feed(chunk);
        }
        scan.finish().map(|v| String::from_utf8(v).expect("utf-8"))
    }

    #[test]
    fn the_id_is_the_top_level_one_wherever_it_comes() {
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":51,"method":"x"}"#).as_deref(),
            Some("51")
        );
        assert_eq!(
            id_of(r#"{"method":"x","params":{"id":5,"a":[{"id":6}]},"id":"a\"b}"}"#).as_deref(),
            Some(r#""a\"b}""#)
        );
        assert_eq!(id_of(r#"{ "id" : -7 , "x": 1}"#).as_deref(), Some("-7"));
        assert_eq!(
            id_of(r#"{"params":{"k":"\"id\":9"},"id":3}"#).as_deref(),
            Some("3")
        );
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#),
            None
        );
        assert_eq!(id_of(r#"{"id":null,"method":"x"}"#), None);
        assert_eq!(id_of(r#"{"id":{"a":1},"method":"x"}"#), None);
        assert_eq!(id_of(r#"{"x":"id","y":1}"#), None);
        assert_eq!(id_of("not json at all"), None);
        assert_eq!(id_of(r#"{"method":"x","id":42"#).as_deref(), Some("42"));
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(MAX_ID + 10));
        assert_eq!(id_of(&long), None);
    }

    #[tokio::test]
    async fn lines_that_fit_pass_unchanged() {
        let input = b"{\"a\":1}\n\n{\"b\":2}\n";
        assert_eq!(through(input, 64).await.as_bytes(), input);
        // The end of input ends what it cut short.
        assert_eq!(through(b"{\"a\":1}\n{\"b\"", 64).await, "{\"a\":1}\n");
    }

    #[tokio::test]
    async fn an_oversized_request_becomes_its_stand_in_and_the_rest_goes_on() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{{\"id\":1,\"code\":\"{}\"}},\"id\":42}}",
            "#".repeat(500)
        );
        let input = format!("{{\"a\":1}}\n{big}\n{{\"b\":2}}\n");
        let out = through(input.as_bytes(), 100).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(lines[0], "{\"a\":1}");
        let stand_in: serde_json::Value = serde_json::from_str(lines[1]).expect("json");
        assert_eq!(stand_in["id"], 42);
        assert_eq!(stand_in["method"], OVERSIZED_METHOD);
        assert_eq!(stand_in["params"]["bytes"], big.len());
        assert_eq!(stand_in["params"]["limit"], 100);
        assert_eq!(lines[2], "{\"b\":2}");
    }

    #[tokio::test]
    async fn an_oversized_line_without_an_id_is_dropped() {
        let input = format!("{}\n{{\"b\":2}}\n{}", "x".repeat(300), "y".repeat(300));
        assert_eq!(through(input.as_bytes(), 100).await, "{\"b\":2}\n");
    }
}
