//! The dispatch: which analyser reads each file of a submission, and which one reads code
//! nested in a string (`python3 -c '…'`, `sh -c '…'`) for the shared command-line analysis.

use std::time::Instant;

use crate::common::{Analysers, NestedLang, Sink};
use crate::{Analysis, LANGUAGES, MAX_FILE_BYTES, MAX_PARSE_TIME, Risk};
use crate::{bash, go, javascript, python};

/// The analysers every sink reaches code nested in strings with.
static ANALYSERS: Analysers = Analysers {
    nested,
    python_module: python::module_rule,
};

/// Analyses `src`, a string that other code hands to `lang`'s interpreter.
fn nested(lang: NestedLang, sink: &mut Sink, src: &str) {
    match lang {
        NestedLang::Python => python::analyse(sink, src),
        NestedLang::JavaScript => javascript::analyse(sink, src),
        NestedLang::Bash => bash::analyse_nested(sink, src),
    }
}

/// Which analyser reads a file: by its extension when it names an analysed language, the
/// submission's language when it has no extension, none otherwise (data files).
fn language_of<'a>(path: &str, default: &'a str) -> Option<&'a str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    match name.rsplit_once('.') {
        None => Some(default),
        Some((_, ext)) => match ext {
            "py" | "pyw" => Some("python"),
            "js" | "mjs" | "cjs" => Some("javascript"),
            "go" => Some("go"),
            "sh" | "bash" => Some("bash"),
            _ => None,
        },
    }
}

/// Analyses a submission: `files` are (path, source) pairs, `language` the submission's
/// language as named in `languages.toml` (`python`, `javascript`, `go`, `bash`). Another
/// language gives an analysis with `analysed: false`. Never panics.
///
/// Each file is read by the analyser its extension names (`.py`, `.js`/`.mjs`/`.cjs`, `.go`,
/// `.sh`/`.bash`), a file without extension by the submission's language, and files with
/// other extensions (data) are skipped.
pub fn analyze(language: &str, files: &[(&str, &str)]) -> Analysis {
    if !LANGUAGES.contains(&language) {
        return Analysis::not_analysed(format!(
            "no analyser for language {language:?} (analysed: {})",
            LANGUAGES.join(", ")
        ));
    }
    if let Some((path, src)) = files.iter().find(|(_, src)| src.len() > MAX_FILE_BYTES) {
        return Analysis::not_analysed(format!(
            "file {path:?} has {} bytes, more than the {MAX_FILE_BYTES} analysed",
            src.len()
        ));
    }
    let deadline = Instant::now() + MAX_PARSE_TIME;
    let mut findings = Vec::new();
    let mut parse_errors = false;
    for (path, src) in files {
        let Some(lang) = language_of(path, language) else {
            continue;
        };
        let mut sink = Sink::new(path, deadline, &ANALYSERS);
        match lang {
            "python" => python::analyse(&mut sink, src),
            "javascript" => javascript::analyse(&mut sink, src),
            "go" => go::analyse(&mut sink, src),
            _ => bash::analyse(&mut sink, src),
        }
        if sink.timed_out {
            return Analysis::not_analysed(format!(
                "parsing took longer than {} ms (stopped at {path:?})",
                MAX_PARSE_TIME.as_millis()
            ));
        }
        parse_errors |= sink.parse_errors;
        findings.extend(sink.findings);
    }
    findings.sort_by(|a, b| {
        (&a.file, a.line, a.column, a.category, &a.what)
            .cmp(&(&b.file, b.line, b.column, b.category, &b.what))
    });
    findings.dedup();
    let mut risk = findings.iter().map(|f| f.risk).max().unwrap_or(Risk::Low);
    if parse_errors {
        risk = risk.max(Risk::Medium);
    }
    let needs = findings.iter().filter_map(|f| f.capability).collect();
    Analysis {
        analysed: true,
        risk,
        needs,
        findings,
        parse_errors,
        reason: None,
    }
}
