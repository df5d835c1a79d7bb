#!/usr/bin/env bash
# Make a Docker engine answer on /var/run/docker.sock and make sure the docker backend's
# default images exist: gearbox/python:bookworm (Python, Bash) and gearbox/runtimes:bookworm
# (Node for JavaScript, Go). Idempotent: installs Debian's docker.io and debootstrap only when
# missing, starts dockerd only when no engine answers, builds an image only when absent (the
# engine's data root, /var/lib/docker, keeps them between runs on the same machine).
#
#   scripts/setup-docker.sh            # exit 0: engine up and images present
#                                      # exit 1: the engine cannot start here (reason printed)
#
# No registry is reachable, so the images are built without one: a minimal Debian root made by
# debootstrap from the mirror apt is configured with, trimmed, then `docker import`ed.
set -euo pipefail

# The backend's default images: Python and Bash run in the first, JavaScript (Node) and Go
# in the second (crates/gearbox-docker/src/config.rs names them).
PYTHON_IMAGE="gearbox/python:bookworm"
RUNTIMES_IMAGE="gearbox/runtimes:bookworm"
LOG_DIR="${GEARBOX_DOCKER_LOG_DIR:-/var/log}"
DOCKERD_LOG="$LOG_DIR/gearbox-dockerd.log"

say() { echo "setup-docker: $*" >&2; }
fail() {
    echo "setup-docker: THE DOCKER ENGINE IS NOT AVAILABLE: $*" >&2
    exit 1
}

if [ "$(id -u)" -ne 0 ]; then
    fail "starting dockerd needs root (running as $(id -un))"
fi

# Debian's docker.io ships /usr/bin/docker; a client elsewhere on PATH may be of another
# version, so prefer Debian's.
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null || fail "apt-get install ${missing[*]} failed"
fi
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker) || fail "no docker client after installing docker.io"

engine_answers() { timeout 10 "$DOCKER" version --format '{{.Server.APIVersion}}' >/dev/null 2>&1; }

if ! engine_answers; then
    # A dockerd killed without cleanup leaves its pid file behind and refuses to start again.
    for pidfile in /var/run/docker.pid /run/docker/containerd/containerd.pid; do
        if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null; then
            rm -f "$pidfile"
        fi
    done
    say "starting dockerd (data root /var/lib/docker, log $DOCKERD_LOG)"
    mkdir -p "$LOG_DIR"
    # setsid: the engine outlives this script and the shell that ran it.
    setsid nohup dockerd --data-root /var/lib/docker >"$DOCKERD_LOG" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
        engine_answers && break
        sleep 0.5
    done
    if ! engine_answers; then
        tail -n 20 "$DOCKERD_LOG" >&2 || true
        fail "dockerd did not answer within 30 s (log above, full log in $DOCKERD_LOG)"
    fi
fi
say "engine answers (API $("$DOCKER" version --format '{{.Server.APIVersion}}'))"

# The mirror apt already uses (deb822 sources first, then the one-line format).
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
        /etc/apt/sources.list.d/debian.sources)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror=$(awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list)
fi

# build_image NAME PACKAGES: a minimal Debian root with PACKAGES (comma-separated), trimmed,
# imported as NAME; nothing when NAME exists.
build_image() {
    local image=$1 packages=$2
    if "$DOCKER" image inspect "$image" >/dev/null 2>&1; then
        say "image $image present"
        return 0
    fi
    [ -n "$mirror" ] || fail "no Debian mirror found in apt's sources to build $image from"
    say "building $image ($packages) with debootstrap from the mirror apt uses (a minute or two)"
    local root
    root=$(mktemp -d /var/tmp/gearbox-image.XXXXXX)
    if ! debootstrap --variant=minbase --include="$packages" bookworm "$root" "$mirror" \
        >"$root.log" 2>&1; then
        tail -n 20 "$root.log" >&2 || true
        rm -rf "$root" "$root.log"
        fail "debootstrap failed, so $image cannot be built"
    fi
    rm -f "$root.log"
    # Trim what a run never needs: apt's lists and caches, documentation, locales.
    rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
        "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
        "$root"/var/log/* "$root"/tmp/*
    mkdir -p "$root/workspace"
    if ! tar --numeric-owner -C "$root" -c . |
        "$DOCKER" import --change 'WORKDIR /workspace' \
            --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' - "$image" >/dev/null; then
        rm -rf "$root"
        fail "docker import of $image failed"
    fi
    rm -rf "$root"
    say "image $image built ($("$DOCKER" image inspect --format '{{.Size}}' "$image") bytes)"
}

build_image "$PYTHON_IMAGE" python3
build_image "$RUNTIMES_IMAGE" nodejs,golang-go
