//! Languages as data: how to find an interpreter, how to run a file, what it needs mounted.
//!
//! The built-in table lives in `languages.toml`; configuration may add or replace entries.
//! Interpreters are detected on the host: shims (a script on PATH such as pyenv's) are resolved
//! to the real binary, whose install prefix is mounted when it lies outside the base root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

const BUILTIN: &str = include_str!("languages.toml");

/// Host directories every Linux sandbox already mounts read-only; an interpreter under one of
/// these needs no extra mount.
pub const BASE_ROOT_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"];

/// One language, as configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LanguageSpec {
    /// File extensions (without the dot) that select this language for `gearbox run FILE` and
    /// for snippets.
    pub extensions: Vec<String>,
    /// Entrypoint file name used when the call does not give one.
    pub entrypoint: String,
    /// Interpreter candidates in order of preference: absolute paths or names looked up on PATH.
    pub interpreters: Vec<String>,
    /// Arguments that make a shim print the real executable's path on its first line; used
    /// only when a candidate is a script.
    #[serde(default)]
    pub resolve_args: Vec<String>,
    /// Arguments that make the interpreter print its version.
    #[serde(default)]
    pub version_args: Vec<String>,
    /// Command line; `{interpreter}` and `{entrypoint}` are replaced and the call's `args`
    /// are appended.
    pub command: Vec<String>,
    /// Environment the language needs; `{workspace}` and `{tmp}` are replaced by the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Extra host paths mounted read-only at the same place inside the sandbox.
    #[serde(default)]
    pub mounts: Vec<PathBuf>,
    /// Warm pool: command that starts the interpreter with a built-in launcher (`{launcher}`
    /// is its path inside the sandbox) which waits for the program and runs it in-process.
    /// Empty: pooled sandboxes of this language are pre-built up to the program's exec.
    #[serde(default)]
    pub launcher_command: Vec<String>,
    /// Name of the built-in launcher script (`python`, `node`); required with
    /// `launcher_command`.
    #[serde(default)]
    pub launcher: Option<String>,
}

/// A language whose interpreter was found on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLanguage {
    pub name: String,
    pub spec: LanguageSpec,
    /// Canonical path of the real interpreter binary.
    pub interpreter: PathBuf,
    /// Host paths the sandbox must mount read-only: the spec's mounts plus the interpreter's
    /// install prefix when it lies outside the base root.
    pub mounts: Vec<PathBuf>,
}

impl ResolvedLanguage {
    /// The argv for running `entrypoint` with `args`.
    pub fn argv(&self, entrypoint: &str, args: &[String]) -> Vec<String> {
        let interp = self.interpreter.to_string_lossy();
        let mut argv: Vec<String> = self
            .spec
            .command
            .iter()
            .map(|a| {
                a.replace("{interpreter}", &interp)
                    .replace("{entrypoint}", entrypoint)
            })
            .collect();
        argv.extend(args.iter().cloned());
        argv
    }

    /// The launcher command line with `{launcher}` at `path`, when the language has one.
    pub fn launcher_argv(&self, path: &str) -> Option<Vec<String>> {
        if self.spec.launcher.is_none() || self.spec.launcher_command.is_empty() {
            return None;
        }
        let interp = self.interpreter.to_string_lossy();
        Some(
            self.spec
                .launcher_command
                .iter()
                .map(|a| {
                    a.replace("{interpreter}", &interp)
                        .replace("{launcher}", path)
                })
                .collect(),
        )
    }

    /// Ask the interpreter for its version (first non-empty line of its output).
    pub fn version(&self) -> Option<String> {
        if self.spec.version_args.is_empty() {
            return None;
        }
        let out = Command::new(&self.interpreter)
            .args(&self.spec.version_args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        text.lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
    }
}

/// The set of configured languages, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct LanguageTable {
    pub languages: BTreeMap<String, LanguageSpec>,
}

impl Default for LanguageTable {
    fn default() -> Self {
        Self::builtin()
    }
}

impl LanguageTable {
    /// The built-in table (python, javascript, go, bash).
    pub fn builtin() -> Self {
        // The table is compiled in and covered by a test; failing to parse it is a build bug.
        #[allow(clippy::expect_used)]
        let languages = toml::from_str(BUILTIN).expect("built-in languages.toml parses");
        LanguageTable { languages }
    }

    /// Add or replace entries from configuration.
    pub fn merge(&mut self, other: BTreeMap<String, LanguageSpec>) {
        self.languages.extend(other);
    }

    pub fn get(&self, name: &str) -> Option<&LanguageSpec> {
        self.languages.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.languages.keys().map(String::as_str)
    }

    /// A language name as a caller wrote it ("Python", "js", "golang", or an extension such
    /// as "py") to a configured name; an unknown one is an error naming the field and the
    /// configured languages.
    pub fn normalize(&self, raw: &str) -> Result<String, String> {
        let l = raw.trim().to_ascii_lowercase();
        if self.get(&l).is_some() {
            return Ok(l);
        }
        let alias = match l.as_str() {
            "node" | "nodejs" | "node.js" | "js" => "javascript",
            "python3" | "py" => "python",
            "golang" => "go",
            "sh" | "shell" => "bash",
            _ => "",
        };
        if !alias.is_empty() && self.get(alias).is_some() {
            return Ok(alias.to_string());
        }
        if let Some(name) = self.by_extension(&l) {
            return Ok(name.to_string());
        }
        Err(format!(
            "language: unknown language {raw:?}; available: {}",
            self.names().collect::<Vec<_>>().join(", ")
        ))
    }

    /// The language a file extension selects.
    pub fn by_extension(&self, ext: &str) -> Option<&str> {
        self.languages
            .iter()
            .find(|(_, spec)| spec.extensions.iter().any(|e| e.eq_ignore_ascii_case(ext)))
            .map(|(name, _)| name.as_str())
    }

    /// Find the interpreter of `name` on this host.
    pub fn resolve(&self, name: &str) -> Result<ResolvedLanguage, String> {
        let spec = self.get(name).ok_or_else(|| {
            format!(
                "unknown language {name:?}; configured: {}",
                self.names().collect::<Vec<_>>().join(", ")
            )
        })?;
        let interpreter = find_interpreter(spec).ok_or_else(|| {
            format!(
                "no interpreter for {name} on this host (tried {})",
                spec.interpreters.join(", ")
            )
        })?;
        let mut mounts = spec.mounts.clone();
        if let Some(prefix) = install_prefix(&interpreter) {
            mounts.push(prefix);
        }
        Ok(ResolvedLanguage {
            name: name.to_string(),
            spec: spec.clone(),
            interpreter,
            mounts,
        })
    }
}

fn find_interpreter(spec: &LanguageSpec) -> Option<PathBuf> {
    spec.interpreters.iter().find_map(|cand| {
        let path = if cand.contains('/') {
            PathBuf::from(cand)
        } else {
            search_path(cand)?
        };
        let real = std::fs::canonicalize(&path).ok()?;
        if !is_executable(&real) {
            return None;
        }
        if is_script(&real) {
            // A shim: ask it where the real interpreter is.
            if spec.resolve_args.is_empty() {
                return None;
            }
            let out = Command::new(&path).args(&spec.resolve_args).output().ok()?;
            let first = String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()?
                .trim()
                .to_string();
            let real = std::fs::canonicalize(first).ok()?;
            return (is_executable(&real) && !is_script(&real)).then_some(real);
        }
        Some(real)
    })
}

fn search_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn is_script(p: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .map(|_| &head == b"#!")
        .unwrap_or(false)
}

/// The install prefix (parent of `bin/`) of an interpreter outside the base root.
fn install_prefix(interp: &Path) -> Option<PathBuf> {
    if BASE_ROOT_DIRS.iter().any(|d| interp.starts_with(d)) {
        return None;
    }
    let bin = interp.parent()?;
    if bin.file_name()? == "bin" {
        bin.parent().map(Path::to_path_buf)
    } else {
        Some(bin.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn language_names_are_forgiving_but_not_silent() {
        let t = LanguageTable::builtin();
        assert_eq!(t.normalize("Python").as_deref(), Ok("python"));
        assert_eq!(t.normalize("JavaScript").as_deref(), Ok("javascript"));
        assert_eq!(t.normalize("js").as_deref(), Ok("javascript"));
        assert_eq!(t.normalize("golang").as_deref(), Ok("go"));
        assert_eq!(t.normalize("sh").as_deref(), Ok("bash"));
        let e = t.normalize("cobol").expect_err("unknown");
        assert!(e.starts_with("language:") && e.contains("python"), "{e}");
    }

    #[test]
    fn builtin_table_has_the_four_languages() {
        let t = LanguageTable::builtin();
        for lang in ["python", "javascript", "go", "bash"] {
            assert!(t.get(lang).is_some(), "{lang}");
        }
        assert_eq!(t.by_extension("py"), Some("python"));
        assert_eq!(t.by_extension("MJS"), Some("javascript"));
        assert_eq!(t.by_extension("rb"), None);
    }

    #[test]
    fn bash_resolves_and_builds_argv() {
        let t = LanguageTable::builtin();
        let bash = t.resolve("bash").expect("bash is on every host");
        let argv = bash.argv("main.sh", &["a b".into()]);
        assert!(argv[0].ends_with("bash"), "{argv:?}");
        assert_eq!(&argv[1..], ["main.sh", "a b"]);
    }

    #[test]
    fn unknown_language_is_a_clear_error() {
        let err = LanguageTable::builtin()
            .resolve("cobol")
            .expect_err("unknown");
        assert!(err.contains("cobol") && err.contains("python"), "{err}");
    }

    #[test]
    fn prefix_of_interpreters_outside_usr() {
        assert_eq!(install_prefix(Path::new("/usr/bin/python3")), None);
        assert_eq!(
            install_prefix(Path::new("/opt/py/3.11/bin/python3.11")),
            Some(PathBuf::from("/opt/py/3.11"))
        );
    }
}
