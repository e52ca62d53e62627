"""A spec generated from a simulated node, used by real containers: a program in a glibc
image dlopen()s libcuda.so.1 and calls the fake driver ("does PyTorch find the GPU").

The node has the RHEL layout (/usr/lib64), which is not in the image loader's default
search path: the library is found only if the hooks wrote the container's ld.so.cache
(hook mode) or the plugin set LD_LIBRARY_PATH (hook-free mode). Both ways are checked,
through containerd's native CDI and through our plugin, plus a Nix-like image (loader and
libc under /nix/store, no /etc/ld.so.conf, no /usr/lib) in the hook-free mode.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import DEFAULT_PATH, ImageConfig, image_from_tree
from tests.e2e.plugin import PluginProcess
from tests.hooks.conftest import NIX_GLIBC, NIX_PROG_FLAGS, _cc, copy_glibc, host_loader

REPO = Path(__file__).resolve().parents[2]
IMAGE_LIBRARY_PATH = "LD_LIBRARY_PATH=/opt/own/lib"
LIBRARY_PATHS: dict[str, str] = {}  # image -> LD_LIBRARY_PATH seen in its last container
PROG_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*version)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    const char *(*node)(void) = (const char *(*)(void))dlsym(h, "fake_gpu_node_id");
    int v = 0, n = 0;
    version(&v);
    count(&n);
    printf("cuda=%d gpus=%d node=%s\n", v, n, node());
    return 0;
}
"""


@pytest.fixture(scope="module")
def world(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("generated")
    node = build_node(out / "node", NodeLayout.uniform(2, distro="rhel"))
    for mode in ("hooks", "mounts"):
        (out / mode).mkdir()
        subprocess.run(
            # 0.6.0: no additionalGids for the 0660 DRM nodes, which NRI cannot carry on
            # containerd < 1.7.30 (docs/reference/runtime-cdi.md, "additionalGids")
            [sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "procfs",
             "--cdi-version", "0.6.0",
             "--driver-root", str(node.driver_root), "--link-mode", mode,
             "--output", str(out / mode / "nvidia.yaml")],
            check=True, cwd=REPO, capture_output=True)
    prog, nix_prog = out / "prog", out / "nix-prog"
    _cc(["-o", str(prog)], PROG_C)
    _cc(["-o", str(nix_prog), *NIX_PROG_FLAGS], PROG_C)
    return {"out": out, "node": node.root, "prog": prog, "nix_prog": nix_prog}


def _images(ctrd: Containerd, world: dict[str, Path]) -> None:
    ld, _ = host_loader()
    out = world["out"]
    for name, loader_dir, libc_dir, prog in (
        ("glibc", "lib64", "lib/x86_64-linux-gnu", world["prog"]),
        ("nix", NIX_GLIBC.lstrip("/"), NIX_GLIBC.lstrip("/"), world["nix_prog"]),
    ):
        tree = out / f"tree-{name}"
        if not tree.exists():
            (tree / loader_dir).mkdir(parents=True)
            shutil.copy2(ld, tree / loader_dir / "ld-linux-x86-64.so.2")
            copy_glibc(tree / libc_dir)
            shutil.copy2(prog, tree / "prog")
        # The image has a library path of its own, which the hook-free mode must keep.
        config = ImageConfig(cmd=("sleep", "600"), env=(DEFAULT_PATH, IMAGE_LIBRARY_PATH))
        archive = image_from_tree(f"localhost/gpu/{name}:e2e", tree, out / f"{name}.tar",
                                  config=config)
        ctrd.import_images(archive)


def _run_prog(ctrd: Containerd, image: str, *, pod_annotations: dict[str, str] | None = None,
              cdi_devices: list[str] | None = None) -> tuple[str, str]:
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod(f"p-{image}", annotations=pod_annotations or {})
        kwargs = {"cdi_devices": cdi_devices} if cdi_devices else {}
        cid = cri.run_container(pod, "c", f"localhost/gpu/{image}:e2e", command=["sleep", "600"],
                                **kwargs)
        result = cri.exec_sync(cid, ["/prog"])
        devices = cri.exec_sync(cid, ["sh", "-c", "ls /dev | grep nvidia | sort | tr '\\n' ' '"])
        library_path = cri.exec_sync(cid, ["sh", "-c", "echo $LD_LIBRARY_PATH"])
        LIBRARY_PATHS[image] = library_path.stdout.strip()
        return result.stdout.strip(), devices.stdout.strip()


def _expected(world: dict[str, Path]) -> str:
    node = BuiltNode.load(world["node"])
    return f"cuda=13000 gpus=1 node={node.manifest['node_id']}"


@pytest.fixture(scope="module")
def native(containerd: ContainerdFactory, world: dict[str, Path]) -> Containerd:
    ctrd = containerd(enable_cdi=True, cdi_spec_dirs=[world["out"] / "hooks"])
    _images(ctrd, world)
    return ctrd


@pytest.fixture(scope="module")
def plain(containerd: ContainerdFactory, world: dict[str, Path]) -> Containerd:
    ctrd = containerd()
    _images(ctrd, world)
    return ctrd


def test_native_cdi_with_generated_spec_and_our_hooks(
    native: Containerd, world: dict[str, Path]
) -> None:
    out, devices = _run_prog(native, "glibc", cdi_devices=["nvidia.com/gpu=0"])
    assert out == _expected(world)
    assert devices.split() == ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0",
                               "nvidiactl"]


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_our_plugin_in_both_link_modes(plain: Containerd, world: dict[str, Path],
                                       mode: str) -> None:
    plugin = PluginProcess(plain.nri_socket, [world["out"] / mode],
                           world["out"] / f"plugin-{mode}.log").start()
    try:
        out, devices = _run_prog(plain, "glibc",
                                 pod_annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    finally:
        plugin.kill()
    assert out == _expected(world)
    assert "nvidia1" in devices.split() and "nvidia0" not in devices.split()
    expected_path = "/opt/own/lib" + (":/usr/lib64:/usr/lib64/vdpau" if mode == "mounts" else "")
    assert LIBRARY_PATHS["glibc"] == expected_path


def test_nix_like_image_works_hook_free(plain: Containerd, world: dict[str, Path]) -> None:
    plugin = PluginProcess(plain.nri_socket, [world["out"] / "mounts"],
                           world["out"] / "plugin-nix.log").start()
    try:
        out, _ = _run_prog(plain, "nix", pod_annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    finally:
        plugin.kill()
    assert out == _expected(world)
