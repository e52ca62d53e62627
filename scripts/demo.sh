#!/usr/bin/env bash
# The main job. Installs nri-cdi and a private containerd, then shows the CDI library at
# work on the example specs (list, validate, inject into an OCI runtime spec) and the NRI
# plugin at work on a real containerd: a pod asks for a CDI device by annotation and its
# container gets the device node, the mount and the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null
bash scripts/install-containerd.sh >/dev/null

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "$*"; "$@"; }

run nri-cdi list --spec-dir specs/examples
run nri-cdi validate --schema specs/examples/vendor-example-device.yaml specs/examples/fpga.json
say "nri-cdi validate specs/cases/invalid/device-node-type.json   # a broken spec"
nri-cdi validate specs/cases/invalid/device-node-type.json || echo "(exit status $?)"

oci='{"ociVersion": "1.1.0", "process": {"args": ["sh"], "env": ["PATH=/bin"]}, "root": {"path": "rootfs"}}'
say "echo '$oci' | nri-cdi inject --spec-dir specs/examples --device vendor.example/device=dev0 --device vendor.example/device=dev1"
echo "$oci" | nri-cdi inject --spec-dir specs/examples \
    --device vendor.example/device=dev0 --device vendor.example/device=dev1

say "python3 scripts/demo_node.py   # containerd + nri-cdi plugin + a pod asking for a device"
python3 scripts/demo_node.py
