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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::proxy::{Body, BoxError, Counted, RunState};
use crate::secrets::{Redactor, redact_str};

/// Where a host keeps its trusted roots, first found wins (`SSL_CERT_FILE` before these).
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// rustls's ring provider. It offers no post-quantum key exchange (hence rustls's
/// deprecation note); aws-lc-rs would, at the price of a cmake and C build on every fresh
/// machine. Both ends here are short-lived connections of one run.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    let p = rustls::crypto::ring::default_provider();
    Arc::new(p)
}

/// The system's root bundle (PEM), as this server finds it.
pub(crate) fn system_roots_file() -> Option<PathBuf> {
    std::env::var_os("SSL_CERT_FILE")
        .map(PathBuf::from)
        .into_iter()
        .chain(SYSTEM_ROOTS.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// The client side of re-encrypted connections: the system's roots and `extra`.
pub(crate) fn upstream_config(extra: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let mut files: Vec<PathBuf> = system_roots_file().into_iter().collect();
    files.extend(extra.iter().cloned());
    for file in &files {
        let certs = CertificateDer::pem_file_iter(file)
            .map_err(|e| format!("reading {}: {e}", file.display()))?
            .filter_map(Result::ok);
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 && extra.contains(file) {
            return Err(format!(
                "[network] extra_roots: {} holds no certificate",
                file.display()
            ));
        }
    }
    if roots.is_empty() {
        return Err(
            "no trusted roots: install ca-certificates or set SSL_CERT_FILE, so that \
             connections carrying a secret can be verified upstream"
                .into(),
        );
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The CA of one run.
pub(crate) struct RunCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
    /// Server configurations made so far, by host name.
    made: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
}

impl RunCa {
    /// A CA that may sign only for `patterns` (host patterns; `*.` and ports dropped).
    pub fn new(patterns: &[String]) -> Result<RunCa, String> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
            .map_err(|e| format!("run CA: {e}"))?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("gearbox run {}", uuid::Uuid::new_v4().simple()),
        );
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let mut permitted = Vec::new();
        for p in patterns {
            let host = strip_port(p);
            let host = host.strip_prefix("*.").unwrap_or(host);
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            match bare.parse::<std::net::IpAddr>() {
                Ok(ip) => permitted.push(rcgen::GeneralSubtree::IpAddress(
                    rcgen::CidrSubnet::from_addr_prefix(ip, if ip.is_ipv4() { 32 } else { 128 }),
                )),
                Err(_) => permitted.push(rcgen::GeneralSubtree::DnsName(host.to_string())),
            }
        }
        params.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
        let key = rcgen::KeyPair::generate().map_err(|e| format!("run CA key: {e}"))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("run CA: {e}"))?;
        Ok(RunCa {
            pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
            made: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate (PEM), for the sandbox's trust store.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server configuration presenting a certificate for `name`, signed by this CA.
    fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = made.get(name) {
            return Ok(c.clone());
        }
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()])
            .map_err(|e| format!("certificate for {name}: {e}"))?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let key = rcgen::KeyPair::generate().map_err(|e| format!("key for {name}: {e}"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("certificate for {name}: {e}"))?;
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], private)
            .map_err(|e| format!("certificate for {name}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        made.insert(name.to_string(), config.clone());
        Ok(config)
    }
}

fn strip_port(pattern: &str) -> &str {
    if pattern.starts_with('[') {
        return match pattern.find(']') {
            Some(i) => &pattern[..=i],
            None => pattern,
        };
    }
    match pattern.rsplit_once(':') {
        Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => h,
        _ => pattern,
    }
}

/// Write the run's trust store into `dir`: `ca.pem` (the run's CA alone, for
/// `NODE_EXTRA_CA_CERTS`) and `trust.pem` (the system's roots and the run's CA). Returns the
/// variables that point the usual clients at them.
pub(crate) fn write_trust(dir: &Path, ca: &RunCa) -> Result<Vec<(String, String)>, String> {
    let mut bundle = match system_roots_file() {
        Some(f) => {
            std::fs::read_to_string(&f).map_err(|e| format!("reading {}: {e}", f.display()))?
        }
        None => String::new(),
    };
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(ca.pem());
    let ca_file = dir.join("ca.pem");
    let trust = dir.join("trust.pem");
    for (path, text) in [(&ca_file, ca.pem()), (&trust, bundle.as_str())] {
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let trust = trust.display().to_string();
    let mut env: Vec<(String, String)> = [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
    ]
    .iter()
    .map(|k| (k.to_string(), trust.clone()))
    .collect();
    env.push(("NODE_EXTRA_CA_CERTS".into(), ca_file.display().to_string()));
    Ok(env)
}

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
        Err(e) => crate::proxy::text(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_stripped_from_patterns() {
        assert_eq!(strip_port("api.example.com:8443"), "api.example.com");
        assert_eq!(strip_port("*.example.com"), "*.example.com");
        assert_eq!(strip_port("[2001:db8::1]:443"), "[2001:db8::1]");
        assert_eq!(strip_port("[2001:db8::1]"), "[2001:db8::1]");
    }

    #[test]
    fn a_run_ca_signs_for_its_hosts() {
        let ca = RunCa::new(&["api.example.com".into(), "*.example.org:8443".into()]).expect("CA");
        assert!(ca.pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let a = ca.server_config("api.example.com").expect("config");
        let b = ca.server_config("api.example.com").expect("config");
        assert!(Arc::ptr_eq(&a, &b), "made once per name");
        let other = RunCa::new(&["api.example.com".into()]).expect("CA");
        assert_ne!(ca.pem(), other.pem(), "a CA per run");
    }
}
