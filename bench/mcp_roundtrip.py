"""MCP round trip of `execute_code` `print(1)` over stdio against bare `python3 -c 'print(1)'`.

    cargo build --release
    /usr/bin/python3 bench/mcp_roundtrip.py [--gearbox target/release/gearbox] [-n 200]

The client is a minimal JSON-lines client (no SDK overhead on the client side), calls are
sequential. For each call the sandbox's own time (set-up plus program run, from the outcome)
is subtracted from the round trip: what is left is what the MCP layer, the engine, the
helper's spawn and the pipes add (duration_ms is whole milliseconds, so +-0.5 ms). A call
refused before any sandbox exists measures the protocol layer alone. The official SDK's client is measured too when `.venv` has it (scripts/setup-e2e.sh).
Only standard library; Debian's /usr/bin/python3, never a pyenv shim.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = "/usr/bin/python3"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, round(p / 100 * (len(xs) - 1))))
    return xs[k]


def bare(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([PYTHON, "-c", "print(1)"], stdout=subprocess.DEVNULL, check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


class Rpc:
    def __init__(self, gearbox: str):
        self.p = subprocess.Popen(
            [gearbox, "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        # Buffered: the pipe itself is unbuffered (bufsize=0, for the writes), and an
        # unbuffered readline reads one byte per system call.
        self.out = io.BufferedReader(self.p.stdout, 1 << 16)
        self.next_id = 0
        self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"},
            },
        )
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg: dict) -> None:
        self.p.stdin.write((json.dumps(msg) + "\n").encode())

    def request(self, method: str, params: dict) -> dict:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.out.readline()
            if not line:
                raise RuntimeError("gearbox closed stdout")
            msg = json.loads(line)
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=10)


def mcp_raw(gearbox: str, n: int) -> tuple[list[float], list[float], list[float]]:
    rpc = Rpc(gearbox)
    args = {"name": "execute_code", "arguments": {"language": "python", "code": "print(1)"}}
    for _ in range(5):  # warm-up: language resolution, page cache
        rpc.request("tools/call", args)
    rtt, overhead = [], []
    for _ in range(n):
        t = time.perf_counter()
        r = rpc.request("tools/call", args)
        ms = (time.perf_counter() - t) * 1000
        sc = r["structuredContent"]
        if sc["status"] != "ok" or sc["stdout"] != "1\n":
            raise RuntimeError(f"bad result: {sc}")
        sandbox_ms = (sc.get("setup_us") or 0) / 1000 + sc["duration_ms"]
        rtt.append(ms)
        overhead.append(ms - sandbox_ms)
    # The protocol alone: a call refused before any sandbox exists (unknown language).
    refused = {"name": "execute_code", "arguments": {"language": "none", "code": "print(1)"}}
    proto = []
    for _ in range(n):
        t = time.perf_counter()
        r = rpc.request("tools/call", refused)
        proto.append((time.perf_counter() - t) * 1000)
        if not r.get("isError"):
            raise RuntimeError(f"expected a refusal: {r}")
    rpc.close()
    return rtt, overhead, proto


def mcp_sdk(gearbox: str, n: int) -> list[float] | None:
    venv_py = ROOT / ".venv" / "bin" / "python"
    if not venv_py.exists():
        return None
    code = r"""
import asyncio, json, sys, time
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
async def main():
    params = StdioServerParameters(command=sys.argv[1], args=["serve"])
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        args = {"language": "python", "code": "print(1)"}
        for _ in range(5):
            await s.call_tool("execute_code", args)
        out = []
        for _ in range(int(sys.argv[2])):
            t = time.perf_counter()
            res = await s.call_tool("execute_code", args)
            out.append((time.perf_counter() - t) * 1000)
            assert not res.is_error, res
        print(json.dumps(out))
asyncio.run(main())
"""
    p = subprocess.run(
        [str(venv_py), "-c", code, gearbox, str(n)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    default = ROOT / "target" / "release" / "gearbox"
    if not default.exists():
        default = ROOT / "target" / "debug" / "gearbox"
    ap.add_argument("--gearbox", default=str(default))
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--no-sdk", action="store_true")
    opts = ap.parse_args()
    if opts.n < 1:
        ap.error("-n must be positive")

    bare_ms = bare(opts.n)
    rtt, overhead, proto = mcp_raw(opts.gearbox, opts.n)
    sdk = None if opts.no_sdk else mcp_sdk(opts.gearbox, opts.n)

    print(f"gearbox: {opts.gearbox}; {opts.n} sequential calls each; {os.cpu_count()} cores")
    print()
    print("| what | median ms | p90 ms |")
    print("|---|---|---|")
    print(f"| bare `{PYTHON} -c 'print(1)'` | {statistics.median(bare_ms):.2f} | {pct(bare_ms, 90):.2f} |")
    print(f"| MCP `execute_code` print(1), JSON-lines client | {statistics.median(rtt):.2f} | {pct(rtt, 90):.2f} |")
    if sdk:
        print(f"| MCP `execute_code` print(1), official Python SDK client | {statistics.median(sdk):.2f} | {pct(sdk, 90):.2f} |")
    print(
        f"| round trip minus the sandbox's own time (set-up + run) | "
        f"{statistics.median(overhead):.2f} | {pct(overhead, 90):.2f} |"
    )
    print(
        f"| MCP tools/call refused before any sandbox (the protocol layer alone) | "
        f"{statistics.median(proto):.3f} | {pct(proto, 90):.3f} |"
    )
    print()
    print(f"ratio MCP round trip / bare python (medians): {statistics.median(rtt) / statistics.median(bare_ms):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
