//! What a caller asks for ([`ExecRequest`]) and what a backend receives ([`Job`]): the request
//! after validation, with the language resolved, the limits fixed and the files decoded.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::language::ResolvedLanguage;
use crate::limits::{LimitOverrides, Limits};
use crate::names::validate_relative_path;

/// Where a warm sandbox's launcher script lives inside the sandbox.
pub const LAUNCHER_PATH: &str = "/.gearbox/launcher";
/// The host uid and gid a sandbox's user maps to when the server runs as root (`nobody`):
/// never host root. Unprivileged, a sandbox maps to the server's own ids.
pub const SANDBOX_HOST_ID: u32 = 65534;

/// Most files one call may bring.
pub const MAX_FILES: usize = 256;
/// Most environment variables one call may set.
pub const MAX_ENV: usize = 128;
/// Most arguments one call may pass.
pub const MAX_ARGS: usize = 256;
/// Most bytes of one argument, or of one variable (`NAME=value`): the kernel's bound on one
/// string an `execve` passes (`MAX_ARG_STRLEN`, 32 pages, its NUL included). A program started
/// by `execve` could not be given more; one started warm could, so every run is held to it.
pub const MAX_ARG_BYTES: usize = 128 * 1024 - 1;
/// Most bytes of the command line and the environment together, NULs counted: half of what
/// an `execve` takes with the sandbox's 8 MiB stack, the rest left to the sandbox's own
/// variables.
pub const MAX_ARGV_ENV_BYTES: usize = 1024 * 1024;

/// How a file's `content` is encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// One extra file to place in the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileInput {
    /// Path relative to the workspace; no absolute paths, `..` or NUL.
    pub filename: String,
    /// File content, as text or base64 (see `encoding`).
    pub content: String,
    /// `utf8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Encoding,
}

/// A request to run code, independent of transport and backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecRequest {
    pub language: String,
    pub code: String,
    pub entrypoint: Option<String>,
    pub files: Vec<FileInput>,
    pub stdin: Vec<u8>,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub limits: LimitOverrides,
    /// The network the run asks for (granted only by policy; after the gear, what it gets).
    pub network: crate::Network,
    /// Host paths the server (never the caller) mounts read-only at the same place: package
    /// layers, the broker's per-run socket directory.
    pub mounts: Vec<PathBuf>,
    /// Packages the program imports (`six`, `numpy==2.*`, `is-number@^7`): the engine
    /// installs them outside the sandbox into a cached layer, adds the layer to `mounts` and
    /// its path to the environment before the job is built.
    pub packages: Vec<String>,
}

/// A file a backend writes into the workspace before the program starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFile {
    /// Validated relative path.
    pub path: String,
    pub content: Vec<u8>,
}

/// A validated request, ready for a backend. [`Job::build`] makes one from a request;
/// `Default` (an empty job) is for the fixed jobs of probes, tests and benches, which name
/// only what they set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    pub language: String,
    /// Command line: the interpreter, its arguments, the entrypoint, the call's args.
    pub argv: Vec<String>,
    /// The entrypoint (workspace-relative) followed by the call's args: what a warm launcher
    /// receives as the program's argv.
    pub program_argv: Vec<String>,
    /// For the warm pool: the language's built-in launcher name and the command that starts
    /// it at [`LAUNCHER_PATH`]; `None` when the language has no launcher.
    pub launcher: Option<(String, Vec<String>)>,
    /// Environment of the language plus the call's; the backend adds PATH, HOME, TMPDIR and
    /// substitutes `{workspace}` and `{tmp}`. Nothing of the server's environment is here.
    pub env: BTreeMap<String, String>,
    /// Files to write into the workspace, the entrypoint first.
    pub files: Vec<JobFile>,
    pub stdin: Vec<u8>,
    pub limits: Limits,
    /// Host paths to mount read-only at the same place (interpreter prefixes and the like).
    pub mounts: Vec<PathBuf>,
    /// A granted run's egress proxy socket (its directory is in `mounts`): the sandbox
    /// relays `127.0.0.1:`[`crate::EGRESS_PROXY_PORT`] to it. `None`: no network at all.
    pub egress: Option<PathBuf>,
    /// A granted run's variables from its egress proxy: the proxy settings, the trust store
    /// holding the run's CA, the secrets' placeholders. Kept apart from `env` (which wins
    /// where both name a variable) so a warm sandbox built for granted runs can be matched
    /// on `env` alone and these, which differ per run, given at hand-over.
    pub egress_env: BTreeMap<String, String>,
}

impl Job {
    /// The variables the program gets from the job (before the sandbox's own): the egress
    /// proxy's, then `env` over them.
    pub fn program_vars(&self) -> BTreeMap<String, String> {
        let mut vars = self.egress_env.clone();
        vars.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        vars
    }

    /// Validate `req` against `lang` and the configured maxima. Every error names the field.
    pub fn build(req: &ExecRequest, lang: &ResolvedLanguage, max: &Limits) -> Result<Job, String> {
        let limits = max.lowered_by(&req.limits)?;
        let entry = req
            .entrypoint
            .clone()
            .unwrap_or_else(|| lang.spec.entrypoint.clone());
        validate_relative_path("entrypoint_filename", &entry).map_err(|e| e.to_string())?;
        if req.files.len() > MAX_FILES {
            return Err(format!("additional_files: at most {MAX_FILES} files"));
        }
        if req.args.len() > MAX_ARGS {
            return Err(format!("args: at most {MAX_ARGS} arguments"));
        }
        if let Some(i) = req.args.iter().position(|a| a.contains('\0')) {
            return Err(format!("args[{i}] contains a NUL byte"));
        }
        if req.env.len() > MAX_ENV {
            return Err(format!("env: at most {MAX_ENV} variables"));
        }
        for (k, v) in &req.env {
            if !valid_env_name(k) {
                return Err(format!(
                    "env: {k:?} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
                ));
            }
            if v.contains('\0') {
                return Err(format!("env.{k} contains a NUL byte"));
            }
        }
        let mut files = vec![JobFile {
            path: entry.clone(),
            content: req.code.clone().into_bytes(),
        }];
        for (i, f) in req.files.iter().enumerate() {
            let field = format!("additional_files[{i}].filename");
            validate_relative_path(&field, &f.filename).map_err(|e| e.to_string())?;
            if files.iter().any(|j| j.path == f.filename) {
                return Err(format!(
                    "{field}: {:?} is given twice (or is the entrypoint)",
                    f.filename
                ));
            }
            let content = match f.encoding {
                Encoding::Utf8 => f.content.clone().into_bytes(),
                Encoding::Base64 => base64::engine::general_purpose::STANDARD
                    .decode(f.content.trim())
                    .map_err(|e| {
                        format!("additional_files[{i}].content is not valid base64: {e}")
                    })?,
            };
            files.push(JobFile {
                path: f.filename.clone(),
                content,
            });
        }
        let total: u64 = files.iter().map(|f| f.content.len() as u64).sum();
        if total > limits.disk_mb * 1024 * 1024 {
            return Err(format!(
                "code and additional_files total {total} bytes, more than the workspace's {} MiB",
                limits.disk_mb
            ));
        }
        let mut env = lang.spec.env.clone();
        env.extend(req.env.clone());
        if let Some((i, a)) = req
            .args
            .iter()
            .enumerate()
            .find(|(_, a)| a.len() > MAX_ARG_BYTES)
        {
            return Err(format!(
                "args[{i}] is {} bytes; an argument may be at most {MAX_ARG_BYTES}",
                a.len()
            ));
        }
        if let Some((k, v)) = env
            .iter()
            .find(|(k, v)| k.len() + 1 + v.len() > MAX_ARG_BYTES)
        {
            return Err(format!(
                "env.{k} is {} bytes with its name; a variable may be at most {MAX_ARG_BYTES}",
                k.len() + 1 + v.len()
            ));
        }
        let argv = lang.argv(&entry, &req.args);
        let bytes: usize = argv.iter().map(|a| a.len() + 1).sum::<usize>()
            + env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        if bytes > MAX_ARGV_ENV_BYTES {
            return Err(format!(
                "args and env take {bytes} bytes together; at most {MAX_ARGV_ENV_BYTES}"
            ));
        }
        Ok(Job {
            language: lang.name.clone(),
            argv,
            program_argv: std::iter::once(entry.clone())
                .chain(req.args.iter().cloned())
                .collect(),
            launcher: lang
                .spec
                .launcher
                .clone()
                .zip(lang.launcher_argv(LAUNCHER_PATH)),
            env,
            files,
            stdin: req.stdin.clone(),
            limits,
            mounts: lang
                .mounts
                .iter()
                .chain(req.mounts.iter())
                .cloned()
                .collect(),
            egress: None,
            egress_env: BTreeMap::new(),
        })
    }
}

fn valid_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        && k.len() <= 256
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::language::LanguageTable;

    fn bash() -> ResolvedLanguage {
        LanguageTable::builtin().resolve("bash").expect("bash")
    }

    fn req() -> ExecRequest {
        ExecRequest {
            language: "bash".into(),
            code: "echo hi".into(),
            ..Default::default()
        }
    }

    #[test]
    fn builds_entrypoint_first_and_decodes_base64() {
        let mut r = req();
        r.files.push(FileInput {
            filename: "data/x.bin".into(),
            content: "AAEC".into(),
            encoding: Encoding::Base64,
        });
        let job = Job::build(&r, &bash(), &Limits::default()).expect("valid");
        assert_eq!(job.files[0].path, "main.sh");
        assert_eq!(job.files[1].content, vec![0, 1, 2]);
        assert_eq!(job.argv.last().map(String::as_str), Some("main.sh"));
    }

    #[test]
    fn traversal_bad_env_and_bad_base64_are_refused_with_the_field() {
        let mut r = req();
        r.files.push(FileInput {
            filename: "../../etc/passwd".into(),
            content: String::new(),
            encoding: Encoding::Utf8,
        });
        let e = Job::build(&r, &bash(), &Limits::default()).expect_err("traversal");
        assert!(e.contains("additional_files[0].filename"), "{e}");

        let mut r = req();
        r.env.insert("A=B".into(), "x".into());
        assert!(
            Job::build(&r, &bash(), &Limits::default())
                .expect_err("env")
                .contains("env")
        );

        let mut r = req();
        r.files.push(FileInput {
            filename: "x".into(),
            content: "!!!".into(),
            encoding: Encoding::Base64,
        });
        let e = Job::build(&r, &bash(), &Limits::default()).expect_err("b64");
        assert!(e.contains("additional_files[0].content"), "{e}");

        let mut r = req();
        r.entrypoint = Some("/tmp/x.sh".into());
        let e = Job::build(&r, &bash(), &Limits::default()).expect_err("abs");
        assert!(e.contains("entrypoint_filename"), "{e}");
    }

    /// What an `execve` could not pass is refused up front, on every path alike (a warm
    /// program, started before its arguments were known, could be given it).
    #[test]
    fn arguments_and_variables_an_exec_could_not_pass_are_refused() {
        let ok = |r: &ExecRequest| Job::build(r, &bash(), &Limits::default());
        let mut r = req();
        r.args = vec!["a".into(), "x".repeat(MAX_ARG_BYTES)];
        r.env.insert("V".into(), "y".repeat(MAX_ARG_BYTES - 2));
        assert!(ok(&r).is_ok());
        r.args[1].push('x');
        let e = ok(&r).expect_err("one argument too long");
        assert!(e.starts_with("args[1] is 131072 bytes"), "{e}");
        r.args[1].pop();
        r.env.insert("V".into(), "y".repeat(MAX_ARG_BYTES - 1));
        let e = ok(&r).expect_err("one variable too long");
        assert!(e.starts_with("env.V is 131072 bytes"), "{e}");
        let mut r = req();
        r.args = vec!["x".repeat(MAX_ARG_BYTES); 8];
        let e = ok(&r).expect_err("too much together");
        assert!(e.starts_with("args and env take "), "{e}");
        assert!(e.ends_with("at most 1048576"), "{e}");
    }

    #[test]
    fn duplicate_file_names_are_refused() {
        let mut r = req();
        r.files.push(FileInput {
            filename: "main.sh".into(),
            content: String::new(),
            encoding: Encoding::Utf8,
        });
        assert!(Job::build(&r, &bash(), &Limits::default()).is_err());
    }
}
