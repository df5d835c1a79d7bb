//! `[[secrets]]`: credentials a granted run uses without ever holding them.
//!
//! The program sees a placeholder in an environment variable (`GITHUB_TOKEN=gbx-placeholder-…`,
//! fresh for every run). On a TLS connection to one of the secret's hosts the proxy terminates
//! TLS with the run's own CA (`intercept.rs`), replaces the placeholder in the request's header
//! values with the real value (and adds the configured header when the request lacks it), and
//! re-encrypts upstream. Anywhere else the placeholder stays a placeholder. An upstream that
//! echoes the value back has it replaced by the placeholder again on the way down (headers,
//! and bodies that are not compressed). The value is never logged, never in a ledger, outcome,
//! audit line or metric, and never in the sandbox.

use std::path::PathBuf;

use gearbox_core::Network;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One `[[secrets]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretConfig {
    /// The environment variable the program sees, holding a placeholder (`GITHUB_TOKEN`):
    /// capitals, digits and `_`, not starting with a digit.
    pub name: String,
    /// Take the value from this variable of the server's environment ...
    #[serde(default)]
    pub value_env: Option<String>,
    /// ... or from this file (trailing newlines dropped). Exactly one of the two.
    #[serde(default)]
    pub value_file: Option<PathBuf>,
    /// Host patterns the value is for (`api.github.com`, `*.example.com`); it is presented
    /// only on TLS connections to these hosts (which the run's grant must admit as well).
    pub hosts: Vec<String>,
    /// A header the proxy sets when a request to the hosts lacks it (`Authorization`).
    /// Absent: the placeholder is replaced wherever the program put it in a header.
    #[serde(default)]
    pub header: Option<String>,
    /// How the value is presented in `header`; `{value}` is replaced (`Bearer {value}`).
    /// Default `{value}`.
    #[serde(default)]
    pub format: Option<String>,
}

/// A secret ready to use: its value read, its hosts parsed. `Debug` never shows the value.
#[derive(Clone)]
pub(crate) struct Secret {
    pub name: String,
    value: String,
    pub hosts: Network,
    header: Option<hyper::header::HeaderName>,
    format: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Whether `name` is a variable name a secret may take.
fn good_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("GEARBOX_")
}

impl SecretConfig {
    /// Check the entry and read its value.
    pub(crate) fn load(&self) -> Result<Secret, String> {
        let name = &self.name;
        if !good_name(name) {
            return Err(format!(
                "[[secrets]] name {name:?}: use capitals, digits and _ (not starting with a \
                 digit, not GEARBOX_…)"
            ));
        }
        let value = match (&self.value_env, &self.value_file) {
            (Some(var), None) => std::env::var(var).map_err(|_| {
                format!("[[secrets]] {name}: the server's environment has no {var}")
            })?,
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| format!("[[secrets]] {name}: reading {}: {e}", path.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
            _ => {
                return Err(format!(
                    "[[secrets]] {name}: give exactly one of value_env and value_file"
                ));
            }
        };
        if value.is_empty() {
            return Err(format!("[[secrets]] {name}: the value is empty"));
        }
        if hyper::header::HeaderValue::from_str(&value).is_err() {
            return Err(format!(
                "[[secrets]] {name}: the value cannot go in an HTTP header (control characters)"
            ));
        }
        if self.hosts.is_empty() {
            return Err(format!("[[secrets]] {name}: list the hosts it is for"));
        }
        if self
            .hosts
            .iter()
            .any(|h| h.trim().starts_with('*') && !h.trim().starts_with("*."))
        {
            return Err(format!(
                "[[secrets]] {name}: a secret is for named hosts, not `*` (any host)"
            ));
        }
        let hosts =
            Network::hosts(&self.hosts).map_err(|e| format!("[[secrets]] {name}: hosts: {e}"))?;
        let header = match &self.header {
            None => None,
            Some(h) => Some(
                hyper::header::HeaderName::from_bytes(h.as_bytes())
                    .map_err(|_| format!("[[secrets]] {name}: {h:?} is not a header name"))?,
            ),
        };
        let format = self.format.clone().unwrap_or_else(|| "{value}".into());
        if !format.contains("{value}") {
            return Err(format!("[[secrets]] {name}: format must contain {{value}}"));
        }
        Ok(Secret {
            name: name.clone(),
            value,
            hosts,
            header,
            format,
        })
    }
}

/// Check every entry and read every value; names must differ.
pub(crate) fn load_all(secrets: &[SecretConfig]) -> Result<Vec<Secret>, String> {
    let loaded = secrets
        .iter()
        .map(SecretConfig::load)
        .collect::<Result<Vec<_>, _>>()?;
    let mut names = std::collections::BTreeSet::new();
    for s in &loaded {
        if !names.insert(s.name.as_str()) {
            return Err(format!("[[secrets]] {} is listed twice", s.name));
        }
    }
    Ok(loaded)
}

/// Check `[[secrets]]` as a server starting with it would (every value read).
pub fn check(secrets: &[SecretConfig]) -> Result<(), String> {
    load_all(secrets).map(drop)
}

/// The secrets of one run: each with this run's placeholder.
#[derive(Debug, Default)]
pub(crate) struct RunSecrets {
    list: Vec<(Secret, String)>,
}

impl RunSecrets {
    /// Fresh placeholders for `secrets`.
    pub fn new(secrets: &[Secret]) -> RunSecrets {
        RunSecrets {
            list: secrets
                .iter()
                .map(|s| {
                    let placeholder = format!("gbx-placeholder-{}", uuid::Uuid::new_v4().simple());
                    (s.clone(), placeholder)
                })
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The program's variables: each secret's name and placeholder.
    pub fn env(&self) -> Vec<(String, String)> {
        self.list
            .iter()
            .map(|(s, p)| (s.name.clone(), p.clone()))
            .collect()
    }

    /// Whether a secret is bound to `host:port` (its connections are terminated).
    pub fn binds(&self, host: &str, port: u16) -> bool {
        self.list.iter().any(|(s, _)| s.hosts.admits(host, port))
    }

    /// Host names the run's CA may sign for (the name constraint of its certificate).
    pub fn patterns(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .list
            .iter()
            .flat_map(|(s, _)| s.hosts.patterns())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Present the secrets bound to `host:port` in `headers`: the placeholder becomes the
    /// value in every header value; a configured header missing is added. Returns the
    /// secrets presented (their values and placeholders, for [`RunSecrets::redact`]).
    pub fn present(
        &self,
        host: &str,
        port: u16,
        headers: &mut hyper::HeaderMap,
    ) -> Vec<(String, String)> {
        let mut used = Vec::new();
        for (secret, placeholder) in &self.list {
            if !secret.hosts.admits(host, port) {
                continue;
            }
            let mut presented = false;
            for value in headers.values_mut() {
                let Ok(text) = value.to_str() else { continue };
                if text.contains(placeholder.as_str()) {
                    let replaced = text.replace(placeholder.as_str(), &secret.value);
                    if let Ok(v) = hyper::header::HeaderValue::from_str(&replaced) {
                        let mut v = v;
                        v.set_sensitive(true);
                        *value = v;
                        presented = true;
                    }
                }
            }
            if let Some(name) = &secret.header
                && !headers.contains_key(name)
                && let Ok(mut v) = hyper::header::HeaderValue::from_str(
                    &secret.format.replace("{value}", &secret.value),
                )
            {
                v.set_sensitive(true);
                headers.insert(name.clone(), v);
                presented = true;
            }
            if presented {
                used.push((secret.value.clone(), placeholder.clone()));
            }
        }
        used
    }
}

/// Replace every value in `used` by its placeholder in `text`.
pub(crate) fn redact_str(text: &str, used: &[(String, String)]) -> Option<String> {
    let mut out = None::<String>;
    for (value, placeholder) in used {
        let cur = out.as_deref().unwrap_or(text);
        if cur.contains(value.as_str()) {
            out = Some(cur.replace(value.as_str(), placeholder));
        }
    }
    out
}

/// Redacts a stream of bytes chunk by chunk: a value split across two chunks is still found,
/// by holding back the last `longest - 1` bytes of each chunk until the next arrives.
pub(crate) struct Redactor {
    used: Vec<(Vec<u8>, Vec<u8>)>,
    held: Vec<u8>,
    keep: usize,
}

impl Redactor {
    pub fn new(used: &[(String, String)]) -> Redactor {
        let used: Vec<(Vec<u8>, Vec<u8>)> = used
            .iter()
            .map(|(v, p)| (v.as_bytes().to_vec(), p.as_bytes().to_vec()))
            .collect();
        let keep = used
            .iter()
            .map(|(v, _)| v.len())
            .max()
            .unwrap_or(1)
            .saturating_sub(1);
        Redactor {
            used,
            held: Vec::new(),
            keep,
        }
    }

    /// Take `chunk`; return what may be passed on now.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(chunk);
        self.replace_all();
        let pass = self.held.len().saturating_sub(self.keep);
        self.held.drain(..pass).collect()
    }

    /// The end of the stream: what is still held.
    pub fn finish(&mut self) -> Vec<u8> {
        self.replace_all();
        std::mem::take(&mut self.held)
    }

    fn replace_all(&mut self) {
        for (value, placeholder) in &self.used {
            if value.is_empty() {
                continue;
            }
            let mut out = Vec::with_capacity(self.held.len());
            let mut i = 0;
            let mut changed = false;
            while i < self.held.len() {
                if self.held[i..].starts_with(value) {
                    out.extend_from_slice(placeholder);
                    i += value.len();
                    changed = true;
                } else {
                    out.push(self.held[i]);
                    i += 1;
                }
            }
            if changed {
                self.held = out;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(header: Option<&str>) -> Secret {
        Secret {
            name: "TOKEN".into(),
            value: "s3cr3t-value".into(),
            hosts: Network::hosts(&["api.example.com"]).expect("hosts"),
            header: header.map(|h| h.parse().expect("header")),
            format: "Bearer {value}".into(),
        }
    }

    #[test]
    fn names_are_checked() {
        for good in ["TOKEN", "_X", "GITHUB_TOKEN2"] {
            assert!(good_name(good), "{good}");
        }
        for bad in ["", "token", "1X", "A-B", "GEARBOX_SECRET", "A B"] {
            assert!(!good_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_placeholder_is_replaced_only_for_its_hosts() {
        let run = RunSecrets::new(&[secret(None)]);
        let placeholder = run.env()[0].1.clone();
        assert!(placeholder.starts_with("gbx-placeholder-"));
        let mut h = hyper::HeaderMap::new();
        h.insert(
            "authorization",
            format!("token {placeholder}").parse().expect("value"),
        );
        let mut elsewhere = h.clone();
        assert!(
            run.present("evil.example.org", 443, &mut elsewhere)
                .is_empty()
        );
        assert_eq!(elsewhere["authorization"], format!("token {placeholder}"));
        let used = run.present("api.example.com", 443, &mut h);
        assert_eq!(used.len(), 1);
        assert_eq!(h["authorization"], "token s3cr3t-value");
        assert!(h["authorization"].is_sensitive());
    }

    #[test]
    fn a_configured_header_is_added_when_missing_and_kept_when_given() {
        let run = RunSecrets::new(&[secret(Some("authorization"))]);
        let mut h = hyper::HeaderMap::new();
        run.present("api.example.com", 443, &mut h);
        assert_eq!(h["authorization"], "Bearer s3cr3t-value");
        let mut own = hyper::HeaderMap::new();
        own.insert("authorization", "Basic abc".parse().expect("value"));
        assert!(run.present("api.example.com", 443, &mut own).is_empty());
        assert_eq!(own["authorization"], "Basic abc");
    }

    #[test]
    fn values_are_redacted_across_chunk_boundaries() {
        let used = vec![("s3cr3t-value".to_string(), "PH".to_string())];
        let text = b"a s3cr3t-value b s3cr3t-value";
        for cut in 0..text.len() {
            let mut r = Redactor::new(&used);
            let mut out = r.push(&text[..cut]);
            out.extend(r.push(&text[cut..]));
            out.extend(r.finish());
            assert_eq!(out, b"a PH b PH", "cut at {cut}");
        }
        assert_eq!(redact_str("x s3cr3t-value", &used).as_deref(), Some("x PH"));
        assert_eq!(redact_str("nothing", &used), None);
    }

    #[test]
    fn entries_are_checked_when_loaded() {
        let base = SecretConfig {
            name: "TOKEN".into(),
            value_env: None,
            value_file: None,
            hosts: vec!["api.example.com".into()],
            header: None,
            format: None,
        };
        let err = base.load().expect_err("no value");
        assert!(err.contains("exactly one"), "{err}");
        let dir = std::env::temp_dir().join(format!("gbx-secret-{}", std::process::id()));
        std::fs::write(&dir, "v\n").expect("write");
        let ok = SecretConfig {
            value_file: Some(dir.clone()),
            ..base.clone()
        }
        .load()
        .expect("loads");
        assert_eq!(ok.value, "v");
        assert!(!format!("{ok:?}").contains("\"v\""));
        let bad = SecretConfig {
            value_file: Some(dir.clone()),
            format: Some("Bearer".into()),
            ..base.clone()
        }
        .load()
        .expect_err("format");
        assert!(bad.contains("{value}"), "{bad}");
        let _ = std::fs::remove_file(dir);
    }
}
