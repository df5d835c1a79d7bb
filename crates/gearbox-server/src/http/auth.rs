//! API keys: named keys from `GEARBOX_API_KEYS` and `[http] api_keys_file`, presented as
//! `Authorization: Bearer KEY` or `X-API-Key: KEY`, compared in constant time. A request with
//! a good key carries a [`Caller`]: the key's name, its tenant, admin and highest gear from
//! `[http.keys.NAME]`; the key itself is never stored past start-up in clear, logged or
//! audited.

use std::collections::BTreeMap;
use std::path::Path;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use gearbox_engine::config::KeyConfig;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::oauth::{TokenError, looks_like_jwt};
use crate::Caller;

/// The environment variable with `name:key,name2:key2`.
pub const ENV_API_KEYS: &str = "GEARBOX_API_KEYS";

/// Keys shorter than this are refused at start-up.
pub const MIN_KEY_LEN: usize = 16;

/// The configured keys: each name with the SHA-256 of its key.
#[derive(Clone, Default)]
pub struct ApiKeys {
    keys: Vec<(String, [u8; 32])>,
    /// `[http.keys.NAME]`: tenant, admin, highest gear.
    settings: BTreeMap<String, KeyConfig>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|(n, _)| n))
            .finish()
    }
}

fn digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

impl ApiKeys {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn names(&self) -> Vec<&str> {
        self.keys.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// Add `name:key` entries separated by commas or newlines; `#` starts a comment line.
    /// `origin` names where they came from, for errors.
    pub fn add_list(&mut self, text: &str, origin: &str) -> Result<(), String> {
        for (i, raw) in text.split([',', '\n']).enumerate() {
            let entry = raw.trim();
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let Some((name, key)) = entry.split_once(':') else {
                return Err(format!(
                    "{origin}: entry {} is not name:key (the key is not shown)",
                    i + 1
                ));
            };
            let (name, key) = (name.trim(), key.trim());
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
            {
                return Err(format!(
                    "{origin}: entry {}: key name {name:?} must be letters, digits, - _ . @",
                    i + 1
                ));
            }
            if key.len() < MIN_KEY_LEN {
                return Err(format!(
                    "{origin}: key {name:?} is shorter than {MIN_KEY_LEN} characters"
                ));
            }
            if self.keys.iter().any(|(n, _)| n == name) {
                return Err(format!("{origin}: key name {name:?} appears twice"));
            }
            self.keys.push((name.to_string(), digest(key.as_bytes())));
        }
        Ok(())
    }

    /// Keys from the environment variable and the keys file.
    pub fn load(env: Option<&str>, file: Option<&Path>) -> Result<ApiKeys, String> {
        let mut keys = ApiKeys::default();
        if let Some(text) = env {
            keys.add_list(text, ENV_API_KEYS)?;
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading api_keys_file {}: {e}", path.display()))?;
            keys.add_list(&text, &format!("api_keys_file {}", path.display()))?;
        }
        Ok(keys)
    }

    /// Take the per-key settings of `[http.keys]`; an entry naming no key is an error (a
    /// typo would otherwise leave a key uncapped).
    pub fn set_settings(&mut self, settings: &BTreeMap<String, KeyConfig>) -> Result<(), String> {
        if let Some(name) = settings
            .keys()
            .find(|n| !self.keys.iter().any(|(k, _)| k == *n))
        {
            return Err(format!(
                "[http.keys.{name}]: no API key is named {name:?} ({ENV_API_KEYS} or [http] \
                 api_keys_file)"
            ));
        }
        self.settings = settings.clone();
        Ok(())
    }

    /// The caller a request with the key `name` is.
    pub fn caller(&self, name: &str) -> Caller {
        let mut c = Caller::named(name);
        if let Some(s) = self.settings.get(name) {
            if let Some(t) = &s.tenant {
                c.tenant = t.clone();
            }
            c.admin = s.admin;
            c.max_gear = s.max_gear;
        }
        c
    }

    /// The name of the key `presented`, comparing against every key in constant time.
    pub fn check(&self, presented: &[u8]) -> Option<&str> {
        let d = digest(presented);
        let mut found = None;
        for (name, k) in &self.keys {
            if bool::from(k.ct_eq(&d)) {
                found = Some(name.as_str());
            }
        }
        found
    }
}

/// The key a request presents: `Authorization: Bearer KEY` or `X-API-Key: KEY`.
fn presented(headers: &HeaderMap) -> Option<&[u8]> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let b = v.as_bytes();
        if b.len() > 7 && b[..7].eq_ignore_ascii_case(b"bearer ") {
            return Some(b[7..].trim_ascii());
        }
    }
    headers.get("x-api-key").map(|v| v.as_bytes().trim_ascii())
}

/// What the daemon accepts: its API keys, and the access tokens of `[http.oauth]`.
#[derive(Debug, Default)]
pub struct Auth {
    pub keys: ApiKeys,
    pub oauth: Option<super::oauth::OAuth>,
}

impl Auth {
    /// No key and no issuer: every request is `anonymous`.
    pub fn is_open(&self) -> bool {
        self.keys.is_empty() && self.oauth.is_none()
    }
}

/// A refusal whose body is a JSON-RPC error, so MCP clients show the message.
fn refusal(status: StatusCode, challenge: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": -32001, "message": message },
    });
    let mut r = (status, axum::Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(challenge) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// A 401 with the challenge of `auth`: where the resource metadata is when OAuth is on.
pub fn unauthorized(auth: &Auth, error: Option<&TokenError>, message: &str) -> Response {
    let challenge = match &auth.oauth {
        Some(o) => o.challenge(error),
        None => "Bearer realm=\"gearbox\"".to_string(),
    };
    refusal(StatusCode::UNAUTHORIZED, &challenge, message)
}

/// Middleware: unless the daemon is open, refuse a request without a good key or token;
/// put the [`Caller`] in the request's extensions. A bearer that matches a key is that key;
/// else, with `[http.oauth]`, one shaped like a JWT is validated as an access token.
pub async fn require_key(
    State(auth): State<std::sync::Arc<Auth>>,
    mut req: Request<Body>,
    next: Next,
) -> Response {
    let caller = if auth.is_open() {
        Caller::named("anonymous")
    } else {
        let Some(presented) = presented(req.headers()) else {
            let message = if auth.oauth.is_some() {
                "unauthorized: no API key or access token; send Authorization: Bearer TOKEN \
                 (an access token of the configured issuer) or Bearer KEY"
            } else {
                "unauthorized: no API key; send Authorization: Bearer KEY or X-API-Key: KEY"
            };
            return unauthorized(&auth, None, message);
        };
        if let Some(name) = auth.keys.check(presented) {
            auth.keys.caller(name)
        } else if let Some(o) = auth.oauth.as_ref().filter(|_| looks_like_jwt(presented)) {
            let token = String::from_utf8_lossy(presented).into_owned();
            match o.verify(&token).await {
                Ok(c) => c,
                Err(e) => {
                    return match &e {
                        TokenError::Invalid(m) => {
                            unauthorized(&auth, Some(&e), &format!("unauthorized: {m}"))
                        }
                        TokenError::Scope(m) => refusal(
                            StatusCode::FORBIDDEN,
                            &o.challenge(Some(&e)),
                            &format!("forbidden: {m}"),
                        ),
                    };
                }
            }
        } else {
            let e = TokenError::Invalid("not a known API key or access token".into());
            return unauthorized(&auth, Some(&e), "unauthorized: the API key is not valid");
        }
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_check_and_never_show() {
        let mut k = ApiKeys::default();
        k.add_list(
            "alice:0123456789abcdef0123, bob:fedcba9876543210fedc",
            "env",
        )
        .expect("parses");
        assert_eq!(k.check(b"0123456789abcdef0123"), Some("alice"));
        assert_eq!(k.check(b"fedcba9876543210fedc"), Some("bob"));
        assert_eq!(k.check(b"0123456789abcdef012"), None);
        assert_eq!(k.check(b""), None);
        assert!(!format!("{k:?}").contains("0123"));
        let e = k.add_list("carol:short", "env").expect_err("short");
        assert!(e.contains("carol") && !e.contains("short\""), "{e}");
        let e = k
            .add_list("alice:0123456789abcdef0123xx", "env")
            .expect_err("dup");
        assert!(e.contains("twice"), "{e}");
        let e = k.add_list("nocolon", "env").expect_err("bad");
        assert!(!e.contains("nocolon"), "the entry may be a key: {e}");
    }

    #[test]
    fn key_settings_name_tenant_admin_and_cap() {
        let mut k = ApiKeys::default();
        k.add_list("ci:0123456789abcdef0123,ops:fedcba9876543210fedc", "env")
            .expect("parses");
        let mut s = BTreeMap::new();
        s.insert(
            "ci".to_string(),
            KeyConfig {
                tenant: Some("team".into()),
                admin: false,
                max_gear: Some(gearbox_core::Gear::Restricted),
            },
        );
        s.insert(
            "ops".to_string(),
            KeyConfig {
                admin: true,
                ..Default::default()
            },
        );
        k.set_settings(&s).expect("both keys exist");
        let ci = k.caller("ci");
        assert_eq!((ci.name.as_str(), ci.tenant.as_str()), ("ci", "team"));
        assert_eq!(
            ci.ceiling(gearbox_core::Gear::FullTrust),
            gearbox_core::Gear::Restricted
        );
        assert_eq!(
            ci.ceiling(gearbox_core::Gear::ReadOnly),
            gearbox_core::Gear::ReadOnly,
            "a cap never raises the server's gear"
        );
        let ops = k.caller("ops");
        assert!(ops.admin && ops.tenant == "ops" && ops.max_gear.is_none());
        s.insert("typo".to_string(), KeyConfig::default());
        let e = k.set_settings(&s).expect_err("unknown key");
        assert!(e.contains("typo"), "{e}");
    }

    #[test]
    fn both_headers_are_read() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(presented(&h), Some(&b"abc"[..]));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", HeaderValue::from_static(" xyz "));
        assert_eq!(presented(&h), Some(&b"xyz"[..]));
        assert_eq!(presented(&HeaderMap::new()), None);
    }
}
