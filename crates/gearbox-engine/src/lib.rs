//! gearbox-engine: the path from a request to an outcome.
//!
//! It owns configuration ([`Config`]), resolves languages once per process, validates a request
//! into a [`gearbox_core::Job`], picks the backend and runs it, and holds the safety gear's
//! policy ([`policy`]: what a call needs, what the gear does, the approval hash), so both
//! transports (MCP, CLI) apply the same one. They call [`Engine::execute`] and nothing below
//! it. It must not speak MCP nor know how a backend
//! isolates.

pub mod config;
mod engine;
mod lazy;
mod packages;
pub mod policy;

pub use config::{Config, ConfigError, PoolConfig, PoolSize, SandboxConfig};
pub use engine::{Engine, LanguageInfo};
pub use gearbox_egress;
pub use gearbox_packages;
pub use gearbox_sandbox::PoolStats;
pub use gearbox_sandbox::live;
pub use packages::Packages;
