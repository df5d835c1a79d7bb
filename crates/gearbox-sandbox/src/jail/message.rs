//! What init (and the program, before exec) and the helper say to each other: the helper's
//! go bytes on the sync pipe, and one JSON line per message on the status pipe.

use std::os::fd::OwnedFd;

use crate::step::StepError;

/// Byte that lets init build the root.
pub const GO_BUILD: &[u8] = b"b";
/// Byte that lets init start the program, memory capped by the cgroup.
pub const GO_RUN_CGROUP: &[u8] = b"c";
/// Byte that lets init start the program, memory capped by rlimits (no cgroup).
pub const GO_RUN_RLIMITS: &[u8] = b"r";

/// One line the init process (or the program, before exec) sends the helper.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Msg {
    /// The program was forked; its time starts now.
    Started {
        /// Init's own work before the program started: building the root (cold), or from
        /// hand-over to start (warm).
        init_us: u64,
    },
    /// A warm sandbox is built and waits for its program.
    Ready { root_us: u64 },
    /// Mechanisms the program applied to itself before exec.
    Applied { mechanisms: Vec<String> },
    /// A set-up step failed.
    Failed { step: String, message: String },
    /// The program exited.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        cpu_time_ms: u64,
        max_rss_kb: u64,
    },
}

/// Longest message line: one atomic pipe write (init and the program share the pipe).
pub const MAX_MSG: usize = 3800;

impl Msg {
    /// A failed step, as its display text and message.
    pub fn failed(e: StepError) -> Msg {
        Msg::Failed {
            step: e.step.to_string(),
            message: e.message,
        }
    }

    /// Send as one line of at most [`MAX_MSG`] bytes: a longer `Failed` message is shortened
    /// (never the JSON itself, which would no longer parse).
    pub fn send(&self, fd: &OwnedFd) {
        if let Some(mut line) = self.encode() {
            line.push(b'\n');
            let _ = nix::unistd::write(fd, &line);
        }
    }

    /// The message as JSON of at most [`MAX_MSG`] bytes (see [`Msg::send`]).
    pub fn encode(&self) -> Option<Vec<u8>> {
        let line = serde_json::to_vec(self).ok()?;
        if line.len() <= MAX_MSG {
            return Some(line);
        }
        let Msg::Failed { step, message } = self else {
            return None;
        };
        let mut keep = message.len().min(MAX_MSG);
        loop {
            keep = keep * 3 / 4;
            let mut cut = keep;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            let short = Msg::Failed {
                step: step.chars().take(200).collect(),
                message: format!("{}… (shortened)", &message[..cut]),
            };
            let line = serde_json::to_vec(&short).ok()?;
            if line.len() <= MAX_MSG {
                return Some(line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_failure_is_shortened_and_still_parses() {
        for message in [
            "x".repeat(10_000),
            "\"\\é".repeat(5_000),
            "\u{1}".repeat(3_000),
        ] {
            let msg = Msg::Failed {
                step: "execve".into(),
                message: message.clone(),
            };
            let line = msg.encode().expect("encodes");
            assert!(line.len() <= MAX_MSG, "{}", line.len());
            match serde_json::from_slice::<Msg>(&line).expect("parses") {
                Msg::Failed { step, message: m } => {
                    assert_eq!(step, "execve");
                    assert!(m.ends_with("(shortened)"), "{m}");
                    assert!(message.starts_with(m.trim_end_matches("… (shortened)")));
                }
                other => panic!("{other:?}"),
            }
        }
        let short = Msg::Failed {
            step: "s".into(),
            message: "m".into(),
        };
        assert_eq!(
            short.encode().expect("encodes"),
            serde_json::to_vec(&short).expect("encodes")
        );
    }
}
