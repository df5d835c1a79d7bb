"""End-to-end test of `gearbox serve` with the official MCP Python SDK over stdio.

Then issue 21's checks (shared with mcp_http_client.py, which runs them over Streamable HTTP):
a figure comes back as an `image` whose PNG has the figure's size; a large one is downscaled
inline and its `resource_link` reads back full size; a pandas DataFrame persists between live
cells (matplotlib and pandas from `packages`, one layer installed into a temporary cache); a
live session over its memory dies with the reason and another is untouched; two live sessions
share nothing; an idle live session expires and nothing of it is left.

Set up once with scripts/setup-e2e.sh, build gearbox, then:

    .venv/bin/python tests/e2e/mcp_client.py [--gearbox target/debug/gearbox]

Each check prints `ok` or `FAIL`; the last line is `N passed, N failed` and the exit status is
non-zero when anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import glob
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[2]
RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, cond: bool, detail: str = "") -> None:
    RESULTS.append((name, bool(cond), detail))
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + ("" if cond else f": {detail}"), flush=True)


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def processes_with(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


class Server:
    """`gearbox serve` with a snippets dir and the given extra arguments. `config` is added to
    its configuration file (top-level keys first, then tables); `@TMP@` in it is the server's
    temp dir (e.g. for its sessions dir)."""

    def __init__(self, gearbox: str, *args: str, elicitation_callback=None, config: str = ""):
        self.elicitation_callback = elicitation_callback
        self.tmp = tempfile.TemporaryDirectory(prefix="gearbox-e2e-")
        snippets = Path(self.tmp.name) / "snippets"
        snippets.mkdir()
        (snippets / "hello.py").write_text("print('hello from a snippet')\n")
        self.config = Path(self.tmp.name) / "gearbox.toml"
        self.config.write_text(
            f"snippets_dir = {json.dumps(str(snippets))}\n" + config.replace("@TMP@", self.tmp.name)
        )
        self.params = StdioServerParameters(
            command=gearbox, args=["--config", str(self.config), "serve", *args]
        )
        self.progress: list[tuple[float, float | None, str | None]] = []

    async def __aenter__(self) -> ClientSession:
        self._stdio = stdio_client(self.params)
        read, write = await self._stdio.__aenter__()
        self._session = ClientSession(read, write, elicitation_callback=self.elicitation_callback)
        session = await self._session.__aenter__()
        await session.initialize()
        return session

    async def __aexit__(self, *exc):
        # The server is stopped (and its temp dir removed) even when the session's exit raises:
        # a server left running would keep this script from ever ending.
        try:
            await self._session.__aexit__(*exc)
        finally:
            try:
                await self._stdio.__aexit__(*exc)
            finally:
                self.tmp.cleanup()

    def pid(self) -> int | None:
        """The `gearbox serve` process (our child, its config file on its command line)."""
        for p in processes_with(str(self.config)):
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                    return p
            except (OSError, ValueError, IndexError):
                continue
        return None


def descendants(pid: int) -> set[int]:
    """Processes below `pid` (its children, theirs, ...), from every process's parent in /proc."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(p))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = set(), list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(children.get(p, []))
    return found


def gearbox_cgroups(pids: set[int]) -> set[str]:
    """The host directories of the gearbox cgroups the processes `pids` are in, and the run
    cgroups they made (`run-{pid}-…`), as tests/e2e/mcp_http_client.py finds them."""
    found: set[str] = set()
    for p in pids:
        try:
            lines = Path(f"/proc/{p}/cgroup").read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            path = line.split(":", 2)[-1]
            if path.startswith("/gearbox/"):
                found.update(glob.glob(f"/sys/fs/cgroup/*{path}") + glob.glob(f"/sys/fs/cgroup{path}"))
        found.update(glob.glob(f"/sys/fs/cgroup/*/gearbox/run-{p}-*"))
        found.update(glob.glob(f"/sys/fs/cgroup/gearbox/run-{p}-*"))
    return found


async def gone_within(pids: set[int], cgroups: set[str], seconds: float) -> tuple[list, list]:
    """Wait until none of `pids` runs and none of `cgroups` exists; what is left at the end."""
    deadline = time.monotonic() + seconds
    while True:
        left = sorted(p for p in pids if os.path.exists(f"/proc/{p}"))
        held = sorted(c for c in cgroups if os.path.exists(c))
        if (not left and not held) or time.monotonic() > deadline:
            return left, held
        await asyncio.sleep(0.1)


def png_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's IHDR (big-endian u32 at bytes 16..24); None if not a PNG."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n") or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


def images(result) -> list[tuple[str, bytes]]:
    """The `image` contents of a tool result: (MIME type, decoded bytes)."""
    return [
        (c.mime_type, base64.b64decode(c.data))
        for c in result.content
        if getattr(c, "type", "") == "image"
    ]


def links(result) -> list:
    """The `resource_link` contents of a tool result."""
    return [c for c in result.content if getattr(c, "type", "") == "resource_link"]


async def read_bytes(s: ClientSession, uri: str) -> tuple[bytes, str | None]:
    """resources/read of `uri`: its bytes (blob or text) and MIME type."""
    c = (await s.read_resource(uri)).contents[0]
    if getattr(c, "blob", None) is not None:
        return base64.b64decode(c.blob), c.mime_type
    return c.text.encode(), c.mime_type


# matplotlib and pandas from `packages`: one layer, installed once per run of this script into
# a cache of its own (outside /tmp, walkable by the sandbox user), removed at exit.
# GEARBOX_E2E_PACKAGE_CACHE names a cache to use and keep instead (to rerun without installing).
PACKAGES = ["matplotlib", "pandas"]
_CACHE: list[str] = []


def package_cache() -> str:
    if not _CACHE and os.environ.get("GEARBOX_E2E_PACKAGE_CACHE"):
        _CACHE.append(os.environ["GEARBOX_E2E_PACKAGE_CACHE"])
    if not _CACHE:
        cache = f"/var/tmp/gearbox-e2e-packages-{os.getpid()}"
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache)
        os.chmod(cache, 0o755)
        atexit.register(shutil.rmtree, cache, True)
        _CACHE.append(cache)
    return _CACHE[0]


def rich_config() -> str:
    """full_trust (packages at exec_open need it), room for matplotlib, the package cache."""
    return (
        'gear = "full_trust"\npool = {}\n[limits]\ntimeout_ms = 120000\nmemory_mb = 1024\n'
        '[sessions]\ndir = "@TMP@/sessions"\n'
        f"[packages]\ncache_dir = {json.dumps(package_cache())}\ninstall_timeout_ms = 600000\n"
    )


async def languages_and_layout(gearbox: str) -> None:
    async with Server(gearbox) as s:
        tools = await s.list_tools()
        names = [t.name for t in tools.tools]
        check(
            "default profile lists execute_code and approval_status",
            names == ["execute_code", "approval_status"],
            str(names),
        )
        tool = tools.tools[0]
        check("execute_code declares an outputSchema", bool(tool.output_schema))
        check(
            "annotations are honest",
            tool.annotations is not None
            and tool.annotations.read_only_hint is False
            and tool.annotations.open_world_hint is False,
            str(tool.annotations),
        )
        programs = {
            "python": ("print('py', 6*7)", "py 42\n"),
            "javascript": ("console.log('js', 6*7)", "js 42\n"),
            "bash": ("echo sh $((6*7))", "sh 42\n"),
            "go": (
                'package main\nimport "fmt"\nfunc main() { fmt.Println("go", 6*7) }\n',
                "go 42\n",
            ),
        }
        for lang, (code, want) in programs.items():
            r = await s.call_tool("execute_code", {"language": lang, "code": code})
            sc = r.structured_content or {}
            check(
                f"{lang} runs",
                not r.is_error and sc.get("status") == "ok" and sc.get("stdout") == want,
                f"{r.is_error} {sc}",
            )
            check(
                f"{lang} text layout",
                text_of(r) == f"--- stdout ---\n{want}--- stderr ---\n",
                repr(text_of(r)),
            )
        r = await s.call_tool(
            "execute_code", {"language": "python", "code": "import sys; sys.exit(3)"}
        )
        sc = r.structured_content or {}
        check(
            "failure is isError with exit code",
            r.is_error and sc.get("status") == "error" and sc.get("exit_code") == 3,
            str(sc),
        )
        check(
            "failure text has the seed-000 prefix",
            text_of(r).startswith("Execution Failed (error): exit code 3"),
            text_of(r),
        )
        r = await s.call_tool(
            "execute_code",
            {"language": "bash", "code": "sleep 5", "timeout_ms": 300},
        )
        check(
            "timeout is reported",
            r.is_error and (r.structured_content or {}).get("status") == "timeout",
            text_of(r),
        )
        env = await s.read_resource("gearbox://env")
        doc = json.loads(env.contents[0].text)
        check(
            "gearbox://env names /work and python's version",
            doc["workspace"]["cwd"] == "/work"
            and any(
                (l.get("version") or "").startswith("Python 3") for l in doc["languages"]
            ),
            json.dumps(doc)[:300],
        )


async def argument_errors(gearbox: str) -> None:
    async with Server(gearbox) as s:
        cases = [
            ({"language": "python", "code": 5}, "code"),
            ({"language": "python", "code": "1", "bogus": True}, "bogus"),
            ({"language": "python"}, "code"),
            ({"language": "brainfuck", "code": "+"}, "language"),
            ({"language": "python", "code": "1", "timeout_ms": 10**9}, "timeout_ms"),
            (
                {
                    "language": "python",
                    "code": "1",
                    "files": [{"filename": "/etc/x", "content": ""}],
                },
                "files[0].filename",
            ),
        ]
        for args, field in cases:
            r = await s.call_tool("execute_code", args)
            check(
                f"argument error names {field}",
                r.is_error and field in text_of(r),
                text_of(r),
            )
        try:
            await s.call_tool("no_such_tool", {})
            check("unknown tool is a JSON-RPC error", False, "no error raised")
        except Exception as e:  # the SDK raises MCPError for JSON-RPC errors
            code = getattr(getattr(e, "error", None), "code", None)
            check(
                "unknown tool is a JSON-RPC error (-32602)",
                code == -32602 or "-32602" in str(e) or "no_such_tool" in str(e),
                repr(e),
            )


async def snippets(gearbox: str) -> None:
    async with Server(gearbox, "--profile", "isolator") as s:
        r = await s.call_tool("execute_code", {"snippet_name": "hello"})
        check(
            "snippet runs by name",
            not r.is_error
            and (r.structured_content or {}).get("stdout") == "hello from a snippet\n",
            text_of(r),
        )
        for bad in ["../../etc/passwd", "a/b", ".."]:
            r = await s.call_tool("execute_code", {"snippet_name": bad})
            check(
                f"snippet {bad!r} refused",
                r.is_error and (r.structured_content or {}).get("status") == "denied",
                text_of(r),
            )
        templates = await s.list_resource_templates()
        check(
            "snippet template listed",
            any(t.uri_template == "gearbox://snippets/{name}" for t in templates.resource_templates),
        )
        src = await s.read_resource("gearbox://snippets/hello")
        check(
            "snippet source readable",
            src.contents[0].text == "print('hello from a snippet')\n",
        )


async def profiles(gearbox: str) -> None:
    async with Server(
        gearbox, "--profile", "quickjs", "--profile", "heroku", "--profile", "sidecar"
    ) as s:
        names = sorted(t.name for t in (await s.list_tools()).tools)
        check(
            "profile tools listed",
            names == ["code_exec_python", "execute", "list_packages", "run_javascript_code"],
            str(names),
        )
        r = await s.call_tool("run_javascript_code", {"code": "console.log(1+1)"})
        check("quickjs: run_javascript_code", "2" in text_of(r) and not r.is_error, text_of(r))
        r = await s.call_tool("code_exec_python", {"code": "print('hi')"})
        check(
            "heroku: code_exec_python",
            r.structured_content == {"returncode": 0, "stdout": "hi\n", "stderr": ""},
            str(r.structured_content),
        )
        r = await s.call_tool("code_exec_python", {"code": "1", "packages": ["numpy"]})
        sc = r.structured_content or {}
        check(
            "heroku: packages wait for a human (user_confirmed), in the drop-in shape",
            sc.get("returncode") == -1 and "pending_approval" in (sc.get("stderr") or ""),
            str(sc),
        )
        r = await s.call_tool("execute", {"code": "print('side')", "language": "python"})
        sc = r.structured_content or {}
        check(
            "sidecar: execute",
            sc.get("stdout") == "side\n" and sc.get("exit_code") == 0,
            str(sc),
        )
        r = await s.call_tool("list_packages", {})
        sc = r.structured_content or {}
        check(
            "sidecar: list_packages",
            not r.is_error and "json" in sc.get("modules", []),
            text_of(r)[:300],
        )
        info = await s.read_resource("env://info")
        check("sidecar: env://info", "python" in info.contents[0].text, info.contents[0].text)


async def concurrency_and_cancel(gearbox: str) -> None:
    async with Server(gearbox) as s:
        async def one(i: int):
            r = await s.call_tool(
                "execute_code",
                {"language": "python", "code": f"import time\ntime.sleep(0.2)\nprint('call-{i}')"},
            )
            return i, r

        results = await asyncio.gather(*(one(i) for i in range(20)))
        wrong = [
            i
            for i, r in results
            if r.is_error or (r.structured_content or {}).get("stdout") != f"call-{i}\n"
        ]
        check("20 concurrent calls each get their own output", not wrong, str(wrong))

        progress: list = []

        async def on_progress(progress_value, total, message):
            progress.append((progress_value, total, message))

        marker = f"gearbox-e2e-cancel-{os.getpid()}"
        task = asyncio.create_task(
            s.call_tool(
                "execute_code",
                # The marker in the command line of the run's own process (`exec -a`): a
                # warm bash's command line is the one it was started with, before the
                # run's arguments were known (docs/PERFORMANCE.md).
                {"language": "bash", "code": f"exec -a {marker} sleep 60"},
                progress_callback=on_progress,
            )
        )
        deadline = time.monotonic() + 10
        while not progress and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        check("progress notifications arrive", bool(progress), "none within 10 s")
        check("the run is alive before cancelling", bool(processes_with(marker)))
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        deadline = time.monotonic() + 5
        while processes_with(marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        survivors = processes_with(marker)
        check("cancellation kills the run", not survivors, f"still running: {survivors}")
        for pid in survivors:  # leave nothing behind, whatever the outcome
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        r = await s.call_tool("execute_code", {"language": "bash", "code": "echo alive"})
        check("server serves after a cancel", (r.structured_content or {}).get("stdout") == "alive\n")


async def gears_and_elicitation(gearbox: str) -> None:
    """The user_confirmed gear asks through the SDK's elicitation callback."""
    from mcp import types

    asked: list[str] = []

    def answering(action: str, approve: bool):
        async def callback(context, params):
            asked.append(params.message)
            if action == "accept":
                return types.ElicitResult(action="accept", content={"approve": approve})
            return types.ElicitResult(action=action)

        return callback

    code = "exec('print(6*7)')"
    for action, approve, want in [
        ("accept", True, "ok"),
        ("accept", False, "denied"),
        ("decline", False, "denied"),
        ("cancel", False, "denied"),
    ]:
        asked.clear()
        async with Server(
            gearbox, "--gear", "user_confirmed", elicitation_callback=answering(action, approve)
        ) as s:
            r = await s.call_tool("execute_code", {"language": "python", "code": code})
            st = r.structured_content or {}
            check(
                f"elicitation {action} approve={approve} -> {want}",
                st.get("status") == want and len(asked) == 1,
                f"{st} asked={asked}",
            )
            if want == "ok":
                check("approved run printed", st.get("stdout") == "42\n", str(st))
                check(
                    "question names the finding",
                    "main.py:1" in asked[0] and "dynamic" in asked[0],
                    asked[0],
                )
    async with Server(gearbox, "--gear", "restricted") as s:
        r = await s.call_tool(
            "execute_code", {"language": "python", "code": "import socket\nsocket.socket()"}
        )
        st = r.structured_content or {}
        check(
            "restricted refuses detected network with findings",
            st.get("status") == "denied" and "main.py:1" in (st.get("reason") or ""),
            str(st),
        )


async def live_sessions(gearbox: str) -> None:
    async with Server(gearbox, "--profile", "sessions") as s:
        r = await s.call_tool("exec_open", {"stateful": True, "language": "python"})
        sc = r.structured_content or {}
        check("live session: opened", not r.is_error and sc.get("live") == "python", text_of(r))
        sid = sc.get("session_id", "")

        async def cell(code: str, timeout_ms: int = 10000) -> dict:
            r = await s.call_tool(
                "exec_run",
                {"session_id": sid, "language": "python", "code": code, "timeout_ms": timeout_ms},
            )
            return r.structured_content or {}

        await cell("x = 41")
        sc = await cell("x + 1")
        check("live session: x = 41 then x + 1 is 42", sc.get("result") == "42", str(sc))
        await cell("rows = {'a': [1, 2, 3]}")
        sc = await cell("sum(rows['a'])")
        check("live session: a structure built in one cell is used in the next", sc.get("result") == "6", str(sc))
        sc = await cell("while True:\n    pass", 1000)
        check("live session: a runaway cell is interrupted", sc.get("status") == "timeout", str(sc))
        sc = await cell("x")
        check("live session: it still answers, state intact", sc.get("result") == "41", str(sc))
        r = await s.call_tool("exec_close", {"session_id": sid})
        check("live session: closed", not r.is_error, text_of(r))


# Issue 21's checks. Each takes a connected `ClientSession` and the `check` to record with, so
# tests/e2e/mcp_http_client.py runs the same ones over Streamable HTTP; `label` starts every
# check's name there.

async def pictures_checks(s: ClientSession, check=check, label: str = "") -> None:
    """Pictures as `image` contents, and a large one downscaled inline and linked full size
    (stateless execute_code, matplotlib from `packages`). Needs rich_config()'s server."""
    code = (
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n"
        "ax.plot([1, 2, 3], [1, 4, 9])\n"
    )
    r = await s.call_tool("execute_code", {"language": "python", "code": code, "packages": PACKAGES})
    pngs = images(r)
    check(
        f"{label}pictures: a figure left open comes back as one image/png content",
        not r.is_error and [m for m, _ in pngs] == ["image/png"],
        text_of(r)[-600:],
    )
    size = png_size(pngs[0][1]) if pngs else None
    check(f"{label}pictures: its PNG decodes to 400x300 (IHDR)", size == (400, 300), str(size))

    code = "import matplotlib.pyplot as plt\nplt.figure(figsize=(40, 30), dpi=100)\nplt.plot(range(10))\n"
    r = await s.call_tool("execute_code", {"language": "python", "code": code, "packages": PACKAGES})
    pngs = images(r)
    size = png_size(pngs[0][1]) if len(pngs) == 1 else None
    check(
        f"{label}pictures: a 4000x3000 figure comes back inline downscaled (long side 1024, 4:3, <= 256 KiB)",
        not r.is_error
        and size is not None
        and max(size) == 1024
        and abs(size[0] * 3 - size[1] * 4) <= 8
        and len(pngs[0][1]) <= 256 * 1024,
        f"{size} {[len(b) for _, b in pngs]} {text_of(r)[-400:]}",
    )
    full = [l for l in links(r) if l.description == "the full-size picture"]
    check(
        f"{label}pictures: a resource_link to the full-size PNG",
        len(full) == 1
        and str(full[0].uri).startswith("gearbox://runs/")
        and full[0].mime_type == "image/png",
        str(links(r)),
    )
    if full:
        data, mime = await read_bytes(s, str(full[0].uri))
        check(
            f"{label}pictures: resources/read of the link is the full 4000x3000 PNG",
            mime == "image/png" and png_size(data) == (4000, 3000),
            f"{mime} {png_size(data)} {len(data)} bytes",
        )


async def live_cell(s: ClientSession, sid: str, code: str, timeout_ms: int = 10000) -> dict:
    """Run `code` as the next cell of live session `sid`; the structured outcome."""
    r = await s.call_tool(
        "exec_run", {"session_id": sid, "language": "python", "code": code, "timeout_ms": timeout_ms}
    )
    return r.structured_content or {}


async def open_live(s: ClientSession, **extra) -> tuple[str, str]:
    """exec_open of a live Python session: its id ("" when refused) and the result's text."""
    r = await s.call_tool("exec_open", {"stateful": True, "language": "python", **extra})
    sid = "" if r.is_error else (r.structured_content or {}).get("session_id", "")
    return sid, text_of(r)[:300]


async def live_pandas_checks(s: ClientSession, check=check, label: str = "") -> None:
    """A pandas DataFrame built in one live cell is used in the next (pandas given at open).
    Needs rich_config()'s server."""
    sid, opened = await open_live(s, packages=PACKAGES)
    check(f"{label}live pandas: opened with packages", sid, opened)
    sc = await live_cell(
        s, sid, "import pandas as pd\ndf = pd.DataFrame({'n': range(1000)})\ndf['sq'] = df['n'] ** 2", 60000
    )
    check(f"{label}live pandas: a DataFrame built in one cell", sc.get("status") == "ok", str(sc)[:400])
    sc = await live_cell(s, sid, "(type(df).__name__, int(df['sq'].sum()))", 60000)
    check(
        f"{label}live pandas: the DataFrame is used in the next cell",
        sc.get("result") == "('DataFrame', 332833500)",
        str(sc)[:400],
    )
    await s.call_tool("exec_close", {"session_id": sid})


async def live_memory_checks(s: ClientSession, server: int | None, check=check, label: str = "") -> None:
    """A live session over its memory dies with the reason, the next call says so, its
    processes are gone, and another live session beside it is untouched. Needs a server with
    `[limits] memory_mb = 128`; `server` is its pid."""
    before = descendants(server) if server else set()
    hog, t1 = await open_live(s)
    hog_procs = (descendants(server) - before) if server else set()
    other, t2 = await open_live(s)
    check(f"{label}live memory: two sessions opened", hog and other, f"{t1} {t2}")
    await live_cell(s, other, "mine = 'untouched'")
    sc = await live_cell(s, hog, "b = []\nwhile True:\n    b.append(bytearray(16 << 20))", 20000)
    check(
        f"{label}live memory: the cell over the limit is killed, the reason names memory",
        sc.get("status") == "killed" and "memory" in (sc.get("reason") or ""),
        str(sc)[:400],
    )
    sc = await live_cell(s, hog, "1")
    reason = sc.get("reason") or ""
    check(
        f"{label}live memory: the next call says the session has ended, and why (memory)",
        sc.get("status") == "killed" and "has ended" in reason and "memory" in reason,
        str(sc)[:400],
    )
    left, _ = await gone_within(hog_procs, set(), 10)
    check(
        f"{label}live memory: the dead session's processes are gone",
        server is not None and hog_procs and not left,
        f"server={server} procs={hog_procs} left={left}",
    )
    sc = await live_cell(s, other, "mine")
    check(
        f"{label}live memory: the session beside it is untouched",
        sc.get("status") == "ok" and sc.get("result") == "'untouched'",
        str(sc)[:400],
    )
    for sid in (hog, other):
        await s.call_tool("exec_close", {"session_id": sid})


async def live_isolation_checks(s: ClientSession, check=check, label: str = "") -> None:
    """Two live sessions see neither each other's variables nor files (/work, /tmp)."""
    (a, t1), (b, t2) = await open_live(s), await open_live(s)
    check(f"{label}live isolation: two sessions opened", a and b, f"{t1} {t2}")
    listing = "sorted(os.listdir('/work')) + sorted(os.listdir('/tmp'))"
    sc = await live_cell(
        s,
        a,
        "import os\nsecret = 'A-only'\nopen('/work/a.txt', 'w').write('A')\n"
        "open('/tmp/a.tmp', 'w').write('A')\n" + listing,
    )
    result = sc.get("result") or ""
    check(
        f"{label}live isolation: session A wrote its variable and files",
        sc.get("status") == "ok" and "'a.txt'" in result and "'a.tmp'" in result,
        str(sc)[:400],
    )
    sc = await live_cell(s, b, "secret")
    check(
        f"{label}live isolation: session B does not see A's variable",
        sc.get("status") == "error" and "NameError" in (sc.get("reason") or "") + (sc.get("stderr") or ""),
        str(sc)[:400],
    )
    sc = await live_cell(s, b, "import os\n" + listing)
    check(
        f"{label}live isolation: session B sees none of A's files (/work, /tmp)",
        sc.get("status") == "ok" and sc.get("result") == "[]",
        str(sc)[:400],
    )
    await live_cell(s, b, "secret = 'B-only'\nopen('/work/b.txt', 'w').write('B')")
    sc = await live_cell(s, a, f"(secret, {listing})")
    check(
        f"{label}live isolation: A keeps its own and sees nothing of B's",
        sc.get("result") == "('A-only', ['a.txt', 'a.tmp'])",
        str(sc)[:400],
    )
    for sid in (a, b):
        await s.call_tool("exec_close", {"session_id": sid})


async def live_expiry_checks(s: ClientSession, server: int | None, check=check, label: str = "") -> None:
    """An idle live session expires after the TTL: none of its processes (nor, as root, its
    cgroup) is left, and the next call says it does not exist. Needs a server with
    `[sessions] ttl_secs = 2`; `server` is its pid."""
    before = descendants(server) if server else set()
    sid, opened = await open_live(s)
    sc = await live_cell(s, sid, "1 + 1")
    last_use = time.monotonic()
    procs = (descendants(server) - before) if server else set()
    cgroups = gearbox_cgroups(procs) if os.geteuid() == 0 else set()
    check(
        f"{label}idle expiry: the live session runs, with its own processes",
        sc.get("result") == "2" and procs,
        f"server={server} procs={procs} {opened} {str(sc)[:300]}",
    )
    if os.geteuid() == 0:
        check(f"{label}idle expiry: its sandbox has a cgroup", bool(cgroups), str(procs))
    left, held = await gone_within(procs, cgroups, 30)
    idle = time.monotonic() - last_use
    check(
        f"{label}idle expiry: past the TTL (2 s) its processes and cgroup are gone",
        procs and not left and not held and idle >= 2,
        f"left={left} cgroups={held} after {idle:.1f} s",
    )
    r = await s.call_tool("exec_run", {"session_id": sid, "language": "python", "code": "1"})
    check(
        f"{label}idle expiry: the next call says the session does not exist (expired)",
        r.is_error and "does not exist" in text_of(r) and "expired" in text_of(r),
        text_of(r)[:300],
    )


MEMORY_CONFIG = 'pool = {}\n[limits]\nmemory_mb = 128\n[sessions]\ndir = "@TMP@/sessions"\n'
EXPIRY_CONFIG = 'pool = {}\n[sessions]\ndir = "@TMP@/sessions"\nttl_secs = 2\n'


async def rich_outputs(gearbox: str) -> None:
    async with Server(gearbox, "--profile", "sessions", config=rich_config()) as s:
        await pictures_checks(s)
        await live_pandas_checks(s)


async def live_memory_and_isolation(gearbox: str) -> None:
    srv = Server(gearbox, "--profile", "sessions", config=MEMORY_CONFIG)
    async with srv as s:
        await live_memory_checks(s, srv.pid())
        await live_isolation_checks(s)


async def live_idle_expiry(gearbox: str) -> None:
    srv = Server(gearbox, "--profile", "sessions", config=EXPIRY_CONFIG)
    async with srv as s:
        await live_expiry_checks(s, srv.pid())


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default=str(ROOT / "target" / "debug" / "gearbox"))
    ap.add_argument("--skip-cancel", action="store_true", help="skip the cancellation check")
    opts = ap.parse_args()
    groups = [
        languages_and_layout,
        argument_errors,
        snippets,
        profiles,
        gears_and_elicitation,
        live_sessions,
        rich_outputs,
        live_memory_and_isolation,
        live_idle_expiry,
    ]
    if not opts.skip_cancel:
        groups.append(concurrency_and_cancel)
    for group in groups:
        try:
            await group(opts.gearbox)
        except Exception as e:  # a crash in a group is one failure, the others still run
            check(f"{group.__name__} completed", False, repr(e))
    passed = sum(1 for _, ok, _ in RESULTS if ok)
    failed = len(RESULTS) - passed
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
