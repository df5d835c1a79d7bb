//! Landlock: a second fence on the filesystem, applied by the program to itself. Everything
//! is readable and executable (the mounts decide what exists); only the writable areas accept
//! writes; the device nodes accept reads and writes. Signals and abstract unix sockets are
//! scoped to the sandbox where the kernel supports it (ABI 6).

use landlock::{
    ABI, Access, AccessFs, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use crate::restriction::{DEVICES, LANDLOCK_DEVICE, LANDLOCK_READ, SCRATCH};

/// Highest ABI we ask for; best-effort mode downgrades to what the kernel has.
const TARGET_ABI: ABI = ABI::V6;

/// Restrict this process with the rules of `crate::restriction` (which the fork server's
/// programs apply too); returns a line saying what was enforced.
pub fn restrict() -> Result<String, String> {
    let abi = TARGET_ABI;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| e.to_string())?
        .scope(Scope::from_all(abi))
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?;
    let read = BitFlags::<AccessFs>::from_bits_truncate(LANDLOCK_READ);
    ruleset = ruleset
        .add_rule(PathBeneath::new(
            PathFd::new("/").map_err(|e| e.to_string())?,
            read,
        ))
        .map_err(|e| e.to_string())?;
    for area in &SCRATCH {
        if let Ok(fd) = PathFd::new(area.target) {
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, AccessFs::from_all(abi)))
                .map_err(|e| e.to_string())?;
        }
    }
    for d in DEVICES {
        if let Ok(fd) = PathFd::new(d) {
            ruleset = ruleset
                .add_rule(PathBeneath::new(
                    fd,
                    BitFlags::<AccessFs>::from_bits_truncate(LANDLOCK_DEVICE),
                ))
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

    /// The shared policy's rights are the sets this crate's Landlock library means: reading
    /// beneath `/`, and using the device nodes as files.
    #[test]
    fn the_shared_rights_are_the_librarys_sets() {
        let abi = TARGET_ABI;
        assert_eq!(LANDLOCK_READ, AccessFs::from_read(abi).bits());
        assert_eq!(LANDLOCK_DEVICE, AccessFs::from_file(abi).bits());
        assert_eq!(
            BitFlags::<AccessFs>::from_bits_truncate(LANDLOCK_READ).bits(),
            LANDLOCK_READ
        );
        assert_eq!(
            BitFlags::<AccessFs>::from_bits_truncate(LANDLOCK_DEVICE).bits(),
            LANDLOCK_DEVICE
        );
    }
}
