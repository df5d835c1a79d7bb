#!/usr/bin/env bash
# Install what the end-to-end MCP tests need: a venv at .venv with the official MCP Python SDK
# (`mcp` from PyPI). Then: cargo build && .venv/bin/python tests/e2e/mcp_client.py
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's interpreter, not a pyenv shim on PATH.
PY=${PYTHON:-/usr/bin/python3}
if ! "$PY" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "setup-e2e: $PY lacks venv/ensurepip; installing python3-venv" >&2
    apt-get install -y python3-venv >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# cryptography: the OAuth checks of mcp_http_client.py sign ES256 tokens with PyJWT (an mcp dependency).
.venv/bin/pip install --quiet --disable-pip-version-check 'mcp>=1.10' cryptography
.venv/bin/python -c 'import mcp, importlib.metadata as m; print("setup-e2e: mcp", m.version("mcp"))'
