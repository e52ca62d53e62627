#!/usr/bin/env bash
# Install NVIDIA's real driver user space as Debian ships it, as a test node root
# (tests/nvidia/test_real_driver.py, tests/e2e/test_real_driver_e2e.py and
# test_docker_cdi_e2e.py; with --arch arm64, the arm64 driver of tests/arm64.py), nothing
# system-wide:
#   - Debian sid non-free's driver $DRIVER_VERSION packages (amd64, and the i386 ones where
#     they exist) plus the glx-alternatives and the EGL platform libraries they depend on,
#     downloaded with a private apt configuration (own sources list with the non-free
#     components, own lists and package cache) into $CACHE/debs;
#   - unpacked with dpkg -x into $CACHE/root (Debian's own layout: merged /usr, libraries in
#     /usr/lib/<triplet>/nvidia/current, nvidia-smi in /usr/lib/nvidia/current);
#   - the install-time links made by RUNNING the packages' own maintainer scripts (postinst
#     configure, then the triggers they raise; scripts/debian_maintscripts.py), chrooted into
#     the root with busybox and the host's real update-alternatives, so every
#     /etc/alternatives link is made the way dpkg makes it on an install;
#   - docker.io and docker-cli 28.5 (sid) unpacked into $CACHE/docker, the third CDI consumer.
# The kernel side (/proc/driver/nvidia, device nodes) is simulated by the tests themselves.
# Idempotent: a stamp makes a second run return at once; a failed run leaves no stamp.
#
# --arch arm64: the same driver's arm64 packages (no i386 ones, no docker), whose
# maintainer scripts are shell scripts and run as the amd64 ones do.
#
# Cache folder: $NRI_CDI_NVIDIA_CACHE, default <repo>/.cache/nvidia-debian (git-ignored);
# for arm64 $NRI_CDI_NVIDIA_ARM64_CACHE, default <repo>/.cache/nvidia-debian-arm64.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ARCH=amd64
case "${1:-}" in
"") ;;
--arch=amd64 | --arch=arm64) ARCH=${1#--arch=} ;;
--arch) ARCH=${2:-} ;;
*) echo "usage: $0 [--arch amd64|arm64]" >&2; exit 2 ;;
esac
case $ARCH in
amd64) CACHE=${NRI_CDI_NVIDIA_CACHE:-$REPO/.cache/nvidia-debian} TRIPLET=x86_64-linux-gnu ;;
arm64) CACHE=${NRI_CDI_NVIDIA_ARM64_CACHE:-$REPO/.cache/nvidia-debian-arm64}
    TRIPLET=aarch64-linux-gnu ;;
*) echo "install-nvidia-debian: unknown --arch '$ARCH' (amd64 or arm64)" >&2; exit 2 ;;
esac
# The upstream driver the expectations in tests/data/nvidia-debian-<version>/ were made
# from. Its Debian revision, and docker.io's version, are whatever sid carries when the
# cache is filled (a new upload of either must not break the suite); both are recorded.
DRIVER_VERSION=550.163.01
DEB_VERSION=
DOCKER_VERSION=
# Bump when the package set or the layout of the cache changes.
STAMP=$CACHE/.installed-$DRIVER_VERSION-v2
ROOT=$CACHE/root
DOCKER=$CACHE/docker
SUITE=sid
PYTHON=${PYTHON:-python3}

# The driver's user-space packages (source nvidia-graphics-drivers at $DEB_VERSION), without
# the kernel module sources (nvidia-kernel-dkms/-source: the kernel side is simulated) and
# without the installer helpers (nvidia-detect, nvidia-legacy-check).
DRIVER_AMD64=(firmware-nvidia-gsp libcuda1 libcudadebugger1 libegl-nvidia0
    libgl1-nvidia-glvnd-glx libgles-nvidia1 libgles-nvidia2 libglx-nvidia0 libnvcuvid1
    libnvidia-allocator1 libnvidia-api1 libnvidia-cfg1 libnvidia-eglcore libnvidia-encode1
    libnvidia-fbc1 libnvidia-glcore libnvidia-glvkspirv libnvidia-gpucomp libnvidia-ml1
    libnvidia-ngx1 libnvidia-nvvm4 libnvidia-opticalflow1 libnvidia-pkcs11-openssl3
    libnvidia-ptxjitcompiler1 libnvidia-rtcore libnvoptix1 nvidia-alternative nvidia-cuda-mps
    nvidia-driver nvidia-driver-bin nvidia-driver-libs nvidia-egl-common nvidia-egl-icd
    nvidia-kernel-support nvidia-libopencl1 nvidia-opencl-common nvidia-opencl-icd
    nvidia-powerd nvidia-smi nvidia-suspend-common nvidia-vdpau-driver nvidia-vulkan-common
    nvidia-vulkan-icd xserver-xorg-video-nvidia)
DRIVER_I386=(libcuda1 libegl-nvidia0 libgl1-nvidia-glvnd-glx libgles-nvidia1 libgles-nvidia2
    libglx-nvidia0 libnvcuvid1 libnvidia-allocator1 libnvidia-eglcore libnvidia-encode1
    libnvidia-fbc1 libnvidia-glcore libnvidia-glvkspirv libnvidia-gpucomp libnvidia-ml1
    libnvidia-nvvm4 libnvidia-opticalflow1 libnvidia-ptxjitcompiler1 nvidia-egl-icd
    nvidia-libopencl1 nvidia-opencl-icd nvidia-vdpau-driver nvidia-vulkan-icd)
# Not from the driver's source, at whatever version sid carries: the alternatives machinery
# (glx-alternative-nvidia's postinst makes the GLX/EGL/GBM links) and the EGL platforms.
OTHERS=(glx-alternative-nvidia glx-alternative-mesa glx-diversions update-glx
    libnvidia-egl-gbm1 libnvidia-egl-wayland1)
OTHERS_I386=(libnvidia-egl-gbm1 libnvidia-egl-wayland1)
DOCKER_PACKAGES=(docker.io docker-cli)
# What the arm64 build of the driver's source does not produce.
NOT_ARM64=(libnvidia-ngx1 libnvidia-pkcs11-openssl3)

log() { echo "install-nvidia-debian: $*" >&2; }
die() { log "error: $*"; exit 1; }

# shellcheck source=scripts/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

apt_opts() {
    local a=$CACHE/apt
    printf '%s\n' -o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=/dev/null" \
        -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache" -o APT::Sandbox::User=root \
        -o "Dir::State::Status=$a/status"
    if [ "$ARCH" = amd64 ]; then
        printf '%s\n' -o "APT::Architectures::=amd64" -o "APT::Architectures::=i386"
    else
        printf '%s\n' -o "APT::Architecture=$ARCH" -o "APT::Architectures::=$ARCH"
    fi
}

download() {
    local a=$CACHE/apt debs=$CACHE/debs
    if [ -f "$debs/.complete-$DRIVER_VERSION" ]; then
        read -r DEB_VERSION DOCKER_VERSION <"$debs/.versions"
        return 0
    fi
    mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$debs"
    : >"$a/status"
    echo "deb $(debian_mirror) $SUITE main contrib non-free non-free-firmware" >"$a/sources.list"
    local o
    mapfile -t o < <(apt_opts)
    log "fetching $SUITE package lists (private apt config in $a)"
    apt-get "${o[@]}" -qq update
    DEB_VERSION=$(newest "$DRIVER_VERSION-" libcuda1 "${o[@]}")
    [ -n "$DEB_VERSION" ] || die "$SUITE no longer carries driver $DRIVER_VERSION (libcuda1):" \
        "move DRIVER_VERSION and tests/data/nvidia-debian-$DRIVER_VERSION to one it carries"
    local want=() p
    if [ "$ARCH" = amd64 ]; then
        DOCKER_VERSION=$(newest "" docker.io "${o[@]}")
        for p in "${DRIVER_AMD64[@]}"; do want+=("$p:amd64=$DEB_VERSION"); done
        for p in "${DRIVER_I386[@]}"; do want+=("$p:i386=$DEB_VERSION"); done
        for p in "${OTHERS[@]}"; do want+=("$p:amd64"); done
        for p in "${OTHERS_I386[@]}"; do want+=("$p:i386"); done
        for p in "${DOCKER_PACKAGES[@]}"; do want+=("$p:amd64"); done
    else
        DOCKER_VERSION=none
        for p in "${DRIVER_AMD64[@]}"; do
            [[ " ${NOT_ARM64[*]} " == *" $p "* ]] || want+=("$p:$ARCH=$DEB_VERSION")
        done
        for p in "${OTHERS[@]}"; do want+=("$p:$ARCH"); done
    fi
    log "downloading ${#want[@]} packages (driver $DEB_VERSION, docker $DOCKER_VERSION)"
    local t0=$SECONDS
    (cd "$debs" && apt-get "${o[@]}" -qq download "${want[@]}") ||
        die "apt-get download failed: driver $DEB_VERSION, docker $DOCKER_VERSION (see $a)"
    log "downloaded $(ls "$debs"/*.deb | wc -l) files, $(du -sm "$debs" | cut -f1) MB in $((SECONDS - t0)) s"
    echo "$DEB_VERSION $DOCKER_VERSION" >"$debs/.versions"
    touch "$debs/.complete-$DRIVER_VERSION"
}

# The newest version of package $2 that sid carries and that starts with $1 (apt-cache
# madison lists the newest first); empty when there is none.
newest() {
    local prefix=$1 package=$2
    shift 2
    apt-cache "$@" madison "$package" |
        awk -F'|' -v p="$prefix" '{gsub(/ /, "", $2)} index($2, p) == 1 {print $2; exit}'
}

is_docker_deb() { case "$(basename "$1")" in docker.io_* | docker-cli_*) return 0 ;; esac; return 1; }

unpack() {
    local tmp=$ROOT.tmp deb debs=()
    rm -rf "$tmp"
    mkdir -p "$tmp"
    # Merged /usr, as Debian installs it.
    for d in bin sbin lib lib32 lib64; do
        mkdir -p "$tmp/usr/$d"
        ln -s "usr/$d" "$tmp/$d"
    done
    for deb in "$CACHE"/debs/*.deb; do
        is_docker_deb "$deb" && continue
        dpkg -x "$deb" "$tmp"
        debs+=("$deb")
    done
    mkdir -p "$tmp/var/lib/dpkg/alternatives" "$tmp/etc/alternatives" "$tmp/var/log"
    log "running the packages' maintainer scripts in $tmp (log: $ROOT.postinst.log)"
    "$PYTHON" "$REPO/scripts/debian_maintscripts.py" "$tmp" "${debs[@]}" >"$ROOT.postinst.log" 2>&1 ||
        die "maintainer scripts failed: $(tail -3 "$ROOT.postinst.log")"
    [ -L "$tmp/usr/lib/$TRIPLET/libcuda.so.1" ] ||
        die "the maintainer scripts made no /usr/lib/$TRIPLET/libcuda.so.1 (log: $ROOT.postinst.log)"
    rm -rf "$ROOT"
    mv "$tmp" "$ROOT"
}

unpack_docker() {
    local tmp=$DOCKER.tmp deb
    rm -rf "$tmp"
    mkdir -p "$tmp"
    for deb in "$CACHE"/debs/docker.io_*.deb "$CACHE"/debs/docker-cli_*.deb; do
        dpkg -x "$deb" "$tmp"
    done
    [ -x "$tmp/usr/sbin/dockerd" ] && [ -x "$tmp/usr/bin/docker" ] || die "no dockerd/docker in $tmp"
    rm -rf "$DOCKER"
    mv "$tmp" "$DOCKER"
}

main() {
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9
    if ! [ -f "$STAMP" ]; then
        download
        unpack
        [ "$ARCH" != amd64 ] || unpack_docker
        touch "$STAMP"
    fi
    [ -n "$DEB_VERSION" ] || read -r DEB_VERSION DOCKER_VERSION <"$CACHE/debs/.versions"
    if [ "$ARCH" != amd64 ]; then
        cat <<EOF
NVIDIA driver root : $ROOT  ($ARCH, Debian sid $DEB_VERSION, alternatives made by its postinsts)
cache folder       : $CACHE  (override with NRI_CDI_NVIDIA_ARM64_CACHE)
EOF
        return 0
    fi
    cat <<EOF
NVIDIA driver root : $ROOT  (Debian sid $DEB_VERSION, alternatives made by its postinsts)
docker             : $DOCKER/usr/bin  (dockerd in usr/sbin, docker in usr/bin: $DOCKER_VERSION)
cache folder       : $CACHE  (override with NRI_CDI_NVIDIA_CACHE)
EOF
}

main "$@"
