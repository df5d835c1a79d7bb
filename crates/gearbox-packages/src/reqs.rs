//! Requirement strings, validated and normalized before anything runs.
//!
//! Python: a strict subset of PEP 508 — `name`, optional `[extras]`, optional version
//! specifiers (`==2.*`, `>=1,<3`, `~=1.4`), no environment markers. npm: a package name by
//! npm's rules (`is-number`, `@scope/name`), optionally `@` and a semver range or dist-tag.
//! URLs, VCS references and (with `allow_urls`) nothing else; paths and installer options
//! (`-e`, `--index-url`, `-r file`) are always refused: they would let a call choose what the
//! host fetches or reads.

use crate::Ecosystem;

/// Most requirements one call may give.
pub const MAX_REQUIREMENTS: usize = 64;
/// Longest requirement string accepted.
pub const MAX_REQUIREMENT_LEN: usize = 256;

/// Validate and normalize `reqs` for `eco`: each is checked, normalized (lower-case names,
/// no blanks), and the set is sorted and de-duplicated. Errors name the entry
/// (`packages[2]: ...`).
pub fn normalize(eco: Ecosystem, reqs: &[String], allow_urls: bool) -> Result<Vec<String>, String> {
    if reqs.len() > MAX_REQUIREMENTS {
        return Err(format!("packages: at most {MAX_REQUIREMENTS} requirements"));
    }
    let mut out = Vec::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        let n = match eco {
            Ecosystem::Python => python(r, allow_urls),
            Ecosystem::Node => npm(r, allow_urls),
        }
        .map_err(|e| format!("packages[{i}]: {r:?}: {e}"))?;
        out.push(n);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// The package name a normalized requirement installs (for the gear prompt and audit).
pub fn name_of(eco: Ecosystem, normalized: &str) -> &str {
    match eco {
        Ecosystem::Python => normalized
            .split(['[', '=', '<', '>', '!', '~', ' ', '@'])
            .next()
            .unwrap_or(normalized),
        Ecosystem::Node => match normalized.strip_prefix('@') {
            Some(rest) => rest
                .find('@')
                .map_or(normalized, |at| &normalized[..at + 1]),
            None => normalized.split('@').next().unwrap_or(normalized),
        },
    }
}

fn common(r: &str) -> Result<&str, String> {
    let t = r.trim();
    if t.is_empty() {
        return Err("empty requirement".into());
    }
    if t.len() > MAX_REQUIREMENT_LEN {
        return Err(format!("longer than {MAX_REQUIREMENT_LEN} characters"));
    }
    if t.chars().any(|c| c.is_control()) {
        return Err("contains a control character".into());
    }
    if t.starts_with('-') {
        return Err(
            "installer options (-e, --index-url, -r, ...) are refused; package \
                    indexes come from the server's configuration"
                .into(),
        );
    }
    if t.starts_with('.') || t.starts_with('/') || t.starts_with('~') || t.starts_with("file:") {
        return Err("local paths are refused; give a package name".into());
    }
    Ok(t)
}

fn looks_like_url(t: &str) -> bool {
    t.contains("://") || t.contains("git+") || t.starts_with("git@") || t.contains("github:")
}

/// A character of a URL requirement: RFC 3986's, less `$` and `;`. uv reads requirements
/// as a requirements file, which expands `${VAR}` (the installer's environment, proxies
/// included, into a URL the caller chose), continues a line ending in a backslash, and
/// takes what follows whitespace as options or a comment.
fn url_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-._~:/?#[]@!&'()*+,=%".contains(c)
}

const URL_REFUSED: &str = "URL and VCS requirements are refused (the server's \
                           packages.allow_urls is false); give a package name and version";

/// PEP 503 normalized name: lower case, runs of `-_.` become `-`.
fn pep503(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

fn python_name_len(s: &str) -> usize {
    // [A-Za-z0-9] ([A-Za-z0-9._-]* [A-Za-z0-9])?
    let b = s.as_bytes();
    let mut end = 0;
    for (i, &c) in b.iter().enumerate() {
        if c.is_ascii_alphanumeric() || (i > 0 && matches!(c, b'.' | b'_' | b'-')) {
            if c.is_ascii_alphanumeric() {
                end = i + 1;
            }
        } else {
            break;
        }
    }
    end
}

fn python(r: &str, allow_urls: bool) -> Result<String, String> {
    let t = common(r)?;
    let n = python_name_len(t);
    if n == 0 {
        if looks_like_url(t) {
            return Err(URL_REFUSED.into());
        }
        return Err("must start with a package name ([A-Za-z0-9][A-Za-z0-9._-]*)".into());
    }
    let name = pep503(&t[..n]);
    let mut rest = t[n..].trim_start();
    let mut extras = Vec::new();
    if let Some(after) = rest.strip_prefix('[') {
        let close = after.find(']').ok_or("unclosed [ in extras")?;
        for e in after[..close].split(',') {
            let e = e.trim();
            if e.is_empty() {
                continue;
            }
            if python_name_len(e) != e.len() {
                return Err(format!("extra {e:?} is not a valid name"));
            }
            extras.push(pep503(e));
        }
        extras.sort();
        extras.dedup();
        rest = after[close + 1..].trim_start();
    }
    let mut out = name;
    if !extras.is_empty() {
        out.push('[');
        out.push_str(&extras.join(","));
        out.push(']');
    }
    if rest.is_empty() {
        return Ok(out);
    }
    if rest.contains(';') {
        return Err("environment markers (`; ...`) are not supported".into());
    }
    if let Some(url) = rest.strip_prefix('@') {
        if !allow_urls {
            return Err(URL_REFUSED.into());
        }
        let url = url.trim();
        let ok_scheme = ["https://", "http://", "git+https://"]
            .iter()
            .any(|s| url.starts_with(s));
        if !ok_scheme || !url.chars().all(url_char) {
            return Err(
                "a URL requirement must be `name @ https://...`, in URL characters (no \
                 whitespace, `$` or backslash)"
                    .into(),
            );
        }
        return Ok(format!("{out} @ {url}"));
    }
    if looks_like_url(rest) {
        return Err(URL_REFUSED.into());
    }
    let spec = match rest.strip_prefix('(') {
        Some(inner) => inner
            .strip_suffix(')')
            .ok_or("unclosed ( in version specifier")?,
        None => rest,
    };
    let mut clauses = Vec::new();
    for clause in spec.split(',') {
        let c: String = clause.chars().filter(|c| !c.is_whitespace()).collect();
        let op = ["===", "~=", "==", "!=", "<=", ">=", "<", ">"]
            .into_iter()
            .find(|op| c.starts_with(op))
            .ok_or_else(|| {
                format!(
                    "version specifier {:?} must start with ==, !=, <=, >=, <, >, ~= or ===",
                    clause.trim()
                )
            })?;
        let v = &c[op.len()..];
        if v.is_empty()
            || !v.chars().all(|ch| {
                ch.is_ascii_alphanumeric() || matches!(ch, '.' | '*' | '+' | '!' | '-' | '_')
            })
        {
            return Err(format!("version {v:?} is not a valid version"));
        }
        clauses.push(format!("{op}{v}"));
    }
    clauses.sort();
    out.push_str(&clauses.join(","));
    Ok(out)
}

fn npm_name_ok(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 214 {
        return Err("a package name has 1 to 214 characters".into());
    }
    let part_ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && !p.starts_with('_')
            && p.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | '_' | '~')
            })
    };
    let ok = match name.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, pkg)) => part_ok(scope) && part_ok(pkg),
            None => false,
        },
        None => part_ok(name),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid npm package name (lower case letters, digits, - . _ ~; \
             optionally @scope/; not starting with . or _)"
        ))
    }
}

fn npm(r: &str, allow_urls: bool) -> Result<String, String> {
    let t = common(r)?;
    let (name, range) = match t.strip_prefix('@') {
        Some(rest) => match rest.find('@') {
            Some(at) => (&t[..at + 1], Some(&rest[at + 1..])),
            None => (t, None),
        },
        None => match t.split_once('@') {
            Some((n, v)) => (n, Some(v)),
            None => (t, None),
        },
    };
    if looks_like_url(name) || (!name.starts_with('@') && name.contains('/')) {
        return Err(format!(
            "{URL_REFUSED} (GitHub shortcuts `user/repo` are references too)"
        ));
    }
    npm_name_ok(name)?;
    let Some(range) = range else {
        return Ok(name.to_string());
    };
    let range = range.trim();
    if range.is_empty() {
        return Err("empty version range after @".into());
    }
    if looks_like_url(range) || range.contains(':') || range.contains('/') {
        if allow_urls && range.starts_with("https://") && !range.contains(char::is_whitespace) {
            return Ok(format!("{name}@{range}"));
        }
        return Err(format!(
            "{URL_REFUSED} (also npm:, file:, git and tarball specs)"
        ));
    }
    if !range.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                '.' | '*' | '^' | '~' | '<' | '>' | '=' | '|' | '+' | '-' | ' '
            )
    }) {
        return Err(format!("{range:?} is not a semver range or dist-tag"));
    }
    let range = range.split_whitespace().collect::<Vec<_>>().join(" ");
    Ok(format!("{name}@{range}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(r: &str) -> Result<String, String> {
        normalize(Ecosystem::Python, &[r.to_string()], false).map(|v| v[0].clone())
    }
    fn js(r: &str) -> Result<String, String> {
        normalize(Ecosystem::Node, &[r.to_string()], false).map(|v| v[0].clone())
    }

    #[test]
    fn python_names_extras_and_specifiers_normalize() {
        assert_eq!(py("six").as_deref(), Ok("six"));
        assert_eq!(py("Typing_Extensions").as_deref(), Ok("typing-extensions"));
        assert_eq!(py("numpy==2.*").as_deref(), Ok("numpy==2.*"));
        assert_eq!(py("attrs >= 22 , < 30").as_deref(), Ok("attrs<30,>=22"));
        assert_eq!(
            py("requests[Socks, security]>=2").as_deref(),
            Ok("requests[security,socks]>=2")
        );
        assert_eq!(py("pandas (>=2)").as_deref(), Ok("pandas>=2"));
        let set = normalize(
            Ecosystem::Python,
            &["six".into(), "attrs".into(), "SIX".into()],
            false,
        )
        .expect("valid");
        assert_eq!(set, vec!["attrs", "six"]);
    }

    #[test]
    fn python_urls_paths_options_and_markers_are_refused_naming_the_entry() {
        for bad in [
            "https://evil.example/x.whl",
            "pkg @ https://evil.example/x.whl",
            "git+https://github.com/a/b",
            "-e .",
            "--index-url=https://evil.example/simple",
            "-r requirements.txt",
            "./local",
            "/abs/path",
            "six; python_version<'3'",
            "six==1.0 --hash=x",
            "six===",
            "",
            "six\n--extra-index-url x",
        ] {
            let e = normalize(Ecosystem::Python, &["ok".into(), bad.into()], false).expect_err(bad);
            assert!(e.starts_with("packages[1]"), "{bad}: {e}");
        }
        let e = py("pkg @ https://x.example/p.whl").expect_err("url");
        assert!(e.contains("allow_urls"), "{e}");
        assert_eq!(
            normalize(
                Ecosystem::Python,
                &["pkg @ https://x.example/p.whl".into()],
                true
            )
            .expect("allowed")[0],
            "pkg @ https://x.example/p.whl"
        );
    }

    /// Regression (found by `proptests::hostile_requirements_never_pass_unsafe`): with
    /// `allow_urls`, a URL could end in a backslash (continuing the line into the next
    /// requirement) or carry `${VAR}`, which a requirements file expands.
    #[test]
    fn url_requirements_hold_only_url_characters() {
        for bad in [
            "pkg @ https://x.example/\\",
            "pkg @ https://x.example/${HTTPS_PROXY}",
            "pkg @ https://x.example/$HOME",
            "pkg @ https://x.example/\"q\"",
            "pkg @ https://x.example/a\u{a0}b",
            "pkg @ https://x.example/é",
        ] {
            let e = normalize(Ecosystem::Python, &[bad.into()], true).expect_err(bad);
            assert!(e.contains("URL characters"), "{bad}: {e}");
        }
        assert_eq!(
            normalize(
                Ecosystem::Python,
                &["pkg @ https://x.example/p-1.0.whl#sha256=ab%20".into()],
                true
            )
            .expect("allowed")[0],
            "pkg @ https://x.example/p-1.0.whl#sha256=ab%20"
        );
    }

    #[test]
    fn npm_names_and_ranges() {
        assert_eq!(js("is-number").as_deref(), Ok("is-number"));
        assert_eq!(js("is-number@^7.0.0").as_deref(), Ok("is-number@^7.0.0"));
        assert_eq!(
            js("@types/node@>=18  <21").as_deref(),
            Ok("@types/node@>=18 <21")
        );
        assert_eq!(js("lodash@latest").as_deref(), Ok("lodash@latest"));
        for bad in [
            "Is-Number",
            "user/repo",
            "is-number@git+https://github.com/x/y",
            "is-number@https://evil.example/x.tgz",
            "x@npm:other",
            "x@file:../y",
            "--registry=https://evil",
            ".hidden",
            "_under",
            "@scope",
            "a@",
            "a@1.0.0;rm",
        ] {
            assert!(js(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(name_of(Ecosystem::Node, "@types/node@>=18"), "@types/node");
        assert_eq!(name_of(Ecosystem::Node, "is-number@^7"), "is-number");
        assert_eq!(name_of(Ecosystem::Python, "requests[socks]>=2"), "requests");
    }
}

/// Property tests: requirement strings come from a tool call. Whatever they are, validation
/// answers without panicking, and what it accepts is a package name and version only: no
/// installer option, path, URL (unless allowed), and nothing that a requirements file (the
/// form uv reads them in) would take as a second requirement, an option, a comment, a line
/// continuation or a variable. `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    fn eco() -> impl Strategy<Value = Ecosystem> {
        prop_oneof![Just(Ecosystem::Python), Just(Ecosystem::Node)]
    }

    /// Pieces of hostile requirements: options, paths, URLs, separators, markers, odd
    /// characters.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-zA-Z0-9]{1,6}",
            2 => prop::sample::select(vec![
                "-", "--", "-e", "--index-url", "-r", "=", "==", "~=", "!=", "<", ">", ">=", "*",
                ".", "..", "/", "~", "@", "@scope/", ":", "://", "https://", "http://",
                "git+", "git@", "github:", "file:", "npm:", " ", "  ", "\t", "\n", "\r", "#",
                ";", ",", "[", "]", "(", ")", "\\", "$", "${HOME}", "%", "^", "|", "&", "'",
                "\"", "`", "_", "+", "!", "\u{a0}", "\u{2028}", "\u{3000}", "é", "\u{0}",
            ])
            .prop_map(String::from),
            1 => any::<char>().prop_map(String::from),
        ]
    }

    fn requirement() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => proptest::collection::vec(piece(), 1..10).prop_map(|v| v.concat()),
            1 => any::<String>(),
            1 => (200usize..400).prop_map(|n| "a".repeat(n)),
            // A name, a URL scheme, then anything: the URL forms.
            2 => (
                "[a-z]{1,4}",
                prop::sample::select(vec![" @ ", "@", " @", "@ "]),
                prop::sample::select(vec!["https://", "http://", "git+https://", "file://"]),
                proptest::collection::vec(piece(), 0..6),
            )
                .prop_map(|(name, at, scheme, rest)| format!("{name}{at}{scheme}{}", rest.concat())),
        ]
    }

    /// A requirement a user would write, valid for `eco`.
    fn valid(eco: Ecosystem) -> BoxedStrategy<String> {
        match eco {
            Ecosystem::Python => (
                "[A-Za-z0-9]([A-Za-z0-9._-]{0,10}[A-Za-z0-9])?",
                proptest::option::of(proptest::collection::vec(
                    "[a-z]([a-z0-9_]{0,4}[a-z0-9])?",
                    1..3,
                )),
                proptest::collection::vec(
                    (
                        prop::sample::select(vec!["==", "!=", "<=", ">=", "<", ">", "~=", "==="]),
                        "[0-9]{1,3}(\\.[0-9*]{1,3}){0,2}",
                    ),
                    0..3,
                ),
            )
                .prop_map(|(name, extras, clauses)| {
                    let mut s = name;
                    if let Some(e) = extras {
                        s.push_str(&format!("[{}]", e.join(", ")));
                    }
                    let c: Vec<String> = clauses
                        .into_iter()
                        .map(|(o, v)| format!("{o}{v}"))
                        .collect();
                    s.push_str(&c.join(","));
                    s
                })
                .boxed(),
            Ecosystem::Node => (
                proptest::option::of("[a-z0-9][a-z0-9._-]{0,8}"),
                "[a-z0-9][a-z0-9._~-]{0,12}",
                proptest::option::of(prop_oneof![
                    "\\^?[0-9]{1,2}(\\.[0-9x*]{1,2}){0,2}",
                    ">=[0-9] <[0-9]{2}",
                    "latest|next|beta",
                ]),
            )
                .prop_map(|(scope, name, range)| {
                    let mut s = match scope {
                        Some(scope) => format!("@{scope}/{name}"),
                        None => name,
                    };
                    if let Some(r) = range {
                        s.push('@');
                        s.push_str(&r);
                    }
                    s
                })
                .boxed(),
        }
    }

    /// The promises of an accepted, normalized requirement.
    fn assert_safe(eco: Ecosystem, n: &str, allow_urls: bool) {
        assert!(!n.is_empty() && n.len() <= MAX_REQUIREMENT_LEN + 8, "{n:?}");
        assert!(
            !n.starts_with(['-', '.', '/', '~']),
            "{n:?}: option or path"
        );
        assert!(!n.starts_with("file:"), "{n:?}");
        assert!(!n.chars().any(char::is_control), "{n:?}: control character");
        assert_eq!(n, n.trim(), "{n:?}");
        let name = name_of(eco, n);
        assert!(
            !name.is_empty() && n.starts_with(name),
            "{n:?}: name {name:?}"
        );
        match eco {
            Ecosystem::Python => {
                assert!(
                    name.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !name.starts_with('-')
                        && !name.ends_with('-'),
                    "{n:?}: name {name:?}"
                );
                let (req, url) = match n.split_once(" @ ") {
                    Some((req, url)) => (req, Some(url)),
                    None => (n, None),
                };
                // The name, extras and version clauses: a closed set of characters, so no
                // whitespace, comment, continuation, variable or option can hide in them.
                assert!(
                    req.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-[],.=<>!~*+_".contains(c)),
                    "{n:?}"
                );
                if let Some(url) = url {
                    assert!(allow_urls, "{n:?}: a URL without allow_urls");
                    assert!(
                        ["https://", "http://", "git+https://"]
                            .iter()
                            .any(|s| url.starts_with(s)),
                        "{n:?}"
                    );
                    assert!(!url.chars().any(char::is_whitespace), "{n:?}");
                    assert!(
                        !url.contains(['$', '\\', ';']),
                        "{n:?}: expansion or continuation"
                    );
                }
            }
            Ecosystem::Node => {
                assert!(npm_name_ok(name).is_ok(), "{n:?}: name {name:?}");
                let rest = &n[name.len()..];
                if let Some(range) = rest.strip_prefix('@') {
                    if range.starts_with("https://") {
                        assert!(allow_urls, "{n:?}: a URL without allow_urls");
                        assert!(!range.chars().any(char::is_whitespace), "{n:?}");
                    } else {
                        assert!(!range.contains([':', '/']), "{n:?}: URL or path");
                        assert!(
                            range
                                .chars()
                                .all(|c| c.is_ascii_alphanumeric() || ".*^~<>=|+- ".contains(c)),
                            "{n:?}"
                        );
                        assert!(!range.contains("  ") && range == range.trim(), "{n:?}");
                    }
                } else {
                    assert!(rest.is_empty(), "{n:?}");
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(512)))]

        #[test]
        fn hostile_requirements_never_pass_unsafe(
            eco in eco(),
            reqs in proptest::collection::vec(requirement(), 0..4),
            allow_urls in any::<bool>(),
        ) {
            match normalize(eco, &reqs, allow_urls) {
                Ok(out) => {
                    prop_assert!(out.len() <= reqs.len());
                    prop_assert!(out.windows(2).all(|w| w[0] < w[1]), "sorted, unique: {:?}", out);
                    for n in &out {
                        assert_safe(eco, n, allow_urls);
                    }
                    // Normalizing again changes nothing.
                    prop_assert_eq!(normalize(eco, &out, allow_urls), Ok(out.clone()));
                }
                Err(e) => prop_assert!(e.starts_with("packages"), "{}", e),
            }
        }

        #[test]
        fn what_users_write_is_accepted(
            (eco, reqs) in eco().prop_flat_map(|e| (Just(e), proptest::collection::vec(valid(e), 1..4))),
        ) {
            let out = normalize(eco, &reqs, false);
            prop_assert!(out.is_ok(), "{:?}: {:?}", reqs, out);
            for n in out.unwrap_or_default() {
                assert_safe(eco, &n, false);
            }
        }

        #[test]
        fn any_string_names_something(eco in eco(), s in any::<String>()) {
            let name = name_of(eco, &s);
            prop_assert!(s.starts_with(name));
        }

        #[test]
        fn too_many_requirements_are_refused(eco in eco(), extra in 1usize..8) {
            let reqs = vec!["six".to_string(); MAX_REQUIREMENTS + extra];
            prop_assert!(normalize(eco, &reqs, false).is_err());
        }
    }
}
