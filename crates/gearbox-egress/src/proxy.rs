//! The egress proxy: one listener per granted run, on a socket in a directory of its own
//! that the sandbox sees through a bind mount (its relay forwards `127.0.0.1:3128` there).
//!
//! - `CONNECT host:port` (TLS and any other tunnel): the host must be in the run's grant,
//!   every address it resolves to is checked (`addr.rs`) and the proxy connects to a
//!   checked address itself. A TLS tunnel's ClientHello is read (never decrypted): a server
//!   name (SNI) outside the grant ends the tunnel.
//! - Plain HTTP (`GET http://host/...`): decided on the request's host the same way, then
//!   forwarded over a connection of the proxy's.
//! - Anything refused gets `403` naming the host and the rule, and lands in the run's
//!   ledger; what passes is counted there (requests, bytes each way).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gearbox_core::rundir::{RunAccess, reachable_by_sandbox};
use gearbox_core::{EGRESS_PROXY_PORT, EgressLedger, Network};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::NetworkConfig;
use crate::ca::RunCa;
use crate::secrets::{RunSecrets, SecretConfig};
use crate::state::{Body, Book, BoxError, Counted, RunState, Settings, text};

/// Most bytes of a TLS ClientHello read before deciding on its server name.
const MAX_CLIENT_HELLO: usize = 16 * 1024;

/// The proxy of one server: opens a listener per granted run.
#[derive(Clone)]
pub struct Egress {
    settings: Arc<Settings>,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("root", &self.settings.root)
            .finish()
    }
}

impl Egress {
    /// The proxy of `config`, presenting `secrets` (each value read now: a missing one is
    /// an error here, not a run that fails later).
    pub fn new(config: NetworkConfig, secrets: &[SecretConfig]) -> Result<Egress, String> {
        config.validate()?;
        let allow_private = crate::addr::parse_allow_private(&config.allow_private)?;
        let root = config.runtime_dir();
        let secrets = crate::secrets::load_all(secrets)?;
        let upstream_tls = if secrets.is_empty() {
            None
        } else {
            Some(crate::ca::upstream_config(&config.extra_roots)?)
        };
        Ok(Egress {
            settings: Arc::new(Settings {
                config,
                allow_private,
                root,
                secrets,
                upstream_tls,
            }),
        })
    }

    /// The directory under which each run's proxy directory is made.
    pub fn runtime_root(&self) -> &Path {
        &self.settings.root
    }

    /// The names of the configured secrets (never their values).
    pub fn secret_names(&self) -> Vec<String> {
        self.settings
            .secrets
            .iter()
            .map(|s| s.name.clone())
            .collect()
    }

    pub fn config(&self) -> &NetworkConfig {
        &self.settings.config
    }

    /// Start serving one run granted `grant` (not [`Network::Off`]).
    pub fn open(&self, grant: Network) -> Result<RunEgress, String> {
        use std::os::unix::fs::DirBuilderExt;
        if !grant.is_on() {
            return Err("no network was granted".into());
        }
        let root = &self.settings.root;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(root)
            .map_err(|e| format!("creating {}: {e}", root.display()))?;
        reachable_by_sandbox(root, "the egress proxy's socket")?;
        let dir = root.join(format!("run-{}", uuid::Uuid::new_v4().simple()));
        let access = RunAccess::of_server();
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let secrets = RunSecrets::new(&self.settings.secrets);
        let ca = if secrets.is_empty() {
            None
        } else {
            Some(RunCa::new(&secrets.patterns())?)
        };
        let mut env = proxy_env();
        env.extend(secrets.env());
        let state = Arc::new(RunState {
            ledger: Mutex::new(Book::new(&grant)),
            grant,
            settings: self.settings.clone(),
            permits: Arc::new(Semaphore::new(self.settings.config.max_connections)),
            stop: tokio_util::sync::CancellationToken::new(),
            secrets: (!secrets.is_empty()).then_some(secrets),
            ca,
        });
        // From here on, a failure removes the directory (Drop).
        let mut run = RunEgress {
            socket: dir.join("proxy.sock"),
            dir,
            state,
            server: None,
            env,
        };
        access
            .restrict(&run.dir, 0o700)
            .map_err(|e| format!("restricting {}: {e}", run.dir.display()))?;
        if let Some(ca) = &run.state.ca {
            let trust = crate::ca::write_trust(&run.dir, ca)?;
            for file in ["ca.pem", "trust.pem"] {
                let path = run.dir.join(file);
                access
                    .restrict(&path, 0o644)
                    .map_err(|e| format!("restricting {}: {e}", path.display()))?;
            }
            run.env.extend(trust);
        }
        let listener = UnixListener::bind(&run.socket)
            .map_err(|e| format!("binding {}: {e}", run.socket.display()))?;
        access
            .restrict(&run.socket, 0o600)
            .map_err(|e| format!("restricting {}: {e}", run.socket.display()))?;
        run.server = Some(tokio::spawn(serve(listener, run.state.clone(), access)));
        Ok(run)
    }
}

/// The proxy of one run. Dropping it stops serving (open tunnels end) and removes its
/// directory; [`RunEgress::finish`] does the same and returns the ledger.
pub struct RunEgress {
    dir: PathBuf,
    socket: PathBuf,
    state: Arc<RunState>,
    server: Option<tokio::task::JoinHandle<()>>,
    /// The program's variables: proxy, trust store, secrets' placeholders.
    env: Vec<(String, String)>,
}

impl std::fmt::Debug for RunEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunEgress")
            .field("dir", &self.dir)
            .field("grant", &self.state.grant)
            .finish()
    }
}

impl RunEgress {
    /// The run's directory on the host; mount it read-only at the same path in the sandbox.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The proxy's socket (inside `dir`), which the sandbox's relay connects to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The program's variables: `HTTP_PROXY`, `HTTPS_PROXY` (both cases) at the relay,
    /// `NO_PROXY` for the run's own loopback; with secrets, each secret's placeholder and
    /// the trust store that holds the run's CA (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`, ...).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The ledger so far.
    pub fn ledger(&self) -> EgressLedger {
        self.state.book().snapshot()
    }

    /// Stop serving, remove the directory, return the ledger.
    pub fn finish(mut self) -> EgressLedger {
        self.stop();
        self.ledger()
    }

    fn stop(&mut self) {
        self.state.stop.cancel();
        if let Some(s) = self.server.take() {
            s.abort();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for RunEgress {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The proxy settings of every run: the relay's address for each usual variable.
fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{EGRESS_PROXY_PORT}");
    let mut env: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "GEARBOX_EGRESS_PROXY",
    ]
    .iter()
    .map(|k| (k.to_string(), url.clone()))
    .collect();
    for k in ["NO_PROXY", "no_proxy"] {
        env.push((k.into(), "localhost,127.0.0.1,::1".into()));
    }
    env
}

impl RunState {
    /// Decide on `host:port` and connect to a checked address of it.
    async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, Refusal> {
        if !self.grant.admits(host, port) {
            return Err(Refusal::Policy(format!(
                "{host}:{port} is not in this run's network grant ({}{})",
                self.grant.describe(),
                if matches!(self.grant, Network::Hosts(_)) {
                    "; a pattern without a port allows 80 and 443"
                } else {
                    ""
                }
            )));
        }
        let timeout = Duration::from_millis(self.settings.config.connect_timeout_ms.max(1));
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<IpAddr> = if let Ok(ip) = bare.parse::<IpAddr>() {
            vec![ip]
        } else if let Some(ip) = self.settings.config.hosts.get(&bare.to_ascii_lowercase()) {
            vec![*ip]
        } else {
            match tokio::time::timeout(timeout, tokio::net::lookup_host((bare, port))).await {
                Ok(Ok(found)) => {
                    let mut v: Vec<IpAddr> = Vec::new();
                    for a in found {
                        if !v.contains(&a.ip()) {
                            v.push(a.ip());
                        }
                    }
                    v
                }
                Ok(Err(e)) => {
                    return Err(Refusal::Unreachable(format!("cannot resolve {bare}: {e}")));
                }
                Err(_) => return Err(Refusal::Unreachable(format!("resolving {bare} timed out"))),
            }
        };
        let mut why = Vec::new();
        let admitted: Vec<IpAddr> = addrs
            .into_iter()
            .filter(
                |ip| match crate::addr::admit(*ip, &self.settings.allow_private) {
                    Ok(()) => true,
                    Err(e) => {
                        why.push(e);
                        false
                    }
                },
            )
            .collect();
        if admitted.is_empty() {
            return Err(Refusal::Policy(match why.first() {
                Some(first) => format!("{host} resolves to {first}"),
                None => format!("{host} resolves to no address"),
            }));
        }
        let mut last = String::new();
        for ip in admitted {
            match tokio::time::timeout(timeout, TcpStream::connect(SocketAddr::new(ip, port))).await
            {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Ok(Err(e)) => last = format!("connecting to {ip}:{port}: {e}"),
                Err(_) => last = format!("connecting to {ip}:{port} timed out"),
            }
        }
        Err(Refusal::Unreachable(last))
    }
}

enum Refusal {
    /// The grant or the address ranges: 403.
    Policy(String),
    /// Allowed, but could not be reached: 502.
    Unreachable(String),
}

async fn serve(listener: UnixListener, state: Arc<RunState>, access: RunAccess) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    match stream.peer_cred() {
                        Ok(cred) if access.admits(cred.uid()) => {}
                        Ok(cred) => {
                            tracing::warn!(uid = cred.uid(), "egress proxy: a connection from another user; closed");
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "egress proxy: no peer credentials; connection closed");
                            continue;
                        }
                    }
                    let Ok(permit) = state.permits.clone().try_acquire_owned() else {
                        let max = state.settings.config.max_connections;
                        tracing::info!(max, "egress refused: too many connections");
                        state.book().refused(
                            "(new connection)".into(),
                            format!("too many connections open at once ([network] max_connections = {max})"),
                        );
                        continue;
                    };
                    conns.spawn(connection(stream, state.clone(), permit));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "egress proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn connection(stream: UnixStream, state: Arc<RunState>, permit: OwnedSemaphorePermit) {
    let permit = Arc::new(Mutex::new(Some(permit)));
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        let permit = permit.clone();
        async move { Ok::<_, Infallible>(handle(state, permit, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

fn refused(state: &RunState, host: &str, port: u16, why: Refusal) -> Response<Body> {
    let (status, reason) = match why {
        Refusal::Policy(r) => (StatusCode::FORBIDDEN, r),
        Refusal::Unreachable(r) => (StatusCode::BAD_GATEWAY, r),
    };
    state.refuse(host, port, &reason);
    let mut r = text(
        status,
        format!("gearbox egress proxy: {host}:{port} refused: {reason}\n"),
    );
    r.headers_mut().insert(
        "x-gearbox-egress",
        hyper::header::HeaderValue::from_static("refused"),
    );
    r
}

async fn handle(
    state: Arc<RunState>,
    permit: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
    req: Request<Incoming>,
) -> Response<Body> {
    if req.method() == Method::CONNECT {
        let Some((host, port)) = req
            .uri()
            .authority()
            .and_then(|a| a.port_u16().map(|p| (a.host().to_string(), p)))
        else {
            return text(
                StatusCode::BAD_REQUEST,
                "gearbox egress proxy: CONNECT needs host:port\n".into(),
            );
        };
        let upstream = match state.connect(&host, port).await {
            Ok(s) => s,
            Err(why) => return refused(&state, &host, port, why),
        };
        let held = permit.lock().unwrap_or_else(|p| p.into_inner()).take();
        let stop = state.stop.clone();
        let secret_bound = state.secrets.as_ref().is_some_and(|s| s.binds(&host, port));
        tokio::spawn(async move {
            let _held = held;
            tokio::select! {
                _ = stop.cancelled() => {}
                upgraded = hyper::upgrade::on(req) => {
                    if let Ok(up) = upgraded {
                        let io = TokioIo::new(up);
                        if secret_bound {
                            crate::intercept::intercept(state, host, port, io, upstream).await;
                        } else {
                            tunnel(&state, &host, port, io, upstream).await;
                        }
                    }
                }
            }
        });
        return Response::new(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed(),
        );
    }
    forward(state, req).await
}

/// A plain HTTP request in absolute form (`GET http://host/path`), forwarded over a
/// connection of the proxy's own.
async fn forward(state: Arc<RunState>, mut req: Request<Incoming>) -> Response<Body> {
    let uri = req.uri().clone();
    if uri.scheme_str() != Some("http") {
        return text(
            StatusCode::BAD_REQUEST,
            "gearbox egress proxy: send plain HTTP requests in absolute form \
             (http://host/path) and tunnel everything else with CONNECT\n"
                .into(),
        );
    }
    let Some(auth) = uri.authority().cloned() else {
        return text(
            StatusCode::BAD_REQUEST,
            "gearbox egress proxy: the request names no host\n".into(),
        );
    };
    let (host, port) = (auth.host().to_string(), auth.port_u16().unwrap_or(80));
    let stream = match state.connect(&host, port).await {
        Ok(s) => s,
        Err(why) => return refused(&state, &host, port, why),
    };
    let key = format!("{host}:{port}");
    let bytes = state.book().request(&key);
    let counted = Counted {
        inner: stream,
        bytes,
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(counted)).await {
            Ok(pair) => pair,
            Err(e) => {
                return refused(&state, &host, port, Refusal::Unreachable(e.to_string()));
            }
        };
    let stop = state.stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = conn => {}
        }
    });
    // Origin form upstream; proxy-only headers stay here.
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    *req.uri_mut() = match path.parse() {
        Ok(u) => u,
        Err(_) => {
            return text(
                StatusCode::BAD_REQUEST,
                "gearbox egress proxy: bad request path\n".into(),
            );
        }
    };
    let headers = req.headers_mut();
    headers.remove("proxy-authorization");
    headers.remove("proxy-connection");
    if !headers.contains_key(hyper::header::HOST)
        && let Ok(v) = hyper::header::HeaderValue::from_str(auth.as_str())
    {
        headers.insert(hyper::header::HOST, v);
    }
    match sender.send_request(req).await {
        Ok(resp) => resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed()),
        Err(e) => refused(&state, &host, port, Refusal::Unreachable(e.to_string())),
    }
}

/// Move a tunnel's bytes both ways. When the program speaks TLS first, its ClientHello is
/// read before anything goes upstream: a server name outside the grant ends the tunnel.
async fn tunnel<C>(state: &RunState, host: &str, port: u16, client: C, upstream: TcpStream)
where
    C: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let bytes = state.book().request(&format!("{host}:{port}"));
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = upstream.into_split();
    let down_count = bytes.clone();
    let downward = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match ur.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    down_count.down.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        let _ = cw.shutdown().await;
    });
    let mut first = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    let allowed = loop {
        match cr.read(&mut buf).await {
            Ok(0) | Err(_) => break first.is_empty(),
            Ok(n) => first.extend_from_slice(&buf[..n]),
        }
        match server_name(&first) {
            Hello::NeedMore if first.len() < MAX_CLIENT_HELLO => continue,
            Hello::Name(name) if !state.grant.admits(&name, port) => {
                state.refuse(
                    host,
                    port,
                    &format!(
                        "the tunnel's TLS server name {name} is not in this run's network grant ({})",
                        state.grant.describe()
                    ),
                );
                break false;
            }
            _ => break true,
        }
    };
    if allowed && !first.is_empty() && uw.write_all(&first).await.is_ok() {
        bytes.up.fetch_add(first.len() as u64, Ordering::Relaxed);
        loop {
            match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if uw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    bytes.up.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        let _ = uw.shutdown().await;
        let _ = downward.await;
    } else if !allowed {
        downward.abort();
    } else {
        let _ = uw.shutdown().await;
        let _ = downward.await;
    }
}

enum Hello {
    /// Not TLS, or TLS without a server name: decided on the CONNECT host alone.
    NoName,
    Name(String),
    NeedMore,
}

/// The server name of a TLS ClientHello at the start of `bytes`, read with rustls's
/// acceptor (nothing is decrypted or answered).
fn server_name(bytes: &[u8]) -> Hello {
    if bytes.first() != Some(&0x16) {
        return Hello::NoName;
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut cursor = std::io::Cursor::new(bytes);
    while (cursor.position() as usize) < bytes.len() {
        match acceptor.read_tls(&mut cursor) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    match acceptor.accept() {
        Ok(None) => Hello::NeedMore,
        Ok(Some(accepted)) => match accepted.client_hello().server_name() {
            Some(name) => Hello::Name(name.to_string()),
            None => Hello::NoName,
        },
        Err(_) => Hello::NoName,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{MAX_LEDGER_HOSTS, MAX_LEDGER_REFUSALS};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn egress(max_connections: usize) -> (Egress, PathBuf) {
        let root = std::env::temp_dir().join(format!(
            "gbx-egress-test-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let config = NetworkConfig {
            runtime_dir: Some(root.clone()),
            max_connections,
            ..NetworkConfig::default()
        };
        (Egress::new(config, &[]).expect("egress"), root)
    }

    /// Send `request` on a new connection to the run's socket; the response's head.
    async fn ask(run: &RunEgress, request: &str) -> String {
        let mut s = UnixStream::connect(run.socket()).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.expect("read");
        String::from_utf8_lossy(&buf[..n]).to_string()
    }

    #[tokio::test]
    async fn refusals_name_the_host_and_the_rule_and_land_in_the_ledger() {
        let (egress, root) = egress(8);
        let run = egress
            .open(Network::hosts(&["allowed.example"]).expect("grant"))
            .expect("open");
        let r = ask(
            &run,
            "CONNECT other.example:443 HTTP/1.1\r\nHost: other.example:443\r\n\r\n",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 403"), "{r}");
        assert!(
            r.contains("other.example:443 is not in this run's network grant (allowed.example"),
            "{r}"
        );
        let r = ask(
            &run,
            "GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        )
        .await;
        assert!(r.starts_with("HTTP/1.1 403"), "{r}");
        let r = ask(&run, "GET /relative HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        let r = ask(&run, "CONNECT nohost HTTP/1.1\r\n\r\n").await;
        assert!(r.starts_with("HTTP/1.1 400"), "{r}");
        let ledger = run.finish();
        assert_eq!(ledger.refused_total, 2, "{ledger:?}");
        assert_eq!(ledger.refused[0].host, "other.example:443");
        assert!(ledger.hosts.is_empty());
        assert!(
            std::fs::read_dir(&root).expect("root").next().is_none(),
            "run dir removed"
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_are_closed_and_counted() {
        let (egress, root) = egress(2);
        let run = egress.open(Network::Any).expect("open");
        // Two idle connections hold both permits.
        let held: Vec<UnixStream> = futures_connect(&run, 2).await;
        let mut third = UnixStream::connect(run.socket()).await.expect("connect");
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(10), third.read(&mut buf))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0, "the third connection is closed unanswered");
        let ledger = run.ledger();
        assert_eq!(ledger.refused_total, 1, "{ledger:?}");
        assert_eq!(ledger.refused[0].host, "(new connection)");
        assert!(
            ledger.refused[0].reason.contains("max_connections = 2"),
            "{ledger:?}"
        );
        drop(held);
        drop(run);
        let _ = std::fs::remove_dir_all(root);
    }

    async fn futures_connect(run: &RunEgress, n: usize) -> Vec<UnixStream> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(UnixStream::connect(run.socket()).await.expect("connect"));
        }
        // The proxy accepts in order: these take the permits before any later connection.
        v
    }

    #[test]
    fn the_ledger_is_bounded() {
        let mut book = Book::new(&Network::Any);
        for i in 0..(MAX_LEDGER_HOSTS + 10) {
            book.request(&format!("h{i}.example:443"));
        }
        book.request("h0.example:443");
        for i in 0..(MAX_LEDGER_REFUSALS + 5) {
            book.refused(format!("r{i}:80"), "no".into());
        }
        let l = book.snapshot();
        assert_eq!(l.hosts.len(), MAX_LEDGER_HOSTS + 1);
        let other = l
            .hosts
            .iter()
            .find(|h| h.host == "(other hosts)")
            .expect("summed");
        assert_eq!(other.requests, 10);
        assert_eq!(
            l.hosts
                .iter()
                .find(|h| h.host == "h0.example:443")
                .map(|h| h.requests),
            Some(2)
        );
        assert_eq!(l.refused.len(), MAX_LEDGER_REFUSALS);
        assert_eq!(l.refused_total, (MAX_LEDGER_REFUSALS + 5) as u64);
    }

    /// A real ClientHello for `name`, as rustls's client sends it.
    fn client_hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new({
            #[allow(deprecated)]
            let p = rustls::crypto::ring::default_provider();
            p
        }))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let server = rustls::pki_types::ServerName::try_from(name.to_string()).expect("name");
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server).expect("client");
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).expect("write");
        }
        out
    }

    #[test]
    fn the_server_name_is_read_whole_or_not_at_all() {
        let hello = client_hello("api.example.com");
        assert!(matches!(server_name(&hello), Hello::Name(n) if n == "api.example.com"));
        for cut in 1..hello.len() {
            match server_name(&hello[..cut]) {
                Hello::NeedMore | Hello::NoName => {}
                Hello::Name(n) => panic!("a name ({n}) from {cut} of {} bytes", hello.len()),
            }
        }
        assert!(matches!(server_name(b"GET / HTTP/1.1\r\n"), Hello::NoName));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_give_an_answer_and_no_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let _ = server_name(&bytes);
            let mut tls = vec![0x16u8, 3, 1];
            tls.extend(&bytes);
            let _ = server_name(&tls);
        }
    }
}
