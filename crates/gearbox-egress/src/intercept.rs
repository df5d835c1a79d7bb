//! TLS termination for connections that carry a secret (`secrets.rs`).
//!
//! A run with secrets gets a CA of its own, made when the run starts: its key stays in the
//! proxy, its certificate goes into the sandbox's trust store, and it is name-constrained to
//! the secrets' hosts, so even its holder could sign for nothing else. A `CONNECT` to a
//! secret-bound host is answered by the proxy itself: it reads the ClientHello, checks the
//! server name against the grant and the CONNECT host, opens TLS upstream with the host's
//! real roots (the system's, plus `[network] extra_roots`), then completes the program's
//! handshake with a certificate the run's CA signs for that name. HTTP/1.1 requests then
//! pass one by one, the secret presented in each (`RunSecrets::present`), the value
//! redacted again from what comes back.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::secrets::{Redactor, redact_str};
use crate::state::{Body, BoxError, Counted, RunState, text};

/// Serve one secret-bound tunnel (the proxy has answered the CONNECT and connected
/// `upstream`): terminate the program's TLS, re-encrypt upstream, present the secrets.
pub(crate) async fn intercept<C>(
    state: Arc<RunState>,
    host: String,
    port: u16,
    client: C,
    upstream: TcpStream,
) where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let Some(upstream_tls) = state.settings.upstream_tls.clone() else {
        return;
    };
    let timeout = Duration::from_millis(state.settings.config.connect_timeout_ms.max(1));
    let acceptor =
        tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), client);
    let start = match tokio::time::timeout(timeout, acceptor).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => {
            state.refuse(
                &host,
                port,
                "a connection that carries a secret must speak TLS from its first byte",
            );
            return;
        }
        Err(_) => return,
    };
    let name = start
        .client_hello()
        .server_name()
        .map(str::to_string)
        .unwrap_or_else(|| host.clone());
    if !name.eq_ignore_ascii_case(host.trim_start_matches('[').trim_end_matches(']')) {
        state.refuse(
            &host,
            port,
            &format!(
                "the TLS server name {name} differs from the CONNECT host on a connection \
                 that carries a secret"
            ),
        );
        return;
    }
    let key = format!("{host}:{port}");
    let bytes = state.book().counters(&key);
    let counted = Counted {
        inner: upstream,
        bytes,
    };
    let Ok(server_name) = ServerName::try_from(name.clone()) else {
        state.refuse(&host, port, "not a TLS server name");
        return;
    };
    let connector = tokio_rustls::TlsConnector::from(upstream_tls);
    let up = match tokio::time::timeout(timeout, connector.connect(server_name, counted)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            state.refuse(&host, port, &format!("TLS with {host} failed: {e}"));
            return;
        }
        Err(_) => {
            state.refuse(&host, port, &format!("TLS with {host} timed out"));
            return;
        }
    };
    let made = match &state.ca {
        Some(ca) => ca.server_config(&name),
        None => return,
    };
    let config = match made {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "egress proxy: no certificate for a secret-bound host");
            return;
        }
    };
    let client_tls = match tokio::time::timeout(timeout, start.into_stream(config)).await {
        Ok(Ok(s)) => s,
        _ => return,
    };
    let (sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(up)).await {
        Ok(pair) => pair,
        Err(_) => return,
    };
    let stop = state.stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = conn => {}
        }
    });
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (state, sender, host) = (state.clone(), sender.clone(), host.clone());
        async move { Ok::<_, std::convert::Infallible>(relay(&state, &host, port, &sender, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client_tls), service)
        .await;
}

/// One request of a terminated connection.
async fn relay(
    state: &RunState,
    host: &str,
    port: u16,
    sender: &tokio::sync::Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    mut req: Request<Incoming>,
) -> Response<Body> {
    state.book().request(&format!("{host}:{port}"));
    let headers = req.headers_mut();
    headers.remove("proxy-authorization");
    headers.remove("proxy-connection");
    let used = match &state.secrets {
        Some(s) => s.present(host, port, headers),
        None => Vec::new(),
    };
    let mut sender = sender.lock().await;
    let sent = match sender.ready().await {
        Ok(()) => sender.send_request(req).await,
        Err(e) => Err(e),
    };
    drop(sender);
    match sent {
        Ok(resp) => redact_response(resp, used),
        Err(e) => text(
            hyper::StatusCode::BAD_GATEWAY,
            format!("gearbox egress proxy: {host}:{port}: {e}\n"),
        ),
    }
}

/// The response with the presented values replaced by their placeholders: in headers, and
/// in a body that is not compressed.
fn redact_response(resp: Response<Incoming>, used: Vec<(String, String)>) -> Response<Body> {
    let (mut parts, body) = resp.into_parts();
    if used.is_empty() {
        return Response::from_parts(parts, body.map_err(|e| Box::new(e) as BoxError).boxed());
    }
    for value in parts.headers.values_mut() {
        if let Ok(text) = value.to_str()
            && let Some(clean) = redact_str(text, &used)
            && let Ok(v) = hyper::header::HeaderValue::from_str(&clean)
        {
            *value = v;
        }
    }
    let encoded = parts
        .headers
        .get(hyper::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    if encoded {
        return Response::from_parts(parts, body.map_err(|e| Box::new(e) as BoxError).boxed());
    }
    // The length may change (a placeholder is not as long as the value).
    parts.headers.remove(hyper::header::CONTENT_LENGTH);
    let body = Redacted {
        inner: body,
        redactor: Redactor::new(&used),
        ended: false,
    };
    Response::from_parts(parts, body.boxed())
}

/// A body passed through a [`Redactor`].
struct Redacted {
    inner: Incoming,
    redactor: Redactor,
    ended: bool,
}

impl hyper::body::Body for Redacted {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    let out = self.redactor.push(&data);
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))))
                }
                // Trailers: what is held goes first would reorder; held bytes are flushed
                // with the end instead, and trailers of a redacted body are dropped.
                Err(_) => {
                    self.ended = true;
                    let rest = self.redactor.finish();
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))))
                }
            },
            Poll::Ready(None) => {
                self.ended = true;
                let rest = self.redactor.finish();
                if rest.is_empty() {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))))
                }
            }
        }
    }
}
