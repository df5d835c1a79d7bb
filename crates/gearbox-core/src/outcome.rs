//! The outcome of one run: what every backend returns, what `gearbox run --json` prints and
//! what the MCP server sends as `structuredContent`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The program ran and exited with status 0.
    Ok,
    /// The program ran and failed: non-zero exit, a signal, or the sandbox could not start it.
    Error,
    /// The wall-clock limit expired; the whole process tree was killed.
    Timeout,
    /// A resource limit (memory, CPU time, file size) killed the program.
    Killed,
    /// Policy refused the run before anything executed.
    Denied,
    /// The run waits for a human's approval.
    PendingApproval,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Killed => "killed",
            Status::Denied => "denied",
            Status::PendingApproval => "pending_approval",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Resources the run consumed, where the backend could measure them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ResourceUsage {
    /// User plus system CPU time of the program and the descendants it waited for, in ms.
    pub cpu_time_ms: Option<u64>,
    /// Peak memory in KiB of the whole run: the cgroup's high-water mark, or, where
    /// `memory_limit` is `sampled`, the highest of the samples.
    pub peak_memory_kb: Option<u64>,
    /// How `memory_mb` was held: `cgroup` (the kernel bounds the whole run), `sampled` (no
    /// cgroup on this host: the run's memory is measured every 10 ms and the run killed past
    /// the limit, see docs/SECURITY.md), `per_process` (rlimits on each process only),
    /// `wasm` (the WebAssembly instance's memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<String>,
    /// Time spent building the sandbox before the program started, in microseconds.
    pub setup_us: Option<u64>,
}

/// Everything a caller learns about one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Outcome {
    pub status: Status,
    /// Exit status of the program when it exited normally.
    pub exit_code: Option<i32>,
    /// Number of the signal that ended the program, if one did.
    pub signal: Option<i32>,
    /// Captured standard output (invalid UTF-8 replaced), at most the configured cap.
    pub stdout: String,
    /// Captured standard error (invalid UTF-8 replaced), at most the configured cap.
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Wall-clock time of the program, from hand-over to exit, in ms.
    pub duration_ms: u64,
    #[serde(flatten)]
    pub usage: ResourceUsage,
    /// Why the run was killed, denied or failed before it started; absent for a plain exit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Language the run used.
    pub language: String,
    /// Backend that ran it (`linux`, `process`, `wasm`, ...).
    pub backend: String,
    /// A granted run's traffic as the egress proxy saw it: hosts reached, bytes, refusals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::EgressLedger>,
    /// A live session's cell: `repr` of the value of its last bare expression (as a notebook
    /// shows a cell's result), when there is one and it is not None.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Pictures the program showed (`display()`, matplotlib figures), taken out of `stdout`;
    /// each is also an MCP `image` content.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pictures: Vec<crate::display::Picture>,
    /// Files the run left under `/work/outputs/` (a run without a session): each is kept by
    /// the server for a while and offered as a `resource_link` (`uri`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<OutputFile>,
    /// Entries of `/work/outputs/` not brought back, with why (a symlink, a fifo, over the
    /// bounds of a run's outputs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs_skipped: Vec<String>,
}

/// A file a run left under `/work/outputs/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputFile {
    /// Its path relative to `/work` (`outputs/…`).
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// The MIME type guessed from its extension.
    pub mime_type: String,
    /// Where `resources/read` serves it (`gearbox://runs/{id}/outputs/…`), once the server
    /// keeps it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// The bytes (never serialized: they travel as the resource).
    #[serde(skip)]
    pub content: Vec<u8>,
}

impl OutputFile {
    /// `content` found at `path` (relative to `/work`).
    pub fn new(path: String, content: Vec<u8>) -> Self {
        OutputFile {
            mime_type: mime_for(&path).to_string(),
            size: content.len() as u64,
            path,
            uri: None,
            content,
        }
    }
}

/// The MIME type of a file, guessed from its extension (`application/octet-stream` when
/// unknown).
pub fn mime_for(path: &str) -> &'static str {
    let ext = path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "webp" => "image/webp",
        "bmp" => "image/bmp",
        "pdf" => "application/pdf",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "py" => "text/x-python",
        "js" | "mjs" => "text/javascript",
        "parquet" => "application/vnd.apache.parquet",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "wav" => "audio/wav",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        _ => "application/octet-stream",
    }
}

impl Outcome {
    /// An outcome for a run refused before anything executed.
    pub fn denied(language: &str, backend: &str, reason: impl Into<String>) -> Self {
        Self::not_run(Status::Denied, language, backend, reason)
    }

    /// An outcome for a run that could not start (no interpreter, sandbox failure, ...).
    pub fn failed_to_start(language: &str, backend: &str, reason: impl Into<String>) -> Self {
        Self::not_run(Status::Error, language, backend, reason)
    }

    fn not_run(status: Status, language: &str, backend: &str, reason: impl Into<String>) -> Self {
        Outcome {
            status,
            exit_code: None,
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 0,
            usage: ResourceUsage::default(),
            reason: Some(reason.into()),
            language: language.to_string(),
            backend: backend.to_string(),
            egress: None,
            result: None,
            pictures: Vec::new(),
            outputs: Vec::new(),
            outputs_skipped: Vec::new(),
        }
    }

    /// Take the pictures the program showed out of its stdout (`display.rs`).
    pub fn take_pictures(&mut self) {
        self.pictures = crate::display::extract(&mut self.stdout);
    }

    pub fn is_ok(&self) -> bool {
        self.status == Status::Ok
    }

    /// The human-readable layout clients of the Docker-per-run design know:
    /// an `Execution Failed (status): …` line when the run was not ok, then
    /// `--- stdout ---` and `--- stderr ---` sections.
    pub fn render_text(&self) -> String {
        let mut text = String::new();
        if !self.is_ok() {
            text.push_str(&format!(
                "Execution Failed ({}): {}\n",
                self.status,
                self.summary()
            ));
        }
        text.push_str("--- stdout ---\n");
        text.push_str(&self.stdout);
        if !self.stdout.is_empty() && !self.stdout.ends_with('\n') {
            text.push('\n');
        }
        text.push_str("--- stderr ---\n");
        text.push_str(&self.stderr);
        if !self.stderr.is_empty() && !self.stderr.ends_with('\n') {
            text.push('\n');
        }
        if let Some(result) = &self.result {
            text.push_str("--- result ---\n");
            text.push_str(result);
            text.push('\n');
        }
        if !self.pictures.is_empty() {
            text.push_str("--- pictures ---\n");
            for (i, p) in self.pictures.iter().enumerate() {
                text.push_str(&format!("{}: {}", i + 1, p.mime));
                if p.width > 0 {
                    text.push_str(&format!(", {}x{}", p.width, p.height));
                }
                if let Some([w, h]) = p.original {
                    text.push_str(&format!(", downscaled from {w}x{h}"));
                }
                if let Some(full) = &p.full {
                    text.push_str(&format!(", full size written to /work/{full}"));
                }
                text.push('\n');
            }
        }
        if !self.outputs.is_empty() || !self.outputs_skipped.is_empty() {
            text.push_str("--- outputs ---\n");
            for f in &self.outputs {
                text.push_str(&format!(
                    "/work/{} ({} bytes, {})",
                    f.path, f.size, f.mime_type
                ));
                if let Some(uri) = &f.uri {
                    text.push_str(&format!(": {uri}"));
                }
                text.push('\n');
            }
            if !self.outputs_skipped.is_empty() {
                text.push_str(&format!("not kept: {}\n", self.outputs_skipped.join(", ")));
            }
        }
        text
    }

    /// One line saying how the run ended.
    pub fn summary(&self) -> String {
        if let Some(reason) = &self.reason {
            return reason.clone();
        }
        match (self.exit_code, self.signal) {
            (_, Some(sig)) => format!("terminated by signal {sig}"),
            (Some(code), None) => format!("exit code {code}"),
            (None, None) => self.status.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(status: Status) -> Outcome {
        Outcome {
            status,
            exit_code: Some(if status == Status::Ok { 0 } else { 3 }),
            signal: None,
            stdout: "hi".into(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 5,
            usage: ResourceUsage::default(),
            reason: None,
            language: "python".into(),
            backend: "linux".into(),
            egress: None,
            result: None,
            pictures: Vec::new(),
            outputs: Vec::new(),
            outputs_skipped: Vec::new(),
        }
    }

    #[test]
    fn text_layout_of_a_success_has_no_failure_line() {
        let text = sample(Status::Ok).render_text();
        assert_eq!(text, "--- stdout ---\nhi\n--- stderr ---\n");
    }

    #[test]
    fn text_layout_of_a_failure_names_status_and_exit_code() {
        let text = sample(Status::Error).render_text();
        assert!(
            text.starts_with("Execution Failed (error): exit code 3\n"),
            "{text}"
        );
    }

    #[test]
    fn json_uses_snake_case_status_and_flat_usage() {
        let mut o = sample(Status::PendingApproval);
        o.usage.cpu_time_ms = Some(7);
        let v = serde_json::to_value(&o).expect("serialize");
        assert_eq!(v["status"], "pending_approval");
        assert_eq!(v["cpu_time_ms"], 7);
        assert!(v.get("reason").is_none());
    }
}
