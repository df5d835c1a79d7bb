#!/usr/bin/env bash
# Link the sandbox helper `gearbox-jail` as a static PIE, in place, and print its path.
#
#   scripts/static-helper.sh            # target/debug/gearbox-jail
#   scripts/static-helper.sh --release  # target/release/gearbox-jail (scripts/setup.sh does this)
#
# Every sandbox starts a fresh helper. Linked statically (the C library in the binary, no
# dynamic loader, no shared libraries to map and relocate) it starts in ~0.5 ms less CPU and
# wall time than the same code linked dynamically (docs/PERFORMANCE.md). Position-independent
# all the same: the kernel still places it at a random address. Only the helper: it resolves
# no names and looks up no users, which a static C library cannot do reliably. The crates are
# built as usual; `-C target-feature=+crt-static` applies to this binary's link alone, so a
# later `cargo build` links the helper dynamically again (a correct helper, only slower).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=()
if [ "${1:-}" = "--release" ]; then profile=(--release); fi
helper=$(cargo rustc "${profile[@]}" --locked -p gearbox --bin gearbox-jail \
        --message-format=json-render-diagnostics -- -C target-feature=+crt-static \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "gearbox-jail" and m.get("executable"):
        print(m["executable"])')
if [ -z "$helper" ] || readelf -l "$helper" | grep -q 'program interpreter'; then
    echo "static-helper: $helper is not a static executable" >&2
    exit 1
fi
echo "$helper"
