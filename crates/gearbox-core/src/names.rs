//! Validation of names that callers choose: file names inside the workspace, snippet names,
//! entrypoints. A name that could leave the workspace refuses the whole call.

use thiserror::Error;

/// Longest accepted relative path, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Deepest accepted relative path, in components.
pub const MAX_PATH_DEPTH: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("{what} is empty")]
    Empty { what: String },
    #[error("{what} {name:?} contains a NUL byte")]
    Nul { what: String, name: String },
    #[error(
        "{what} {name:?} is an absolute path; only paths relative to the workspace are allowed"
    )]
    Absolute { what: String, name: String },
    #[error("{what} {name:?} contains a '..' component")]
    ParentDir { what: String, name: String },
    #[error("{what} {name:?} contains an empty or '.' component")]
    EmptyComponent { what: String, name: String },
    #[error("{what} {name:?} is longer than {MAX_PATH_BYTES} bytes or {MAX_PATH_DEPTH} components")]
    TooLong { what: String, name: String },
    #[error("{what} {name:?} contains a backslash or control character")]
    BadChar { what: String, name: String },
}

/// Check that `name` is a plain relative path inside the workspace: no absolute path, no `..`,
/// no NUL, no empty or `.` components, no backslash or control characters, bounded length.
/// `what` names the field in the error ("additional_files[2].filename").
pub fn validate_relative_path(what: &str, name: &str) -> Result<(), NameError> {
    let err_name = || name.chars().take(200).collect::<String>();
    let w = || what.to_string();
    if name.is_empty() {
        return Err(NameError::Empty { what: w() });
    }
    if name.contains('\0') {
        return Err(NameError::Nul {
            what: w(),
            name: err_name(),
        });
    }
    if name.starts_with('/') {
        return Err(NameError::Absolute {
            what: w(),
            name: err_name(),
        });
    }
    if name.len() > MAX_PATH_BYTES || name.split('/').count() > MAX_PATH_DEPTH {
        return Err(NameError::TooLong {
            what: w(),
            name: err_name(),
        });
    }
    if name.chars().any(|c| c == '\\' || c.is_control()) {
        return Err(NameError::BadChar {
            what: w(),
            name: err_name(),
        });
    }
    for component in name.split('/') {
        match component {
            ".." => {
                return Err(NameError::ParentDir {
                    what: w(),
                    name: err_name(),
                });
            }
            "" | "." => {
                return Err(NameError::EmptyComponent {
                    what: w(),
                    name: err_name(),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass() {
        for ok in [
            "main.py",
            "data/input.csv",
            "a-b_c.d/e f.txt",
            "ünïcode.txt",
        ] {
            validate_relative_path("f", ok).expect(ok);
        }
    }

    #[test]
    fn escaping_names_fail() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/..",
            "..",
            "a//b",
            "./a",
            "a\0b",
            "a\\..\\b",
            "a\nb",
        ] {
            assert!(
                validate_relative_path("f", bad).is_err(),
                "{bad:?} accepted"
            );
        }
        let deep = vec!["d"; MAX_PATH_DEPTH + 1].join("/");
        assert!(validate_relative_path("f", &deep).is_err());
    }

    #[test]
    fn error_names_the_field() {
        let e = validate_relative_path("additional_files[1].filename", "../x").expect_err("bad");
        assert!(
            e.to_string().starts_with("additional_files[1].filename"),
            "{e}"
        );
    }
}

/// Property tests: whatever a caller sends as a name, the validator answers without
/// panicking, and a name it accepts stays inside the directory it is joined to.
/// `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
pub(crate) mod proptests {
    use std::path::{Component, Path};

    use proptest::prelude::*;

    use super::*;

    /// Pieces that make names interesting: separators, dot components, NUL, backslashes,
    /// control and bidi characters, percent-escapes, multi-byte characters.
    pub(crate) fn hostile_piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("..".to_string()),
            Just(".".to_string()),
            Just("/".to_string()),
            Just("//".to_string()),
            Just("\0".to_string()),
            Just("\\".to_string()),
            Just("\n".to_string()),
            Just("~".to_string()),
            Just("%2e%2e".to_string()),
            Just("\u{202e}".to_string()),
            Just("\u{2024}\u{2024}".to_string()),
            Just("é".to_string()),
            Just("\u{1F600}".to_string()),
            "[a-z]{1,8}",
            any::<char>().prop_map(String::from),
        ]
    }

    /// A name made of hostile pieces, or any string at all.
    pub(crate) fn hostile_name() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => proptest::collection::vec(hostile_piece(), 0..24).prop_map(|v| v.concat()),
            1 => any::<String>(),
            1 => (1usize..3000).prop_map(|n| "a/".repeat(n / 2) + &"b".repeat(n % 7)),
        ]
    }

    /// One plain component: no `/`, NUL, backslash or control character, not `.` or `..`.
    fn plain_component() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 ._~%-]{1,24}|[^/\\\\\\p{Cc}]{1,8}"
            .prop_filter("not . or ..", |c| c != "." && c != "..")
    }

    /// Everything an accepted name must be: each promise of the validator, checked
    /// independently of its code.
    pub(crate) fn assert_stays_inside(name: &str) {
        assert!(!name.is_empty());
        assert!(!name.contains('\0'), "{name:?}");
        assert!(!name.starts_with('/'), "{name:?}");
        assert!(name.len() <= MAX_PATH_BYTES, "{name:?}");
        assert!(
            !name.chars().any(|c| c == '\\' || c.is_control()),
            "{name:?}"
        );
        let components: Vec<Component<'_>> = Path::new(name).components().collect();
        assert!(components.len() <= MAX_PATH_DEPTH, "{name:?}");
        assert_eq!(components.len(), name.split('/').count(), "{name:?}");
        for c in &components {
            assert!(matches!(c, Component::Normal(_)), "{name:?}: {c:?}");
        }
        // Joined to a root, it names something strictly below the root.
        let root = Path::new("/srv/root");
        let joined = root.join(name);
        assert!(joined.starts_with(root) && joined != root, "{name:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(crate::fuzz_cases(512)))]

        #[test]
        fn accepted_names_stay_inside(name in hostile_name()) {
            if validate_relative_path("f", &name).is_ok() {
                assert_stays_inside(&name);
            }
        }

        #[test]
        fn errors_name_the_field_and_stay_short(name in hostile_name()) {
            if let Err(e) = validate_relative_path("files[3].filename", &name) {
                let text = e.to_string();
                prop_assert!(text.starts_with("files[3].filename"), "{}", text);
                // The name is quoted at most 200 characters (escaped, so up to 10 bytes each).
                prop_assert!(text.len() < 200 * 10 + 200, "{} bytes", text.len());
            }
        }

        #[test]
        fn plain_relative_paths_are_accepted(
            parts in proptest::collection::vec(plain_component(), 1..=MAX_PATH_DEPTH),
        ) {
            let name = parts.join("/");
            prop_assume!(name.len() <= MAX_PATH_BYTES);
            prop_assert_eq!(validate_relative_path("f", &name), Ok(()));
        }

        #[test]
        fn one_bad_component_refuses_the_whole_name(
            before in proptest::collection::vec(plain_component(), 0..4),
            bad in prop_oneof![Just(".."), Just("."), Just("")],
            after in proptest::collection::vec(plain_component(), 0..4),
        ) {
            let name = before
                .into_iter()
                .chain(std::iter::once(bad.to_string()))
                .chain(after)
                .collect::<Vec<_>>()
                .join("/");
            prop_assert!(validate_relative_path("f", &name).is_err(), "{:?}", name);
        }
    }
}
