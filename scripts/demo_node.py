"""The node demo: a private containerd with NRI, our plugin connected to it, and a pod that
asks for a CDI device by annotation. Prints what the container sees. Run by demo.sh."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e import images, paths  # noqa: E402 - the private-containerd harness
from tests.e2e.containerd import Containerd  # noqa: E402
from tests.e2e.plugin import PluginProcess  # noqa: E402

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
    return 0


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
