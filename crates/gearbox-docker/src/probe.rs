//! What `gearbox doctor` learns about the docker backend: whether an engine answers, its
//! version and API, and which configured images exist.

use std::time::Duration;

use gearbox_core::{BackendKind, BackendReport};

use crate::client::connect;
use crate::config::DockerConfig;

/// Probe the engine. Runs on a thread of its own with its own runtime, so it works from
/// synchronous code and from inside a tokio runtime alike.
pub fn probe(config: &DockerConfig) -> BackendReport {
    let config = config.clone();
    let joined = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start a runtime for the probe: {e}"))?;
        rt.block_on(probe_async(&config))
    })
    .join();
    let (available, details) = match joined {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => (false, vec![e]),
        Err(_) => (false, vec!["the docker probe panicked".to_string()]),
    };
    BackendReport {
        backend: BackendKind::Docker,
        available,
        details,
    }
}

async fn probe_async(config: &DockerConfig) -> Result<(bool, Vec<String>), String> {
    config.validate()?;
    let docker = match connect(&config.host).await {
        Ok(d) => d,
        Err(e) => {
            return Ok((
                false,
                vec![
                    format!("engine: {e}"),
                    "start one with scripts/setup-docker.sh (installs docker.io, starts dockerd, \
                     builds gearbox/python:bookworm and gearbox/runtimes:bookworm)"
                        .to_string(),
                ],
            ));
        }
    };
    let mut details = Vec::new();
    match tokio::time::timeout(Duration::from_secs(5), docker.version()).await {
        Ok(Ok(v)) => details.push(format!(
            "engine: {} answers, Docker {} (API {}, negotiated {})",
            config.host,
            v.version.as_deref().unwrap_or("?"),
            v.api_version.as_deref().unwrap_or("?"),
            docker.client_version()
        )),
        Ok(Err(e)) => return Ok((false, vec![format!("engine: version query failed: {e}")])),
        Err(_) => return Ok((false, vec!["engine: version query timed out".to_string()])),
    }
    let mut any_image = false;
    for (lang, img) in &config.images {
        match docker.inspect_image(&img.image).await {
            Ok(i) => {
                any_image = true;
                details.push(format!(
                    "image {lang}: {} present ({} MB)",
                    img.image,
                    i.size.unwrap_or(0) / 1_000_000
                ));
            }
            Err(e) => details.push(format!(
                "image {lang}: {} MISSING ({e}); gearbox does not pull: `docker pull {}` or \
                 scripts/setup-docker.sh for the default image",
                img.image, img.image
            )),
        }
    }
    details.push(
        "per run: fresh container, memory = memory+swap limit, CPU quota, pids limit, \
         read-only root, tmpfs workspace and /tmp, network none (a granted run is refused), all \
         capabilities dropped, no-new-privileges, seccomp deny list, non-root user, removed \
         after the run; orphans of dead gearbox processes reaped at start-up"
            .to_string(),
    );
    Ok((any_image, details))
}
