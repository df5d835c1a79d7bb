#!/usr/bin/env bash
# The longer run of the property tests (fuzzing on stable Rust with proptest) of everything a
# hostile party feeds gearbox: tool arguments, the helper's wire frames, the broker's line
# protocol, file, session and snippet names, session resource URIs, the workspace stream,
# package specifiers. The test suite runs each with a bounded number of cases; this raises it.
#
#   scripts/fuzz.sh              # 20000 cases per property
#   scripts/fuzz.sh 200000       # more
#
# A failing case is shrunk and saved under proptest-regressions/ beside its source file:
# commit it, and the suite replays it first from then on.
#
# See docs/SECURITY.md, "What is fuzzed".
set -euo pipefail
cd "$(dirname "$0")/.."
cases="${1:-20000}"
case "$cases" in '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [cases]" >&2; exit 2 ;; esac
export CARGO_TERM_COLOR=never
echo "== property tests, $cases cases each"
start=$(date +%s)
PROPTEST_CASES="$cases" cargo test --workspace --exclude gearbox-docker --locked --lib -- proptests
echo "== done in $(( $(date +%s) - start )) s"
