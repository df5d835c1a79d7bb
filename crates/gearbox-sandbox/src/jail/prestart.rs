//! Bash started before its run, on both warm paths that exec it: the exec fork server's slots
//! (`exec_zygote.rs`) and helper-built warm sandboxes (`init.rs`, hosts without fork servers).
//!
//! Most of a warm Bash call was bash's own `execve`, dynamic linking and start-up, paid after
//! the hand-over. Bash reads the file named by `BASH_ENV` before it opens its script, and a
//! pipe there blocks it: so the warm sandbox's program execs bash at once, restricted, with
//! the run's environment and `BASH_ENV` naming the read end of a pipe whose other end its
//! init holds. Once the hand-over has come and the run's files are written, init writes the
//! start-up ([`Prestart::start_up`]: the run's arguments, `SECONDS` from now, the pipe and
//! `BASH_ENV` gone) and closes the pipe; bash then opens its script as a cold bash does. A run
//! bash was not started for ([`Prestart::args_of`]) is given a fresh program instead.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::path::Path;

use gearbox_core::Limits;

use crate::wire::HandOver;

/// The command a warm sandbox's program is started with before its run, and its environment:
/// every run of the sandbox's pool has the same (the pool's key holds it).
pub(super) struct Prestart {
    /// The interpreter and the script, as the run's command starts.
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    /// The sandbox's limits, which a run's may lower (a fork server's slots).
    pub(super) slot: Limits,
}

/// Variables a bash reads as it starts, before `BASH_ENV`, or that change how it reads
/// `BASH_ENV` or runs the start-up: runs that set one are never started early.
const BASH_START_VARIABLES: [&str; 7] = [
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "POSIXLY_CORRECT",
    "BASH_XTRACEFD",
    "PS4",
];

impl Prestart {
    /// What to start before each run of a pool whose runs are `argv` (its template's: no
    /// arguments) with `env`, if anything: Bash run as `bash SCRIPT`, with none of
    /// [`BASH_START_VARIABLES`] and no exported function (which could stand in for the
    /// start-up's builtins) in its environment.
    pub(super) fn for_runs(
        argv: &[String],
        env: &[(String, String)],
        slot: &Limits,
    ) -> Option<Prestart> {
        let [interpreter, script] = argv else {
            return None;
        };
        let bash = Path::new(interpreter).file_name() == Some("bash".as_ref());
        let plain = env.iter().all(|(k, _)| {
            !BASH_START_VARIABLES.contains(&k.as_str()) && !k.starts_with("BASH_FUNC_")
        });
        (bash && plain && !script.starts_with('-') && !script.is_empty()).then(|| Prestart {
            argv: argv.to_vec(),
            env: env.iter().cloned().collect(),
            slot: *slot,
        })
    }

    /// The command and environment to exec before the run, bash reading its start-up from
    /// `fd`.
    pub(super) fn command(&self, fd: RawFd) -> (&[String], Vec<(String, String)>) {
        let mut env: Vec<(String, String)> = self.env.clone().into_iter().collect();
        env.push(("BASH_ENV".into(), format!("/proc/self/fd/{fd}")));
        (&self.argv, env)
    }

    /// The run's arguments, if the program was started for `handover` (with the program's
    /// environment `env`): its command starts with the program's, the environment is the
    /// same, and no argument holds a NUL (which the exec of the other path refuses).
    pub(super) fn args_of<'h>(
        &self,
        handover: &'h HandOver,
        env: &BTreeMap<String, String>,
    ) -> Option<&'h [String]> {
        let args = handover.argv.get(self.argv.len()..)?;
        (handover.argv.starts_with(&self.argv)
            && *env == self.env
            && args.iter().all(|a| !a.contains('\0')))
        .then_some(args)
    }

    /// What bash runs before its script, read from `fd`: `BASH_ENV` and the pipe gone, the
    /// run's arguments (each single-quoted), `SECONDS` counting from now, and `$_` as a cold
    /// bash starts with it (the path it was run by).
    pub(super) fn start_up(&self, args: &[String], fd: RawFd) -> String {
        let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
        let mut script = format!("unset BASH_ENV; exec {fd}<&-; set --");
        for a in args {
            script.push(' ');
            script.push_str(&quote(a));
        }
        script.push_str(&format!("; SECONDS=0; : {}\n", quote(&self.argv[0])));
        script
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_bash_running_a_script_without_start_up_variables_is_started_early() {
        let env = vec![("PATH".to_string(), "/usr/bin".to_string())];
        let l = Limits::default();
        assert!(Prestart::for_runs(&strings(&["/usr/bin/bash", "main.sh"]), &env, &l).is_some());
        for argv in [
            &["/usr/bin/python3", "main.py"][..],
            &["/usr/bin/bash", "-e", "main.sh"],
            &["/usr/bin/bash", "-x"],
            &["/usr/bin/bash"],
        ] {
            assert!(
                Prestart::for_runs(&strings(argv), &env, &l).is_none(),
                "{argv:?}"
            );
        }
        for name in [
            "SHELLOPTS",
            "POSIXLY_CORRECT",
            "BASH_ENV",
            "BASH_FUNC_set%%",
        ] {
            let mut env = env.clone();
            env.push((name.to_string(), "x".to_string()));
            let argv = strings(&["/usr/bin/bash", "main.sh"]);
            assert!(Prestart::for_runs(&argv, &env, &l).is_none(), "{name}");
        }
    }

    #[test]
    fn a_run_is_fed_only_to_the_bash_started_for_it() {
        let env = vec![("PATH".to_string(), "/usr/bin".to_string())];
        let p = Prestart::for_runs(
            &strings(&["/usr/bin/bash", "main.sh"]),
            &env,
            &Limits::default(),
        )
        .expect("bash");
        let same: BTreeMap<_, _> = env.iter().cloned().collect();
        let handover = |argv: &[&str]| HandOver {
            argv: strings(argv),
            program_argv: vec![],
            env: BTreeMap::new(),
            files: vec![],
            limits: None,
            cpu_s: None,
        };
        let h = handover(&["/usr/bin/bash", "main.sh", "a", "b"]);
        assert_eq!(p.args_of(&h, &same), Some(&h.argv[2..]));
        let h = handover(&["/usr/bin/bash", "main.sh"]);
        assert_eq!(p.args_of(&h, &same), Some(&[][..]));
        for argv in [
            &["/usr/bin/bash", "other.sh", "a"][..],
            &["/usr/bin/bash", "main.sh", "a\0b"],
            &["/usr/bin/bash"],
        ] {
            assert_eq!(p.args_of(&handover(argv), &same), None, "{argv:?}");
        }
        let mut other = same.clone();
        other.insert("FOO".into(), "1".into());
        assert_eq!(
            p.args_of(&handover(&["/usr/bin/bash", "main.sh"]), &other),
            None
        );
    }

    #[test]
    fn the_start_up_quotes_every_argument() {
        let p = Prestart::for_runs(
            &strings(&["/usr/bin/bash", "main.sh"]),
            &[],
            &Limits::default(),
        )
        .expect("bash");
        assert_eq!(
            p.start_up(&strings(&["a b", "it's", "", "$(x)`y`\n"]), 5),
            "unset BASH_ENV; exec 5<&-; set -- 'a b' 'it'\\''s' '' '$(x)`y`\n'; SECONDS=0; : '/usr/bin/bash'\n"
        );
    }
}
