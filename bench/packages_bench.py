#!/usr/bin/env python3
"""Time `packages`: the first run of a requirement set (install into a new layer) and the
cached run, beside the seed's design (`pip install` into a fresh venv before the run),
measured in the same session on the same machine.

    python3 bench/packages_bench.py [--gearbox PATH] [--repeat N] [--packages six numpy]

Each gearbox measurement uses a fresh cache directory (no layer, no download cache), so the
first run pays the whole download and install; pip runs with --no-cache-dir for the same
reason. Prints a Markdown table (medians of N repeats) on stdout.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gearbox_binary(given):
    if given:
        return given
    for p in [
        os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release/gearbox"),
        os.path.join(ROOT, "target/release/gearbox"),
        os.path.join(ROOT, "target/debug/gearbox"),
    ]:
        if os.path.exists(p):
            return p
    sys.exit("no gearbox binary; build it (cargo build --release -p gearbox) or pass --gearbox")


def timed(cmd, **kw):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return dt


def gearbox_runs(gearbox, pkg, module, workdir):
    """(first, cached) seconds for `gearbox run --package pkg` with a fresh cache."""
    cache = tempfile.mkdtemp(prefix="gearbox-bench-", dir="/var/tmp")
    os.chmod(cache, 0o755)
    try:
        cfg = os.path.join(cache, "gearbox.toml")
        with open(cfg, "w") as f:
            f.write(f'[packages]\ncache_dir = "{cache}/layers"\n')
        prog = os.path.join(workdir, "bench_pkg.py")
        with open(prog, "w") as f:
            f.write(f"import {module}\nprint({module}.__name__)\n")
        cmd = [gearbox, "--config", cfg, "run"]
        help_text = subprocess.run([gearbox, "run", "--help"], capture_output=True, text=True).stdout
        if "--gear" in help_text:
            cmd += ["--gear", "full_trust"]
        cmd += ["--package", pkg, prog]
        first = timed(cmd)
        cached = timed(cmd)
        return first, cached
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def pip_venv(pkg, module):
    """Seconds for: fresh venv, pip install pkg (no cache), run the import."""
    d = tempfile.mkdtemp(prefix="pip-bench-", dir="/var/tmp")
    try:
        t = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-m", "venv", d], check=True, capture_output=True)
        subprocess.run(
            [f"{d}/bin/pip", "install", "--quiet", "--no-cache-dir", "--disable-pip-version-check", pkg],
            check=True,
            capture_output=True,
        )
        subprocess.run([f"{d}/bin/python", "-c", f"import {module}"], check=True)
        return time.perf_counter() - t
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--packages", nargs="*", default=["six", "numpy"])
    a = ap.parse_args()
    gearbox = gearbox_binary(a.gearbox)
    work = tempfile.mkdtemp(prefix="bench-prog-")
    base = os.path.join(work, "base.py")
    with open(base, "w") as f:
        f.write("print(1)\n")
    baseline = statistics.median(timed([gearbox, "run", base]) for _ in range(a.repeat))
    rows = []
    for pkg in a.packages:
        module = pkg.split("=")[0].split("<")[0].split(">")[0]
        firsts, cached, pips = [], [], []
        for _ in range(a.repeat):
            f, c = gearbox_runs(gearbox, pkg, module, work)
            firsts.append(f)
            cached.append(c)
            pips.append(pip_venv(pkg, module))
        rows.append((pkg, statistics.median(firsts), statistics.median(cached), statistics.median(pips)))
    shutil.rmtree(work, ignore_errors=True)
    print(f"gearbox: {gearbox}; medians of {a.repeat}; `gearbox run` without packages: {baseline * 1000:.0f} ms\n")
    print("| package | gearbox first run (install) | gearbox cached run | pip install into a fresh venv + import |")
    print("|---|---|---|---|")
    for pkg, f, c, p in rows:
        print(f"| `{pkg}` | {f * 1000:.0f} ms | {c * 1000:.0f} ms | {p * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
