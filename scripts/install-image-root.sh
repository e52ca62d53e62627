#!/usr/bin/env bash
# What tests/e2e/test_daemonset_e2e.py builds the nri-cdi image from, fetched here (install
# time) so that the tests download nothing:
#   - a Debian bookworm root made by debootstrap (--variant=minbase, plus python3 and
#     python3-pip), from the Debian mirror the system's apt already uses; the same content
#     as deploy/kubernetes/Dockerfile's base debian:bookworm-slim with python3 and pip
#     (like the slim image, without documentation, man pages, locales and apt's lists);
#   - the wheels of nri-cdi's dependencies with the extras the Dockerfile installs
#     (nvml, metrics), from PyPI.
# The project's own wheel is built at test time, from the checkout.
# Idempotent: a stamp naming the suite and packages makes a second run return at once
# (about a minute and 60 MB of downloads the first time).
#
# Cache folder: $NRI_CDI_IMAGE_CACHE, default <repo>/.cache/nri-cdi-image (git-ignored).
# Needs root (debootstrap, apt-get install debootstrap if missing).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${NRI_CDI_IMAGE_CACHE:-$REPO/.cache/nri-cdi-image}
PYTHON=${PYTHON:-python3}
SUITE=bookworm
INCLUDE=python3,python3-pip
ROOT=$CACHE/root
WHEELS=$CACHE/wheels
STAMP=$CACHE/.root-$SUITE-${INCLUDE//,/+}-v1

log() { echo "install-image-root: $*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=scripts/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

make_root() {
    [ "$(id -u)" = 0 ] || die "debootstrap needs root"
    command -v debootstrap >/dev/null || {
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    rm -rf "$ROOT.tmp" "$ROOT"
    log "debootstrap $SUITE (minbase + $INCLUDE) from $(debian_mirror)"
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOT.tmp" \
        "$(debian_mirror)" >"$CACHE/debootstrap.log" 2>&1 ||
        die "debootstrap failed, see $CACHE/debootstrap.log"
    # What the slim images leave out, and apt's downloads.
    rm -rf "$ROOT.tmp"/usr/share/{doc,man,info,locale} "$ROOT.tmp"/var/lib/apt/lists/* \
        "$ROOT.tmp"/var/cache/apt/*.bin "$ROOT.tmp"/var/cache/apt/archives/*.deb
    mv "$ROOT.tmp" "$ROOT"
}

download_wheels() {
    rm -rf "$WHEELS" && mkdir -p "$WHEELS"
    # The dependencies pyproject.toml names for the package and the two extras.
    mapfile -t reqs < <("$PYTHON" - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(project["dependencies"] + extras["nvml"] + extras["metrics"]))
EOF
)
    log "downloading wheels: ${reqs[*]}"
    "$PYTHON" -m pip download -q --only-binary :all: --python-version 3.11 \
        --platform manylinux2014_x86_64 -d "$WHEELS" "${reqs[@]}"
}

main() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9
    if ! { [ -f "$STAMP" ] && [ -x "$ROOT/usr/bin/python3" ] && [ -d "$WHEELS" ]; }; then
        make_root
        download_wheels
        touch "$STAMP"
    fi
    echo "image root: $ROOT (Debian $(cat "$ROOT/etc/debian_version" 2>/dev/null))"
    echo "wheels    : $WHEELS"
}

main "$@"
