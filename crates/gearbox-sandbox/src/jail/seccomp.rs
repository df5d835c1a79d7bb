//! The seccomp policy: an allow list kept as data (`seccomp.json`, seccompiler's format, a
//! comment on every entry), compiled with seccompiler for x86_64.
//!
//! `seccomp.json` holds five filters:
//! - `allow`: what a program may call, some calls only with certain arguments (`clone`
//!   without namespace flags, `socket` of four families, `ioctl` without TIOCSTI...);
//!   anything else answers EPERM;
//! - `enosys` and `eafnosupport`, installed after it, refine what it refuses (between filters
//!   that refuse, the most recently installed one's errno wins): `clone3` answers ENOSYS, so
//!   libc falls back to `clone`, whose flags `allow` can inspect; a socket of a family
//!   `allow` does not name answers EAFNOSUPPORT, as a kernel without that family would;
//! - `fork_server`: what the fork server's loop and each run's init call that `allow`
//!   refuses (new namespaces, the run's mounts, its hostname), as rules that refuse them;
//! - `refused`: the review's record of what is refused and why. Never installed (anything
//!   `allow` does not name is refused): unit tests check that every x86_64 system call up to
//!   the newest one reviewed is in `allow`, `refused`, `fork_server` or `enosys`, and that
//!   each one in `refused` is refused.
//!
//! Every compiled filter starts, after seccompiler's architecture check (any other audit
//! architecture, i386 included, kills the process), with two checks of its own ([`guard`]):
//! x32 system calls (x86_64 numbers with bit 30 set, which reach a filter with x86_64's audit
//! architecture, and which seccompiler's rules never name) and numbers above the newest
//! system call reviewed answer ENOSYS, as a kernel without them would.
//!
//! A program runs under `allow`, `enosys` and `eafnosupport` ([`compile`]). The Python and
//! Node fork servers install the policy in two parts ([`compile_split`]): in themselves,
//! once, the same three filters with `allow` granting the system calls `fork_server` names
//! whatever their arguments (every program inherits them); in each program, the
//! `fork_server` filter, which refuses those again. Each program thus ends under exactly
//! the cold path's answers (a unit test runs both through a BPF interpreter), and installs a
//! filter of a few rules instead of the whole list (the kernel checks a new filter against
//! every system call number when it is installed, which showed in the fork server's
//! profile).

use seccompiler::{BpfProgram, sock_filter};

#[cfg(test)]
#[path = "seccomp_compile.rs"]
mod compiler;
#[cfg(test)]
use compiler::{NEWEST_REVIEWED, SERVER_ALLOW, arch, policy, rules, split_policy};

/// The filters every program runs under, in the order they are installed: compiled by
/// `build.rs` (`seccomp_compile.rs`), so no run pays for compiling them.
const COLD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp-cold.bin"));
/// The fork server's own filters, then the one each of its programs adds.
const SPLIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/seccomp-split.bin"));

/// The filters every program runs under, in the order they are installed.
pub fn compile() -> Result<Vec<BpfProgram>, String> {
    let filters = decode(COLD)?;
    if filters.len() != 3 {
        return Err(unreviewed(filters.len(), 3));
    }
    Ok(filters)
}

/// Why the embedded filters are not the expected number: `build.rs` embeds none for a
/// target the policy was not reviewed for.
fn unreviewed(found: usize, expected: usize) -> String {
    format!(
        "{found} seccomp filters embedded, not {expected}: the policy is reviewed for x86_64 \
         only, not {}",
        std::env::consts::ARCH
    )
}

/// The policy split for a fork server: (the filters the fork server installs in itself,
/// the filter each program adds). A program under both answers every system call as one
/// under [`compile`]'s filters.
pub fn compile_split() -> Result<(Vec<BpfProgram>, Vec<BpfProgram>), String> {
    let mut server = decode(SPLIT)?;
    if server.len() != 4 {
        return Err(unreviewed(server.len(), 4));
    }
    let program = server.split_off(3);
    Ok((server, program))
}

/// The filters `compiler::encode` wrote.
fn decode(bytes: &[u8]) -> Result<Vec<BpfProgram>, String> {
    let short = || "the embedded seccomp filters are cut short".to_string();
    let mut filters = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = bytes.get(at..at + 4).ok_or_else(short)?;
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        at += 4;
        let body = bytes.get(at..at + 8 * len).ok_or_else(short)?;
        at += 8 * len;
        let f = body
            .chunks_exact(8)
            .map(|i| sock_filter {
                code: u16::from_le_bytes([i[0], i[1]]),
                jt: i[2],
                jf: i[3],
                k: u32::from_le_bytes([i[4], i[5], i[6], i[7]]),
            })
            .collect();
        filters.push(f);
    }
    Ok(filters)
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use seccompiler::{BpfProgram, sock_filter};
    use serde_json::Value;

    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;
    const ALLOW: u32 = 0x7FFF_0000;
    const KILL_PROCESS: u32 = 0x8000_0000;
    const fn errno(e: u32) -> u32 {
        0x0005_0000 | e
    }
    const EPERM: u32 = errno(1);
    const ENOSYS: u32 = errno(38);
    const EAFNOSUPPORT: u32 = errno(97);

    /// One system call as a filter sees it (`struct seccomp_data`).
    #[derive(Clone, Copy, Debug)]
    struct Call {
        arch: u32,
        nr: u32,
        args: [u64; 6],
    }

    fn call(nr: u32, args: &[u64]) -> Call {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Call {
            arch: AUDIT_ARCH_X86_64,
            nr,
            args: a,
        }
    }

    /// Run one filter over `c` as the kernel would (the instructions seccompiler and
    /// [`super::guard`] emit).
    fn run(filter: &[sock_filter], c: &Call) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&c.nr.to_ne_bytes());
        data[4..8].copy_from_slice(&c.arch.to_ne_bytes());
        for (i, a) in c.args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
        }
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let i = &filter[pc];
            let k = i.k;
            let jump = |taken: bool| usize::from(if taken { i.jt } else { i.jf });
            pc += 1 + match i.code {
                0x20 => {
                    let at = k as usize;
                    acc = u32::from_ne_bytes(data[at..at + 4].try_into().expect("4 bytes"));
                    0
                }
                0x05 => k as usize,
                0x15 => jump(acc == k),
                0x25 => jump(acc > k),
                0x35 => jump(acc >= k),
                0x45 => jump(acc & k != 0),
                0x54 => {
                    acc &= k;
                    0
                }
                0x06 => return k,
                code => panic!("unexpected BPF instruction {code:#x}"),
            };
        }
    }

    /// The kernel's answer under several filters (installed in this order): the most
    /// restrictive action; between equal actions, the most recently installed filter's.
    fn verdict(filters: &[&BpfProgram], c: &Call) -> u32 {
        let mut answer = ALLOW;
        for f in filters.iter().rev() {
            let r = run(f, c);
            if ((r & 0xFFFF_0000) as i32) < ((answer & 0xFFFF_0000) as i32) {
                answer = r;
            }
        }
        answer
    }

    fn cold() -> Vec<BpfProgram> {
        super::compile().expect("policy compiles")
    }

    fn split() -> (Vec<BpfProgram>, Vec<BpfProgram>) {
        super::compile_split().expect("split policy compiles")
    }

    fn policy() -> serde_json::Map<String, Value> {
        super::policy().expect("policy parses")
    }

    /// The names of the system calls a filter of `seccomp.json` has rules for.
    fn names(filter: &str) -> BTreeSet<String> {
        super::rules(&policy(), filter)
            .expect("a filter")
            .iter()
            .map(|r| r["syscall"].as_str().expect("a name").to_string())
            .collect()
    }

    /// A system call's number, from seccompiler's table (a one-rule filter's comparison).
    fn nr(name: &str) -> u32 {
        let text = serde_json::json!({"f": {"mismatch_action": "allow",
            "match_action": {"errno": 1}, "filter": [{"syscall": name}]}});
        let map = seccompiler::compile_from_json(
            text.to_string().as_bytes(),
            super::arch().expect("x86_64"),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let f = &map["f"];
        assert_eq!((f[3].code, f[3].k, f[4].code), (0x20, 0, 0x15), "{f:?}");
        f[4].k
    }

    /// What the build embedded is what the policy compiles to now (`build.rs` reruns when
    /// `seccomp.json` changes; this catches an embedding that went stale or wrong).
    #[test]
    fn the_embedded_filters_are_the_policy_compiled() {
        use super::compiler::{compile, compile_split, encode};
        let arch = super::arch().expect("x86_64");
        let compiled = compile(arch).expect("policy compiles");
        assert_eq!(super::COLD, encode(&compiled).as_slice());
        assert_eq!(cold(), compiled);
        let (server, program) = compile_split(arch).expect("split");
        assert_eq!(split(), (server.clone(), program.clone()));
        assert_eq!(super::SPLIT, encode(&[server, program].concat()).as_slice());
    }

    /// The index in front of each long filter and the shortened filter behind it
    /// (`compiler::indexed`) change no answer: every filter, indexed and whole, over every
    /// number up to past the review, x32 numbers, three architectures, and arguments from
    /// none to all bits set, and every value a rule of the policy compares one with.
    #[test]
    fn the_index_changes_no_answer() {
        use super::compiler::{compile, compile_split, without_index};
        let arch = super::arch().expect("x86_64");
        let (server, program) = compile_split(arch).expect("split");
        let indexed: Vec<BpfProgram> = compile(arch)
            .expect("policy compiles")
            .into_iter()
            .chain(server)
            .chain(program)
            .collect();
        let whole = without_index(arch).expect("filters without the index");
        assert_eq!(indexed.len(), whole.len());
        let shortened = indexed
            .iter()
            .zip(&whole)
            .filter(|(i, w)| i.len() < w.len());
        assert!(shortened.count() >= 2, "the allow lists are indexed");
        let mut args: Vec<[u64; 6]> = vec![[0; 6], [u64::MAX; 6], [1, 2, 3, 4, 5, 6]];
        for (_, filter) in policy() {
            for rule in filter["filter"].as_array().into_iter().flatten() {
                for arg in rule["args"].as_array().into_iter().flatten() {
                    if let Some(v) = arg["val"].as_u64() {
                        args.push([v; 6]);
                    }
                }
            }
        }
        let numbers = (0..700u32)
            .chain((0..700u32).map(|n| n | 0x4000_0000))
            .chain([u32::MAX, 0x7FFF_FFFF]);
        let mut checked = 0;
        for nr in numbers {
            for arch in [AUDIT_ARCH_X86_64, AUDIT_ARCH_I386, 0] {
                for a in &args {
                    let c = Call { arch, nr, args: *a };
                    for (i, w) in indexed.iter().zip(&whole) {
                        assert_eq!(run(i, &c), run(w, &c), "{c:?}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 10_000);
    }

    #[test]
    fn policy_compiles() {
        let filters = cold();
        assert_eq!(filters.len(), 3);
        let (server, program) = split();
        assert_eq!((server.len(), program.len()), (3, 1));
        for f in filters.iter().chain(&server).chain(&program) {
            // Under seccomp's limit of 4096 instructions.
            assert!(f.len() > 7 && f.len() < 4096, "{}", f.len());
        }
    }

    #[test]
    fn every_entry_has_a_comment() {
        for (name, filter) in policy() {
            let rules = filter["filter"].as_array().expect("rules");
            assert!(!rules.is_empty(), "{name}");
            for rule in rules {
                let comment = rule["comment"].as_str().unwrap_or("");
                assert!(comment.trim().len() > 10, "{name}: {rule} has no comment");
                for arg in rule["args"].as_array().into_iter().flatten() {
                    let comment = arg["comment"].as_str().unwrap_or("");
                    assert!(!comment.is_empty(), "{name}: {rule}: {arg} has no comment");
                }
            }
        }
    }

    #[test]
    fn every_system_call_is_reviewed() {
        let (allow, refused) = (names("allow"), names("refused"));
        let (fork_server, enosys) = (names("fork_server"), names("enosys"));
        assert!(
            allow.is_disjoint(&refused),
            "{:?}",
            allow.intersection(&refused)
        );
        assert!(fork_server.is_disjoint(&refused));
        assert!(enosys.is_disjoint(&allow) && enosys.is_disjoint(&refused));
        // Only clone is both allowed (without namespace flags) and named by fork_server.
        assert_eq!(
            allow.intersection(&fork_server).collect::<Vec<_>>(),
            ["clone"]
        );
        let reviewed: BTreeSet<u32> = allow
            .iter()
            .chain(&refused)
            .chain(&fork_server)
            .chain(&enosys)
            .map(|n| nr(n))
            .collect();
        // x86_64's table: 0..=335, then 424 on (the numbers between were never assigned).
        for n in (0..=335).chain(424..=super::NEWEST_REVIEWED) {
            assert!(reviewed.contains(&n), "system call {n} is in no list");
        }
        // What the record says is refused is refused, whatever the arguments.
        let filters = cold();
        let filters: Vec<&BpfProgram> = filters.iter().collect();
        for name in refused
            .iter()
            .chain(&enosys)
            .chain(fork_server.difference(&allow))
        {
            let n = nr(name);
            for args in [[0; 6], [u64::MAX; 6], [1; 6]] {
                let v = verdict(&filters, &call(n, &args));
                assert!(v == EPERM || v == ENOSYS, "{name} {args:?}: {v:#x}");
            }
        }
    }

    const CLONE_NAMESPACES: [u64; 7] = [
        0x0002_0000,
        0x0200_0000,
        0x0400_0000,
        0x0800_0000,
        0x1000_0000,
        0x2000_0000,
        0x4000_0000,
    ];
    /// CLONE_VM | FS | FILES | SIGHAND | THREAD | SYSVSEM | SETTLS | PARENT_SETTID |
    /// CHILD_CLEARTID: a thread, as glibc makes one.
    const CLONE_THREAD_FLAGS: u64 = 0x003D_0F00;

    /// Calls whose answer the policy decides, with that answer.
    fn expected_answers() -> Vec<(&'static str, Call, u32)> {
        let (af_unix, af_inet, af_inet6, af_netlink) = (1, 2, 10, 16);
        let (stream, dgram, raw, seqpacket, packet) = (1, 2, 3, 5, 10);
        let cloexec = 0x80000;
        let mut calls = vec![
            ("getpid", call(39, &[]), ALLOW),
            ("read", call(0, &[0, 0, 0]), ALLOW),
            ("x32 getpid", call(0x4000_0000 | 39, &[]), ENOSYS),
            ("x32 read", call(0x4000_0000, &[]), ENOSYS),
            ("x32 readv (x32 only)", call(0x4000_0000 | 515, &[]), ENOSYS),
            (
                "newer than the review",
                call(super::NEWEST_REVIEWED + 1, &[]),
                ENOSYS,
            ),
            ("far beyond", call(0x3FFF_FFFF, &[]), ENOSYS),
            ("never assigned", call(400, &[]), EPERM),
            (
                "i386 getpid",
                Call {
                    arch: AUDIT_ARCH_I386,
                    ..call(20, &[])
                },
                KILL_PROCESS,
            ),
            ("modify_ldt", call(154, &[0, 0, 0]), EPERM),
            ("process_madvise", call(440, &[]), EPERM),
            ("ptrace", call(101, &[]), EPERM),
            ("io_uring_setup", call(425, &[1, 0]), EPERM),
            ("bpf", call(321, &[]), EPERM),
            ("keyctl", call(250, &[]), EPERM),
            ("unshare", call(272, &[0x1000_0000]), EPERM),
            ("mount", call(165, &[]), EPERM),
            ("sethostname", call(170, &[]), EPERM),
            ("clone3", call(435, &[]), ENOSYS),
            ("clone, a thread", call(56, &[CLONE_THREAD_FLAGS]), ALLOW),
            ("clone, fork", call(56, &[0x0120_0011]), ALLOW),
            ("clone, vfork", call(56, &[0x4111]), ALLOW),
            ("personality query", call(135, &[0xFFFF_FFFF]), ALLOW),
            ("personality default", call(135, &[0]), ALLOW),
            (
                "personality ADDR_NO_RANDOMIZE",
                call(135, &[0x0004_0000]),
                EPERM,
            ),
            (
                "personality READ_IMPLIES_EXEC",
                call(135, &[0x0040_0000]),
                EPERM,
            ),
            ("ioctl TCGETS", call(16, &[0, 0x5401]), ALLOW),
            ("ioctl SIOCSIFFLAGS", call(16, &[3, 0x8914]), ALLOW),
            ("ioctl TIOCSTI", call(16, &[0, 0x5412]), EPERM),
            (
                "ioctl TIOCSTI, high bits",
                call(16, &[0, 0x1_0000_5412]),
                EPERM,
            ),
            ("ioctl TIOCLINUX", call(16, &[0, 0x541C]), EPERM),
            ("ioctl TIOCSETD", call(16, &[0, 0x5423]), EPERM),
            (
                "socket AF_UNIX",
                call(41, &[af_unix, stream | cloexec, 0]),
                ALLOW,
            ),
            (
                "socket AF_UNIX dgram",
                call(41, &[af_unix, dgram, 0]),
                ALLOW,
            ),
            ("socket AF_INET tcp", call(41, &[af_inet, stream, 0]), ALLOW),
            (
                "socket AF_INET tcp 6",
                call(41, &[af_inet, stream | cloexec, 6]),
                ALLOW,
            ),
            (
                "socket AF_INET udp",
                call(41, &[af_inet, dgram | 0x800, 17]),
                ALLOW,
            ),
            ("socket AF_INET ping", call(41, &[af_inet, dgram, 1]), ALLOW),
            (
                "socket AF_INET6 tcp",
                call(41, &[af_inet6, stream, 0]),
                ALLOW,
            ),
            (
                "socket AF_INET6 ping",
                call(41, &[af_inet6, dgram, 58]),
                ALLOW,
            ),
            ("socket AF_INET raw", call(41, &[af_inet, raw, 1]), EPERM),
            (
                "socket AF_INET SOCK_PACKET",
                call(41, &[af_inet, packet, 0x300]),
                EPERM,
            ),
            (
                "socket AF_INET sctp",
                call(41, &[af_inet, stream, 132]),
                EPERM,
            ),
            (
                "socket AF_INET6 seqpacket",
                call(41, &[af_inet6, seqpacket, 0]),
                EPERM,
            ),
            ("socket AF_INET dccp", call(41, &[af_inet, 6, 33]), EPERM),
            (
                "socket AF_INET mptcp",
                call(41, &[af_inet, stream, 262]),
                EPERM,
            ),
            (
                "socket NETLINK_ROUTE",
                call(41, &[af_netlink, raw | cloexec, 0]),
                ALLOW,
            ),
            (
                "socket NETLINK_ROUTE dgram",
                call(41, &[af_netlink, dgram, 0]),
                ALLOW,
            ),
            (
                "socket NETLINK_AUDIT",
                call(41, &[af_netlink, raw, 9]),
                EPERM,
            ),
            (
                "socket NETLINK_SOCK_DIAG",
                call(41, &[af_netlink, raw, 4]),
                EPERM,
            ),
            (
                "socket NETLINK_KOBJECT_UEVENT",
                call(41, &[af_netlink, dgram, 15]),
                EPERM,
            ),
            ("socket AF_VSOCK", call(41, &[40, stream, 0]), EAFNOSUPPORT),
            (
                "socket AF_PACKET",
                call(41, &[17, raw, 0x300]),
                EAFNOSUPPORT,
            ),
            ("socket AF_ALG", call(41, &[38, seqpacket, 0]), EAFNOSUPPORT),
            (
                "socket AF_BLUETOOTH",
                call(41, &[31, stream, 0]),
                EAFNOSUPPORT,
            ),
            ("socket AF_UNSPEC", call(41, &[0, stream, 0]), EAFNOSUPPORT),
            (
                "socket AF_VSOCK, high bits",
                call(41, &[0x1_0000_0028, stream, 0]),
                EAFNOSUPPORT,
            ),
            (
                "socket AF_INET, high bits",
                call(41, &[0x1_0000_0002, stream, 0]),
                ALLOW,
            ),
            ("socketpair AF_UNIX", call(53, &[af_unix, stream, 0]), ALLOW),
            (
                "socketpair AF_INET",
                call(53, &[af_inet, stream, 0]),
                EAFNOSUPPORT,
            ),
            ("sync", call(162, &[]), EPERM),
            ("set_thread_area", call(205, &[]), EPERM),
            ("prctl", call(157, &[15]), ALLOW),
            ("seccomp", call(317, &[1, 0, 0]), ALLOW),
            ("landlock_restrict_self", call(446, &[3, 0]), ALLOW),
            ("capset", call(126, &[]), ALLOW),
            ("prlimit64", call(302, &[]), ALLOW),
        ];
        for flag in CLONE_NAMESPACES {
            calls.push(("clone into a namespace", call(56, &[flag | 17]), EPERM));
        }
        calls
    }

    #[test]
    fn the_policy_answers_as_reviewed() {
        let filters = cold();
        let filters: Vec<&BpfProgram> = filters.iter().collect();
        for (what, c, expected) in expected_answers() {
            assert_eq!(verdict(&filters, &c), expected, "{what}: {c:?}");
        }
    }

    #[test]
    fn every_filter_refuses_x32_and_unreviewed_calls_on_its_own() {
        let (server, program) = split();
        for f in cold().iter().chain(&server).chain(&program) {
            for nr in [
                0x4000_0000 | 39,
                0x4000_0000 | 272,
                super::NEWEST_REVIEWED + 1,
            ] {
                assert_eq!(run(f, &call(nr, &[])), ENOSYS, "{nr:#x}");
            }
            let i386 = Call {
                arch: AUDIT_ARCH_I386,
                ..call(39, &[])
            };
            assert_eq!(run(f, &i386), KILL_PROCESS);
        }
    }

    #[test]
    fn a_forked_program_answers_as_a_cold_one() {
        let cold = cold();
        let cold: Vec<&BpfProgram> = cold.iter().collect();
        let (server, program) = split();
        let forked: Vec<&BpfProgram> = server.iter().chain(&program).collect();
        let mut args: Vec<[u64; 6]> = vec![[0; 6], [u64::MAX; 6], [1; 6], [2; 6]];
        for flag in CLONE_NAMESPACES {
            args.push([flag | 17, 0, 0, 0, 0, 0]);
            args.push([flag | CLONE_THREAD_FLAGS, 0, 0, 0, 0, 0]);
        }
        args.push([CLONE_THREAD_FLAGS, 0, 0, 0, 0, 0]);
        for family in [0, 1, 2, 10, 16, 17, 38, 40] {
            for (kind, proto) in [(1, 0), (2, 0), (3, 0), (2, 17), (1, 132), (3, 9), (10, 0)] {
                args.push([family, kind, proto, 0, 0, 0]);
            }
        }
        for request in [0x5401, 0x5412, 0x541C, 0x5423, 0x8914] {
            args.push([0, request, 0, 0, 0, 0]);
        }
        let mut answers = BTreeMap::new();
        for nr in (0..600).chain((0..600).map(|n| n | 0x4000_0000)) {
            for a in &args {
                let c = Call {
                    arch: AUDIT_ARCH_X86_64,
                    nr,
                    args: *a,
                };
                let want = verdict(&cold, &c);
                assert_eq!(verdict(&forked, &c), want, "{c:?}");
                *answers.entry(want).or_insert(0) += 1;
            }
        }
        // Not vacuous: the calls above meet every answer of the policy.
        for a in [ALLOW, EPERM, ENOSYS, EAFNOSUPPORT] {
            assert!(answers.contains_key(&a), "{answers:?}");
        }
    }

    #[test]
    fn the_fork_server_and_a_runs_init_may_build_runs() {
        let (server, program) = split();
        let server: Vec<&BpfProgram> = server.iter().collect();
        let mut forked = server.clone();
        forked.extend(&program);
        // What launchers/fork/ calls after installing the fork server's part: the loop's
        // clone into new namespaces (a user namespace too), init's cgroup namespace, mounts,
        // hostname, loopback; the program's own restrictions.
        let built = [
            ("clone a run's init", call(56, &[0x6C02_0000 | 17])),
            ("clone with a user namespace", call(56, &[0x7C02_0000 | 17])),
            ("unshare a cgroup namespace", call(272, &[0x0200_0000])),
            ("unshare a user namespace", call(272, &[0x1000_0000])),
            ("mount", call(165, &[1, 2, 3, 0x1000, 0])),
            ("umount2", call(166, &[1, 2])),
            ("sethostname", call(170, &[1, 7])),
            ("loopback socket", call(41, &[2, 2, 0])),
            ("loopback flags", call(16, &[3, 0x8914, 0])),
            ("capset", call(126, &[1, 2])),
            ("prctl", call(157, &[22, 2, 0])),
            ("landlock_create_ruleset", call(444, &[0, 0, 1])),
            ("prlimit64", call(302, &[0, 7, 0, 0])),
            ("setsid", call(112, &[])),
        ];
        for (what, c) in built {
            assert_eq!(verdict(&server, &c), ALLOW, "fork server: {what}");
        }
        for (what, c) in &built[..7] {
            assert_eq!(verdict(&forked, c), EPERM, "program: {what}");
        }
    }

    #[test]
    fn the_split_policy_grants_the_fork_server_exactly_what_it_names() {
        let whole = policy();
        let split = super::split_policy().expect("policy splits");
        let granted = names("fork_server");
        let server = super::rules(&split, super::SERVER_ALLOW).expect("server_allow");
        // allow's rules for other system calls, unchanged and once each...
        let others = |rules: &Vec<Value>| -> Vec<String> {
            let mut v: Vec<String> = rules
                .iter()
                .filter(|r| !granted.contains(r["syscall"].as_str().unwrap_or("")))
                .map(|r| r.to_string())
                .collect();
            v.sort();
            v
        };
        let allow = super::rules(&whole, "allow").expect("allow");
        assert_eq!(others(server), others(allow));
        // ...and one rule without arguments for each granted one.
        for name in &granted {
            let mine: Vec<&Value> = server
                .iter()
                .filter(|r| r["syscall"] == name.as_str())
                .collect();
            assert_eq!(mine.len(), 1, "{name}");
            assert!(mine[0].get("args").is_none(), "{name}");
        }
        for key in ["mismatch_action", "match_action"] {
            assert_eq!(split[super::SERVER_ALLOW][key], whole["allow"][key]);
        }
        for name in ["enosys", "eafnosupport", "fork_server"] {
            assert_eq!(split[name], whole[name]);
        }
    }
}
