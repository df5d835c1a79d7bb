//! Fresh entropy. A program is a fork of the fork server: every random generator the
//! interpreter keeps in memory holds the same state in every program unless it is renewed
//! after the fork. Python reseeds `random` itself (its at-fork hook, run by
//! `PyOS_AfterFork_Child`), and `os.urandom`, `secrets` and `uuid` ask the kernel each time.
//! OpenSSL's generators (behind Node's `crypto`, and Python's `ssl` and `hashlib` when the
//! fork server has them loaded) detect a fork by a change of pid, which never happens here:
//! each program is pid 2 of its own pid namespace, as the fork server is of its own. So each
//! program reseeds them, and a program whose generators cannot be renewed does not run.
//! V8's generators are Node's part (`napi.rs`, `renew_v8`).

use std::ffi::{c_int, c_void};

use super::message::Fail;
use super::sys::*;

type RandGet0 = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type RandReseed =
    unsafe extern "C" fn(*mut c_void, c_int, *const u8, usize, *const u8, usize) -> c_int;

/// `N` bytes from the kernel's random pool.
pub(crate) fn fresh<const N: usize>() -> Result<[u8; N], Fail> {
    let mut buf = [0u8; N];
    // SAFETY: getrandom writes at most N bytes into the buffer on this frame.
    let n = unsafe { getrandom(buf.as_mut_ptr().cast(), N, 0) };
    if n != N as isize {
        return Err(Fail::new("read fresh entropy", errno()));
    }
    Ok(buf)
}

/// A symbol of OpenSSL's libcrypto if this process has it: exported by the executable (Node
/// links OpenSSL in) or in a libcrypto already loaded (Python loads it privately with `ssl`
/// or `hashlib`). Never loads one.
fn openssl_symbol(name: &std::ffi::CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT (null) and a NUL-terminated name.
    let p = unsafe { dlsym(std::ptr::null_mut(), name.as_ptr()) };
    if !p.is_null() {
        return p;
    }
    for lib in [c"libcrypto.so.3", c"libcrypto.so"] {
        // SAFETY: RTLD_NOLOAD returns a handle only to a library already loaded.
        let handle = unsafe { dlopen(lib.as_ptr(), RTLD_LAZY | RTLD_NOLOAD) };
        if !handle.is_null() {
            // SAFETY: dlsym on a valid handle with a NUL-terminated name.
            return unsafe { dlsym(handle, name.as_ptr()) };
        }
    }
    std::ptr::null_mut()
}

/// OpenSSL's generators in this process, looked up once, by the fork server before it
/// serves: a program is a fork that runs nothing of its own before it renews them, so it has
/// the fork server's libraries loaded, no more (the look-up is a `dlsym` and two `dlopen`
/// probes per symbol, each reading the loader's cache, ~16 file opens per program).
pub(crate) enum OpenSsl {
    /// No OpenSSL loaded: nothing to renew.
    Absent,
    /// An OpenSSL without OpenSSL 3's reseeding functions (1.1), or with part of them:
    /// generators that cannot be renewed, so no program runs.
    Unrenewable,
    /// OpenSSL 3: its reseed function and the getters of its primary, public and private
    /// generators.
    Renewable {
        reseed: RandReseed,
        getters: [RandGet0; 3],
    },
}

impl OpenSsl {
    pub(crate) fn find() -> OpenSsl {
        let reseed = openssl_symbol(c"EVP_RAND_reseed");
        let getters = [
            openssl_symbol(c"RAND_get0_primary"),
            openssl_symbol(c"RAND_get0_public"),
            openssl_symbol(c"RAND_get0_private"),
        ];
        if reseed.is_null() && getters.iter().all(|g| g.is_null()) {
            if openssl_symbol(c"RAND_bytes").is_null() {
                return OpenSsl::Absent;
            }
            return OpenSsl::Unrenewable;
        }
        if reseed.is_null() || getters.iter().any(|g| g.is_null()) {
            return OpenSsl::Unrenewable;
        }
        // SAFETY: the symbols are OpenSSL 3's functions of these names and C signatures.
        unsafe {
            OpenSsl::Renewable {
                reseed: std::mem::transmute::<*mut c_void, RandReseed>(reseed),
                getters: getters.map(|g| std::mem::transmute::<*mut c_void, RandGet0>(g)),
            }
        }
    }

    /// Reseed OpenSSL's primary, public and private generators, each with fresh entropy from
    /// its parent and fresh additional input from the kernel. Nothing to do where no OpenSSL
    /// is loaded; an OpenSSL that is loaded but cannot be reseeded is an error.
    pub(crate) fn renew(&self) -> Result<(), Fail> {
        let (reseed, getters) = match self {
            OpenSsl::Absent => return Ok(()),
            OpenSsl::Unrenewable => {
                return Err(Fail::new("renew OpenSSL's random generators", EIO));
            }
            OpenSsl::Renewable { reseed, getters } => (reseed, getters),
        };
        for get in getters {
            let input = fresh::<32>()?;
            // SAFETY: the default library context (null); OpenSSL copies the input.
            let ok = unsafe {
                let ctx = get(std::ptr::null_mut());
                !ctx.is_null()
                    && reseed(ctx, 0, std::ptr::null(), 0, input.as_ptr(), input.len()) == 1
            };
            if !ok {
                return Err(Fail::new("renew OpenSSL's random generators", EIO));
            }
        }
        Ok(())
    }
}
