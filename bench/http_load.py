#!/usr/bin/env python3
"""Load benchmark of `gearbox serve --http`: throughput and latency of `execute_code`
`print(1)` at 1, 2, 4 and 8 concurrent clients, beside bare `/usr/bin/python3 -c 'print(1)'`
spawned at the same concurrency. Loopback only; each level is bounded by a call count and a
time limit. Standard library only.

    cargo build --release && /usr/bin/python3 bench/http_load.py [-n 200] [-t 20]

Each client is one MCP session (Streamable HTTP, keep-alive connection, raw JSON-RPC over
http.client). The server runs with its defaults (max_running = number of cores) unless
--max-running is given.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "bench-key-0123456789abcdef"
LEVELS = [1, 2, 4, 8]


def start_server(gearbox: str, max_running: int | None, tmp: str) -> tuple[subprocess.Popen, str]:
    cfg = Path(tmp) / "gearbox.toml"
    cfg.write_text(f"[concurrency]\nmax_running = {max_running}\n" if max_running else "")
    env = {k: v for k, v in os.environ.items() if k != "PORT"}
    env["GEARBOX_API_KEYS"] = f"bench:{KEY}"
    proc = subprocess.Popen(
        [gearbox, "--config", str(cfg), "serve", "--http", "127.0.0.1:0",
         "--audit-log", str(Path(tmp) / "audit.jsonl")],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        m = re.search(r"listening on http://([\d.]+):(\d+)/mcp", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, f"{m.group(1)}:{m.group(2)}"
        if not line:
            break
    proc.kill()
    raise SystemExit("gearbox serve --http did not start")


class Session:
    """One MCP session over one keep-alive HTTP connection."""

    def __init__(self, addr: str):
        host, port = addr.split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.sid: str | None = None
        self.next_id = 1
        r = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}}})
        assert "result" in r, r
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, msg: dict) -> dict:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {KEY}",
            "MCP-Protocol-Version": "2025-03-26",
        }
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
        self.conn.request("POST", "/mcp", body=json.dumps(msg), headers=headers)
        resp = self.conn.getresponse()
        body = resp.read().decode()
        if resp.getheader("mcp-session-id"):
            self.sid = resp.getheader("mcp-session-id")
        if resp.status == 202:
            return {}
        if resp.status != 200:
            return {"http_status": resp.status, "body": body}
        for line in body.splitlines():
            if line.startswith("data:") and line[5:].strip().startswith("{"):
                return json.loads(line[5:])
        return json.loads(body) if body.strip().startswith("{") else {}

    def execute(self) -> bool:
        self.next_id += 1
        r = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call", "params": {
            "name": "execute_code",
            "arguments": {"language": "python", "code": "print(1)"}}})
        sc = (r.get("result") or {}).get("structuredContent") or {}
        return sc.get("stdout") == "1\n"


def run_level(make_worker, clients: int, count: int, limit_s: float) -> dict:
    """`clients` threads share `count` calls, stopping at `limit_s`."""
    lock = threading.Lock()
    left = [count]
    lat: list[float] = []
    errors = [0]
    deadline = time.monotonic() + limit_s

    def worker():
        call = make_worker()
        while True:
            with lock:
                if left[0] <= 0 or time.monotonic() > deadline:
                    return
                left[0] -= 1
            t = time.perf_counter()
            ok = call()
            dt = time.perf_counter() - t
            with lock:
                lat.append(dt)
                if not ok:
                    errors[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    lat.sort()
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")
    return {"n": len(lat), "rps": len(lat) / wall if wall else 0, "p50": p(0.50),
            "p99": p(0.99), "errors": errors[0]}


def bare_worker():
    def call() -> bool:
        r = subprocess.run(["/usr/bin/python3", "-c", "print(1)"], capture_output=True)
        return r.stdout == b"1\n"
    return call


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=200, help="calls per level (default 200)")
    ap.add_argument("-t", type=float, default=20.0, help="seconds per level at most (default 20)")
    ap.add_argument("--gearbox", default=None, help="binary (default: release, else debug)")
    ap.add_argument("--max-running", type=int, default=None,
                    help="[concurrency] max_running for the server (default: cores)")
    o = ap.parse_args()
    gearbox = o.gearbox or next(
        (str(p) for p in (ROOT / "target/release/gearbox", ROOT / "target/debug/gearbox") if p.exists()),
        None)
    if not gearbox:
        raise SystemExit("build gearbox first (cargo build --release)")
    with tempfile.TemporaryDirectory(prefix="gearbox-bench-") as tmp:
        proc, addr = start_server(gearbox, o.max_running, tmp)
        try:
            Session(addr).execute()  # warm up: language resolution, page cache
            rows = []
            for c in LEVELS:
                g = run_level(lambda: Session(addr).execute, c, o.n, o.t)
                b = run_level(bare_worker, c, o.n, o.t)
                rows.append((c, g, b))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
    print(f"gearbox: {gearbox}; cores: {os.cpu_count()}; max_running: "
          f"{o.max_running or 'default (cores)'}; {o.n} calls or {o.t:.0f} s per level")
    print()
    print("| clients | MCP execute_code calls/s | p50 ms | p99 ms | errors | bare python3 -c runs/s | p50 ms | p99 ms | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, g, b in rows:
        ratio = b["rps"] / g["rps"] if g["rps"] else float("nan")
        print(f"| {c} | {g['rps']:.1f} (n={g['n']}) | {g['p50']:.1f} | {g['p99']:.1f} | {g['errors']} "
              f"| {b['rps']:.1f} (n={b['n']}) | {b['p50']:.1f} | {b['p99']:.1f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
