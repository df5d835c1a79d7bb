//! Session ids: UUID v4 in their canonical form, the only form that ever becomes a path
//! component.

use std::fmt;

use uuid::Uuid;

/// A validated session id. The only way to build one is [`SessionId::parse`] (or
/// [`SessionId::new`]), so any `SessionId` is 36 characters of lowercase hex and hyphens:
/// safe as a directory name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Uuid);

impl SessionId {
    /// A fresh random id.
    pub fn new() -> SessionId {
        SessionId(Uuid::new_v4())
    }

    /// Accept exactly the canonical lowercase hyphenated form of a version-4, RFC 4122
    /// UUID. `field` names the argument in the error.
    pub fn parse(field: &str, s: &str) -> Result<SessionId, String> {
        let shown: String = s.chars().take(60).collect();
        let bad = || format!("{field}: {shown:?} is not a session id (a lowercase UUID v4)");
        if s.len() != 36 {
            return Err(bad());
        }
        let u = Uuid::try_parse(s).map_err(|_| bad())?;
        if u.get_version_num() != 4
            || u.get_variant() != uuid::Variant::RFC4122
            || u.hyphenated().to_string() != s
        {
            return Err(bad());
        }
        Ok(SessionId(u))
    }

    /// The directory name of this session.
    pub fn dir_name(&self) -> String {
        self.0.hyphenated().to_string()
    }
}

impl Default for SessionId {
    fn default() -> Self {
        SessionId::new()
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_v4_ids_pass() {
        let id = SessionId::new();
        assert_eq!(SessionId::parse("id", &id.to_string()), Ok(id));
        for bad in [
            "",
            "../../etc/passwd",
            "..",
            "%2e%2e",
            "/etc/passwd",
            "00000000-0000-0000-0000-000000000000",
            // version 1
            "c232ab00-9414-11ec-b3c8-9f6bdeced846",
            // upper case, braces, urn, simple forms of a valid v4
            &id.to_string().to_uppercase(),
            &format!("{{{id}}}"),
            &format!("urn:uuid:{id}"),
            &id.to_string().replace('-', ""),
            &format!("{id}/../x"),
            &format!("{id}\0"),
        ] {
            let e = SessionId::parse("session_id", bad).expect_err(bad);
            assert!(e.starts_with("session_id: "), "{e}");
        }
    }
}
