#!/usr/bin/env python3
"""Docker backend latency: one fresh container per run, against the Linux backend and a bare
interpreter, in the same run (same machine state).

    scripts/setup-docker.sh                 # engine up, gearbox/python:bookworm built
    cargo build --release
    /usr/bin/python3 bench/docker_bench.py [--gearbox target/release/gearbox] [-n 30]

Rows, each `print(1)` in Python, sequential, n runs each, interleaved round-robin so drift in
machine load hits every row alike:
  1. bare `python3 -c 'print(1)'` subprocess: the floor;
  2. `gearbox run --backend linux` (a cold sandbox; one CLI process per run);
  3. `gearbox run --backend docker` (create, attach, start, copy, run, remove);
  4. `docker run --rm --network none IMAGE python3 -c 'print(1)'` (the docker CLI, for
     reference: no copy, no limits beyond the network).
Prints median / p90 per row, the ratio of each median to the bare one, and for the docker
backend the median set-up time it reports (`setup_us`: create + attach + start + copy).
Standard library only.
"""
import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "gearbox/python:bookworm"


def pct(xs, p):
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, round(p / 100 * (len(xs) - 1))))]


def timed(argv):
    t = time.perf_counter()
    out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    ms = (time.perf_counter() - t) * 1000
    return ms, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gearbox", default=str(ROOT / "target/release/gearbox"))
    ap.add_argument("-n", type=int, default=30)
    args = ap.parse_args()
    docker = shutil.which("docker", path="/usr/bin") or shutil.which("docker")

    with tempfile.TemporaryDirectory() as d:
        prog = Path(d) / "main.py"
        prog.write_text("print(1)\n")
        rows = {
            "bare python3 -c": ["/usr/bin/python3", "-c", "print(1)"],
            "gearbox run, linux": [args.gearbox, "run", "--backend", "linux", "--json", str(prog)],
            "gearbox run, docker": [args.gearbox, "run", "--backend", "docker", "--json", str(prog)],
        }
        if docker:
            rows["docker run --rm (CLI)"] = [docker, "run", "--rm", "--network", "none", IMAGE,
                                             "python3", "-c", "print(1)"]
        # Warm caches (page cache, image layers, the wasm module) once per row.
        for name, argv in rows.items():
            _, out = timed(argv)
            if out.returncode != 0 or b"1" not in out.stdout:
                raise SystemExit(f"{name} does not work here: {out.stderr.decode()[-400:]}")
        times = {name: [] for name in rows}
        setup = []
        for _ in range(args.n):
            for name, argv in rows.items():
                ms, out = timed(argv)
                if out.returncode != 0:
                    raise SystemExit(f"{name} failed: {out.stderr.decode()[-400:]}")
                times[name].append(ms)
                if name == "gearbox run, docker":
                    setup.append(json.loads(out.stdout)["setup_us"] / 1000)

    bare = statistics.median(times["bare python3 -c"])
    print(f"per-run latency, Python print(1), n={args.n} each, interleaved (ms)\n")
    print(f"| {'':<24} | median | p90    | vs bare |")
    print(f"|{'-' * 26}|--------|--------|---------|")
    for name, xs in times.items():
        med = statistics.median(xs)
        print(f"| {name:<24} | {med:6.1f} | {pct(xs, 90):6.1f} | {med / bare:6.1f}x |")
    linux = statistics.median(times["gearbox run, linux"])
    dock = statistics.median(times["gearbox run, docker"])
    print(f"\ndocker backend / linux backend (medians): {dock / linux:.1f}x")
    print(f"docker backend set-up (create + attach + start + copy), median: "
          f"{statistics.median(setup):.1f} ms")


if __name__ == "__main__":
    main()
