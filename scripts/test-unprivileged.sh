#!/usr/bin/env bash
# Run the sandbox test binary as `nobody`: the Linux backend must isolate without root
# (user namespaces, no cgroups, rlimits instead). The binaries are copied to a directory
# nobody can read, since the build directory usually is not. With GEARBOX_TEST_POOL=1, every
# default-limits run goes through a helper-built warm sandbox (no fork servers without root).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cargo test --workspace --test sandbox --no-run --locked --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "sandbox" and m.get("executable"):
        print(m["executable"])')
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
dir=$(mktemp -d /tmp/gearbox-unpriv-XXXXXX)
trap 'rm -rf "$dir"' EXIT
cp "$bin" "$dir/sandbox-tests"
cp "$target_dir/debug/gearbox" "$dir/"
# The helper linked statically, as scripts/setup.sh installs it.
cp "$(bash scripts/static-helper.sh)" "$dir/gearbox-jail"
mkdir "$dir/tmp"
chmod 755 "$dir" "$dir/sandbox-tests" "$dir/gearbox" "$dir/gearbox-jail"
chmod 1777 "$dir/tmp"
cd "$dir"
setpriv --reuid=65534 --regid=65534 --clear-groups \
    env -i ${GEARBOX_TEST_POOL:+GEARBOX_TEST_POOL=1} PATH=/usr/local/bin:/usr/bin:/bin HOME="$dir/tmp" TMPDIR="$dir/tmp" \
    GEARBOX_BIN="$dir/gearbox" GEARBOX_EXPECT_STATIC_HELPER=1 ./sandbox-tests --test-threads=2
