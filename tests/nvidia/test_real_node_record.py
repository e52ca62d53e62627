"""The specs real nodes' driver 580 gave (tests/data/real-node-*-580.159.04*: two lent H100
machines and three H200s): they load with the strict parser, the two discovery modes agree,
what the doctor reads from them is that node's, and the plugin's OCI result for GPU 0 equals
native CDI's on every runtime version of docs/reference/runtime-cdi.md's table, the spec's
``rwm`` device nodes included."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.cache import Snapshot, SpecCache
from cdi.edits import apply
from cdi.libpath import merge_library_path
from nri_cdi_testbed.node_check.check import spec_differences, spec_facts
from nri_plugin.nri.versions import NativeCdi, RuntimeInfo, SpecDirs
from nri_plugin.plugins.cdi_injector.context import DeviceRequest
from nri_plugin.plugins.cdi_injector.delegation import RuntimeCdiConfig
from tests.helpers import plan_injection
from tests.nri_apply import CONTAINER_BEFORE_NRI, apply_adjustment

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDS = sorted(DATA.glob("real-node-*-580.159.04*"))
LINKS = ("hooks", "mounts")
RUNTIMES = [("containerd", "1.7.24"), ("containerd", "1.7.30"), ("containerd", "2.1.9"),
            ("containerd", "2.2.1"), ("containerd", "2.3.4"), ("cri-o", "1.31.0"),
            ("cri-o", "1.35.0")]
BASE = CONTAINER_BEFORE_NRI


def _doc(record: Path, mode: str, link: str) -> dict[str, Any]:
    return dict(yaml.safe_load((record / f"spec-{mode}-{link}.yaml").read_text()))


def _uuid(record: Path) -> str:
    """GPU 0's UUID as the node's own nvidia-smi -L listed it (node.txt)."""
    found = re.search(r"^GPU 0: .*\(UUID: (GPU-[0-9a-f-]+)\)$", (record / "node.txt").read_text(),
                      re.MULTILINE)
    assert found is not None
    return found.group(1)


def test_there_are_the_five_records() -> None:
    assert [r.name for r in RECORDS] == ["real-node-h100-580.159.04",
                                         "real-node-h100-580.159.04-second",
                                         "real-node-h200-580.159.04",
                                         "real-node-h200-580.159.04-second",
                                         "real-node-h200-580.159.04-third"]
    assert len({_uuid(r) for r in RECORDS}) == 5  # five machines


@pytest.fixture(scope="module", params=[(r, link) for r in RECORDS for link in LINKS],
                ids=[f"{r.name}-{link}" for r in RECORDS for link in LINKS])
def snapshot(request: pytest.FixtureRequest,
             tmp_path_factory: pytest.TempPathFactory) -> Snapshot:
    record, link = request.param
    folder = tmp_path_factory.mktemp(f"real-{link}")
    shutil.copy(record / f"spec-nvml-{link}.yaml", folder / "nvidia.yaml")
    snap = SpecCache([str(folder)]).refresh()
    assert not snap.errors, snap.errors
    return snap


@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
@pytest.mark.parametrize("link", LINKS)
def test_every_recorded_spec_loads_and_the_modes_agree(record: Path, link: str,
                                                       tmp_path: Path) -> None:
    for mode in ("nvml", "procfs"):
        (tmp_path / mode).mkdir()
        shutil.copy(record / f"spec-{mode}-{link}.yaml", tmp_path / mode / "nvidia.yaml")
        snap = SpecCache([str(tmp_path / mode)]).refresh()
        assert not snap.errors, snap.errors
        assert {d.split("=")[1] for d in snap.devices} == {"0", _uuid(record), "all"}
    assert spec_differences(_doc(record, "nvml", link), _doc(record, "procfs", link)) == []


@pytest.mark.parametrize("record", RECORDS, ids=[r.name for r in RECORDS])
@pytest.mark.parametrize("link", LINKS)
def test_the_doctor_reads_the_nodes_gpu_and_driver(record: Path, link: str) -> None:
    facts = spec_facts(_doc(record, "nvml", link), 0)
    assert facts.own_nodes == {"/dev/nvidia0"} and facts.other_nodes == set()
    assert facts.uuid == _uuid(record)
    assert facts.smi == "/usr/bin/nvidia-smi"
    assert facts.libcuda == "/usr/local/nvidia/lib64/libcuda.so.1"
    assert facts.libcuda_host == "/usr/local/nvidia/lib64/libcuda.so.580.159.04"
    mounts = {m["containerPath"]: m["hostPath"]
              for m in _doc(record, "nvml", link)["containerEdits"]["mounts"]}
    # The driver's program, not the node's /usr/bin wrapper script (node.txt, "wrappers").
    assert mounts["/usr/bin/nvidia-smi"] == "/usr/local/nvidia/bin/nvidia-smi"


def _native(snapshot: Snapshot, spec: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return apply(spec, snapshot.resolve(names))


def _access(spec: dict[str, Any]) -> dict[tuple[int, int], set[str]]:
    """Each GPU device number's allowed access, all rules after BASE's two together."""
    out: dict[tuple[int, int], set[str]] = {}
    for rule in spec["linux"]["resources"]["devices"][2:]:
        assert rule["allow"] and rule["type"] == "c"
        out.setdefault((rule["major"], rule["minor"]), set()).update(rule["access"])
    return out


@pytest.mark.parametrize("name, version", RUNTIMES, ids=[f"{n}-{v}" for n, v in RUNTIMES])
def test_gpu_0_through_the_plugin_is_native_cdi(snapshot: Snapshot, name: str,
                                                version: str) -> None:
    runtime = RuntimeCdiConfig(enabled=NativeCdi.ON, spec_dirs=SpecDirs.of(
        snapshot.spec_dirs)).applied_to(RuntimeInfo.from_configure(name, version))
    names = ["nvidia.com/gpu=0"]
    plan = plan_injection(snapshot, [DeviceRequest(n, "test") for n in names], runtime)
    cdi = (lambda spec, wanted: _native(snapshot, spec, wanted)) \
        if runtime.supports_cdi_devices else None
    assert runtime.nri_version is not None
    ours = apply_adjustment(BASE, plan.adjustment, runtime.nri_version, cdi)
    native = _native(snapshot, BASE, names)
    assert ours["linux"]["devices"] == native["linux"]["devices"]
    # Hook-free specs carry their library folder in NRI_CDI_LD_LIBRARY_PATH, which the
    # plugin folds into LD_LIBRARY_PATH (docs/usage/hooks-and-mounts.md, "Hooks or mounts").
    assert ours["process"]["env"] == list(merge_library_path(native["process"]["env"]))
    assert ours.get("hooks") == native.get("hooks")
    assert ours["mounts"] == native["mounts"]
    wanted = _access(native)
    # The spec asks rwm for /dev/nvidia0 and the control nodes (nvidiactl, nvidia-uvm, ...).
    assert {(195, 0), (195, 255)} <= set(wanted) and all(a == set("rwm") for a in wanted.values())
    if plan.delegated:  # handed to the runtime's own CDI: exactly native
        assert plan.delegated == tuple(names) and ours == native
    elif runtime.nri_version >= (0, 10, 0):  # NRI's rw rule, then the plugin's rwm one
        assert _access(ours) == wanted
    else:  # NRI's "rw" alone: never wider, only mknod missing
        assert _access(ours) == {key: set("rw") for key in wanted}
    if runtime.supports_cdi_devices and "LD_LIBRARY_PATH" not in str(native):
        assert plan.delegated  # hooks mode: nothing for the plugin to fold
