"""Each hook program a generated spec can name, run by runc under a real containerd
(native CDI): ours (the default entry, and the static launcher ``nri-cdi-hook``), NVIDIA's
``nvidia-cdi-hook`` and ``nvidia-ctk`` (from $NRI_CDI_PEERS, tests/peers.py; skipped where absent).

In every case the program in a glibc image dlopen()s ``libcuda.so.1`` from the simulated
node's RHEL layout (/usr/lib64, not in the loader's default path): it resolves only if the
hooks made the SONAME link and the ld cache, i.e. only if the hook program understood the
arguments it was given.  A spec naming NVIDIA's binary with our argument layout made
containers without ``libcuda.so.1`` (issue 15): this is the check that it no longer does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cdi.hooks.launcher import LauncherError, build_launcher
from nri_cdi_testbed.simnode import NodeLayout, build_node
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.test_generated_spec_e2e import PROG_C, _expected, _images, _run_prog
from tests.hooks.conftest import NIX_PROG_FLAGS, _cc
from tests.peers import absent, peer

REPO = Path(__file__).resolve().parents[2]
PROGRAMS: dict[str, Path | None] = {
    "ours": None, "launcher": Path("nri-cdi-hook"), "nvcdihook": peer("nvidia-cdi-hook"),
    "nvctk": peer("nvidia-ctk")}


@pytest.fixture(scope="module")
def world(e2e_ready: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("hook-programs")
    node = build_node(out / "node", NodeLayout.uniform(1, distro="rhel"))
    specs = out / "specs"
    specs.mkdir()
    programs = dict(PROGRAMS)
    try:  # our static launcher (needs gcc -static and libc6-dev)
        programs["launcher"] = Path(build_launcher(str(out / "nri-cdi-hook")))
    except LauncherError:
        programs["launcher"] = out / "nri-cdi-hook"  # absent: that case skips
    for cls, program in programs.items():
        if program is not None and not program.is_file():
            continue
        hook = ["--hook-path", str(program)] if program is not None else []
        subprocess.run(
            [sys.executable, "-m", "nri_plugin.ops.cli", "generate", "--mode", "procfs",
             "--driver-root", str(node.driver_root), "--class", cls, *hook,
             "--output", str(specs / f"nvidia-{cls}.yaml")],
            check=True, cwd=REPO, capture_output=True)
    prog, nix_prog = out / "prog", out / "nix-prog"
    _cc(["-o", str(prog)], PROG_C)
    _cc(["-o", str(nix_prog), *NIX_PROG_FLAGS], PROG_C)
    return {"out": out, "node": node.root, "prog": prog, "nix_prog": nix_prog, "specs": specs,
            "launcher": programs["launcher"]}


@pytest.fixture(scope="module")
def native(containerd: ContainerdFactory, world: dict[str, Path]) -> Containerd:
    ctrd = containerd(enable_cdi=True, cdi_spec_dirs=[world["specs"]])
    _images(ctrd, world)
    return ctrd


@pytest.mark.parametrize("cls", sorted(PROGRAMS))
def test_libcuda_resolves_with_each_hook_program(native: Containerd, world: dict[str, Path],
                                                 cls: str) -> None:
    program = world["launcher"] if cls == "launcher" else PROGRAMS[cls]
    if program is not None and not program.is_file():
        pytest.skip(f"{program} is absent: the static launcher could not be built (gcc "
                    "-static needs libc6-dev)" if cls == "launcher" else absent(program.name))
    spec = (world["specs"] / f"nvidia-{cls}.yaml").read_text()
    assert "enable-cuda-compat" in spec and "disable-device-node-modification" in spec
    out, devices = _run_prog(native, "glibc", cdi_devices=[f"nvidia.com/{cls}=0"])
    assert out == _expected(world), out
    assert "nvidia0" in devices.split() and "nvidiactl" in devices.split()
