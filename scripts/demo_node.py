"""The node demo on a machine without a GPU: a private containerd with NRI and our plugin.

1. A pod asks for a device of the example specs by annotation; its container gets it.
2. A simulated GPU node (real gcc-built driver libraries, mknod'ed device nodes, /proc
   files) gets its spec from ``nri-cdi generate``; a pod asks for ``nvidia.com/gpu=0`` and
   its container gets /dev/nvidia0, the control nodes and the driver libraries — and not
   /dev/nvidia1. Run by demo.sh."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import subprocess  # noqa: E402

from nri_cdi_testbed.node_check import images, paths  # noqa: E402 - private containerd
from nri_cdi_testbed.node_check.containerd import Containerd  # noqa: E402
from nri_cdi_testbed.node_check.plugin import PluginProcess  # noqa: E402
from nri_cdi_testbed.simnode import NodeLayout, build_node  # noqa: E402

SPECS = REPO / "specs" / "examples"
DEVICE = "vendor.example/device=dev0"


def show(title: str, text: str) -> None:
    print(f"\n\033[1m# {title}\033[0m")
    print(text.rstrip())


def main() -> int:
    missing = paths.missing_prerequisites()
    if missing:
        print(f"cannot run the node demo: {'; '.join(missing)}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp, Containerd() as ctrd:
        root = Path(tmp)  # the context manager has started containerd
        ctrd.import_images(images.pause_image(root), images.busybox_image(root))
        show("a private containerd 1.7 with NRI", f"CRI socket {ctrd.address}\n"
             f"NRI socket {ctrd.nri_socket}")
        plugin = PluginProcess(ctrd.nri_socket, [SPECS], root / "plugin.log").start()
        try:
            run_pod(ctrd, plugin)
        finally:
            plugin.kill()
        gpu_node(ctrd, root)
    return 0


def gpu_node(ctrd: Containerd, root: Path) -> None:
    node = build_node(root / "node", NodeLayout.uniform(2))
    specs = root / "cdi"
    specs.mkdir()
    command = ["nri-cdi", "generate", "--mode", "procfs", "--driver-root", str(node.root),
               "--link-mode", "mounts", "--output", str(specs / "nvidia.yaml")]
    subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", *command[1:]], check=True,
                   cwd=REPO)
    show("a simulated node with 2 GPUs: " + " ".join(command).replace(str(root), "$TMP"),
         subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "list", "--spec-dir",
                         str(specs)], capture_output=True, text=True, cwd=REPO).stdout)
    plugin = PluginProcess(ctrd.nri_socket, [specs], root / "gpu-plugin.log").start()
    try:
        with ctrd.cri() as cri, cri.cleanup():
            pod = cri.run_pod("gpu", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
            show("pod 'gpu' annotated", "cdi.k8s.io/gpu: nvidia.com/gpu=0")
            ctr = cri.run_container(pod, "app", images.BUSYBOX_IMAGE, command=["sleep", "600"])
            for title, script in (
                ("its device nodes", "ls -l /dev | grep nvidia"),
                ("its driver libraries (read-only bind mounts)",
                 "ls /usr/lib/x86_64-linux-gnu | grep -E 'libcuda|libnvidia-ml'"),
                ("its environment", "env | grep -E 'NVIDIA|LD_LIBRARY' | sort"),
            ):
                result = cri.exec_sync(ctr, ["sh", "-c", script])
                show(f"{title}: {script}", result.stdout + result.stderr)
    finally:
        plugin.kill()


def run_pod(ctrd: Containerd, plugin: PluginProcess) -> None:
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("demo", annotations={"cdi.k8s.io/demo": DEVICE})
        show("pod 'demo' annotated", f"cdi.k8s.io/demo: {DEVICE}")
        ctr = cri.run_container(pod, "app", images.BUSYBOX_IMAGE, command=["sleep", "600"])
        for title, command in (
            ("the device node inside the container", "ls -l /dev/vendor-example0"),
            ("the mount (host /etc/os-release, read-only)",
             "head -2 /etc/vendor-example-release; touch /etc/vendor-example-release 2>&1"),
            ("the environment", "env | grep VENDOR_EXAMPLE | sort"),
        ):
            result = cri.exec_sync(ctr, ["sh", "-c", command])
            show(f"{title}: {command}", result.stdout + result.stderr)
        other = cri.run_container(cri.run_pod("other"), "app", images.BUSYBOX_IMAGE,
                                  command=["sleep", "600"])
        result = cri.exec_sync(other, ["sh", "-c", "ls /dev/vendor-example0 2>&1"])
        show("a pod that asked for nothing", result.stdout + result.stderr)
    show("the plugin's log", "\n".join(
        line for line in plugin.log().splitlines() if "injected" in line or "registry" in line))


if __name__ == "__main__":
    sys.exit(main())
