//! The audit log: one JSON line per execution and per refusal, appended to a file by one
//! writer thread. Lines that arrive while an fsync is under way share the next fsync (group
//! commit); a caller gets its answer only once its line is on disk. The file is rotated by
//! size (`FILE.1`, `FILE.2`, ...). When the file cannot be opened or written the log turns
//! unhealthy, [`AuditLog::ready`] says why, and the server refuses executions (fail closed)
//! until a later attempt to reopen it succeeds.
//!
//! The mapping of a call to its line is here too: who made the call (`CallInfo`), the
//! [`Record`], what the request, the outcome and the gear's decision put in it
//! (`fill_request`, `fill_outcome`, `fill_policy`), and `append`, which adds the call's total
//! time.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gearbox_core::{ExecRequest, Outcome};
use gearbox_engine::config::AuditConfig;
use gearbox_engine::policy::PolicyReport;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

/// Messages waiting for the writer, at most; past it callers wait (back-pressure).
const QUEUE: usize = 4096;
/// Longest a caller waits for its line to be durable before it counts the log as failed.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);

type Ack = oneshot::Sender<Result<(), String>>;

enum Msg {
    Line(String, Ack),
    /// Reopen if needed and report health.
    Probe(Ack),
}

/// A handle on the audit log; cheap to share.
pub struct AuditLog {
    tx: mpsc::Sender<Msg>,
    health: Arc<Mutex<Result<(), String>>>,
    path: PathBuf,
    hash_only: bool,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.path)
            .field("hash_only", &self.hash_only)
            .finish()
    }
}

/// The durations of one call, in milliseconds (set-up in microseconds, as the outcome has it).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Durations {
    /// Time waiting for a run slot.
    pub queued_ms: u64,
    /// The program's wall-clock time.
    pub run_ms: u64,
    /// Sandbox construction before the program started.
    pub setup_us: Option<u64>,
    /// From the call's arrival to its answer.
    pub total_ms: u64,
}

/// One audit line.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// `execution` (a sandbox ran) or `refusal` (nothing ran: arguments, policy, busy, audit).
    pub event: &'static str,
    /// Name of the API key (or a token's tenant claim), `anonymous` over HTTP without
    /// keys, `local` over stdio.
    pub caller: String,
    /// The tenant the event concerns: the caller's (an API key's `[http.keys.NAME] tenant`,
    /// else its name), or for a decision on an approval, the tenant that asked for it.
    pub tenant: String,
    /// `stdio`, `http` (Streamable HTTP) or `sse` (the 2024-11-05 transport).
    pub transport: String,
    pub tool: String,
    pub language: Option<String>,
    pub backend: Option<String>,
    /// Hex SHA-256 of the code (the entrypoint's source).
    pub code_sha256: Option<String>,
    /// The code itself, unless `[audit] hash_only`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    pub code_bytes: usize,
    /// Names of the extra files, and the entrypoint's name when given.
    pub files: Vec<String>,
    pub entrypoint: Option<String>,
    pub stdin_bytes: usize,
    pub args: usize,
    /// Names of the environment variables set (not their values).
    pub env: Vec<String>,
    /// The decision taken before the run: `allowed` or `refused`.
    pub decision: &'static str,
    /// Outcome status (`ok`, `error`, `timeout`, `killed`, `denied`, `busy`, ...).
    pub status: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub reason: Option<String>,
    pub durations: Durations,
    pub cpu_time_ms: Option<u64>,
    pub peak_memory_kb: Option<u64>,
    pub stdout_bytes: usize,
    pub stderr_bytes: usize,
    /// The safety gear the call ran under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gear: Option<String>,
    /// Capabilities granted (execution) or asked for (approval).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// How the gear's decision was taken: `auto` (no human needed), `asked` (an approval
    /// was requested), `approved`, `rejected`, `expired`, `elicitation_accepted`,
    /// `elicitation_declined`, `elicitation_cancelled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<String>,
    /// The out-of-band approval this record concerns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
    /// A granted run's traffic as its egress proxy saw it: hosts, bytes, refusals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress: Option<gearbox_core::EgressLedger>,
}

impl Record {
    /// A record with the time set and every other field empty.
    pub fn new(event: &'static str, caller: &str, transport: &str, tool: &str) -> Record {
        Record {
            time: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            event,
            caller: caller.to_string(),
            tenant: caller.to_string(),
            transport: transport.to_string(),
            tool: tool.to_string(),
            language: None,
            backend: None,
            code_sha256: None,
            code: None,
            code_bytes: 0,
            files: Vec::new(),
            entrypoint: None,
            stdin_bytes: 0,
            args: 0,
            env: Vec::new(),
            decision: if event == "execution" {
                "allowed"
            } else {
                "refused"
            },
            status: String::new(),
            exit_code: None,
            signal: None,
            reason: None,
            durations: Durations::default(),
            cpu_time_ms: None,
            peak_memory_kb: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
            gear: None,
            capabilities: Vec::new(),
            approval: None,
            operation_id: None,
            egress: None,
        }
    }
}

/// Who asked, over what, when: what the audit line and metrics need of one call.
pub(crate) struct CallInfo {
    /// The API key's name or the token's tenant claim.
    pub caller: String,
    /// The tenant that owns what the call creates.
    pub tenant: String,
    /// The highest gear the caller's calls run at (`None`: the server's).
    pub max_gear: Option<gearbox_core::Gear>,
    pub transport: String,
    pub tool: String,
    pub arrived: Instant,
}

/// Append `record` of the call `info`, with the call's total time; false when `log` is
/// configured and the line did not reach the disk.
pub(crate) async fn append(log: Option<&AuditLog>, mut record: Record, info: &CallInfo) -> bool {
    record.tenant.clone_from(&info.tenant);
    record.durations.total_ms = info.arrived.elapsed().as_millis() as u64;
    match log {
        Some(log) => log.write(&record).await.is_ok(),
        None => true,
    }
}

/// The request's part of a record: the code's hash, names and sizes, never the contents of
/// stdin, arguments or environment; the code itself unless `hash_only`.
pub(crate) fn fill_request(r: &mut Record, req: &ExecRequest, backend: &str, hash_only: bool) {
    r.language = Some(req.language.clone());
    r.backend = Some(backend.to_string());
    r.code_sha256 = Some(sha256_hex(req.code.as_bytes()));
    if !hash_only {
        r.code = Some(req.code.clone());
    }
    r.code_bytes = req.code.len();
    r.files = req.files.iter().map(|f| f.filename.clone()).collect();
    r.entrypoint = req.entrypoint.clone();
    r.stdin_bytes = req.stdin.len();
    r.args = req.args.len();
    r.env = req.env.keys().cloned().collect();
}

/// The outcome's part of a record: status, exit, durations, usage, output sizes, egress
/// (and the language and backend, when the request's part did not set them).
pub(crate) fn fill_outcome(r: &mut Record, o: &Outcome) {
    r.status = o.status.to_string();
    r.exit_code = o.exit_code;
    r.signal = o.signal;
    r.reason = o.reason.clone();
    r.durations.run_ms = o.duration_ms;
    r.durations.setup_us = o.usage.setup_us;
    r.cpu_time_ms = o.usage.cpu_time_ms;
    r.peak_memory_kb = o.usage.peak_memory_kb;
    r.stdout_bytes = o.stdout.len();
    r.stderr_bytes = o.stderr.len();
    r.egress = o.egress.clone();
    if r.language.is_none() && !o.language.is_empty() {
        r.language = Some(o.language.clone());
    }
    if r.backend.is_none() {
        r.backend = Some(o.backend.clone());
    }
}

/// The gear's part of a record: the gear, what it granted, how it was decided.
pub(crate) fn fill_policy(r: &mut Record, p: &PolicyReport) {
    r.gear = Some(p.gear.to_string());
    r.capabilities = p.granted.iter().map(|c| c.as_str().to_string()).collect();
    r.approval = Some(
        match p.decided_by.as_str() {
            "gear" => "auto",
            "human" => "approved",
            "elicitation" => "elicitation_accepted",
            other => other,
        }
        .to_string(),
    );
    r.operation_id = p.operation_id.clone();
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(data: &[u8]) -> String {
    let digest = Sha256::digest(data);
    let mut s = String::with_capacity(64);
    for b in digest {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The default file for `serve --http` when `[audit] path` is not set.
pub fn default_path() -> PathBuf {
    if let Some(dir) = std::env::var_os("STATE_DIRECTORY").filter(|d| !d.is_empty()) {
        // systemd's StateDirectory=; it may list several, separated by ':'.
        let first = dir
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        return PathBuf::from(first).join("audit.jsonl");
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("gearbox/audit.jsonl");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".local/state/gearbox/audit.jsonl")
}

impl AuditLog {
    /// Start the writer for `path`. Never fails: a file that cannot be opened leaves the log
    /// unhealthy (executions refused, `/readyz` says why) and is retried on each probe.
    pub fn open(path: PathBuf, cfg: &AuditConfig) -> AuditLog {
        let (tx, rx) = mpsc::channel(QUEUE);
        let health = Arc::new(Mutex::new(Ok(())));
        let mut writer = Writer {
            path: path.clone(),
            file: None,
            size: 0,
            max_bytes: cfg.max_bytes.max(1),
            keep: cfg.keep,
            wait: Duration::from_millis(cfg.fsync_interval_ms),
            health: health.clone(),
        };
        if let Err(e) = writer.reopen() {
            tracing::error!(error = %e, "audit log not writable; executions are refused");
        }
        let spawned = std::thread::Builder::new()
            .name("gearbox-audit".into())
            .spawn(move || writer.run(rx));
        if let Err(e) = spawned {
            set(
                &health,
                Err(format!("audit log: starting its writer thread: {e}")),
            );
        }
        AuditLog {
            tx,
            health,
            path,
            hash_only: cfg.hash_only,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn hash_only(&self) -> bool {
        self.hash_only
    }

    /// The last known health, without touching the file.
    pub fn health(&self) -> Result<(), String> {
        self.health
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether a line can be written now; reopens the file when it had failed.
    pub async fn ready(&self) -> Result<(), String> {
        let (ack, rx) = oneshot::channel();
        self.ask(Msg::Probe(ack), rx).await
    }

    /// Append `record` and wait until it is on disk.
    pub async fn write(&self, record: &Record) -> Result<(), String> {
        let line = serde_json::to_string(record)
            .map_err(|e| format!("audit log: encoding a record: {e}"))?;
        let (ack, rx) = oneshot::channel();
        let result = self.ask(Msg::Line(line, ack), rx).await;
        if let Err(e) = &result {
            tracing::error!(error = %e, "audit line not written");
        }
        result
    }

    /// Wait until every line sent so far is on disk.
    pub async fn flush(&self) -> Result<(), String> {
        self.ready().await
    }

    async fn ask(&self, msg: Msg, rx: oneshot::Receiver<Result<(), String>>) -> Result<(), String> {
        if self.tx.send(msg).await.is_err() {
            return Err("audit log: its writer thread has stopped".into());
        }
        match tokio::time::timeout(ACK_TIMEOUT, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err("audit log: its writer thread has stopped".into()),
            Err(_) => {
                let e = format!(
                    "audit log {}: no fsync within {} s",
                    self.path.display(),
                    ACK_TIMEOUT.as_secs()
                );
                set(&self.health, Err(e.clone()));
                Err(e)
            }
        }
    }
}

fn set(health: &Mutex<Result<(), String>>, value: Result<(), String>) {
    *health.lock().unwrap_or_else(|p| p.into_inner()) = value;
}

struct Writer {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max_bytes: u64,
    keep: usize,
    wait: Duration,
    health: Arc<Mutex<Result<(), String>>>,
}

impl Writer {
    fn fail(&mut self, what: &str, e: std::io::Error) -> String {
        let msg = format!("audit log {}: {what}: {e}", self.path.display());
        self.file = None;
        set(&self.health, Err(msg.clone()));
        msg
    }

    fn reopen(&mut self) -> Result<(), String> {
        if self.file.is_some() {
            return Ok(());
        }
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            return Err(self.fail("creating its directory", e));
        }
        match OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|f| f.metadata().map(|m| (f, m.len())))
        {
            Ok((f, len)) => {
                self.file = Some(f);
                self.size = len;
                set(&self.health, Ok(()));
                Ok(())
            }
            Err(e) => Err(self.fail("opening", e)),
        }
    }

    fn rotate(&mut self) -> Result<(), String> {
        self.file = None;
        let name = |i: usize| {
            let mut p = self.path.clone().into_os_string();
            p.push(format!(".{i}"));
            PathBuf::from(p)
        };
        if self.keep == 0 {
            if let Err(e) = std::fs::remove_file(&self.path) {
                return Err(self.fail("removing for rotation", e));
            }
        } else {
            for i in (1..self.keep).rev() {
                let from = name(i);
                if from.exists()
                    && let Err(e) = std::fs::rename(&from, name(i + 1))
                {
                    return Err(self.fail("rotating", e));
                }
            }
            if let Err(e) = std::fs::rename(&self.path, name(1)) {
                return Err(self.fail("rotating", e));
            }
        }
        self.reopen()
    }

    fn write_batch(&mut self, lines: &[String]) -> Result<(), String> {
        self.reopen()?;
        let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
        if self.size > 0 && self.size + bytes as u64 > self.max_bytes {
            self.rotate()?;
        }
        let mut buf = Vec::with_capacity(bytes);
        for l in lines {
            buf.extend_from_slice(l.as_bytes());
            buf.push(b'\n');
        }
        let Some(file) = self.file.as_mut() else {
            return Err(format!("audit log {}: not open", self.path.display()));
        };
        if let Err(e) = file.write_all(&buf) {
            return Err(self.fail("writing", e));
        }
        if let Err(e) = file.sync_data() {
            return Err(self.fail("fsync", e));
        }
        self.size += bytes as u64;
        Ok(())
    }

    fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            if !self.wait.is_zero() {
                std::thread::sleep(self.wait);
            }
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(m) => batch.push(m),
                    Err(_) => break,
                }
            }
            let mut lines = Vec::new();
            let mut acks = Vec::new();
            for m in batch {
                match m {
                    Msg::Line(l, ack) => {
                        lines.push(l);
                        acks.push(ack);
                    }
                    Msg::Probe(ack) => acks.push(ack),
                }
            }
            let result = if lines.is_empty() {
                self.reopen()
            } else {
                self.write_batch(&lines)
            };
            for ack in acks {
                let _ = ack.send(result.clone());
            }
        }
        if let Some(f) = self.file.take()
            && let Err(e) = f.sync_all()
        {
            tracing::warn!(error = %e, "audit log: final fsync");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gearbox-audit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("tmp dir");
        d
    }

    #[tokio::test]
    async fn lines_are_json_and_rotate_by_size() {
        let d = tmpdir("rotate");
        let path = d.join("audit.jsonl");
        let cfg = AuditConfig {
            max_bytes: 600,
            keep: 2,
            ..AuditConfig::default()
        };
        let log = AuditLog::open(path.clone(), &cfg);
        log.ready().await.expect("writable");
        for i in 0..10 {
            let mut r = Record::new("execution", "alice", "http", "execute_code");
            r.code_sha256 = Some(sha256_hex(format!("print({i})").as_bytes()));
            log.write(&r).await.expect("written");
        }
        let text = std::fs::read_to_string(&path).expect("current file");
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("json line");
            assert_eq!(v["caller"], "alice");
        }
        assert!(d.join("audit.jsonl.1").exists());
        assert!(d.join("audit.jsonl.2").exists());
        assert!(!d.join("audit.jsonl.3").exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn an_unwritable_path_fails_closed_and_says_why() {
        let d = tmpdir("closed");
        // A directory where the file should be: opening it for append fails, even as root.
        let path = d.join("audit.jsonl");
        std::fs::create_dir_all(&path).expect("dir");
        let log = AuditLog::open(path.clone(), &AuditConfig::default());
        let e = log.ready().await.expect_err("not writable");
        assert!(e.contains("audit.jsonl"), "{e}");
        assert!(log.health().is_err());
        let r = Record::new("execution", "a", "stdio", "t");
        assert!(log.write(&r).await.is_err());
        // Repaired: the next probe reopens it.
        std::fs::remove_dir(&path).expect("rmdir");
        log.ready().await.expect("writable again");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn sha256_is_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
