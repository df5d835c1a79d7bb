//! Limits that bound one run. Every field has a unit in its name and a default chosen for an
//! agent's typical snippet; the configured values are maxima a call may only lower.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Wall-clock limit: long enough for `go run` to compile, short enough that a stuck program
/// does not hold a slot for long.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Memory (cgroup) limit: Node.js and the Go toolchain need a few hundred MiB.
pub const DEFAULT_MEMORY_MB: u64 = 512;
/// Processes and threads: Node starts ~11 threads, `go run` a few processes with many threads.
pub const DEFAULT_PIDS: u64 = 128;
/// Largest file the program may write (RLIMIT_FSIZE).
pub const DEFAULT_FILE_SIZE_MB: u64 = 64;
/// Open file descriptors (RLIMIT_NOFILE).
pub const DEFAULT_OPEN_FILES: u64 = 256;
/// Size of the private workspace and /tmp (tmpfs), together.
pub const DEFAULT_DISK_MB: u64 = 128;
/// Bytes kept of each of stdout and stderr; the rest is counted and dropped.
pub const DEFAULT_OUTPUT_BYTES: u64 = 1024 * 1024;

/// Resolved limits of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock time in milliseconds, counted from the moment the program is handed over.
    pub timeout_ms: u64,
    /// CPU time in milliseconds (user + system, whole tree); 0 means "same as timeout_ms".
    pub cpu_ms: u64,
    /// Memory in MiB, enforced by a cgroup where cgroups are writable.
    pub memory_mb: u64,
    /// Processes plus threads.
    pub pids: u64,
    /// Largest file the program may write, in MiB.
    pub file_size_mb: u64,
    /// Open file descriptors.
    pub open_files: u64,
    /// Workspace plus /tmp size, in MiB.
    pub disk_mb: u64,
    /// Bytes kept per output stream.
    pub output_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: DEFAULT_TIMEOUT_MS,
            cpu_ms: 0,
            memory_mb: DEFAULT_MEMORY_MB,
            pids: DEFAULT_PIDS,
            file_size_mb: DEFAULT_FILE_SIZE_MB,
            open_files: DEFAULT_OPEN_FILES,
            disk_mb: DEFAULT_DISK_MB,
            output_bytes: DEFAULT_OUTPUT_BYTES,
        }
    }
}

impl Limits {
    /// CPU limit in milliseconds with the "0 = timeout" rule applied.
    pub fn effective_cpu_ms(&self) -> u64 {
        if self.cpu_ms == 0 {
            self.timeout_ms
        } else {
            self.cpu_ms
        }
    }

    /// The program's CPU-time rlimit in whole seconds. An explicit `cpu_ms` is what was asked
    /// (rounded up); without one, the wall clock is the limit and the rlimit only a backstop a
    /// second beyond it, so that a run that runs out of time is always reported as a timeout.
    pub fn cpu_rlimit_secs(&self) -> u64 {
        if self.cpu_ms == 0 {
            self.timeout_ms.div_ceil(1000) + 1
        } else {
            self.cpu_ms.div_ceil(1000).max(1)
        }
    }

    /// Apply a call's overrides. An override may only lower a limit; a higher value is an
    /// error naming the field, never silently clamped.
    pub fn lowered_by(&self, o: &LimitOverrides) -> Result<Limits, String> {
        fn pick(field: &str, max: u64, asked: Option<u64>) -> Result<u64, String> {
            match asked {
                None => Ok(max),
                Some(0) => Err(format!("{field} must be greater than 0")),
                Some(v) if v > max => Err(format!(
                    "{field} = {v} exceeds the configured maximum of {max}"
                )),
                Some(v) => Ok(v),
            }
        }
        Ok(Limits {
            timeout_ms: pick("timeout_ms", self.timeout_ms, o.timeout_ms)?,
            cpu_ms: match o.cpu_ms {
                None => self.cpu_ms,
                Some(v) => pick("cpu_ms", self.effective_cpu_ms(), Some(v))?,
            },
            memory_mb: pick("memory_mb", self.memory_mb, o.memory_mb)?,
            pids: pick("pids", self.pids, o.pids)?,
            file_size_mb: pick("file_size_mb", self.file_size_mb, o.file_size_mb)?,
            open_files: self.open_files,
            disk_mb: pick("disk_mb", self.disk_mb, o.disk_mb)?,
            output_bytes: pick("output_bytes", self.output_bytes, o.output_bytes)?,
        })
    }
}

/// Per-call limit requests; each may only lower the configured value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    pub timeout_ms: Option<u64>,
    pub cpu_ms: Option<u64>,
    pub memory_mb: Option<u64>,
    pub pids: Option<u64>,
    pub file_size_mb: Option<u64>,
    pub disk_mb: Option<u64>,
    pub output_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_lower_but_never_raise() {
        let max = Limits::default();
        let lowered = max
            .lowered_by(&LimitOverrides {
                timeout_ms: Some(100),
                ..Default::default()
            })
            .expect("lower is fine");
        assert_eq!(lowered.timeout_ms, 100);
        assert_eq!(lowered.memory_mb, max.memory_mb);
        let err = max
            .lowered_by(&LimitOverrides {
                memory_mb: Some(max.memory_mb + 1),
                ..Default::default()
            })
            .expect_err("raising is refused");
        assert!(err.contains("memory_mb"), "{err}");
        assert!(
            max.lowered_by(&LimitOverrides {
                pids: Some(0),
                ..Default::default()
            })
            .is_err()
        );
    }
}
