#!/usr/bin/env bash
# The main job. Installs nri-cdi, then shows the CDI library at work on the example specs:
# list the devices, validate the specs (and a broken one), inject two devices into an OCI
# runtime spec. Later parts of the project extend this into the full node demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null

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
