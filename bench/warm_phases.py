#!/usr/bin/env python3
"""Where a warm call's time goes, phase by phase, from the kernel's own timestamps: `perf
record` of the scheduler's exec, fork, exit and wake-up tracepoints around sequential
`execute_code` calls to `gearbox serve`, on the clock the client times its calls with.

    /usr/bin/python3 bench/warm_phases.py [--gearbox PATH] [--language python|bash|javascript]
                                          [-n 100] [--gap 0.02]

Each call's phases (medians over the calls; a call whose events cannot all be found is
left out and counted):
  server        the request written -> the server wakes the warm sandbox's program
                (protocol, analysis, gear, pool, the hand-over's write)
  hand-over     -> the program's `execve` (exec-based languages: files, rlimits, exec)
  program       -> the program's exit (fork servers: from the wake-up; includes the run)
  exit          the program's exit -> its init's report waking the server (a fork server's
                run), or init's exit (a helper-built one): the exit status reaching init
  report        -> the answer read by the client (the outcome, the protocol; a helper-built
                run's namespaces' teardown)
The bare interpreter (`python3 -c`, `bash -c`, `node -e`) is measured the same way in the
same recording: its exec -> exit. `refill during the call` counts calls in which the pool's
replacement sandbox was forked while the program ran (two cores: it competes with the run).
Needs root and `perf`. Standard library otherwise.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from warm_pool import Lines  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CODE = {"python": "print({i})", "bash": "echo {i}", "javascript": "console.log({i})"}
BARE = {
    "python": ["/usr/bin/python3", "-c", "print(1)"],
    "bash": ["/usr/bin/bash", "-c", "echo 1"],
    "javascript": ["node", "-e", "console.log(1)"],
}
EVENT = re.compile(r"\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+sched:(\w+):\s*(.*)")
NOT_PROGRAM = ("gb-init", "gb-zygote", "gearbox", "tokio", "perf", "kworker")


def calls(gearbox, language, n, gap):
    server = Lines(gearbox)
    time.sleep(2.5)
    out = []
    for i in range(n + 10):
        t0 = time.monotonic()
        sc = server.execute({"language": language, "code": CODE[language].format(i=i)})
        t1 = time.monotonic()
        if sc.get("stdout", "").strip() != str(i):
            raise SystemExit(f"call {i} answered {sc}")
        if i >= 10:
            out.append((t0, t1))
        time.sleep(gap)
    server.p.kill()
    server.p.wait()
    return out


def parse(text):
    events = []
    for line in text.splitlines():
        m = EVENT.match(line)
        if m:
            comm, pid, tid, t, name, rest = m.groups()
            events.append((float(t), comm, int(tid), name, rest))
    return events


def target_pid(rest):
    m = re.search(r"\bpid=(\d+)", rest)
    return int(m.group(1)) if m else None


def phases(events, t0, t1):
    inside = [e for e in events if t0 <= e[0] <= t1]
    exits = [e for e in inside if e[3] == "sched_process_exit"
             and not e[1].startswith(NOT_PROGRAM)]
    if not exits:
        return None
    prog_exit = exits[0]
    pid = prog_exit[2]
    woken = [e[0] for e in inside if e[3] == "sched_wakeup" and target_pid(e[4]) == pid
             and e[1].startswith("tokio")]
    execs = [e[0] for e in inside if e[3] == "sched_process_exec" and e[2] == pid]
    # Init's report: the first wake-up of the server by init after the program's exit (a
    # fork server's init exits only after the answer); else init's exit (helper-built).
    init_exits = [e[0] for e in inside if e[3] == "sched_wakeup" and e[1].startswith("gb-init")
                  and "comm=tokio" in e[4] and e[0] >= prog_exit[0]]
    init_exits += [e[0] for e in inside if e[3] == "sched_process_exit"
                   and e[1].startswith("gb-init") and e[0] >= prog_exit[0]]
    if not woken or not init_exits:
        return None
    handover = woken[0]
    start = execs[0] if execs else handover
    refill = any(e[3] == "sched_process_fork" and e[1].startswith("gb-zygote")
                 and handover <= e[0] <= prog_exit[0] for e in inside)
    ms = lambda a, b: (b - a) * 1000  # noqa: E731
    return {
        "server": ms(t0, handover),
        "hand-over": ms(handover, execs[0]) if execs else None,
        "program": ms(start, prog_exit[0]),
        "exit": ms(prog_exit[0], init_exits[0]),
        "report": ms(init_exits[0], t1),
        "total": ms(t0, t1),
        "refill": refill,
    }


def bare_times(events, argv0):
    name = os.path.basename(argv0)
    started, times = {}, []
    for t, comm, tid, ev, rest in events:
        if ev == "sched_process_exec" and f"/{name}" in rest:
            started[tid] = t
        elif ev == "sched_process_exit" and tid in started:
            times.append((t - started.pop(tid)) * 1000)
    return times


def main():
    ap = argparse.ArgumentParser()
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
    ap.add_argument("--gearbox", default=str(target / "gearbox"))
    ap.add_argument("--language", default="python", choices=sorted(CODE))
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between calls")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "perf.data"
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-o", str(data),
             "-e", "sched:sched_process_exec", "-e", "sched:sched_process_fork",
             "-e", "sched:sched_process_exit", "-e", "sched:sched_wakeup"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        windows = calls(args.gearbox, args.language, args.n, args.gap)
        bare = BARE[args.language]
        for _ in range(args.n):
            subprocess.run(bare, stdout=subprocess.DEVNULL, check=True)
            time.sleep(args.gap)
        time.sleep(0.3)
        perf.send_signal(2)
        perf.wait()
        text = subprocess.run(["perf", "script", "-i", str(data), "-F",
                               "comm,pid,tid,time,event,trace"],
                              capture_output=True, text=True, check=True).stdout
    events = parse(text)
    rows = [r for r in (phases(events, t0, t1) for t0, t1 in windows) if r]
    if not rows:
        raise SystemExit("no call's events were found (root? perf?)")
    print(f"{args.language}: {len(rows)} of {len(windows)} calls with every event; "
          f"refill during the call in {sum(r['refill'] for r in rows)}")
    print()
    print("| phase | median ms | p90 ms |")
    print("|---|---|---|")
    for k in ("server", "hand-over", "program", "exit", "report", "total"):
        v = sorted(r[k] for r in rows if r[k] is not None)
        if v:
            print(f"| {k} | {statistics.median(v):.3f} | {v[int(len(v) * 0.9)]:.3f} |")
    b = bare_times(events, bare[0])
    if b:
        print(f"| bare `{' '.join(bare[:2])}` exec -> exit | {statistics.median(b):.3f} | "
              f"{sorted(b)[int(len(b) * 0.9)]:.3f} |")


if __name__ == "__main__":
    main()
