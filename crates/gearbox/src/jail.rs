//! `gearbox-jail`: the sandbox helper alone, installed beside `gearbox`.
//!
//! Every sandbox starts with a fresh helper process. `gearbox __jail` is the same helper, but
//! starting the whole 60 MB `gearbox` (the server, the broker, wasmtime) costs ~0.7 ms more
//! per sandbox than this binary, which links only `gearbox-sandbox`'s helper code. The engine
//! uses it when it sits beside the running `gearbox` (`gearbox_sandbox::helper_beside`);
//! the two must come from the same build, which the helper checks.

fn main() {
    if std::env::args_os().nth(1).is_some_and(|a| a == "__jail") {
        gearbox_sandbox::jail_main();
    }
    eprintln!(
        "gearbox-jail is gearbox's sandbox helper, started by gearbox itself (build {})",
        gearbox_sandbox::HELPER_BUILD
    );
    std::process::exit(2);
}
