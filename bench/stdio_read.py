#!/usr/bin/env python3
"""What reading a request on stdio costs, by its size: builds interleaved (each round in a
random order), the median round trip of a request the server answers at once.

    /usr/bin/python3 bench/stdio_read.py --gearbox old/gearbox --gearbox new/gearbox \
        [--sizes 300,100000,4000000] [-n 15] [--rounds 4]

Each round starts `gearbox serve` over stdio (no pool: nothing runs), initializes, and sends
n requests of an unknown method whose params hold one string of about SIZE bytes (escaped
newlines, as code has), each answered `-32601` and checked against its own id. What a round
trip holds beyond the floor is the transport's reading and parsing of the line: the figure
to compare when the stdio reader changes. Standard library only.
"""
import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from warm_pool import Lines  # noqa: E402


def one(gearbox, config, size, n):
    server = Lines(gearbox, ["--config", config])
    blob = "a\n" * (size // 3)
    lat = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            msg = server.request("no/such", {"blob": blob})
            lat.append((time.perf_counter() - t) * 1000)
            assert msg.get("error", {}).get("code") == -32601, str(msg)[:200]
    finally:
        server.close()
    return statistics.median(lat)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gearbox", action="append", required=True)
    ap.add_argument("--sizes", default="300,100000,4000000")
    ap.add_argument("-n", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    config = Path(tempfile.mkdtemp(prefix="gearbox-stdio-")) / "c.toml"
    config.write_text("pool = {}\n")
    sizes = [int(s) for s in args.sizes.split(",")]
    print("| build | " + " | ".join(f"{s} B p50 ms (rounds)" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    results = {b: {s: [] for s in sizes} for b in args.gearbox}
    for _ in range(args.rounds):
        for size in sizes:
            order = args.gearbox[:]
            random.shuffle(order)
            for b in order:
                results[b][size].append(one(b, str(config), size, args.n))
    for b in args.gearbox:
        cells = []
        for s in sizes:
            r = results[b][s]
            cells.append(f"{statistics.median(r):.2f} ({' '.join(f'{x:.2f}' for x in r)})")
        print(f"| {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
