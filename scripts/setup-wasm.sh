#!/usr/bin/env bash
# Install what scripts/build-guest.sh needs to build the QuickJS guest (guest/quickjs) for
# wasm32-wasip1: Debian's clang-16 + lld-16 + the wasm32 compiler runtime + wasi-libc, and the
# Rust wasm32-wasip1 target. Idempotent: does nothing when everything is present.
set -euo pipefail

PACKAGES=(clang-16 lld-16 libclang-rt-16-dev-wasm32 wasi-libc)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
# build-guest.sh needs an llvm-ar (any version reads wasm objects): llvm-16 has llvm-ar-16.
if ! command -v llvm-ar-16 >/dev/null && ! command -v llvm-ar >/dev/null; then
    missing+=(llvm-16)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "setup-wasm: installing ${missing[*]}" >&2
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! rustup target list --installed | grep -qx wasm32-wasip1; then
    echo "setup-wasm: adding the Rust target wasm32-wasip1" >&2
    rustup target add wasm32-wasip1
fi
echo "setup-wasm: ok" >&2
