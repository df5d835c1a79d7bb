//! Landlock: a second fence on the filesystem, applied by the program to itself. Everything
//! is readable and executable (the mounts decide what exists); only the writable areas accept
//! writes; the device nodes accept reads and writes. Signals and abstract unix sockets are
//! scoped to the sandbox where the kernel supports it (ABI 6).

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};

/// Highest ABI we ask for; best-effort mode downgrades to what the kernel has.
const TARGET_ABI: ABI = ABI::V6;
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// Restrict this process; returns a line saying what was enforced.
pub fn restrict(writable: &[&str]) -> Result<String, String> {
    let abi = TARGET_ABI;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| e.to_string())?
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?;
    let read = AccessFs::from_read(abi);
    ruleset = ruleset
        .add_rule(PathBeneath::new(
            PathFd::new("/").map_err(|e| e.to_string())?,
            read,
        ))
        .map_err(|e| e.to_string())?;
    for w in writable {
        if let Ok(fd) = PathFd::new(w) {
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, AccessFs::from_all(abi)))
                .map_err(|e| e.to_string())?;
        }
    }
    for d in DEVICES {
        if let Ok(fd) = PathFd::new(d) {
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, AccessFs::from_file(abi)))
                .map_err(|e| e.to_string())?;
        }
    }
    let status = ruleset.restrict_self().map_err(|e| e.to_string())?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => "landlock: fully enforced".into(),
        RulesetStatus::PartiallyEnforced => {
            "landlock: partially enforced (older kernel ABI)".into()
        }
        RulesetStatus::NotEnforced => "landlock: not enforced (kernel lacks it)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use landlock::BitFlags;

    /// The fork server's programs build their ruleset in native code (`launchers/fork.rs`,
    /// built outside this crate): the same device nodes and writable areas as here.
    #[test]
    fn the_fork_servers_programs_use_the_same_rules() {
        let native = include_str!("../launchers/fork.rs");
        let block = |name: &str| -> String {
            let start = native
                .find(&format!("const {name}"))
                .unwrap_or_else(|| panic!("fork.rs lists {name}"));
            let body = start + native[start..].find("= [").expect("start of list");
            let end = body + native[body..].find("];").expect("end of list");
            native[start..end].to_string()
        };
        let devices = block("DEVICES");
        assert_eq!(
            devices.matches("b\"").count(),
            super::DEVICES.len(),
            "{devices}"
        );
        for d in super::DEVICES {
            assert!(devices.contains(&format!("b\"{d}\\0\"")), "{d}: {devices}");
        }
        // The access rights: the same bits, and the same sets as this module asks for.
        let value = |name: &str| -> u64 {
            let line = native
                .lines()
                .find(|l| l.starts_with(&format!("const {name}: u64 = ")))
                .unwrap_or_else(|| panic!("fork.rs defines {name}"));
            let v = line.rsplit("= ").next().unwrap_or("").trim_end_matches(';');
            match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            }
            .unwrap_or_else(|e| panic!("{line}: {e}"))
        };
        let abi = ABI::V6;
        let bits = |set: BitFlags<AccessFs>| set.bits();
        assert_eq!(value("LL_ABI1"), bits(AccessFs::from_all(ABI::V1)));
        for (name, right) in [
            ("LL_EXECUTE", AccessFs::Execute),
            ("LL_WRITE_FILE", AccessFs::WriteFile),
            ("LL_READ_FILE", AccessFs::ReadFile),
            ("LL_READ_DIR", AccessFs::ReadDir),
            ("LL_REFER", AccessFs::Refer),
            ("LL_TRUNCATE", AccessFs::Truncate),
            ("LL_IOCTL_DEV", AccessFs::IoctlDev),
        ] {
            assert_eq!(value(name), right as u64, "{name}");
        }
        assert_eq!(
            value("LL_ABI1") | value("LL_REFER") | value("LL_TRUNCATE") | value("LL_IOCTL_DEV"),
            bits(AccessFs::from_all(abi))
        );
        assert!(native.contains("let read = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR;"));
        assert_eq!(
            value("LL_EXECUTE") | value("LL_READ_FILE") | value("LL_READ_DIR"),
            bits(AccessFs::from_read(abi))
        );
        assert!(native.contains(
            "(LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | LL_TRUNCATE | LL_IOCTL_DEV) & handled"
        ));
        assert_eq!(
            value("LL_EXECUTE")
                | value("LL_WRITE_FILE")
                | value("LL_READ_FILE")
                | value("LL_TRUNCATE")
                | value("LL_IOCTL_DEV"),
            bits(AccessFs::from_file(abi))
        );
        assert_eq!(value("LL_SCOPE_ALL"), Scope::from_all(abi).bits());
        // The writable areas the cold path passes to `restrict` (jail/program.rs).
        let writable = block("WRITABLE");
        for w in ["/work", "/tmp", "/dev/shm"] {
            assert!(
                writable.contains(&format!("b\"{w}\\0\"")),
                "{w}: {writable}"
            );
        }
    }
}
