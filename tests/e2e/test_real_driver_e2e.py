"""NVIDIA's real driver as Debian ships it (tests/nvidia_debian.py), used by real containers
on containerd 1.7 and 2.1: through native CDI and through our plugin, in both link modes, a
glibc image (the host's loader and libraries) runs

* a probe built here with gcc: dlopen("libcuda.so.1", RTLD_NOW) of the real
  libcuda.so.550.163.01 (every dependency resolved) and cuInit(0), which answers 100
  (CUDA_ERROR_NO_DEVICE: no kernel module, as expected);
* the real nvidia-smi, which gets as far as its own "couldn't communicate with the NVIDIA
  driver" (exit 9);
* a check that every path the spec makes (mounts, links) exists in the container, a link
  followed to its end: no link dangles.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.images import DEFAULT_PATH, ImageConfig, image_from_tree
from tests.e2e.plugin import PluginProcess
from tests.helpers import generate_link_modes
from tests.hooks.conftest import _cc, host_loader
from tests.nvidia_debian import driver_root, kernel_side

IMAGE = "localhost/gpu/debian-real:e2e"
# What the real libcuda and nvidia-smi need besides libc (readelf -d: NEEDED).
GLIBC_LIBS = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
PROBE_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    if (!init) { printf("no cuInit\n"); return 1; }
    printf("cuInit=%d\n", init(0));
    return 0;
}
"""
SMI_MESSAGE = "couldn't communicate with the NVIDIA driver"


@pytest.fixture(scope="module")
def world(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = driver_root()
    out = tmp_path_factory.mktemp("real-driver")
    kernel = kernel_side(out / "kernel")
    # 0.6.0: no additionalGids for the 0660 DRM nodes, which NRI cannot carry on
    # containerd < 1.7.30 (as test_generated_spec_e2e.py)
    generate_link_modes(out, root, kernel.dev_root, cdi_version="0.6.0")
    _cc(["-o", str(out / "probe")], PROBE_C)
    return {"out": out, "root": root}


def _paths_the_spec_makes(spec_file: Path) -> list[str]:
    spec = yaml.safe_load(spec_file.read_text().split("---", 1)[1])
    edits = spec["containerEdits"]
    (gpu0,) = [d["containerEdits"] for d in spec["devices"] if d["name"] == "0"]
    paths = [m["containerPath"] for m in (*edits.get("mounts", []), *gpu0.get("mounts", []))]
    paths += [n["path"] for n in (*edits.get("deviceNodes", []), *gpu0.get("deviceNodes", []))]
    for hook in edits.get("hooks", []):
        args = hook["args"]
        paths += [args[i + 1].split("::")[-1] for i, w in enumerate(args)
                  if w in ("--link", "--device-link")]
    # GPU 0's by-path names: links made by the hook in hooks mode, its nodes mounted at
    # those names in mounts mode.
    assert any(p.startswith("/dev/dri/by-path/") for p in paths)
    return sorted(set(paths))


def _image(ctrd: Containerd, world: dict[str, Path]) -> None:
    out = world["out"]
    tree = out / "tree"
    if not tree.exists():
        ld, _ = host_loader()
        (tree / "lib64").mkdir(parents=True)
        shutil.copy2(ld, tree / "lib64" / "ld-linux-x86-64.so.2")
        libs = tree / "lib/x86_64-linux-gnu"
        libs.mkdir(parents=True)
        for name in GLIBC_LIBS:
            shutil.copy2(os.path.realpath(f"/lib/x86_64-linux-gnu/{name}"), libs / name)
        shutil.copy2(out / "probe", tree / "probe")
    # Every capability: the plugin then gives every file of the spec, as native CDI does,
    # and every path the spec makes can be checked in the container.
    config = ImageConfig(cmd=("sleep", "600"),
                         env=(DEFAULT_PATH, "NVIDIA_DRIVER_CAPABILITIES=all"))
    ctrd.import_images(image_from_tree(IMAGE, tree, out / "image.tar", config=config))


def _check(ctrd: Containerd, world: dict[str, Path], mode: str, *,
           pod_annotations: dict[str, str] | None = None,
           cdi_devices: list[str] | None = None) -> None:
    paths = _paths_the_spec_makes(world["out"] / mode / "nvidia.yaml")
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod(f"p-real-{mode}", annotations=pod_annotations or {})
        kwargs = {"cdi_devices": cdi_devices} if cdi_devices else {}
        cid = cri.run_container(pod, "c", IMAGE, command=["sleep", "600"], **kwargs)
        probe = cri.exec_sync(cid, ["/probe"])
        assert (probe.exit_code, probe.stdout.strip()) == (0, "cuInit=100"), probe
        smi = cri.exec_sync(cid, ["/usr/bin/nvidia-smi"])
        assert smi.exit_code == 9 and SMI_MESSAGE in smi.stdout + smi.stderr, smi
        # "[ -e ]" follows a link to its end: a dangling link, or a missing mount, shows.
        script = ('for p in "$@"; do [ -e "$p" ] && continue; '
                  '[ -L "$p" ] && echo "dangling: $p -> $(readlink "$p")" || echo "missing: $p"; '
                  'done')
        missing = cri.exec_sync(cid, ["sh", "-c", script, "sh", *paths], timeout=30)
        assert missing.exit_code == 0 and missing.stdout == "", missing.stdout


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_native_cdi(containerd: ContainerdFactory, world: dict[str, Path], mode: str) -> None:
    ctrd = containerd(enable_cdi=True, cdi_spec_dirs=[world["out"] / mode])
    _image(ctrd, world)
    _check(ctrd, world, mode, cdi_devices=["nvidia.com/gpu=0"])


@pytest.mark.parametrize("mode", ["hooks", "mounts"])
def test_our_plugin(containerd: ContainerdFactory, world: dict[str, Path], mode: str) -> None:
    ctrd = containerd()
    _image(ctrd, world)
    plugin = PluginProcess(ctrd.nri_socket, [world["out"] / mode],
                           world["out"] / f"plugin-{mode}.log").start()
    try:
        _check(ctrd, world, mode, pod_annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
    finally:
        plugin.kill()
