//! gearbox-docker: the `docker` backend. Each run gets a fresh container from a per-language
//! image (configured under `[docker.images]`), created through the Docker Engine API with
//! memory, CPU, pids and file limits, a read-only root, a tmpfs workspace, no network (a
//! run granted network is refused: only the linux backend confines one to the egress
//! proxy), no capabilities, `no-new-privileges`, a seccomp profile and a non-root
//! user. Files go in as a tar stream (no bind mounts); the container is removed before the
//! run's answer, and containers of dead gearbox processes are reaped on start-up.
//!
//! It must not read configuration files (the engine passes [`DockerConfig`]), nor pull images.

mod client;
pub mod config;
mod probe;
pub mod reap;
mod sandbox;

pub use client::connect;
pub use config::{DockerConfig, DockerImage};
pub use probe::probe;
pub use sandbox::{DockerSandbox, SECCOMP_PROFILE, program_command, workspace_tar};
