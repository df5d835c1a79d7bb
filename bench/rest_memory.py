#!/usr/bin/env python3
"""Memory of `gearbox serve` at rest (issue 23): PSS of the whole process tree.

    cargo build --release
    sudo /usr/bin/python3 bench/rest_memory.py [--gearbox target/release/gearbox] [--config FILE] [--burst 20] [--idle 95]

Starts `gearbox serve` over stdio (default config unless --config), waits for the pool to
settle, and sums PSS (/proc/PID/smaps_rollup; needs root to read the sandboxes' processes)
over the server and every descendant (each address space once), grouped by process kind. Three points: at rest after
start, right after a burst of --burst `execute_code` calls per language (python, javascript,
bash; 8 in flight, so the pool grows), and after --idle seconds without calls (the pool checks every
idle_secs / 2, so a key shrinks between 1 and 1.5 idle_secs after its last call).
Prints one table per point. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from warm_pool import distinct_address_spaces  # noqa: E402

CODE = {"python": "print(1)", "javascript": "console.log(1)", "bash": "echo 1"}


def children():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(root):
    kids, out, todo = children(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def pss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def kind(pid, root):
    if pid == root:
        return "gearbox serve"
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        return "?"
    name = os.path.basename(argv[0].decode(errors="replace")) if argv and argv[0] else "?"
    text = b" ".join(argv).decode(errors="replace")
    if "gearbox" in name or "__jail" in text:
        return "gearbox helper/init"
    return name


def table(title, root):
    rows = {}
    procs = tree(root)
    # A program and its keeper share one address space: counted once.
    distinct = set(distinct_address_spaces(procs))
    for p in procs:
        k = kind(p, root)
        n, kib = rows.get(k, (0, 0))
        rows[k] = (n + 1, kib + (pss_kib(p) if p in distinct else 0))
    total = sum(v[1] for v in rows.values())
    print(f"\n{title}")
    print(f"| {'process kind':<24} | {'count':>5} | {'PSS MiB':>8} |")
    print(f"|{'-' * 26}|{'-' * 7}|{'-' * 10}|")
    for k, (n, kib) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"| {k:<24} | {n:>5} | {kib / 1024:>8.1f} |")
    print(f"| {'total':<24} | {sum(v[0] for v in rows.values()):>5} | {total / 1024:>8.1f} |")
    return total


class Client:
    def __init__(self, argv):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.id = 0

    def call(self, method, params=None):
        self.id += 1
        msg = {"jsonrpc": "2.0", "id": self.id, "method": method, "params": params or {}}
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit("server exited")
            r = json.loads(line)
            if r.get("id") == self.id:
                return r

    def burst(self, calls, in_flight=8):
        """`calls` tools/call params, `in_flight` sent before any answer is read (a burst that
        outruns the pool and makes it grow); the error answers."""
        bad, todo = [], list(calls)
        while todo:
            ids = set()
            for params in todo[:in_flight]:
                self.id += 1
                ids.add(self.id)
                msg = {"jsonrpc": "2.0", "id": self.id, "method": "tools/call", "params": params}
                self.p.stdin.write((json.dumps(msg) + "\n").encode())
            self.p.stdin.flush()
            todo = todo[in_flight:]
            while ids:
                line = self.p.stdout.readline()
                if not line:
                    raise SystemExit("server exited")
                r = json.loads(line)
                if r.get("id") in ids:
                    ids.discard(r["id"])
                    if "error" in r or r.get("result", {}).get("isError"):
                        bad.append(r)
        return bad

    def notify(self, method):
        self.p.stdin.write((json.dumps({"jsonrpc": "2.0", "method": method}) + "\n").encode())
        self.p.stdin.flush()


def settle(root, quiet=3.0, limit=60.0):
    """Wait until the tree's process count has not changed for `quiet` seconds."""
    start, last, since = time.time(), None, time.time()
    while time.time() - start < limit:
        n = len(tree(root))
        if n != last:
            last, since = n, time.time()
        elif time.time() - since >= quiet:
            return
        time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default=str(ROOT / "target/release/gearbox"))
    ap.add_argument("--config")
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--idle", type=float, default=95.0)
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("note: not root, the sandboxes' PSS is not readable", file=sys.stderr)
    argv = [a.gearbox, "serve"] + (["--config", a.config] if a.config else [])
    c = Client(argv)
    c.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "rest", "version": "1"}})
    c.notify("notifications/initialized")
    root = c.p.pid
    settle(root)
    print(f"gearbox: {a.gearbox}  config: {a.config or 'default'}  load: {open('/proc/loadavg').read().split()[:3]}")
    table("at rest after start", root)
    calls = [
        {"name": "execute_code", "arguments": {"language": lang, "code": code}}
        for _ in range(a.burst)
        for lang, code in CODE.items()
    ]
    for r in c.burst(calls):
        print(f"failed: {r}", file=sys.stderr)
    settle(root)
    table(f"after a burst of {a.burst} calls per language", root)
    time.sleep(a.idle)
    settle(root)
    table(f"after {a.idle:.0f} s idle", root)
    c.p.stdin.close()
    c.p.wait(timeout=15)


if __name__ == "__main__":
    main()
