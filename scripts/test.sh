#!/usr/bin/env bash
# The whole test suite, as CI runs it (`.ci/run` calls this). Installs what is missing first.
#
#   scripts/test.sh
#
# Steps: formatting check; every crate's unit and integration tests (real sandboxes, real
# MCP clients over stdio); the sandbox suite again as an unprivileged user; the end-to-end
# client of the official MCP Python SDK; clippy -D warnings on every target; the Kubernetes
# manifests and seccomp profile in deploy/, checked offline.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

GEARBOX_SKIP_BUILD=1 bash scripts/setup.sh
# The docker backend's engine and image; without them its tests skip loudly, with them a skip fails.
if bash scripts/setup-docker.sh; then export GEARBOX_DOCKER_REQUIRED=1; fi

echo "== the committed QuickJS guest is reproducible from guest/"
bash scripts/build-guest.sh --check

echo "== cargo fmt --check"
cargo fmt --all -- --check
# The fork server's native loop is compiled by build.rs, outside the crate's module tree.
rustfmt --check --edition 2024 crates/gearbox-sandbox/src/launchers/fork/*.rs

echo "== no module cycles in any crate"
python3 scripts/module-cycles.py

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

# As root, every check that needs root and cgroups must run: a skip fails (the
# unprivileged pass below starts from a clean environment and skips them).
if [ "$(id -u)" -eq 0 ]; then export GEARBOX_SANDBOX_REQUIRED=1; fi

echo "== cargo test (as $(id -un))"
cargo test --workspace --exclude gearbox-docker --locked

echo "== docker backend suite (real engine; a fresh container per run)"
cargo test -p gearbox-docker --locked
if [ -n "${GEARBOX_DOCKER_REQUIRED:-}" ] && [ -n "$(docker ps -aq --filter label=dev.gearbox.backend=docker)" ]; then
    echo "docker: containers left behind:"; docker ps -a --filter label=dev.gearbox.backend=docker; exit 1
fi

echo "== sandbox suite again, every default-limits run through a warm (pooled) sandbox, with the"
echo "   helper linked statically as scripts/setup.sh installs it (the pass above: dynamically)"
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
static_dir=$(mktemp -d /tmp/gearbox-static-XXXXXX)
trap 'rm -rf "$static_dir"' EXIT
cargo build --locked -p gearbox
cp "$target_dir/debug/gearbox" "$static_dir/"
cp "$(bash scripts/static-helper.sh)" "$static_dir/gearbox-jail"
GEARBOX_TEST_POOL=1 GEARBOX_BIN="$static_dir/gearbox" GEARBOX_EXPECT_STATIC_HELPER=1 \
    cargo test --workspace --test sandbox --locked

if [ "$(id -u)" -eq 0 ]; then
    echo "== sandbox suite as an unprivileged user"
    bash scripts/test-unprivileged.sh
    echo "== sandbox suite as an unprivileged user, every default-limits run through a helper-built"
    echo "   warm sandbox"
    GEARBOX_TEST_POOL=1 bash scripts/test-unprivileged.sh
fi

echo "== end-to-end: official MCP Python SDK over stdio"
.venv/bin/python tests/e2e/mcp_client.py --gearbox "$target_dir/debug/gearbox"

echo "== end-to-end: official MCP Python SDK over HTTP (Streamable HTTP and SSE)"
.venv/bin/python tests/e2e/mcp_http_client.py --gearbox "$target_dir/debug/gearbox"

echo "== deploy/: manifests against the Kubernetes API schemas (strict), the pod's security profile, the seccomp profile"
bash scripts/setup-deploy-check.sh
.venv-deploy/bin/python scripts/check-deploy.py --gearbox "$target_dir/debug/gearbox"
echo "== deploy/ check's self-test: broken manifests and profiles are caught"
.venv-deploy/bin/python scripts/check-deploy.py --self-test --gearbox "$target_dir/debug/gearbox"
if [ "$(id -u)" -eq 0 ]; then
    echo "== the pod's settings for real: the sandbox inside runc with the pod's user namespace, seccomp profile and /proc"
    python3 scripts/check-pod-profile.py --gearbox "$target_dir/debug/gearbox"
fi
