#!/usr/bin/env python3
"""QuickJS-in-wasm calls through `gearbox serve`, builds interleaved (A, B, A, B, ...):
p50 round trip and the server process's own CPU per call.

    /usr/bin/python3 bench/quickjs_calls.py --gearbox old/gearbox --gearbox new/gearbox [-n 1500] [--rounds 5]

Each round starts `gearbox serve` over stdio, initializes, makes n sequential `execute_code`
calls of `console.log("<i>")` with `backend: "wasm"` (each answer checked against its own
call), and reads the server's user + system time from /proc (its threads included, its
children not: the wasm backend runs in the server). A warm-up server per build first, so
that each build's compiled module is in the cache. Standard library only.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from warm_pool import Lines  # noqa: E402


def one(gearbox, n):
    server = Lines(gearbox)
    time.sleep(1.0)

    def cpu_ms():
        st = open(f"/proc/{server.p.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(st[11]) + int(st[12])) * 1000 / os.sysconf("SC_CLK_TCK")

    cpu0, times = cpu_ms(), []
    for i in range(n):
        t = time.perf_counter()
        sc = server.execute({"language": "javascript", "backend": "wasm",
                             "code": f'console.log("{i}")'})
        times.append((time.perf_counter() - t) * 1000)
        if sc.get("stdout") != f"{i}\n":
            raise SystemExit(f"{gearbox}: call {i} answered {sc}")
    cpu = (cpu_ms() - cpu0) / n
    server.close()
    return statistics.median(times), cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", action="append", required=True)
    ap.add_argument("-n", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    for g in args.gearbox:
        one(g, 20)
    res = {g: [] for g in args.gearbox}
    for _ in range(args.rounds):
        for g in args.gearbox:
            res[g].append(one(g, args.n))
    print(f"load {os.getloadavg()[0]:.2f}; n = {args.n} calls per round\n")
    print("| build | p50 ms (median of rounds) | server CPU per call ms | rounds (p50/CPU) |")
    print("|---|---|---|---|")
    for g, rs in res.items():
        p50 = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        rounds = " ".join(f"{a:.2f}/{b:.2f}" for a, b in rs)
        print(f"| {g} | {p50:.3f} | {cpu:.3f} | {rounds} |")


if __name__ == "__main__":
    main()
