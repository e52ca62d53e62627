#!/usr/bin/env bash
# The main job.
# On a GPU node (an NVIDIA driver is loaded): generate the node's CDI spec into
# /var/run/cdi, list it, check the node with doctor, then run the NRI plugin against the
# node's containerd (Ctrl-C stops it).
# Elsewhere: installs nri-cdi and a private containerd, then shows the CDI library at work
# on the example specs (list, validate, inject) and the plugin at work on a real
# containerd, first with an example device, then with a simulated GPU node whose spec
# comes from nri-cdi generate.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >/dev/null

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "$*"; "$@"; }

if [ -e /proc/driver/nvidia/version ] && [ -z "${NRI_CDI_DEMO_SIMULATED:-}" ]; then
    run nri-cdi generate --output /var/run/cdi/nvidia.yaml --if-changed
    run nri-cdi list
    say "nri-cdi doctor"
    nri-cdi doctor || echo "(doctor found problems: see above)"
    run exec nri-cdi plugin
fi

bash scripts/install-containerd.sh >/dev/null

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
