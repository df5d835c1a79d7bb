# gearbox live-session launcher for Python: one interpreter, many cells, in one sandbox.
#
# Started as the program of a sandbox built like any run's (namespaces, seccomp, Landlock,
# cgroup, rlimits). It speaks newline-delimited JSON with the server on the descriptors it
# was started with, and gives the program its own:
#   in  (fd 0 at start): {"cell": N, "code": "...", "timeout_ms": T}
#   out (fd 1 at start): {"ready": true}, then per cell {"cell": N, "stream": "stdout"|
#        "stderr", "data": "..."} and one {"cell": N, "done": true, "status": "ok"|"error"|
#        "interrupted"|"exited", "result": repr-or-null, "error": text-or-null}
# The program's stdin is /dev/null; its fds 1 and 2 are pipes this launcher reads, so the
# output of subprocesses and C code comes back too. Output written by a thread counts for the
# cell that started the thread. A cell past its timeout gets KeyboardInterrupt; one that
# ignores it is the server's to end (it kills the whole sandbox). Everything here runs in the
# program's own process: what it reports is the program's word, as its output is; the
# server takes time, death and memory from the sandbox.
import ast as _ast
import codecs as _codecs
import json as _json
import os as _os
import sys as _sys
import threading as _threading
import time as _time
import traceback as _traceback
import types as _types
import _thread

_MAX_RESULT = 64 * 1024

# The protocol's descriptors: duplicates that no child inherits.
_proto_in = _os.fdopen(_os.dup(0), "rb")
_proto_out = _os.fdopen(_os.dup(1), "wb", buffering=0)
_send_lock = _threading.Lock()


def _send(obj):
    data = (_json.dumps(obj, ensure_ascii=False) + "\n").encode("utf-8", "replace")
    with _send_lock:
        _proto_out.write(data)


_null = _os.open(_os.devnull, _os.O_RDONLY)
_os.dup2(_null, 0)
_os.close(_null)
_sys.stdin = open(0, "r", closefd=False)

_current = [0]
_local = _threading.local()


def _cell():
    return getattr(_local, "cell", None) or _current[0]


_thread_start = _threading.Thread.start


def _start(self):
    cell = _cell()
    run = self.run

    def run_in_cell():
        _local.cell = cell
        run()

    self.run = run_in_cell
    _thread_start(self)


_threading.Thread.start = _start


class _Stream:
    """sys.stdout / sys.stderr. Text is sent a line at a time, as a frame of the cell whose
    thread wrote it, after whatever the program wrote to the descriptors before it."""

    def __init__(self, name, fd):
        self.name = "<" + name + ">"
        self._stream = name
        self._fd = fd
        self._held = {}
        self._lock = _threading.Lock()
        self.encoding = "utf-8"
        self.errors = "replace"

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not " + type(s).__name__)
        if not s:
            return 0
        cell = _cell()
        with self._lock:
            text = self._held.pop(cell, "") + s
            cut = text.rfind("\n") + 1
            if cut < len(text):
                self._held[cell] = text[cut:]
            text = text[:cut]
        if text:
            self._send(cell, text)
        return len(s)

    def _send(self, cell, text):
        _settle()
        _send({"cell": cell, "stream": self._stream, "data": text})

    def flush(self, cell=None):
        with self._lock:
            if cell is None:
                held, self._held = self._held, {}
            else:
                held = {cell: self._held.pop(cell)} if cell in self._held else {}
        for c, text in held.items():
            self._send(c, text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False

    def fileno(self):
        return self._fd

    @property
    def closed(self):
        return False


_busy = [0]


def _pump(fd, name):
    r, w = _os.pipe()
    _os.dup2(w, fd)
    _os.close(w)
    decoder = _codecs.getincrementaldecoder("utf-8")("replace")

    def loop():
        while True:
            try:
                data = _os.read(r, 65536)
            except OSError:
                return
            if not data:
                return
            _busy[0] += 1
            try:
                text = decoder.decode(data)
                if text:
                    _send({"cell": _current[0], "stream": name, "data": text})
            finally:
                _busy[0] -= 1

    t = _threading.Thread(target=loop, daemon=True)
    _thread_start(t)
    return r


_pipes = [_pump(1, "stdout"), _pump(2, "stderr")]
_sys.stdout = _Stream("stdout", 1)
_sys.stderr = _Stream("stderr", 2)


def _pending():
    """Bytes written to fds 1 and 2 not yet sent."""
    import fcntl
    import termios

    waiting = _busy[0]
    for r in _pipes:
        buf = bytearray(4)
        try:
            fcntl.ioctl(r, termios.FIONREAD, buf)
            waiting += int.from_bytes(buf, _sys.byteorder)
        except OSError:
            pass
    return waiting


def _settle(seconds=0.05):
    """Wait (briefly) until what was written to fds 1 and 2 has been sent."""
    until = _time.monotonic() + seconds
    while _pending() and _time.monotonic() < until:
        _time.sleep(0.0005)


def _drain():
    _settle(0.2)


_main = _types.ModuleType("__main__")
_main.__builtins__ = __builtins__
_sys.modules["__main__"] = _main
_sys.argv = [""]
_sys.path[0] = "/work"
_os.chdir("/work")
_ns = vars(_main)
_running = [False]


def _watch(cell, seconds, done):
    if not done.wait(seconds) and _running[0] and _current[0] == cell:
        _thread.interrupt_main()


def _traceback_text(e):
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell"):
        tb = tb.tb_next
    return "".join(_traceback.format_exception(type(e), e, tb))


def _run(cell, code):
    tree = _ast.parse(code, "<cell %d>" % cell, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = _ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell %d>" % cell, "exec"), _ns)
    if last is None:
        return None
    value = eval(compile(last, "<cell %d>" % cell, "eval"), _ns)
    if value is None:
        return None
    _ns["_"] = value
    # A picture (a PIL image, a matplotlib figure) is shown, as a notebook shows it.
    try:
        import gearbox_display

        if gearbox_display.displayable(value):
            gearbox_display.display(value)
            return None
    except ImportError:
        pass
    text = repr(value)
    if len(text) > _MAX_RESULT:
        text = text[:_MAX_RESULT] + "... [%d characters]" % len(text)
    return text


def _serve():
    _send({"ready": True})
    while True:
        line = _proto_in.readline()
        if not line:
            return
        msg = _json.loads(line)
        cell = int(msg["cell"])
        _current[0] = cell
        done = _threading.Event()
        watchdog = _threading.Thread(
            target=_watch, args=(cell, msg.get("timeout_ms", 30000) / 1000.0, done), daemon=True
        )
        _thread_start(watchdog)
        status, result, error, exit_code = "ok", None, None, None
        try:
            try:
                _running[0] = True
                result = _run(cell, msg["code"])
            finally:
                _running[0] = False
                done.set()
        except KeyboardInterrupt:
            status, error = "interrupted", "KeyboardInterrupt: the cell ran past its timeout"
        except SystemExit as e:
            status = "exited"
            exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            error = "the program exited (code %s)" % exit_code
        except BaseException as e:  # the program's error, reported like a plain run's
            status = "error"
            text = _traceback_text(e)
            _send({"cell": cell, "stream": "stderr", "data": text})
            error = "".join(_traceback.format_exception_only(type(e), e)).strip()
        try:
            # Figures the cell left open are shown with it, as in a notebook.
            if "matplotlib.pyplot" in _sys.modules:
                import gearbox_display

                gearbox_display.show_open_figures()
        except BaseException as e:  # showing must not end the session
            _send({"cell": cell, "stream": "stderr", "data": "[gearbox: %s]\n" % e})
        try:
            _sys.stdout.flush(cell)
            _sys.stderr.flush(cell)
            _drain()
        except KeyboardInterrupt:
            pass
        frame = {"cell": cell, "done": True, "status": status, "result": result, "error": error}
        _send(frame)
        if status == "exited":
            _os._exit(exit_code & 0xFF)


_serve()
