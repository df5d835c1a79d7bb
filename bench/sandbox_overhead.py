#!/usr/bin/env python3
"""Cost of a fresh gearbox sandbox per run, against the bare interpreter, in one run.

    /usr/bin/python3 bench/sandbox_overhead.py [--gearbox target/release/gearbox] [-n 50]

For Python `print(1)`, Node `console.log(1)` and Bash `echo 1`: median and p90 wall time of
the bare interpreter started as a subprocess, and of `gearbox run` (linux backend) running
the same program, plus the difference and the ratio. Bare and sandboxed runs are interleaved
so machine noise hits both alike. Also prints the helper's own set-up time (`setup_us`).
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = [
    ("python", ["/usr/bin/python3", "-c", "print(1)"], "main.py", "print(1)\n"),
    ("javascript", ["/usr/bin/node", "-e", "console.log(1)"], "main.js", "console.log(1)\n"),
    ("bash", ["/usr/bin/bash", "-c", "echo 1"], "main.sh", "echo 1\n"),
]


def timed(cmd, env=None):
    t = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    dt = (time.perf_counter() - t) * 1000
    return dt, out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default=str(ROOT / "target" / "release" / "gearbox"))
    ap.add_argument("-n", type=int, default=50)
    a = ap.parse_args()
    clean_env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for lang, bare, fname, code in CASES:
            src = Path(d) / fname
            src.write_text(code)
            gb = [a.gearbox, "run", "--json", str(src)]
            # warm-up: page cache, interpreter files
            for _ in range(3):
                timed(bare, clean_env)
                timed(gb)
            b, g, setup = [], [], []
            for _ in range(a.n):
                b.append(timed(bare, clean_env)[0])
                dt, out = timed(gb)
                o = json.loads(out.stdout)
                assert o["status"] == "ok" and o["stdout"] == "1\n", o
                g.append(dt)
                setup.append(o["setup_us"] / 1000)
            rows.append((lang, b, g, setup))
    print(f"gearbox run vs bare interpreter, {a.n} runs each, interleaved (ms)")
    print(f"{'language':<11} {'bare med':>9} {'bare p90':>9} {'gearbox med':>12} {'gearbox p90':>12} {'added med':>10} {'ratio':>6} {'setup med':>10}")
    for lang, b, g, s in rows:
        bm, gm = statistics.median(b), statistics.median(g)
        print(f"{lang:<11} {bm:9.1f} {pct(b, 90):9.1f} {gm:12.1f} {pct(g, 90):12.1f} {gm - bm:10.1f} {gm / bm:6.2f} {statistics.median(s):10.1f}")


if __name__ == "__main__":
    main()
