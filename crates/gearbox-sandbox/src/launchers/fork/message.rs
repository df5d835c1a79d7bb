//! What the native loop tells the server on a slot's control socket: JSON messages built on
//! the stack, and the failed steps.

use std::ffi::c_int;
use std::fmt::Write as _;

use super::sys::*;

/// A step that failed: its name, what it acted on (a path of the shared policy, or nothing),
/// and the errno it failed with.
pub(crate) struct Fail {
    step: &'static str,
    on: &'static str,
    errno: c_int,
}

impl Fail {
    pub(crate) fn new(step: &'static str, errno: c_int) -> Fail {
        Fail::on(step, "", errno)
    }

    pub(crate) fn on(step: &'static str, on: &'static str, errno: c_int) -> Fail {
        Fail { step, on, errno }
    }
}

pub(crate) fn check(r: c_int, step: &'static str) -> Result<c_int, Fail> {
    if r < 0 {
        Err(Fail::new(step, errno()))
    } else {
        Ok(r)
    }
}

/// A JSON message built on the stack (no allocation: the heap is the interpreter's, and a
/// write to it would copy a page).
pub(crate) struct Buf {
    pub(crate) data: [u8; 512],
    pub(crate) len: usize,
}

impl Buf {
    pub(crate) fn new() -> Buf {
        Buf {
            data: [0; 512],
            len: 0,
        }
    }
}

impl std::fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let b = s.as_bytes();
        if self.len + b.len() > self.data.len() {
            return Err(std::fmt::Error);
        }
        self.data[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
        Ok(())
    }
}

pub(crate) fn send_buf(chan: c_int, buf: &Buf) {
    // SAFETY: sends bytes from a buffer on this stack frame.
    unsafe { send(chan, buf.data.as_ptr().cast(), buf.len, MSG_NOSIGNAL) };
}

pub(crate) fn send_str(chan: c_int, msg: &str) {
    // SAFETY: sends bytes from a static string.
    unsafe { send(chan, msg.as_ptr().cast(), msg.len(), MSG_NOSIGNAL) };
}

pub(crate) fn send_failed(chan: c_int, fail: &Fail) {
    // SAFETY: strerror returns a NUL-terminated string that stays valid until the next call.
    let text = unsafe { std::ffi::CStr::from_ptr(strerror(fail.errno)) };
    let text = text.to_str().unwrap_or("error");
    let mut buf = Buf::new();
    // Steps are constants of these files, what they act on paths of the shared policy, and
    // strerror's texts carry no quotes or backslashes.
    let sep = if fail.on.is_empty() { "" } else { " " };
    let _ = write!(
        buf,
        "{{\"t\":\"failed\",\"step\":\"{}{sep}{}\",\"message\":\"{}\"}}",
        fail.step,
        fail.on,
        text.replace(['"', '\\'], "'")
    );
    send_buf(chan, &buf);
}

/// Report a program's failed step on its control socket and end it.
pub(crate) fn program_failed(chan: c_int, fail: Fail) -> ! {
    send_failed(chan, &fail);
    // SAFETY: ends this process.
    unsafe { _exit(127) }
}

/// Report a run init's failed step on the slot's control socket and end it.
pub(crate) fn init_failed(chan: c_int, fail: Fail) -> ! {
    send_failed(chan, &fail);
    // SAFETY: ends this process.
    unsafe { _exit(1) }
}
