#!/usr/bin/env python3
"""Warm pool benchmark: a fresh sandbox per run, built before the request arrived.

    cargo build --release
    /usr/bin/python3 bench/warm_pool.py [--gearbox target/release/gearbox] [-n 200] [--seconds 5] [--languages python,javascript,bash]

For Python `print(1)`, Node `console.log(1)` and Bash `echo 1`, in one run:
  1. bare interpreter subprocess (`python3 -c`): the floor for any fresh-process design;
  2. `gearbox run` (cold sandbox, one CLI process per run);
  3. MCP `execute_code` over stdio, cold (`pool = {}`);
  4. MCP `execute_code` over stdio, warm pool (the default).
Sequential: median/p90/p99 over n runs, and the machine's busy CPU per run over the same
runs (from /proc/stat: every process, the client included; the pool's refills included). Then throughput (runs/s) at concurrency 1/2/4/8 for
(1) and (4), each bounded by --seconds. Minimal JSON-lines MCP client; standard library only.
"""
import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "python": (["/usr/bin/python3", "-c", "print(1)"], "print(1)", "main.py"),
    "javascript": (["/usr/bin/node", "-e", "console.log(1)"], "console.log(1)", "main.js"),
    "bash": (["/usr/bin/bash", "-c", "echo 1"], "echo 1", "main.sh"),
}
CLEAN_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def pct(xs, p):
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, round(p / 100 * (len(xs) - 1))))]


class Rpc:
    """One `gearbox serve` over stdio; thread-safe request/response by id."""

    def __init__(self, gearbox, config, env=None):
        self.p = subprocess.Popen([gearbox, "--config", config, "serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
                                  env=env)
        self.lock = threading.Lock()
        self.next_id = 0
        self.waiting = {}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, msg):
        with self.lock:
            self.p.stdin.write((json.dumps(msg) + "\n").encode())

    def _read(self):
        # Buffered: the pipe itself is unbuffered (bufsize=0, for the writes), and an
        # unbuffered readline reads one byte per system call.
        for line in io.BufferedReader(self.p.stdout, 1 << 16):
            msg = json.loads(line)
            slot = self.waiting.get(msg.get("id"))
            if slot is not None:
                slot[1] = msg
                slot[0].set()

    def request(self, method, params):
        with self.lock:
            self.next_id += 1
            rid = self.next_id
        slot = [threading.Event(), None]
        self.waiting[rid] = slot
        self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        slot[0].wait(60)
        del self.waiting[rid]
        msg = slot[1]
        if msg is None or "error" in msg:
            raise RuntimeError(f"no answer or error: {msg}")
        return msg["result"]

    def run(self, lang, code):
        r = self.request("tools/call", {"name": "execute_code",
                                        "arguments": {"language": lang, "code": code}})
        sc = r["structuredContent"]
        if sc["status"] != "ok" or sc["stdout"].strip() != "1":
            raise RuntimeError(f"bad result: {sc}")

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=15)


class Lines:
    """One `gearbox serve` over stdio, one request at a time on the calling thread: no reader
    thread stands between an answer and its caller, for timing sub-millisecond calls."""

    def __init__(self, gearbox, args=()):
        self.p = subprocess.Popen([gearbox, *args, "serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 0
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "0"}})
        self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _send(self, msg):
        self.p.stdin.write((json.dumps(msg) + "\n").encode())
        self.p.stdin.flush()

    def request(self, method, params):
        """The whole answer (`result` or `error`) to one request."""
        self.next_id += 1
        self._send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            msg = json.loads(self.p.stdout.readline())
            if msg.get("id") == self.next_id:
                return msg

    def execute(self, arguments):
        """`execute_code` with `arguments`: its structured result."""
        msg = self.request("tools/call", {"name": "execute_code", "arguments": arguments})
        return msg.get("result", {}).get("structuredContent", {})

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=15)


GAP_S = 0.0


def distinct_address_spaces(pids):
    """`pids` less each process that shares its memory with one kept before it (kcmp
    KCMP_VM; needs root for the sandboxes' processes). A fork server's program and its keeper
    share one address space, and each reports that space's PSS in full: summed, the memory
    would count twice."""
    import ctypes
    import platform

    libc = ctypes.CDLL(None, use_errno=True)
    sys_kcmp = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
    kept = []
    for p in pids:
        if sys_kcmp is None or not any(
                libc.syscall(sys_kcmp, p, q, 1, 0, 0) == 0 for q in kept):
            kept.append(p)
    return kept


def busy_ms():
    """Busy CPU of the whole machine so far (user, nice, system, irq, softirq; not idle,
    iowait, or time the hypervisor gave to other guests), ms."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) * 1000 / os.sysconf("SC_CLK_TCK")


CPU = {}  # (language, path) -> machine CPU ms per run, client included


def timed(fn, n, key=None):
    out = []
    cpu0 = busy_ms()
    for _ in range(n):
        time.sleep(GAP_S)
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    if key is not None:
        CPU[key] = (busy_ms() - cpu0) / n
    return out


def throughput(fn, conc, seconds):
    stop = time.perf_counter() + seconds
    count = [0] * conc

    def worker(i):
        while time.perf_counter() < stop:
            fn()
            count[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(conc)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(count) / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default=str(ROOT / "target" / "release" / "gearbox"))
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--languages", default=",".join(CASES),
                    help="comma-separated subset of: " + ", ".join(CASES))
    ap.add_argument("--gap-ms", type=float, default=0,
                    help="idle time between sequential calls (an agent's think time); the pool refills in it")
    a = ap.parse_args()
    global GAP_S
    GAP_S = a.gap_ms / 1000
    tmp = tempfile.mkdtemp(prefix="gearbox-bench-")
    cold_cfg = Path(tmp) / "cold.toml"
    cold_cfg.write_text("pool = {}\n")
    warm_cfg = Path(tmp) / "warm.toml"
    warm_cfg.write_text("[pool]\npython = 2\njavascript = 2\nbash = 2\n")
    cold, warm = Rpc(a.gearbox, str(cold_cfg)), Rpc(a.gearbox, str(warm_cfg))
    time.sleep(2)  # let the pool fill
    rows, tput = [], []
    chosen = [lang.strip() for lang in a.languages.split(",") if lang.strip()]
    unknown = [lang for lang in chosen if lang not in CASES]
    if unknown:
        ap.error(f"unknown language(s): {', '.join(unknown)}")
    for lang in chosen:
        bare, code, fname = CASES[lang]
        src = Path(tmp) / fname
        src.write_text(code + "\n")
        run_bare = lambda: subprocess.run(bare, stdout=subprocess.DEVNULL, env=CLEAN_ENV, check=True)
        run_cli = lambda: subprocess.run([a.gearbox, "run", str(src)], stdout=subprocess.DEVNULL, check=True)
        for f in (run_bare, run_cli, lambda: cold.run(lang, code), lambda: warm.run(lang, code)):
            for _ in range(5):
                f()
        res = {
            "bare": timed(run_bare, a.n, (lang, "bare")),
            "gearbox run (cold)": timed(run_cli, max(50, a.n // 4), (lang, "gearbox run (cold)")),
            "MCP cold": timed(lambda: cold.run(lang, code), a.n, (lang, "MCP cold")),
            "MCP warm": timed(lambda: warm.run(lang, code), a.n, (lang, "MCP warm")),
        }
        rows.append((lang, res))
        for conc in ((1, 2, 4, 8) if a.seconds > 0 else ()):
            tput.append((lang, conc, throughput(run_bare, conc, a.seconds),
                         throughput(lambda: warm.run(lang, code), conc, a.seconds)))
    cold.close()
    warm.close()
    print(f"sequential latency, ms (n={a.n}; gearbox run n={max(50, a.n // 4)}; {a.gap_ms:.0f} ms idle between calls)")
    print(f"{'language':<11} {'path':<20} {'median':>8} {'p90':>8} {'p99':>8} {'vs bare':>8} {'CPU/run':>8}")
    for lang, res in rows:
        base = statistics.median(res["bare"])
        for name, xs in res.items():
            m = statistics.median(xs)
            cpu = CPU.get((lang, name), 0.0)
            print(f"{lang:<11} {name:<20} {m:8.2f} {pct(xs, 90):8.2f} {pct(xs, 99):8.2f} {m / base:7.2f}x {cpu:8.2f}")
    print(f"\nthroughput, runs/s ({a.seconds:.0f} s per cell)")
    print(f"{'language':<11} {'conc':>4} {'bare':>8} {'MCP warm':>9} {'ratio':>6}")
    for lang, conc, b, w in tput:
        print(f"{lang:<11} {conc:>4} {b:8.1f} {w:9.1f} {w / b:6.2f}")


if __name__ == "__main__":
    main()
