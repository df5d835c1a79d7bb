#!/usr/bin/env python3
"""Where a cold `gearbox run` spends its time, phase by phase, from the kernel's own
timestamps: `perf record` of the scheduler's exec, fork and exit tracepoints (cheap: no
system call is traced) around runs of one or more builds, interleaved.

    /usr/bin/python3 bench/cold_phases.py [--gearbox PATH ...] [-n 40]

Each run's phases, by the processes they start or end:
  CLI start -> helper exec     the `gearbox` CLI: binary start, config, gear, spawn
  helper exec -> init fork     the helper: its start, request, cgroup, clone into namespaces
  init fork -> program fork    init: id maps, the root (mounts)
  program fork -> interpreter  the program's restriction (rlimits, capabilities, Landlock,
                               seccomp) and its exec
  interpreter                  the interpreter itself (compare: bare, measured the same way)
  interpreter exit -> init     the program's exit as its parent sees it
  init exit -> helper exit     init's and the namespaces' teardown, the report
  helper exit -> CLI exit      the CLI prints the outcome and exits
Needs root and `perf`. Standard library otherwise.
"""
import argparse
import random
import os
import re
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BARE = "/usr/bin/python3"
EVENT = re.compile(r"\s*(\S+)\s+(\d+)\s+\[\d+\]\s+([\d.]+):\s+sched:(\w+):\s*(.*)")
PHASES = [
    ("cli", "jail_exec", "CLI start -> helper exec"),
    ("jail_exec", "init_fork", "helper exec -> init fork"),
    ("init_fork", "prog_fork", "init fork -> program fork"),
    ("prog_fork", "py_exec", "program fork -> interpreter exec"),
    ("py_exec", "py_exit", "interpreter"),
    ("py_exit", "init_exit", "interpreter exit -> init exit"),
    ("init_exit", "jail_exit", "init exit -> helper exit"),
    ("jail_exit", "cli_exit", "helper exit -> CLI exit"),
    ("cli", "cli_exit", "total"),
]


def child_pid(rest):
    m = re.search(r"child_pid=(\d+)", rest)
    return int(m.group(1)) if m else None


def parse(lines, builds):
    runs = {b: [] for b in builds}
    bare = []
    started = {}
    cur = None
    for line in lines:
        m = EVENT.match(line)
        if not m:
            continue
        comm, pid, t, kind, rest = m.group(1), int(m.group(2)), float(m.group(3)) * 1000, m.group(4), m.group(5)
        if kind == "sched_process_exec":
            path = rest.split(" ")[0].removeprefix("filename=")
            if path in runs:
                cur = {"build": path, "cli_pid": pid, "cli": t}
                runs[path].append(cur)
                continue
            if path == BARE and cur is None:
                started[pid] = t
                continue
        if kind == "sched_process_exit" and pid in started and "group_dead=true" in rest:
            bare.append(t - started.pop(pid))
            continue
        if cur is None:
            continue
        if kind == "sched_process_exec" and "gearbox" in rest and "jail" not in cur:
            if pid != cur["cli_pid"]:
                cur["jail_exec"], cur["jail"] = t, pid
        elif kind == "sched_process_fork" and pid == cur.get("jail") and "init" not in cur:
            cur["init_fork"], cur["init"] = t, child_pid(rest)
        elif kind == "sched_process_fork" and pid == cur.get("init") and "prog" not in cur:
            cur["prog_fork"], cur["prog"] = t, child_pid(rest)
        elif kind == "sched_process_exec" and pid == cur.get("prog"):
            cur["py_exec"] = t
        elif kind == "sched_process_exit" and "group_dead=true" in rest:
            for who, key in (("prog", "py_exit"), ("init", "init_exit"), ("jail", "jail_exit")):
                if pid == cur.get(who):
                    cur[key] = t
            if pid == cur["cli_pid"]:
                cur["cli_exit"] = t
                cur = None
    return runs, bare


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", action="append", help="a gearbox binary (repeat)")
    ap.add_argument("-n", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    builds = [str(Path(g).resolve()) for g in (args.gearbox or [ROOT / "target/release/gearbox"])]
    with tempfile.TemporaryDirectory() as d:
        prog = Path(d) / "main.py"
        prog.write_text("print(1)\n")
        # A fresh random order every round: no build always follows another.
        rng = random.Random(args.seed)
        cmds = [f"{b} run {prog} >/dev/null" for b in builds] + [f"{BARE} -c 'print(1)' >/dev/null"]
        loop = "\n".join(c for _ in range(args.n) for c in rng.sample(cmds, len(cmds)))
        data = Path(d) / "perf.data"
        subprocess.run(
            ["perf", "record", "-q", "-a", "-o", str(data), "-e", "sched:sched_process_exec",
             "-e", "sched:sched_process_exit", "-e", "sched:sched_process_fork",
             "--", "sh", "-c", loop],
            check=True, stdout=subprocess.DEVNULL,
        )
        out = subprocess.run(["perf", "script", "-i", str(data)], check=True,
                             capture_output=True, text=True).stdout
    runs, bare = parse(out.splitlines(), builds)
    print(f"load: {os.getloadavg()[0]:.2f}; medians in ms, n = {args.n} per build\n")
    print("| phase | " + " | ".join(builds) + " |")
    print("|---|" + "---|" * len(builds))
    for a, b, name in PHASES:
        cells = []
        for build in builds:
            v = [r[b] - r[a] for r in runs[build] if a in r and b in r]
            cells.append(f"{statistics.median(v):.2f}" if v else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if bare:
        print(f"| bare `python3 -c` exec -> exit | {statistics.median(bare):.2f} |" + " |" * (len(builds) - 1))


if __name__ == "__main__":
    main()
