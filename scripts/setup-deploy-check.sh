#!/usr/bin/env bash
# Install what scripts/check-deploy.py needs: a venv at .venv-deploy with kubernetes-validate
# (the Kubernetes API schemas of many versions, offline; it brings PyYAML and jsonschema).
# Then: .venv-deploy/bin/python scripts/check-deploy.py --gearbox target/debug/gearbox
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's interpreter, not a pyenv shim on PATH (tomllib needs 3.11+).
PY=${PYTHON:-/usr/bin/python3}
if ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "setup-deploy-check: $PY lacks venv/ensurepip; installing python3-venv" >&2
    apt-get install -y python3-venv >/dev/null
fi
# The kernel's syscall tables the seccomp profile's names are checked against.
if [ ! -f /usr/include/asm-generic/unistd.h ]; then
    echo "setup-deploy-check: installing linux-libc-dev (the kernel's syscall tables)" >&2
    apt-get install -y linux-libc-dev >/dev/null
fi
if [ ! -x .venv-deploy/bin/python ]; then
    "$PY" -m venv .venv-deploy
fi
.venv-deploy/bin/pip install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0'
.venv-deploy/bin/python -c 'import importlib.metadata as m; print("setup-deploy-check: kubernetes-validate", m.version("kubernetes-validate"))'
