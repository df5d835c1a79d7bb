//! Globs of tool names: `*` matches any run of characters (`/` included), `?` one character,
//! everything else itself. Small on purpose: the patterns are short and written by operators
//! and callers, and matching is linear in practice.

/// A pattern is 1 to 256 characters without NUL.
pub fn validate(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("empty pattern".into());
    }
    if pattern.len() > 256 {
        return Err("pattern longer than 256 characters".into());
    }
    if pattern.contains('\0') {
        return Err("pattern contains a NUL byte".into());
    }
    Ok(())
}

/// Whether `text` matches `pattern` as a whole.
pub fn matches(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    // Position of the last `*` and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) && p[pi] != '*' {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs() {
        assert!(matches("everything/*", "everything/echo"));
        assert!(matches("*", "a/b"));
        assert!(matches("*/get-*", "everything/get-sum"));
        assert!(matches("e?ho", "echo"));
        assert!(!matches("everything/*", "memory/read_graph"));
        assert!(!matches("everything/echo", "everything/echo2"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("a*b*c", "axxbyy"));
        assert!(matches("", ""));
        assert!(!matches("?", ""));
    }
}

/// Property tests: the allowlist's matcher agrees with a plain recursive definition of the
/// globs, so a pattern allows exactly the names it should. `PROPTEST_CASES` raises the case
/// count (`scripts/fuzz.sh`).
#[cfg(test)]
mod proptests {
    use proptest::prelude::*;

    use super::*;

    /// The definition: `*` any run of characters, `?` one character, anything else itself.
    fn reference(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', rest)) => (0..=t.len()).any(|i| reference(rest, &t[i..])),
            Some(('?', rest)) => !t.is_empty() && reference(rest, &t[1..]),
            Some((c, rest)) => t.first() == Some(c) && reference(rest, &t[1..]),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(gearbox_core::fuzz_cases(1024)))]

        #[test]
        fn matching_agrees_with_the_definition(
            pattern in "[ab/*?é]{0,8}",
            text in "[ab/é]{0,10}",
        ) {
            let p: Vec<char> = pattern.chars().collect();
            let t: Vec<char> = text.chars().collect();
            prop_assert_eq!(matches(&pattern, &text), reference(&p, &t));
        }

        #[test]
        fn any_pattern_and_name_never_panic(pattern in any::<String>(), text in any::<String>()) {
            let _ = validate(&pattern);
            let _ = matches(&pattern, &text);
            // A pattern without wildcards matches exactly itself.
            if !pattern.contains(['*', '?']) {
                prop_assert_eq!(matches(&pattern, &text), pattern == text);
                prop_assert!(matches(&pattern, &pattern));
            }
        }
    }
}
