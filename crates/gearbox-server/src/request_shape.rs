//! A request the transport cannot read, answered for its id.
//!
//! rmcp's transports read each message as a `ClientJsonRpcMessage`. A line (or HTTP body)
//! that is JSON but not of that shape gets, from rmcp's stdio transport, an `-32600` with no
//! `id` member, which no client matches to its call (it waits for ever), and from its HTTP
//! transport a `415` (rewritten to a `400` with `id: null`, `http/mod.rs`). A request nested
//! deeper than the parser reads (128 levels) is taken for bytes that are not JSON and gets
//! nothing at all. When such a message is an object with a `method` and an id the protocol
//! allows (an integer or a string), it is a request whose caller can be answered:
//! [`unreadable`] gives its id and what is wrong with it. The stdio transport (`stdio.rs`)
//! then passes on a [`stand_in`] request under that id (as it does for a request too long to
//! read), which the server answers with `-32600` and the message it carries; the HTTP layer
//! answers at once.
//!
//! Which messages are unreadable is decided by rmcp's own parse (the same type, the same
//! function), so the two never disagree.

use rmcp::model::{ClientJsonRpcMessage, ClientRequest, CustomRequest, RequestId};
use serde_json::Value;

/// The method of the request that stands, under a client's id, for one the stdio transport
/// could not read: answered `-32600` with the message it carries, and with nothing else.
pub const STAND_IN_METHOD: &str = "gearbox/unread_request";

/// The stand-in for an unread request: [`STAND_IN_METHOD`] under its `id`, carrying the
/// message its caller gets.
pub fn stand_in(id: RequestId, message: String) -> ClientJsonRpcMessage {
    let params = serde_json::json!({ "message": message });
    ClientJsonRpcMessage::request(
        ClientRequest::CustomRequest(CustomRequest::new(STAND_IN_METHOD, Some(params))),
        id,
    )
}

/// The message a request of `method` with `params` is answered with if it is a stand-in.
/// A client calling the method itself without a message gets "method not found", as for any
/// unknown method; with one, its own message back.
pub fn stand_in_message<'a>(method: &str, params: Option<&'a Value>) -> Option<&'a str> {
    if method != STAND_IN_METHOD {
        return None;
    }
    params?.get("message")?.as_str()
}

/// If `bytes` is a request the transport will not read but whose id can be answered (of the
/// wrong shape, or too deep): that id and why the request is not one. `None` for a readable
/// message, for bytes that are not JSON (ignored, as rmcp and the official SDKs do), and for
/// a message without a `method` (a response) or without an answerable id.
pub fn unreadable_request(bytes: &[u8]) -> Option<(RequestId, String)> {
    let bytes = without_bom(bytes);
    let error = serde_json::from_slice::<ClientJsonRpcMessage>(bytes).err()?;
    unreadable(bytes, &error)
}

/// [`unreadable_request`] for `bytes` (without a byte order mark) whose parse as a client
/// message has just failed with `error`: the stdio transport parses each line once.
pub fn unreadable(bytes: &[u8], error: &serde_json::Error) -> Option<(RequestId, String)> {
    why_unreadable(bytes, error).or_else(|| too_deep(bytes, error))
}

/// A request of the wrong shape: its id and what is wrong.
fn why_unreadable(bytes: &[u8], error: &serde_json::Error) -> Option<(RequestId, String)> {
    if !error.is_data() {
        return None;
    }
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(bytes) else {
        return None;
    };
    let method = message.get("method")?;
    let id = answerable_id(message.get("id")?)?;
    let params = message.get("params").filter(|p| !p.is_null());
    let meta = params.and_then(|p| p.get("_meta")).filter(|m| !m.is_null());
    let why = if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        r#""jsonrpc" must be "2.0""#.to_string()
    } else if !method.is_string() {
        r#""method" must be a string"#.to_string()
    } else if params.is_some_and(|p| !p.is_object()) {
        r#""params" must be an object"#.to_string()
    } else if meta.is_some_and(|m| !m.is_object()) {
        r#""params._meta" must be an object"#.to_string()
    } else {
        error.to_string()
    };
    Some((id, why))
}

/// `bytes` without a leading UTF-8 byte order mark (rmcp's reader skips one).
pub fn without_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
}

/// The longest id taken back from bytes the parser could not read (a longer one is not
/// echoed).
const MAX_ID: usize = 1024;

/// The reason given for a request nested deeper than the parser reads.
pub const TOO_DEEP: &str = "the message is nested more than 128 levels deep";

/// If `bytes` failed to parse with `error` because they are nested deeper than serde_json
/// reads (128 levels: valid JSON it does not read, which the transport would take for bytes
/// that are not JSON and leave unanswered), and they are a request with an id that can be
/// answered: that id and why.
fn too_deep(bytes: &[u8], error: &serde_json::Error) -> Option<(RequestId, String)> {
    // serde_json says so only in its message ("recursion limit exceeded at line …"; pinned
    // by a test).
    if !error.to_string().starts_with("recursion limit exceeded") {
        return None;
    }
    let mut scan = IdScan::default();
    scan.feed(bytes);
    Some((scan.request_id()?, TOO_DEEP.to_string()))
}

/// Finds, in a stream of bytes, the value of a JSON object's top-level `"id"` member and
/// whether it has a top-level `"method"`, without parsing it (no depth or size limit: the
/// bytes may be too long or too deep for the parser). Strings, escapes and nesting are
/// tracked, so an `"id"` inside the params is not taken for it. An id that is `null`, an
/// object, over [`MAX_ID`] bytes, or behind a key written with escapes is not taken.
#[derive(Default)]
pub struct IdScan {
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
    /// A top-level `method` key was read.
    method: bool,
}

impl IdScan {
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.id.is_some() && self.method {
                return;
            }
            if let Some(v) = self.value.as_mut() {
                if v[0] == b'"' {
                    v.push(b);
                    if self.escaped {
                        self.escaped = false;
                    } else if b == b'\\' {
                        self.escaped = true;
                    } else if b == b'"' {
                        self.id = self.value.take();
                        continue;
                    }
                    if v.len() > MAX_ID {
                        // Too long to echo: the rest of it is read as any other string.
                        self.in_string = true;
                        self.value = None;
                        self.key_is_id = false;
                    }
                    continue;
                }
                if b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E') {
                    v.push(b);
                    if v.len() > MAX_ID {
                        self.value = None;
                        self.key_is_id = false;
                    }
                    continue;
                }
                // The number ended at this byte, which is read as usual below.
                self.id = self.value.take();
                self.key_is_id = false;
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
                        self.method |= self.key == b"method";
                    }
                    continue;
                }
                if self.depth == 1 && !self.after_colon && self.key.len() <= 6 {
                    self.key.push(b);
                }
                continue;
            }
            let id_value_next =
                self.depth == 1 && self.after_colon && self.key_is_id && self.id.is_none();
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
                b' ' | b'\t' | b'\r' | b'\n' => {}
                _ => {
                    if self.depth == 1 && self.after_colon {
                        self.key_is_id = false;
                    }
                }
            }
        }
    }

    /// The id of the request scanned, once its bytes are over (a number may end with them):
    /// `None` without a top-level `method` (a response is never answered) or without an id
    /// the protocol allows (an integer or a string).
    pub fn request_id(self) -> Option<RequestId> {
        if !self.method {
            return None;
        }
        let text = match (self.id, self.value) {
            (Some(id), _) => id,
            (None, Some(v)) if v[0] != b'"' => v,
            _ => return None,
        };
        answerable_id(&serde_json::from_slice::<Value>(&text).ok()?)
    }
}

/// `id` as a request id, if the protocol allows it: a string or an integer.
fn answerable_id(id: &Value) -> Option<RequestId> {
    match id {
        Value::String(s) => Some(RequestId::String(s.as_str().into())),
        Value::Number(n) => Some(RequestId::Number(n.as_i64()?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str) -> Option<(Value, String)> {
        unreadable_request(line.as_bytes()).map(|(id, why)| (id.into_json_value(), why))
    }

    fn id_of(line: &str) -> Option<Value> {
        let mut scan = IdScan::default();
        // Fed in small pieces, as reads come.
        for chunk in line.as_bytes().chunks(3) {
            scan.feed(chunk);
        }
        scan.request_id().map(RequestId::into_json_value)
    }

    #[test]
    fn the_id_is_the_top_level_one_of_a_request_wherever_it_comes() {
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":51,"method":"x"}"#),
            Some(Value::from(51))
        );
        assert_eq!(
            id_of(r#"{"method":"x","params":{"id":5,"a":[{"id":6}]},"id":"a\"b}"}"#),
            Some(Value::from("a\"b}"))
        );
        assert_eq!(
            id_of(r#"{ "id" : -7 , "method": "x"}"#),
            Some(Value::from(-7))
        );
        assert_eq!(
            id_of(r#"{"params":{"k":"\"id\":9","method":1},"id":3,"method":"m"}"#),
            Some(Value::from(3))
        );
        // A number ending the bytes, and one right before a brace.
        assert_eq!(id_of(r#"{"method":"x","id":42"#), Some(Value::from(42)));
        assert_eq!(id_of(r#"{"method":"x","id":43}"#), Some(Value::from(43)));
        // Not a request: a notification, a response, a method only inside the params.
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#),
            None
        );
        assert_eq!(id_of(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#), None);
        assert_eq!(id_of(r#"{"id":9,"params":{"method":"x"}}"#), None);
        assert_eq!(id_of(r#"{"id":10,"methods":"x"}"#), None);
        // Ids that cannot be answered.
        assert_eq!(id_of(r#"{"id":null,"method":"x"}"#), None);
        assert_eq!(id_of(r#"{"id":{"a":1},"method":"x"}"#), None);
        assert_eq!(id_of(r#"{"id":1.5,"method":"x"}"#), None);
        assert_eq!(id_of(r#"{"x":"id","y":1,"method":"x"}"#), None);
        assert_eq!(id_of("not json at all"), None);
        let long = format!(r#"{{"id":"{}","method":"x"}}"#, "x".repeat(MAX_ID + 10));
        assert_eq!(id_of(&long), None);
        let long = format!(r#"{{"id":{},"method":"x"}}"#, "9".repeat(MAX_ID + 10));
        assert_eq!(id_of(&long), None);
    }

    #[test]
    fn a_request_too_deep_to_parse_is_answered_for_its_id() {
        let deep = |id: &str, depth: usize| {
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"x":{}{}}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        let line = deep("7", 200);
        let error = serde_json::from_slice::<ClientJsonRpcMessage>(line.as_bytes())
            .expect_err("too deep for serde_json");
        // serde_json classes it with syntax errors: the transport would ignore the line.
        assert!(!error.is_data(), "{error}");
        assert_eq!(
            too_deep(line.as_bytes(), &error),
            Some((RequestId::Number(7), TOO_DEEP.to_string()))
        );
        assert_eq!(
            unreadable_request(line.as_bytes()),
            Some((RequestId::Number(7), TOO_DEEP.to_string()))
        );
        // Not too deep, or not JSON: not this answer.
        let cut = &line[..40];
        let error =
            serde_json::from_slice::<ClientJsonRpcMessage>(cut.as_bytes()).expect_err("cut short");
        assert_eq!(too_deep(cut.as_bytes(), &error), None);
        assert!(serde_json::from_slice::<ClientJsonRpcMessage>(deep("8", 100).as_bytes()).is_ok());
    }

    #[test]
    fn readable_messages_pass() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":"a","method":"ping","params":null}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"k":1}}}"#,
            // An unknown method is read (as a custom request) and answered -32601 later.
            r#"{"jsonrpc":"2.0","id":3,"method":"no/such","params":{"x":1}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            "\u{feff}{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"}",
        ] {
            assert_eq!(check(line), None, "{line}");
        }
    }

    #[test]
    fn an_unreadable_request_gives_its_id_and_why() {
        let cases = [
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":"x"}"#,
                Value::from(1),
                r#""params" must be an object"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":"two","method":"tools/list","params":{"_meta":"x"}}"#,
                Value::from("two"),
                r#""params._meta" must be an object"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"ping","params":[1]}"#,
                Value::from(3),
                r#""params" must be an object"#,
            ),
            (
                r#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#,
                Value::from(4),
                r#""jsonrpc" must be "2.0""#,
            ),
            (
                r#"{"id":-5,"method":"ping"}"#,
                Value::from(-5),
                r#""jsonrpc" must be "2.0""#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":7}"#,
                Value::from(6),
                r#""method" must be a string"#,
            ),
        ];
        for (line, id, why) in cases {
            assert_eq!(check(line), Some((id, why.to_string())), "{line}");
        }
    }

    #[test]
    fn what_cannot_be_answered_is_left_to_the_transport() {
        for line in [
            // Not JSON, or cut short: ignored, as rmcp and the official SDKs do.
            r#"{"jsonrpc":"2.0","id":1,"method":"ping""#,
            "not json",
            // An id the protocol does not allow: it cannot be echoed.
            r#"{"jsonrpc":"2.0","id":true,"method":"ping","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping","params":"x"}"#,
            r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"ping","params":"x"}"#,
            // No id: a notification is never answered.
            r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":"x"}"#,
            // No method: a response, not a request.
            r#"{"jsonrpc":"2.0","id":1,"result":5,"error":{}}"#,
            r#"[1,2]"#,
        ] {
            assert_eq!(check(line), None, "{line}");
        }
    }
}
