//! gearbox-core: the vocabulary every other gearbox crate speaks.
//!
//! It owns the request a caller makes ([`ExecRequest`]), the limits that bound a run
//! ([`Limits`]), the language table ([`LanguageSpec`]), the outcome of a run ([`Outcome`]),
//! output capture, name validation, and the [`Sandbox`] trait that every backend implements.
//! It must not know how any backend isolates code, nor speak MCP.

pub mod capture;
pub mod display;
pub mod gear;
pub mod language;
pub mod limits;
pub mod names;
pub mod network;
pub mod outcome;
pub mod request;
pub mod rundir;
pub mod sandbox;
pub mod tree;

pub use capture::{CappedOutput, read_capped, read_capped_until};
pub use gear::{Capability, Gear};
pub use language::{LanguageSpec, LanguageTable, ResolvedLanguage};
pub use limits::{LimitOverrides, Limits};
pub use names::{NameError, validate_relative_path};
pub use network::{
    EGRESS_PROXY_PORT, EgressHost, EgressLedger, EgressRefusal, HostPattern, Network,
};
pub use outcome::{Outcome, OutputFile, ResourceUsage, Status, mime_for};
pub use request::{Encoding, ExecRequest, FileInput, Job, JobFile, LAUNCHER_PATH, SANDBOX_HOST_ID};
pub use sandbox::{BackendKind, BackendReport, CollectFuture, RunFuture, Sandbox, SandboxError};
pub use tree::{CollectLimits, Collected, OUTPUT_LIMITS, WalkSummary};

/// Cases for a property test: `default`, or `PROPTEST_CASES` when it is set (the longer run of
/// `scripts/fuzz.sh`). proptest's own `with_cases` ignores that variable.
#[doc(hidden)]
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
