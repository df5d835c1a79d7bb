"""Launch -> first `execute_code` result of `gearbox serve` over stdio, with the default warm
pool and without one, rounds interleaved (issue 23: what filling the pool at start costs a call
made at once after launch).

    cargo build --release --locked -p gearbox
    .venv/bin/python bench/cold_start.py [--gearbox PATH] [--rounds 7]

Each round launches the server through the official MCP Python SDK, initializes, makes one
Python `print(1)` call, checks its answer and closes. Prints the median and range per
configuration and the first call's `setup_us` (hundreds of µs: served warm).
"""

import argparse
import asyncio
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


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gearbox", default=str(ROOT / "target/release/gearbox"))
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        nopool = Path(d) / "nopool.toml"
        nopool.write_text("pool = {}\n")
        configs = {"default pool": ["serve"], "pool = {}": ["--config", str(nopool), "serve"]}
        got: dict[str, list[tuple[float, int]]] = {k: [] for k in configs}
        for _ in range(a.rounds):
            for name, args in configs.items():
                got[name].append(await first_call(a.gearbox, args))
    print("| configuration | median ms | min–max ms | first call's setup_us (median) |")
    print("|---|---|---|---|")
    for name, rows in got.items():
        ms = [r[0] for r in rows]
        print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f}–{max(ms):.1f} | "
              f"{statistics.median(r[1] for r in rows):.0f} |")


asyncio.run(main())
