# gearbox warm-pool launcher for Python. Started inside a fully built sandbox (namespaces,
# seccomp, Landlock, rlimits already applied) before any request exists; it blocks on fd 3
# until the sandbox's init hands over one program, then runs it in this process as
# `python3 main.py` would, and exits. Used once, never reused.
import json as _json
import os as _os
import importlib.machinery as _machinery
import sys as _sys
import traceback as _traceback
import types as _types


def _gearbox_run():
    with _os.fdopen(3, "rb") as f:
        job = _json.loads(f.read())
    _os.environ.clear()
    _os.environ.update(job["env"])
    _os.chdir("/work")
    path = _os.path.join("/work", job["argv"][0])
    _sys.argv = [job["argv"][0]] + job["argv"][1:]
    _sys.orig_argv = list(job.get("command") or _sys.orig_argv)
    _sys.path[0] = "/work"
    # A fresh __main__ (the launcher's own globals stay with this function).
    main = _types.ModuleType("__main__")
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
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, vars(main))
    except SystemExit:
        raise
    except BaseException as e:  # print the traceback as a plain run would: program frames only
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        _traceback.print_exception(type(e), e, tb)
        _sys.exit(1)


_gearbox_run()
