//! What the fork server serves with: the limits it was given, the interpreter's name, and
//! the seccomp filters, read once before it serves ([`gb_config`]).

use std::ffi::{c_char, c_int};

use super::sys::SockFprog;

/// What the fork server serves with, built by [`gb_config`].
#[repr(C)]
pub struct Config {
    pub(crate) control_fd: c_int,
    pub(crate) disk_mb: u64,
    pub(crate) open_files: u64,
    pub(crate) cpu_s: u64,
    pub(crate) nfilters: u32,
    pub(crate) filters: *const *const SockFprog,
    /// The interpreter's own process name, NUL-terminated, which each program takes back.
    pub(crate) program_name: *const c_char,
    /// How many seccomp filters the fork server installs in itself (every program inherits
    /// them; `filters` are the rest of the policy), and they.
    pub(crate) inherited: u32,
    pub(crate) server_filters: *const *const SockFprog,
}

/// The fork server's config: the limits given, the interpreter's own name (read now, before
/// the fork server renames itself; each program takes it back), and the seccomp policy in
/// two parts from `/.gearbox` (`jail/seccomp.rs`, `compile_split`): `seccomp-server-N.bpf`,
/// which `gb_serve` (`serve.rs`) installs in the fork server, and `seccomp-N.bpf`, which each
/// program adds. Lives as long as the process; null if the filters cannot be read.
///
/// # Safety
/// Reads files and allocates: call before serving, from one thread.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gb_config(
    control_fd: c_int,
    disk_mb: u64,
    open_files: u64,
    cpu_s: u64,
) -> *const Config {
    let name = std::fs::read("/proc/self/comm").unwrap_or_default();
    let name = std::ffi::CString::new(name.trim_ascii()).unwrap_or_default();
    let mut names: Vec<String> = std::fs::read_dir("/.gearbox")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("seccomp-") && n.ends_with(".bpf"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let (mut server, mut filters) = (Vec::new(), Vec::new());
    for file in names {
        let Ok(program) = std::fs::read(format!("/.gearbox/{file}")) else {
            return std::ptr::null();
        };
        let program: &'static [u8] = Box::leak(program.into_boxed_slice());
        let prog: *const SockFprog = Box::leak(Box::new(SockFprog {
            len: (program.len() / 8) as u16,
            filter: program.as_ptr().cast(),
        }));
        if file.starts_with("seccomp-server-") {
            server.push(prog);
        } else {
            filters.push(prog);
        }
    }
    if server.is_empty() || filters.is_empty() {
        return std::ptr::null();
    }
    let server: &'static [*const SockFprog] = Box::leak(server.into_boxed_slice());
    let filters: &'static [*const SockFprog] = Box::leak(filters.into_boxed_slice());
    Box::leak(Box::new(Config {
        control_fd,
        disk_mb,
        open_files,
        cpu_s,
        nfilters: filters.len() as u32,
        filters: filters.as_ptr(),
        program_name: Box::leak(name.into_boxed_c_str()).as_ptr(),
        inherited: server.len() as u32,
        server_filters: server.as_ptr(),
    }))
}
