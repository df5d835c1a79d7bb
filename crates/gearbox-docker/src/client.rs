//! The Docker Engine client: connected and version-negotiated, shared by the backend and the
//! probe.

use std::time::Duration;

use bollard::Docker;

/// Request timeout of the engine client: the longest run plus its set-up.
const CLIENT_TIMEOUT_SECS: u64 = 3600;
/// How long `probe` waits for the engine.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connect to `host` and negotiate the API version down to what the engine speaks (bollard's
/// default is newer than Debian's engine, API 1.41, and every call would fail without this).
pub async fn connect(host: &str) -> Result<Docker, String> {
    let docker = if let Some(path) = host.strip_prefix("unix://") {
        Docker::connect_with_unix(path, CLIENT_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
    } else {
        Docker::connect_with_http(host, CLIENT_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
    }
    .map_err(|e| format!("no Docker engine at {host}: {e}"))?;
    tokio::time::timeout(PROBE_TIMEOUT, docker.negotiate_version())
        .await
        .map_err(|_| format!("the Docker engine at {host} did not answer within 5 s"))?
        .map_err(|e| format!("the Docker engine at {host} does not answer: {e}"))
}
