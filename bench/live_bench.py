#!/usr/bin/env python3
"""What a live session costs and saves, in one run: `gearbox serve --profile sessions` over
stdio (gear full_trust), the same client for every figure.

    /usr/bin/python3 bench/live_bench.py [--gearbox target/release/gearbox] [-n 50] [--numpy]

1. Opening a live Python session (`exec_open` stateful), median and p90.
2. A cell on a live session vs a fresh `execute_code` (warm pool), interleaved:
   `print(1)`; a pure-Python sum of squares to 10^6; with `--numpy` (installed into a layer
   at open, and for execute_code with `packages`), a 10^6-element numpy sum where the live
   session imported numpy once and the fresh run imports it every time.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from warm_pool import Rpc  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default="target/release/gearbox")
    ap.add_argument("-n", type=int, default=50)
    ap.add_argument("--numpy", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gearbox-live-bench-", dir="/var/tmp"))
    tmp.chmod(0o755)  # the sandbox user walks down to the package layers
    (tmp / "c.toml").write_text(
        'gear = "full_trust"\nprofiles = ["sessions"]\n'
        f'[sessions]\ndir = "{tmp}/sessions"\nlive_max = 8\n'
        f'[packages]\ncache_dir = "{tmp}/packages"\ninstall_timeout_ms = 300000\n')
    rpc = Rpc(a.gearbox, str(tmp / "c.toml"))

    def call(name, args):
        t = time.perf_counter()
        r = rpc.request("tools/call", {"name": name, "arguments": args})
        return (time.perf_counter() - t) * 1000, r["structuredContent"]

    try:
        opens = []
        for _ in range(min(a.n, 20)):
            ms, sc = call("exec_open", {"stateful": True, "language": "python"})
            opens.append(ms)
            call("exec_close", {"session_id": sc["session_id"]})
        print(f"## opening a live Python session (n={len(opens)})\n")
        print(f"median {statistics.median(opens):.1f} ms, p90 {pct(opens, 90):.1f} ms\n")

        extra = {"packages": ["numpy"]} if a.numpy else {}
        _, sc = call("exec_open", {"stateful": True, "language": "python", **extra})
        sid = sc["session_id"]
        cases = [("print(1)", "print(1)", "print(1)"),
                 ("sum of squares to 10^6", "sum(i * i for i in range(10**6))",
                  "print(sum(i * i for i in range(10**6)))")]
        if a.numpy:
            _, sc = call("exec_run", {"session_id": sid, "language": "python",
                                      "code": "import numpy as np\na = np.arange(10**6)"})
            assert sc["status"] == "ok", sc
            cases.append(("numpy sum of 10^6", "int(a.sum())",
                          "import numpy as np\nprint(int(np.arange(10**6).sum()))"))
        print(f"## a cell vs a fresh execute_code (warm), n={a.n}, ms\n")
        print("| code | live cell median | p90 | fresh run median | p90 | fresh / live |")
        print("|---|---|---|---|---|---|")
        for name, cell, fresh in cases:
            live, cold = [], []
            for _ in range(a.n):
                ms, sc = call("exec_run", {"session_id": sid, "language": "python", "code": cell})
                assert sc["status"] == "ok", sc
                live.append(ms)
                args = {"language": "python", "code": fresh}
                if a.numpy and "numpy" in fresh:
                    args["packages"] = ["numpy"]
                ms, sc = call("execute_code", args)
                assert sc["status"] == "ok", sc
                cold.append(ms)
            lm, cm = statistics.median(live), statistics.median(cold)
            print(f"| {name} | {lm:.1f} | {pct(live, 90):.1f} | {cm:.1f} | {pct(cold, 90):.1f} | {cm / lm:.2f}x |")
        call("exec_close", {"session_id": sid})
    finally:
        rpc.close()
        os.system(f"rm -rf {tmp}")


if __name__ == "__main__":
    main()
