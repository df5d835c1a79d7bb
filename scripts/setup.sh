#!/usr/bin/env bash
# Install everything gearbox and its tests need on a fresh Debian 12 machine (run as root),
# then build the release binary. Idempotent: a second run installs nothing and rebuilds only
# what changed.
#
#   scripts/setup.sh            # packages + toolchains + release build
#   GEARBOX_SKIP_BUILD=1 ...    # packages and toolchains only
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: Go for the `go` language, python3-venv for the MCP end-to-end client,
# util-linux for setpriv (unprivileged test run), runc for the pod-profile check, libc6-dev
# for the static sandbox helper (scripts/static-helper.sh).
PACKAGES=(golang-go python3-venv util-linux ca-certificates runc libc6-dev)
missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The QuickJS-in-WebAssembly guest: clang/lld/wasi-libc and the wasm32-wasip1 Rust target.
bash scripts/setup-wasm.sh

# The official MCP Python SDK (end-to-end tests) in .venv.
bash scripts/setup-e2e.sh
# kubernetes-validate (deploy/ checked offline) in .venv-deploy.
bash scripts/setup-deploy-check.sh

# Package installers run outside the sandbox for `packages`: uv (PyPI) and npm.
bash scripts/setup-packages.sh

# Downstream MCP servers used by broker tests, from npm.
if [ -f tests/npm/package.json ]; then
    (cd tests/npm && npm install --no-audit --no-fund --silent)
fi

if [ -z "${GEARBOX_SKIP_BUILD:-}" ]; then
    cargo build --release --locked -p gearbox
    # The sandbox helper, linked statically: every sandbox starts one.
    bash scripts/static-helper.sh --release >/dev/null
    echo "setup: built $(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/gearbox (and its sandbox helper gearbox-jail beside it, linked statically)" >&2
fi
