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

/// Property tests: a session id comes from a client and becomes a directory name. Whatever
/// it is, parsing answers without panicking and accepts exactly the canonical lowercase form
/// of a version-4 UUID (checked against a definition independent of the `uuid` crate), which
/// is one plain path component. `PROPTEST_CASES` raises the case count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use std::path::{Component, Path};

    use proptest::prelude::*;

    use super::*;

    /// `xxxxxxxx-xxxx-4xxx-Nxxx-xxxxxxxxxxxx`, lowercase hex, N one of 8, 9, a, b.
    fn canonical_v4(s: &str) -> bool {
        let b = s.as_bytes();
        b.len() == 36
            && b.iter().enumerate().all(|(i, &c)| match i {
                8 | 13 | 18 | 23 => c == b'-',
                _ => c.is_ascii_digit() || (b'a'..=b'f').contains(&c),
            })
            && b[14] == b'4'
            && matches!(b[19], b'8' | b'9' | b'a' | b'b')
    }

    fn candidate() -> impl Strategy<Value = String> {
        prop_oneof![
            "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-4[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}",
            "[0-9a-f/.{}%:-]{30,40}",
            any::<String>(),
            // A valid id with one character replaced or inserted.
            (any::<prop::sample::Index>(), any::<char>(), any::<bool>()).prop_map(
                |(i, c, insert)| {
                    let mut s: Vec<char> = SessionId::new().to_string().chars().collect();
                    let i = i.index(s.len());
                    if insert {
                        s.insert(i, c);
                    } else {
                        s[i] = c;
                    }
                    s.into_iter().collect()
                }
            ),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(512)))]

        #[test]
        fn exactly_canonical_v4_ids_are_accepted(s in candidate()) {
            match SessionId::parse("session_id", &s) {
                Ok(id) => {
                    prop_assert!(canonical_v4(&s), "{:?} accepted", s);
                    prop_assert_eq!(id.dir_name(), s.clone());
                    prop_assert_eq!(id.to_string(), s.clone());
                    let c: Vec<_> = Path::new(&s).components().collect();
                    prop_assert!(c.len() == 1 && matches!(c[0], Component::Normal(_)));
                }
                Err(e) => {
                    prop_assert!(!canonical_v4(&s), "{:?} refused", s);
                    prop_assert!(e.starts_with("session_id: "), "{}", e);
                    // The echoed value is bounded (60 characters, escaped).
                    prop_assert!(e.len() < 60 * 10 + 100, "{} bytes", e.len());
                }
            }
        }

        #[test]
        fn every_v4_id_round_trips(bytes in any::<[u8; 16]>()) {
            let id = SessionId(uuid::Builder::from_random_bytes(bytes).into_uuid());
            prop_assert!(canonical_v4(&id.to_string()));
            prop_assert_eq!(SessionId::parse("id", &id.to_string()), Ok(id));
        }
    }
}
