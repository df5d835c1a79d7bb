//! `[[targets]]` and `[broker]`: the downstream servers and the limits of code-mode runs.
//!
//! Values of a target's `env` and `headers` may use `${VAR}`, taken from gearbox's own
//! environment when the broker starts; a missing variable is a start-up error naming it and
//! the target. The `Debug` output of every type here shows variable and header names only, so
//! a secret never reaches a log line.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::BrokerError;
use crate::glob;

/// One downstream MCP server: a child process speaking stdio (`command`) or a Streamable HTTP
/// endpoint (`url`).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Name used in `server/tool` references: 1 to 64 of `a-z`, `0-9`, `_`, `-`.
    pub name: String,
    /// Program of a stdio server (looked up on `PATH`). Excludes `url`.
    #[serde(default)]
    pub command: Option<String>,
    /// Arguments of `command`.
    #[serde(default)]
    pub args: Vec<String>,
    /// Working directory of `command` (default: gearbox's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Environment of `command`, added to a minimal one (`PATH`, `HOME`, `LANG`). Values may
    /// use `${VAR}` from gearbox's environment. Never passed to sandboxes or shown in results.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Free labels shown by `servers_list`.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Globs of the tool names this server may expose (`*`, `?`); empty allows every tool.
    #[serde(default)]
    pub tools_allow: Vec<String>,
    /// Streamable HTTP endpoint (`http://host:port/mcp`). Excludes `command`.
    #[serde(default)]
    pub url: Option<String>,
    /// HTTP headers sent to `url`; values may use `${VAR}`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

impl fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("cwd", &self.cwd)
            .field("env", &Redacted(&self.env))
            .field("tags", &self.tags)
            .field("tools_allow", &self.tools_allow)
            .field("url", &self.url)
            .field("headers", &Redacted(&self.headers))
            .finish()
    }
}

/// Shows the keys of a map and hides its values.
pub(crate) struct Redacted<'a>(pub &'a BTreeMap<String, String>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, "<redacted>")))
            .finish()
    }
}

/// How a target is reached, with every `${VAR}` substituted.
#[derive(Clone, PartialEq, Eq)]
pub enum Transport {
    Stdio {
        command: String,
        args: Vec<String>,
        cwd: Option<PathBuf>,
        env: BTreeMap<String, String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Stdio {
                command,
                args,
                cwd,
                env,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("cwd", cwd)
                .field("env", &Redacted(env))
                .finish(),
            Transport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &Redacted(headers))
                .finish(),
        }
    }
}

/// A validated target with its secrets resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedTarget {
    pub name: String,
    pub tags: Vec<String>,
    pub tools_allow: Vec<String>,
    pub transport: Transport,
}

impl ResolvedTarget {
    /// Every secret value of this target (env and header values that came from `${VAR}`),
    /// for scrubbing text that leaves the broker.
    pub fn secret_values(&self) -> Vec<String> {
        match &self.transport {
            Transport::Stdio { env, .. } => env.values().cloned().collect(),
            Transport::Http { headers, .. } => headers.values().cloned().collect(),
        }
    }
}

/// `[a-z0-9_-]{1,64}`.
pub fn validate_target_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("target name {name:?} must have 1 to 64 characters"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_' || *c == '-'))
    {
        return Err(format!(
            "target name {name:?} has {c:?}; only a-z, 0-9, _ and - are allowed"
        ));
    }
    Ok(())
}

/// Substitute every `${VAR}` of `value` with `lookup(VAR)`. `$$` is a literal `$`.
pub fn expand(value: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, ExpandError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let Some(end) = tail.find('}') else {
                return Err(ExpandError::Unterminated);
            };
            let var = &tail[..end];
            if var.is_empty()
                || !var.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
                || var.starts_with(|c: char| c.is_ascii_digit())
            {
                return Err(ExpandError::BadName(var.to_string()));
            }
            match lookup(var) {
                Some(v) => out.push_str(&v),
                None => return Err(ExpandError::Missing(var.to_string())),
            }
            rest = &tail[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError {
    Missing(String),
    BadName(String),
    Unterminated,
}

impl TargetConfig {
    /// Validate and substitute `${VAR}` with `lookup`.
    pub fn resolve(
        &self,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ResolvedTarget, BrokerError> {
        let bad = |message: String| BrokerError::Config {
            target: self.name.clone(),
            message,
        };
        validate_target_name(&self.name).map_err(bad)?;
        for (i, g) in self.tools_allow.iter().enumerate() {
            glob::validate(g).map_err(|e| bad(format!("tools_allow[{i}]: {e}")))?;
        }
        let sub = |field: &str, v: &str| {
            expand(v, lookup).map_err(|e| match e {
                ExpandError::Missing(var) => BrokerError::MissingVariable {
                    target: self.name.clone(),
                    field: field.to_string(),
                    variable: var,
                },
                ExpandError::BadName(n) => {
                    bad(format!("{field}: ${{{n}}} is not a valid variable name"))
                }
                ExpandError::Unterminated => {
                    bad(format!("{field}: \"${{\" without a closing \"}}\""))
                }
            })
        };
        let transport = match (&self.command, &self.url) {
            (Some(_), Some(_)) => {
                return Err(bad("give either command or url, not both".into()));
            }
            (None, None) => return Err(bad("give command (stdio) or url (HTTP)".into())),
            (Some(command), None) => {
                if command.trim().is_empty() {
                    return Err(bad("command: empty".into()));
                }
                if !self.headers.is_empty() {
                    return Err(bad("headers: only for url targets".into()));
                }
                let mut env = BTreeMap::new();
                for (k, v) in &self.env {
                    if k.is_empty()
                        || k.contains('=')
                        || k.contains('\0')
                        || !k.chars().all(|c| c == '_' || c.is_ascii_alphanumeric())
                    {
                        return Err(bad(format!("env: {k:?} is not a valid variable name")));
                    }
                    env.insert(k.clone(), sub(&format!("env.{k}"), v)?);
                }
                Transport::Stdio {
                    command: command.clone(),
                    args: self.args.clone(),
                    cwd: self.cwd.clone(),
                    env,
                }
            }
            (None, Some(url)) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(bad(format!(
                        "url: {url:?} must start with http:// or https://"
                    )));
                }
                if !self.env.is_empty() || !self.args.is_empty() || self.cwd.is_some() {
                    return Err(bad("env, args and cwd are only for command targets".into()));
                }
                let mut headers = BTreeMap::new();
                for (k, v) in &self.headers {
                    if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                        return Err(bad(format!("headers: {k:?} is not a valid header name")));
                    }
                    let value = sub(&format!("headers.{k}"), v)?;
                    if reqwest::header::HeaderValue::from_str(&value).is_err() {
                        return Err(bad(format!(
                            "headers.{k}: the value is not a valid header value"
                        )));
                    }
                    headers.insert(k.clone(), value);
                }
                Transport::Http {
                    url: url.clone(),
                    headers,
                }
            }
        };
        Ok(ResolvedTarget {
            name: self.name.clone(),
            tags: self.tags.clone(),
            tools_allow: self.tools_allow.clone(),
            transport,
        })
    }
}

/// Limits of the tool calls of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CallLimits {
    /// Milliseconds from the start of the run after which every tool call is refused.
    pub wall_clock_ms: u64,
    /// Milliseconds one tool call may take; the downstream request is cancelled past it.
    pub per_call_ms: u64,
    /// Tool calls the run may make (refused calls count too).
    pub max_calls: u32,
    /// KiB of one tool result handed to the code; a larger result is stored as an artifact
    /// and the code gets a preview and the artifact id.
    pub max_output_kb: u64,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            wall_clock_ms: 60_000,
            per_call_ms: 30_000,
            max_calls: 50,
            max_output_kb: 64,
        }
    }
}

impl CallLimits {
    fn maxima() -> Self {
        CallLimits {
            wall_clock_ms: 600_000,
            per_call_ms: 300_000,
            max_calls: 1_000,
            max_output_kb: 4_096,
        }
    }
}

/// Limits a call may ask for; absent ones take the configured defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallLimitOverrides {
    pub wall_clock_ms: Option<u64>,
    pub per_call_ms: Option<u64>,
    pub max_calls: Option<u32>,
    pub max_output_kb: Option<u64>,
}

/// `[broker]`: where run channels live and the limits of code-mode runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BrokerConfig {
    /// Directory of the runs' channel directories. Default `$RUNTIME_DIRECTORY/broker`, else
    /// `/run/gearbox/broker` as root, else `$XDG_RUNTIME_DIR/gearbox/broker`, else
    /// `/tmp/gearbox-UID/broker`.
    pub runtime_dir: Option<PathBuf>,
    /// Milliseconds to wait for a target to start and answer `initialize`. Default 30000.
    pub connect_timeout_ms: u64,
    /// Limits of a run that does not give its own.
    pub defaults: CallLimits,
    /// The most a run may ask for.
    pub maxima: CallLimits,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            runtime_dir: None,
            connect_timeout_ms: 30_000,
            defaults: CallLimits::default(),
            maxima: CallLimits::maxima(),
        }
    }
}

impl BrokerConfig {
    /// The runtime directory this configuration names.
    pub fn runtime_dir(&self) -> PathBuf {
        if let Some(d) = &self.runtime_dir {
            return d.clone();
        }
        gearbox_core::rundir::runtime_dir("broker")
    }

    /// The limits of a run: `o` over the defaults, each at most its maximum (an error names
    /// the field otherwise).
    pub fn limits(&self, o: &CallLimitOverrides) -> Result<CallLimits, String> {
        fn pick<T: Copy + PartialOrd + fmt::Display + Default>(
            field: &str,
            asked: Option<T>,
            default: T,
            max: T,
        ) -> Result<T, String> {
            match asked {
                None => Ok(if default > max { max } else { default }),
                Some(v) if v > max => {
                    Err(format!("{field}: {v} is above this server's maximum {max}"))
                }
                Some(v) if v == T::default() => Err(format!("{field}: must be at least 1")),
                Some(v) => Ok(v),
            }
        }
        let d = &self.defaults;
        let m = &self.maxima;
        Ok(CallLimits {
            wall_clock_ms: pick(
                "wall_clock_ms",
                o.wall_clock_ms,
                d.wall_clock_ms,
                m.wall_clock_ms,
            )?,
            per_call_ms: pick("per_call_ms", o.per_call_ms, d.per_call_ms, m.per_call_ms)?,
            max_calls: pick("max_calls", o.max_calls, d.max_calls, m.max_calls)?,
            max_output_kb: pick(
                "max_output_kb",
                o.max_output_kb,
                d.max_output_kb,
                m.max_output_kb,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "TOKEN" => Some("s3cret".into()),
            "HOME" => Some("/root".into()),
            _ => None,
        }
    }

    fn stdio(name: &str) -> TargetConfig {
        TargetConfig {
            name: name.into(),
            command: Some("node".into()),
            ..Default::default()
        }
    }

    #[test]
    fn expand_substitutes_and_names_the_missing_variable() {
        assert_eq!(expand("a ${TOKEN} b", &env).as_deref(), Ok("a s3cret b"));
        assert_eq!(
            expand("$$HOME $x ${HOME}", &env).as_deref(),
            Ok("$HOME $x /root")
        );
        assert_eq!(
            expand("${NOPE}", &env),
            Err(ExpandError::Missing("NOPE".into()))
        );
        assert_eq!(
            expand("${A-B}", &env),
            Err(ExpandError::BadName("A-B".into()))
        );
        assert_eq!(expand("${TOKEN", &env), Err(ExpandError::Unterminated));
    }

    #[test]
    fn resolve_reports_the_target_field_and_variable() {
        let mut t = stdio("mem");
        t.env
            .insert("API_KEY".into(), "Bearer ${MISSING_VAR}".into());
        let e = t.resolve(&env).expect_err("missing");
        let text = e.to_string();
        assert!(
            text.contains("MISSING_VAR") && text.contains("mem") && text.contains("env.API_KEY"),
            "{text}"
        );
        t.env.insert("API_KEY".into(), "Bearer ${TOKEN}".into());
        let r = t.resolve(&env).expect("resolves");
        assert_eq!(r.secret_values(), vec!["Bearer s3cret".to_string()]);
        let debug = format!("{t:?} {r:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("${TOKEN}"),
            "{debug}"
        );
        assert!(debug.contains("API_KEY"), "{debug}");
    }

    #[test]
    fn names_and_shapes_are_validated() {
        for bad in ["", "Upper", "a/b", "a.b", &"x".repeat(65)] {
            assert!(stdio(bad).resolve(&env).is_err(), "{bad:?}");
        }
        assert!(stdio("ok_name-2").resolve(&env).is_ok());
        let mut both = stdio("x");
        both.url = Some("http://127.0.0.1:1/mcp".into());
        assert!(
            both.resolve(&env)
                .expect_err("invalid")
                .to_string()
                .contains("not both")
        );
        let neither = TargetConfig {
            name: "x".into(),
            ..Default::default()
        };
        assert!(neither.resolve(&env).is_err());
        let mut h = TargetConfig {
            name: "h".into(),
            url: Some("ftp://x".into()),
            ..Default::default()
        };
        assert!(
            h.resolve(&env)
                .expect_err("invalid")
                .to_string()
                .contains("url")
        );
        h.url = Some("http://127.0.0.1:9/mcp".into());
        h.headers
            .insert("Authorization".into(), "Bearer ${TOKEN}".into());
        let r = h.resolve(&env).expect("http");
        assert!(!format!("{r:?}").contains("s3cret"));
        let mut g = stdio("g");
        g.tools_allow = vec!["".into()];
        assert!(
            g.resolve(&env)
                .expect_err("invalid")
                .to_string()
                .contains("tools_allow[0]")
        );
    }

    #[test]
    fn deny_unknown_fields() {
        let e = toml_like(r#"{"name":"x","command":"y","secret":"z"}"#);
        assert!(e.contains("secret"), "{e}");
    }

    fn toml_like(json: &str) -> String {
        serde_json::from_str::<TargetConfig>(json)
            .map(|_| String::new())
            .unwrap_or_else(|e| e.to_string())
    }

    #[test]
    fn limits_take_defaults_and_refuse_above_maxima() {
        let c = BrokerConfig::default();
        let l = c.limits(&CallLimitOverrides::default()).expect("defaults");
        assert_eq!(l, c.defaults);
        let e = c
            .limits(&CallLimitOverrides {
                max_calls: Some(1_000_000),
                ..Default::default()
            })
            .expect_err("above");
        assert!(e.starts_with("max_calls:"), "{e}");
        let e = c
            .limits(&CallLimitOverrides {
                per_call_ms: Some(0),
                ..Default::default()
            })
            .expect_err("zero");
        assert!(e.starts_with("per_call_ms:"), "{e}");
    }
}
