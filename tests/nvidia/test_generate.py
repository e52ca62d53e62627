"""``nri-cdi generate`` on simulated nodes: goldens, NVML vs procfs, metadata, versions."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi.hooks import cli as cli_ops
from cdi.hooks import entry as hook_entry
from cdi.nvidia import cli
from cdi.nvidia.generate import GENERATOR_VERSION
from cdi.spec import dump_yaml, parse_spec
from nri_cdi_testbed.simnode import BuiltNode, NodeLayout
from tests.helpers import run_generate as generate

NodeFactory = Callable[[str, NodeLayout], BuiltNode]
CAN_MKNOD = os.geteuid() == 0  # as in conftest: mknod needs root

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "specs" / "golden"
HOOK = "/usr/local/bin/nri-cdi"
PLACEHOLDER = "/@NODE@"  # stays a valid plain YAML path

needs_nodes = pytest.mark.skipif(not CAN_MKNOD, reason="goldens need real device nodes (root)")

LAYOUTS = {
    "one-gpu": NodeLayout(seed="golden-one"),
    "eight-gpu": NodeLayout.uniform(8, seed="golden-eight"),
    # as conftest's node8: MIG on GPUs 0 (7 x 1g.10gb) and 3 (with a gfx profile), minors permuted
    "mig": NodeLayout.uniform(8, mig={0: "1g.10gb*7", 3: "3g.40gb,2g.20gb+gfx"},
                              minors=[0, 1, 2, 3, 7, 6, 5, 4], seed="eight"),
    "rhel": NodeLayout.uniform(2, distro="rhel", seed="golden-rhel"),
    "driver-container": NodeLayout.uniform(2, driver_container=True, seed="golden-dc"),
}


def node_args(node: BuiltNode) -> list[str]:
    return ["--driver-root", str(node.driver_root), "--dev-root", str(node.dev_root),
            "--hook-path", HOOK]


def body(text: str) -> str:
    """The spec without its comment header (which names the mode and fingerprint)."""
    return text[text.index("---"):]


def templated(text: str, node: BuiltNode) -> str:
    return text.replace(str(node.root), PLACEHOLDER)


@pytest.fixture(scope="module")
def nodes(node_factory: NodeFactory) -> dict[str, BuiltNode]:
    return {name: node_factory(name, layout) for name, layout in LAYOUTS.items()}


# --- goldens --------------------------------------------------------------------------------


@needs_nodes
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_golden(name: str, nodes: dict[str, BuiltNode]) -> None:
    node = nodes[name]
    rc, out, err = generate([*node_args(node), "--mode", "procfs"])
    assert rc == 0, err
    parse_spec(out, f"{name}.yaml")  # our validator accepts it
    text = templated(body(out), node)
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), f"regenerate with UPDATE_GOLDEN=1 if intended ({name})"
    parse_spec(golden.read_text(), str(golden))


def test_goldens_are_valid_specs() -> None:
    files = sorted(GOLDEN.glob("*.yaml"))
    assert len(files) >= 5
    for path in files:
        spec = parse_spec(path.read_text(), str(path)).data
        assert spec.kind == "nvidia.com/gpu"
        assert spec.cdi_version == "0.7.0"  # additionalGids for the 0660 DRM nodes


def test_yaml_output_matches_pyyaml(nodes: dict[str, BuiltNode]) -> None:
    # Our writer gives, byte for byte, what PyYAML's C dumper gives for the same document
    # (the settings cdi.spec.dump_spec used when it called PyYAML).
    from cdi.model import to_dict

    for node in nodes.values():
        rc, out, _ = generate([*node_args(node), "--mode", "procfs"])
        assert rc == 0
        document = to_dict(parse_spec(out).data)
        assert body(out) == "---\n" + yaml.dump(
            document, Dumper=yaml.CSafeDumper, sort_keys=False, default_flow_style=False,
            allow_unicode=True, width=1 << 16)


@pytest.mark.parametrize("text", ["1", "3:0", "0:0", "yes", "~", "", "a: b", "x #y", "-", "foo:",
                                  "null", "1.5", "tmp dir/x", "é", ".inf", "--link", "=", "0x1F",
                                  "1_000", "2001-12-14", "a,b", "+1", "'q'", '"', "a\nb"])
def test_yaml_emitter_round_trips(text: str) -> None:
    doc = {"k": [text], "m": {}, "l": [], "n": [{"a": 1, "b": {"c": [1, {"d": text}]}}]}
    assert yaml.safe_load(dump_yaml(doc)) == doc


_KEYS = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=6)
_LEAVES = st.one_of(st.text(max_size=12), st.integers(-(2**40), 2**40), st.booleans())
_DOCUMENTS = st.dictionaries(_KEYS, st.recursive(
    _LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20), max_size=5)


@settings(max_examples=400, deadline=None)
@given(_DOCUMENTS)
def test_yaml_emitter_round_trips_any_document(doc: dict) -> None:
    # Lists in lists, empty containers in lists and every string PyYAML might misread.
    assert yaml.safe_load(dump_yaml(doc)) == doc


# --- content --------------------------------------------------------------------------------


@needs_nodes
def test_mig_gpus_not_emitted_whole(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["mig"]
    _, out, _ = generate([*node_args(node), "--mode", "procfs"])
    spec = parse_spec(out).data
    names = {d.name for d in spec.devices}
    assert "0" not in names and "3" not in names
    gpu = node.manifest["gpus"][0]
    slots = [f"{g['index']}:gi{m['gi']}-ci{m['ci']}" for g in node.manifest["gpus"]
             for m in g["mig_devices"]]
    assert len(slots) == 9 and set(slots) | {"1", "2", "all"} <= names
    assert not any(re.fullmatch(r"\d+:\d+", n) for n in names)  # procfs knows no i:j
    mig = next(d for d in spec.devices if d.name == slots[0]).container_edits
    caps = {f"/dev/nvidia-caps/nvidia-cap{gpu['mig_devices'][0][k]}"
            for k in ("gi_cap_minor", "ci_cap_minor")}
    assert {n.path for n in mig.device_nodes} == {"/dev/nvidia0", *caps}
    # minors are not indices: GPU index 4 is /dev/nvidia7
    gpu4 = next(d for d in spec.devices if d.name == "4").container_edits
    assert "/dev/nvidia7" in {n.path for n in gpu4.device_nodes}


@needs_nodes
def test_device_nodes_are_stat_ed(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["one-gpu"]
    _, out, _ = generate([*node_args(node), "--mode", "procfs"])
    spec = parse_spec(out).data
    by_path = {n.path: n for n in spec.container_edits.device_nodes}
    uvm = by_path["/dev/nvidia-uvm"]
    assert (uvm.type, uvm.major, uvm.minor, uvm.file_mode) == ("c", 508, 0, 0o666)
    assert uvm.host_path == str(node.dev_root / "dev/nvidia-uvm")
    gpu = next(d for d in spec.devices if d.name == "0").container_edits
    card = next(n for n in gpu.device_nodes if n.path == "/dev/dri/card0")
    assert (card.major, card.gid, card.file_mode) == (226, 44, 0o660)


@needs_nodes
def test_driver_container_paths(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["driver-container"]
    _, out, _ = generate([*node_args(node), "--mode", "procfs"])
    spec = parse_spec(out).data
    libcuda = next(m for m in spec.container_edits.mounts
                   if m.container_path.endswith(f"libcuda.so.{node.driver_version}"))
    assert libcuda.host_path.startswith(str(node.driver_root))
    assert libcuda.container_path == f"{node.manifest['lib_dir']}/libcuda.so.{node.driver_version}"
    ctl = next(n for n in spec.container_edits.device_nodes if n.path == "/dev/nvidiactl")
    assert ctl.host_path == str(node.dev_root / "dev/nvidiactl")


@needs_nodes
def test_hooks_and_links(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["rhel"]
    _, out, _ = generate([*node_args(node), "--mode", "procfs"])
    spec = parse_spec(out).data
    # One entry does everything, so a container starts one hook process, whatever it asks;
    # the operations in nvidia-ctk's order (enable-cuda-compat before update-ldcache).
    (hook,) = spec.container_edits.hooks
    assert hook.args[:3] == ("nri-cdi", "hook", "create-symlinks")
    assert hook.path == HOOK and hook.hook_name == "createContainer"
    assert not any(d.container_edits.hooks for d in spec.devices)
    compat = hook.args.index("enable-cuda-compat")
    split = hook.args.index("update-ldcache")
    params = hook.args.index("disable-device-node-modification")
    assert compat < split < params == len(hook.args) - 1
    links = hook.args[3:compat]
    v = node.driver_version
    assert f"libcuda.so.{v}::/usr/lib64/libcuda.so.1" in links
    assert "libcuda.so.1::/usr/lib64/libcuda.so" in links
    assert f"libGLX_nvidia.so.{v}::/usr/lib64/libGLX_indirect.so.0" in links
    # The devices' by-path links, each made only in a container that has its DRM node.
    device_links = [links[i + 1] for i, a in enumerate(links) if a == "--device-link"]
    assert device_links and all(d.startswith("/dev/dri/card") or d.startswith(
        "/dev/dri/renderD") for d in device_links)
    gpu0 = next(d for d in spec.devices if d.name == "0").container_edits.device_nodes
    card = next(n.path for n in gpu0 if n.path.startswith("/dev/dri/card"))
    assert any(d.startswith(f"{card}::../{card.rsplit('/', 1)[1]}::/dev/dri/by-path/pci-")
               for d in device_links)
    assert hook.args[compat + 1:split] == (f"--host-driver-version={v}",)
    assert hook.args[split + 1:params] == (
        "--folder", "/usr/lib64", "--folder", "/usr/lib64/vdpau")


@needs_nodes
def test_link_mode_mounts(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["one-gpu"]
    _, out, _ = generate([*node_args(node), "--mode", "procfs", "--link-mode", "mounts"])
    edits = parse_spec(out).data.container_edits
    assert not edits.hooks
    lib = node.manifest["lib_dir"]
    mounts = {m.container_path: m for m in edits.mounts}
    so1 = mounts[f"{lib}/libcuda.so.1"]
    assert so1.host_path == str(node.lib_dir / f"libcuda.so.{node.driver_version}")
    assert "ro" in so1.options
    assert mounts[f"{lib}/libcuda.so"].host_path == so1.host_path
    assert f"NRI_CDI_LD_LIBRARY_PATH={lib}:{lib}/vdpau" in edits.env
    for device in parse_spec(out).data.devices:
        assert not device.container_edits.hooks  # no by-path hooks either
        # The by-path names: each a mount of the node it names, which keeps its one
        # device node (one device-cgroup rule per node).
        device_nodes = device.container_edits.device_nodes
        numbers = [(n.major, n.minor) for n in device_nodes]
        assert len(numbers) == len(set(numbers)), device.name
        hosts = {n.path: n.host_path or n.path for n in device_nodes}
        by_path = [m for m in device.container_edits.mounts
                   if m.container_path.startswith("/dev/dri/by-path/pci-")]
        assert sorted(m.container_path.rsplit("-", 1)[1] for m in by_path) == \
            ["card", "render"], device.name
        for m in by_path:
            link = node.dev_root / m.container_path.lstrip("/")
            target = "/dev/dri/" + os.readlink(link).rsplit("/", 1)[1]
            assert m.host_path == hosts[target], m
            assert not {"ro", "nodev"} & set(m.options), m


def test_hooks_default_to_the_isolated_interpreter_entry(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["one-gpu"]
    rc, out, err = generate(["--driver-root", str(node.driver_root), "--dev-root",
                             str(node.dev_root)])
    assert rc == 0, err
    hooks = parse_spec(out).data.container_edits.hooks
    assert [h.args[1:5] for h in hooks] == [
        ("-I", "-S", hook_entry.ENTRY_SCRIPT, "create-symlinks")]
    ops = [a for a in hooks[0].args if a in cli_ops.operations()]
    assert ops == ["create-symlinks", "enable-cuda-compat", "update-ldcache",
                   "disable-device-node-modification"]
    assert all(h.path == h.args[0] == sys.executable and h.env == hook_entry.HOOK_ENV
               for h in hooks)
    assert cli._hook_path("/x/nri-cdi") == "/x/nri-cdi"


def test_generator_version_matches_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == GENERATOR_VERSION


# --- NVML mode through nvidia-ml-py and the node's simulated libnvidia-ml ---------------------

needs_pynvml = pytest.mark.skipif(importlib.util.find_spec("pynvml") is None,
                                  reason="nvidia-ml-py (pynvml) is not installed")


@pytest.fixture(scope="module")
def mig_node(node_factory: NodeFactory) -> BuiltNode:
    """MIG without graphics profiles: procfs sees everything NVML sees except UUIDs.
    Instances created in GPU-instance-id order, the order procfs mode numbers them in."""
    return node_factory("mig-nogfx", NodeLayout.uniform(
        3, mig={1: "2g.20gb,1g.10gb*2"}, minors=[2, 0, 1], seed="mig-nogfx"))


def _nvml_and_procfs(node: BuiltNode, extra: list[str]) -> tuple[str, str]:
    rc, nvml_out, err = generate([*node_args(node), "--mode", "nvml", *extra])
    assert rc == 0, err
    rc, procfs_out, err = generate([*node_args(node), "--mode", "procfs", *extra])
    assert rc == 0, err
    return nvml_out, procfs_out


@needs_pynvml
@needs_nodes
@pytest.mark.parametrize("name", ["one-gpu", "eight-gpu", "rhel", "driver-container"])
def test_nvml_equals_procfs(name: str, nodes: dict[str, BuiltNode]) -> None:
    node = nodes[name]
    nvml_out, procfs_out = _nvml_and_procfs(node, [])
    assert body(nvml_out) == body(procfs_out)
    assert "(nvml mode)" in nvml_out
    # NVML was loaded from the driver root, not from wherever the loader looks.
    import pynvml
    assert pynvml.nvmlLib._name == str(node.lib_dir / f"libnvidia-ml.so.{node.driver_version}")


@needs_pynvml
@needs_nodes
def test_nvml_equals_procfs_with_mig(mig_node: BuiltNode) -> None:
    strategies = ["--device-name-strategy", "index", "--device-name-strategy", "type-index"]
    nvml_out, procfs_out = _nvml_and_procfs(mig_node, strategies)
    names = {d.name for d in parse_spec(nvml_out).data.devices}
    assert names == {"0", "2", "1:0", "1:1", "1:2", "gpu0", "gpu2", "mig1:0", "mig1:1",
                     "mig1:2", "all"}
    # procfs names the same slices by GPU-instance and compute-instance id, with the same edits.
    migs = mig_node.manifest["gpus"][1]["mig_devices"]
    renames = {f"1:{m['index']}": f"1:gi{m['gi']}-ci{m['ci']}" for m in migs}
    renames |= {f"mig{k}": f"mig{v}" for k, v in renames.items()}
    by_name = {renames.get(d.name, d.name): d._replace(name=renames.get(d.name, d.name))
               for d in parse_spec(nvml_out).data.devices}
    procfs = parse_spec(procfs_out).data
    assert {d.name: d for d in procfs.devices} == by_name
    assert procfs.container_edits == parse_spec(nvml_out).data.container_edits
    # Only NVML knows MIG UUIDs: with the uuid strategy they appear in nvml mode only.
    nvml_out, procfs_out = _nvml_and_procfs(mig_node, [])
    mig_uuids = {m["uuid"] for m in migs}
    assert mig_uuids <= {d.name for d in parse_spec(nvml_out).data.devices}
    assert not mig_uuids & {d.name for d in parse_spec(procfs_out).data.devices}


@pytest.fixture(scope="module")
def gfx_first_node(node_factory: NodeFactory) -> BuiltNode:
    """The graphics instance created last gets the lowest GPU-instance id (3) but NVML index
    2: sorting by GI id, as procfs could, would call it 0:0 (issue 15, defect 5)."""
    return node_factory("gfx-first", NodeLayout.uniform(
        1, mig={0: "1g.10gb*2,2g.20gb+gfx"}, seed="gfx-first"))


@needs_pynvml
@needs_nodes
def test_procfs_never_gives_a_slice_nvmls_name_for_another(gfx_first_node: BuiltNode) -> None:
    node = gfx_first_node
    migs = node.manifest["gpus"][0]["mig_devices"]
    assert [m["gi"] for m in migs] == [7, 8, 3]
    rc, nvml_out, _ = generate([*node_args(node), "--mode", "nvml"])
    assert rc == 0
    rc, procfs_out, err = generate([*node_args(node), "--mode", "procfs"])
    assert rc == 0
    assert "cannot tell NVML's MIG device indices" in err

    def caps(text: str, name: str) -> set[str]:
        device = next(d for d in parse_spec(text).data.devices if d.name == name)
        return {n.path for n in device.container_edits.device_nodes if "caps" in n.path}

    procfs_names = {d.name for d in parse_spec(procfs_out).data.devices}
    assert not any(re.fullmatch(r"\d+:\d+", n) for n in procfs_names)
    for m in migs:
        want = {f"/dev/nvidia-caps/nvidia-cap{m[k]}" for k in ("gi_cap_minor", "ci_cap_minor")}
        assert caps(nvml_out, f"0:{m['index']}") == want  # as nvidia-ctk names it
        assert caps(procfs_out, f"0:gi{m['gi']}-ci{m['ci']}") == want


@needs_pynvml
@needs_nodes
def test_nvml_gfx_mig_gets_drm_nodes(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["mig"]  # GPU 3's second MIG device is 2g.20gb+gfx
    nvml_out, procfs_out = _nvml_and_procfs(node, [])

    def nodes_of(text: str, name: str) -> set[str]:
        spec = parse_spec(text).data
        return {n.path for n in next(d for d in spec.devices if d.name == name)
                .container_edits.device_nodes}

    assert any(p.startswith("/dev/dri/") for p in nodes_of(nvml_out, "3:1"))
    assert not any(p.startswith("/dev/dri/") for p in nodes_of(nvml_out, "3:0"))
    gfx = node.manifest["gpus"][3]["mig_devices"][1]
    # procfs cannot see the +gfx attribute: no DRM nodes (and it says so).
    assert not any(p.startswith("/dev/dri/")
                   for p in nodes_of(procfs_out, f"3:gi{gfx['gi']}-ci{gfx['ci']}"))


@needs_pynvml
@needs_nodes
def test_auto_falls_back_to_procfs_and_says_so(nodes: dict[str, BuiltNode],
                                               monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    node = nodes["one-gpu"]
    # The simulated library answers nvmlInit with NVML_ERROR_DRIVER_NOT_LOADED.
    monkeypatch.setenv("SIMNODE_NVML_NODE", str(tmp_path / "no-such-node.txt"))
    rc, out, err = generate(node_args(node))
    assert rc == 0
    assert "mode auto: using procfs (NVML unavailable" in err
    assert "Driver Not Loaded" in err
    assert "(procfs mode)" in out


@needs_pynvml
@needs_nodes
def test_auto_uses_nvml_when_it_works(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["one-gpu"]
    rc, out, err = generate(node_args(node))
    assert rc == 0 and "mode auto: using nvml" in err and "(nvml mode)" in out


# --- metadata, fingerprint, versions --------------------------------------------------------


@needs_pynvml
@needs_nodes
def test_metadata_sidecar(nodes: dict[str, BuiltNode], tmp_path: Path) -> None:
    node = nodes["mig"]
    target = tmp_path / "nvidia.yaml"
    rc, _, err = generate([*node_args(node), "--mode", "nvml", "--output", str(target)])
    assert rc == 0, err
    text = target.read_text()
    spec = parse_spec(text, str(target)).data
    assert not spec.annotations and not any(d.annotations for d in spec.devices)
    assert spec.cdi_version == "0.7.0"  # additionalGids for the 0660 DRM nodes
    meta = json.loads((tmp_path / "nvidia.yaml.meta").read_text())
    assert re.search(r"^# fingerprint: (sha256:[0-9a-f]{64})$", text, re.M).group(1) == \
        meta["fingerprint"]
    assert meta["driver"] == {"version": node.driver_version, "cudaVersion": "13.0",
                              "libraryDirs": [node.manifest["lib_dir"],
                                              node.manifest["lib_dir"] + "/vdpau"]}
    gpu1 = meta["devices"]["1"]
    assert (gpu1["arch"], gpu1["brand"], gpu1["type"]) == ("9.0", "nvidia", "gpu")
    assert meta["devices"]["3:1"]["profile"] == "2g.20gb+gfx"
    # By host file (the driver root's), whatever container path mounts it.
    lib = f"{node.driver_root}{node.manifest['lib_dir']}"
    caps = meta["capabilities"]
    assert f"{lib}/libcuda.so.{node.driver_version}" in caps["compute"]
    assert f"{node.driver_root}/usr/bin/nvidia-smi" in caps["utility"]
    assert f"{lib}/libnvidia-glcore.so.{node.driver_version}" in caps["graphics"]
    # The driver's configuration files too: OpenCL's ICD is compute's, Vulkan's graphics'.
    assert f"{node.driver_root}/etc/OpenCL/vendors/nvidia.icd" in caps["compute"]
    assert [p for p in caps["graphics"] if p.endswith("/vulkan/icd.d/nvidia_icd.json")]
    # The sidecar does not end in .json: spec folders would read it as a broken spec.
    assert not any(p.name.endswith((".json", ".yaml")) and p != target for p in tmp_path.iterdir())


@needs_nodes
def test_annotations_only_when_cdi_version_allows(nodes: dict[str, BuiltNode]) -> None:
    node = nodes["one-gpu"]
    rc, out, err = generate([*node_args(node), "--mode", "procfs", "--cdi-version", "0.6.0"])
    assert rc == 0, err
    spec = parse_spec(out).data
    assert spec.cdi_version == "0.6.0"
    assert spec.annotations["nri-cdi/fingerprint"].startswith("sha256:")
    assert "libcuda.so" in spec.annotations["nri-cdi/libraries.compute"]
    gpu = next(d for d in spec.devices if d.name == "0")
    assert gpu.annotations["nri-cdi/driver-version"] == node.driver_version
    rc, out, _ = generate([*node_args(node), "--mode", "procfs", "--cdi-version", "0.5.0"])
    assert rc == 0 and parse_spec(out).data.cdi_version == "0.5.0"


@needs_nodes
def test_cdi_version_too_low_fails_clearly(nodes: dict[str, BuiltNode], tmp_path: Path) -> None:
    node = nodes["one-gpu"]
    target = tmp_path / "nvidia.yaml"
    target.write_text("previous\n")
    rc, out, err = generate([*node_args(node), "--mode", "procfs", "--cdi-version", "0.4.0",
                             "--output", str(target)])
    assert rc == 1 and not out
    assert "needs cdiVersion 0.5.0" in err and "--cdi-version 0.4.0" in err
    assert target.read_text() == "previous\n"
    rc, _, err = generate([*node_args(node), "--cdi-version", "9.9.9"])
    assert rc == 1 and "unknown --cdi-version" in err


@needs_nodes
def test_if_changed(nodes: dict[str, BuiltNode], tmp_path: Path) -> None:
    node = nodes["one-gpu"]
    target = tmp_path / "nvidia.yaml"
    args = [*node_args(node), "--mode", "procfs", "--output", str(target), "--if-changed"]
    assert generate(args)[0] == 0
    before = target.stat()
    rc, _, err = generate(args)
    assert rc == 0 and "up to date" in err
    assert target.stat().st_ino == before.st_ino  # not replaced
    rc, _, err = generate([*args, "--device-name-strategy", "uuid"])  # other options
    assert "up to date" not in err and target.stat().st_ino != before.st_ino
    target.write_text(target.read_text() + "# edited\n")  # a hand-edited spec is replaced
    rc, _, err = generate([*args, "--device-name-strategy", "uuid"])
    assert "up to date" not in err and "# edited" not in target.read_text()


def test_fingerprint_tracks_what_makes_a_spec_stale() -> None:
    from cdi.nvidia.discover import Gpu, NodeInfo
    from cdi.nvidia.driver import DeviceNodeInfo, DeviceNodes, DriverFiles
    from cdi.nvidia.generate import Inventory, Options, fingerprint

    def inv(version: str = "580.1", uvm: int = 508, uuid: str = "GPU-a") -> Inventory:
        ctl = DeviceNodeInfo(path="/dev/nvidia-uvm", host="/dev/nvidia-uvm", type="c",
                             major=uvm, minor=0, mode=0o666, gid=0)
        driver = DriverFiles(version=version, lib_dirs=(), libraries=(), links=(), binaries=(),
                             ipc=(), firmware=(), configs=(), control_nodes=(ctl,))
        gpu = Gpu(index=0, uuid=uuid, minor=0, bus_id="0000:01:00.0", name="x")
        node = NodeInfo(mode="procfs", driver_version=version, cuda_version=None, gpus=(gpu,))
        return Inventory(node=node, driver=driver, gpu_nodes={0: DeviceNodes(nodes=())})

    base = fingerprint(inv(), Options())
    assert fingerprint(inv(), Options()) == base
    assert fingerprint(inv(version="580.2"), Options()) != base
    assert fingerprint(inv(uvm=509), Options()) != base
    assert fingerprint(inv(uuid="GPU-b"), Options()) != base
    assert fingerprint(inv(), Options(strategies=("uuid",))) != base


def test_the_all_device_keeps_every_field_of_the_devices_edits() -> None:
    # Merged as a runtime merges edits (cdi.edits.merge): intelRdt and netDevices too.
    from cdi.model import ContainerEdits, DeviceData, DeviceNode, IntelRdt, NetDevice
    from cdi.nvidia.generate import all_device_edits

    rdt = IntelRdt(clos_id="gpu")
    net = NetDevice(host_interface_name="ib0", name="net0")
    devices = [
        DeviceData(name="0", container_edits=ContainerEdits(
            device_nodes=(DeviceNode(path="/dev/nvidia0"),), net_devices=(net,))),
        DeviceData(name="1", container_edits=ContainerEdits(
            device_nodes=(DeviceNode(path="/dev/nvidia1"),), intel_rdt=rdt,
            net_devices=(net,))),
    ]
    edits = all_device_edits(devices, ContainerEdits(env=("NVIDIA_VISIBLE_DEVICES=void",)))
    assert [n.path for n in edits.device_nodes] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert edits.intel_rdt == rdt
    assert edits.net_devices == (net,)
