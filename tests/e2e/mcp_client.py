"""End-to-end test of `gearbox serve` with the official MCP Python SDK over stdio.

Set up once with scripts/setup-e2e.sh, build gearbox, then:

    .venv/bin/python tests/e2e/mcp_client.py [--gearbox target/debug/gearbox]

Each check prints `ok` or `FAIL`; the last line is `N passed, N failed` and the exit status is
non-zero when anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
    """`gearbox serve` with a snippets dir and the given extra arguments."""

    def __init__(self, gearbox: str, *args: str, elicitation_callback=None):
        self.elicitation_callback = elicitation_callback
        self.tmp = tempfile.TemporaryDirectory(prefix="gearbox-e2e-")
        snippets = Path(self.tmp.name) / "snippets"
        snippets.mkdir()
        (snippets / "hello.py").write_text("print('hello from a snippet')\n")
        config = Path(self.tmp.name) / "gearbox.toml"
        config.write_text(f"snippets_dir = {json.dumps(str(snippets))}\n")
        self.params = StdioServerParameters(
            command=gearbox, args=["--config", str(config), "serve", *args]
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
        await self._session.__aexit__(*exc)
        await self._stdio.__aexit__(*exc)
        self.tmp.cleanup()


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
                {"language": "bash", "code": "sleep 60", "args": [marker]},
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
