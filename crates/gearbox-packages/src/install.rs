//! Running the installers: uv or pip for Python, npm for JavaScript. Each runs with a
//! cleared environment (PATH, a private HOME, the host's TLS and proxy variables), in its own
//! process group that is killed on timeout or when the caller goes away, and never runs
//! package code (npm `--ignore-scripts`; Python wheels only unless `allow_sdist`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{Ecosystem, Package, PackageError, PackagesConfig, PythonInstaller, Target};

/// Variables of the server's environment an installer may see: TLS roots and proxies.
const PASS_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
];

/// Installer error output kept in an error: the last lines, at most this many bytes.
const STDERR_KEEP: usize = 4000;

/// How a Python install is carried out.
#[derive(Debug, Clone)]
pub(crate) enum PyTool {
    Uv(PathBuf),
    Pip,
}

pub(crate) struct Installers {
    pub config: PackagesConfig,
    pub root: PathBuf,
    /// Installer processes started by this store (tests count them).
    pub runs: AtomicU64,
}

fn find_uv(config: &PackagesConfig) -> Option<PathBuf> {
    if let Some(p) = &config.uv {
        return Some(p.clone());
    }
    let mut candidates = Vec::new();
    if let Some(t) = std::env::var_os("GEARBOX_TOOLS_DIR") {
        candidates.push(PathBuf::from(t).join("bin/uv"));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    if let Some(c) = cache {
        candidates.push(c.join("gearbox/tools/bin/uv"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("uv")));
    }
    candidates.into_iter().find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn find_npm(config: &PackagesConfig) -> Option<PathBuf> {
    if let Some(p) = &config.npm {
        return Some(p.clone());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("npm"))
        .find(|p| is_executable(p))
}

impl Installers {
    pub fn python_tool(&self) -> Result<PyTool, PackageError> {
        match self.config.python_installer {
            PythonInstaller::Pip => Ok(PyTool::Pip),
            PythonInstaller::Uv => find_uv(&self.config).map(PyTool::Uv).ok_or_else(|| {
                PackageError::Unsupported(
                    "packages: uv is not installed (run scripts/setup-packages.sh or set \
                     packages.uv)"
                        .into(),
                )
            }),
            PythonInstaller::Auto => Ok(find_uv(&self.config).map_or(PyTool::Pip, PyTool::Uv)),
        }
    }

    /// Short name of the installer used for `eco` (recorded in a layer's metadata).
    pub fn describe(&self, eco: Ecosystem) -> String {
        match eco {
            Ecosystem::Python => match self.python_tool() {
                Ok(PyTool::Uv(p)) => format!("uv ({})", p.display()),
                Ok(PyTool::Pip) => "pip".into(),
                Err(_) => "none".into(),
            },
            Ecosystem::Node => find_npm(&self.config)
                .map_or_else(|| "none".into(), |p| format!("npm ({})", p.display())),
        }
    }

    fn base_command(&self, program: &Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(program);
        cmd.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.root.join("home"))
            .env("NO_COLOR", "1")
            .env("LANG", "C.UTF-8");
        for k in PASS_ENV {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        cmd
    }

    fn python_command(
        &self,
        target: &Target,
        reqs: &[String],
        out: &Path,
        dry_run: bool,
    ) -> Result<tokio::process::Command, PackageError> {
        let tool = self.python_tool()?;
        let cfg = &self.config;
        let mut cmd = match &tool {
            PyTool::Uv(uv) => {
                let mut c = self.base_command(uv);
                c.env("UV_CACHE_DIR", self.root.join("cache/uv"))
                    .env("UV_PYTHON_DOWNLOADS", "never")
                    .arg("pip")
                    .arg(if dry_run { "compile" } else { "install" });
                c.args(["--no-config", "--native-tls", "--python"])
                    .arg(&target.interpreter);
                if dry_run {
                    c.args(["--no-header", "--no-annotate", "--quiet"]);
                } else {
                    c.args(["--link-mode", "copy", "--target"]).arg(out);
                }
                if !cfg.allow_sdist {
                    c.args(["--only-binary", ":all:"]);
                }
                for (i, url) in cfg.python_index_urls.iter().enumerate() {
                    c.arg(if i == 0 {
                        "--index-url"
                    } else {
                        "--extra-index-url"
                    })
                    .arg(url);
                }
                c
            }
            PyTool::Pip => {
                let mut c = self.base_command(&target.interpreter);
                c.args([
                    "-m",
                    "pip",
                    "install",
                    "--isolated",
                    "--no-input",
                    "--disable-pip-version-check",
                    "--root-user-action=ignore",
                    "--cache-dir",
                ])
                .arg(self.root.join("cache/pip"));
                if let Some(cert) = std::env::var_os("SSL_CERT_FILE") {
                    c.arg("--cert").arg(cert);
                }
                if dry_run {
                    c.args([
                        "--dry-run",
                        "--ignore-installed",
                        "--quiet",
                        "--report",
                        "-",
                    ]);
                } else {
                    c.args(["--quiet", "--target"]).arg(out);
                }
                if !cfg.allow_sdist {
                    c.arg("--only-binary=:all:");
                }
                for (i, url) in cfg.python_index_urls.iter().enumerate() {
                    c.arg(if i == 0 {
                        "--index-url"
                    } else {
                        "--extra-index-url"
                    })
                    .arg(url);
                }
                c
            }
        };
        match (&tool, dry_run) {
            // uv pip compile reads requirements from a file: stdin.
            (PyTool::Uv(_), true) => {
                cmd.arg("-").stdin(Stdio::piped());
            }
            _ => {
                cmd.arg("--").args(reqs);
            }
        }
        Ok(cmd)
    }

    fn npm_command(
        &self,
        reqs: &[String],
        prefix: &Path,
        dry_run: bool,
    ) -> Result<tokio::process::Command, PackageError> {
        let npm = find_npm(&self.config).ok_or_else(|| {
            PackageError::Unsupported(
                "packages: npm is not installed on this server (run scripts/setup-packages.sh)"
                    .into(),
            )
        })?;
        let mut c = self.base_command(&npm);
        c.arg("install")
            .arg("--prefix")
            .arg(prefix)
            .args([
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--update-notifier=false",
                "--loglevel=error",
                "--fetch-retries=1",
                "--omit=dev",
                "--cache",
            ])
            .arg(self.root.join("cache/npm"));
        if dry_run {
            c.arg("--package-lock-only");
        }
        if let Some(r) = &self.config.npm_registry {
            c.arg("--registry").arg(r);
        }
        c.arg("--").args(reqs);
        Ok(c)
    }

    /// Run one installer to completion within the timeout; `Ok(stdout)` on success.
    async fn run(
        &self,
        mut cmd: tokio::process::Command,
        stdin: Option<String>,
        reqs: &[String],
    ) -> Result<String, PackageError> {
        let label = reqs.join(" ");
        let io = |e: std::io::Error| {
            PackageError::Unsupported(format!("packages: cannot start the installer: {e}"))
        };
        self.runs.fetch_add(1, Ordering::SeqCst);
        let mut child = cmd.spawn().map_err(io)?;
        let group = GroupKiller(child.id().map(|p| p as i32));
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            use tokio::io::AsyncWriteExt;
            let _ = pipe.write_all(text.as_bytes()).await;
        }
        let timeout = Duration::from_millis(self.config.install_timeout_ms);
        let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(r) => r.map_err(io)?,
            Err(_) => {
                drop(group);
                return Err(PackageError::Timeout {
                    requirements: label,
                    timeout_ms: self.config.install_timeout_ms,
                });
            }
        };
        drop(group);
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
        if text.trim().is_empty() {
            text = String::from_utf8_lossy(&out.stdout).into_owned();
        }
        Err(PackageError::InstallFailed {
            requirements: label,
            status: out.status.to_string(),
            stderr: trim_tail(&text),
        })
    }

    /// Install `reqs` into `dir` (which exists and is empty).
    pub async fn install(
        &self,
        target: &Target,
        reqs: &[String],
        dir: &Path,
    ) -> Result<(), PackageError> {
        let cmd = match target.ecosystem {
            Ecosystem::Python => self.python_command(target, reqs, &dir.join("site"), false)?,
            Ecosystem::Node => self.npm_command(reqs, dir, false)?,
        };
        self.run(cmd, None, reqs).await.map(|_| ())
    }

    /// What installing `reqs` would install, without installing: `uv pip compile`,
    /// `pip install --dry-run --report`, or an npm lock file written into `scratch`.
    pub async fn resolve(
        &self,
        target: &Target,
        reqs: &[String],
        scratch: &Path,
    ) -> Result<Vec<Package>, PackageError> {
        match target.ecosystem {
            Ecosystem::Python => {
                let tool = self.python_tool()?;
                let cmd = self.python_command(target, reqs, scratch, true)?;
                let stdin = matches!(tool, PyTool::Uv(_)).then(|| reqs.join("\n") + "\n");
                let out = self.run(cmd, stdin, reqs).await?;
                Ok(match tool {
                    PyTool::Uv(_) => parse_pinned(&out),
                    PyTool::Pip => parse_pip_report(&out),
                })
            }
            Ecosystem::Node => {
                let cmd = self.npm_command(reqs, scratch, true)?;
                self.run(cmd, None, reqs).await?;
                Ok(npm_lock_packages(&scratch.join("package-lock.json")))
            }
        }
    }
}

/// Kills the installer's whole process group when dropped (timeout, cancelled call).
struct GroupKiller(Option<i32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The end of an installer's output, where its error is.
pub(crate) fn trim_tail(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.contains("A complete log of this run"))
        .collect();
    let mut out = String::new();
    for line in lines.iter().rev() {
        if out.len() + line.len() + 1 > STDERR_KEEP {
            out.insert_str(0, "…\n");
            break;
        }
        out.insert_str(0, &format!("{line}\n"));
    }
    out.trim_end().to_string()
}

/// `name==version` lines (uv pip compile).
fn parse_pinned(text: &str) -> Vec<Package> {
    let mut v: Vec<Package> = text
        .lines()
        .filter_map(|l| {
            let l = l.split('#').next()?.trim();
            let (n, ver) = l.split_once("==")?;
            let n = n.split('[').next()?.trim();
            Some(Package {
                name: n.to_string(),
                version: ver.split(';').next()?.trim().to_string(),
            })
        })
        .collect();
    v.sort();
    v
}

/// pip's `--report -` JSON.
fn parse_pip_report(text: &str) -> Vec<Package> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text.trim()) else {
        return Vec::new();
    };
    let mut out: Vec<Package> = v["install"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| {
            Some(Package {
                name: i["metadata"]["name"].as_str()?.to_string(),
                version: i["metadata"]["version"].as_str()?.to_string(),
            })
        })
        .collect();
    out.sort();
    out
}

/// Packages of an npm lock file (`package-lock.json` or `node_modules/.package-lock.json`).
pub(crate) fn npm_lock_packages(path: &Path) -> Vec<Package> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let mut out: Vec<Package> = v["packages"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, p)| {
            let name = k.rsplit("node_modules/").next().filter(|n| !n.is_empty())?;
            Some(Package {
                name: name.to_string(),
                version: p["version"].as_str()?.to_string(),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Distributions installed in a Python `--target` directory (their `.dist-info` METADATA).
pub(crate) fn python_site_packages(site: &Path) -> Vec<Package> {
    let Ok(entries) = std::fs::read_dir(site) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".dist-info") {
            continue;
        }
        let Ok(meta) = std::fs::read_to_string(e.path().join("METADATA")) else {
            continue;
        };
        let field = |f: &str| {
            meta.lines()
                .take_while(|l| !l.is_empty())
                .find_map(|l| l.strip_prefix(f).map(|v| v.trim().to_string()))
        };
        if let (Some(n), Some(v)) = (field("Name:"), field("Version:")) {
            out.push(Package {
                name: n,
                version: v,
            });
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_keeps_the_end_and_drops_log_pointers() {
        let long: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let t = trim_tail(
            &(long + "npm error A complete log of this run can be found in: x\nERROR: the end\n"),
        );
        assert!(t.ends_with("ERROR: the end"), "{t}");
        assert!(t.starts_with('…'));
        assert!(t.len() <= STDERR_KEEP + 8);
    }

    #[test]
    fn parses_pins_and_reports() {
        let p = parse_pinned("attrs==26.1.0\nsix==1.17.0 ; python_version >= '3'\n# x\n");
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].version, "1.17.0");
        let r = parse_pip_report(r#"{"install":[{"metadata":{"name":"six","version":"1.17.0"}}]}"#);
        assert_eq!(
            r,
            vec![Package {
                name: "six".into(),
                version: "1.17.0".into()
            }]
        );
    }
}
