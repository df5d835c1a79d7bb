//! Session ids: UUID v4 in their canonical form, the only form that ever becomes a path
//! component. A replica of a fleet shows them as `REPLICA.UUID` ([`set_replica`]), so any
//! replica can tell which one holds a session; the directory is still named by the UUID.

use std::fmt;
use std::sync::OnceLock;

use uuid::Uuid;

/// This process's replica name, once set.
static REPLICA: OnceLock<String> = OnceLock::new();

/// Name this process as a replica of a fleet: from now on ids are shown, and must be given,
/// as `NAME.UUID`. The caller has checked `name` is a DNS label (`gearbox_server`'s fleet
/// configuration). Once per process; a second call with another name fails.
pub fn set_replica(name: &str) -> Result<(), String> {
    let set = REPLICA.get_or_init(|| name.to_string());
    if set == name {
        Ok(())
    } else {
        Err(format!("this process is already replica {set:?}"))
    }
}

fn replica() -> Option<&'static str> {
    REPLICA.get().map(String::as_str)
}

/// A validated session id. The only way to build one is [`SessionId::parse`] (or
/// [`SessionId::new`]), so any `SessionId` is a UUID whose directory name is 36 characters of
/// lowercase hex and hyphens: safe as a directory name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(Uuid);

impl SessionId {
    /// A fresh random id.
    pub fn new() -> SessionId {
        SessionId(Uuid::new_v4())
    }

    /// Accept exactly the form [`fmt::Display`] shows: the canonical lowercase hyphenated
    /// form of a version-4, RFC 4122 UUID, after `REPLICA.` when this process is a replica
    /// (an id of another replica is refused like any unknown id). `field` names the argument
    /// in the error.
    pub fn parse(field: &str, s: &str) -> Result<SessionId, String> {
        parse_as(field, s, replica())
    }

    /// An id from a directory name: the bare UUID.
    pub fn from_dir_name(name: &str) -> Result<SessionId, String> {
        parse_as("entry", name, None)
    }

    /// The directory name of this session.
    pub fn dir_name(&self) -> String {
        self.0.hyphenated().to_string()
    }
}

fn parse_as(field: &str, s: &str, replica: Option<&str>) -> Result<SessionId, String> {
    let shown: String = s.chars().take(60).collect();
    let bad = || format!("{field}: {shown:?} is not a session id (a lowercase UUID v4)");
    let bare = match replica {
        None => s,
        Some(r) => s
            .strip_prefix(r)
            .and_then(|rest| rest.strip_prefix('.'))
            .ok_or_else(|| {
                format!("{field}: {shown:?} is not a session id of this server ({r}.UUID)")
            })?,
    };
    if bare.len() != 36 {
        return Err(bad());
    }
    let u = Uuid::try_parse(bare).map_err(|_| bad())?;
    if u.get_version_num() != 4
        || u.get_variant() != uuid::Variant::RFC4122
        || u.hyphenated().to_string() != bare
    {
        return Err(bad());
    }
    Ok(SessionId(u))
}

fn show(id: &SessionId, replica: Option<&str>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match replica {
        Some(r) => write!(f, "{r}.{}", id.0.hyphenated()),
        None => write!(f, "{}", id.0.hyphenated()),
    }
}

impl Default for SessionId {
    fn default() -> Self {
        SessionId::new()
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        show(self, replica(), f)
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

    #[test]
    fn a_replica_shows_and_wants_its_name_first() {
        struct Shown(SessionId, Option<&'static str>);
        impl fmt::Display for Shown {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                show(&self.0, self.1, f)
            }
        }
        let id = SessionId::new();
        let as_a = Shown(id, Some("gearbox-0")).to_string();
        assert_eq!(as_a, format!("gearbox-0.{}", id.dir_name()));
        assert_eq!(parse_as("id", &as_a, Some("gearbox-0")), Ok(id));
        assert_eq!(Shown(id, None).to_string(), id.dir_name());
        for bad in [
            id.dir_name(),
            format!("gearbox-1.{id}"),
            format!("gearbox-0{id}"),
            format!("gearbox-0..{id}"),
            format!("gearbox-0./{id}"),
            "gearbox-0.".to_string(),
        ] {
            let e = parse_as("session_id", &bad, Some("gearbox-0")).expect_err(&bad);
            assert!(e.starts_with("session_id: "), "{e}");
        }
        assert!(parse_as("id", &as_a, None).is_err());
        assert_eq!(SessionId::from_dir_name(&id.dir_name()), Ok(id));
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
