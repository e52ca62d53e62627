"""A Jetson's CSV spec used by real containers: ``nri-cdi generate --mode csv`` on the simulated
Jetson (nri_cdi_testbed.tegra), then a program in a glibc image dlopen()s libcuda.so.1, whose
cuInit loads libnvrm_gpu.so through the loader and counts the GPU when the container has
/dev/nvgpu/igpu0/ctrl and /dev/nvmap.

The driver sits in usr/lib/aarch64-linux-gnu/nvidia, which the image's loader does not search:
the library is found only if the hooks made the links and wrote the container's ld.so.cache
(hook mode) or the plugin set LD_LIBRARY_PATH (hook-free mode). The same device is asked for
through containerd's own CDI and through our plugin on one containerd, and the two containers
must get the same device nodes and mounts; the hook-free spec goes through the plugin alone.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.tegra import BuiltTegraNode, TegraLayout, build_tegra_node
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import DEFAULT_PATH, ImageConfig, image_from_tree
from tests.e2e.plugin import PluginProcess
from tests.hooks.conftest import copy_glibc, host_loader

REPO = Path(__file__).resolve().parents[2]
IMAGE = "localhost/tegra/glibc:e2e"
NV = "/usr/lib/aarch64-linux-gnu/nvidia"
SLEEP = ["sleep", "600"]
PROG_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { printf("dlopen failed: %s\n", dlerror()); return 1; }
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*version)(int *) = (int (*)(int *))dlsym(h, "cuDriverGetVersion");
    int (*count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    const char *(*node)(void) = (const char *(*)(void))dlsym(h, "fake_gpu_node_id");
    int v = 0, n = 0, rc = init(0);
    version(&v);
    count(&n);
    printf("init=%d cuda=%d gpus=%d node=%s\n", rc, v, n, node());
    return 0;
}
"""


@pytest.fixture(scope="module")
def world(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("tegra")
    node = build_tegra_node(out / "node", TegraLayout(seed="e2e"))
    for name, extra in (("hooks", ()), ("mounts", (
            "--link-mode", "mounts", "--feature-flag", "no-additional-gids-for-device-nodes"))):
        (out / name).mkdir()
        subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "csv",
                        "--driver-root", str(node.root), *extra,
                        "--output", str(out / name / "nvidia.yaml")],
                       check=True, cwd=REPO, capture_output=True)
    tree = out / "tree"
    ld, _ = host_loader()
    (tree / "lib64").mkdir(parents=True)
    shutil.copy2(ld, tree / "lib64" / "ld-linux-x86-64.so.2")
    copy_glibc(tree / "lib" / "x86_64-linux-gnu")
    subprocess.run(["gcc", "-x", "c", "-", "-o", str(tree / "prog")], input=PROG_C.encode(),
                   check=True, capture_output=True)
    image_from_tree(IMAGE, tree, out / "image.tar",
                    config=ImageConfig(cmd=tuple(SLEEP), env=(DEFAULT_PATH,)))
    return {"out": out, "node": node.root}


def _node(world: dict[str, Path]) -> BuiltTegraNode:
    return BuiltTegraNode.load(world["node"])


def _expected(world: dict[str, Path]) -> str:
    return f"init=0 cuda=12060 gpus=1 node={_node(world).manifest['node_id']}"


def _import(ctrd: Containerd, world: dict[str, Path]) -> None:
    ctrd.import_images(world["out"] / "image.tar")


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory, world: dict[str, Path]) -> Iterator[Containerd]:
    """Native CDI on, reading the hook-mode spec, and the plugin on the same folder."""
    daemon = containerd(enable_cdi=True, cdi_spec_dirs=[world["out"] / "hooks"])
    _import(daemon, world)
    plugin = PluginProcess(daemon.nri_socket, [world["out"] / "hooks"],
                           world["out"] / f"plugin-{daemon.version}.log").start()
    yield daemon
    plugin.kill()


def _inside(cri: CriClient, cid: str) -> dict[str, Any]:
    def sh(command: str) -> str:
        result = cri.exec_sync(cid, ["sh", "-c", command])
        assert result.exit_code == 0, (command, result)
        return result.stdout.strip()

    return {
        "prog": sh("/prog"),
        "nodes": sh("find /dev -type c | sort").split(),
        "release": sh("cat /etc/nv_tegra_release"),
        "libcuda_link": sh("readlink /usr/lib/aarch64-linux-gnu/libcuda.so || "
                           "echo not-a-link"),
        "libraries": sh(f"ls {NV}").split(),
        "library_path": sh("echo $LD_LIBRARY_PATH"),
    }


def _assert_tegra(world: dict[str, Path], seen: dict[str, Any]) -> None:
    node = _node(world)
    assert seen["prog"] == _expected(world)
    assert {n["path"] for n in node.manifest["device_nodes"]} <= set(seen["nodes"])
    assert not set(node.manifest["absent_nodes"]) & set(seen["nodes"])
    assert seen["release"] == (node.root / "etc/nv_tegra_release").read_text().strip()
    assert {Path(lib["path"]).name for lib in node.manifest["libraries"]} <= \
        set(seen["libraries"])


def _spec(cri: CriClient, cid: str) -> dict[str, Any]:
    spec = cri.runtime_spec(cid)
    return {"devices": sorted((d["path"], d["major"], d["minor"])
                              for d in spec["linux"].get("devices", [])),
            "mounts": sorted(m["destination"] for m in spec["mounts"])}


def test_native_cdi_and_the_plugin_give_the_same_jetson_container(
        ctrd: Containerd, world: dict[str, Path]) -> None:
    with ctrd.cri() as cri, cri.cleanup():
        native_pod = cri.run_pod("native")
        native = cri.run_container(native_pod, "c", IMAGE, command=SLEEP,
                                   cdi_devices=["nvidia.com/gpu=0"])
        ours_pod = cri.run_pod("ours", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
        ours = cri.run_container(ours_pod, "c", IMAGE, command=SLEEP)
        seen_native, seen_ours = _inside(cri, native), _inside(cri, ours)
        specs = _spec(cri, native), _spec(cri, ours)
    for seen in (seen_native, seen_ours):
        _assert_tegra(world, seen)
        # hook mode: the hook made the board's links and the ld cache found the folder
        assert seen["libcuda_link"] == "nvidia/libcuda.so"
        assert seen["library_path"] == ""
    assert seen_ours == seen_native
    assert specs[0] == specs[1]


@pytest.fixture(scope="module")
def plain(containerd: ContainerdFactory, world: dict[str, Path]) -> Containerd:
    daemon = containerd()
    _import(daemon, world)
    return daemon


def test_hook_free_spec_through_the_plugin(plain: Containerd, world: dict[str, Path]) -> None:
    plugin = PluginProcess(plain.nri_socket, [world["out"] / "mounts"],
                           world["out"] / f"plugin-mounts-{plain.version}.log").start()
    try:
        with plain.cri() as cri, cri.cleanup():
            pod = cri.run_pod("hook-free", annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=0"})
            cid = cri.run_container(pod, "c", IMAGE, command=SLEEP)
            seen = _inside(cri, cid)
            hooks = cri.runtime_spec(cid).get("hooks", {})
    finally:
        plugin.kill()
    _assert_tegra(world, seen)
    assert seen["library_path"] == NV  # the plugin's fold of NRI_CDI_LD_LIBRARY_PATH
    assert seen["libcuda_link"] == "not-a-link"  # a bind mount of the file it ends at
    assert not hooks.get("createContainer")
