//! The stdio transport: rmcp's framing (one JSON-RPC message per line, its codec for what
//! the server writes), with a reader that answers what rmcp's own would leave unanswered.
//!
//! rmcp's stdio transport drops a line over its limit (16 MiB) with a log line, and answers a
//! line that is JSON but not of a message's shape with an `-32600` that has no `id`: in both
//! cases the client that sent a request waits for an answer that never comes. This reader
//! reads each line once, bounded, and parses it once, as rmcp does (the same type, the same
//! function); then:
//! - a line over [`MAX_LINE`] is never held: if it was a request, a small stand-in request
//!   under its id takes its place (`request_shape::stand_in`), which the server answers
//!   with an error saying so (`server.rs`). The id is read from the line's top level by
//!   [`IdScan`] as the bytes pass (strings and nesting tracked, so an `"id"` inside the
//!   params is not taken for it), wherever it comes in the line; a line without a
//!   top-level `method` (a response) is not answered;
//! - a request of the wrong shape, or nested deeper than serde_json reads (128 levels), with
//!   an id the protocol allows is replaced by the stand-in of `request_shape.rs`, answered
//!   `-32600` for its id, saying what is wrong;
//! - a batch (an array of messages on one line, which MCP 2025-03-26 has servers accept and
//!   rmcp's reader refuses) is taken message by message, each answered on its own line;
//! - what has no answerable id keeps rmcp's behaviour: bytes that are not JSON are ignored,
//!   a notification is never answered, and other JSON gets rmcp's id-less `-32600`.
//!
//! Written by hand: rmcp's reader is not open to extension, and no crate frames JSON-RPC
//! lines with a limit and an answer. What the server writes goes through rmcp's codec, as
//! before.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures::SinkExt;
use rmcp::RoleServer;
use rmcp::model::{ClientJsonRpcMessage, ErrorData, RequestId, ServerJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::{JsonRpcMessageCodec, JsonRpcMessageCodecError};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Mutex;
use tokio_util::codec::FramedWrite;

use crate::request_shape::{self, IdScan};

/// The longest line read, its newline not counted: rmcp's own limit
/// (`DEFAULT_MAX_LINE_LENGTH`, 16 MiB with the newline).
pub const MAX_LINE: usize = 16 * 1024 * 1024 - 1;

/// The buffer space kept between lines.
const KEEP: usize = 64 * 1024;

type Writer<W> = Arc<Mutex<FramedWrite<W, JsonRpcMessageCodec<ServerJsonRpcMessage>>>>;

/// The server's side of MCP over a pair of byte streams (stdin and stdout).
pub struct StdioTransport<R, W> {
    lines: Lines<R>,
    write: Writer<W>,
    /// rmcp's id-less `-32600`, owed for a line that is JSON but no message (`Queue`), and
    /// written but not yet flushed (`Flush`): kept here so that a `receive` cancelled while
    /// it writes resumes where it stopped.
    owed: Option<Owed>,
    /// The messages of a batch line not yet passed on.
    batch: VecDeque<ClientJsonRpcMessage>,
}

enum Owed {
    Queue,
    Flush,
}

impl<R, W> StdioTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    pub fn new(read: R, write: W) -> Self {
        StdioTransport {
            lines: Lines::new(read, MAX_LINE),
            write: Arc::new(Mutex::new(FramedWrite::new(
                write,
                JsonRpcMessageCodec::default(),
            ))),
            owed: None,
            batch: VecDeque::new(),
        }
    }

    /// What to do for the line that just ended.
    fn next(&self, line: Line) -> Next {
        let limit = self.lines.limit;
        let line = match line {
            Line::Over {
                bytes,
                id: Some(id),
            } => {
                tracing::warn!(
                    bytes,
                    limit,
                    "a request on stdio is over the line limit: dropped, its id answered with an error"
                );
                return Next::Pass(request_shape::stand_in(
                    id,
                    format!(
                        "the request was not read: it is {bytes} bytes, over the {limit} bytes a message on stdio may be"
                    ),
                ));
            }
            Line::Over { bytes, id: None } => {
                tracing::warn!(
                    bytes,
                    limit,
                    "a message on stdio without a request's id is over the line limit: dropped"
                );
                return Next::Nothing;
            }
            Line::Whole => request_shape::without_bom(self.lines.line()),
        };
        if line.trim_ascii_start().starts_with(b"[") {
            batch(line)
        } else {
            message_of(line)
        }
    }
}

/// What one JSON text (a line, or an element of a batch) comes to.
fn message_of(text: &[u8]) -> Next {
    if text.iter().all(u8::is_ascii_whitespace) {
        return Next::Nothing;
    }
    let error = match serde_json::from_slice::<ClientJsonRpcMessage>(text) {
        Ok(message) => return Next::Pass(message),
        Err(e) => e,
    };
    if let Some((id, why)) = request_shape::unreadable(text, &error) {
        tracing::debug!(%why, "an unreadable request on stdio");
        return Next::Pass(request_shape::stand_in(
            id,
            format!("Invalid Request: {why}"),
        ));
    }
    if !error.is_data() {
        // Not JSON: no id to answer, and an answer could start an error storm with a peer
        // that echoes it (rmcp and the official SDKs ignore it).
        tracing::debug!(%error, "ignoring a line on stdio that is not JSON");
        Next::Nothing
    } else if is_notification(text) {
        tracing::debug!(%error, "ignoring an unreadable notification");
        Next::Nothing
    } else {
        tracing::debug!(%error, "an unreadable message on stdio");
        Next::Owe
    }
}

/// A JSON-RPC batch (an array of messages on one line; MCP 2025-03-26 has servers accept
/// them, later revisions dropped them): each message is taken, from its own bytes, as if it
/// had come on a line of its own, and answered on its own. An empty batch, or one with a
/// message that has no id to answer, owes rmcp's id-less error once; bytes that are not a
/// JSON array are ignored, as any line that is not JSON.
fn batch(line: &[u8]) -> Next {
    let elements = match serde_json::from_slice::<Vec<&RawValue>>(line) {
        Ok(elements) => elements,
        Err(error) => {
            tracing::debug!(%error, "ignoring a line on stdio that is not JSON");
            return Next::Nothing;
        }
    };
    let mut messages = Vec::with_capacity(elements.len());
    let mut owe = elements.is_empty();
    for element in elements {
        match message_of(element.get().as_bytes()) {
            Next::Pass(message) => messages.push(message),
            Next::Nothing => {}
            Next::Owe | Next::Batch(..) => owe = true,
        }
    }
    Next::Batch(messages, owe)
}

/// What a line comes to.
#[expect(
    clippy::large_enum_variant,
    reason = "made once per line and moved out at once, as the service's own `Option` of it is"
)]
enum Next {
    /// A message for the service (the line's, or what stands for it).
    Pass(ClientJsonRpcMessage),
    /// Nothing (a blank line, bytes that are not JSON, a notification).
    Nothing,
    /// rmcp's id-less `-32600`: JSON that is no message and has no id to answer.
    Owe,
    /// The messages of a batch, and whether an id-less error is owed for it.
    Batch(Vec<ClientJsonRpcMessage>, bool),
}

impl<R, W> Transport<RoleServer> for StdioTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = JsonRpcMessageCodecError;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = self.write.clone();
        async move { write.lock().await.send(item).await }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        // Polled inside a `select!` by the service: every step keeps its state in `self`, so
        // a cancelled call loses nothing.
        loop {
            if let Some(owed) = self.owed.as_mut() {
                let mut write = self.write.lock().await;
                if matches!(owed, Owed::Queue) {
                    let error = ServerJsonRpcMessage::error(
                        ErrorData::invalid_request("Invalid request", None),
                        None,
                    );
                    write.feed(error).await.ok()?;
                    *owed = Owed::Flush;
                }
                write.flush().await.ok()?;
                self.owed = None;
            }
            if let Some(message) = self.batch.pop_front() {
                return Some(message);
            }
            let line = match std::future::poll_fn(|cx| self.lines.poll_line(cx)).await {
                Ok(Some(line)) => line,
                Ok(None) => return None,
                Err(e) => {
                    tracing::error!(error = %e, "reading stdin");
                    return None;
                }
            };
            let next = self.next(line);
            self.lines.line_done();
            match next {
                Next::Pass(message) => return Some(message),
                Next::Nothing => {}
                Next::Owe => self.owed = Some(Owed::Queue),
                Next::Batch(messages, owe) => {
                    if owe {
                        self.owed = Some(Owed::Queue);
                    }
                    self.batch.extend(messages);
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.lock().await.close().await
    }
}

/// Whether `line` is a JSON object with a `method` and no `id`: a notification, never
/// answered, whatever its shape.
fn is_notification(line: &[u8]) -> bool {
    matches!(
        serde_json::from_slice::<Value>(line),
        Ok(Value::Object(m)) if m.contains_key("method") && !m.contains_key("id")
    )
}

/// What ended a line.
#[derive(Debug, PartialEq)]
enum Line {
    /// A line that fits, in [`Lines::line`].
    Whole,
    /// A line over the limit, dropped as it passed: its length, and its id if it was a
    /// request with an id that can be answered.
    Over { bytes: usize, id: Option<RequestId> },
}

/// Lines of at most `limit` bytes (the newline not counted) from `inner`.
struct Lines<R> {
    inner: R,
    limit: usize,
    /// The current line, while it fits.
    line: Vec<u8>,
    /// The line being dropped: its length so far and the scan for its id.
    dropping: Option<(usize, IdScan)>,
    /// Bytes read and not yet taken: `read[pos..filled]`.
    read: Box<[u8]>,
    pos: usize,
    filled: usize,
}

impl<R: AsyncRead + Unpin> Lines<R> {
    fn new(inner: R, limit: usize) -> Self {
        Lines {
            inner,
            limit,
            line: Vec::new(),
            dropping: None,
            read: vec![0; 64 * 1024].into_boxed_slice(),
            pos: 0,
            filled: 0,
        }
    }

    /// The next line's end, or `None` at the end of input (a last line without its newline
    /// is not passed on: rmcp delivers none either).
    fn poll_line(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Line>>> {
        loop {
            while self.pos < self.filled {
                let rest = &self.read[self.pos..self.filled];
                let newline = rest.iter().position(|&b| b == b'\n');
                let part = &rest[..newline.unwrap_or(rest.len())];
                self.pos += part.len() + usize::from(newline.is_some());
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
                    return Poll::Ready(Ok(Some(match self.dropping.take() {
                        None => Line::Whole,
                        Some((bytes, scan)) => Line::Over {
                            bytes,
                            id: scan.request_id(),
                        },
                    })));
                }
            }
            let mut buf = ReadBuf::new(&mut self.read);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut buf))?;
            let n = buf.filled().len();
            if n == 0 {
                return Poll::Ready(Ok(None));
            }
            self.pos = 0;
            self.filled = n;
        }
    }

    /// The line that [`Line::Whole`] announced.
    fn line(&self) -> &[u8] {
        &self.line
    }

    /// Done with the current line: the next one starts empty, in the space kept.
    fn line_done(&mut self) {
        self.line.clear();
        // What one long line needed is not kept for the short ones after it.
        self.line.shrink_to(KEEP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What the transport passes on for `input` read in pieces of `piece` bytes, and what it
    /// writes back itself.
    async fn through(input: &[u8], limit: usize, piece: usize) -> (Vec<Value>, String) {
        let (mut feed, read) = tokio::io::duplex(piece);
        let (write, mut written) = tokio::io::duplex(1 << 20);
        let input = input.to_vec();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for chunk in input.chunks(piece) {
                feed.write_all(chunk).await.expect("write");
            }
        });
        let mut t = StdioTransport::new(read, write);
        t.lines.limit = limit;
        let mut got = Vec::new();
        while let Some(m) = t.receive().await {
            got.push(serde_json::to_value(&m).expect("json"));
        }
        writer.await.expect("writer");
        drop(t);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut written, &mut out)
            .await
            .expect("read");
        (got, out)
    }

    #[tokio::test]
    async fn messages_pass_and_what_cannot_be_read_is_answered_or_dropped() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{{\"id\":1,\"code\":\"{}\"}},\"id\":42}}",
            "#".repeat(500)
        );
        let input = [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            "",
            "not json",
            &big,
            &"x".repeat(500),
            r#"{"jsonrpc":"2.0","id":"s","method":"ping","params":"x"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":"x"}"#,
            r#"[1]"#,
            r#" [{"jsonrpc":"2.0","id":7,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":"b","method":"ping","params":"x"}]"#,
            "[]",
            &format!(
                r#"[{{"jsonrpc":"2.0","id":8,"method":"ping","params":{{"x":{}{}}}}}]"#,
                "[".repeat(130),
                "]".repeat(130)
            ),
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\r",
            r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
        ]
        .join("\n")
            + "\n{\"cut\":";
        for piece in [1, 7, 4096] {
            let (got, out) = through(input.as_bytes(), 400, piece).await;
            assert_eq!(got.len(), 9, "{got:?}");
            assert_eq!(got[0], json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}));
            assert_eq!(got[1]["id"], 42);
            assert_eq!(got[1]["method"], request_shape::STAND_IN_METHOD);
            assert_eq!(
                got[1]["params"]["message"],
                format!(
                    "the request was not read: it is {} bytes, over the 400 bytes a message on stdio may be",
                    big.len()
                )
            );
            assert_eq!(got[2]["id"], "s");
            assert_eq!(got[2]["method"], request_shape::STAND_IN_METHOD);
            assert_eq!(
                got[2]["params"]["message"],
                r#"Invalid Request: "params" must be an object"#
            );
            // A batch: each message passed on as if alone on its line, in order.
            assert_eq!(got[3], json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}));
            assert_eq!(got[4]["method"], "notifications/initialized");
            assert_eq!(got[5]["id"], "b");
            assert_eq!(got[5]["method"], request_shape::STAND_IN_METHOD);
            // A batch's request too deep to read, answered for its id.
            assert_eq!(got[6]["id"], 8);
            assert_eq!(
                got[6]["params"]["message"],
                format!("Invalid Request: {}", request_shape::TOO_DEEP)
            );
            assert_eq!(got[7]["id"], 2);
            assert_eq!(got[8]["id"], 3);
            // Only `[1]` and `[]` (JSON, no message, nothing to answer) get rmcp's id-less
            // error.
            let idless = "{\"jsonrpc\":\"2.0\",\"error\":{\"code\":-32600,\"message\":\"Invalid request\"}}\n";
            assert_eq!(out, idless.repeat(2), "piece {piece}");
        }
    }
}
