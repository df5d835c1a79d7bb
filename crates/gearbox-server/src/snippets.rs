//! Named snippets: files `NAME.<ext>` in the configured snippets directory that a call may run
//! by name (isolator-mcp's `promptsDir`). The extension chooses the language.

use std::path::{Path, PathBuf};

use gearbox_core::LanguageTable;
use serde::Serialize;

/// Largest snippet file served, in bytes.
pub const MAX_SNIPPET_BYTES: u64 = 1024 * 1024;

/// One snippet found in the directory.
#[derive(Debug, Clone, Serialize)]
pub struct SnippetInfo {
    /// Name used as `snippet_name` (the file name without its extension).
    pub name: String,
    pub language: String,
    /// File name in the snippets directory, used as the entrypoint's name.
    pub filename: String,
    pub bytes: u64,
}

/// Check a caller-chosen snippet name: no path separators, no `..`, no NUL, not empty.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("snippet_name is empty".into());
    }
    if name.contains('\0') {
        return Err("snippet_name contains a NUL byte".into());
    }
    if name.contains('/') || name.contains('\\') {
        return Err(format!(
            "snippet_name {name:?} contains a path separator; give the bare name"
        ));
    }
    if name.contains("..") {
        return Err(format!("snippet_name {name:?} contains '..'"));
    }
    if name.starts_with('.') || name.chars().any(char::is_control) || name.len() > 255 {
        return Err(format!(
            "snippet_name {name:?} is not a plain name (no leading dot, control characters, at most 255 bytes)"
        ));
    }
    Ok(())
}

/// Every snippet in `dir`, sorted by name. Files whose extension selects no language, hidden
/// files and anything that is not a regular file are skipped.
pub fn list(dir: &Path, table: &LanguageTable) -> Vec<SnippetInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<SnippetInfo> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            if !meta.is_file() {
                return None;
            }
            let filename = e.file_name().to_str()?.to_string();
            let path = Path::new(&filename);
            let name = path.file_stem()?.to_str()?.to_string();
            let ext = path.extension()?.to_str()?;
            let language = table.by_extension(ext)?.to_string();
            validate_name(&name).ok()?;
            Some(SnippetInfo {
                name,
                language,
                filename,
                bytes: meta.len(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name).then(a.filename.cmp(&b.filename)));
    out
}

/// A snippet resolved for a run: its file name, language and content.
#[derive(Debug, Clone)]
pub struct Snippet {
    pub info: SnippetInfo,
    pub content: String,
}

/// Resolve `name` in `dir`. Errors name `snippet_name` and say what is available.
pub fn load(dir: Option<&Path>, table: &LanguageTable, name: &str) -> Result<Snippet, String> {
    validate_name(name)?;
    let dir = dir.ok_or_else(|| {
        "snippet_name: no snippets directory is configured (set snippets_dir in the config)"
            .to_string()
    })?;
    let all = list(dir, table);
    let mut matching = all.iter().filter(|s| s.name == name);
    let Some(info) = matching.next().cloned() else {
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        return Err(format!(
            "snippet_name: no snippet named {name:?}; available: {}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ));
    };
    if let Some(other) = matching.next() {
        return Err(format!(
            "snippet_name: {name:?} is ambiguous ({} and {})",
            info.filename, other.filename
        ));
    }
    if info.bytes > MAX_SNIPPET_BYTES {
        return Err(format!(
            "snippet_name: {} is larger than {MAX_SNIPPET_BYTES} bytes",
            info.filename
        ));
    }
    let path = inside(dir, &info.filename)?;
    let content = std::fs::read_to_string(&path)
        .map_err(|e| format!("snippet_name: reading {}: {e}", info.filename))?;
    Ok(Snippet { info, content })
}

/// The canonical path of `filename` in `dir`, refused when a symlink leads outside `dir`.
fn inside(dir: &Path, filename: &str) -> Result<PathBuf, String> {
    let root = std::fs::canonicalize(dir)
        .map_err(|e| format!("snippet_name: snippets directory {}: {e}", dir.display()))?;
    let path = std::fs::canonicalize(dir.join(filename))
        .map_err(|e| format!("snippet_name: {filename}: {e}"))?;
    if !path.starts_with(&root) {
        return Err(format!(
            "snippet_name: {filename} leads outside the snippets directory"
        ));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_names_are_refused() {
        for bad in ["", "../x", "a/b", "..", "a\0b", ".hidden", "a\\b", "x..y"] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
        validate_name("hello_world").expect("plain");
    }

    #[test]
    fn load_finds_by_stem_and_reports_what_exists() {
        let dir = std::env::temp_dir().join(format!("gearbox-snippets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("hello.py"), "print('hi')\n").expect("write");
        std::fs::write(dir.join("notes.txt"), "x").expect("write");
        let table = LanguageTable::builtin();
        let s = load(Some(&dir), &table, "hello").expect("found");
        assert_eq!(s.info.language, "python");
        assert_eq!(s.info.filename, "hello.py");
        let e = load(Some(&dir), &table, "nope").expect_err("missing");
        assert!(e.contains("available: hello"), "{e}");
        assert!(load(None, &table, "hello").is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Property tests: a snippet name comes from a call or a resource URI; whatever it is, the
/// check answers without panicking, and a name it accepts is one plain file name in the
/// snippets directory. `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use std::path::{Component, Path};

    use proptest::prelude::*;

    use super::*;

    fn name() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("..".to_string()),
            Just(".".to_string()),
            Just("/".to_string()),
            Just("\\".to_string()),
            Just("\0".to_string()),
            Just("\n".to_string()),
            Just("%2e".to_string()),
            "[a-z_]{1,6}",
            any::<char>().prop_map(String::from),
        ];
        prop_oneof![
            4 => proptest::collection::vec(piece, 0..8).prop_map(|v| v.concat()),
            1 => any::<String>(),
            1 => (250usize..260).prop_map(|n| "s".repeat(n)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(512)))]

        #[test]
        fn accepted_names_are_one_plain_file_name(name in name()) {
            if validate_name(&name).is_ok() {
                prop_assert!(!name.is_empty() && name.len() <= 255);
                prop_assert!(!name.contains(['/', '\\', '\0']) && !name.contains(".."));
                prop_assert!(!name.starts_with('.') && !name.chars().any(char::is_control));
                let file = format!("{name}.py");
                let c: Vec<_> = Path::new(&file).components().collect();
                prop_assert!(c.len() == 1 && matches!(c[0], Component::Normal(_)), "{:?}", name);
            }
        }
    }
}
