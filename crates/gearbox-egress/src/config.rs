//! `[network]`: the egress proxy's settings and the most each gear may grant.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use gearbox_core::{Gear, Network};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[network]`: how granted runs reach out. Every run has a network namespace of its own;
/// a granted one reaches the hosts of its grant through gearbox's egress proxy, never the
/// host's loopback, link-local or (unless listed here) private addresses. See
/// docs/NETWORK.md.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Directory of the per-run proxy sockets. Default `$RUNTIME_DIRECTORY/egress`, else
    /// `/run/gearbox/egress` as root, else `$XDG_RUNTIME_DIR/gearbox/egress`, else
    /// `/tmp/gearbox-UID/egress`.
    pub runtime_dir: Option<PathBuf>,
    /// Private ranges (CIDR, e.g. `10.20.0.0/16`, `fd00::/64`) that granted runs may reach:
    /// 10/8, 172.16/12, 192.168/16, 100.64/10 and fc00::/7 are refused otherwise. Loopback
    /// and link-local can never be listed. Default none.
    pub allow_private: Vec<String>,
    /// Names the proxy resolves from this table before DNS (`{ "db.internal" =
    /// "10.20.0.5" }`); the address is still checked against the ranges above.
    pub hosts: BTreeMap<String, IpAddr>,
    /// The most a run may be granted under `user_confirmed`: a list of host patterns
    /// (`["data.example.org", "*.cdn.example.org"]`) a call's list must stay within, or absent:
    /// any host (`network: true`). `restricted` never grants network.
    pub user_confirmed: Option<Vec<String>>,
    /// The most a run may be granted under `full_trust` (as `user_confirmed`).
    pub full_trust: Option<Vec<String>>,
    /// Milliseconds to resolve and connect to an upstream host. Default 10000.
    pub connect_timeout_ms: u64,
    /// Connections one run may hold open through the proxy at once. Default 64.
    pub max_connections: usize,
    /// PEM files of certificate authorities trusted besides the system's when the proxy
    /// re-encrypts a connection that carries a secret (`[[secrets]]`): a private API's CA.
    pub extra_roots: Vec<PathBuf>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            runtime_dir: None,
            allow_private: Vec::new(),
            hosts: BTreeMap::new(),
            user_confirmed: None,
            full_trust: None,
            connect_timeout_ms: 10_000,
            max_connections: 64,
            extra_roots: Vec::new(),
        }
    }
}

impl NetworkConfig {
    /// Every field checked: the ranges, the gear caps' patterns.
    pub fn validate(&self) -> Result<(), String> {
        crate::addr::parse_allow_private(&self.allow_private)?;
        for gear in [Gear::UserConfirmed, Gear::FullTrust] {
            self.cap(gear)
                .map_err(|e| format!("[network] {gear}: {e}"))?;
        }
        if self.max_connections == 0 {
            return Err("[network] max_connections must be at least 1".into());
        }
        Ok(())
    }

    /// The most `gear` may grant.
    pub fn cap(&self, gear: Gear) -> Result<Network, String> {
        let list = match gear {
            Gear::ReadOnly | Gear::Restricted => return Ok(Network::Off),
            Gear::UserConfirmed => &self.user_confirmed,
            Gear::FullTrust => &self.full_trust,
        };
        match list {
            None => Ok(Network::Any),
            Some(l) if l.is_empty() => Ok(Network::Off),
            Some(l) => Network::hosts(l),
        }
    }

    /// The runtime directory this configuration names.
    pub fn runtime_dir(&self) -> PathBuf {
        if let Some(d) = &self.runtime_dir {
            return d.clone();
        }
        gearbox_core::rundir::runtime_dir("egress")
    }
}
