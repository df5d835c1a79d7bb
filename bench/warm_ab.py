#!/usr/bin/env python3
"""A/B of warm runs: latency and machine CPU per run of one or more gearbox builds (or one
build under different environments), interleaved (each round in a random order) so that a noisy machine
disturbs both alike.

    /usr/bin/python3 bench/warm_ab.py --gearbox old/gearbox --gearbox new/gearbox [-n 300] [--rounds 3]
    /usr/bin/python3 bench/warm_ab.py --language bash \
        --gearbox 'GEARBOX_FORK_SERVER=0 target/release/gearbox' --gearbox target/release/gearbox

Each round starts `gearbox serve` with a pool of 2 for the language, lets it fill, makes n
sequential `execute_code` calls of `print(1)` (`echo 1`, `console.log(1)`), and reports the
median latency and the machine's busy CPU per call (from /proc/stat: every process, the
client, the pool's refills and the kernel's workers included). A `--gearbox` of the form
`KEY=VALUE ... PATH` runs that build with those variables set. Standard library only; as
root, so the fork servers are used. `--cold` measures cold calls instead (`pool = {}`: a
fresh helper, sandbox and interpreter per call). `--gap S` sleeps S seconds between calls,
as an agent's calls come (machine CPU then also counts what the pause lets finish).
"""
import argparse
import random
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from warm_pool import Rpc, busy_ms  # noqa: E402


CODE = {"python": "print(1)", "bash": "echo 1", "javascript": "console.log(1)"}


def measure(build, n, language, cold=False, gap=0.0):
    *assignments, gearbox = build.split()
    env = dict(os.environ, **dict(a.split("=", 1) for a in assignments))
    cfg = Path(tempfile.mkdtemp(prefix="gearbox-ab-")) / "warm.toml"
    cfg.write_text("pool = {}\n" if cold else f"[pool]\n{language} = 2\n")
    rpc = Rpc(gearbox, str(cfg), env)
    code = CODE[language]
    try:
        time.sleep(2)  # let the pool fill
        for _ in range(20):
            rpc.run(language, code)
        time.sleep(0.5)
        lat = []
        cpu0 = busy_ms()
        for _ in range(n):
            t = time.perf_counter()
            rpc.run(language, code)
            lat.append((time.perf_counter() - t) * 1000)
            if gap:
                time.sleep(gap)
        return statistics.median(lat), (busy_ms() - cpu0) / n
    finally:
        rpc.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", action="append", required=True, help="a build to measure (repeat)")
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--language", default="python", choices=sorted(CODE))
    ap.add_argument("--cold", action="store_true", help="no pool: every call starts cold")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="seconds between calls (an agent's calls come spaced; 0: back to back)")
    a = ap.parse_args()
    results = {g: [] for g in a.gearbox}
    rng = random.Random(1)
    for _ in range(a.rounds):
        # Each round in a fresh random order: none of the builds always follows another.
        for g in rng.sample(a.gearbox, len(a.gearbox)):
            results[g].append(measure(g, a.n, a.language, a.cold, a.gap))
    print(f"{'build':<50} {'median ms':>10} {'CPU/run ms':>11}  (per round)")
    for g, rs in results.items():
        med = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        rounds = " ".join(f"{r[0]:.2f}/{r[1]:.2f}" for r in rs)
        print(f"{g[-50:]:<50} {med:10.2f} {cpu:11.2f}  {rounds}")


if __name__ == "__main__":
    main()
