# gearbox fork server ("zygote") for Python.
#
# Started once per pool key inside a built sandbox root (user, mount, pid, net, ipc and uts
# namespaces; read-only root) by the sandbox's init, as the sandbox user, keeping only the
# capabilities it needs to build per-run namespaces (CAP_SYS_ADMIN, CAP_NET_ADMIN, both
# confined to the sandbox's own user namespace), at nice 10 (the server sets each program
# back to 0 when it hands the run over). It never runs a program:
# it has imported what a run needs and forks one single-use sandbox per request:
#
#   zygote ── init, pid 1 of the run: cloned into new mount/net/ipc/uts/pid namespaces,
#             │   then its own cgroup namespace, fresh /work, /tmp, /dev/shm and /proc,
#             │   loopback up; reaps, reports the program's exit
#             └── program (setsid, rlimits, no capabilities, no_new_privs,
#                          Landlock, seccomp; then reads its program on fd 0)
#
# The server sends each request on fd 4 (a SOCK_SEQPACKET socket) with five fds: the run's
# control socket, stdin, stdout, stderr and the done pipe (on which the program says how it
# ended, see _finish). Each program builds its Landlock ruleset itself,
# with the rules of jail/landlock.rs (Landlock rules name inodes, and each run's /work,
# /tmp and /dev/shm are new). The seccomp filters are the same compiled BPF the cold path installs
# (/.gearbox/seccomp-N.bpf), and /.gearbox/zygote.json holds the limits. The run's init
# and its program speak to the server on the control socket (one JSON message per packet);
# the kernel attaches each sender's pid (SO_PASSCRED), which the server uses to put the slot
# in its own cgroup and to kill the run. The zygote's bounding set is empty (its init
# emptied it before exec), and so is that of every process it forks.
import ctypes as _ctypes
import gc as _gc
import io as _io
import glob as _glob
import importlib.machinery as _machinery
import json as _json
import os as _os
import resource as _resource
import signal as _signal
import socket as _socket
import struct as _struct
import sys as _sys
import traceback as _traceback
import types as _types
import fcntl as _fcntl

_CONTROL_FD = 4
# The program's end of the pipe on which it tells the server how it ended (see _finish).
_done_fd = -1
_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWUTS = 0x04000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_MOVE = 8192
_MS_REC = 16384
_MNT_DETACH = 2
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_PR_GET_NO_NEW_PRIVS = 39
_PR_SET_NAME = 15
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECCOMP_MODE_FILTER = 2
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
# Access rights by the ABI that introduced them (jail/landlock.rs asks for ABI 6).
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_ABI1 = 0x1FFF
_LL_REFER, _LL_TRUNCATE, _LL_IOCTL_DEV = 0x2000, 0x4000, 0x8000
_LL_SCOPE_ALL = 0x3
_LL_TARGET_ABI = 6
_LL_WRITABLE = ("/work", "/tmp", "/dev/shm")
_LL_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 1
_PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
_MAX_HEADER = 16 * 1024 * 1024

_libc = _ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [_ctypes.c_char_p] * 3 + [_ctypes.c_ulong, _ctypes.c_char_p]
_libc.umount2.argtypes = [_ctypes.c_char_p, _ctypes.c_int]
_libc.unshare.argtypes = [_ctypes.c_int]
_libc.prctl.argtypes = [_ctypes.c_int] + [_ctypes.c_ulong] * 4
_libc.syscall.restype = _ctypes.c_long
_libc.capset.argtypes = [_ctypes.c_void_p, _ctypes.c_void_p]
# clone(2) through a PyDLL, which keeps the GIL across the call: the child resumes in the
# same consistent interpreter state as a fork's child (the zygote has one thread).
_pylibc = _ctypes.PyDLL(None, use_errno=True)
_pylibc.syscall.restype = _ctypes.c_long
_SYS_CLONE = {"x86_64": 56, "aarch64": 220}.get(_os.uname().machine)
_SIGCHLD = 17


class _Fail(Exception):
    def __init__(self, step, message):
        super().__init__(step, message)
        self.step = step
        self.message = message


def _check(result, step):
    if result < 0:
        err = _ctypes.get_errno()
        raise _Fail(step, _os.strerror(err))
    return result


def _mount(source, target, fstype, flags, data, step):
    enc = lambda s: None if s is None else s.encode()
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), step)


def _send(chan, **msg):
    try:
        chan.send(_json.dumps(msg).encode()[:3800])
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
        self.filters = []
        for path in sorted(_glob.glob("/.gearbox/seccomp-*.bpf")):
            with open(path, "rb") as f:
                self.filters.append(_Filter(f.read()))


def _name(name):
    """The process's name (comm), which shows in ps and /proc/PID/comm."""
    buf = _ctypes.create_string_buffer(name[:15])
    _libc.prctl(_PR_SET_NAME, _ctypes.addressof(buf), 0, 0, 0)


# The interpreter's own name, which each program takes back: a program sees what it would
# see when started as `python3 main.py`.
with open("/proc/self/comm", "rb") as _f:
    _PROGRAM_NAME = _f.read().strip()


def _serve():
    _name(b"gb-zygote")
    config = _Config()
    control = _socket.socket(fileno=_CONTROL_FD)
    _warm_interpreter()
    # Everything imported so far stays untouched by the collector in every fork, so forks
    # share those pages instead of copying them.
    _gc.collect()
    _gc.freeze()
    # Each run's init is a child of the zygote until the run ends: reap them as they end.
    _signal.signal(_signal.SIGCHLD, lambda _sig, _frame: _reap())
    while True:
        try:
            msg, fds, _flags, _addr = _socket.recv_fds(control, 4096, 5)
        except InterruptedError:
            continue
        if not msg:
            return
        if len(fds) != 5:
            for fd in fds:
                _os.close(fd)
            continue
        pid = _clone(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS | _CLONE_NEWPID)
        if pid == 0:
            code = 1
            try:
                _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
                control.close()
                _init(fds, config)
                code = 0
            except BaseException:
                _traceback.print_exc()
            finally:
                _os._exit(code)
        if pid < 0:
            chan = _socket.socket(fileno=fds[0])
            _send(chan, t="failed", step="new namespaces", message=_os.strerror(_ctypes.get_errno()))
            chan.close()
            fds = fds[1:]
        for fd in fds:
            _os.close(fd)


def _clone(flags):
    """fork(2) into new namespaces in one step; the child is pid 1 of a new pid namespace."""
    if _SYS_CLONE is None:
        _ctypes.set_errno(38)  # ENOSYS: no clone number for this architecture
        return -1
    zero = _ctypes.c_long(0)
    return _pylibc.syscall(
        _ctypes.c_long(_SYS_CLONE), _ctypes.c_ulong(flags | _SIGCHLD), zero, zero, zero, zero
    )


def _warm_interpreter():
    """State the interpreter creates on first use, created once here instead of in every
    fork: the compiler's (the first compile() costs about a millisecond), and the foreign
    function call paths a run's init and program use (harmless calls)."""
    exec(compile("x = [i for i in range(3)]\n", "<warm>", "exec"), {})
    _json.loads(_json.dumps({"t": "warm", "n": [1, 2]}))
    _struct.pack("<QQQ", 0, 0, 0)
    _ctypes.create_string_buffer(24)  # the Landlock ruleset and rule buffers' types
    _ctypes.create_string_buffer(12)
    _libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
    _libc.unshare(0)
    _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, _ctypes.c_size_t(0),
                  _ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))


def _reap():
    while True:
        try:
            pid, _ = _os.waitpid(-1, _os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _init(fds, config):
    """Pid 1 of the run: once the server has put it in the run's cgroup, its own cgroup
    namespace, scratch space, /proc and loopback; then the program; reports its exit."""
    _name(b"gb-init")
    chan_fd, stdin_fd, stdout_fd, stderr_fd, done_fd = fds
    chan = _socket.socket(fileno=chan_fd)
    chan.setblocking(True)
    _send(chan, t="hello")
    go = chan.recv(4096)
    if not go:
        return
    try:
        # After the move into the run's cgroup, so that the namespace's root is that cgroup.
        _check(_libc.unshare(_CLONE_NEWCGROUP), "new cgroup namespace")
        inodes = min(max(config.disk_mb * 64, 1024), 1 << 20)
        stage = "/.gearbox/stage"
        _mount(
            "tmpfs",
            stage,
            "tmpfs",
            _MS_NOSUID | _MS_NODEV,
            "size=%dm,nr_inodes=%d,mode=0755" % (config.disk_mb, inodes),
            "mount scratch tmpfs",
        )
        for sub, mode, target in (
            ("work", 0o755, "/work"),
            ("tmp", 0o1777, "/tmp"),
            ("shm", 0o1777, "/dev/shm"),
        ):
            src = stage + "/" + sub
            _os.mkdir(src)
            _os.chmod(src, mode)
            _mount(src, target, None, _MS_BIND, None, "bind /" + sub)
        _check(_libc.umount2(stage.encode(), _MNT_DETACH), "detach scratch stage")
        _socket.sethostname("gearbox")
        staged = "/.gearbox/proc"
        _mount("proc", staged, "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None, "mount /proc")
        for sub in _PROC_READONLY:
            p = staged + "/" + sub
            if _os.path.exists(p):
                _mount(p, p, None, _MS_BIND | _MS_REC, None, "bind /proc/" + sub)
                _mount(
                    None,
                    p,
                    None,
                    _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                    None,
                    "make /proc/%s read-only" % sub,
                )
        # The zygote's /proc (which shows every run of this zygote) leaves the tree; the
        # run's own takes its place.
        _check(_libc.umount2(b"/proc", _MNT_DETACH), "detach zygote /proc")
        _mount(staged, "/proc", None, _MS_MOVE, None, "move /proc")
        _loopback_up()
    except _Fail as e:
        _send(chan, t="failed", step=e.step, message=e.message)
        return
    except Exception as e:
        _send(chan, t="failed", step="build init", message=repr(e))
        return
    child = _os.fork()
    if child == 0:
        code = 127
        try:
            global _done_fd
            _name(_PROGRAM_NAME)
            _done_fd = done_fd
            _program(chan, stdin_fd, stdout_fd, stderr_fd, config)
        finally:
            _os._exit(code)
    for fd in (stdin_fd, stdout_fd, stderr_fd, done_fd):
        _os.close(fd)
    _send(chan, t="ready")
    exited = _await_program(child)
    _send(chan, t="exited", **exited)
    # Whatever the program left behind dies with this pid namespace.
    try:
        _os.kill(-1, _signal.SIGKILL)
    except OSError:
        pass


def _await_program(child):
    """How the program ended, from its wait status. (A program that ends through _finish
    has already told the server on the done pipe; this is what every other end reports.)"""
    while True:
        try:
            pid, status = _os.waitpid(-1, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return {"code": None, "signal": None, "cpu_time_ms": 0, "max_rss_kb": 0}
        if pid == child:
            break
    usage = _resource.getrusage(_resource.RUSAGE_CHILDREN)
    return {
        "code": _os.WEXITSTATUS(status) if _os.WIFEXITED(status) else None,
        "signal": _os.WTERMSIG(status) if _os.WIFSIGNALED(status) else None,
        "cpu_time_ms": int((usage.ru_utime + usage.ru_stime) * 1000),
        "max_rss_kb": int(usage.ru_maxrss),
    }


def _loopback_up():
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        req = _struct.pack("16sh22x", b"lo", 0)
        flags = _struct.unpack("16sh22x", _fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        _fcntl.ioctl(s, _SIOCSIFFLAGS, _struct.pack("16sh22x", b"lo", flags | _IFF_UP))
    except OSError as e:
        raise _Fail("bring up loopback", str(e))
    finally:
        s.close()


# ctypes creates an array type on its first use in a process: these are created once here.
_CapHeader = _ctypes.c_uint32 * 2
_CapData = _ctypes.c_uint32 * 6


def _drop_capabilities():
    # The bounding set is already empty (see the top of this file).
    _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(0x20080522, 0)
    data = _CapData()
    _check(_libc.capset(header, data), "drop capabilities")


def _landlock():
    """The rules of jail/landlock.rs: everything readable and executable, the writable
    areas fully usable, the device nodes readable and writable, signals and abstract unix
    sockets scoped to the sandbox (ABI 6); best effort on older kernels."""
    sc = _libc.syscall
    abi = sc(_SYS_LANDLOCK_CREATE_RULESET, None, _ctypes.c_size_t(0),
             _ctypes.c_uint32(_LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        return "landlock: not enforced (kernel lacks it)"
    abi = min(abi, _LL_TARGET_ABI)
    handled = _LL_ABI1
    if abi >= 2:
        handled |= _LL_REFER
    if abi >= 3:
        handled |= _LL_TRUNCATE
    if abi >= 5:
        handled |= _LL_IOCTL_DEV
    scoped = _LL_SCOPE_ALL if abi >= 6 else 0
    attr = _ctypes.create_string_buffer(_struct.pack("<QQQ", handled, 0, scoped), 24)
    fd = _check(
        sc(_SYS_LANDLOCK_CREATE_RULESET, attr, _ctypes.c_size_t(24), _ctypes.c_uint32(0)),
        "landlock: create ruleset",
    )
    read = _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR
    device = (_LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV) & handled
    rules = [("/", read)] + [(w, handled) for w in _LL_WRITABLE] + [(d, device) for d in _LL_DEVICES]
    try:
        for path, access in rules:
            try:
                parent = _os.open(path, _os.O_PATH | _os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                rule = _ctypes.create_string_buffer(_struct.pack("<Qi", access, parent), 12)
                _check(
                    sc(_SYS_LANDLOCK_ADD_RULE, _ctypes.c_int(fd),
                       _ctypes.c_int(_LANDLOCK_RULE_PATH_BENEATH), rule, _ctypes.c_uint32(0)),
                    "landlock: add rule for " + path,
                )
            finally:
                _os.close(parent)
        _check(sc(_SYS_LANDLOCK_RESTRICT_SELF, _ctypes.c_int(fd), _ctypes.c_uint32(0)),
               "landlock: restrict")
    finally:
        _os.close(fd)
    if abi >= _LL_TARGET_ABI:
        return "landlock: fully enforced"
    return "landlock: partially enforced (older kernel ABI)"


class _SockFprog(_ctypes.Structure):
    _fields_ = [("len", _ctypes.c_ushort), ("filter", _ctypes.c_void_p)]


class _Filter:
    """A compiled seccomp filter, its sock_fprog built once in the fork server."""

    def __init__(self, program):
        self.buf = _ctypes.create_string_buffer(program, len(program))
        self.prog = _SockFprog(len(program) // 8, _ctypes.addressof(self.buf))


def _install_seccomp(f):
    _check(
        _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _ctypes.addressof(f.prog), 0, 0),
        "install seccomp filter",
    )


def _program(chan, stdin_fd, stdout_fd, stderr_fd, config):
    """Restrict this process exactly as the cold path restricts a program before exec, then
    read the program from fd 0 and run it here."""
    try:
        for fd, target in ((stdin_fd, 0), (stdout_fd, 1), (stderr_fd, 2)):
            _os.dup2(fd, target)
            _os.close(fd)
        _os.setsid()
        _resource.setrlimit(_resource.RLIMIT_CORE, (0, 0))
        _resource.setrlimit(_resource.RLIMIT_NOFILE, (config.open_files, config.open_files))
        _resource.setrlimit(_resource.RLIMIT_CPU, (config.cpu_s, config.cpu_s + 1))
        _os.chdir("/work")
        _drop_capabilities()
        _check(_libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")
        applied = ["capabilities: none", "no_new_privs", _landlock()]
        for f in config.filters:
            _install_seccomp(f)
        applied.append("seccomp: %d filters (deny list)" % len(config.filters))
        _send(chan, t="applied", mechanisms=applied)
        _prewarm()
        job, files = _read_handover()
        for (name, _size), content in zip(job["files"], files):
            _write_file(name, content)
        # The run's own limits, never above the slot's (a run may only lower them).
        limits = job.get("limits") or {}
        fsize = min(config.file_size_bytes, int(limits.get("file_size_mb", 1 << 40)) << 20)
        nofile = min(config.open_files, int(limits.get("open_files", config.open_files)))
        cpu_ms = int(limits.get("cpu_ms", 0)) or int(limits.get("timeout_ms", 0))
        cpu_s = min(config.cpu_s, max(1, -(-cpu_ms // 1000))) if cpu_ms else config.cpu_s
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
    chan.close()
    _os.closerange(3, _done_fd)
    _os.closerange(_done_fd + 1, 1 << 20)
    _run(job)


def _prewarm():
    """Do once, before the program exists, what every run does: the pages a run writes are
    copied from the fork server now, off the request's path."""
    out = _io.StringIO()
    code = compile("import sys\nx = [i for i in range(10)]\nprint(x, sys.argv, file=out)\n", "/work/main.py", "exec")
    main = _types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    exec(code, {"out": out, "__name__": "__main__"})
    _json.loads(_json.dumps({"argv": ["main.py"], "env": {"A": "b"}, "files": [["main.py", 1]]}))
    for stream in (_sys.stdout, _sys.stderr):
        stream.flush()
    import atexit  # noqa: F401  (imported by _finish)
    # The program's environment is the job's alone: the fork server's leaves now.
    _os.environ.clear()


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


def _write_file(name, content):
    # The server validated every name; check again before writing as the sandbox user.
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise _Fail("write files", "invalid file name %r" % name)
    parent = "/work"
    for p in parts[:-1]:
        parent = parent + "/" + p
        try:
            _os.mkdir(parent, 0o755)
        except FileExistsError:
            pass
    mode = 0o755 if content.startswith(b"#!") else 0o644
    fd = _os.open(
        "/work/" + name, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL | _os.O_NOFOLLOW, mode
    )
    try:
        view = memoryview(content)
        while view:
            view = view[_os.write(fd, view) :]
    finally:
        _os.close(fd)


def _run(job):
    """Run the program as `python3 -s main.py args` would, then exit without tearing the
    interpreter down (the process ends here; atexit handlers and non-daemon threads still
    run first)."""
    _os.environ.update(job["env"])
    argv = job["program_argv"]
    path = _os.path.join("/work", argv[0])
    _sys.argv = [argv[0]] + argv[1:]
    _sys.path[0] = "/work"
    main = _types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    _sys.modules["__main__"] = main
    main.__file__ = path
    main.__cached__ = None
    main.__doc__ = None
    main.__spec__ = None
    main.__package__ = None
    main.__loader__ = _machinery.SourceFileLoader("__main__", path)
    code = 0
    try:
        with open(path, "rb") as f:
            compiled = compile(f.read(), path, "exec")
        exec(compiled, vars(main))
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException as e:  # program frames only, as a plain run prints them
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        _traceback.print_exception(type(e), e, tb)
        code = 1
    _finish(code)


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
        _traceback.print_exc()
    for stream in (_sys.stdout, _sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    # Close the output first (the server reads to EOF), then tell init how this ended: the
    # answer need not wait for this process's teardown.
    for fd in (1, 2):
        try:
            _os.close(fd)
        except OSError:
            pass
    try:
        me = _resource.getrusage(_resource.RUSAGE_SELF)
        kids = _resource.getrusage(_resource.RUSAGE_CHILDREN)
        cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        said = {"code": code, "cpu_time_ms": int(cpu * 1000), "max_rss_kb": max(me.ru_maxrss, kids.ru_maxrss)}
        _os.write(_done_fd, _json.dumps(said).encode())
    except OSError:
        pass
    try:
        # This process's teardown (a fork of the interpreter: a millisecond or more) yields
        # the CPU to the answer.
        _os.setpriority(_os.PRIO_PROCESS, 0, 19)
    except OSError:
        pass
    _os._exit(code)


_serve()
