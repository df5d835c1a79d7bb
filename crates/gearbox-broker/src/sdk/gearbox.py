"""gearbox: call the tools of other MCP servers from code running in a gearbox sandbox.

    import gearbox
    total = gearbox.call_tool("everything", "get-sum", {"a": 1, "b": 2})

call_tool returns the tool's structured content when it has some, else its text (several
text blocks joined by newlines), else the list of its content blocks. A result larger than
the run's max_output_kb comes back as a dict {"truncated": True, "artifact_id", "size_bytes",
"preview"}. Failures raise a subclass of ToolError: ToolNotAllowed (not in this run's
allowlist), ToolTimeout (per-call deadline or the run's wall clock), CallLimitExceeded
(max_calls), ToolFailed (the tool reported an error, or its server is down or crashed).

Typed stubs of the servers this run may call are in the package `tools`:
`from tools import everything; everything.get_sum(a=1, b=2)`.

Standard library only; the channel is the Unix socket named by $GEARBOX_BROKER.
"""

import itertools
import json
import os
import socket
import threading

__all__ = [
    "call_tool",
    "list_servers",
    "list_tools",
    "ToolError",
    "ToolNotAllowed",
    "ToolTimeout",
    "CallLimitExceeded",
    "ToolFailed",
]


class ToolError(Exception):
    """A tool call that did not produce a result."""


class ToolNotAllowed(ToolError):
    """The tool is not in this run's allowlist."""


class ToolTimeout(ToolError):
    """The call passed its deadline (per_call_ms) or the run's wall clock (wall_clock_ms)."""


class CallLimitExceeded(ToolError):
    """The run already made max_calls tool calls."""


class ToolFailed(ToolError):
    """The tool reported an error, or its server is down or crashed during the call."""


_ERRORS = {
    "ToolNotAllowed": ToolNotAllowed,
    "ToolTimeout": ToolTimeout,
    "CallLimitExceeded": CallLimitExceeded,
    "ToolFailed": ToolFailed,
}

_lock = threading.Lock()
_ids = itertools.count(1)
_conn = None  # (pid, socket, file)


def _connection():
    global _conn
    if _conn is not None and _conn[0] == os.getpid():
        return _conn
    path = os.environ.get("GEARBOX_BROKER")
    if not path:
        raise ToolError("GEARBOX_BROKER is not set: this run was not given any tools (allow_tools)")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        s.close()
        raise ToolError("cannot reach the gearbox broker at %s: %s" % (path, e)) from None
    _conn = (os.getpid(), s, s.makefile("rb"))
    return _conn


def _request(op, **fields):
    global _conn
    with _lock:
        _, s, f = _connection()
        rid = next(_ids)
        msg = dict(fields, id=rid, op=op)
        try:
            s.sendall(json.dumps(msg).encode() + b"\n")
            line = f.readline()
        except OSError as e:
            _conn = None
            raise ToolError("the gearbox broker connection failed: %s" % e) from None
        if not line:
            _conn = None
            raise ToolError("the gearbox broker closed the connection")
    answer = json.loads(line)
    if answer.get("ok"):
        return answer.get("result")
    err = answer.get("error") or {}
    raise _ERRORS.get(err.get("type"), ToolError)(err.get("message", "unknown error"))


def call_tool(server, tool, arguments=None):
    """Call `tool` of `server` with the dict `arguments`; see the module's documentation."""
    if arguments is not None and not isinstance(arguments, dict):
        raise TypeError("arguments must be a dict")
    result = _request("call", server=server, tool=tool, args=arguments or {})
    if result.get("truncated"):
        return result
    if result.get("structured") is not None:
        return result["structured"]
    text_blocks = [c for c in result.get("content", []) if c.get("type") == "text"]
    if text_blocks or not result.get("content"):
        return result.get("text", "")
    return result["content"]


def list_servers():
    """The servers this run may call: [{"name", "tags", "status", "error"}]."""
    return _request("list_servers")


def list_tools(server):
    """The tools of `server` this run may call: [{"name", "description"}]."""
    return _request("list_tools", server=server)
