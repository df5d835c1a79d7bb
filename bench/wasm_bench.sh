#!/usr/bin/env bash
# console.log(1) through the wasm backend (in-process) vs bare `node -e`, interleaved, in one
# run: median and p90 over RUNS (default 300). See crates/gearbox-wasm/examples/bench.rs.
#   bench/wasm_bench.sh [RUNS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The inherited NODE_EXTRA_CA_CERTS doubles node's start-up; the bench clears node's env.
exec cargo run --quiet --release -p gearbox-wasm --example bench -- "${1:-300}"
