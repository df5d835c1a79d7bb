//! Safety gears and capabilities: the policy vocabulary.
//!
//! A gear says how much a run may do without a human. A capability is something a run may
//! need beyond the default sandbox (which has no network, no package installs and no host
//! mounts). The gear decides, per capability, whether it is denied, asked for, or granted.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How much trust a server (or one call) runs with. Ordered: a call may pass a lower gear
/// than the server's, never a higher one.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Gear {
    /// Nothing executes; discovery and resources work.
    ReadOnly,
    /// Runs in the strongest backend; every capability is denied, and code whose analysis
    /// shows it needs one is refused up front with the findings.
    Restricted,
    /// Like restricted, but a human decides when a run needs a capability or looks risky.
    #[default]
    UserConfirmed,
    /// Capabilities are granted without asking; still sandboxed.
    FullTrust,
}

impl Gear {
    pub const ALL: [Gear; 4] = [
        Gear::ReadOnly,
        Gear::Restricted,
        Gear::UserConfirmed,
        Gear::FullTrust,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Gear::ReadOnly => "read_only",
            Gear::Restricted => "restricted",
            Gear::UserConfirmed => "user_confirmed",
            Gear::FullTrust => "full_trust",
        }
    }
}

impl std::fmt::Display for Gear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Gear {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Gear::ALL
            .into_iter()
            .find(|g| g.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown gear {s:?} (expected read_only, restricted, user_confirmed or \
                     full_trust)"
                )
            })
    }
}

/// Something a run may need beyond the default sandbox.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// A working network for the run.
    Network,
    /// Packages installed (by gearbox, outside the sandbox) before the run.
    Packages,
    /// Host directories mounted into the sandbox.
    HostMounts,
    /// Tools of other MCP servers, called through the broker.
    Tools,
}

impl Capability {
    pub const ALL: [Capability; 4] = [
        Capability::Network,
        Capability::Packages,
        Capability::HostMounts,
        Capability::Tools,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Network => "network",
            Capability::Packages => "packages",
            Capability::HostMounts => "host_mounts",
            Capability::Tools => "tools",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gears_are_ordered_by_trust() {
        assert!(Gear::ReadOnly < Gear::Restricted);
        assert!(Gear::Restricted < Gear::UserConfirmed);
        assert!(Gear::UserConfirmed < Gear::FullTrust);
    }

    #[test]
    fn names_round_trip() {
        for g in Gear::ALL {
            assert_eq!(g.as_str().parse::<Gear>().expect("parses"), g);
            assert_eq!(serde_json::to_value(g).expect("serializes"), g.as_str());
        }
        assert!(
            "turbo"
                .parse::<Gear>()
                .expect_err("unknown")
                .contains("turbo")
        );
    }
}
