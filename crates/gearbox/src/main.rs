//! The gearbox binary: a thin layer of commands over the engine.
//!
//! `run` and `doctor` are for humans and scripts, `serve` speaks MCP, and the hidden `__jail`
//! is the sandbox helper the Linux and process backends re-execute. `__jail` is recognised
//! before anything else starts so that the helper stays single-threaded and quick.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "__jail") {
        gearbox_sandbox::jail_main();
    }
    cli::main()
}
