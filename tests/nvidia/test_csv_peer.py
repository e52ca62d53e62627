"""``nri-cdi generate --mode csv`` side by side with NVIDIA's ``nvidia-ctk cdi generate --mode
csv`` on simulated Jetsons, in both link modes: device names, device nodes, additionalGids,
mounts, env, links, ld-cache folders, compat-hook arguments and hook operations must agree,
apart from ``csv_parity.INTENDED`` (docs/usage/jetson.md, "Compared with nvidia-ctk").

nvidia-ctk's output for each scenario is committed (tests/data/peers/csv-*.yaml), so the
comparison runs without the binary. Where ``$NRI_CDI_PEERS`` names it (and we are root), the
live output must also equal the recording; ``NRI_CDI_RECORD_PEERS=1`` rewrites the
recordings from the live binary first.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from nri_cdi_testbed.tegra import CSV_FOLDER, BuiltTegraNode, TegraLayout
from tests.nvidia import csv_parity, peer_parity

TegraFactory = Callable[[str, TegraLayout], BuiltTegraNode]
RECORD = os.environ.get("NRI_CDI_RECORD_PEERS") == "1"
BOARD = TegraLayout(seed="peer")
ORIN = TegraLayout(nvml=("Orin (nvgpu)",), seed="peer-orin")
FILES = tuple(f"{csv_parity.ROOT}/{CSV_FOLDER}/{name}" for name in ("devices.csv",
                                                                     "drivers.csv"))

# scenario -> (the board, options for both tools; {root} is the node's folder)
SCENARIOS: dict[str, tuple[TegraLayout, tuple[str, ...]]] = {
    "default": (BOARD, ()),
    "ignore-pattern": (BOARD, ("--csv.ignore-pattern", "**/libcuda.so",
                               "--csv.ignore-pattern", "/etc/vulkan/icd.d/*")),
    "csv-files": (BOARD, ("--csv.file", FILES[0], "--csv.file", FILES[1])),
    "type-index": (BOARD, ("--device-name-strategy", "type-index",
                           "--device-name-strategy", "index")),
    "orin": (ORIN, ()),
    "compat-container-root": (ORIN, ("--csv.compat-container-root", "/opt/compat")),
    "thor": (TegraLayout(nvml=("NVIDIA Thor",), seed="peer-thor"), ()),
    "igx-one-device": (TegraLayout(nvml=("Orin (nvgpu)", "NVIDIA RTX 6000 Ada"),
                                   seed="peer-igx"),
                       ("--feature-flag", "disable-multiple-csv-devices")),
}

def _options(node: BuiltTegraNode, scenario: str) -> list[str]:
    return [a.replace(csv_parity.ROOT, str(node.root)) for a in SCENARIOS[scenario][1]]


@pytest.fixture(scope="module")
def board(tegra_factory: TegraFactory) -> Callable[[str], BuiltTegraNode]:
    def get(scenario: str) -> BuiltTegraNode:
        layout = SCENARIOS[scenario][0]
        if layout.nvml:
            pytest.importorskip("pynvml", reason="nvidia-ml-py (pynvml) is not installed")
        return tegra_factory(f"peer-{layout.seed}", layout)
    return get


def test_every_scenario_has_its_recording() -> None:
    recorded = sorted(p.name for p in csv_parity.DATA.glob("csv-*.yaml"))
    assert recorded == sorted(f"csv-{s}.yaml" for s in SCENARIOS)
    # the four the project asked for are among them
    assert {"default", "ignore-pattern", "compat-container-root"} <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_recording_is_what_nvidia_ctk_prints(scenario: str,
                                             board: Callable[[str], BuiltTegraNode]) -> None:
    """The refresh path: the live binary against its recording (rewritten first with
    NRI_CDI_RECORD_PEERS=1)."""
    reason = csv_parity.why_not_runnable()
    if reason:
        pytest.skip(reason)
    node = board(scenario)
    argv = csv_parity.ctk_argv(node, _options(node, scenario))
    live = csv_parity.run(argv, node)
    if RECORD:
        csv_parity.recording(scenario).parent.mkdir(parents=True, exist_ok=True)
        csv_parity.recording(scenario).write_text(csv_parity.record(scenario, live, node, argv))
    assert csv_parity.summary(live, node) == \
        csv_parity.summary(csv_parity.recorded(scenario, node), node)


@pytest.mark.parametrize("link_mode", ["hooks", "mounts"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_same_as_nvidia_ctk(scenario: str, link_mode: str,
                            board: Callable[[str], BuiltTegraNode]) -> None:
    node = board(scenario)
    theirs = csv_parity.nvidia_ctk_summary(csv_parity.recorded(scenario, node), node)
    ours = csv_parity.summary(csv_parity.run(csv_parity.ours_argv(
        node, [*_options(node, scenario), "--link-mode", link_mode]), node), node)
    if link_mode == "mounts":  # nvidia-ctk has hooks only: its links as our mounts
        theirs = csv_parity.as_link_mounts(theirs, node)
    assert csv_parity.differences(ours, theirs, node) == []
    # The comparison is not vacuous: there is something to agree on.
    assert theirs["devices"]["0"]["nodes"] and theirs["common"]["mounts"]
    assert theirs["common"]["links"] or link_mode == "mounts"


def test_a_difference_is_reported(board: Callable[[str], BuiltTegraNode]) -> None:
    node = board("default")
    theirs = csv_parity.nvidia_ctk_summary(csv_parity.recorded("ignore-pattern", node), node)
    ours = csv_parity.summary(csv_parity.run(csv_parity.ours_argv(node), node), node)
    lines = csv_parity.differences(ours, theirs, node)
    assert any(line.startswith("common links: only ours") for line in lines)
    assert any(line.startswith("common mounts: only ours") for line in lines)


@pytest.fixture(scope="module")
def compared(board: Callable[[str], BuiltTegraNode]) -> dict[str, peer_parity.Comparison]:
    """Every scenario in hooks mode, every field (peer_parity.compare) against the recording."""
    out = {}
    for scenario in sorted(SCENARIOS):
        node = board(scenario)
        ours = csv_parity.run(csv_parity.ours_argv(
            node, [*_options(node, scenario), "--link-mode", "hooks"]), node)
        theirs = csv_parity.recording(scenario).read_text().replace(csv_parity.ROOT,
                                                                    peer_parity.NODE)
        out[scenario] = peer_parity.compare(ours.replace(str(node.root), peer_parity.NODE),
                                            theirs, node, csv_parity.FIELD_INTENDED)
    return out


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_field_as_nvidia_ctk(scenario: str,
                                   compared: dict[str, peer_parity.Comparison]) -> None:
    assert list(compared[scenario].differences) == []


def test_every_field_waiver_is_still_needed(
        compared: dict[str, peer_parity.Comparison]) -> None:
    used = set().union(*(c.used for c in compared.values()))
    assert sorted(set(csv_parity.FIELD_INTENDED) - used) == []
