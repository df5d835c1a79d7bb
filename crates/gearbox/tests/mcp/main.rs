//! The MCP integration suite, one test binary: `gearbox serve` driven by real clients over
//! real stdio and HTTP, with real sandboxes and real downstream MCP servers.
//!
//! - `stdio`: the protocol, every language, inputs, failures, profiles, progress and
//!   cancellation, hostile bytes, schemas;
//! - `gears`: safety gears, human approval (out of band, elicitation, stateless), the CLI's gear;
//! - `http`: the daemon (Streamable HTTP, SSE, keys, origins, limits, audit, shutdown);
//! - `sessions`: workspaces that persist across runs;
//! - `broker`: code mode against the npm reference servers (`tests/npm`, installed by
//!   `scripts/setup.sh`).
//!
//! Run one module with `cargo test --workspace --test mcp -- broker::`.

#[path = "../common/cgroups.rs"]
mod cgroups;
mod support;

mod broker;
mod gears;
mod http;
mod live;
mod pictures;
mod sessions;
mod stdio;
