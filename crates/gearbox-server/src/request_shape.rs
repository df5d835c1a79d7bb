//! A request the transport cannot read, answered for its id.
//!
//! rmcp's transports read each message as a `ClientJsonRpcMessage`. A line (or HTTP body)
//! that is JSON but not of that shape gets, from rmcp's stdio transport, an `-32600` with no
//! `id` member, which no client matches to its call (it waits for ever), and from its HTTP
//! transport a `415` (rewritten to a `400` with `id: null`, `http/mod.rs`). When such a
//! message is an object with a `method` and an id the protocol allows (an integer or a
//! string), it is a request whose caller can be answered: [`why_unreadable`] gives its id and
//! what is wrong with it. The stdio transport (`stdio.rs`) then passes on a stand-in request
//! of [`INVALID_METHOD`] under that id, which the server answers with `-32600`; the HTTP
//! layer answers it at once.
//!
//! Which messages are unreadable is decided by rmcp's own parse (the same type, the same
//! function), so the two never disagree.

use rmcp::model::{ClientJsonRpcMessage, RequestId};
use serde_json::Value;

/// The method of the request that stands for an unreadable one; answered with an error only.
pub const INVALID_METHOD: &str = "gearbox/invalid_request";

/// If `bytes` is a request the transport will not read but whose id can be answered: that
/// id and why the request is not one. `None` for a readable message, for bytes that are not
/// JSON (ignored, as rmcp and the official SDKs do), and for a message without a `method`
/// (a response) or without an answerable id.
pub fn unreadable_request(bytes: &[u8]) -> Option<(RequestId, String)> {
    let bytes = without_bom(bytes);
    let error = serde_json::from_slice::<ClientJsonRpcMessage>(bytes).err()?;
    why_unreadable(bytes, &error)
}

/// The same, for `bytes` (without a byte order mark) whose parse as a client message has
/// just failed with `error`: the transport's reader parses each line once.
pub fn why_unreadable(bytes: &[u8], error: &serde_json::Error) -> Option<(RequestId, String)> {
    if !error.is_data() {
        return None;
    }
    let Ok(Value::Object(message)) = serde_json::from_slice::<Value>(bytes) else {
        return None;
    };
    let method = message.get("method")?;
    let id = match message.get("id")? {
        Value::String(s) => RequestId::String(s.as_str().into()),
        Value::Number(n) => RequestId::Number(n.as_i64()?),
        _ => return None,
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(line: &str) -> Option<(Value, String)> {
        unreadable_request(line.as_bytes()).map(|(id, why)| (id.into_json_value(), why))
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
