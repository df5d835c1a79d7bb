#!/usr/bin/env bash
# Build the QuickJS guest (guest/quickjs) for wasm32-wasip1 and copy it to
# crates/gearbox-wasm/guest/quickjs.wasm, the module the wasm backend embeds.
# Installs nothing: run scripts/setup-wasm.sh first. Prints the module's sha256.
#
#   scripts/build-guest.sh            build and copy
#   scripts/build-guest.sh --check    build and fail if the committed module differs
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GUEST="$ROOT/guest/quickjs"
OUT="$ROOT/crates/gearbox-wasm/guest/quickjs.wasm"
TARGET_DIR="${GEARBOX_GUEST_TARGET_DIR:-$ROOT/target/guest}"
mkdir -p "$TARGET_DIR" && TARGET_DIR="$(cd "$TARGET_DIR" && pwd)"

# Debian ships wasi-libc under /usr/{include,lib}/wasm32-wasi; clang wants one sysroot with
# both (without --sysroot, host glibc headers leak into the build).
SYSROOT="$TARGET_DIR/wasi-sysroot"
mkdir -p "$SYSROOT"
ln -sfn /usr/include/wasm32-wasi "$SYSROOT/include"
ln -sfn /usr/lib/wasm32-wasi "$SYSROOT/lib"
for need in /usr/include/wasm32-wasi /usr/lib/wasm32-wasi; do
    [ -d "$need" ] || { echo "build-guest: $need missing: run scripts/setup-wasm.sh" >&2; exit 1; }
done
command -v clang-16 >/dev/null || { echo "build-guest: clang-16 missing: run scripts/setup-wasm.sh" >&2; exit 1; }

export CC_wasm32_wasip1=clang-16
# Any llvm-ar reads wasm objects; prefer the one matching clang-16.
AR_TOOL="$(command -v llvm-ar-16 || command -v llvm-ar || true)"
[ -n "$AR_TOOL" ] || { echo "build-guest: llvm-ar missing: run scripts/setup-wasm.sh" >&2; exit 1; }
export AR_wasm32_wasip1="$AR_TOOL"
export CFLAGS_wasm32_wasip1="--sysroot=$SYSROOT"
# Otherwise rquickjs-sys downloads wasi-sdk from the internet.
export RQUICKJS_SYS_NO_WASI_SDK=1
# Reproducible output: no absolute paths of this checkout, of the target directory (the C
# sources' __FILE__ lives there) or of ~/.cargo in the module. For rustc the last matching
# remap wins; clang prefers the longest prefix.
CARGO_DIR="${CARGO_HOME:-$HOME/.cargo}"
export RUSTFLAGS="--remap-path-prefix=$ROOT=/gearbox --remap-path-prefix=$CARGO_DIR=/cargo --remap-path-prefix=$TARGET_DIR=/target"
export CFLAGS_wasm32_wasip1="$CFLAGS_wasm32_wasip1 -ffile-prefix-map=$ROOT=/gearbox -ffile-prefix-map=$CARGO_DIR=/cargo -ffile-prefix-map=$TARGET_DIR=/target"
export SOURCE_DATE_EPOCH=0

cargo build --release --locked --target wasm32-wasip1 \
    --manifest-path "$GUEST/Cargo.toml" --target-dir "$TARGET_DIR" >&2
BUILT="$TARGET_DIR/wasm32-wasip1/release/gearbox-quickjs-guest.wasm"

if [ "${1:-}" = "--check" ]; then
    if ! cmp -s "$BUILT" "$OUT"; then
        echo "build-guest: $OUT differs from a fresh build of guest/quickjs" >&2
        sha256sum "$BUILT" "$OUT" >&2
        exit 1
    fi
    echo "build-guest: $OUT is reproducible" >&2
else
    mkdir -p "$(dirname "$OUT")"
    cp "$BUILT" "$OUT"
fi
sha256sum "$OUT"
