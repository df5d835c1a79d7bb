#!/usr/bin/env bash
# Install the package installers gearbox runs outside the sandbox for `packages`:
# uv (from PyPI, into a tools venv) for Python, Debian's npm for JavaScript. Idempotent: a
# second run installs nothing.
#
#   scripts/setup-packages.sh     # uv at $GEARBOX_TOOLS_DIR/bin/uv (default
#                                 # /root/.cache/gearbox/tools/bin/uv when root,
#                                 # ~/.cache/gearbox/tools/bin/uv otherwise)
set -euo pipefail

TOOLS="${GEARBOX_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gearbox/tools}"
UV_VERSION="${GEARBOX_UV_VERSION:-0.9.*}"
say() { echo "setup-packages: $*" >&2; }

# Debian's python3 with venv (the tools venv) and npm (JavaScript packages; a nodejs that
# ships its own npm needs nothing more).
missing=()
dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q 'install ok installed' || missing+=(python3-venv)
command -v npm >/dev/null || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" -eq 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
command -v npm >/dev/null || say "npm is missing: JavaScript packages will be refused"

if [ -x "$TOOLS/bin/uv" ] && "$TOOLS/bin/uv" --version >/dev/null 2>&1; then
    say "uv present: $("$TOOLS/bin/uv" --version)"
    exit 0
fi
mkdir -p "$TOOLS"
if [ ! -x "$TOOLS/bin/python3" ]; then
    /usr/bin/python3 -m venv "$TOOLS"
fi
# pip's own configuration (find-links, index) of this machine applies to this one install.
"$TOOLS/bin/python3" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
say "installed $("$TOOLS/bin/uv" --version) at $TOOLS/bin/uv"
