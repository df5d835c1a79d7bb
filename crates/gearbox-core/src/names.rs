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
