"""End-to-end test of `gearbox serve --http` with the official MCP Python SDK's HTTP clients:
Streamable HTTP (`streamable_http_client`, and the high-level `Client`) and the 2024-11-05
HTTP+SSE transport (`sse_client`). Loopback only.

Then issue 22's checks, two API keys (alice, bob) against one daemon each time: bob cannot see
or touch alice's sessions, live sessions, run outputs or pending approvals, by list or by id
(the answers are those for a never-issued id); per-tenant quotas refuse naming the quota (429
with Retry-After) and reset; a key capped at `restricted` never gets `full_trust`; one tenant's
flood does not hold back another's single call; OAuth tokens minted here by a local issuer
(P-256 key, JWKS on loopback): valid, expired, wrong audience, wrong issuer, unknown key,
missing scope, rotated key. And issue 21's checks of mcp_client.py (pictures, a large one
linked full size, live sessions: a DataFrame between cells, memory, isolation, idle expiry).

Set up once with scripts/setup-e2e.sh, build gearbox, then:

    .venv/bin/python tests/e2e/mcp_http_client.py [--gearbox target/debug/gearbox]

Each check prints `ok` or `FAIL`; the last line is `N passed, N failed` and the exit status is
non-zero when anything failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextlib
import http.server
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
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from jwt.algorithms import ECAlgorithm
from mcp import Client, ClientSession
from mcp.client.sse import sse_client
from mcp.shared.exceptions import MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import mcp_client as e2e  # issue 21's checks, shared with the stdio script (same directory)

ROOT = Path(__file__).resolve().parents[2]
RESULTS: list[tuple[str, bool, str]] = []
KEY = "e2e-key-0123456789abcdef0123"
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-fedcba9876543210"
TWO_KEYS = f"alice:{ALICE},bob:{BOB}"


def check(name: str, cond: bool, detail: str = "") -> None:
    RESULTS.append((name, bool(cond), detail))
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + ("" if cond else f": {detail}"), flush=True)


class Daemon:
    """`gearbox serve --http 127.0.0.1:0` with an audit log in a temp dir."""

    def __init__(self, gearbox: str, keys: str | None, *extra: str, config: str = ""):
        self.tmp = tempfile.TemporaryDirectory(prefix="gearbox-http-e2e-")
        self.audit = Path(self.tmp.name) / "audit.jsonl"
        pre: list[str] = []
        if config:
            # `@TMP@` in the config is this daemon's temp dir (e.g. its sessions dir).
            cfg = Path(self.tmp.name) / "config.toml"
            cfg.write_text(config.replace("@TMP@", self.tmp.name))
            pre = ["--config", str(cfg)]
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("GEARBOX_API_KEYS", "PORT", "GEARBOX_REPLICA", "GEARBOX_PEER_SECRET")
        }
        if keys:
            env["GEARBOX_API_KEYS"] = keys
        self.proc = subprocess.Popen(
            [gearbox, *pre, "serve", "--http", "127.0.0.1:0", "--audit-log", str(self.audit), *extra],
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
    tree = e2e.descendants(pid) | {pid}
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


async def issue21_over_http(gearbox: str) -> None:
    """Issue 21's checks of tests/e2e/mcp_client.py over Streamable HTTP, a daemon for each
    configuration: pictures and a large one linked full size, a DataFrame kept between live
    cells (matplotlib and pandas from `packages`); a live session over its memory, and two
    that share nothing; an idle live session that expires with nothing of it left."""
    label = "over HTTP: "

    async def rich(s: ClientSession, pid: int) -> None:
        await e2e.pictures_checks(s, check, label)
        await e2e.live_pandas_checks(s, check, label)

    async def memory(s: ClientSession, pid: int) -> None:
        await e2e.live_memory_checks(s, pid, check, label)
        await e2e.live_isolation_checks(s, check, label)

    async def expiry(s: ClientSession, pid: int) -> None:
        await e2e.live_expiry_checks(s, pid, check, label)

    for config, run in (
        (e2e.rich_config(), rich),
        (e2e.MEMORY_CONFIG, memory),
        (e2e.EXPIRY_CONFIG, expiry),
    ):
        d = Daemon(gearbox, f"e2e:{KEY}", "--profile", "sessions", config=config)
        try:
            async with connect(d, KEY) as s:
                await run(s, d.proc.pid)
        finally:
            d.stop()


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(c) for c in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except OSError:
            pass
    return out


@contextlib.asynccontextmanager
async def connect(d: Daemon, bearer: str):
    """A `ClientSession` over Streamable HTTP with `bearer` (an API key or a token)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {bearer}"}, timeout=300) as http:
        async with streamable_http_client(f"{d.base}/mcp", http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s


def raw_client(**kw) -> httpx2.AsyncClient:
    """A plain HTTP client for raw requests, one connection per request: a pooled keep-alive
    connection the server closes as it is reused would fail a request for no fault of either
    side (seen once on a loaded machine)."""
    return httpx2.AsyncClient(timeout=120, limits=httpx2.Limits(max_keepalive_connections=0), **kw)


def text_of(r) -> str:
    return "".join(getattr(c, "text", "") for c in r.content)


def sc_of(r) -> dict:
    return r.structured_content or {}


def other_id(real: str) -> str:
    """An id of the same shape as `real` that was never issued (its last character changed)."""
    last = real[-1]
    return real[:-1] + ("1" if last != "1" else "2")


async def read_error(s: ClientSession, uri: str) -> str:
    """resources/read of `uri`: the error's message, or `READ OK` when it was read."""
    try:
        await s.read_resource(uri)
        return "READ OK"
    except MCPError as e:
        return e.message


async def metrics_until(d: Daemon, needle: str) -> str:
    """Poll /metrics until it has `needle` (a bound on waiting, not on speed)."""
    deadline = time.monotonic() + 120
    async with raw_client(headers={"Authorization": f"Bearer {ALICE}"}) as h:
        while True:
            m = (await h.get(f"{d.base}/metrics")).text
            if needle in m or time.monotonic() > deadline:
                return m
            await asyncio.sleep(0.05)


async def raw_session(h: httpx2.AsyncClient, d: Daemon, key: str) -> str:
    """initialize + notifications/initialized over raw HTTP; the MCP session id."""
    hdrs = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}
    r = await h.post(f"{d.base}/mcp", headers=hdrs, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
    sid = r.headers["mcp-session-id"]
    await h.post(f"{d.base}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                 headers={**hdrs, "mcp-session-id": sid, "mcp-protocol-version": "2025-03-26"})
    return sid


async def tenants(gearbox: str) -> None:
    """Two keys of one daemon: bob cannot see or touch alice's sessions (files, live) or run
    outputs, by list or by id; to him they are as a never-issued id; alice still has them."""
    d = Daemon(gearbox, TWO_KEYS, "--profile", "sessions",
               config='gear = "full_trust"\n[sessions]\ndir = "@TMP@/sessions"\n')
    try:
        async with connect(d, ALICE) as alice, connect(d, BOB) as bob:
            r = await alice.call_tool("exec_open", {})
            files = sc_of(r).get("session_id", "")
            r = await alice.call_tool("exec_run", {
                "session_id": files, "language": "python",
                "code": "open('secret.txt', 'w').write('alice only')"})
            check("tenants: alice writes a file in her session", files and not r.is_error, text_of(r))
            r = await alice.call_tool("exec_open", {"stateful": True, "language": "python"})
            live = sc_of(r).get("session_id", "")
            r = await alice.call_tool("exec_run", {"session_id": live, "language": "python",
                                                   "code": "x = 'alice'"})
            check("tenants: alice opens a live session", live and not r.is_error, text_of(r))
            code = ("import os\nos.makedirs('/work/outputs', exist_ok=True)\n"
                    "open('/work/outputs/secret.txt', 'w').write('alice only')\n")
            r = await alice.call_tool("execute_code", {"language": "python", "code": code})
            links = [c.uri for c in r.content if getattr(c, "type", "") == "resource_link"]
            out = str(links[0]) if links else ""
            check("tenants: alice's run output is a gearbox://runs/ link",
                  out.startswith("gearbox://runs/") and out.endswith("/outputs/secret.txt"),
                  f"{links} {text_of(r)[:300]}")
            listed = [str(x.uri) for x in (await bob.list_resources()).resources]
            mine = [str(x.uri) for x in (await alice.list_resources()).resources]
            check("tenants: alice's resources/list has her session", any(files in u for u in mine),
                  str(mine))
            check("tenants: bob's resources/list shows none of alice's",
                  not any(files in u or live in u for u in listed) and out not in listed, str(listed))
            for kind, sid in (("files", files), ("live", live)):
                fake = other_id(sid)
                for tool, args in (
                    ("exec_run", {"language": "python", "code": "print(open('secret.txt').read())"}),
                    ("execute_code", {"language": "python", "code": "print(x)"}),
                    ("exec_get_artifact", {"path": "secret.txt"}),
                    ("exec_close", {}),
                ):
                    r = await bob.call_tool(tool, {"session_id": sid, **args})
                    n = await bob.call_tool(tool, {"session_id": fake, **args})
                    t, tn = text_of(r), text_of(n)
                    check(f"tenants: bob's {tool} on alice's {kind} session is 'does not exist', "
                          "as a never-issued id",
                          r.is_error and "does not exist" in t and "alice" not in t
                          and t.replace(sid, fake) == tn, f"{t!r} vs {tn!r}")
                uri = f"gearbox://sessions/{sid}/files/secret.txt"
                e = await read_error(bob, uri)
                en = await read_error(bob, uri.replace(sid, fake))
                check(f"tenants: bob's resources/read of alice's {kind} session file fails as a "
                      "never-issued id", e != "READ OK" and e.replace(sid, fake) == en,
                      f"{e!r} vs {en!r}")
            if out:
                run = out.split("/")[3]
                fake_out = out.replace(run, other_id(run))
                e = await read_error(bob, out)
                en = await read_error(bob, fake_out)
                check("tenants: bob's resources/read of alice's run output fails as a never-issued "
                      "id", e != "READ OK" and e.replace(run, other_id(run)) == en,
                      f"{e!r} vs {en!r}")
            # Alice still has all of it, untouched.
            r = await alice.call_tool("exec_get_artifact", {"session_id": files, "path": "secret.txt"})
            check("tenants: alice still reads her file", sc_of(r).get("content") == "alice only",
                  text_of(r)[:300])
            r = await alice.call_tool("exec_run", {"session_id": live, "language": "python",
                                                   "code": "x"})
            check("tenants: alice's live session still has x", sc_of(r).get("result") == "'alice'",
                  text_of(r)[:300])
            if out:
                rr = await alice.read_resource(out)
                got = getattr(rr.contents[0], "text", None)
                check("tenants: alice reads her run output", got == "alice only", str(rr)[:300])
    finally:
        rc = d.stop()
        check("tenants: SIGTERM exits 0", rc == 0, str(rc))


async def approvals(gearbox: str) -> None:
    """A run of alice's pending approval: bob (an approver, of his own tenant) neither lists,
    shows, decides nor asks the status of it: 404 / an empty list, as a never-issued id."""
    d = Daemon(gearbox, TWO_KEYS, "--gear", "user_confirmed",
               config='[approvals]\nhttp_approvers = ["alice", "bob"]\n')
    try:
        async with connect(d, ALICE) as alice, connect(d, BOB) as bob:
            r = await alice.call_tool("execute_code", {"language": "python", "network": True,
                                                      "code": "print('approved')"})
            op = sc_of(r).get("operation_id", "")
            check("approvals: alice's network run is pending_approval",
                  sc_of(r).get("status") == "pending_approval" and op, str(sc_of(r)))
            fake = other_id(op)
            async with raw_client() as h:
                def auth(k):
                    return {"Authorization": f"Bearer {k}"}
                a = (await h.get(f"{d.base}/approvals", headers=auth(ALICE))).json()
                check("approvals: alice lists hers", any(x.get("operation_id") == op for x in a),
                      str(a))
                b = await h.get(f"{d.base}/approvals", headers=auth(BOB))
                check("approvals: bob's list is empty", b.status_code == 200 and b.json() == [],
                      b.text[:300])
                for what, req in (
                    ("GET", lambda i: h.get(f"{d.base}/approvals/{i}", headers=auth(BOB))),
                    ("POST", lambda i: h.post(f"{d.base}/approvals/{i}", headers=auth(BOB),
                                              json={"decision": "approve"})),
                ):
                    x, y = await req(op), await req(fake)
                    check(f"approvals: bob's {what} /approvals/ALICES_ID is 404, as a never-issued id",
                          x.status_code == 404 and y.status_code == 404
                          and x.text.replace(op, fake) == y.text, f"{x.status_code} {x.text[:200]}"
                          f" vs {y.status_code} {y.text[:200]}")
            r = await bob.call_tool("approval_status", {"operation_id": op})
            n = await bob.call_tool("approval_status", {"operation_id": fake})
            check("approvals: bob's approval_status of alice's id is as a never-issued id",
                  r.is_error and text_of(r).replace(op, fake) == text_of(n) and "alice" not in text_of(r),
                  f"{text_of(r)!r} vs {text_of(n)!r}")
            r = await alice.call_tool("approval_status", {"operation_id": op})
            check("approvals: alice's approval_status shows it pending",
                  "pending" in json.dumps(sc_of(r)) + text_of(r), text_of(r)[:300])
    finally:
        rc = d.stop()
        check("approvals: SIGTERM exits 0", rc == 0, str(rc))


async def quotas(gearbox: str) -> None:
    """Per-tenant quotas: alice at max_running 1 / max_queued 1 / live_sessions 1, bob at
    runs_per_minute 3. Over a quota the SDK gets the JSON-RPC error (HTTP 429 + Retry-After)
    naming it; the other tenant is not held back; the quota resets."""
    d = Daemon(gearbox, TWO_KEYS, "--profile", "sessions", config=(
        '[concurrency]\nmax_running = 4\n[sessions]\ndir = "@TMP@/sessions"\n'
        "[quotas.tenants.alice]\nmax_running = 1\nmax_queued = 1\nlive_sessions = 1\n"
        "[quotas.tenants.bob]\nruns_per_minute = 3\n"))
    try:
        async with connect(d, ALICE) as alice, connect(d, BOB) as bob, \
                raw_client() as h:
            # Long enough that the probes run while one is running and one waits, even on a loaded machine.
            slow = {"language": "bash", "code": "sleep 6; echo slow"}

            async def probes():
                m = await metrics_until(d, 'gearbox_tenant_queued{tenant="alice"} 1')
                check("quotas: alice has one running, one waiting",
                      'gearbox_tenant_queued{tenant="alice"} 1' in m, m[-500:])
                try:
                    r = await alice.call_tool("execute_code", {"language": "bash", "code": "echo 3"})
                    check("quotas: alice's third call is refused (SDK)", False, text_of(r))
                except MCPError as e:
                    check("quotas: alice's third call is refused through the SDK naming max_queued",
                          "max_queued" in e.message and "alice" in e.message and "1 of 1" in e.message,
                          e.message)
                sid = await raw_session(h, d, ALICE)
                raw = await h.post(f"{d.base}/mcp", json={
                    "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                        "name": "execute_code", "arguments": {"language": "bash", "code": "echo 4"}}},
                    headers={"Authorization": f"Bearer {ALICE}", "mcp-session-id": sid,
                             "mcp-protocol-version": "2025-03-26",
                             "Accept": "application/json, text/event-stream"})
                retry = raw.headers.get("retry-after", "")
                try:
                    body = raw.json()
                except ValueError:
                    body = {}
                check("quotas: raw POST over the quota: 429, Retry-After >= 1 s, JSON-RPC error "
                      "with its id", raw.status_code == 429 and retry.isdigit() and int(retry) >= 1
                      and body.get("id") == 7 and "max_queued" in body.get("error", {}).get("message", ""),
                      f"{raw.status_code} {retry!r} {raw.text[:300]}")
                r = await bob.call_tool("execute_code", {"language": "bash", "code": "echo bob"})
                check("quotas: bob is not held back by alice's quota",
                      sc_of(r).get("stdout") == "bob\n", text_of(r)[:300])

            a, b, _ = await asyncio.gather(alice.call_tool("execute_code", slow),
                                           alice.call_tool("execute_code", slow), probes())
            check("quotas: alice's two accepted runs complete",
                  sc_of(a).get("stdout") == "slow\n" and sc_of(b).get("stdout") == "slow\n",
                  f"{text_of(a)[:200]} {text_of(b)[:200]}")
            r = await alice.call_tool("execute_code", {"language": "bash", "code": "echo again"})
            check("quotas: reset: alice runs again once hers ended",
                  sc_of(r).get("stdout") == "again\n", text_of(r)[:300])
            oks = [await bob.call_tool("execute_code", {"language": "bash", "code": "true"})
                   for _ in range(2)]
            check("quotas: bob's 2nd and 3rd runs of the minute go",
                  all(not r.is_error for r in oks), str([text_of(r)[:100] for r in oks]))
            try:
                r = await bob.call_tool("execute_code", {"language": "bash", "code": "true"})
                check("quotas: bob's 4th run of the minute is refused", False, text_of(r))
            except MCPError as e:
                check("quotas: bob's 4th run of the minute is refused naming runs_per_minute",
                      "runs_per_minute" in e.message and "3 of 3" in e.message, e.message)
            live = {"stateful": True, "language": "python"}
            r = await alice.call_tool("exec_open", live)
            first = sc_of(r).get("session_id", "")
            check("quotas: alice opens one live session", first and not r.is_error, text_of(r)[:300])
            r = await alice.call_tool("exec_open", live)
            check("quotas: alice's second live session is a tool error naming live_sessions",
                  r.is_error and "live_sessions" in text_of(r) and "1 of 1" in text_of(r),
                  text_of(r)[:300])
            r = await bob.call_tool("exec_open", live)
            check("quotas: bob opens his own live session", not r.is_error, text_of(r)[:300])
            await alice.call_tool("exec_close", {"session_id": first})
            r = await alice.call_tool("exec_open", live)
            check("quotas: reset: alice opens again after closing hers", not r.is_error,
                  text_of(r)[:300])
    finally:
        rc = d.stop()
        check("quotas: SIGTERM exits 0", rc == 0, str(rc))


async def capped(gearbox: str) -> None:
    """`[http.keys.bob] max_gear = "restricted"` on a full_trust daemon."""
    d = Daemon(gearbox, TWO_KEYS,
               config='gear = "full_trust"\n[http.keys.bob]\nmax_gear = "restricted"\n')
    try:
        async with connect(d, ALICE) as alice, connect(d, BOB) as bob:
            ask = {"language": "python", "code": "print('plain')", "gear": "full_trust"}
            r = await alice.call_tool("execute_code", ask)
            check("capped: alice asking full_trust runs at full_trust",
                  sc_of(r).get("status") == "ok"
                  and sc_of(r).get("policy", {}).get("gear") == "full_trust", str(sc_of(r))[:300])
            r = await bob.call_tool("execute_code", ask)
            check("capped: bob asking full_trust runs at restricted",
                  sc_of(r).get("status") == "ok"
                  and sc_of(r).get("policy", {}).get("gear") == "restricted", str(sc_of(r))[:300])
            r = await bob.call_tool("execute_code", {**ask, "network": True})
            check("capped: bob's network is denied by the restricted gear",
                  sc_of(r).get("status") == "denied"
                  and "restricted gear denies network" in text_of(r), text_of(r)[:300])
    finally:
        rc = d.stop()
        check("capped: SIGTERM exits 0", rc == 0, str(rc))


async def fairness(gearbox: str) -> None:
    """One run slot: alice floods it with 5 slow runs, then bob sends one; once bob waits, at
    most one more of alice's runs starts before his (by the start times the runs print)."""
    d = Daemon(gearbox, TWO_KEYS, config="[concurrency]\nmax_running = 1\nmax_queued = 64\n")
    try:
        async with connect(d, ALICE) as alice, connect(d, BOB) as bob:
            code = {"language": "python",
                    "code": "import time\nprint(time.time_ns())\ntime.sleep(1)\n"}

            async def single():
                await metrics_until(d, 'gearbox_tenant_queued{tenant="alice"} 4')

                async def seen():
                    m = await metrics_until(d, 'gearbox_tenant_queued{tenant="bob"} 1')
                    ok = 'gearbox_tenant_queued{tenant="bob"} 1' in m
                    for line in m.splitlines():
                        if line.startswith('gearbox_tenant_runs_total{tenant="alice"} '):
                            return ok, int(float(line.split()[-1]))
                    return ok, None

                return await asyncio.gather(bob.call_tool("execute_code", code), seen())

            flood, (mine, (waited, granted)) = await asyncio.gather(
                asyncio.gather(*[alice.call_tool("execute_code", code) for _ in range(5)]), single())

            def start(r):
                try:
                    return int(sc_of(r).get("stdout", "").strip())
                except ValueError:
                    return None

            starts = sorted(s for s in (start(r) for r in flood) if s is not None)
            b = start(mine)
            check("fairness: all six runs printed their start", len(starts) == 5 and b is not None,
                  f"{[text_of(r)[:100] for r in flood]} {text_of(mine)[:100]}")
            check("fairness: bob's call waited in the queue while alice's flood ran",
                  waited and granted is not None and granted < 5, f"{waited} {granted}")
            if b is not None and granted is not None:
                before = sum(1 for s in starts if s < b)
                check("fairness: at most one more of alice's runs starts before bob's",
                      before <= granted + 1,
                      f"{before} of alice's before bob, {granted} granted when he queued")
    finally:
        rc = d.stop()
        check("fairness: SIGTERM exits 0", rc == 0, str(rc))


class Issuer:
    """A local OAuth issuer on loopback: RFC 8414 metadata naming its JWKS, which the test
    can rotate. Its ES256 (P-256) keys are made in the test."""

    def __init__(self):
        self.jwks: list[dict] = []
        issuer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/.well-known/oauth-authorization-server":
                    body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks"}
                elif self.path == "/jwks":
                    body = {"keys": list(issuer.jwks)}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class IssuerKey:
    def __init__(self, kid: str):
        self.kid = kid
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.jwk = {**ECAlgorithm.to_jwk(self.key.public_key(), as_dict=True),
                    "kid": kid, "use": "sig", "alg": "ES256"}

    def mint(self, claims: dict) -> str:
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})


async def oauth(gearbox: str) -> None:
    """OAuth 2.1 resource server: tokens minted here by a local issuer."""
    aud = "http://gearbox.test/mcp"
    k1 = IssuerKey("k1")
    issuer = Issuer()
    issuer.jwks = [k1.jwk]
    d = Daemon(gearbox, TWO_KEYS, config=(
        f'gear = "full_trust"\n[http.oauth]\nissuer = "{issuer.url}"\naudience = "{aud}"\n'
        "jwks_refetch_secs = 0\n"))
    try:
        async with raw_client() as h:
            m = (await h.get(f"{d.base}/.well-known/oauth-protected-resource")).json()
            check("oauth: protected resource metadata names the audience and the issuer",
                  m.get("resource") == aud and m.get("authorization_servers") == [issuer.url]
                  and "gearbox:restricted" in m.get("scopes_supported", []), str(m))
            prm = "http://gearbox.test/.well-known/oauth-protected-resource/mcp"

            async def initialize(bearer: str | None):
                hdrs = {"Accept": "application/json, text/event-stream"}
                if bearer:
                    hdrs["Authorization"] = f"Bearer {bearer}"
                return await h.post(f"{d.base}/mcp", headers=hdrs, json={
                    "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                        "protocolVersion": "2025-03-26", "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "1"}}})

            r = await initialize(None)
            check("oauth: no token: 401 with the resource metadata URL",
                  r.status_code == 401 and r.headers.get("www-authenticate")
                  == f'Bearer resource_metadata="{prm}"', f"{r.status_code} {r.headers}")
            now = int(time.time())

            def claims(**over):
                c = {"iss": issuer.url, "aud": aud, "sub": "agent-7",
                     "scope": "openid gearbox:restricted", "iat": now, "exp": now + 600}
                c.update(over)
                return c

            token = k1.mint(claims())
            async with connect(d, token) as s:
                r = await s.call_tool("execute_code", {"language": "python",
                                                       "code": "print('token ok')", "gear": "full_trust"})
                check("oauth: a valid token works through the SDK, at its scope's gear (restricted)",
                      sc_of(r).get("stdout") == "token ok\n"
                      and sc_of(r).get("policy", {}).get("gear") == "restricted", str(sc_of(r))[:300])
            for what, bad, needle in (
                ("expired", k1.mint(claims(exp=now - 3600, iat=now - 7200)), "expired"),
                ("wrong audience", k1.mint(claims(aud="http://elsewhere.test/mcp")), "aud"),
                ("wrong issuer", k1.mint(claims(iss="http://impostor.test")), "iss"),
                ("unknown key", IssuerKey("rogue").mint(claims()), "not in the issuer's key set"),
            ):
                r = await initialize(bad)
                ch = r.headers.get("www-authenticate", "")
                check(f"oauth: {what} token: 401 invalid_token with resource_metadata",
                      r.status_code == 401 and ch.startswith(f'Bearer resource_metadata="{prm}"')
                      and 'error="invalid_token"' in ch and needle in r.text,
                      f"{r.status_code} {ch} {r.text[:200]}")
            r = await initialize(k1.mint(claims(scope="openid profile")))
            ch = r.headers.get("www-authenticate", "")
            check("oauth: no gearbox scope: 403 insufficient_scope",
                  r.status_code == 403 and 'error="insufficient_scope"' in ch and "gearbox:" in r.text,
                  f"{r.status_code} {ch} {r.text[:200]}")
            # Rotation: the issuer switches to a new key after the server cached k1's set.
            k2 = IssuerKey("k2")
            issuer.jwks = [k2.jwk]
            rotated = k2.mint(claims(sub="agent-8", scope="gearbox:full_trust"))
            r = await initialize(rotated)
            check("oauth: rotated key: a token signed by the new key is accepted",
                  r.status_code == 200, f"{r.status_code} {r.text[:200]}")
            async with connect(d, rotated) as s:
                r = await s.call_tool("execute_code", {"language": "python", "code": "print(2)"})
                check("oauth: the rotated key's token through the SDK, at full_trust",
                      sc_of(r).get("stdout") == "2\n"
                      and sc_of(r).get("policy", {}).get("gear") == "full_trust", str(sc_of(r))[:300])
            r = await initialize(ALICE)
            check("oauth: API keys keep working beside tokens", r.status_code == 200, r.text[:200])
        audit = d.audit.read_text() if d.audit.exists() else ""
        check("oauth: the audit names the token's subject as tenant, never the token",
              '"agent-7"' in audit and token not in audit, audit[-300:])
    finally:
        rc = d.stop()
        check("oauth: SIGTERM exits 0", rc == 0, str(rc))
        issuer.stop()


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
    for group in (live_over_http, issue21_over_http, tenants, approvals, quotas, capped, fairness,
                  oauth):
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
