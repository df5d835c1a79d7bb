"""End-to-end test of `gearbox serve --http` with the official MCP Python SDK's HTTP clients:
Streamable HTTP (`streamable_http_client`, and the high-level `Client`) and the 2024-11-05
HTTP+SSE transport (`sse_client`). Loopback only.

Set up once with scripts/setup-e2e.sh, build gearbox, then:

    .venv/bin/python tests/e2e/mcp_http_client.py [--gearbox target/debug/gearbox]

Each check prints `ok` or `FAIL`; the last line is `N passed, N failed` and the exit status is
non-zero when anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import httpx2
from mcp import Client, ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parents[2]
RESULTS: list[tuple[str, bool, str]] = []
KEY = "e2e-key-0123456789abcdef0123"


def check(name: str, cond: bool, detail: str = "") -> None:
    RESULTS.append((name, bool(cond), detail))
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + ("" if cond else f": {detail}"), flush=True)


class Daemon:
    """`gearbox serve --http 127.0.0.1:0` with an audit log in a temp dir."""

    def __init__(self, gearbox: str, keys: str | None, *extra: str):
        self.tmp = tempfile.TemporaryDirectory(prefix="gearbox-http-e2e-")
        self.audit = Path(self.tmp.name) / "audit.jsonl"
        env = {k: v for k, v in os.environ.items() if k not in ("GEARBOX_API_KEYS", "PORT")}
        if keys:
            env["GEARBOX_API_KEYS"] = keys
        self.proc = subprocess.Popen(
            [gearbox, "serve", "--http", "127.0.0.1:0", "--audit-log", str(self.audit), *extra],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        self.base = ""
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            m = re.search(r"listening on (http://\S+)/mcp", line)
            if m:
                self.base = m.group(1)
                break
        if not self.base:
            raise RuntimeError("gearbox serve --http did not start")
        # Keep draining stderr so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> int | None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        finally:
            self.tmp.cleanup()

    def audit_lines(self) -> list[dict]:
        try:
            return [json.loads(l) for l in self.audit.read_text().splitlines()]
        except OSError:
            return []


def auth_client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=60)


async def streamable(d: Daemon) -> None:
    async with auth_client() as http:
        async with streamable_http_client(f"{d.base}/mcp", http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                check(
                    "streamable HTTP: initialize",
                    init.server_info.name == "gearbox",
                    str(init.server_info),
                )
                tools = await s.list_tools()
                check(
                    "streamable HTTP: tools/list",
                    [t.name for t in tools.tools] == ["execute_code", "approval_status"],
                    str([t.name for t in tools.tools]),
                )
                r = await s.call_tool("execute_code", {"language": "python", "code": "print(6*7)"})
                sc = r.structured_content or {}
                check(
                    "streamable HTTP: execute_code",
                    not r.is_error and sc.get("stdout") == "42\n",
                    str(sc),
                )
                results = await asyncio.gather(
                    *[
                        s.call_tool("execute_code", {"language": "bash", "code": f"echo call-{i}"})
                        for i in range(4)
                    ]
                )
                outs = [(r.structured_content or {}).get("stdout") for r in results]
                check(
                    "streamable HTTP: 4 concurrent calls each get their own output",
                    outs == [f"call-{i}\n" for i in range(4)],
                    str(outs),
                )
    lines = d.audit_lines()
    check(
        "audit: one line per execution, caller is the key's name",
        len(lines) == 5 and all(l["caller"] == "e2e" and l["transport"] == "http" for l in lines),
        str(lines[:1]),
    )


async def sse(d: Daemon) -> None:
    async with sse_client(f"{d.base}/sse", headers={"Authorization": f"Bearer {KEY}"}) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check("SSE (2024-11-05): initialize", init.server_info.name == "gearbox", str(init))
            r = await s.call_tool("execute_code", {"language": "bash", "code": "echo sse $((6*7))"})
            sc = r.structured_content or {}
            check("SSE: execute_code", not r.is_error and sc.get("stdout") == "sse 42\n", str(sc))
            r = await s.call_tool("execute_code", {"language": "python", "code": "raise SystemExit(4)"})
            check(
                "SSE: a failing program is isError",
                r.is_error and (r.structured_content or {}).get("exit_code") == 4,
                str(r.structured_content),
            )
    check(
        "audit: SSE calls recorded as transport sse",
        any(l["transport"] == "sse" for l in d.audit_lines()),
        str(d.audit_lines()[-1:]),
    )


async def refused(d: Daemon) -> None:
    try:
        async with httpx2.AsyncClient(headers={"X-API-Key": "wrong-0123456789abcdef"}) as http:
            async with streamable_http_client(f"{d.base}/mcp", http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as s:
                    await asyncio.wait_for(s.initialize(), 10)
        check("a wrong key is refused", False, "initialize succeeded")
    except BaseException as e:  # the SDK raises an exception group
        check("a wrong key is refused", "401" in repr(e) or "nauthorized" in repr(e), repr(e)[:300])
    req = urllib.request.Request(f"{d.base}/healthz")
    with urllib.request.urlopen(req, timeout=10) as r:
        check("healthz needs no key", r.status == 200)


async def high_level_client(gearbox: str) -> None:
    # The SDK's high-level Client takes a bare URL, so this daemon has no keys (loopback).
    d = Daemon(gearbox, None)
    try:
        async with Client(f"{d.base}/mcp") as c:
            r = await c.call_tool("execute_code", {"language": "python", "code": "print('hl')"})
            sc = r.structured_content or {}
            check("high-level Client over /mcp", sc.get("stdout") == "hl\n", str(sc))
        check(
            "no key configured: caller is anonymous",
            any(l["caller"] == "anonymous" for l in d.audit_lines()),
            str(d.audit_lines()),
        )
    finally:
        rc = d.stop()
        check("SIGTERM: exit 0", rc == 0, str(rc))


def gearbox_cgroups(pid: int) -> set[str]:
    """The host directories of the gearbox cgroups that process `pid` and its descendants are
    in (the fork servers', the warm sandboxes'), and those named after `pid` (run cgroups the
    server created, in use or kept for reuse)."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(p))
        except (OSError, ValueError, IndexError):
            continue
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        tree.add(p)
        todo.extend(children.get(p, []))
    found = set()
    for p in tree:
        try:
            lines = Path(f"/proc/{p}/cgroup").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            path = line.split(":", 2)[-1]
            if path.startswith("/gearbox/"):
                found.update(glob.glob(f"/sys/fs/cgroup/*{path}") + glob.glob(f"/sys/fs/cgroup{path}"))
    found.update(glob.glob(f"/sys/fs/cgroup/*/gearbox/run-{pid}-*"))
    found.update(glob.glob(f"/sys/fs/cgroup/gearbox/run-{pid}-*"))
    return found


async def live_over_http(gearbox: str) -> None:
    """A live session over Streamable HTTP; after SIGTERM its sandbox and cgroup are gone."""
    d = Daemon(gearbox, f"e2e:{KEY}", "--profile", "sessions")
    helpers: set[int] = set()
    held: set[str] = set()
    try:
        async with auth_client() as http:
            async with streamable_http_client(f"{d.base}/mcp", http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as s:
                    await s.initialize()
                    r = await s.call_tool("exec_open", {"stateful": True, "language": "python"})
                    sid = (r.structured_content or {}).get("session_id", "")
                    check("live over HTTP: opened", not r.is_error and sid, str(r.structured_content))
                    for code in ["x = 41", "x + 1"]:
                        r = await s.call_tool(
                            "exec_run", {"session_id": sid, "language": "python", "code": code}
                        )
                    sc = r.structured_content or {}
                    check("live over HTTP: x + 1 is 42", sc.get("result") == "42", str(sc))
                    helpers = set(children(d.proc.pid))
                    if os.geteuid() == 0:
                        held = set().union(*(gearbox_cgroups(p) for p in helpers))
                        check("live over HTTP: its sandbox has a cgroup", bool(held), str(helpers))
    finally:
        rc = d.stop()
        check("live over HTTP: SIGTERM exits 0", rc == 0, str(rc))
    if os.geteuid() == 0:
        time.sleep(0.5)
        left = [p for p in helpers if os.path.exists(f"/proc/{p}")]
        cgroups = [c for c in held if os.path.exists(c)]
        check("live over HTTP: its sandbox and cgroup are gone after SIGTERM", not left and not cgroups,
              f"{left} {cgroups}")


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except OSError:
            pass
    return out


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default=str(ROOT / "target" / "debug" / "gearbox"))
    opts = ap.parse_args()
    d = Daemon(opts.gearbox, f"e2e:{KEY}")
    try:
        for group in (streamable, sse, refused):
            try:
                await group(d)
            except Exception as e:  # a crash in a group is one failure, the others still run
                check(f"{group.__name__} completed", False, repr(e))
    finally:
        cgroups = gearbox_cgroups(d.proc.pid) if os.geteuid() == 0 else set()
        t = time.monotonic()
        rc = d.stop()
        check("SIGTERM: exit 0 within 10 s", rc == 0 and time.monotonic() - t < 10, str(rc))
    if os.geteuid() == 0:
        # The fork servers ended and removed their cgroups; the run cgroups kept are gone.
        check("while serving: fork server and run cgroups found", len(cgroups) > 0, str(cgroups))
        time.sleep(0.5)
        left = sorted(c for c in cgroups | gearbox_cgroups(d.proc.pid) if os.path.exists(c))
        check("SIGTERM: no cgroup left behind", not left, str(left))
    try:
        await high_level_client(opts.gearbox)
    except Exception as e:
        check("high_level_client completed", False, repr(e))
    try:
        await live_over_http(opts.gearbox)
    except Exception as e:
        check("live_over_http completed", False, repr(e))
    passed = sum(1 for _, ok, _ in RESULTS if ok)
    failed = len(RESULTS) - passed
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
