#!/usr/bin/env bash
# Install what the end-to-end tests (tests/e2e) need to run a real containerd 1.7 and a real
# containerd 2.1 with CRI + NRI, without installing containerd system-wide:
#   - bookworm packages runc, busybox-static, gcc, libc6-dev and podman (apt-get install
#     --no-install-recommends, if missing; podman 4.3 is the second CDI consumer tested);
#   - trixie packages containerd (1.7) and golang-github-kubernetes-cri-api-dev, downloaded
#     with a private apt config (the system's apt sources/lists/cache are never touched) and
#     unpacked with dpkg -x into $CACHE/root;
#   - sid's containerd (2.1), the same way, into $CACHE/root-2.1 (its own apt folder, debs
#     folder and stamp, so a cache that already holds 1.7 only gains 2.1);
#   - the CRI v1 api.proto compiled with grpc_tools into $CACHE/cri_gen/cri_api_v1.
# Both containerds run with bookworm's runc 1.1.5: the .debs' own runc needs glibc 2.38.
# Idempotent: stamp files make a second run return at once.
#
# Cache folder: $NRI_CDI_CACHE, default <repo>/.cache/containerd (git-ignored).
# Needs root (apt-get install) and python3 with grpcio-tools (pip install grpcio-tools).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${NRI_CDI_CACHE:-$REPO/.cache/containerd}
PYTHON=${PYTHON:-python3}
# Bump when the layout of the cache changes, so old caches are rebuilt.
STAMP_VERSION=1
STAMP=$CACHE/.installed-v$STAMP_VERSION
ROOTFS=$CACHE/root
# containerd 2.x from sid: a separate tree with its own stamp, added next to the 1.7 one.
STAMP_2=$CACHE/.installed-2.1-v1
ROOTFS_2=$CACHE/root-2.1
SUITE_2=sid
BIN=$ROOTFS/usr/bin
GEN=$CACHE/cri_gen
PKG=cri_api_v1
CRI_PROTO_IN_DEB=usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto
HOST_PACKAGES=(runc busybox-static gcc libc6-dev podman)

log() { echo "install-containerd: $*" >&2; }
die() { log "error: $*"; exit 1; }

report() {
    cat <<EOF
containerd bin folder : $BIN  (containerd, ctr, containerd-shim-runc-v2)
containerd 2.x folder : $ROOTFS_2/usr/bin
runc                  : $(command -v runc || echo missing)
busybox               : $(command -v busybox || echo missing)
CRI v1 python stubs   : $GEN/$PKG  (add $GEN to sys.path, import $PKG.api_pb2)
cache folder          : $CACHE  (override with NRI_CDI_CACHE)
EOF
}

host_packages_ok() {
    local p
    for p in "${HOST_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || return 1
    done
}

install_host_packages() {
    host_packages_ok && return 0
    [ "$(id -u)" = 0 ] || die "apt-get install ${HOST_PACKAGES[*]} needs root"
    log "installing bookworm packages: ${HOST_PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${HOST_PACKAGES[@]}" >/dev/null
}

# shellcheck source=scripts/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

download_trixie_debs() {
    local a=$CACHE/apt debs=$CACHE/debs
    if ls "$debs"/containerd_*.deb "$debs"/golang-github-kubernetes-cri-api-dev_*.deb \
        >/dev/null 2>&1; then
        return 0
    fi
    mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$debs"
    echo "deb $(debian_mirror) trixie main" >"$a/sources.list"
    # Private sources, lists and package cache: the system's apt state stays untouched.
    local o=(-o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache"
        -o APT::Sandbox::User=root)
    log "fetching trixie package lists (private apt config in $a)"
    apt-get "${o[@]}" -qq update
    log "downloading trixie containerd and golang-github-kubernetes-cri-api-dev"
    (cd "$debs" && apt-get "${o[@]}" -qq download containerd golang-github-kubernetes-cri-api-dev)
}

unpack_debs() {
    [ -x "$BIN/containerd" ] && [ -f "$ROOTFS/$CRI_PROTO_IN_DEB" ] && return 0
    rm -rf "$ROOTFS"
    mkdir -p "$ROOTFS"
    local deb
    for deb in "$CACHE"/debs/*.deb; do
        dpkg -x "$deb" "$ROOTFS"
    done
    # trixie's runc needs glibc 2.38; bookworm's /usr/sbin/runc is used instead.
    rm -f "$ROOTFS/usr/sbin/runc" "$ROOTFS/usr/bin/runc"
    [ -x "$BIN/containerd" ] || die "no containerd binary in $BIN after unpacking"
    "$BIN/containerd" --version >&2
}

# containerd 2.x: sid's package through its own private apt folder, unpacked into ROOTFS_2.
download_sid_containerd() {
    local a=$CACHE/apt-$SUITE_2 debs=$CACHE/debs-2.1
    ls "$debs"/containerd_2.*.deb >/dev/null 2>&1 && return 0
    mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$debs"
    echo "deb $(debian_mirror) $SUITE_2 main" >"$a/sources.list"
    local o=(-o "Dir::Etc::SourceList=$a/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$a/lists" -o "Dir::Cache=$a/cache"
        -o APT::Sandbox::User=root)
    log "fetching $SUITE_2 package lists (private apt config in $a)"
    apt-get "${o[@]}" -qq update
    log "downloading $SUITE_2 containerd"
    (cd "$debs" && apt-get "${o[@]}" -qq download containerd)
    ls "$debs"/containerd_2.*.deb >/dev/null 2>&1 ||
        die "$SUITE_2's containerd is not a 2.x package: $(ls "$debs")"
}

unpack_containerd_2() {
    [ -x "$ROOTFS_2/usr/bin/containerd" ] && return 0
    local tmp=$ROOTFS_2.tmp
    rm -rf "$tmp"
    mkdir -p "$tmp"
    dpkg -x "$(ls "$CACHE"/debs-2.1/containerd_2.*.deb | head -1)" "$tmp"
    rm -f "$tmp/usr/sbin/runc" "$tmp/usr/bin/runc"
    [ -x "$tmp/usr/bin/containerd" ] || die "no containerd binary in $tmp/usr/bin"
    # Readers of the cache never see a half-unpacked tree.
    rm -rf "$ROOTFS_2"
    mv "$tmp" "$ROOTFS_2"
    "$ROOTFS_2/usr/bin/containerd" --version >&2
}

install_containerd_2() {
    [ -f "$STAMP_2" ] && [ -x "$ROOTFS_2/usr/bin/containerd" ] && return 0
    download_sid_containerd
    unpack_containerd_2
    touch "$STAMP_2"
}

compile_cri_proto() {
    [ -f "$GEN/$PKG/api_pb2.py" ] && return 0
    "$PYTHON" -c "import grpc_tools.protoc" 2>/dev/null ||
        die "$PYTHON lacks grpc_tools: run '$PYTHON -m pip install grpcio grpcio-tools'"
    local src=$CACHE/cri_src
    rm -rf "$src" "$GEN"
    mkdir -p "$src/$PKG" "$GEN/$PKG"
    # gogoproto options only matter to Go code generators, and their import is not available.
    grep -v gogoproto "$ROOTFS/$CRI_PROTO_IN_DEB" >"$src/$PKG/api.proto"
    # The proto sits at <pkg>/api.proto so the generated _grpc module imports it as
    # "from cri_api_v1 import api_pb2", not as a top-level "api_pb2".
    # Messages only: the client makes its service stubs from the descriptors, so the
    # grpcio of the node is never held to the version of the grpcio-tools used here.
    "$PYTHON" -m grpc_tools.protoc -I "$src" --python_out="$GEN" --pyi_out="$GEN" \
        "$src/$PKG/api.proto"
    : >"$GEN/$PKG/__init__.py"
    log "compiled CRI v1 stubs into $GEN/$PKG"
}

main() {
    mkdir -p "$CACHE"
    # Two concurrent runs (e.g. parallel CI jobs) must not unpack over each other.
    exec 9>"$CACHE/.lock"
    flock 9
    if ! { [ -f "$STAMP" ] && [ -x "$BIN/containerd" ] && [ -f "$GEN/$PKG/api_pb2.py" ] &&
        host_packages_ok; }; then
        install_host_packages
        download_trixie_debs
        unpack_debs
        compile_cri_proto
        touch "$STAMP"
    fi
    install_containerd_2
    report
}

main "$@"
