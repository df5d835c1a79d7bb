//! Live sessions: one interpreter in one sandbox, running cell after cell.
//!
//! The sandbox is built by a helper like any cold run's (same namespaces, cgroup, seccomp,
//! Landlock, rlimits); its program is a built-in live launcher (`launchers/python_live.py`)
//! that reads cells as JSON lines on its stdin and answers with JSON lines on its stdout
//! (output frames, then one `done` per cell). The job's limits are the session's: memory and
//! pids for the whole session, its wall clock the session's maximum age. Each cell has a
//! timeout of its own: the launcher interrupts the cell; a cell still running a grace period
//! later ends the session (the helper is killed, and with it the sandbox).
//!
//! What the launcher reports (output, the cell's result) is the program's word, as any
//! program's output is; whether the session still lives, and why it died, is the helper's.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gearbox_core::{Job, SandboxError};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe::{Receiver as ChildStdout, Sender as ChildStdin};

use crate::helper::{Spawned, spawn, spec_for, take_payload};
use crate::wire::{JailReport, Mode};

/// Longest line the launcher may send (a frame of output or a result): more is a broken
/// session, not a bigger buffer.
const MAX_FRAME: usize = 4 << 20;
/// The cell number of output that came past the protocol (counted for the running cell).
const RAW_CELL: u64 = u64::MAX;
/// How long a cell may run past its timeout after the interrupt before the session ends.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// How long opening may take until the interpreter says it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Most bytes of the helper's own stderr kept, for a death's reason.
const STDERR_TAIL: usize = 4096;

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellStatus {
    /// Ran to its end.
    Ok,
    /// Raised an error (the traceback is in `stderr`).
    Error,
    /// Ran past its timeout and was interrupted; the session goes on.
    Interrupted,
    /// The session ended during the cell (see `reason`).
    Dead,
}

/// What one cell did.
#[derive(Debug, Clone)]
pub struct CellOutcome {
    pub status: CellStatus,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// `repr` of the value of the cell's last bare expression, when it has one (not None).
    pub result: Option<String>,
    /// The error's one-line summary, or why the session ended.
    pub reason: Option<String>,
    pub duration_ms: u64,
}

#[derive(Deserialize)]
struct Frame {
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    cell: u64,
    #[serde(default)]
    stream: Option<String>,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    done: bool,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// A live interpreter in its sandbox. Dropping it kills the sandbox.
pub struct Live {
    child: crate::helper::HelperProcess,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    report: tokio::net::unix::pipe::Receiver,
    stderr_tail: Arc<Mutex<String>>,
    job: Job,
    next_cell: u64,
    dead: Option<String>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("language", &self.job.language)
            .field("cells", &self.next_cell)
            .field("dead", &self.dead)
            .finish()
    }
}

/// The live launcher of a language's warm launcher (`python` → `python-live`).
pub fn live_launcher(launcher: &str) -> Option<&'static str> {
    match launcher {
        "python" => Some("python-live"),
        "node" => Some("node-live"),
        _ => None,
    }
}

impl Live {
    /// Build the sandbox for `job` (its limits are the session's; its files are written
    /// into `/work`) and start the interpreter of its language's live launcher.
    pub async fn open(helper: &Path, mut job: Job) -> Result<Live, SandboxError> {
        let Some((name, command)) = job.launcher.clone() else {
            return Err(SandboxError::Unavailable(format!(
                "{} has no live sessions (no built-in launcher)",
                job.language
            )));
        };
        let Some(script) = live_launcher(&name) else {
            return Err(SandboxError::Unavailable(format!(
                "{} has no live sessions (Python and JavaScript have)",
                job.language
            )));
        };
        job.argv = command;
        let mut spec = spec_for(Mode::Linux, &job, None);
        spec.live = Some(script.to_string());
        spec.outputs = false;
        let Spawned {
            child,
            mut stdin,
            stdout,
            mut stderr,
            report,
        } = spawn(helper, &spec).await?;
        // The files; the stream stays open: it carries the cells.
        for chunk in take_payload(Vec::new(), &mut job) {
            if chunk.is_empty() {
                continue;
            }
            stdin
                .write_all(&chunk)
                .await
                .map_err(|e| SandboxError::Protocol(format!("writing the session's files: {e}")))?;
        }
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        let tail = stderr_tail.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                        t.push_str(&String::from_utf8_lossy(&buf[..n]));
                        if t.len() > STDERR_TAIL {
                            let cut = t.len() - STDERR_TAIL;
                            let cut = (cut..t.len()).find(|&i| t.is_char_boundary(i)).unwrap_or(0);
                            t.drain(..cut);
                        }
                    }
                }
            }
        });
        let mut live = Live {
            child,
            stdin,
            stdout: BufReader::with_capacity(64 * 1024, stdout),
            report,
            stderr_tail,
            job,
            next_cell: 1,
            dead: None,
        };
        match tokio::time::timeout(READY_TIMEOUT, live.frame()).await {
            Ok(Ok(Some(f))) if f.ready => Ok(live),
            Ok(Ok(Some(_))) => Err(SandboxError::Protocol(
                "the live interpreter spoke before it was ready".into(),
            )),
            Ok(Ok(None)) | Ok(Err(_)) => {
                let why = live.death().await;
                Err(SandboxError::Protocol(format!(
                    "the live interpreter did not start: {why}"
                )))
            }
            Err(_) => Err(SandboxError::Protocol(format!(
                "the live interpreter was not ready within {} s",
                READY_TIMEOUT.as_secs()
            ))),
        }
    }

    /// The language of the session.
    pub fn language(&self) -> &str {
        &self.job.language
    }

    /// Why the session ended, once it has.
    pub fn dead(&self) -> Option<&str> {
        self.dead.as_deref()
    }

    /// Cells run so far.
    pub fn cells(&self) -> u64 {
        self.next_cell - 1
    }

    /// Run one cell. Its output is capped at `output_bytes` per stream. Past `timeout` the
    /// launcher interrupts it; past `timeout` plus a grace period the session is ended.
    pub async fn run_cell(
        &mut self,
        code: &str,
        timeout: Duration,
        output_bytes: usize,
    ) -> CellOutcome {
        let started = Instant::now();
        let mut out = CellOutcome {
            status: CellStatus::Dead,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            result: None,
            reason: None,
            duration_ms: 0,
        };
        if let Some(why) = &self.dead {
            out.reason = Some(format!("the session has ended: {why}"));
            return out;
        }
        let cell = self.next_cell;
        self.next_cell += 1;
        let line = serde_json::json!({
            "cell": cell,
            "code": code,
            "timeout_ms": timeout.as_millis() as u64,
        })
        .to_string()
            + "\n";
        if self.stdin.write_all(line.as_bytes()).await.is_err() {
            let why = self.death().await;
            out.reason = Some(format!("the session has ended: {why}"));
            return out;
        }
        let deadline = tokio::time::Instant::now() + timeout + INTERRUPT_GRACE;
        loop {
            let frame = match tokio::time::timeout_at(deadline, self.frame()).await {
                Err(_) => {
                    let why = format!(
                        "cell {cell} did not stop within {} ms of its {} ms timeout; the \
                         session was ended",
                        INTERRUPT_GRACE.as_millis(),
                        timeout.as_millis()
                    );
                    self.end().await;
                    self.dead = Some(why.clone());
                    out.reason = Some(why);
                    break;
                }
                Ok(Ok(Some(f))) => f,
                Ok(Ok(None)) => {
                    let why = self.death().await;
                    out.reason = Some(format!("the session ended during the cell: {why}"));
                    break;
                }
                Ok(Err(e)) => {
                    let why = format!("the live interpreter broke its protocol: {e}");
                    self.end().await;
                    self.dead = Some(why.clone());
                    out.reason = Some(why);
                    break;
                }
            };
            // Late output of an earlier cell's threads is that cell's, and it is over.
            if frame.cell != cell && frame.cell != RAW_CELL {
                continue;
            }
            if let (Some(stream), Some(data)) = (&frame.stream, &frame.data) {
                let (text, truncated) = if stream == "stderr" {
                    (&mut out.stderr, &mut out.stderr_truncated)
                } else {
                    (&mut out.stdout, &mut out.stdout_truncated)
                };
                append_capped(text, truncated, data, output_bytes);
                continue;
            }
            if frame.done && frame.cell == cell {
                out.result = frame.result;
                out.status = match frame.status.as_deref() {
                    Some("ok") => CellStatus::Ok,
                    Some("interrupted") => CellStatus::Interrupted,
                    Some("exited") => CellStatus::Dead,
                    _ => CellStatus::Error,
                };
                out.reason = frame.error;
                if out.status == CellStatus::Dead {
                    let why = out
                        .reason
                        .clone()
                        .unwrap_or_else(|| "the program exited".into());
                    self.dead = Some(why);
                    self.end().await;
                }
                break;
            }
        }
        out.duration_ms = started.elapsed().as_millis() as u64;
        out
    }

    /// End the session now.
    pub async fn close(mut self) {
        self.end().await;
    }

    /// End the sandbox so that its helper still cleans up: kill its init (pid 1 of the
    /// sandbox's pid namespace, which takes every process of the sandbox with it); the
    /// helper sees it end, removes the session's cgroup and exits. A helper that has not
    /// exited within a few seconds is killed.
    async fn end(&mut self) {
        self.killer().kill();
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = self.child.wait().await;
        }
    }

    /// A handle that ends this session's sandbox without the session itself (which a
    /// running cell holds): its init is killed, and the cell sees the session end.
    pub fn killer(&self) -> Killer {
        Killer {
            helper: self.child.id(),
        }
    }

    /// Read up to `max` bytes at `offset` of the regular file `path` of this session's
    /// `/work` ([`LiveFiles::read_file`]).
    pub fn read_file(&self, path: &str, offset: u64, max: u64) -> Result<(u64, Vec<u8>), String> {
        if self.dead.is_some() {
            return Err("the live session has ended; its files went with its sandbox".into());
        }
        self.files().read_file(path, offset, max)
    }

    /// A handle that reads this session's files without the session itself (which a
    /// running cell holds).
    pub fn files(&self) -> LiveFiles {
        LiveFiles {
            helper: self.child.id(),
        }
    }

    /// Whether the sandbox is still running (not killed, not ended).
    pub fn alive(&mut self) -> bool {
        self.dead.is_none() && matches!(self.child.try_wait(), Ok(None))
    }

    /// The next frame, `None` at the end of the stream.
    async fn frame(&mut self) -> std::io::Result<Option<Frame>> {
        let mut line = Vec::new();
        loop {
            let buf = self.stdout.fill_buf().await?;
            if buf.is_empty() {
                return Ok(None);
            }
            match buf.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    line.extend_from_slice(&buf[..i]);
                    self.stdout.consume(i + 1);
                    break;
                }
                None => {
                    let n = buf.len();
                    line.extend_from_slice(buf);
                    self.stdout.consume(n);
                }
            }
            if line.len() > MAX_FRAME {
                return Err(std::io::Error::other(format!(
                    "a line of more than {MAX_FRAME} bytes"
                )));
            }
        }
        // A line that is not a frame is output that went past the protocol (a child
        // process given the interpreter's own stdout): the running cell's, as it is.
        Ok(Some(serde_json::from_slice(&line).unwrap_or_else(|_| {
            Frame {
                ready: false,
                cell: RAW_CELL,
                stream: Some("stdout".into()),
                data: Some(String::from_utf8_lossy(&line).into_owned() + "\n"),
                done: false,
                status: None,
                result: None,
                error: None,
            }
        })))
    }

    /// The session ended: why, from the helper's report (memory, the session's age, ...).
    async fn death(&mut self) -> String {
        if let Some(why) = &self.dead {
            return why.clone();
        }
        let mut bytes = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(5), self.report.read_to_end(&mut bytes)).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        let report = serde_json::Deserializer::from_slice(&bytes)
            .into_iter::<JailReport>()
            .next()
            .and_then(Result::ok);
        let stderr = self
            .stderr_tail
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .trim()
            .to_string();
        let why = match report {
            Some(r) => match r.error {
                Some(e) => format!("sandbox set-up failed at step {}: {}", e.step, e.message),
                None => {
                    let (_, reason) = crate::helper::classify(&r, &self.job.limits);
                    match (reason, r.exit_code, r.signal) {
                        (Some(reason), _, _) => reason,
                        (None, Some(code), _) => format!("the interpreter exited (code {code})"),
                        (None, None, Some(sig)) => {
                            format!("the interpreter was killed by signal {sig}")
                        }
                        (None, None, None) => "the interpreter ended".into(),
                    }
                }
            },
            None => "the sandbox ended without a report".into(),
        };
        let why = if stderr.is_empty() {
            why
        } else {
            format!(
                "{why}; stderr: {}",
                stderr
                    .chars()
                    .rev()
                    .take(500)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<String>()
            )
        };
        self.dead = Some(why.clone());
        why
    }
}

/// Reads a live session's files from outside its sandbox ([`Live::files`]).
#[derive(Debug, Clone, Copy)]
pub struct LiveFiles {
    helper: Option<u32>,
}

impl LiveFiles {
    /// Read up to `max` bytes at `offset` of the regular file `path` (relative to `/work`)
    /// of the session's sandbox, from outside it: through `/proc/<init>/root/work`, resolved
    /// with `openat2` beneath it (no symlink, no magic link, no other mount) and opened
    /// non-blocking, so nothing the program planted (a link, a fifo) reaches past its own
    /// files or holds the server. Returns the file's size and the bytes.
    pub fn read_file(&self, path: &str, offset: u64, max: u64) -> Result<(u64, Vec<u8>), String> {
        use std::io::{Read, Seek, SeekFrom};
        use std::os::fd::AsFd;
        gearbox_core::validate_relative_path("path", path).map_err(|e| e.to_string())?;
        let init = self
            .helper
            .and_then(|helper| children(helper).into_iter().next())
            .ok_or("the live session's sandbox is not running")?;
        let no_file = || format!("no file {path:?} in the live session's /work");
        let work = gearbox_core::tree::open_dir(Path::new(&format!("/proc/{init}/root/work")))
            .map_err(|e| format!("the live session's /work cannot be read: {e}"))?;
        let fd = gearbox_core::tree::open_beneath(
            work.as_fd(),
            path,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(|_| no_file())?;
        let mut f = std::fs::File::from(fd);
        let meta = f.metadata().map_err(|_| no_file())?;
        if !meta.is_file() {
            return Err(no_file());
        }
        let size = meta.len();
        f.seek(SeekFrom::Start(offset.min(size)))
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        f.take(max)
            .read_to_end(&mut buf)
            .map_err(|e| e.to_string())?;
        Ok((size, buf))
    }
}

/// Ends a live session's sandbox from outside the session ([`Live::killer`]).
#[derive(Debug, Clone, Copy)]
pub struct Killer {
    helper: Option<u32>,
}

impl Killer {
    /// Kill the sandbox's init (its helper then cleans up and exits).
    pub fn kill(&self) {
        if let Some(helper) = self.helper {
            for init in children(helper) {
                // SAFETY: kill has no memory-safety preconditions; the pid is a child of our
                // helper, which cannot be reaped (and the pid reused) while the helper lives.
                unsafe { libc::kill(init as i32, libc::SIGKILL) };
            }
        }
    }
}

/// The children of process `pid`, from each of its threads' lists.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Append `data` to `text` up to `cap` bytes (never splitting a character).
fn append_capped(text: &mut String, truncated: &mut bool, data: &str, cap: usize) {
    if *truncated {
        return;
    }
    let room = cap.saturating_sub(text.len());
    if data.len() <= room {
        text.push_str(data);
        return;
    }
    let mut cut = room;
    while cut > 0 && !data.is_char_boundary(cut) {
        cut -= 1;
    }
    text.push_str(&data[..cut]);
    *truncated = true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_capped_on_a_character_boundary() {
        let (mut text, mut truncated) = (String::new(), false);
        append_capped(&mut text, &mut truncated, "ab", 3);
        append_capped(&mut text, &mut truncated, "éé", 3);
        assert_eq!((text.as_str(), truncated), ("ab", true));
        append_capped(&mut text, &mut truncated, "x", 3);
        assert_eq!(text, "ab");
    }

    #[test]
    fn python_and_node_have_live_launchers() {
        assert_eq!(live_launcher("python"), Some("python-live"));
        assert_eq!(live_launcher("node"), Some("node-live"));
        assert_eq!(live_launcher("bash"), None);
    }
}
