//! The protocol between the server and the `__jail` helper.
//!
//! The server writes to the helper's stdin: a little-endian `u32` length, that many bytes of
//! JSON [`JailSpec`], then the content of each file in `spec.files` (lengths in the spec),
//! then the program's stdin until EOF. The helper reads exactly the header and the files, so
//! what remains on fd 0 is the program's stdin, which it inherits. The program's stdout and
//! stderr are the helper's fds 1 and 2 (pipes the server reads). The helper writes one JSON
//! [`JailReport`] to fd 3 before it exits. When the spec asks to collect the workspace and
//! the report's `collected` is true, the report is followed on fd 3 by the workspace's files
//! as frames (`gearbox_core::tree`: a tag, a path, a size, the bytes; then a summary).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use gearbox_core::{CollectLimits, Limits};
use serde::{Deserialize, Serialize};

/// Largest spec header the helper accepts.
pub const MAX_SPEC_BYTES: u32 = 16 * 1024 * 1024;
/// The fd on which the helper writes its report.
pub const REPORT_FD: i32 = 3;
/// The fd on which a fork server's helper receives the server's control socket, passed on
/// to the fork server (see `fork_server.rs`).
pub const FORK_SERVER_FD: i32 = 4;

/// How the helper isolates the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Namespaces, minimal root, seccomp, Landlock, cgroups.
    Linux,
    /// A plain child process in its own process group; no isolation.
    Process,
}

/// Everything the helper needs to build and run one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JailSpec {
    pub mode: Mode,
    pub argv: Vec<String>,
    /// The program's environment before `{workspace}`/`{tmp}` substitution.
    pub env: BTreeMap<String, String>,
    /// Workspace-relative paths and lengths; the contents follow the header.
    pub files: Vec<(String, u64)>,
    pub limits: Limits,
    /// Extra host paths bound read-only at the same place.
    pub mounts: Vec<PathBuf>,
    /// A granted run: the egress proxy's socket (bound at the same path, inside `mounts`),
    /// relayed to `127.0.0.1:3128` in the run's own network namespace. `None`: loopback only.
    #[serde(default)]
    pub egress: Option<PathBuf>,
    /// Pid of the server; the helper exits if its parent changes (server died).
    pub parent_pid: i32,
    /// A warm sandbox: build everything, then wait on stdin for a [`HandOver`].
    #[serde(default)]
    pub pooled: Option<Pooled>,
    /// Bring back the workspace's regular files after the program exits (session runs).
    #[serde(default)]
    pub collect: Option<CollectLimits>,
    /// Bring back the files of `/work/outputs/` after the program exits, within
    /// `gearbox_core::OUTPUT_LIMITS`, when there are any (runs without a session).
    #[serde(default)]
    pub outputs: bool,
    /// A live session: the built-in launcher (`python-live`) written at the launcher's path
    /// for the program (`argv`) to run (`live.rs`).
    #[serde(default)]
    pub live: Option<String>,
}

/// How a warm sandbox waits for its program.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pooled {
    /// Built-in launcher name and the command that starts it; `None`: the program is
    /// exec'd at hand-over.
    pub launcher: Option<(String, Vec<String>)>,
    /// Start the launcher as a fork server instead: it keeps the capabilities to build
    /// per-run namespaces and forks one single-use sandbox per request (`fork_server.rs`).
    #[serde(default)]
    pub fork_server: bool,
}

/// The program handed to a warm sandbox: written to the helper's stdin (read by init) as a
/// little-endian `u32` length and JSON, then the files, then the program's stdin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HandOver {
    pub argv: Vec<String>,
    /// Entrypoint and args, for a launcher.
    pub program_argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub files: Vec<(String, u64)>,
    /// The run's limits, for a fork server's program: it lowers its rlimits (CPU time, open
    /// files, file size) to these at hand-over; the server enforces the wall clock and the
    /// output cap itself.
    #[serde(default)]
    pub limits: Option<Limits>,
    /// The program's CPU-time rlimit in seconds (`Limits::cpu_rlimit_secs`), for a fork
    /// server's program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<u64>,
}

/// Encode a hand-over header.
pub fn encode_handover(h: &HandOver) -> Result<Vec<u8>, serde_json::Error> {
    encode_frame(h)
}

/// A little-endian `u32` length, then that many bytes of JSON: the framing of both headers.
fn encode_frame<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let json = serde_json::to_vec(value)?;
    let mut out = Vec::with_capacity(json.len() + 4);
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

/// Read a hand-over and its files, reading no byte beyond them.
pub fn read_handover<R: Read>(r: &mut R) -> Result<(HandOver, Vec<Vec<u8>>), String> {
    let json = read_frame(r)?;
    let h: HandOver =
        serde_json::from_slice(&json).map_err(|e| format!("parsing hand-over: {e}"))?;
    let files = read_files(r, &h.files)?;
    Ok((h, files))
}

fn read_frame<R: Read>(r: &mut R) -> Result<Vec<u8>, String> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .map_err(|e| format!("reading length: {e}"))?;
    let len = u32::from_le_bytes(len);
    if len > MAX_SPEC_BYTES {
        return Err(format!(
            "header of {len} bytes is larger than {MAX_SPEC_BYTES}"
        ));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)
        .map_err(|e| format!("reading header: {e}"))?;
    Ok(buf)
}

fn read_files<R: Read>(r: &mut R, names: &[(String, u64)]) -> Result<Vec<Vec<u8>>, String> {
    let mut files = Vec::with_capacity(names.len());
    for (name, size) in names {
        // Grow with the bytes that arrive, not with the size the header announces: a size
        // no stream delivers is an error, not an allocation that aborts the process.
        let mut content = Vec::with_capacity(usize::try_from(*size).unwrap_or(0).min(1 << 20));
        r.by_ref()
            .take(*size)
            .read_to_end(&mut content)
            .map_err(|e| format!("reading file {name}: {e}"))?;
        if content.len() as u64 != *size {
            return Err(format!(
                "reading file {name}: the stream ended after {} of {size} bytes",
                content.len()
            ));
        }
        files.push(content);
    }
    Ok(files)
}

/// Where the `linux` backend puts gearbox's Python helpers in every sandbox (the display
/// hooks, `launchers/gearbox_display.py`).
pub const PYTHON_HELPERS: &str = "/.gearbox/python";
/// The same for Node (`launchers/gearbox_display.js`), on `NODE_PATH`.
pub const NODE_HELPERS: &str = "/.gearbox/node";

/// The variables that turn the display hooks on (`linux` backend): the helpers on
/// `PYTHONPATH` (after the job's own entries), matplotlib's backend unless the job chose one.
pub(crate) fn with_display_env(mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    for (var, dir) in [("PYTHONPATH", PYTHON_HELPERS), ("NODE_PATH", NODE_HELPERS)] {
        match env.iter_mut().find(|(k, _)| k == var) {
            Some((_, v)) if !v.is_empty() => *v = format!("{v}:{dir}"),
            Some((_, v)) => *v = dir.to_string(),
            None => env.push((var.into(), dir.into())),
        }
    }
    for (k, v) in [
        ("MPLBACKEND", "module://gearbox_mpl_backend"),
        // matplotlib's font cache: in /tmp, not in a session's workspace.
        ("MPLCONFIGDIR", "/tmp/.matplotlib"),
    ] {
        if !env.iter().any(|(name, _)| name == k) {
            env.push((k.into(), v.into()));
        }
    }
    env.sort();
    env
}

/// The program's environment: a fixed base, then the job's variables with the sandbox's
/// paths substituted. Nothing is inherited from the server.
pub(crate) fn program_env(
    spec_env: &std::collections::BTreeMap<String, String>,
    workspace: &str,
    tmp: &str,
) -> Vec<(String, String)> {
    let mut env: std::collections::BTreeMap<String, String> = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    env.insert("HOME".into(), workspace.to_string());
    env.insert("PWD".into(), workspace.to_string());
    env.insert("TMPDIR".into(), tmp.to_string());
    for (k, v) in spec_env {
        env.insert(
            k.clone(),
            v.replace("{workspace}", workspace).replace("{tmp}", tmp),
        );
    }
    env.into_iter().collect()
}

/// A set-up step that failed, as it travels between processes: the step's name (a
/// `crate::step::Step` displayed, or a step of the fork server's native loop) and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetupFailure {
    pub step: String,
    pub message: String,
}

/// What the helper observed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailReport {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The memory cgroup killed a process of the run, or (no cgroup) the helper stopped the
    /// run because its sampled memory passed the limit.
    pub oom_killed: bool,
    /// No memory cgroup: the helper measured the run's memory by sampling
    /// (`jail/memwatch.rs`), and the peak is the sampled one.
    #[serde(default)]
    pub memory_sampled: bool,
    pub cpu_time_ms: Option<u64>,
    pub peak_memory_kb: Option<u64>,
    /// From hand-over to exit.
    pub duration_us: u64,
    /// From helper start to hand-over.
    pub setup_us: u64,
    pub error: Option<SetupFailure>,
    /// Mechanisms that were applied (for `doctor` and tests).
    pub enforced: Vec<String>,
    /// Microseconds since helper start at which each set-up step ended.
    pub timings: Vec<(String, u64)>,
    /// The workspace's files follow the report on fd 3.
    #[serde(default)]
    pub collected: bool,
    /// Why the workspace could not be collected although the program ran to its end.
    #[serde(default)]
    pub collect_error: Option<String>,
}

/// Encode the header the server sends first.
pub fn encode_header(spec: &JailSpec) -> Result<Vec<u8>, serde_json::Error> {
    encode_frame(spec)
}

/// Read the header and the files from `r`, reading no byte beyond them.
pub fn read_request<R: Read>(r: &mut R) -> Result<(JailSpec, Vec<Vec<u8>>), String> {
    let json = read_frame(r)?;
    let spec: JailSpec = serde_json::from_slice(&json).map_err(|e| format!("parsing spec: {e}"))?;
    let files = read_files(r, &spec.files)?;
    Ok((spec, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (found by `proptests::announced_file_sizes_are_not_trusted`): `read_files`
    /// allocated the size a header announced before reading a byte, so a size above
    /// `isize::MAX` panicked ("capacity overflow") and a smaller huge one aborted the helper
    /// ("memory allocation of 6926914525241934501 bytes failed").
    #[test]
    fn a_huge_announced_file_is_an_error() {
        for size in [u64::MAX, 1 << 42, u64::from(u32::MAX) + 1] {
            let h = HandOver {
                argv: vec!["x".into()],
                program_argv: vec![],
                env: BTreeMap::new(),
                files: vec![("big".into(), size)],
                limits: None,
                cpu_s: None,
            };
            let mut bytes = encode_handover(&h).expect("encode");
            bytes.extend_from_slice(b"only a few bytes");
            let e = read_handover(&mut &bytes[..]).expect_err("too short");
            assert!(e.contains("reading file big"), "{e}");
        }
    }
}

/// Property tests of the frames between the server and the helper: arbitrary, truncated and
/// mutated bytes never panic the decoders, and valid values round-trip, reading no byte
/// beyond their files. `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use std::io::Cursor;

    use proptest::prelude::*;

    use super::*;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-zA-Z0-9_./=-]{0,12}",
            any::<String>(),
            Just("{workspace}".to_string()),
        ]
    }

    fn limits() -> impl Strategy<Value = Limits> {
        proptest::array::uniform8(any::<u64>()).prop_map(|v| Limits {
            timeout_ms: v[0],
            cpu_ms: v[1],
            memory_mb: v[2],
            pids: v[3],
            file_size_mb: v[4],
            open_files: v[5],
            disk_mb: v[6],
            output_bytes: v[7],
        })
    }

    fn files() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
        proptest::collection::vec(
            (text(), proptest::collection::vec(any::<u8>(), 0..64)),
            0..4,
        )
    }

    fn env() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(text(), text(), 0..4)
    }

    fn pooled() -> impl Strategy<Value = Option<Pooled>> {
        proptest::option::of(
            (
                proptest::option::of((text(), proptest::collection::vec(text(), 0..3))),
                any::<bool>(),
            )
                .prop_map(|(launcher, fork_server)| Pooled {
                    launcher,
                    fork_server,
                }),
        )
    }

    fn spec() -> impl Strategy<Value = (JailSpec, Vec<Vec<u8>>)> {
        (
            (
                prop_oneof![Just(Mode::Linux), Just(Mode::Process)],
                proptest::collection::vec(text(), 0..4),
                env(),
                files(),
                limits(),
            ),
            (
                proptest::collection::vec("/[a-z0-9/._-]{0,16}", 0..3),
                proptest::option::of("/[a-z0-9/._-]{1,16}"),
                any::<i32>(),
                pooled(),
                proptest::option::of((any::<usize>(), any::<u64>())),
            ),
        )
            .prop_map(
                |(
                    (mode, argv, env, files, limits),
                    (mounts, egress, parent_pid, pooled, collect),
                )| {
                    let spec = JailSpec {
                        mode,
                        argv,
                        env,
                        files: files
                            .iter()
                            .map(|(n, c)| (n.clone(), c.len() as u64))
                            .collect(),
                        limits,
                        mounts: mounts.into_iter().map(PathBuf::from).collect(),
                        egress: egress.map(PathBuf::from),
                        parent_pid,
                        pooled,
                        collect: collect.map(|(max_files, max_bytes)| CollectLimits {
                            max_files,
                            max_bytes,
                        }),
                        outputs: parent_pid % 2 == 0,
                        live: None,
                    };
                    (spec, files.into_iter().map(|(_, c)| c).collect())
                },
            )
    }

    fn handover() -> impl Strategy<Value = (HandOver, Vec<Vec<u8>>)> {
        (
            proptest::collection::vec(text(), 0..4),
            proptest::collection::vec(text(), 0..4),
            env(),
            files(),
            proptest::option::of(limits()),
        )
            .prop_map(|(argv, program_argv, env, files, limits)| {
                let h = HandOver {
                    argv,
                    program_argv,
                    env,
                    files: files
                        .iter()
                        .map(|(n, c)| (n.clone(), c.len() as u64))
                        .collect(),
                    cpu_s: limits.as_ref().map(|l: &Limits| l.cpu_rlimit_secs()),
                    limits,
                };
                (h, files.into_iter().map(|(_, c)| c).collect())
            })
    }

    fn report() -> impl Strategy<Value = JailReport> {
        (
            (
                proptest::option::of(any::<i32>()),
                proptest::option::of(any::<i32>()),
                any::<bool>(),
                any::<bool>(),
                proptest::option::of(any::<u64>()),
                proptest::option::of(any::<u64>()),
                any::<u64>(),
                any::<u64>(),
            ),
            (
                proptest::option::of(
                    (text(), text()).prop_map(|(step, message)| SetupFailure { step, message }),
                ),
                proptest::collection::vec(text(), 0..4),
                proptest::collection::vec((text(), any::<u64>()), 0..4),
                any::<bool>(),
                proptest::option::of(text()),
            ),
        )
            .prop_map(
                |(
                    (exit_code, signal, timed_out, oom_killed, cpu, peak, duration_us, setup_us),
                    (error, enforced, timings, collected, collect_error),
                )| JailReport {
                    exit_code,
                    signal,
                    timed_out,
                    oom_killed,
                    // Sampled memory goes with a peak; either way it round-trips.
                    memory_sampled: peak.is_some() && oom_killed,
                    cpu_time_ms: cpu,
                    peak_memory_kb: peak,
                    duration_us,
                    setup_us,
                    error,
                    enforced,
                    timings,
                    collected,
                    collect_error,
                },
            )
    }

    /// The header, the files, then what the program's stdin would be.
    fn stream(header: Vec<u8>, files: &[Vec<u8>], stdin: &[u8]) -> Vec<u8> {
        let mut bytes = header;
        for f in files {
            bytes.extend_from_slice(f);
        }
        bytes.extend_from_slice(stdin);
        bytes
    }

    fn mutate(bytes: &mut Vec<u8>, edits: Vec<(prop::sample::Index, u8, u8)>) {
        for (at, byte, how) in edits {
            if bytes.is_empty() {
                return;
            }
            let i = at.index(bytes.len());
            match how % 3 {
                0 => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                _ => {
                    bytes.remove(i);
                }
            }
        }
    }

    fn edits() -> impl Strategy<Value = Vec<(prop::sample::Index, u8, u8)>> {
        proptest::collection::vec(any::<(prop::sample::Index, u8, u8)>(), 1..6)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(128)))]

        #[test]
        fn specs_round_trip_and_leave_stdin_unread(
            (spec, files) in spec(),
            stdin in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            let header = encode_header(&spec).expect("encode");
            let bytes = stream(header, &files, &stdin);
            let mut r = Cursor::new(&bytes[..]);
            let (got, got_files) = read_request(&mut r).expect("a valid request reads");
            prop_assert_eq!(
                serde_json::to_value(&got).expect("json"),
                serde_json::to_value(&spec).expect("json")
            );
            prop_assert_eq!(got_files, files);
            prop_assert_eq!(&bytes[r.position() as usize..], &stdin[..]);
        }

        #[test]
        fn handovers_round_trip_and_leave_stdin_unread(
            (h, files) in handover(),
            stdin in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            let header = encode_handover(&h).expect("encode");
            let bytes = stream(header, &files, &stdin);
            let mut r = Cursor::new(&bytes[..]);
            let (got, got_files) = read_handover(&mut r).expect("a valid hand-over reads");
            prop_assert_eq!(
                serde_json::to_value(&got).expect("json"),
                serde_json::to_value(&h).expect("json")
            );
            prop_assert_eq!(got_files, files);
            prop_assert_eq!(&bytes[r.position() as usize..], &stdin[..]);
        }

        #[test]
        fn truncated_specs_and_handovers_are_errors(
            (spec, files) in spec(),
            (h, hfiles) in handover(),
            cut in any::<prop::sample::Index>(),
        ) {
            let bytes = stream(encode_header(&spec).expect("encode"), &files, &[]);
            let at = cut.index(bytes.len());
            prop_assert!(read_request(&mut &bytes[..at]).is_err(), "cut at {}", at);
            let bytes = stream(encode_handover(&h).expect("encode"), &hfiles, &[]);
            let at = cut.index(bytes.len());
            prop_assert!(read_handover(&mut &bytes[..at]).is_err(), "cut at {}", at);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = read_request(&mut &bytes[..]);
            let _ = read_handover(&mut &bytes[..]);
            // The same bytes behind a length that matches them.
            let mut framed = (bytes.len() as u32).to_le_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            let _ = read_request(&mut &framed[..]);
            let _ = read_handover(&mut &framed[..]);
        }

        #[test]
        fn mutated_frames_never_panic(
            (spec, files) in spec(),
            (h, hfiles) in handover(),
            edits in edits(),
        ) {
            let mut bytes = stream(encode_header(&spec).expect("encode"), &files, b"in");
            mutate(&mut bytes, edits.clone());
            let _ = read_request(&mut &bytes[..]);
            let mut bytes = stream(encode_handover(&h).expect("encode"), &hfiles, b"in");
            mutate(&mut bytes, edits);
            let _ = read_handover(&mut &bytes[..]);
        }

        /// A header may announce any file size: one that no stream delivers is an error,
        /// never an allocation of that size.
        #[test]
        fn announced_file_sizes_are_not_trusted(
            (mut h, _) in handover(),
            sizes in proptest::collection::vec(prop_oneof![0u64..20, any::<u64>()], 1..3),
            tail in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            h.files = sizes.iter().enumerate().map(|(i, s)| (format!("f{i}"), *s)).collect();
            let mut bytes = encode_handover(&h).expect("encode");
            bytes.extend_from_slice(&tail);
            let delivered = sizes.iter().try_fold(0u64, |a, s| a.checked_add(*s));
            match read_handover(&mut &bytes[..]) {
                Ok((_, files)) => {
                    prop_assert_eq!(delivered, Some(files.iter().map(|f| f.len() as u64).sum()));
                    prop_assert!(delivered.unwrap_or(u64::MAX) <= tail.len() as u64);
                }
                Err(e) => prop_assert!(e.contains("reading file"), "{}", e),
            }
        }

        /// The report as the server reads it: one JSON value, then the workspace frames.
        #[test]
        fn reports_round_trip_with_a_trailer(
            report in report(),
            trailer in proptest::collection::vec(any::<u8>(), 0..32),
        ) {
            let mut bytes = serde_json::to_vec(&report).expect("encode");
            let json_len = bytes.len();
            bytes.extend_from_slice(&trailer);
            let mut values = serde_json::Deserializer::from_slice(&bytes).into_iter::<JailReport>();
            let got = values.next().expect("one value").expect("a valid report reads");
            prop_assert_eq!(got, report);
            prop_assert_eq!(values.byte_offset(), json_len);
        }

        #[test]
        fn arbitrary_reports_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut values = serde_json::Deserializer::from_slice(&bytes).into_iter::<JailReport>();
            let _ = values.next();
            let _ = bytes.get(values.byte_offset()..);
        }
    }
}
