//! Resources: what a model reads to write code that works here.
//!
//! - `gearbox://env` (JSON) and `env://info` (the same as plain text, the sidecar's name):
//!   languages with their versions, backend, limits, workspace layout, tool profiles.
//! - `gearbox://snippets` (JSON index) and `gearbox://snippets/{name}` (a snippet's source).
//! - `gearbox://packages/{language}` (JSON): what `language` imports without `packages`, the
//!   cached package layers, and the package policy.

use gearbox_engine::Engine;
use gearbox_engine::config::ToolProfile;
use rmcp::ErrorData as McpError;
use rmcp::model::{ReadResourceResult, Resource, ResourceContents, ResourceTemplate};
use serde_json::{Value, json};

use crate::snippets;

pub const ENV_URI: &str = "gearbox://env";
pub const ENV_INFO_URI: &str = "env://info";
pub const SNIPPETS_URI: &str = "gearbox://snippets";
pub const SNIPPET_PREFIX: &str = "gearbox://snippets/";
pub const SNIPPET_TEMPLATE: &str = "gearbox://snippets/{name}";
pub const PACKAGES_PREFIX: &str = "gearbox://packages/";
pub const PACKAGES_TEMPLATE: &str = "gearbox://packages/{language}";

/// Working directory and workspace of every run, as the program sees it.
pub const WORKSPACE_DIR: &str = "/work";
/// Scratch directory of every run.
pub const SCRATCH_DIR: &str = "/tmp";

/// The environment document behind `gearbox://env`. `languages` is `Engine::languages(true)`,
/// computed once per process (it starts each interpreter to ask its version).
pub fn env_document(engine: &Engine, profiles: &[ToolProfile], languages: &Value) -> Value {
    let config = engine.config();
    json!({
        "server": { "name": "gearbox", "version": env!("CARGO_PKG_VERSION") },
        "backend": config.backend,
        "backends": engine.backend_kinds(),
        "languages": languages,
        "limits": config.limits,
        "limits_note": "maxima per run; a call may lower timeout_ms and memory_mb, never raise them",
        "workspace": {
            "cwd": WORKSPACE_DIR,
            "workspace": WORKSPACE_DIR,
            "scratch": SCRATCH_DIR,
            "network": false,
            "persistence": "none: every call runs in a fresh sandbox that is destroyed afterwards",
            "files": "additional_files are written under the workspace before the program starts",
        },
        "profiles": profiles.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
        "snippets_dir": config.snippets_dir,
    })
}

/// `env://info`: the environment document as short plain text.
pub fn env_text(doc: &Value) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "gearbox {}\nbackend: {}\n",
        doc["server"]["version"].as_str().unwrap_or("?"),
        doc["backend"].as_str().unwrap_or("?")
    ));
    s.push_str("languages:\n");
    for l in doc["languages"].as_array().into_iter().flatten() {
        let name = l["name"].as_str().unwrap_or("?");
        match (l["version"].as_str(), l["unavailable"].as_str()) {
            (_, Some(why)) => s.push_str(&format!("  {name}: unavailable ({why})\n")),
            (Some(v), None) => s.push_str(&format!("  {name}: {v}\n")),
            (None, None) => s.push_str(&format!("  {name}: available\n")),
        }
    }
    let limits = &doc["limits"];
    s.push_str(&format!(
        "limits: timeout {} ms, memory {} MiB, {} processes, output {} bytes per stream\n",
        limits["timeout_ms"], limits["memory_mb"], limits["pids"], limits["output_bytes"]
    ));
    s.push_str(&format!(
        "workspace: {WORKSPACE_DIR} (working directory), scratch: {SCRATCH_DIR}, network: none, \
         nothing persists between calls\n"
    ));
    s
}

/// Resources listed by `resources/list`: the environment, the snippet index and each snippet.
pub fn list(engine: &Engine, profiles: &[ToolProfile], tenant: &str) -> Vec<Resource> {
    let mut out = vec![
        Resource::new(ENV_URI, "env")
            .with_title("Execution environment")
            .with_description(
                "Languages and versions, backend, limits and workspace layout of the sandbox",
            )
            .with_mime_type("application/json"),
    ];
    if profiles.contains(&ToolProfile::Sidecar) {
        out.push(
            Resource::new(ENV_INFO_URI, "env-info")
                .with_title("Execution Environment Info")
                .with_description("Information about the current code execution environment")
                .with_mime_type("text/plain"),
        );
    }
    for language in ["python", "javascript"] {
        if engine.language_table().get(language).is_some() {
            out.push(
                Resource::new(
                    format!("{PACKAGES_PREFIX}{language}"),
                    format!("packages-{language}"),
                )
                .with_title(format!("{language} packages"))
                .with_description(format!(
                    "What {language} code imports without `packages`, and the package \
                         layers cached on this server"
                ))
                .with_mime_type("application/json"),
            );
        }
    }
    out.push(
        Resource::new(SNIPPETS_URI, "snippets")
            .with_title("Snippets")
            .with_description("Index of the snippets execute_code can run by snippet_name")
            .with_mime_type("application/json"),
    );
    if profiles.contains(&ToolProfile::Sessions) {
        out.extend(crate::sessions::list_resources(engine, tenant));
    }
    if let Some(dir) = engine.config().snippets_dir.as_deref() {
        for s in snippets::list(dir, engine.language_table()) {
            out.push(
                Resource::new(format!("{SNIPPET_PREFIX}{}", s.name), s.name.clone())
                    .with_title(s.filename.clone())
                    .with_description(format!("{} snippet", s.language))
                    .with_mime_type("text/plain")
                    .with_size(s.bytes),
            );
        }
    }
    out
}

pub fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(SNIPPET_TEMPLATE, "snippet")
            .with_title("Snippet source")
            .with_description("Source of the snippet NAME, runnable with execute_code snippet_name")
            .with_mime_type("text/plain"),
        ResourceTemplate::new(PACKAGES_TEMPLATE, "packages")
            .with_title("Packages of a language")
            .with_description(
                "What LANGUAGE (python, javascript) imports without `packages`, the cached \
                 package layers, and the package policy",
            )
            .with_mime_type("application/json"),
        ResourceTemplate::new(crate::runs::RUNS_TEMPLATE, "run output")
            .with_title("A file a run wrote under /work/outputs/")
            .with_description(
                "A file a run without a session left in /work/outputs/, kept for 15 minutes \
                 for the tenant that ran it; execute_code's result links each one",
            ),
    ]
}

/// The program that lists what Python imports by default (host side, same interpreter and
/// /usr as the sandbox).
const DEFAULT_PYTHON: &str = "import json, pkgutil, sys\nimport importlib.metadata as md\n\
d = sorted({(x.metadata['Name'] or '').lower(): {'name': x.metadata['Name'], 'version': x.version} \
for x in md.distributions() if x.metadata['Name']}.values(), key=lambda v: v['name'].lower())\n\
m = set(sys.builtin_module_names) | {i.name for i in pkgutil.iter_modules() if not i.name.startswith('_')}\n\
print(json.dumps({'version': sys.version.split()[0], 'distributions': d, 'modules': sorted(m)}))\n";
const DEFAULT_NODE: &str = "console.log(JSON.stringify({version: process.version, \
builtin_modules: require('module').builtinModules.filter(m => !m.startsWith('_'))}))";

/// `gearbox://packages/{language}`.
pub fn packages_document(engine: &Engine, language: &str) -> Result<Value, String> {
    let table = engine.language_table();
    let resolved = table.resolve(language)?;
    let (args, var) = match language {
        "python" => (vec!["-s", "-c", DEFAULT_PYTHON], "PYTHONPATH"),
        "javascript" => (vec!["-e", DEFAULT_NODE], "NODE_PATH"),
        other => {
            return Err(format!(
                "{other} has no package support (python and javascript do)"
            ));
        }
    };
    let out = std::process::Command::new(&resolved.interpreter)
        .args(&args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .output()
        .map_err(|e| format!("running {}: {e}", resolved.interpreter.display()))?;
    let default: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let cfg = &engine.config().packages;
    Ok(json!({
        "language": language,
        "interpreter": resolved.interpreter,
        "default": default,
        "layers": engine.package_layers(Some(language)),
        "how": format!(
            "pass packages (e.g. {}) to execute_code; they are installed outside the sandbox \
             into a cached read-only layer put on {var}; identical lists reuse the layer",
            if language == "python" { "[\"attrs\", \"numpy==2.*\"]" } else { "[\"is-number@^7\"]" }
        ),
        "policy": {
            "enabled": cfg.enabled,
            "allow_urls": cfg.allow_urls,
            "allow_sdist": cfg.allow_sdist,
            "python_index_urls": cfg.python_index_urls,
            "npm_registry": cfg.npm_registry,
        },
    }))
}

/// Read a resource other than the environment (which needs the cached language list).
pub fn read_snippets(engine: &Engine, uri: &str) -> Result<ReadResourceResult, McpError> {
    let table = engine.language_table();
    let dir = engine.config().snippets_dir.as_deref();
    if uri == SNIPPETS_URI {
        let index = dir.map(|d| snippets::list(d, table)).unwrap_or_default();
        let body = json!({ "snippets_dir": dir, "snippets": index });
        return Ok(ReadResourceResult::new(vec![
            ResourceContents::text(body.to_string(), uri).with_mime_type("application/json"),
        ]));
    }
    if let Some(language) = uri.strip_prefix(PACKAGES_PREFIX) {
        let doc = packages_document(engine, language)
            .map_err(|e| McpError::resource_not_found(e, Some(json!({ "uri": uri }))))?;
        return Ok(ReadResourceResult::new(vec![
            ResourceContents::text(serde_json::to_string_pretty(&doc).unwrap_or_default(), uri)
                .with_mime_type("application/json"),
        ]));
    }
    if let Some(name) = uri.strip_prefix(SNIPPET_PREFIX) {
        let snippet = snippets::load(dir, table, name)
            .map_err(|e| McpError::resource_not_found(e, Some(json!({ "uri": uri }))))?;
        return Ok(ReadResourceResult::new(vec![ResourceContents::text(
            snippet.content,
            uri,
        )]));
    }
    Err(McpError::resource_not_found(
        format!("no resource {uri:?}; try {ENV_URI}, {SNIPPETS_URI} or {SNIPPET_TEMPLATE}"),
        Some(json!({ "uri": uri })),
    ))
}

/// Property tests of resource URIs, which a client writes: reading any URI answers a
/// resource or an error without panicking, and a snippet URI serves only the content of a
/// snippet inside the snippets directory, never a file a symlink or a path leads to.
/// `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use std::path::PathBuf;
    use std::sync::OnceLock;

    use gearbox_engine::Config;
    use proptest::prelude::*;

    use super::*;

    /// `base/snippets/` holds `hello.py` and `link.py -> ../secret.py`; `base/secret.py` is
    /// outside.
    fn engine() -> &'static Engine {
        static ENGINE: OnceLock<Engine> = OnceLock::new();
        ENGINE.get_or_init(|| {
            let base =
                std::env::temp_dir().join(format!("gearbox-resources-prop-{}", std::process::id()));
            let dir = base.join("snippets");
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("hello.py"), "print('INSIDE')\n").expect("write");
            std::fs::write(base.join("secret.py"), "SECRET\n").expect("write");
            let _ = std::os::unix::fs::symlink("../secret.py", dir.join("link.py"));
            let config = Config {
                snippets_dir: Some(dir),
                ..Config::default()
            };
            Engine::new(config, PathBuf::from("/nonexistent"))
        })
    }

    fn uri() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("hello".to_string()),
            Just("link".to_string()),
            Just("secret".to_string()),
            Just("..".to_string()),
            Just("/".to_string()),
            Just(".py".to_string()),
            Just("%2e%2e".to_string()),
            Just("\0".to_string()),
            "[a-z]{1,4}",
            any::<char>().prop_map(String::from),
        ];
        (
            prop::sample::select(vec![
                SNIPPET_PREFIX,
                SNIPPETS_URI,
                PACKAGES_PREFIX,
                "gearbox://",
                "",
            ]),
            proptest::collection::vec(piece, 0..6),
        )
            .prop_map(|(prefix, rest)| format!("{prefix}{}", rest.concat()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(256)))]

        #[test]
        fn snippet_uris_serve_only_snippets(uri in prop_oneof![uri(), any::<String>()]) {
            // These two start an interpreter to list what it imports: not for every case.
            prop_assume!(uri != format!("{PACKAGES_PREFIX}python")
                && uri != format!("{PACKAGES_PREFIX}javascript"));
            if let Ok(r) = read_snippets(engine(), &uri) {
                let text = serde_json::to_string(&r).expect("json");
                prop_assert!(!text.contains("SECRET"), "{:?} served {}", uri, text);
                if let Some(name) = uri.strip_prefix(SNIPPET_PREFIX) {
                    prop_assert_eq!(name, "hello");
                    prop_assert!(text.contains("INSIDE"));
                }
            }
        }
    }
}
