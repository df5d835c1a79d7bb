//! Compiling the seccomp policy (`seccomp.json`) with seccompiler: done once, by `build.rs`,
//! which includes this file as a module of its own (it uses no other module of the crate);
//! the crate embeds the result (`seccomp.rs`). The crate's unit tests compile it again and
//! check the embedded filters are what this gives.

use seccompiler::{BpfProgram, TargetArch, sock_filter};
use serde_json::{Map, Value};

const POLICY: &str = include_str!("seccomp.json");
/// The filters a program runs under, in the order they are installed.
const FILTERS: &[&str] = &["allow", "enosys", "eafnosupport"];
/// The fork server's own version of `allow` (built by [`split_policy`]).
pub const SERVER_ALLOW: &str = "server_allow";
/// What the fork server's loop and each run's init need beyond `allow`, as refusals.
const FORK_SERVER: &str = "fork_server";
/// x32 system calls: x86_64's audit architecture, numbers with this bit set.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// The newest x86_64 system call the policy was reviewed against (`mseal`, Linux 6.10):
/// newer ones answer ENOSYS until a review adds them to `allow` or `refused`.
pub const NEWEST_REVIEWED: u32 = 462;
const ENOSYS: u32 = 38;

// Classic BPF as seccomp uses it (linux/filter.h, linux/seccomp.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGT_K: u16 = 0x25;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;

/// The target architecture `build.rs` compiles for (`CARGO_CFG_TARGET_ARCH`), or this
/// binary's own.
pub fn arch_named(name: &str) -> Result<TargetArch, String> {
    if name != "x86_64" {
        return Err(format!(
            "the seccomp policy is reviewed for x86_64 only, not {name}"
        ));
    }
    TargetArch::try_from(name).map_err(|e| e.to_string())
}

#[cfg(test)]
pub fn arch() -> Result<TargetArch, String> {
    arch_named(std::env::consts::ARCH)
}

/// The filters every program runs under, in the order they are installed.
pub fn compile(arch: TargetArch) -> Result<Vec<BpfProgram>, String> {
    build(policy()?, FILTERS, arch, true)
}

/// The policy split for a fork server: (the filters the fork server installs in itself,
/// the filter each program adds). A program under both answers every system call as one
/// under [`compile`]'s filters.
pub fn compile_split(arch: TargetArch) -> Result<(Vec<BpfProgram>, Vec<BpfProgram>), String> {
    split(arch, true)
}

fn split(arch: TargetArch, index: bool) -> Result<(Vec<BpfProgram>, Vec<BpfProgram>), String> {
    let mut server = build(
        split_policy()?,
        &[SERVER_ALLOW, FILTERS[1], FILTERS[2], FORK_SERVER],
        arch,
        index,
    )?;
    let program = server.split_off(3);
    Ok((server, program))
}

pub fn policy() -> Result<Map<String, Value>, String> {
    match serde_json::from_str(POLICY).map_err(|e| e.to_string())? {
        Value::Object(map) => Ok(map),
        _ => Err("seccomp.json is not an object".into()),
    }
}

/// Compile the filters `names` of `policy`, in that order, each behind [`guard`], and,
/// with `index`, each long one as its index ([`indexed`]) in front of the filter compiled
/// from its rules with arguments alone (what the index leaves to it).
fn build(
    mut policy: Map<String, Value>,
    names: &[&str],
    arch: TargetArch,
    index: bool,
) -> Result<Vec<BpfProgram>, String> {
    let mut selected = Map::new();
    for name in names {
        let mut filter = policy
            .remove(*name)
            .ok_or_else(|| format!("seccomp.json lacks filter {name}"))?;
        strip_comments(&mut filter);
        selected.insert(name.to_string(), filter);
    }
    let mut full = compile_json(&selected, arch)?;
    let conditional = if index {
        let mut reduced = selected.clone();
        for filter in reduced.values_mut() {
            keep_conditional(filter);
        }
        reduced.retain(|_, f| f["filter"].as_array().is_some_and(|r| !r.is_empty()));
        compile_json(&reduced, arch)?
    } else {
        seccompiler::BpfMap::new()
    };
    names
        .iter()
        .map(|name| {
            let f = full
                .remove(*name)
                .ok_or_else(|| format!("seccomp policy lacks filter {name}"))
                .and_then(guard)?;
            match conditional.get(*name) {
                Some(rest) if f.len() >= INDEX_FROM => Ok(indexed(&f, guard(rest.clone())?)),
                _ => Ok(f),
            }
        })
        .collect()
}

fn compile_json(
    filters: &Map<String, Value>,
    arch: TargetArch,
) -> Result<seccompiler::BpfMap, String> {
    // seccompiler reads its input through `io::Read`, which costs far more per byte than
    // parsing a string: it gets only the filters needed, compact and without comments.
    let text = serde_json::to_vec(filters).map_err(|e| e.to_string())?;
    seccompiler::compile_from_json(text.as_slice(), arch).map_err(|e| e.to_string())
}

/// Keep a filter's rules for the system calls it names with conditions on arguments: the
/// others have one answer whatever the arguments, which the index gives.
fn keep_conditional(filter: &mut Value) {
    let Some(rules) = filter["filter"].as_array_mut() else {
        return;
    };
    let conditional: std::collections::BTreeSet<String> = rules
        .iter()
        .filter(|r| r.get("args").is_some())
        .filter_map(|r| r["syscall"].as_str().map(String::from))
        .collect();
    rules.retain(|r| {
        r["syscall"]
            .as_str()
            .is_some_and(|s| conditional.contains(s))
    });
}

/// [`compile`] and [`compile_split`]'s filters without the index, whole, to check that the
/// index and the shortened filter behind it change no answer.
#[cfg(test)]
pub fn without_index(arch: TargetArch) -> Result<Vec<BpfProgram>, String> {
    let (server, program) = split(arch, false)?;
    Ok(build(policy()?, FILTERS, arch, false)?
        .into_iter()
        .chain(server)
        .chain(program)
        .collect())
}

/// Filters shorter than this are left as they are: the index would be most of them.
const INDEX_FROM: usize = 256;
const BPF_JA: u16 = 0x05;
const BPF_JSET_K: u16 = 0x45;
const BPF_AND_K: u16 = 0x54;
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;

/// An index in front of `rest`: a binary search over the system call number that returns
/// at once, for each number up to [`NEWEST_REVIEWED`], the answer `filter` gives it whatever
/// the arguments (found by running `filter` with the arguments unknown, as the kernel does
/// to cache answers), and goes on into `rest` for every other call (another architecture,
/// x32, a newer number, a call whose answer depends on its arguments). `rest` is `filter`
/// compiled from its rules with arguments alone: behind the same guard and architecture
/// check, with the same rules for each such call and the same default, it answers those
/// calls as `filter` does (`seccomp::tests::the_index_changes_no_answer` checks every
/// number). What changes is the cost of installing the filter: the kernel checks and
/// compiles every instruction and then runs the filter for every system call number, and
/// seccompiler's filter is a chain of comparisons 1,569 instructions long, walked to its
/// end for each number it does not name (`docs/PERFORMANCE.md`).
fn indexed(filter: &[sock_filter], rest: BpfProgram) -> BpfProgram {
    // Runs of consecutive numbers with the same constant answer (`None`: it depends on the
    // arguments, or could not be followed).
    let mut runs: Vec<(u32, Option<u32>)> = Vec::new();
    for nr in 0..=NEWEST_REVIEWED {
        let answer = constant_answer(filter, nr);
        if runs.last().is_none_or(|(_, a)| *a != answer) {
            runs.push((nr, answer));
        }
    }
    let mut index = vec![
        insn(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH),
        // Another architecture → into the filter (the jump's target is patched below).
        insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        insn(BPF_JA, 0, 0, 0),
        insn(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        // x32 or newer than the review → into the filter.
        insn(BPF_JGT_K, 0, 1, NEWEST_REVIEWED),
        insn(BPF_JA, 0, 0, 0),
    ];
    let mut into_filter = vec![2, 5];
    search(&runs, &mut index, &mut into_filter);
    let len = index.len();
    for at in into_filter {
        index[at].k = (len - at - 1) as u32;
    }
    index.extend(rest);
    index
}

/// Emit a binary search over `runs` (the accumulator holds the number): each leaf returns
/// its run's answer, or jumps into the filter (its position is pushed to `into_filter`).
fn search(runs: &[(u32, Option<u32>)], out: &mut BpfProgram, into_filter: &mut Vec<usize>) {
    if let [(_, answer)] = runs {
        match answer {
            Some(k) => out.push(insn(BPF_RET_K, 0, 0, *k)),
            None => {
                into_filter.push(out.len());
                out.push(insn(BPF_JA, 0, 0, 0));
            }
        }
        return;
    }
    let (low, high) = runs.split_at(runs.len() / 2);
    // At or above the upper half's first number → the jump to it; below → on.
    out.push(insn(BPF_JGE_K, 0, 1, high[0].0));
    let to_high = out.len();
    out.push(insn(BPF_JA, 0, 0, 0));
    search(low, out, into_filter);
    out[to_high].k = (out.len() - to_high - 1) as u32;
    search(high, out, into_filter);
}

/// The answer `filter` gives system call `nr` of x86_64 whatever its arguments, if its path
/// reads nothing but the number and the architecture; `None` otherwise. (The unit tests run
/// filters through an interpreter of their own, on purpose: one shared with this would
/// share its mistakes, and the index's check would pass on them.)
fn constant_answer(filter: &[sock_filter], nr: u32) -> Option<u32> {
    let (mut acc, mut pc) = (0u32, 0usize);
    for _ in 0..filter.len() {
        let i = filter.get(pc)?;
        let jump = |taken: bool| usize::from(if taken { i.jt } else { i.jf });
        pc += 1 + match i.code {
            BPF_LD_W_ABS => {
                acc = match i.k {
                    SECCOMP_DATA_NR => nr,
                    SECCOMP_DATA_ARCH => AUDIT_ARCH_X86_64,
                    _ => return None,
                };
                0
            }
            BPF_JA => i.k as usize,
            BPF_JEQ_K => jump(acc == i.k),
            BPF_JGT_K => jump(acc > i.k),
            BPF_JGE_K => jump(acc >= i.k),
            BPF_JSET_K => jump(acc & i.k != 0),
            BPF_AND_K => {
                acc &= i.k;
                0
            }
            BPF_RET_K => return Some(i.k),
            _ => return None,
        };
    }
    None
}

/// A BPF statement (`jt`, `jf` 0) or jump.
fn insn(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// `filter` with x32 system calls and those newer than the review answering ENOSYS, right
/// after seccompiler's architecture check (which it must start with).
fn guard(mut filter: BpfProgram) -> Result<BpfProgram, String> {
    let starts_with_arch_check = filter.len() > 3
        && filter[0] == insn(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH)
        && filter[1].code == BPF_JEQ_K
        && (filter[1].jt, filter[1].jf) == (1, 0)
        && filter[2].code == BPF_RET_K;
    if !starts_with_arch_check {
        return Err("a compiled seccomp filter does not start with its architecture check".into());
    }
    let checks = [
        insn(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_NR),
        // x32 → the ENOSYS return below; otherwise on.
        insn(BPF_JGE_K, 1, 0, X32_SYSCALL_BIT),
        // Newer than the review → ENOSYS; otherwise past it, to seccompiler's rules.
        insn(BPF_JGT_K, 0, 1, NEWEST_REVIEWED),
        insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
    ];
    filter.splice(3..3, checks);
    Ok(filter)
}

/// `seccomp.json` with the fork server's allow list added as `server_allow`: `allow` with
/// every system call that `fork_server` names allowed whatever its arguments.
pub fn split_policy() -> Result<Map<String, Value>, String> {
    let mut policy = policy()?;
    let granted: std::collections::BTreeSet<String> = rules(&policy, FORK_SERVER)?
        .iter()
        .filter_map(|r| r["syscall"].as_str().map(String::from))
        .collect();
    let mut server = policy
        .get(FILTERS[0])
        .cloned()
        .ok_or("seccomp.json lacks filter allow")?;
    // seccompiler would read a name with both a rule with arguments and one without as the
    // rule with arguments alone: drop `allow`'s rules for the granted names first.
    let mut kept: Vec<Value> = rules(&policy, FILTERS[0])?
        .iter()
        .filter(|r| !r["syscall"].as_str().is_some_and(|s| granted.contains(s)))
        .cloned()
        .collect();
    kept.extend(granted.iter().map(|name| {
        serde_json::json!({
            "syscall": name,
            "comment": "the fork server and each run's init need it; each program refuses it again (fork_server)",
        })
    }));
    server["filter"] = Value::Array(kept);
    policy.insert(SERVER_ALLOW.to_string(), server);
    Ok(policy)
}

/// Remove the comments of a filter's rules and of their conditions.
fn strip_comments(filter: &mut Value) {
    for rule in filter["filter"].as_array_mut().into_iter().flatten() {
        if let Some(rule) = rule.as_object_mut() {
            rule.remove("comment");
            let args = rule.get_mut("args").and_then(Value::as_array_mut);
            for arg in args.into_iter().flatten() {
                if let Some(arg) = arg.as_object_mut() {
                    arg.remove("comment");
                }
            }
        }
    }
}

pub fn rules<'a>(policy: &'a Map<String, Value>, name: &str) -> Result<&'a Vec<Value>, String> {
    policy
        .get(name)
        .and_then(|f| f["filter"].as_array())
        .ok_or_else(|| format!("seccomp.json lacks filter {name}"))
}

/// Filters as bytes: for each, its length in instructions (u32), then each instruction as
/// `code` (u16), `jt`, `jf` (u8) and `k` (u32), little-endian. What `build.rs` writes and
/// `seccomp.rs` reads back.
pub fn encode(filters: &[BpfProgram]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in filters {
        out.extend_from_slice(&(f.len() as u32).to_le_bytes());
        for i in f {
            out.extend_from_slice(&i.code.to_le_bytes());
            out.extend_from_slice(&[i.jt, i.jf]);
            out.extend_from_slice(&i.k.to_le_bytes());
        }
    }
    out
}
