#!/usr/bin/env python3
"""What the network gear costs, in one run (root: it builds a stand-in internet).

    /usr/bin/python3 bench/network_bench.py [--gearbox target/release/gearbox] [-n 20] [--mb 64]

1. Start-up: `gearbox run` of a Python `print(1)` without network, and the same granted
   network (`--network=inet.test`): median and p90 wall time, the difference and the ratio.
   Runs are interleaved so machine noise hits both alike.
2. Start-up through MCP (`gearbox serve` over stdio, gear full_trust): warm `execute_code`
   of `print(1)` without network (the fork server) and granted (a warm sandbox kept for
   granted runs, after a first granted call that misses), interleaved.
3. Throughput: a file of `--mb` MiB fetched over HTTP from a server in a network namespace
   (veth, 198.51.100.250 in a /30), directly by the host's Python and through a granted run's relay and
   egress proxy; MB/s each and the ratio. Both figures time the fetch alone (the sandboxed
   one is measured by the program itself), so neither includes an interpreter's start.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NS = f"gbxbench-{os.getpid()}"
INET = "198.51.100.250"
# The host's own fetches go direct, whatever proxy the environment names.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gearbox", default=str(ROOT / "target/release/gearbox"))
    ap.add_argument("-n", type=int, default=20)
    ap.add_argument("--mb", type=int, default=64)
    a = ap.parse_args()
    # Stand-in internets of test or bench processes that are gone would shadow this one.
    for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        for prefix in ("gbxnet-", "gbxbench-"):
            if name.startswith(prefix) and not Path(f"/proc/{name[len(prefix):]}").exists():
                subprocess.run(["ip", "netns", "del", name])
    routed = subprocess.run(["ip", "-o", "route", "show", "match", INET], capture_output=True, text=True).stdout
    if any(not l.startswith("default") for l in routed.splitlines()):
        raise SystemExit(f"{INET} is already routed here ({routed.strip()}); the bench would hijack it")
    tmp = Path(tempfile.mkdtemp(prefix="gbx-netbench-"))
    h, i = f"gbbh{os.getpid() % 10000}", f"gbbi{os.getpid() % 10000}"
    sh(f"ip netns add {NS} && ip link add {h} type veth peer name {i} && ip link set {i} netns {NS} "
       f"&& ip addr add 198.51.100.249/30 dev {h} && ip link set {h} up && ip -n {NS} addr add {INET}/30 dev {i} "
       f"&& ip -n {NS} link set {i} up && ip -n {NS} link set lo up")
    server = None
    try:
        (tmp / "blob").write_bytes(os.urandom(1 << 20) * a.mb)
        server = subprocess.Popen(["ip", "netns", "exec", NS, "python3", "-m", "http.server", "80",
                                   "--bind", INET], cwd=tmp, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                DIRECT.open(f"http://{INET}/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        (tmp / "gearbox.toml").write_text(f'[limits]\ntimeout_ms = 120000\nmemory_mb = 1024\n\n[network]\nhosts = {{ "inet.test" = "{INET}" }}\n')
        (tmp / "p.py").write_text("print(1)\n")
        base = [a.gearbox, "--config", str(tmp / "gearbox.toml"), "run", "--gear", "full_trust"]
        plain, granted = [], []
        for _ in range(a.n):
            for out, extra in ((plain, []), (granted, ["--network=inet.test"])):
                t = time.perf_counter()
                r = subprocess.run(base + extra + [str(tmp / "p.py")], capture_output=True)
                out.append((time.perf_counter() - t) * 1000)
                assert r.stdout.strip() == b"1", r
        print(f"## start-up, gearbox run print(1), n={a.n}\n")
        print("| run | median ms | p90 ms |\n|---|---|---|")
        for name, xs in (("no network", plain), ("network granted (proxy + relay)", granted)):
            print(f"| {name} | {statistics.median(xs):.1f} | {pct(xs, 90):.1f} |")
        d = statistics.median(granted) - statistics.median(plain)
        print(f"\nadded by the grant: {d:+.1f} ms median ({statistics.median(granted) / statistics.median(plain):.2f}x)\n")

        # Through the MCP server: a granted run is served by a warm sandbox kept for granted
        # runs (after the first, which misses), an ungranted one by the fork server.
        sys.path.insert(0, str(Path(__file__).parent))
        from warm_pool import Rpc
        (tmp / "serve.toml").write_text('gear = "full_trust"\n\n' + (tmp / "gearbox.toml").read_text())
        rpc = Rpc(a.gearbox, str(tmp / "serve.toml"))
        try:
            def call(network):
                args = {"language": "python", "code": "print(1)"}
                if network:
                    args["network"] = ["inet.test"]
                t = time.perf_counter()
                sc = rpc.request("tools/call", {"name": "execute_code", "arguments": args})["structuredContent"]
                ms = (time.perf_counter() - t) * 1000
                assert sc["status"] == "ok" and sc["stdout"].strip() == "1", sc
                assert bool(sc.get("egress")) == network, sc
                return ms
            first = call(True)
            time.sleep(1)
            warm_plain, warm_granted = [], []
            for _ in range(a.n):
                warm_plain.append(call(False))
                warm_granted.append(call(True))
                time.sleep(0.02)
        finally:
            rpc.close()
        print(f"## start-up through MCP (execute_code print(1), warm), n={a.n}\n")
        print("| run | median ms | p90 ms |\n|---|---|---|")
        print(f"| no network (fork server) | {statistics.median(warm_plain):.1f} | {pct(warm_plain, 90):.1f} |")
        print(f"| network granted (warm sandbox for granted runs) | {statistics.median(warm_granted):.1f} | {pct(warm_granted, 90):.1f} |")
        print(f"| first granted call (cold: the pool keeps none until one misses) | {first:.1f} | |")
        d = statistics.median(warm_granted) - statistics.median(warm_plain)
        print(f"\nadded by the grant, warm: {d:+.1f} ms median\n")

        t = time.perf_counter()
        n = len(DIRECT.open(f"http://{INET}/blob", timeout=60).read())
        direct = n / (time.perf_counter() - t) / 1e6
        (tmp / "f.py").write_text(
            "import time, urllib.request\nt = time.perf_counter()\n"
            "n = len(urllib.request.urlopen('http://inet.test/blob', timeout=120).read())\n"
            "print(n / (time.perf_counter() - t) / 1e6)\n")
        r = subprocess.run(base + ["--network=inet.test", "--memory", "1G", "--timeout", "2m", "--json",
                                   str(tmp / "f.py")], capture_output=True)
        o = json.loads(r.stdout)
        assert o["status"] == "ok", o
        proxied = float(o["stdout"].strip())
        print(f"## throughput, {a.mb} MiB over HTTP\n")
        print("| path | MB/s |\n|---|---|")
        print(f"| host, direct | {direct:.0f} |\n| sandbox, relay + egress proxy | {proxied:.0f} |")
        print(f"\nproxied / direct: {proxied / direct:.2f}; ledger: {o.get('egress', {}).get('hosts')}")
    finally:
        if server:
            server.kill()
        subprocess.run(["ip", "netns", "del", NS])
        subprocess.run(["rm", "-rf", str(tmp)])


if __name__ == "__main__":
    main()
