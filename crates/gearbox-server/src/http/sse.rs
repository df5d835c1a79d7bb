//! The 2024-11-05 HTTP+SSE transport, which rmcp no longer ships: `GET /sse` opens an event
//! stream whose first event, `endpoint`, names `/messages?sessionId=ID`; the client POSTs
//! each JSON-RPC message there (answered `202 Accepted`) and reads the server's messages as
//! `message` events on the stream. Each stream is one MCP session: the same
//! [`GearboxServer`] handler driven by rmcp's generic service loop over a pair of in-memory
//! channels. Closing the stream ends the session and cancels its runs.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use rmcp::ServiceExt;
use rmcp::model::{ClientJsonRpcMessage, GetExtensions, RequestId, ServerJsonRpcMessage};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::{Responding, RespondingGuard};
use crate::{Caller, GearboxServer};

/// Messages a session buffers in each direction.
const CHANNEL: usize = 64;
/// Interval of keep-alive comments on an idle stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

struct Session {
    to_server: mpsc::Sender<ClientJsonRpcMessage>,
    caller: String,
    /// Requests posted and not answered yet on the stream: each holds shutdown back until
    /// its answer has gone out (see [`Responding`]).
    pending: Pending,
}

type Pending = Arc<Mutex<HashMap<RequestId, RespondingGuard>>>;

/// The open SSE sessions.
#[derive(Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the SSE handlers share.
#[derive(Clone)]
pub struct SseState {
    pub server: GearboxServer,
    pub sessions: Arc<Sessions>,
    /// Cancelled at shutdown: every session ends.
    pub shutdown: CancellationToken,
    /// What shutdown waits for before it ends the sessions.
    pub responding: Arc<Responding>,
}

/// Removes the session and cancels it when its stream is dropped (the client left).
struct SessionGuard {
    id: String,
    sessions: Arc<Sessions>,
    ct: CancellationToken,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sessions.lock().remove(&self.id);
        self.ct.cancel();
        tracing::debug!(session = %self.id, "SSE session closed");
    }
}

/// `GET /sse`.
pub async fn open(State(state): State<SseState>, req: Request<Body>) -> Response {
    let caller = req
        .extensions()
        .get::<Caller>()
        .map_or_else(|| "anonymous".to_string(), |c| c.name.clone());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (to_server, from_client) = mpsc::channel::<ClientJsonRpcMessage>(CHANNEL);
    let (to_client, from_server) = mpsc::channel(CHANNEL);
    let ct = state.shutdown.child_token();
    let pending = Pending::default();
    state.sessions.lock().insert(
        id.clone(),
        Session {
            to_server,
            caller: caller.clone(),
            pending: pending.clone(),
        },
    );
    let server = state.server.clone();
    let session_ct = ct.clone();
    let sid = id.clone();
    tokio::spawn(async move {
        match server
            .serve_with_ct((to_client, from_client), session_ct)
            .await
        {
            Ok(running) => {
                let reason = running.waiting().await;
                tracing::debug!(session = %sid, ?reason, "SSE session ended");
            }
            Err(e) => tracing::debug!(session = %sid, error = %e, "SSE session not initialised"),
        }
    });
    tracing::info!(session = %id, %caller, "SSE session opened");
    let guard = SessionGuard {
        id: id.clone(),
        sessions: state.sessions.clone(),
        ct: ct.clone(),
    };
    let endpoint = futures::stream::once(async move {
        let endpoint = Event::default()
            .event("endpoint")
            .data(format!("/messages?sessionId={id}"));
        (endpoint, None)
    });
    let messages = from_server.map(move |msg: ServerJsonRpcMessage| {
        let data = serde_json::to_string(&msg).unwrap_or_default();
        // Its answer is on its way: the request no longer holds shutdown back (dropped once
        // this event is handed to the connection).
        let answered = match &msg {
            ServerJsonRpcMessage::Response(r) => Some(&r.id),
            ServerJsonRpcMessage::Error(e) => e.id.as_ref(),
            _ => None,
        };
        let done =
            answered.and_then(|id| pending.lock().unwrap_or_else(|p| p.into_inner()).remove(id));
        (Event::default().event("message").data(data), done)
    });
    let stream = endpoint
        .chain(messages)
        .take_until(ct.cancelled_owned())
        .map(move |(e, done)| {
            let _keep = &guard;
            drop(done);
            Ok::<_, Infallible>(e)
        });
    Sse::new(Box::pin(stream)
        as std::pin::Pin<
            Box<dyn Stream<Item = Result<Event, Infallible>> + Send>,
        >)
    .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
    .into_response()
}

#[derive(Deserialize)]
pub struct MessagesQuery {
    #[serde(rename = "sessionId")]
    session_id: Option<String>,
}

fn plain(status: StatusCode, text: &str) -> Response {
    (status, text.to_string()).into_response()
}

/// `POST /messages?sessionId=ID`.
pub async fn post(
    State(state): State<SseState>,
    Query(q): Query<MessagesQuery>,
    req: Request<Body>,
) -> Response {
    let Some(id) = q.session_id else {
        return plain(StatusCode::BAD_REQUEST, "missing sessionId query parameter");
    };
    let (parts, body) = req.into_parts();
    let caller = parts
        .extensions
        .get::<Caller>()
        .map_or("anonymous", |c| c.name.as_str())
        .to_string();
    let (mut tx, pending) = {
        let sessions = state.sessions.lock();
        let Some(s) = sessions.get(&id) else {
            return plain(StatusCode::NOT_FOUND, "unknown or closed session");
        };
        if s.caller != caller {
            return plain(
                StatusCode::FORBIDDEN,
                "this session belongs to another API key",
            );
        }
        (s.to_server.clone(), s.pending.clone())
    };
    // The body limit layer bounds this read.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("reading the body: {e}"),
            );
        }
    };
    let mut msg: ClientJsonRpcMessage = match serde_json::from_slice(&bytes) {
        Ok(m) => m,
        Err(e) => {
            return plain(
                StatusCode::BAD_REQUEST,
                &format!("body is not a JSON-RPC message: {e}"),
            );
        }
    };
    let mut request = None;
    match &mut msg {
        ClientJsonRpcMessage::Request(r) => {
            r.request.extensions_mut().insert(parts);
            // A request's entry leaves with its answer, or with the session.
            pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(r.id.clone(), state.responding.enter());
            request = Some(r.id.clone());
        }
        ClientJsonRpcMessage::Notification(n) => {
            n.notification.extensions_mut().insert(parts);
        }
        _ => {}
    }
    let sent = tokio::time::timeout(Duration::from_secs(10), tx.send(msg)).await;
    if !matches!(sent, Ok(Ok(())))
        && let Some(id) = request
    {
        // Not queued: no answer will come for it.
        pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
    }
    match sent {
        Ok(Ok(())) => plain(StatusCode::ACCEPTED, "Accepted"),
        Ok(Err(_)) => plain(StatusCode::NOT_FOUND, "session closed"),
        Err(_) => {
            let mut r = plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy: the session's queue is full; retry after 1 s",
            );
            r.headers_mut()
                .insert("retry-after", axum::http::HeaderValue::from_static("1"));
            r
        }
    }
}
