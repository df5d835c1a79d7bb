//! Labels on every container of the backend, and the start-up reaper that removes the
//! containers of gearbox processes that died without cleaning up (a crash, SIGKILL, a host
//! reboot with a remote engine still running).
//!
//! A container's owner is `HOSTNAME:PID:STARTTIME` (start time in clock ticks since boot, from
//! `/proc/PID/stat`), so a recycled pid is not mistaken for the owner. Only containers owned
//! by this host's dead processes are removed: a live `gearbox serve` next to a one-shot
//! `gearbox run` keeps its containers.

use std::collections::HashMap;

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptions, RemoveContainerOptions};

/// Every container the backend creates carries this label with the value `docker`.
pub const LABEL_BACKEND: &str = "dev.gearbox.backend";
/// `HOSTNAME:PID:STARTTIME` of the gearbox process that created the container.
pub const LABEL_OWNER: &str = "dev.gearbox.owner";
/// A fresh id per run.
pub const LABEL_RUN: &str = "dev.gearbox.run";

/// Who owns a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub pid: u32,
    pub start_time: u64,
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            host: hostname(),
            pid,
            start_time: process_start_time(pid).unwrap_or(0),
        }
    }

    pub fn label(&self) -> String {
        format!("{}:{}:{}", self.host, self.pid, self.start_time)
    }

    pub fn parse(label: &str) -> Option<Owner> {
        let mut parts = label.rsplitn(3, ':');
        let start_time = parts.next()?.parse().ok()?;
        let pid = parts.next()?.parse().ok()?;
        let host = parts.next()?.to_string();
        Some(Owner {
            host,
            pid,
            start_time,
        })
    }

    /// Whether the owner still runs (always true for another host's process: not ours to
    /// judge).
    pub fn alive(&self) -> bool {
        if self.host != hostname() {
            return true;
        }
        process_start_time(self.pid) == Some(self.start_time)
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Field 22 of `/proc/PID/stat`: the start time in clock ticks since boot.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The labels of a new container.
pub fn labels(owner: &Owner, run: &str) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_BACKEND.to_string(), "docker".to_string()),
        (LABEL_OWNER.to_string(), owner.label()),
        (LABEL_RUN.to_string(), run.to_string()),
    ])
}

/// Remove every backend container whose owner is dead. Returns the ids removed.
pub async fn reap_orphans(docker: &Docker) -> Result<Vec<String>, bollard::errors::Error> {
    let list = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("{LABEL_BACKEND}=docker")],
            )])),
            ..Default::default()
        }))
        .await?;
    let mut removed = Vec::new();
    for c in list {
        let Some(id) = c.id else { continue };
        let owner = c
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_OWNER))
            .and_then(|o| Owner::parse(o));
        // A labelled container without a readable owner is ours and broken: remove it too.
        if owner.as_ref().is_some_and(Owner::alive) {
            continue;
        }
        match docker
            .remove_container(
                &id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => {
                tracing::info!(container = %id, owner = ?owner, "removed an orphaned container");
                removed.push(id);
            }
            Err(e) => tracing::warn!(container = %id, error = %e, "removing an orphan failed"),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_round_trips_and_this_process_is_alive() {
        let me = Owner::current();
        assert!(me.start_time > 0);
        assert_eq!(Owner::parse(&me.label()), Some(me.clone()));
        assert!(me.alive());
        let recycled = Owner {
            start_time: me.start_time + 1,
            ..me.clone()
        };
        assert!(!recycled.alive());
        assert!(
            Owner {
                host: "elsewhere".into(),
                ..recycled
            }
            .alive()
        );
        assert_eq!(Owner::parse("no-colons"), None);
        let odd = Owner::parse("a:b:12:34").expect("host with a colon");
        assert_eq!(
            (odd.host.as_str(), odd.pid, odd.start_time),
            ("a:b", 12, 34)
        );
    }
}
