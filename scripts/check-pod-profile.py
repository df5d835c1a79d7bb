#!/usr/bin/env python3
"""Run gearbox's sandbox the way deploy/kubernetes.yaml runs the pod, with runc (an OCI
runtime, as containerd and CRI-O use), and show each setting the manifest claims is needed.

    sudo python3 scripts/check-pod-profile.py --gearbox target/debug/gearbox

The container: its own user namespace (ids 0-65535 mapped to unprivileged host ids, like
`hostUsers: false`), uid/gid 65532, no capability in any set, no_new_privs, the seccomp profile
deploy/seccomp-gearbox.json, no AppArmor profile, and /proc without the runtime's masks
(`procMount: Unmasked`); the host's root, read-only, as its root file system. Inside it,
`gearbox run` must run Python and Bash programs in its sandbox. Then two controls, each of
which must make the sandbox's set-up fail: the runtime's default /proc masks (the manifest
without `procMount: Unmasked`), and the profile without `mount`.

`gearbox serve` runs there too: five calls over MCP stdio, the later ones through the warm
pool's fork server. What this does not cover: Kubernetes itself (the kubelet, idmapped volume
mounts) and the runtime's default AppArmor profile (this host may have no AppArmor). Needs
root, runc and unshare; exit 0 when every case behaves as expected.
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "deploy/seccomp-gearbox.json"
# An MCP client over stdio: `gearbox serve` (warm pool and fork servers on, as in the pod)
# answers five Python calls; one JSON line per outcome.
SERVE_CLIENT = """
import json, subprocess, sys
p = subprocess.Popen([sys.argv[1], "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     text=True)
def send(m):
    p.stdin.write(json.dumps(m) + "\\n")
    p.stdin.flush()
def recv(i):
    for line in p.stdout:
        m = json.loads(line)
        if m.get("id") == i:
            return m
send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "check-pod-profile", "version": "1"}}})
recv(1)
send({"jsonrpc": "2.0", "method": "notifications/initialized"})
for i in range(2, 7):
    send({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"language": "python", "code": f"print({i})"}}})
    print(json.dumps(recv(i)["result"].get("structuredContent")), flush=True)
p.stdin.close()
p.wait(timeout=30)
"""
PROGRAMS = {
    "t.py": ("python", 'import os\nprint("python as", os.getuid())\n', "python as 1000\n"),
    "t.sh": ("bash", 'echo "bash as $(id -u)"\n', "bash as 1000\n"),
}


def base_config(gearbox, rootfs, progs, seccomp, masked):
    return {
        "ociVersion": "1.0.2",
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "gearbox-0",
        "process": {
            "terminal": False,
            "user": {"uid": 65532, "gid": 65532},
            "args": [str(gearbox), "run", "--json"],
            "env": ["PATH=/usr/bin:/bin", "HOME=/tmp"],
            "cwd": "/",
            "capabilities": {k: [] for k in ("bounding", "effective", "permitted", "ambient")},
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096}],
        },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "nodev", "mode=1777"]},
            {"destination": "/tmp/prog", "type": "bind", "source": str(progs),
             "options": ["rbind", "ro"]},
        ],
        "linux": {
            "namespaces": [{"type": t} for t in
                           ("pid", "network", "ipc", "uts", "mount", "user", "cgroup")],
            "uidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
            "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
            "seccomp": seccomp,
            # What runc (and containerd, CRI-O) mask by default; `procMount: Unmasked` drops it.
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"]
            if masked else [],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                              "/proc/sysrq-trigger"] if masked else [],
        },
    }


def run_case(name, gearbox, seccomp, masked, program, work, args=None):
    bundle = work / name
    bundle.mkdir()
    rootfs = work / "rootfs"
    config = base_config(gearbox, rootfs, work / "prog", seccomp, masked)
    config["process"]["args"].append(f"/tmp/prog/{program}")
    if args is not None:
        config["process"]["args"] = args
    (bundle / "config.json").write_text(json.dumps(config))
    cid = f"gearbox-pod-check-{os.getpid()}-{name}"
    # The host's root, bound (read-only in the container) in a mount namespace of our own,
    # so that nothing of it shows on the host.
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
           f'mount --rbind / "{rootfs}" && exec runc run --bundle "{bundle}" "{cid}"']
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=120)
    finally:
        subprocess.run(["runc", "delete", "-f", cid], capture_output=True)
    lines = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    if args is not None:
        return lines or [{"status": "none", "reason": p.stderr[-400:]}]
    return lines[-1] if lines else {"status": "none", "reason": p.stderr[-400:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gearbox", required=True, type=Path)
    args = ap.parse_args()
    gearbox = Path("/tmp/prog/gearbox")
    if os.geteuid() != 0 or not shutil.which("runc") or not shutil.which("unshare"):
        print("check-pod-profile: needs root, runc and unshare")
        sys.exit(1)
    profile = json.loads(PROFILE.read_text())
    no_mount = copy.deepcopy(profile)
    for rule in no_mount["syscalls"]:
        rule["names"] = [n for n in rule["names"] if n != "mount"]
    work = Path(tempfile.mkdtemp(prefix="gearbox-pod-check-"))
    os.chmod(work, 0o755)
    (work / "rootfs").mkdir()
    (work / "prog").mkdir()
    for fname, (_, code, _) in PROGRAMS.items():
        (work / "prog" / fname).write_text(code)
        os.chmod(work / "prog" / fname, 0o644)
    # The binary goes in with the programs: the container's user (a mapped, unprivileged id)
    # may not reach the build's directory (under a home that is 0700, say).
    shutil.copy2(args.gearbox.resolve(), work / "prog" / "gearbox")
    os.chmod(work / "prog" / "gearbox", 0o755)
    (work / "prog" / "serve.py").write_text(SERVE_CLIENT)
    os.chmod(work / "prog" / "serve.py", 0o644)
    os.chmod(work / "prog", 0o755)
    bad = 0
    try:
        for fname, (lang, _, want) in PROGRAMS.items():
            o = run_case(f"pod-{lang}", gearbox, profile, False, fname, work)
            ok = o.get("status") == "ok" and o.get("stdout") == want
            bad += not ok
            print(f"check-pod-profile: the pod's settings, {lang}: "
                  f"{'ok' if ok else 'FAILED'} ({o.get('status')}: "
                  f"{(o.get('stdout') or o.get('reason') or '').strip()[:200]})")
        outs = run_case("pod-serve", gearbox, profile, False, "", work,
                        args=["/usr/bin/python3", "/tmp/prog/serve.py", str(gearbox)])
        ok = len(outs) == 5 and all(
            o.get("status") == "ok" and o.get("stdout") == f"{i}\n" for i, o in enumerate(outs, 2))
        bad += not ok
        print(f"check-pod-profile: the pod's settings, gearbox serve (5 calls, warm pool): "
              f"{'ok' if ok else 'FAILED'} (set-up us: {[o.get('setup_us') for o in outs]}; "
              f"{'' if ok else outs})")
        for name, seccomp, masked, step in [
            ("masked-proc", profile, True, "mount /proc"),
            ("no-mount", no_mount, False, "EPERM"),
        ]:
            o = run_case(name, gearbox, seccomp, masked, "t.py", work)
            reason = o.get("reason") or ""
            ok = o.get("status") == "error" and "set-up failed" in reason and step in reason
            bad += not ok
            print(f"check-pod-profile: control {name}: "
                  f"{'fails as it must' if ok else 'DID NOT FAIL AS EXPECTED'} "
                  f"({o.get('status')}: {reason.strip()[:200]})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"check-pod-profile: {5 - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
