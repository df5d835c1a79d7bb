#!/usr/bin/env python3
"""Check what deploy/ ships, offline, and prove the checks can fail.

    .venv-deploy/bin/python scripts/check-deploy.py --gearbox target/debug/gearbox
    .venv-deploy/bin/python scripts/check-deploy.py --self-test --gearbox target/debug/gearbox

(scripts/setup-deploy-check.sh makes .venv-deploy; scripts/test.sh runs both.)

1. Every Kubernetes manifest in deploy/ against the API schemas of each pinned Kubernetes
   version, strictly: an unknown field (a misspelled `hostUsers`) fails.
2. The pod's security claims (docs/SECURITY.md): user namespace, Localhost seccomp profile
   that exists in deploy/, no privileged container, every capability dropped, no privilege
   escalation.
3. The gearbox.toml inside the ConfigMap against the configuration's JSON Schema
   (`gearbox config-schema`): an unknown key fails here as it would at start-up.
4. The seccomp profile (OCI/Docker JSON): it parses, its default action refuses, each name
   is a syscall of x86_64 or aarch64 (the kernel's tables in /usr/include), it allows every
   call a sandboxed program may make (the per-run allow filter,
   crates/gearbox-sandbox/src/jail/seccomp.json), and of the calls every run is refused
   it allows only those the server needs to build a run.

`--self-test` breaks a copy of each input in turn and requires the check to fail.
"""

import argparse
import copy
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
RUN_POLICY = ROOT / "crates/gearbox-sandbox/src/jail/seccomp.json"
# The oldest version the manifests claim (user namespaces on by default) and the newest the
# validator ships.
KUBERNETES_VERSIONS = ["1.33.0", "1.37.0"]
SYSCALL_TABLES = [
    Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
    Path("/usr/include/asm-generic/unistd.h"),  # aarch64 uses the generic table
]
# Newer than the headers of the machine the check may run on (Debian 12's linux-libc-dev is
# 6.1), with the kernel version that added them; the per-run filter already names them.
NEWER_SYSCALLS = {
    "fchmodat2": "6.6", "futex_wake": "6.7", "futex_wait": "6.7", "futex_requeue": "6.7",
    "map_shadow_stack": "6.6", "statmount": "6.8", "listmount": "6.8", "mseal": "6.10",
    "uretprobe": "6.11",
}
# Refused to every run, yet needed by the server, the helper or the fork server to build one
# (the comments of the profile's second rule say where).
SERVER_NEEDS = {"pivot_root"}
REFUSING = {"SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD"}
ARCHES = {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"}


class Failed(Exception):
    pass


def manifests():
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        out.append((path.name, [d for d in yaml.safe_load_all(path.read_text()) if d]))
    return out


def check_schemas(name, docs):
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path)
                raise Failed(f"{name}: {doc.get('kind')}/{doc['metadata'].get('name')} "
                             f"against Kubernetes {version}: {path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                raise Failed(f"{name}: no schema for {doc.get('apiVersion')}/{doc.get('kind')} "
                             f"in Kubernetes {version}: {e}")


def pod_specs(docs):
    for doc in docs:
        spec = doc.get("spec") or {}
        if doc.get("kind") in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield doc["metadata"]["name"], spec["template"]["spec"]
        elif doc.get("kind") == "Pod":
            yield doc["metadata"]["name"], spec


def check_pod_profile(name, docs):
    found = False
    for pod, spec in pod_specs(docs):
        found = True
        where = f"{name}: {pod}"
        if spec.get("hostUsers") is not False:
            raise Failed(f"{where}: hostUsers must be false (a user namespace per pod)")
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(flag):
                raise Failed(f"{where}: {flag} must not be set")
        pod_seccomp = (spec.get("securityContext") or {}).get("seccompProfile")
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            sc = c.get("securityContext") or {}
            cwhere = f"{where}/{c['name']}"
            if sc.get("privileged"):
                raise Failed(f"{cwhere}: privileged")
            if sc.get("allowPrivilegeEscalation") is not False:
                raise Failed(f"{cwhere}: allowPrivilegeEscalation must be false")
            caps = sc.get("capabilities") or {}
            if caps.get("drop") != ["ALL"] or caps.get("add"):
                raise Failed(f"{cwhere}: capabilities must drop ALL and add none")
            seccomp = sc.get("seccompProfile") or pod_seccomp or {}
            if seccomp.get("type") != "Localhost":
                raise Failed(f"{cwhere}: seccompProfile must be Localhost")
            shipped = DEPLOY / ("seccomp-" + Path(seccomp.get("localhostProfile", "")).name)
            if not shipped.is_file():
                raise Failed(f"{cwhere}: localhostProfile {seccomp.get('localhostProfile')!r} "
                             f"is not shipped as deploy/{shipped.name}")
    return found


def check_config(name, docs, gearbox):
    schema = json.loads(subprocess.run([gearbox, "config-schema"], check=True,
                                       capture_output=True, text=True).stdout)
    for doc in docs:
        if doc.get("kind") != "ConfigMap":
            continue
        for key, text in (doc.get("data") or {}).items():
            if not key.endswith(".toml"):
                continue
            try:
                config = tomllib.loads(text)
                jsonschema.validate(config, schema)
            except (tomllib.TOMLDecodeError, jsonschema.ValidationError) as e:
                msg = getattr(e, "message", str(e))
                raise Failed(f"{name}: ConfigMap {doc['metadata']['name']} {key}: {msg}")


def syscall_names():
    names = set()
    for table in SYSCALL_TABLES:
        if not table.is_file():
            raise Failed(f"{table} is missing (Debian's linux-libc-dev has it)")
        names |= set(re.findall(r"^#define __NR(?:3264)?_(\w+)\s", table.read_text(), re.M))
    return names | set(NEWER_SYSCALLS)


def run_policy():
    policy = json.loads(RUN_POLICY.read_text())
    allowed = {r["syscall"] for r in policy["allow"]["filter"]}
    refused = {r["syscall"] for r in policy["refused"]["filter"]}
    return allowed, refused


def check_seccomp(name, profile, known, run_allowed, run_refused):
    if not isinstance(profile, dict):
        raise Failed(f"{name}: not a JSON object")
    if profile.get("defaultAction") not in REFUSING:
        raise Failed(f"{name}: defaultAction {profile.get('defaultAction')!r} does not refuse")
    arches = set(profile.get("architectures") or [])
    if not arches or not arches <= ARCHES:
        raise Failed(f"{name}: architectures {sorted(arches)} (want a subset of {sorted(ARCHES)})")
    allowed = set()
    for i, rule in enumerate(profile.get("syscalls") or []):
        names = rule.get("names")
        if not isinstance(names, list) or not names:
            raise Failed(f"{name}: rule {i} has no names")
        if rule.get("action") != "SCMP_ACT_ALLOW" or rule.get("args"):
            raise Failed(f"{name}: rule {i}: only unconditional SCMP_ACT_ALLOW rules are expected")
        unknown = [n for n in names if n not in known]
        if unknown:
            raise Failed(f"{name}: rule {i}: not syscalls of x86_64 or aarch64: {unknown}")
        dup = allowed & set(names)
        if dup or len(set(names)) != len(names):
            raise Failed(f"{name}: rule {i}: names listed twice: {sorted(dup) or names}")
        allowed |= set(names)
    missing = run_allowed - allowed
    if missing:
        raise Failed(f"{name}: refuses calls every sandboxed program may make: {sorted(missing)}")
    extra = (allowed & run_refused) - SERVER_NEEDS
    if extra:
        raise Failed(f"{name}: allows calls refused to every run and not needed to build one: "
                     f"{sorted(extra)}")


def check_all(gearbox, mans=None, profiles=None):
    mans = manifests() if mans is None else mans
    profiles = ({p.name: json.loads(p.read_text()) for p in sorted(DEPLOY.glob("seccomp-*.json"))}
                if profiles is None else profiles)
    if not mans:
        raise Failed("no manifest in deploy/")
    if not profiles:
        raise Failed("no seccomp profile in deploy/")
    pods = False
    for name, docs in mans:
        check_schemas(name, docs)
        pods |= check_pod_profile(name, docs)
        check_config(name, docs, gearbox)
    if not pods:
        raise Failed("no pod template in deploy/")
    known = syscall_names()
    run_allowed, run_refused = run_policy()
    for name, profile in profiles.items():
        check_seccomp(name, profile, known, run_allowed, run_refused)
    return [n for n, _ in mans] + list(profiles)


def self_test(gearbox):
    """Each broken copy must fail, and for the reason given."""
    mans = manifests()
    profiles = {p.name: json.loads(p.read_text()) for p in sorted(DEPLOY.glob("seccomp-*.json"))}
    main = next(i for i, (_, docs) in enumerate(mans) if any(True for _ in pod_specs(docs)))

    def with_pod(edit):
        m = copy.deepcopy(mans)
        for _, spec in pod_specs(m[main][1]):
            edit(spec)
        return m, profiles

    def with_config(text):
        m = copy.deepcopy(mans)
        for doc in m[main][1]:
            if doc.get("kind") == "ConfigMap":
                doc["data"]["gearbox.toml"] += text
        return m, profiles

    def with_profile(edit):
        p = copy.deepcopy(profiles)
        for v in p.values():
            edit(v)
        return mans, p

    def rename(spec, old, new):
        spec[new] = spec.pop(old)

    cases = [
        ("misspelled hostUsers", "Additional properties",
         with_pod(lambda s: rename(s, "hostUsers", "hostUser"))),
        ("unknown container field", "Additional properties",
         with_pod(lambda s: s["containers"][0].update(securityContexts={}))),
        ("wrong type", "is not of type",
         with_pod(lambda s: s.update(terminationGracePeriodSeconds="forty"))),
        ("host users", "hostUsers must be false", with_pod(lambda s: s.update(hostUsers=True))),
        ("privileged", "privileged",
         with_pod(lambda s: s["containers"][0]["securityContext"].update(privileged=True))),
        ("a capability added", "capabilities",
         with_pod(lambda s: s["containers"][0]["securityContext"]["capabilities"].update(
             add=["SYS_ADMIN"]))),
        ("runtime seccomp", "Localhost",
         with_pod(lambda s: s["securityContext"].update(seccompProfile={"type": "RuntimeDefault"}))),
        ("profile not shipped", "is not shipped",
         with_pod(lambda s: s["securityContext"]["seccompProfile"].update(
             localhostProfile="profiles/nothing.json"))),
        ("unknown config key", "Additional properties",
         with_config("\n[sandbox_typo]\nx = 1\n")),
        ("profile allows by default", "does not refuse",
         with_profile(lambda p: p.update(defaultAction="SCMP_ACT_ALLOW"))),
        ("not a syscall", "not syscalls",
         with_profile(lambda p: p["syscalls"][0]["names"].append("mount_everything"))),
        ("a run's call missing", "refuses calls every sandboxed program",
         with_profile(lambda p: p["syscalls"][0]["names"].remove("openat"))),
        ("a refused call allowed", "allows calls refused to every run",
         with_profile(lambda p: p["syscalls"][1]["names"].append("bpf"))),
        ("conditional rule", "only unconditional",
         with_profile(lambda p: p["syscalls"][1].update(args=[{"index": 0, "value": 0,
                                                               "op": "SCMP_CMP_EQ"}]))),
    ]
    bad = 0
    for what, expect, (m, p) in cases:
        try:
            check_all(gearbox, m, p)
            print(f"self-test: {what}: NOT caught")
            bad += 1
        except Failed as e:
            if expect in str(e):
                print(f"self-test: {what}: caught ({e})")
            else:
                print(f"self-test: {what}: caught for another reason: {e}")
                bad += 1
    print(f"self-test: {len(cases) - bad} passed, {bad} failed")
    return bad == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gearbox", required=True, help="the gearbox binary (for config-schema)")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        sys.exit(0 if self_test(args.gearbox) else 1)
    try:
        checked = check_all(args.gearbox)
    except Failed as e:
        print(f"check-deploy: FAILED: {e}")
        sys.exit(1)
    print(f"check-deploy: ok ({', '.join(checked)}; Kubernetes {', '.join(KUBERNETES_VERSIONS)})")


if __name__ == "__main__":
    main()
