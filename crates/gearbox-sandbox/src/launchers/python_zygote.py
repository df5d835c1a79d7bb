# gearbox fork server ("zygote") for Python.
#
# Started once per pool key inside a built sandbox root (user, mount, pid, net, ipc and uts
# namespaces; read-only root) by the sandbox's init, as the sandbox user, keeping only the
# capabilities it needs to build per-run namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN, both
# confined to the sandbox's own user namespace), at nice 10 (the server sets each program
# back to 0 when it hands the run over). It never runs a program: it imports what a run
# needs, then enters the native loop of /.gearbox/fork.so (launchers/fork/), which forks
# one single-use sandbox per request:
#
#   zygote ── init, pid 1 of the run (native): cloned into new mount/net/ipc/uts/pid
#             │   namespaces, then its own cgroup namespace, fresh /work, /tmp, /dev/shm
#             │   and /proc, loopback up; reaps, reports the program's exit
#             └── program (setsid, rlimits, no capabilities, no_new_privs, Landlock,
#                          seccomp, all native; then back here in Python, where it reads
#                          its program on fd 0 and runs it)
#
# The server sends each request on fd 4 (a SOCK_SEQPACKET socket) with four fds: the run's
# control socket, stdin, stdout and stderr. How a program ended is reported by the run's init
# from the wait status, never by the program. Each program builds its Landlock ruleset itself, with the rules of
# jail/landlock.rs (Landlock rules name inodes, and each run's /work, /tmp and /dev/shm are
# new). The seccomp policy is the cold path's compiled BPF in two parts (jail/seccomp.rs,
# compile_split): /.gearbox/seccomp-server-N.bpf, which the fork server installs in itself
# (every program inherits it), and /.gearbox/seccomp-N.bpf, which each program adds.
# /.gearbox/zygote.json holds the limits and the environment each run of the key is handed
# (the rehearsal uses it). The run's init
# and its program speak to the server on the control socket (one JSON message per packet);
# the kernel attaches each sender's pid (SO_PASSCRED), which the server uses to put the slot
# in its own cgroup and to kill the run. The zygote's bounding set is empty (its init
# emptied it before exec), and so is that of every process it forks.
#
# What it imports, every fork inherits, and every page of it is copied into page tables at
# each fork and unmapped at each exit: only what a run needs (no socket, signal, glob or
# traceback, which bring enum and re; json brings re).
import _signal
import ctypes as _ctypes
import gc as _gc
import io as _io
import importlib.machinery as _machinery
import json as _json
import os as _os
import resource as _resource
import struct as _struct
import sys as _sys

_CONTROL_FD = 4
_PR_SET_NAME = 15
_MAX_HEADER = 16 * 1024 * 1024

_libc = _ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [_ctypes.c_int] + [_ctypes.c_ulong] * 4


class _Fail(Exception):
    def __init__(self, step, message):
        super().__init__(step, message)
        self.step = step
        self.message = message


def _send(chan, **msg):
    """One message on the control socket (a SOCK_SEQPACKET fd: one write, one packet)."""
    try:
        _os.write(chan, _json.dumps(msg).encode()[:3800])
    except OSError:
        pass


class _Config:
    def __init__(self):
        with open("/.gearbox/zygote.json", "rb") as f:
            c = _json.load(f)
        self.disk_mb = int(c["disk_mb"])
        self.open_files = int(c["open_files"])
        self.file_size_bytes = int(c["file_size_mb"]) * 1024 * 1024
        self.cpu_s = int(c["cpu_s"])
        # The environment every run of this fork server's key is handed.
        self.run_env = dict(c["run_env"])


def _name(name):
    """The process's name (comm), which shows in ps and /proc/PID/comm."""
    buf = _ctypes.create_string_buffer(name[:15])
    _libc.prctl(_PR_SET_NAME, _ctypes.addressof(buf), 0, 0, 0)


class _Handed(_ctypes.Structure):
    """`Handed` of launchers/fork/serve.rs: the program's control socket."""

    _fields_ = [("chan", _ctypes.c_int)]


# What os.fork() runs in its child (fresh interpreter locks, the at-fork hooks of modules
# such as random); the native loop forks without it.
_after_fork_child = _ctypes.pythonapi.PyOS_AfterFork_Child
_after_fork_child.argtypes = []
_after_fork_child.restype = None


def _serve():
    config = _Config()
    native = _ctypes.PyDLL("/.gearbox/fork.so")
    # The limits, the interpreter's own name (read before the rename below: each program takes
    # it back) and the seccomp policy in two parts (jail/seccomp.rs, compile_split).
    native.gb_config.argtypes = [_ctypes.c_int] + [_ctypes.c_uint64] * 3
    native.gb_config.restype = _ctypes.c_void_p
    native_config = native.gb_config(
        _CONTROL_FD, config.disk_mb, config.open_files, config.cpu_s
    )
    if not native_config:
        raise OSError("read the seccomp filters")
    _name(b"gb-zygote")
    # The native loop: a PyDLL keeps the GIL across the call, so each program resumes here in
    # the same consistent interpreter state as a fork's child (the fork server has one thread).
    native.gb_serve.argtypes = [_ctypes.c_void_p, _ctypes.c_void_p]
    native.gb_serve.restype = _ctypes.c_int
    handed = _Handed(-1)
    _warm_interpreter()
    # A program's environment is its job's alone.
    _os.environ.clear()
    # Everything imported so far stays untouched by the collector in every fork, so forks
    # share those pages instead of copying them.
    _gc.collect()
    _gc.freeze()
    # The runs' inits are children of the fork server until they end: the kernel reaps them.
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)
    # The fork server's part of the seccomp policy is installed by gb_serve, before it serves.
    served = native.gb_serve(native_config, _ctypes.addressof(handed))
    if served < 0:
        raise OSError("install the fork server's seccomp filters")
    if served != 0:
        return
    # A program, restricted by the native loop, its stdio on 0, 1 and 2.
    _after_fork_child()
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    _program(handed.chan, config)


def _warm_interpreter():
    """State the interpreter creates on first use, created once here instead of in every
    fork: the compiler's (the first compile() costs about a millisecond), json's and
    struct's."""
    exec(compile("x = [i for i in range(3)]\n", "<warm>", "exec"), {})
    _json.loads(_json.dumps({"t": "warm", "n": [1, 2]}))
    _struct.pack("<I", 0)


def _program(chan, config):
    """The program, restricted by the native loop exactly as the cold path restricts a
    program before exec: read the program from fd 0 and run it here."""
    try:
        _prewarm(config)
        job, files = _read_handover()
        sources = {}
        for (name, _size), content in zip(job["files"], files):
            _write_file(name, content)
            sources[name] = content
        # The run's own limits, never above the slot's (a run may only lower them).
        limits = job.get("limits") or {}
        fsize = min(config.file_size_bytes, int(limits.get("file_size_mb", 1 << 40)) << 20)
        nofile = min(config.open_files, int(limits.get("open_files", config.open_files)))
        cpu_s = min(config.cpu_s, int(job.get("cpu_s") or config.cpu_s))
        _resource.setrlimit(_resource.RLIMIT_FSIZE, (fsize, fsize))
        _resource.setrlimit(_resource.RLIMIT_NOFILE, (nofile, nofile))
        _resource.setrlimit(_resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    except _Fail as e:
        _send(chan, t="failed", step=e.step, message=e.message)
        return
    except Exception as e:
        _send(chan, t="failed", step="prepare program", message=repr(e))
        return
    _send(chan, t="started")
    # From here on the program holds fds 0, 1 and 2 only.
    _os.closerange(3, 1 << 20)
    _run(job, sources)


def _prewarm(config):
    """Rehearse a run with a dummy job, before the program exists: the pages a run writes
    (CPython's reference counts and caches, malloc's and the object allocator's free lists)
    are copied from the fork server now, off the request's path. Every step a run takes
    that leaves nothing behind is taken for real: the hand-over read from a pipe, its file
    written (in /tmp, then removed), the environment set, `__main__` and `sys.argv`
    replaced, the script compiled and run (printing to a buffer); each is undone before
    the program's own hand-over is read."""
    header = _json.dumps(
        {
            "argv": ["/usr/bin/python3", "-s", "main.py"],
            "files": [["main.py", 9]],
            "program_argv": ["main.py"],
            "env": config.run_env,
            "limits": {"timeout_ms": 1, "open_files": 1, "file_size_mb": 1},
        }
    ).encode()
    r, w = _os.pipe()
    _os.write(w, _struct.pack("<I", len(header)) + header + b"print(1)\n")
    _os.close(w)
    stdin = _os.dup(0)
    _os.dup2(r, 0)
    _os.close(r)
    try:
        job, files = _read_handover()
    finally:
        _os.dup2(stdin, 0)
        _os.close(stdin)
    # Best effort: a /tmp that refuses the file only leaves those pages to the run.
    try:
        _write_file(".gearbox-rehearsal.py", files[0], root="/tmp")
    except (OSError, _Fail):
        pass
    finally:
        try:
            _os.unlink("/tmp/.gearbox-rehearsal.py")
        except OSError:
            pass
    limits = job.get("limits") or {}
    int(limits.get("file_size_mb", 1 << 40)) + int(limits.get("open_files", 1))
    for res in (_resource.RLIMIT_FSIZE, _resource.RLIMIT_NOFILE, _resource.RLIMIT_CPU):
        _resource.setrlimit(res, _resource.getrlimit(res))
    _json.dumps({"t": "started"})
    saved = (_sys.argv, _sys.orig_argv, _sys.path[0], _sys.modules["__main__"])
    try:
        _os.environ.update(job["env"])
        out = _io.StringIO()
        main = _main_module(job, "/work/main.py")
        code = compile(files[0], "/work/main.py", "exec")
        exec(code, {"print": lambda *a: print(*a, file=out), "__name__": "__main__"})
        del main
    finally:
        _os.environ.clear()
        _sys.argv, _sys.orig_argv, _sys.path[0], _sys.modules["__main__"] = saved
    for stream in (_sys.stdout, _sys.stderr):
        stream.flush()
    import atexit  # noqa: F401  (imported by _finish)


def _read_exact(n):
    parts = []
    while n > 0:
        chunk = _os.read(0, min(n, 1 << 20))
        if not chunk:
            raise ValueError("hand-over ended early")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _read_handover():
    (length,) = _struct.unpack("<I", _read_exact(4))
    if length > _MAX_HEADER:
        raise ValueError("hand-over header of %d bytes is too large" % length)
    job = _json.loads(_read_exact(length))
    files = [_read_exact(int(size)) for _name, size in job["files"]]
    return job, files


def _write_file(name, content, root="/work"):
    # The server validated every name; check again before writing as the sandbox user.
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise _Fail("write files", "invalid file name %r" % name)
    parent = root
    for p in parts[:-1]:
        parent = parent + "/" + p
        try:
            _os.mkdir(parent, 0o755)
        except FileExistsError:
            pass
    mode = 0o755 if content.startswith(b"#!") else 0o644
    fd = _os.open(
        root + "/" + name, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL | _os.O_NOFOLLOW, mode
    )
    try:
        view = memoryview(content)
        while view:
            view = view[_os.write(fd, view) :]
    finally:
        _os.close(fd)


def _run(job, sources):
    """Run the program as `python3 -s main.py args` would, then exit without tearing the
    interpreter down (the process ends here; atexit handlers and non-daemon threads still
    run first). `sources`: the files just written, by name; the script is compiled from
    its bytes there (what reading it back would return) when it is one of them."""
    _os.environ.update(job["env"])
    script = job["program_argv"][0]
    path = _os.path.join("/work", script)
    main = _main_module(job, path)
    code = 0
    try:
        source = sources.get(script)
        if source is None:
            with open(path, "rb") as f:
                source = f.read()
        exec(compile(source, path, "exec"), vars(main))
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:  # program frames only, as a plain run prints them
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        _sys.excepthook(type(e), e, e.with_traceback(tb).__traceback__)
        code = 1
    _finish(code)


def _main_module(job, path):
    """Set `sys.argv`, `sys.orig_argv` and `sys.path[0]` as `python3 -s main.py args` would,
    and a fresh `__main__` for `path`, in `sys.modules`; return it."""
    argv = job["program_argv"]
    _sys.argv = [argv[0]] + argv[1:]
    # What the interpreter was started with, had the run started one (`/proc/self/cmdline`
    # stays the fork server's: rewriting it needs a capability the sandbox does not have).
    _sys.orig_argv = list(job["argv"])
    _sys.path[0] = "/work"
    main = type(_sys)("__main__")
    main.__builtins__ = __builtins__
    if _sys.version_info < (3, 14):
        # What the interpreter's own `__main__` starts with (3.14 creates it lazily).
        main.__annotations__ = {}
    _sys.modules["__main__"] = main
    main.__file__ = path
    main.__cached__ = None
    main.__doc__ = None
    main.__spec__ = None
    main.__package__ = None
    main.__loader__ = _machinery.SourceFileLoader("__main__", path)
    return main


def _exit_code(value):
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    try:
        print(value, file=_sys.stderr)
    except Exception:
        pass
    return 1


def _finish(code):
    try:
        threading = _sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:
        _sys.excepthook(*_sys.exc_info())
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # The output ends here (the server reads it to EOF); the run's init reports the exit
    # status once this process is gone.
    for fd in (1, 2):
        try:
            _os.close(fd)
        except OSError:
            pass
    _os._exit(code)


_serve()
