//! A fleet of replicas behind one Service (docs/HTTP.md, Fleet): session ids that name the
//! replica owning them, and forwarding a request for another replica's session to it.
//!
//! - `[http] replica_id` (or `GEARBOX_REPLICA`, a pod's name) is this replica's name. The
//!   MCP sessions it opens are `NAME.UUID` ([`ReplicaSessions`]); the gearbox sessions it
//!   opens are too (`gearbox_sessions::set_replica`). The UUID stays the whole random part.
//! - `[http] peers` is the other replicas' address with `{replica}` for a name. A request
//!   whose `Mcp-Session-Id`, or (with no `Mcp-Session-Id`) whose `tools/call` argument
//!   `session_id` or `resources/read` of a session resource, names another replica is sent
//!   there unchanged ([`route`]): method, path, headers (the client's own credentials and
//!   `Host` included), body, and the answer streams back. The owner checks the API key again like for any request; forwarding never skips
//!   a check.
//! - The forwarded request carries [`PEER_HEADER`] with the secret the replicas share. A
//!   request that carries it is served where it lands and never forwarded again (the loop
//!   guard); one that carries it with any other value is refused with 403, so a client cannot
//!   pose as a peer.
//! - When the owner cannot be reached, an MCP session answers 404 (the spec's "session
//!   gone": the client initialises again) and a gearbox session call 502, both naming the
//!   replica.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use gearbox_engine::config::HttpConfig;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionManager};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The header a replica adds to the requests it forwards: the shared secret.
pub const PEER_HEADER: &str = "x-gearbox-peer";
/// The environment variable naming this replica (overrides `[http] replica_id`).
pub const ENV_REPLICA: &str = "GEARBOX_REPLICA";
/// The environment variable with the peers' shared secret (overrides `peer_secret_file`).
pub const ENV_PEER_SECRET: &str = "GEARBOX_PEER_SECRET";
/// Shorter secrets stop start-up.
pub const MIN_SECRET_LEN: usize = 16;
/// How long connecting to the owner may take before it counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const MCP_SESSION_ID: &str = "mcp-session-id";

/// This replica's name and how to reach the others.
#[derive(Default)]
pub struct Fleet {
    replica: Option<String>,
    peers: Option<Peers>,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("replica", &self.replica)
            .field("peers", &self.peers.as_ref().map(|p| &p.template))
            .finish()
    }
}

struct Peers {
    /// `http://{replica}.gearbox-headless:8080`.
    template: String,
    secret: HeaderValue,
    secret_sha256: [u8; 32],
    client: reqwest::Client,
}

/// Whether `s` can name a replica: a DNS label (`a-z`, `0-9`, `-` inside), as a pod's name is.
pub fn is_replica_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// The replica an id names: the part before the first `.` when it is a replica name.
pub fn owner_of(id: &str) -> Option<&str> {
    let (owner, rest) = id.split_once('.')?;
    (is_replica_name(owner) && !rest.is_empty()).then_some(owner)
}

impl Fleet {
    /// From `[http]` and the environment (`env_replica` = `GEARBOX_REPLICA`, `env_secret` =
    /// `GEARBOX_PEER_SECRET`). Errors name the setting, never the secret.
    pub fn from_config(
        cfg: &HttpConfig,
        env_replica: Option<String>,
        env_secret: Option<String>,
    ) -> anyhow::Result<Fleet> {
        let replica = env_replica
            .filter(|r| !r.trim().is_empty())
            .or_else(|| cfg.replica_id.clone());
        if let Some(r) = &replica
            && !is_replica_name(r)
        {
            bail!(
                "replica name {r:?} ({ENV_REPLICA} or [http] replica_id): use 1 to 63 of a-z, \
                 0-9 and '-', not starting or ending with '-' (a pod's name)"
            );
        }
        let Some(template) = cfg.peers.clone() else {
            return Ok(Fleet {
                replica,
                peers: None,
            });
        };
        if replica.is_none() {
            bail!("[http] peers needs this replica's name: set {ENV_REPLICA} or [http] replica_id");
        }
        let probe = template.replace("{replica}", "replica");
        let url = reqwest::Url::parse(&probe)
            .with_context(|| format!("[http] peers {template:?} is not a URL"))?;
        if !template.contains("{replica}")
            || !matches!(url.scheme(), "http" | "https")
            || url.path() != "/"
            || url.query().is_some()
        {
            bail!(
                "[http] peers {template:?}: give the replicas' base URL with {{replica}} for a \
                 name, such as \"http://{{replica}}.gearbox-headless:8080\""
            );
        }
        let secret = match env_secret.filter(|s| !s.is_empty()) {
            Some(s) => s,
            None => match &cfg.peer_secret_file {
                Some(path) => std::fs::read_to_string(path)
                    .with_context(|| format!("reading [http] peer_secret_file {}", path.display()))?
                    .trim()
                    .to_string(),
                None => bail!(
                    "[http] peers needs the secret the replicas share: set {ENV_PEER_SECRET} or \
                     [http] peer_secret_file"
                ),
            },
        };
        if secret.len() < MIN_SECRET_LEN {
            bail!("the peer secret is shorter than {MIN_SECRET_LEN} characters");
        }
        let secret_sha256 = Sha256::digest(secret.as_bytes()).into();
        let mut secret = HeaderValue::from_str(&secret)
            .context("the peer secret must be visible ASCII (it travels in a header)")?;
        secret.set_sensitive(true);
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .context("building the HTTP client for forwarding")?;
        Ok(Fleet {
            replica,
            peers: Some(Peers {
                template: template.trim_end_matches('/').to_string(),
                secret,
                secret_sha256,
                client,
            }),
        })
    }

    /// This replica's name, when it has one.
    pub fn replica(&self) -> Option<&str> {
        self.replica.as_deref()
    }

    /// Whether requests for other replicas' sessions are forwarded.
    pub fn forwards(&self) -> bool {
        self.peers.is_some()
    }

    /// Whether `presented` is the peers' secret (constant time).
    fn is_peer(&self, presented: &HeaderValue) -> bool {
        let Some(p) = &self.peers else { return false };
        let got: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        bool::from(got.ct_eq(&p.secret_sha256))
    }
}

/// rmcp's in-memory session manager, with ids that start with this replica's name.
pub struct ReplicaSessions {
    inner: LocalSessionManager,
    replica: Option<String>,
}

impl ReplicaSessions {
    pub fn new(replica: Option<&str>) -> ReplicaSessions {
        ReplicaSessions {
            inner: LocalSessionManager::default(),
            replica: replica.map(str::to_string),
        }
    }
}

impl SessionManager for ReplicaSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let Some(replica) = &self.replica else {
            return self.inner.create_session().await;
        };
        // rmcp's manager makes a session under a given id when it restores one; a fresh
        // UUID v4 is the whole random part, as in the ids it mints itself.
        let id: SessionId = format!("{replica}.{}", uuid::Uuid::new_v4()).into();
        match self.inner.restore_session(id.clone()).await? {
            RestoreOutcome::Restored(transport) => Ok((id, transport)),
            // A UUID v4 collision: take one of rmcp's own ids rather than share a session.
            _ => self.inner.create_session().await,
        }
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }
}

/// Which kind of session a request is routed by.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum By {
    /// The `Mcp-Session-Id` header.
    McpSession,
    /// A `tools/call`'s `session_id` argument (a request without an MCP session).
    GearboxSession,
}

/// The gearbox session a JSON-RPC body names, if any: a `tools/call`'s `session_id` argument,
/// or a `resources/read` of a session resource (`gearbox://sessions/{id}/...`). One message or
/// a batch (the first session found decides).
fn gearbox_session_in(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let calls: Vec<&serde_json::Value> = match &v {
        serde_json::Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    calls.iter().find_map(|m| {
        let params = m.get("params")?;
        match m.get("method")?.as_str()? {
            "tools/call" => Some(
                params
                    .get("arguments")?
                    .get("session_id")?
                    .as_str()?
                    .to_string(),
            ),
            "resources/read" => {
                let rest = params
                    .get("uri")?
                    .as_str()?
                    .strip_prefix(crate::sessions::SESSIONS_PREFIX)?;
                Some(rest.split('/').next()?.to_string())
            }
            _ => None,
        }
    })
}

fn jsonrpc_error(status: StatusCode, message: String) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": -32001, "message": message },
    });
    (status, axum::Json(body)).into_response()
}

/// Middleware on `/mcp`, after the API key check: serve here, or forward to the replica that
/// owns the request's session.
pub async fn route(State(fleet): State<Arc<Fleet>>, req: Request<Body>, next: Next) -> Response {
    if let Some(presented) = req.headers().get(PEER_HEADER) {
        if !fleet.is_peer(presented) {
            tracing::warn!("refused a request with a wrong {PEER_HEADER} header");
            return jsonrpc_error(
                StatusCode::FORBIDDEN,
                format!("forbidden: {PEER_HEADER} does not carry the peers' secret"),
            );
        }
        // From a peer: served here, never forwarded again.
        return next.run(req).await;
    }
    let Some(peers) = &fleet.peers else {
        return next.run(req).await;
    };
    let header_id = req
        .headers()
        .get(MCP_SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (req, owner, by) = match header_id {
        Some(id) => (req, owner_of(&id).map(str::to_string), By::McpSession),
        None if req.method() == axum::http::Method::POST => {
            let (parts, body) = req.into_parts();
            // The body limit layer outside bounds this; past it the client gets 413.
            let bytes = match super::read_body(body, usize::MAX).await {
                Ok(b) => b,
                Err(too_large) => return too_large,
            };
            let owner = gearbox_session_in(&bytes).and_then(|id| owner_of(&id).map(str::to_string));
            (
                Request::from_parts(parts, Body::from(bytes)),
                owner,
                By::GearboxSession,
            )
        }
        None => (req, None, By::McpSession),
    };
    match owner {
        Some(owner) if Some(owner.as_str()) != fleet.replica() => {
            forward(&fleet, peers, &owner, req, by).await
        }
        _ => next.run(req).await,
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !hop_by_hop(name) && name != PEER_HEADER && name != header::CONTENT_LENGTH {
            to.append(name.clone(), value.clone());
        }
    }
}

async fn forward(
    fleet: &Fleet,
    peers: &Peers,
    owner: &str,
    req: Request<Body>,
    by: By,
) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let url = format!("{}{path}", peers.template.replace("{replica}", owner));
    let mut headers = HeaderMap::new();
    copy_headers(&parts.headers, &mut headers);
    headers.insert(PEER_HEADER, peers.secret.clone());
    let sent = peers
        .client
        .request(parts.method.clone(), &url)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(
                owner,
                from = fleet.replica().unwrap_or(""),
                error = %e,
                "the replica owning a session cannot be reached"
            );
            return match by {
                By::McpSession => jsonrpc_error(
                    StatusCode::NOT_FOUND,
                    format!(
                        "session not found: replica {owner}, which owns it, cannot be reached; \
                         initialize a new session"
                    ),
                ),
                By::GearboxSession => jsonrpc_error(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "session_id: replica {owner}, which owns that session, cannot be \
                         reached; its session is gone if the replica stopped"
                    ),
                ),
            };
        }
    };
    tracing::debug!(
        owner,
        status = resp.status().as_u16(),
        "forwarded to the owner"
    );
    let mut out = Response::builder().status(resp.status());
    if let Some(h) = out.headers_mut() {
        copy_headers(resp.headers(), h);
    }
    out.body(Body::from_stream(resp.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_names_are_dns_labels() {
        assert!(is_replica_name("gearbox-0"));
        assert!(is_replica_name("41001"));
        for bad in ["", "-a", "a-", "A", "a.b", "a/b", "a:1", &"a".repeat(64)] {
            assert!(!is_replica_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn owners_come_from_the_prefix() {
        assert_eq!(owner_of("gearbox-1.0b6c"), Some("gearbox-1"));
        assert_eq!(owner_of("0b6c-uuid"), None);
        assert_eq!(owner_of("evil.example.com/x"), Some("evil"));
        assert_eq!(owner_of("x:80.y"), None);
        assert_eq!(owner_of("a."), None);
    }

    #[test]
    fn configuration_is_checked() {
        let mut cfg = HttpConfig::default();
        let f = Fleet::from_config(&cfg, None, None).expect("no fleet");
        assert!(f.replica().is_none() && !f.forwards());
        cfg.replica_id = Some("gearbox-0".into());
        let f = Fleet::from_config(&cfg, Some("gearbox-3".into()), None).expect("env wins");
        assert_eq!(f.replica(), Some("gearbox-3"));
        assert!(Fleet::from_config(&cfg, Some("Bad_Name".into()), None).is_err());
        cfg.peers = Some("http://{replica}.gearbox-headless:8080".into());
        let e = Fleet::from_config(&cfg, None, None).expect_err("needs a secret");
        assert!(e.to_string().contains(ENV_PEER_SECRET), "{e}");
        assert!(Fleet::from_config(&cfg, None, Some("short".into())).is_err());
        let secret = "0123456789abcdef0123".to_string();
        let f = Fleet::from_config(&cfg, None, Some(secret.clone())).expect("fleet");
        assert!(f.forwards());
        assert!(f.is_peer(&HeaderValue::from_str(&secret).expect("value")));
        assert!(!f.is_peer(&HeaderValue::from_static("0123456789abcdef0124")));
        for bad in [
            "http://gearbox-headless:8080",
            "ftp://{replica}:21",
            "http://{replica}:8080/mcp",
            "not a url {replica}",
        ] {
            cfg.peers = Some(bad.into());
            assert!(
                Fleet::from_config(&cfg, None, Some(secret.clone())).is_err(),
                "{bad}"
            );
        }
        cfg.peers = Some("http://{replica}:8080".into());
        cfg.replica_id = None;
        assert!(Fleet::from_config(&cfg, None, Some(secret)).is_err());
    }

    #[test]
    fn a_tools_call_names_its_gearbox_session() {
        let one = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec_run","arguments":{"session_id":"a.x","code":"1"}}}"#;
        assert_eq!(gearbox_session_in(one).as_deref(), Some("a.x"));
        let batch = br#"[{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"arguments":{"session_id":"b.y"}}}]"#;
        assert_eq!(gearbox_session_in(batch).as_deref(), Some("b.y"));
        let read = br#"{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"gearbox://sessions/c.z/files/a.txt"}}"#;
        assert_eq!(gearbox_session_in(read).as_deref(), Some("c.z"));
        for none in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#[..],
            br#"{"method":"tools/call","params":{"arguments":{"session_id":7}}}"#,
            br#"{"method":"resources/read","params":{"uri":"file:///etc/passwd"}}"#,
            b"not json",
            b"",
        ] {
            assert_eq!(gearbox_session_in(none), None);
        }
    }
}
