"""Code mode, measured: what a model reads to use the everything server's tools, and the
latency of one brokered tool call made by sandboxed Python.

    scripts/setup.sh    # tests/npm (the reference servers) and .venv (the MCP Python SDK)
    .venv/bin/python bench/broker_bench.py [--gearbox target/release/gearbox] [--calls 200]

Tokens are estimated as characters / 4 (no tokenizer ships with this repository); the
characters are exactly what the client receives: the JSON of tools/list, or the text of the
discovery tools' results.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = Path(__file__).resolve().parents[1]
NPM = ROOT / "tests/npm/node_modules/@modelcontextprotocol"


def tokens(chars: int) -> int:
    return (chars + 3) // 4


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def tools_json(tools) -> str:
    return json.dumps(
        {"tools": [t.model_dump(by_alias=True, exclude_none=True) for t in tools]},
        separators=(",", ":"),
    )


async def plain_everything() -> str:
    """tools/list of the everything server, asked directly."""
    params = StdioServerParameters(
        command="node", args=[str(NPM / "server-everything/dist/index.js"), "stdio"]
    )
    async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        return tools_json((await s.list_tools()).tools)


SNIPPET = """
import gearbox, time, json
lat = []
for i in range({n}):
    t = time.perf_counter()
    gearbox.call_tool("everything", "echo", {{"message": "m%d" % i}})
    lat.append((time.perf_counter() - t) * 1000)
print(json.dumps(lat))
"""


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default=str(ROOT / "target/release/gearbox"))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()

    plain = await plain_everything()
    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d) / "gearbox.toml"
        cfg.write_text(
            "[[targets]]\nname = \"everything\"\ncommand = \"node\"\n"
            f"args = [{json.dumps(str(NPM / 'server-everything/dist/index.js'))}, \"stdio\"]\n"
        )
        params = StdioServerParameters(
            command=args.gearbox,
            args=["--config", str(cfg), "serve", "--profile", "default", "--profile", "broker"],
            env=dict(os.environ),
        )
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            own = tools_json((await s.list_tools()).tools)
            servers = text_of(await s.call_tool("servers_list", {}))
            listing = text_of(
                await s.call_tool("server_tools_list", {"server": "everything"})
            )
            info = text_of(
                await s.call_tool("tool_info", {"server": "everything", "tool": "get-sum"})
            )
            stubs = text_of(await s.call_tool("tool_stubs", {"server": "everything"}))

            rows = [
                ("everything's tools/list JSON (plain MCP)", len(plain)),
                ("gearbox tools/list (execute_code + 4 discovery tools)", len(own)),
                ("servers_list result", len(servers)),
                ("server_tools_list everything", len(listing)),
                ("tool_info everything/get-sum", len(info)),
                ("tool_stubs everything (python, all tools)", len(stubs)),
            ]
            print("| what the model reads | characters | tokens (chars/4) |")
            print("|---|---:|---:|")
            for name, n in rows:
                print(f"| {name} | {n} | {tokens(n)} |")
            targeted = len(servers) + len(listing) + len(info)
            full = len(servers) + len(listing) + len(stubs)
            print(f"| discovery, one tool: servers_list + server_tools_list + tool_info | {targeted} | {tokens(targeted)} |")
            print(f"| discovery + every stub: servers_list + server_tools_list + tool_stubs | {full} | {tokens(full)} |")
            print()

            # Latency: per call inside one run, and the cost a channel adds to a run.
            lat: list[float] = []
            for _ in range(args.runs):
                res = await s.call_tool(
                    "execute_code",
                    {"language": "python", "code": SNIPPET.format(n=args.calls),
                     "allow_tools": ["everything/echo"], "max_calls": args.calls},
                )
                out = res.structured_content or {}
                if out.get("status") != "ok":
                    raise SystemExit(f"run failed: {text_of(res)}")
                lat.extend(json.loads(out["stdout"]))
            lat.sort()
            first = [
                (await s.call_tool(
                    "execute_code",
                    {"language": "python",
                     "code": "import gearbox\ngearbox.call_tool('everything','echo',{'message':'x'})",
                     "allow_tools": ["everything/echo"]},
                ))
                for _ in range(1)
            ]
            del first

            async def wall(extra: dict) -> float:
                t = time.perf_counter()
                await s.call_tool("execute_code", {"language": "python", "code": "pass", **extra})
                return (time.perf_counter() - t) * 1000

            plain_runs = sorted([await wall({}) for _ in range(args.runs * 2)])
            chan_runs = sorted([await wall({"allow_tools": ["everything/echo"]}) for _ in range(args.runs * 2)])

            def pct(xs: list[float], p: float) -> float:
                return xs[min(len(xs) - 1, int(p * len(xs)))]

            print("| measure | n | p50 ms | p95 ms | mean ms |")
            print("|---|---:|---:|---:|---:|")
            print(f"| one brokered call (sandboxed Python → everything/echo) | {len(lat)} | "
                  f"{pct(lat, 0.5):.2f} | {pct(lat, 0.95):.2f} | {statistics.mean(lat):.2f} |")
            print(f"| execute_code `pass`, no allow_tools | {len(plain_runs)} | "
                  f"{pct(plain_runs, 0.5):.1f} | {pct(plain_runs, 0.95):.1f} | {statistics.mean(plain_runs):.1f} |")
            print(f"| execute_code `pass`, allow_tools (channel + stubs) | {len(chan_runs)} | "
                  f"{pct(chan_runs, 0.5):.1f} | {pct(chan_runs, 0.95):.1f} | {statistics.mean(chan_runs):.1f} |")


if __name__ == "__main__":
    asyncio.run(main())
