#!/usr/bin/env python3
"""Cold `gearbox run` against the bare interpreter, several gearbox builds or installs
interleaved in one run (A/B): wall time of the whole command, median and p90.

    /usr/bin/python3 bench/cold_run.py [--gearbox PATH ...] [--language python] [-n 40]

Each `--gearbox` is a path to a gearbox binary (default target/release/gearbox). The helper
each one starts is the one the engine picks: `gearbox-jail` beside it when there is one,
else `gearbox __jail`. To measure the lean helper against the whole binary in one build,
give a directory holding only a link to gearbox as well:

    mkdir -p /tmp/alone && ln -sf $PWD/target/release/gearbox /tmp/alone/gearbox
    /usr/bin/python3 bench/cold_run.py --gearbox target/release/gearbox --gearbox /tmp/alone/gearbox

Bare and gearbox runs alternate, in a fresh random order every round (no build always
follows another, or the bare interpreter), so machine noise hits all of them alike; the ratio
is each median over the bare interpreter's median in the same run. Compare copies made at
the same time (`cp` both builds into fresh directories just before): a copy of one build made
an hour earlier measured 1 ms slower than a fresh copy of the same file, in the same run.
"""
import argparse
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

CASES = {
    "python": (["/usr/bin/python3", "-c", "print(1)"], "main.py", "print(1)\n"),
    "javascript": (["/usr/bin/node", "-e", "console.log(1)"], "main.js", "console.log(1)\n"),
    "bash": (["/usr/bin/bash", "-c", "echo 1"], "main.sh", "echo 1\n"),
}


def timed(cmd):
    t = time.perf_counter()
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    dt = (time.perf_counter() - t) * 1000
    if out.returncode != 0 or out.stdout.strip() != b"1":
        raise SystemExit(f"{cmd}: exit {out.returncode}: {out.stdout!r} {out.stderr!r}")
    return dt


def p90(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.9 * (len(xs) - 1))))]


def main():
    root = Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", action="append")
    ap.add_argument("--language", default="python", choices=sorted(CASES))
    ap.add_argument("-n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    gearboxes = a.gearbox or [str(root / "target" / "release" / "gearbox")]
    bare, name, code = CASES[a.language]
    with tempfile.TemporaryDirectory() as d:
        prog = Path(d) / name
        prog.write_text(code)
        cmds = [("bare", bare)] + [(g, [g, "run", str(prog)]) for g in gearboxes]
        for _, c in cmds:  # warm the page cache
            timed(c)
        times = {label: [] for label, _ in cmds}
        for _ in range(a.n):
            for label, c in rng.sample(cmds, len(cmds)):
                times[label].append(timed(c))
    base = statistics.median(times["bare"])
    print(f"| {a.language} `print(1)`-like, n={a.n} | median ms | p90 ms | ratio to bare |")
    print("|---|---|---|---|")
    for label, xs in times.items():
        m = statistics.median(xs)
        print(f"| {label} | {m:.2f} | {p90(xs):.2f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
