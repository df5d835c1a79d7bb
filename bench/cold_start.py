"""Launch -> first `execute_code` result of `gearbox serve` over stdio, with the default warm
pool and without one, rounds interleaved (issue 23: what filling the pool at start costs a call
made at once after launch).

    cargo build --release --locked -p gearbox
    .venv/bin/python bench/cold_start.py [--gearbox PATH ...] [--rounds 7]

Given `--gearbox` more than once, the builds alternate within each round too (an A/B of two
builds in the same minutes), each row labelled with its build's directory.

Each round launches the server through the official MCP Python SDK, initializes, makes one
Python `print(1)` call, checks its answer and closes; then the same with a bare JSON-lines
client (initialize, tools/list, the call: what the SDK sends, without its own work). Prints
the median and range per configuration and client, and the first call's `setup_us`.

The two clients differ by what the SDK does on its side before it hands the first result
over: it compiles a validator for the tool's output schema once per session (jsonschema's
`check_schema` of gearbox's 2020-12 schema, ~25 ms here; see docs/PERFORMANCE.md).
"""

import argparse
import asyncio
import json
import subprocess
import statistics
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[1]


async def first_call(gearbox: str, args: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    params = StdioServerParameters(command=gearbox, args=args)
    async with stdio_client(params) as (r, w):
        async with ClientSession(r, w) as s:
            await asyncio.wait_for(s.initialize(), 60)
            res = await asyncio.wait_for(
                s.call_tool("execute_code", {"language": "python", "code": "print(1)"}), 60)
            ms = (time.perf_counter() - t) * 1000
            sc = res.structured_content or {}
            if res.is_error or sc.get("stdout") != "1\n":
                raise SystemExit(f"wrong first answer: {sc or res.content}")
            return ms, int(sc.get("setup_us") or 0)


STEPS: dict[str, list[list[float]]] = {}


def raw_first_call(gearbox: str, args: list[str], check: bool = True,
                   steps: list[list[float]] | None = None) -> tuple[float, int]:
    """Launch -> first result over bare JSON lines (initialize, tools/list, the call, as the
    SDK sends them); `check`: the answer must be Python's `1` (not for a server that runs
    nothing). `steps`: gets the ms of each step (launch -> initialize answered, tools/list,
    the call) appended."""
    t = time.perf_counter()
    marks = [t]
    p = subprocess.Popen([gearbox, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    try:
        def ask(msg: dict) -> dict:
            p.stdin.write((json.dumps(msg) + "\n").encode())
            p.stdin.flush()
            while True:
                answer = json.loads(p.stdout.readline())
                if answer.get("id") == msg.get("id"):
                    return answer
        ask({"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "cold-start", "version": "0"}}})
        marks.append(time.perf_counter())
        p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        ask({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
        marks.append(time.perf_counter())
        r = ask({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                 "params": {"name": "execute_code",
                            "arguments": {"language": "python", "code": "print(1)"}}})
        marks.append(time.perf_counter())
        ms = (marks[-1] - t) * 1000
        if steps is not None:
            steps.append([(b - a) * 1000 for a, b in zip(marks, marks[1:])])
        sc = r["result"].get("structuredContent") or {}
        if check and sc.get("stdout") != "1\n":
            raise SystemExit(f"wrong first answer: {r}")
        return ms, int(sc.get("setup_us") or 0)
    finally:
        p.stdin.close()
        p.wait(timeout=30)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gearbox", action="append",
                    help="the binary (repeat to compare builds); default target/release/gearbox")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        nopool = Path(d) / "nopool.toml"
        nopool.write_text("pool = {}\n")
        configs = {"default pool": ["serve"], "pool = {}": ["--config", str(nopool), "serve"]}
        builds = a.gearbox or [str(ROOT / "target/release/gearbox")]
        label = (lambda b: f"{Path(b).parent.name}: ") if len(builds) > 1 else (lambda b: "")
        got: dict[str, list[tuple[float, int]]] = {}
        for _ in range(a.rounds):
            for name, args in configs.items():
                for b in builds:
                    got.setdefault(f"{label(b)}{name}, SDK client", []).append(
                        await first_call(b, args))
                    got.setdefault(f"{label(b)}{name}, JSON-lines client", []).append(
                        raw_first_call(b, args,
                                       steps=STEPS.setdefault(f"{label(b)}{name}", [])))
    print("| configuration, client | median ms | min–max ms | first call's setup_us (median) |")
    print("|---|---|---|---|")
    for name, rows in got.items():
        ms = [r[0] for r in rows]
        print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f}–{max(ms):.1f} | "
              f"{statistics.median(r[1] for r in rows):.0f} |")
    print()
    print("JSON-lines client, each step (median ms):")
    print()
    print("| configuration | launch -> initialize answered | tools/list | the first call |")
    print("|---|---|---|---|")
    for name, rows in STEPS.items():
        print(f"| {name} | " + " | ".join(
            f"{statistics.median(r[i] for r in rows):.1f}" for i in range(3)) + " |")


if __name__ == "__main__":
    asyncio.run(main())
