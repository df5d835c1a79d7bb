//! gearbox as an OAuth 2.1 resource server (`[http.oauth]`, MCP authorization).
//!
//! A bearer that is a JWT (and not an API key) is an access token of the configured issuer:
//! its signature is checked against the issuer's key set (JWKS; fetched with a timeout,
//! kept `jwks_ttl_secs`, fetched again when a token names a key id it lacks — key rotation —
//! at most once per `jwks_refetch_secs`), then `exp` and `nbf` (with `leeway_secs`), `iss`
//! and `aud` (this server's resource identifier, RFC 8707). The tenant is the
//! `tenant_claim`; the scope `PREFIX` + gear caps the gear, `PREFIX` + `admin` makes an
//! admin; a token with no gear scope is refused with 403 `insufficient_scope`. The
//! signature work is `jsonwebtoken`'s (ring); nothing here is cryptography.
//!
//! The Protected Resource Metadata (RFC 9728) is served at
//! `/.well-known/oauth-protected-resource` and at the path-suffixed form for the resource's
//! path (`/.well-known/oauth-protected-resource/mcp`), and a 401 names it in
//! `WWW-Authenticate: Bearer resource_metadata="..."`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use gearbox_core::Gear;
use gearbox_engine::config::OAuthConfig;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use crate::Caller;

/// How long one fetch (connect, TLS, answer) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest metadata or key set document read.
const MAX_DOCUMENT: usize = 1024 * 1024;
/// Longest token considered.
const MAX_TOKEN: usize = 16 * 1024;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// 401 `invalid_token`: bad, expired, not for this server, unknown key.
    Invalid(String),
    /// 403 `insufficient_scope`: valid, but grants no gear.
    Scope(String),
}

/// The key set last fetched, and when.
#[derive(Default)]
struct Cache {
    keys: Option<(Instant, Arc<JwkSet>)>,
    /// When the last fetch was tried (succeeded or not): the refetch rate limit.
    tried: Option<Instant>,
    /// The key set's URL, once known (configured or discovered).
    url: Option<String>,
}

/// The resource server of one daemon.
pub struct OAuth {
    cfg: OAuthConfig,
    cache: tokio::sync::Mutex<Cache>,
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth")
            .field("issuer", &self.cfg.issuer)
            .field("audience", &self.cfg.audience)
            .finish()
    }
}

/// Whether `s` has the shape of a JWS compact token (three base64url parts).
pub fn looks_like_jwt(s: &[u8]) -> bool {
    s.len() <= MAX_TOKEN
        && s.starts_with(b"eyJ")
        && s.iter().filter(|b| **b == b'.').count() == 2
        && s.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
}

/// The well-known path of the metadata of a resource at `path`: RFC 9728 inserts
/// `/.well-known/oauth-protected-resource` between the host and the resource's path.
pub const PRM_PATH: &str = "/.well-known/oauth-protected-resource";

/// `(origin, path)` of an http(s) URL; the path without a trailing `/` (`""` for the root).
fn split_url(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = path.split(['?', '#']).next().unwrap_or("");
    Some((
        format!("{scheme}://{host}"),
        path.trim_end_matches('/').to_string(),
    ))
}

impl OAuth {
    pub fn new(cfg: OAuthConfig) -> OAuth {
        let cache = Cache {
            url: cfg.jwks_url.clone(),
            ..Cache::default()
        };
        OAuth {
            cfg,
            cache: tokio::sync::Mutex::new(cache),
        }
    }

    /// The scopes gearbox reads, lowest gear first, then the admin scope.
    fn scopes(&self) -> Vec<String> {
        let p = &self.cfg.scope_prefix;
        Gear::ALL
            .iter()
            .map(|g| format!("{p}{g}"))
            .chain(std::iter::once(format!("{p}admin")))
            .collect()
    }

    /// The Protected Resource Metadata document (RFC 9728).
    pub fn metadata(&self) -> Value {
        serde_json::json!({
            "resource": self.cfg.audience,
            "authorization_servers": [self.cfg.issuer],
            "scopes_supported": self.scopes(),
            "bearer_methods_supported": ["header"],
            "resource_name": "gearbox",
        })
    }

    /// Where the metadata is, as a client finds it from the resource identifier.
    pub fn metadata_url(&self) -> String {
        match split_url(&self.cfg.audience) {
            Some((origin, path)) => format!("{origin}{PRM_PATH}{path}"),
            None => PRM_PATH.to_string(),
        }
    }

    /// The `WWW-Authenticate` value of a refusal: the metadata's URL, and the RFC 6750
    /// error when a token was presented and refused.
    pub fn challenge(&self, error: Option<&TokenError>) -> String {
        let mut v = format!("Bearer resource_metadata=\"{}\"", self.metadata_url());
        match error {
            Some(TokenError::Invalid(d)) => {
                v.push_str(&format!(
                    ", error=\"invalid_token\", error_description=\"{}\"",
                    quoted(d)
                ));
            }
            Some(TokenError::Scope(d)) => {
                v.push_str(&format!(
                    ", error=\"insufficient_scope\", scope=\"{}\", error_description=\"{}\"",
                    self.scopes()[..Gear::ALL.len()].join(" "),
                    quoted(d)
                ));
            }
            None => {}
        }
        v
    }

    /// Validate an access token; the caller it is.
    pub async fn verify(&self, token: &str) -> Result<Caller, TokenError> {
        let invalid = |m: String| TokenError::Invalid(m);
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| invalid(format!("not a valid JWT: {e}")))?;
        if matches!(
            header.alg,
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
        ) {
            return Err(invalid(
                "the token is signed with a shared secret (HS*); only the issuer's public \
                 keys are accepted"
                    .into(),
            ));
        }
        let keys = self.keys(header.kid.as_deref()).await?;
        let jwk = match &header.kid {
            Some(kid) => keys.find(kid),
            // Without a key id, only a set of one key says which key it is.
            None if keys.keys.len() == 1 => keys.keys.first(),
            None => None,
        }
        .ok_or_else(|| {
            invalid(format!(
                "the token's signing key ({}) is not in the issuer's key set",
                header.kid.as_deref().unwrap_or("no kid")
            ))
        })?;
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            return Err(invalid("the issuer's key is a shared secret".into()));
        }
        let key = DecodingKey::from_jwk(jwk)
            .map_err(|e| invalid(format!("the issuer's key cannot be used: {e}")))?;
        let mut v = Validation::new(header.alg);
        v.leeway = self.cfg.leeway_secs;
        v.validate_nbf = true;
        v.set_issuer(&[&self.cfg.issuer]);
        v.set_audience(&[&self.cfg.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &v)
            .map_err(|e| invalid(describe(&e)))?;
        self.caller(&data.claims)
    }

    /// The caller the claims of a valid token name.
    fn caller(&self, claims: &serde_json::Map<String, Value>) -> Result<Caller, TokenError> {
        let claim = &self.cfg.tenant_claim;
        let tenant = claims
            .get(claim)
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= 256 && !t.chars().any(char::is_control))
            .ok_or_else(|| {
                TokenError::Invalid(format!(
                    "the token has no usable {claim} claim (it names the tenant)"
                ))
            })?;
        let scopes: Vec<&str> = match (claims.get("scope"), claims.get("scp")) {
            (Some(Value::String(s)), _) => s.split_whitespace().collect(),
            (_, Some(Value::Array(a))) => a.iter().filter_map(Value::as_str).collect(),
            (_, Some(Value::String(s))) => s.split_whitespace().collect(),
            _ => Vec::new(),
        };
        let p = &self.cfg.scope_prefix;
        let has = |name: &str| {
            scopes
                .iter()
                .any(|s| s.strip_prefix(p.as_str()) == Some(name))
        };
        let gear = Gear::ALL.iter().rev().find(|g| has(g.as_str())).copied();
        let Some(gear) = gear else {
            return Err(TokenError::Scope(format!(
                "the token grants no gearbox scope; it needs one of {}",
                self.scopes()[..Gear::ALL.len()].join(", ")
            )));
        };
        Ok(Caller {
            name: tenant.to_string(),
            tenant: tenant.to_string(),
            admin: has("admin"),
            max_gear: Some(gear),
        })
    }

    /// The key set: the cached one while fresh and holding `kid`; else fetched again,
    /// unless the last fetch is younger than `jwks_refetch_secs` (a flood of tokens with
    /// made-up key ids must not become a flood of fetches).
    async fn keys(&self, kid: Option<&str>) -> Result<Arc<JwkSet>, TokenError> {
        let mut cache = self.cache.lock().await;
        let now = Instant::now();
        let ttl = Duration::from_secs(self.cfg.jwks_ttl_secs);
        if let Some((at, set)) = &cache.keys {
            let fresh = now.duration_since(*at) < ttl;
            let knows = kid.is_none_or(|k| set.find(k).is_some());
            if fresh && knows {
                return Ok(set.clone());
            }
        }
        let may_fetch = refetch_allowed(
            cache.tried,
            now,
            Duration::from_secs(self.cfg.jwks_refetch_secs),
        );
        if !may_fetch {
            return match &cache.keys {
                Some((_, set)) => Ok(set.clone()),
                None => Err(TokenError::Invalid(
                    "the issuer's key set could not be fetched; retry later".into(),
                )),
            };
        }
        cache.tried = Some(now);
        match self.fetch_keys(&mut cache).await {
            Ok(set) => {
                let set = Arc::new(set);
                cache.keys = Some((now, set.clone()));
                Ok(set)
            }
            Err(e) => {
                tracing::warn!(issuer = %self.cfg.issuer, error = %e, "fetching the issuer's key set");
                match &cache.keys {
                    // A stale set still verifies what it holds; a new kid waits.
                    Some((_, set)) => Ok(set.clone()),
                    None => Err(TokenError::Invalid(format!(
                        "the issuer's key set could not be fetched: {e}"
                    ))),
                }
            }
        }
    }

    async fn fetch_keys(&self, cache: &mut Cache) -> Result<JwkSet, String> {
        let url = match &cache.url {
            Some(u) => u.clone(),
            None => {
                let u = self.discover().await?;
                cache.url = Some(u.clone());
                u
            }
        };
        let doc = get_json(&url).await?;
        serde_json::from_value::<JwkSet>(doc)
            .map_err(|e| format!("{url}: not a JSON Web Key Set: {e}"))
    }

    /// The `jwks_uri` of the issuer's metadata: RFC 8414's document, else OpenID Connect's.
    async fn discover(&self) -> Result<String, String> {
        let issuer = self.cfg.issuer.trim_end_matches('/');
        let (origin, path) = split_url(issuer).ok_or("the issuer is not a URL")?;
        let mut errors = Vec::new();
        for url in [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{issuer}/.well-known/openid-configuration"),
        ] {
            match get_json(&url).await {
                Ok(doc) => {
                    if doc.get("issuer").and_then(Value::as_str) != Some(self.cfg.issuer.as_str()) {
                        errors.push(format!("{url}: its issuer is not {}", self.cfg.issuer));
                        continue;
                    }
                    match doc.get("jwks_uri").and_then(Value::as_str) {
                        Some(u) => return Ok(u.to_string()),
                        None => errors.push(format!("{url}: no jwks_uri")),
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        Err(format!(
            "no authorization server metadata: {}",
            errors.join("; ")
        ))
    }
}

/// Whether a fetch may go out now, the last one having been tried at `tried`.
fn refetch_allowed(tried: Option<Instant>, now: Instant, every: Duration) -> bool {
    tried.is_none_or(|t| now.duration_since(t) >= every)
}

/// What a token's error means, in words for its holder.
fn describe(e: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => "the token has expired".into(),
        K::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        K::InvalidAudience => "the token is not for this server (aud)".into(),
        K::InvalidIssuer => "the token is from another issuer (iss)".into(),
        K::InvalidSignature => "the token's signature does not verify".into(),
        K::MissingRequiredClaim(c) => format!("the token lacks the {c} claim"),
        K::InvalidAlgorithm => "the token's algorithm does not match its key".into(),
        other => format!("the token is not valid: {other:?}"),
    }
}

/// `s` fit for a quoted-string of a header: printable ASCII, no quote or backslash.
fn quoted(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// GET `url` (http or https, system roots), within [`FETCH_TIMEOUT`]; its JSON.
async fn get_json(url: &str) -> Result<Value, String> {
    match tokio::time::timeout(FETCH_TIMEOUT, get(url)).await {
        Ok(Ok(body)) => serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}")),
        Ok(Err(e)) => Err(format!("{url}: {e}")),
        Err(_) => Err(format!("{url}: no answer within {FETCH_TIMEOUT:?}")),
    }
}

async fn get(url: &str) -> Result<bytes::Bytes, String> {
    let uri: axum::http::Uri = url.parse().map_err(|e| format!("bad URL: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("expected an http(s) URL".into()),
    };
    let host = uri.host().ok_or("no host")?.to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
    let path = uri
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    let req = axum::http::Request::get(path)
        .header(axum::http::header::HOST, authority)
        .header(axum::http::header::ACCEPT, "application/json")
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    let resp = if https {
        let config = gearbox_egress::tls_client_config()?;
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from(
            host.trim_matches(['[', ']']).to_string(),
        )
        .map_err(|e| format!("bad host name: {e}"))?;
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        send(tls, req).await?
    } else {
        send(tcp, req).await?
    };
    if resp.status() != axum::http::StatusCode::OK {
        return Err(format!("answered {}", resp.status()));
    }
    axum::body::to_bytes(Body::new(resp.into_body()), MAX_DOCUMENT)
        .await
        .map_err(|e| format!("reading the answer: {e}"))
}

async fn send<S>(
    io: S,
    req: axum::http::Request<Body>,
) -> Result<axum::http::Response<hyper::body::Incoming>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| format!("HTTP: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oauth() -> OAuth {
        OAuth::new(OAuthConfig {
            issuer: "https://id.example".into(),
            audience: "https://gearbox.example/mcp".into(),
            ..OAuthConfig::default()
        })
    }

    #[test]
    fn metadata_url_and_challenge() {
        let o = oauth();
        assert_eq!(
            o.metadata_url(),
            "https://gearbox.example/.well-known/oauth-protected-resource/mcp"
        );
        let m = o.metadata();
        assert_eq!(m["resource"], "https://gearbox.example/mcp");
        assert_eq!(m["authorization_servers"][0], "https://id.example");
        assert_eq!(m["scopes_supported"][4], "gearbox:admin");
        let c = o.challenge(Some(&TokenError::Invalid("bad \"x\"\n".into())));
        assert!(c.contains("error=\"invalid_token\""), "{c}");
        assert!(c.contains("bad ?x??"), "{c}");
        let c = o.challenge(Some(&TokenError::Scope("none".into())));
        assert!(c.contains("error=\"insufficient_scope\""), "{c}");
        assert!(!o.challenge(None).contains("error="));
    }

    #[test]
    fn scopes_cap_the_gear_and_the_claim_names_the_tenant() {
        let o = oauth();
        let claims = |v: Value| v.as_object().cloned().expect("object");
        let c = o
            .caller(&claims(serde_json::json!({
                "sub": "svc-1", "scope": "openid gearbox:restricted gearbox:read_only"
            })))
            .expect("valid");
        assert_eq!(c.tenant, "svc-1");
        assert_eq!(c.max_gear, Some(Gear::Restricted), "the highest gear scope");
        assert!(!c.admin);
        let c = o
            .caller(&claims(serde_json::json!({
                "sub": "ops", "scp": ["gearbox:full_trust", "gearbox:admin"]
            })))
            .expect("valid");
        assert!(c.admin && c.max_gear == Some(Gear::FullTrust));
        let e = o
            .caller(&claims(
                serde_json::json!({"sub": "x", "scope": "gearbox:admin other"}),
            ))
            .expect_err("no gear scope");
        assert!(matches!(e, TokenError::Scope(_)), "{e:?}");
        let e = o
            .caller(&claims(serde_json::json!({"scope": "gearbox:full_trust"})))
            .expect_err("no sub");
        assert!(matches!(e, TokenError::Invalid(_)), "{e:?}");
        let e = o
            .caller(&claims(
                serde_json::json!({"sub": "", "scope": "gearbox:full_trust"}),
            ))
            .expect_err("empty sub");
        assert!(matches!(e, TokenError::Invalid(_)), "{e:?}");
    }

    #[test]
    fn refetch_is_rate_limited() {
        let t0 = Instant::now();
        let every = Duration::from_secs(10);
        assert!(refetch_allowed(None, t0, every));
        assert!(!refetch_allowed(
            Some(t0),
            t0 + Duration::from_secs(9),
            every
        ));
        assert!(refetch_allowed(Some(t0), t0 + every, every));
    }

    #[test]
    fn jwt_shape() {
        assert!(looks_like_jwt(b"eyJhbGciOi.eyJzdWIi.c2ln"));
        assert!(!looks_like_jwt(b"alice-key-0123456789abcdef"));
        assert!(!looks_like_jwt(b"eyJa.b"));
        assert!(!looks_like_jwt(b"eyJa.b.c d"));
    }

    #[tokio::test]
    async fn garbage_and_secret_signed_tokens_are_invalid_not_a_panic() {
        let o = oauth();
        for t in [
            "eyJ.eyJ.x",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln",
            "",
            "....",
        ] {
            match o.verify(t).await {
                Err(TokenError::Invalid(_)) => {}
                other => panic!("{t}: {other:?}"),
            }
        }
    }
}
