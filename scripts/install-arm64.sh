#!/usr/bin/env bash
# What the arm64 tests need on an amd64 machine (tests/arm64.py says which tests), nothing
# system-wide:
#   - Debian sid's qemu-user (its qemu-aarch64 is a static binary, what qemu-user-static
#     shipped before sid merged the two), unpacked with dpkg -x into $CACHE/qemu. Not
#     bookworm's 7.2 nor trixie's 10.0: their linux-user answers ENOSYS to fsopen, fsconfig,
#     fsmount and mount_setattr, which the disable-device-node-modification hook calls;
#   - an arm64 root: bookworm's arm64 libc6, libc-bin (ldconfig), busybox-static and
#     python3 with their dependencies, resolved and downloaded by apt with a private
#     configuration (own sources list, lists, cache and an empty dpkg status, arm64 as the
#     native architecture) and unpacked with dpkg -x into $CACHE/root. Nothing is
#     configured: no maintainer script runs (they would need the emulator).
# NVIDIA's arm64 driver comes from scripts/install-nvidia-debian.sh --arch arm64, the aarch64
# cross compiler (gcc-aarch64-linux-gnu) from scripts/setup.sh.
# Registering the emulator with binfmt_misc, which the arm64 containers need, is a
# system-wide change that this script does not make: the tests make it for their run and
# undo it (tests/e2e/binfmt.py).
# Idempotent: a stamp makes a second run return at once; a failed run leaves no stamp.
#
# Cache folder: $NRI_CDI_ARM64_CACHE, default <repo>/.cache/arm64 (git-ignored).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${NRI_CDI_ARM64_CACHE:-$REPO/.cache/arm64}
ROOT_SUITE=bookworm
ROOT_PACKAGES=(libc6 libc-bin busybox-static python3)
QEMU_SUITE=sid
# Bump when the package set or the layout of the cache changes.
STAMP=$CACHE/.installed-v2

log() { echo "install-arm64: $*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=scripts/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

# A private apt configuration in $CACHE/apt-$1 for suite $1, native architecture $2.
apt_opts() {
    local a=$CACHE/apt-$1
    printf '%s\n' -o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=/dev/null" \
        -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o APT::Sandbox::User=root \
        -o "APT::Architecture=$2" -o "APT::Architectures::=$2" -o "Dir::State::Status=$a/status"
}

apt_update() {
    local suite=$1 a=$CACHE/apt-$1 o
    mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
    : >"$a/status"
    echo "deb $(debian_mirror) $suite main" >"$a/sources.list"
    mapfile -t o < <(apt_opts "$suite" "$2")
    log "fetching $suite package lists (private apt config in $a)"
    apt-get "${o[@]}" -qq update
}

download_qemu() {
    local debs=$CACHE/debs-qemu o version
    rm -rf "$debs" && mkdir -p "$debs"
    apt_update "$QEMU_SUITE" amd64
    mapfile -t o < <(apt_opts "$QEMU_SUITE" amd64)
    version=$(apt-cache "${o[@]}" madison qemu-user | awk -F'|' '{gsub(/ /, "", $2); print $2; exit}')
    [ -n "$version" ] || die "$QEMU_SUITE carries no qemu-user"
    log "downloading qemu-user $version"
    (cd "$debs" && apt-get "${o[@]}" -qq download "qemu-user=$version") ||
        die "apt-get download qemu-user=$version failed"
    rm -rf "$CACHE/qemu.tmp" && mkdir -p "$CACHE/qemu.tmp"
    dpkg -x "$debs"/qemu-user_*.deb "$CACHE/qemu.tmp"
    # Only the aarch64 emulator and its binfmt_misc line are kept (the package has one per
    # architecture).
    find "$CACHE/qemu.tmp" \( -type f -o -type l \) ! -path '*/usr/bin/qemu-aarch64' \
        ! -path '*/binfmt.d/qemu-aarch64.conf' -delete
    [ -f "$CACHE/qemu.tmp/usr/share/qemu/binfmt.d/qemu-aarch64.conf" ] ||
        die "qemu-user $version has no usr/share/qemu/binfmt.d/qemu-aarch64.conf"
    "$CACHE/qemu.tmp/usr/bin/qemu-aarch64" --version | head -1 >"$CACHE/qemu.tmp/VERSION" ||
        die "the unpacked qemu-aarch64 does not run"
    rm -rf "$CACHE/qemu" && mv "$CACHE/qemu.tmp" "$CACHE/qemu"
    rm -rf "$debs"
}

download_root() {
    local debs=$CACHE/debs-root o want
    rm -rf "$debs" && mkdir -p "$debs"
    apt_update "$ROOT_SUITE" arm64
    mapfile -t o < <(apt_opts "$ROOT_SUITE" arm64)
    # What apt would install on an empty arm64 system: the packages and their dependencies.
    mapfile -t want < <(apt-get "${o[@]}" -s install --no-install-recommends "${ROOT_PACKAGES[@]}" |
        awk '$1 == "Inst" {gsub(/[()]/, "", $3); print $2 "=" $3}')
    [ ${#want[@]} -gt ${#ROOT_PACKAGES[@]} ] || die "apt resolved no dependencies for ${ROOT_PACKAGES[*]}"
    log "downloading ${#want[@]} arm64 packages (${ROOT_PACKAGES[*]} and their dependencies)"
    (cd "$debs" && apt-get "${o[@]}" -qq download "${want[@]}") || die "apt-get download failed"
    local tmp=$CACHE/root.tmp deb
    rm -rf "$tmp" && mkdir -p "$tmp"
    # As the packages lay their files out (bookworm's ship /lib, /bin and /sbin; dpkg -x
    # would replace merged-/usr links with folders).
    for deb in "$debs"/*.deb; do
        dpkg -x "$deb" "$tmp"
    done
    printf '%s\n' "${want[@]}" >"$tmp/.packages"
    [ -e "$tmp/lib/ld-linux-aarch64.so.1" ] && [ -x "$tmp/usr/bin/python3" ] &&
        [ -x "$tmp/bin/busybox" ] && [ -x "$tmp/sbin/ldconfig" ] ||
        die "the arm64 root lacks the loader, python3, busybox or ldconfig"
    rm -rf "$CACHE/root" && mv "$tmp" "$CACHE/root"
    rm -rf "$debs"
}

main() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9
    if ! [ -f "$STAMP" ]; then
        download_qemu
        download_root
        touch "$STAMP"
    fi
    cat <<EOF
qemu-aarch64 : $CACHE/qemu/usr/bin/qemu-aarch64  ($(cat "$CACHE/qemu/VERSION"); not registered)
arm64 root   : $CACHE/root  (Debian $ROOT_SUITE: ${ROOT_PACKAGES[*]} and their dependencies)
cache folder : $CACHE  (override with NRI_CDI_ARM64_CACHE)
EOF
}

main "$@"
