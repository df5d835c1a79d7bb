//! The seccomp policy: a reviewed deny list kept as data (`seccomp.json`, one entry per
//! syscall with the reason), compiled with seccompiler. Two filters: one answers EPERM, one
//! answers ENOSYS (for `clone3`, so libc falls back to `clone`, whose flags the first filter
//! can inspect).
//!
//! The Python fork server installs the same policy in two parts (see [`compile_split`]):
//! the rules it and each run's init do not need, once, in itself (every program inherits
//! them); the rest in each program. Each program ends under exactly the rules above, and
//! installs a filter of a few rules instead of the whole list (the kernel checks a new filter
//! against every system call number when it is installed, which showed in the fork
//! server's profile).

use seccompiler::{BpfProgram, TargetArch};
use serde_json::Value;

const POLICY: &str = include_str!("seccomp.json");
/// Filter names in `seccomp.json`, in the order they are installed.
const FILTERS: &[&str] = &["deny_eperm", "deny_enosys"];
/// The denied system calls that the fork server and each run's init make (new namespaces,
/// the run's mounts, its hostname): each program installs these rules itself.
const PROGRAM_ONLY: &[&str] = &["unshare", "mount", "umount2", "sethostname", "clone"];

fn arch() -> Result<TargetArch, String> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())
}

pub fn compile() -> Result<Vec<BpfProgram>, String> {
    let mut map =
        seccompiler::compile_from_json(POLICY.as_bytes(), arch()?).map_err(|e| e.to_string())?;
    FILTERS
        .iter()
        .map(|name| {
            map.remove(*name)
                .ok_or_else(|| format!("seccomp.json lacks filter {name}"))
        })
        .collect()
}

/// The policy split for a fork server: (the filters the fork server installs in itself,
/// the filter each program adds). Every rule of [`compile`]'s filters is in exactly one part.
pub fn compile_split() -> Result<(Vec<BpfProgram>, Vec<BpfProgram>), String> {
    let policy = split_policy()?;
    let text = serde_json::to_string(&policy).map_err(|e| e.to_string())?;
    let mut map =
        seccompiler::compile_from_json(text.as_bytes(), arch()?).map_err(|e| e.to_string())?;
    let mut take = |name: &str| {
        map.remove(name)
            .ok_or_else(|| format!("split policy lacks filter {name}"))
    };
    let server = vec![take("server_eperm")?, take("deny_enosys")?];
    let program = vec![take("program_eperm")?];
    Ok((server, program))
}

/// `seccomp.json` with `deny_eperm` split by [`PROGRAM_ONLY`] into `server_eperm` and
/// `program_eperm` (same actions, disjoint rules).
fn split_policy() -> Result<Value, String> {
    let mut policy: Value = serde_json::from_str(POLICY).map_err(|e| e.to_string())?;
    let map = policy
        .as_object_mut()
        .ok_or("seccomp.json is not an object")?;
    let eperm = map
        .remove("deny_eperm")
        .ok_or("seccomp.json lacks filter deny_eperm")?;
    let rules = eperm["filter"]
        .as_array()
        .ok_or("deny_eperm has no rules")?;
    let (program, server): (Vec<Value>, Vec<Value>) = rules.iter().cloned().partition(|r| {
        r["syscall"]
            .as_str()
            .is_some_and(|s| PROGRAM_ONLY.contains(&s))
    });
    for (name, part) in [("server_eperm", server), ("program_eperm", program)] {
        let mut filter = eperm.clone();
        filter["filter"] = Value::Array(part);
        map.insert(name.to_string(), filter);
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    #[test]
    fn policy_compiles() {
        let filters = super::compile().expect("policy compiles");
        assert_eq!(filters.len(), 2);
        assert!(filters.iter().all(|f| !f.is_empty()));
    }

    #[test]
    fn the_split_policy_keeps_every_rule_once() {
        let whole: serde_json::Value = serde_json::from_str(super::POLICY).expect("policy parses");
        let split = super::split_policy().expect("policy splits");
        let rules = |v: &serde_json::Value, name: &str| -> Vec<String> {
            v[name]["filter"]
                .as_array()
                .expect("a filter has rules")
                .iter()
                .map(|r| r.to_string())
                .collect()
        };
        let mut parts = rules(&split, "server_eperm");
        parts.extend(rules(&split, "program_eperm"));
        let mut all = rules(&whole, "deny_eperm");
        parts.sort();
        all.sort();
        assert_eq!(parts, all);
        assert_eq!(split["deny_enosys"], whole["deny_enosys"]);
        for name in ["server_eperm", "program_eperm"] {
            assert_eq!(
                split[name]["match_action"],
                whole["deny_eperm"]["match_action"]
            );
            assert_eq!(
                split[name]["mismatch_action"],
                whole["deny_eperm"]["mismatch_action"]
            );
        }
        // Every name the split moves to the programs is a rule of the policy.
        for s in super::PROGRAM_ONLY {
            assert!(
                rules(&split, "program_eperm")
                    .iter()
                    .any(|r| r.contains(&format!("\"{s}\""))),
                "{s} is not in the policy"
            );
        }
        let (server, program) = super::compile_split().expect("split policy compiles");
        assert_eq!((server.len(), program.len()), (2, 1));
    }
}
