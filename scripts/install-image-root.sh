#!/usr/bin/env bash
# What tests/e2e/test_daemonset_e2e.py builds the nri-cdi images from, amd64 and arm64,
# fetched here (install time) so that the tests download nothing:
#   - amd64: a Debian bookworm root made by debootstrap (--variant=minbase, plus python3 and
#     python3-pip), from the Debian mirror the system's apt already uses; the same content
#     as deploy/kubernetes/Dockerfile's base debian:bookworm-slim with python3 and pip
#     (like the slim image, without documentation, man pages, locales and apt's lists);
#   - arm64: the same package set (minbase's: every Priority: required package and apt, and
#     python3 and python3-pip) for arm64, resolved by apt with a private configuration
#     (arm64 native, an empty dpkg status) and unpacked with dpkg -x. Unlike debootstrap's
#     second stage nothing of it runs, so no emulator is needed: the maintainer scripts are
#     not run, and of what they make only /etc/passwd and /etc/group are made here (from
#     base-passwd's masters, as its postinst does on an install);
#   - the wheels of nri-cdi's dependencies with the extras the Dockerfile installs
#     (nvml, metrics, kubelet), from PyPI, for each architecture (pip download --platform
#     manylinux2014_x86_64 / manylinux2014_aarch64).
# The project's own wheel is built at test time, from the checkout.
# Idempotent: a stamp per architecture naming the suite and packages makes a second run
# return at once (about a minute and 60 MB of downloads each the first time).
#
# usage: install-image-root.sh [--arch amd64|arm64]   (default: both)
# Cache folder: $NRI_CDI_IMAGE_CACHE, default <repo>/.cache/nri-cdi-image (git-ignored):
# amd64 in root/ and wheels/, arm64 in arm64/root/ and arm64/wheels/.
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
ARM64=$CACHE/arm64
STAMP_ARM64=$ARM64/.root-$SUITE-${INCLUDE//,/+}-v1
# pip's platform tag for each architecture's wheels
declare -A WHEEL_PLATFORM=([amd64]=manylinux2014_x86_64 [arm64]=manylinux2014_aarch64)

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

make_root_unpacked() {
    local arch=$1 dest=$2 a=$2.apt o required want deb
    mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$a/debs"
    : >"$a/status"
    echo "deb $(debian_mirror) $SUITE main" >"$a/sources.list"
    o=(-o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o APT::Sandbox::User=root
        -o "APT::Architecture=$arch" -o "APT::Architectures::=$arch"
        -o "Dir::State::Status=$a/status")
    log "fetching $SUITE $arch package lists (private apt config in $a)"
    apt-get "${o[@]}" -qq update
    # debootstrap --variant=minbase's set: the required packages and apt.
    mapfile -t required < <(apt-cache "${o[@]}" dumpavail |
        awk '/^Package: / {p = $2} /^Priority: required$/ {print p}' | sort -u)
    [ ${#required[@]} -gt 10 ] || die "no Priority: required packages in the $arch lists"
    mapfile -t want < <(apt-get "${o[@]}" -s install --no-install-recommends \
        "${required[@]}" apt ${INCLUDE//,/ } |
        awk '$1 == "Inst" {gsub(/[()]/, "", $3); print $2 "=" $3}')
    log "downloading ${#want[@]} $arch packages (minbase + $INCLUDE)"
    (cd "$a/debs" && apt-get "${o[@]}" -qq download "${want[@]}") ||
        die "apt-get download of the $arch packages failed"
    rm -rf "$dest.tmp" "$dest" && mkdir -p "$dest.tmp"
    for deb in "$a"/debs/*.deb; do
        dpkg -x "$deb" "$dest.tmp"
    done
    # What base-passwd's postinst makes on an install.
    cp "$dest.tmp/usr/share/base-passwd/passwd.master" "$dest.tmp/etc/passwd"
    cp "$dest.tmp/usr/share/base-passwd/group.master" "$dest.tmp/etc/group"
    printf '%s\n' "${want[@]}" >"$dest.tmp/.packages"
    rm -rf "$dest.tmp"/usr/share/{doc,man,info,locale}
    [ -x "$dest.tmp/usr/bin/python3" ] && [ -f "$dest.tmp/usr/bin/pip" ] ||
        die "the $arch root has no python3 or pip"
    mv "$dest.tmp" "$dest"
    rm -rf "$a"
}

# The dependencies pyproject.toml names for the package and the extras the Dockerfile
# installs, one a line.
requirements() {
    "$PYTHON" - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
extras = project["optional-dependencies"]
print("\n".join(project["dependencies"] + extras["nvml"] + extras["metrics"]
                + extras["kubelet"]))
EOF
}

# Each architecture's wheels, downloaded again when the requirements changed.
download_wheels() {
    local arch=$1 wheels=$2 want
    want=$(requirements)
    [ -d "$wheels" ] && [ "$(cat "$wheels/.requirements" 2>/dev/null)" = "$want" ] && return 0
    rm -rf "$wheels" && mkdir -p "$wheels"
    mapfile -t reqs <<<"$want"
    log "downloading $arch wheels (${WHEEL_PLATFORM[$arch]}): ${reqs[*]}"
    "$PYTHON" -m pip download -q --only-binary :all: --python-version 3.11 \
        --platform "${WHEEL_PLATFORM[$arch]}" -d "$wheels" "${reqs[@]}"
    printf '%s\n' "$want" >"$wheels/.requirements"
}

main() {
    local arches=(amd64 arm64)
    case "${1:-}" in
    "") ;;
    --arch) arches=("${2:-}") ;;
    --arch=*) arches=("${1#--arch=}") ;;
    *) die "usage: $0 [--arch amd64|arm64]" ;;
    esac
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9
    local arch
    for arch in "${arches[@]}"; do
        case $arch in
        amd64)
            if ! { [ -f "$STAMP" ] && [ -x "$ROOT/usr/bin/python3" ]; }; then
                make_root
                touch "$STAMP"
            fi
            download_wheels amd64 "$WHEELS"
            echo "amd64 image root: $ROOT (Debian $(cat "$ROOT/etc/debian_version" 2>/dev/null))"
            echo "amd64 wheels    : $WHEELS" ;;
        arm64)
            if ! { [ -f "$STAMP_ARM64" ] && [ -x "$ARM64/root/usr/bin/python3" ]; }; then
                mkdir -p "$ARM64"
                make_root_unpacked arm64 "$ARM64/root"
                touch "$STAMP_ARM64"
            fi
            download_wheels arm64 "$ARM64/wheels"
            echo "arm64 image root: $ARM64/root (Debian $(cat "$ARM64/root/etc/debian_version" 2>/dev/null), unpacked)"
            echo "arm64 wheels    : $ARM64/wheels" ;;
        *) die "unknown --arch '$arch' (amd64 or arm64)" ;;
        esac
    done
}

main "$@"
