//! gearbox-egress: how a granted run reaches the outside, and nothing else.
//!
//! Every run has a network namespace of its own with only loopback. A run granted network
//! (`network: true` or a list of host patterns) also gets a relay on `127.0.0.1:3128` (in
//! the sandbox, `gearbox-sandbox`'s `jail/relay.rs`) to this crate's proxy, one listener
//! per run on a socket the sandbox sees through a bind mount. The proxy decides every
//! connection on the host side: the host must be in the grant, every address it resolves to
//! must be public (or listed in `[network] allow_private`), a TLS tunnel's server name must
//! be in the grant too. It keeps a ledger of what passed and what was refused, which becomes
//! the outcome's `egress`. See docs/NETWORK.md.

pub mod addr;
mod ca;
mod config;
mod intercept;
mod proxy;
mod secrets;
mod state;

pub use config::NetworkConfig;
pub use proxy::{Egress, RunEgress};
pub use secrets::{SecretConfig, check as check_secrets};

/// A TLS client configuration that trusts the system's roots (`SSL_CERT_FILE`, else the
/// usual bundles), on the same ring provider as the proxy; ALPN `http/1.1`.
pub fn tls_client_config() -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    ca::upstream_config(&[])
}
