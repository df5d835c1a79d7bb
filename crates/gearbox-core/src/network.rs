//! The network a run asks for and is given, and what it did with it.
//!
//! A run never shares the host's network stack: it has a network namespace of its own with
//! only loopback, granted or not. A granted run reaches the outside only through gearbox's
//! egress proxy (a per-run socket, relayed to `127.0.0.1:`[`EGRESS_PROXY_PORT`] inside the
//! sandbox), which admits the hosts of the grant and refuses the rest. See docs/NETWORK.md.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The port of the egress proxy inside a granted run's own loopback.
pub const EGRESS_PROXY_PORT: u16 = 3128;

/// Most host patterns one run may list.
pub const MAX_HOST_PATTERNS: usize = 64;

/// The network of a run: what a call asks for and, once the gear has decided, what the run
/// gets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Network {
    /// No network: the run's own loopback only.
    #[default]
    Off,
    /// Any public host, any port (`network: true`).
    Any,
    /// Only hosts matching one of these patterns (`network: ["data.example.org", ...]`).
    Hosts(Vec<HostPattern>),
}

impl Network {
    /// Parse the list form; every pattern is checked, the error names the first bad one.
    pub fn hosts<S: AsRef<str>>(patterns: &[S]) -> Result<Network, String> {
        if patterns.is_empty() {
            return Err("network: an empty host list grants nothing; pass false".into());
        }
        if patterns.len() > MAX_HOST_PATTERNS {
            return Err(format!(
                "network: at most {MAX_HOST_PATTERNS} host patterns"
            ));
        }
        let mut out: Vec<HostPattern> = Vec::with_capacity(patterns.len());
        for (i, p) in patterns.iter().enumerate() {
            let p = HostPattern::parse(p.as_ref()).map_err(|e| format!("network[{i}]: {e}"))?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        out.sort();
        Ok(Network::Hosts(out))
    }

    pub fn is_on(&self) -> bool {
        !matches!(self, Network::Off)
    }

    /// Whether a connection to `host:port` is within this grant (the address checks come
    /// after, in the proxy).
    pub fn admits(&self, host: &str, port: u16) -> bool {
        match self {
            Network::Off => false,
            Network::Any => true,
            Network::Hosts(list) => list.iter().any(|p| p.matches(host, port)),
        }
    }

    /// The grant as a list of words: `[]` (off), `["*"]`-like for any, or the patterns.
    pub fn patterns(&self) -> Vec<String> {
        match self {
            Network::Off => Vec::new(),
            Network::Any => vec!["any public host".into()],
            Network::Hosts(list) => list.iter().map(ToString::to_string).collect(),
        }
    }

    /// For messages: `any public host` or `data.example.org, *.example.com:8443`.
    pub fn describe(&self) -> String {
        match self {
            Network::Off => "no network".into(),
            _ => self.patterns().join(", "),
        }
    }

    /// The part of this request that `cap` (the most a gear may grant) does not cover, as a
    /// refusal; `Ok` when all of it is covered.
    pub fn within(&self, cap: &Network) -> Result<(), String> {
        match (self, cap) {
            (Network::Off, _) | (_, Network::Any) => Ok(()),
            (_, Network::Off) => Err("no network may be granted".into()),
            (Network::Any, Network::Hosts(c)) => Err(format!(
                "`network: true` (any host) is more than the most this gear grants ({}); list \
                 the hosts the code needs",
                c.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            (Network::Hosts(asked), Network::Hosts(c)) => {
                let over: Vec<String> = asked
                    .iter()
                    .filter(|a| !c.iter().any(|p| p.covers(a)))
                    .map(ToString::to_string)
                    .collect();
                if over.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "{} {} not within what this gear may grant ({})",
                        over.join(", "),
                        if over.len() == 1 { "is" } else { "are" },
                        c.iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                }
            }
        }
    }
}

/// A host a run may reach: `example.com` (that host), `*.example.com` (any host below it,
/// not the apex), `*` (any host), each optionally with `:port`. Without a port, 80 and 443.
/// IP literals (`203.0.113.7`, `[2001:db8::1]`) are hosts too.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPattern {
    /// Lower-case host, without the `*.` (empty for `*`).
    host: String,
    /// `*.host` (or `*` when `host` is empty).
    wildcard: bool,
    port: Option<u16>,
}

impl HostPattern {
    pub fn parse(s: &str) -> Result<HostPattern, String> {
        let s = s.trim();
        if s.is_empty() || s.len() > 260 {
            return Err(format!("{s:?} is not a host pattern (empty or too long)"));
        }
        let (host, port) = split_port(s)?;
        let host = host.to_ascii_lowercase();
        if host == "*" {
            return Ok(HostPattern {
                host: String::new(),
                wildcard: true,
                port,
            });
        }
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, host.clone()),
        };
        if name.starts_with('[') {
            let inner = name.trim_start_matches('[').trim_end_matches(']');
            if wildcard || !name.ends_with(']') || inner.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(format!("{s:?}: not an IPv6 address in brackets"));
            }
            return Ok(HostPattern {
                host: inner.to_string(),
                wildcard: false,
                port,
            });
        }
        if !valid_hostname(&name) {
            return Err(format!(
                "{s:?} is not a host pattern: a host name (letters, digits, '-', '.'), \
                 optionally `*.` before it and `:port` after it"
            ));
        }
        Ok(HostPattern {
            host: name,
            wildcard,
            port,
        })
    }

    /// Whether `host:port` (a host name as the client asked for it) matches.
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => port == 80 || port == 443,
        };
        if !port_ok {
            return false;
        }
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if self.wildcard {
            self.host.is_empty()
                || host
                    .strip_suffix(self.host.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
        } else {
            host == self.host
        }
    }

    /// Whether every connection `other` admits, this admits too.
    pub fn covers(&self, other: &HostPattern) -> bool {
        let ports_ok = match (self.port, other.port) {
            (None, None) => true,
            (Some(a), Some(b)) => a == b,
            (None, Some(b)) => b == 80 || b == 443,
            (Some(_), None) => false,
        };
        if !ports_ok {
            return false;
        }
        match (self.wildcard, other.wildcard) {
            (true, _) if self.host.is_empty() => true,
            (false, false) => self.host == other.host,
            (false, true) => false,
            (true, w) => {
                let below = other
                    .host
                    .strip_suffix(self.host.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.'));
                below || (w && other.host == self.host)
            }
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.wildcard, self.host.is_empty()) {
            (true, true) => write!(f, "*")?,
            (true, false) => write!(f, "*.{}", self.host)?,
            (false, _) if self.host.contains(':') => write!(f, "[{}]", self.host)?,
            (false, _) => write!(f, "{}", self.host)?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

fn split_port(s: &str) -> Result<(&str, Option<u16>), String> {
    let bad_port = || format!("{s:?}: the port must be a number from 1 to 65535");
    if s.starts_with('[') {
        return match s.rsplit_once("]:") {
            Some((h, p)) => {
                let p: u16 = p.parse().map_err(|_| bad_port())?;
                if p == 0 {
                    return Err(bad_port());
                }
                Ok((&s[..h.len() + 1], Some(p)))
            }
            None => Ok((s, None)),
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => {
            let p: u16 = p.parse().map_err(|_| bad_port())?;
            if p == 0 {
                return Err(bad_port());
            }
            Ok((h, Some(p)))
        }
        None => Ok((s, None)),
    }
}

fn valid_hostname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// What a granted run did with the network, as the egress proxy saw it (never the
/// program's own account).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EgressLedger {
    /// What the run was granted: `any public host`, or the host patterns.
    pub granted: Vec<String>,
    /// Hosts reached, each `host:port`, with requests (HTTP requests and tunnels), bytes the
    /// program sent and bytes it received. At most 64 entries; further hosts are summed
    /// under `(other hosts)`.
    pub hosts: Vec<EgressHost>,
    /// Connections refused, with the reason (the rule, or the address range). At most 64
    /// listed; `refused_total` counts them all.
    pub refused: Vec<EgressRefusal>,
    pub refused_total: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EgressHost {
    /// `host:port` as the program asked for it.
    pub host: String,
    pub requests: u64,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EgressRefusal {
    /// `host:port` as the program asked for it.
    pub host: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> HostPattern {
        HostPattern::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn patterns_parse_and_print_back() {
        for s in [
            "data.example.org",
            "*.githubusercontent.com",
            "api.example.com:8443",
            "*",
            "*:22",
            "203.0.113.7",
            "[2001:db8::1]:443",
        ] {
            assert_eq!(p(s).to_string(), s);
        }
        assert_eq!(p("Data.Example.org").to_string(), "data.example.org");
        for bad in [
            "",
            "a b",
            "http://x.com",
            "x.com:0",
            "x.com:99999",
            "*.",
            "-x.com",
            "x..com",
            "[::1",
            "*.[::1]",
            "x.com/path",
            "a*.com",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn matching_follows_host_wildcard_and_port() {
        assert!(p("data.example.org").matches("data.example.org", 443));
        assert!(p("data.example.org").matches("DATA.EXAMPLE.ORG.", 80));
        assert!(!p("data.example.org").matches("data.example.org", 8080));
        assert!(!p("data.example.org").matches("evil-data.example.org", 443));
        assert!(!p("data.example.org").matches("data.example.org.evil.com", 443));
        assert!(p("*.example.com").matches("a.b.example.com", 443));
        assert!(!p("*.example.com").matches("example.com", 443));
        assert!(!p("*.example.com").matches("badexample.com", 443));
        assert!(p("api.example.com:8443").matches("api.example.com", 8443));
        assert!(!p("api.example.com:8443").matches("api.example.com", 443));
        assert!(p("*").matches("anything.at.all", 80));
        assert!(!p("*").matches("anything.at.all", 22));
        assert!(p("[2001:db8::1]").matches("[2001:db8::1]", 443));
    }

    #[test]
    fn caps_cover_what_they_should() {
        let cap = Network::hosts(&["*.example.com", "data.example.org"]).expect("patterns");
        assert!(
            Network::hosts(&["a.example.com", "data.example.org"])
                .expect("patterns")
                .within(&cap)
                .is_ok()
        );
        assert!(
            Network::hosts(&["*.a.example.com"])
                .expect("patterns")
                .within(&cap)
                .is_ok()
        );
        let e = Network::hosts(&["example.com", "x.org"])
            .expect("patterns")
            .within(&cap);
        assert!(
            e.as_ref()
                .is_err_and(|e| e.contains("example.com, x.org are not")),
            "{e:?}"
        );
        assert!(Network::Any.within(&cap).is_err());
        assert!(Network::Any.within(&Network::Any).is_ok());
        assert!(
            Network::hosts(&["data.example.org:22"])
                .expect("patterns")
                .within(&cap)
                .is_err()
        );
        assert!(Network::Off.within(&Network::Off).is_ok());
        assert!(
            Network::hosts(&["x.org"])
                .expect("patterns")
                .within(&Network::Off)
                .is_err()
        );
    }

    #[test]
    fn lists_are_bounded_and_deduplicated() {
        assert!(Network::hosts::<&str>(&[]).is_err());
        let many: Vec<String> = (0..=MAX_HOST_PATTERNS)
            .map(|i| format!("h{i}.org"))
            .collect();
        assert!(Network::hosts(&many).is_err());
        let n = Network::hosts(&["b.org", "a.org", "b.org"]).expect("patterns");
        assert_eq!(n.patterns(), vec!["a.org", "b.org"]);
    }
}
