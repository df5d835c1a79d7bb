#!/usr/bin/env bash
# Times the static analysis (crates/gearbox-analysis) per language on a small snippet and a
# 2000-line file; prints a markdown table of medians. Release build.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo run --quiet --release -p gearbox-analysis --example analysis_bench
