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
