//! The seccomp policy: a reviewed deny list kept as data (`seccomp.json`, one entry per
//! syscall with the reason), compiled with seccompiler. Two filters: one answers EPERM, one
//! answers ENOSYS (for `clone3`, so libc falls back to `clone`, whose flags the first filter
//! can inspect).

use seccompiler::{BpfProgram, TargetArch};

const POLICY: &str = include_str!("seccomp.json");
/// Filter names in `seccomp.json`, in the order they are installed.
const FILTERS: &[&str] = &["deny_eperm", "deny_enosys"];

pub fn compile() -> Result<Vec<BpfProgram>, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| e.to_string())?;
    let mut map =
        seccompiler::compile_from_json(POLICY.as_bytes(), arch).map_err(|e| e.to_string())?;
    FILTERS
        .iter()
        .map(|name| {
            map.remove(*name)
                .ok_or_else(|| format!("seccomp.json lacks filter {name}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn policy_compiles() {
        let filters = super::compile().expect("policy compiles");
        assert_eq!(filters.len(), 2);
        assert!(filters.iter().all(|f| !f.is_empty()));
    }
}
