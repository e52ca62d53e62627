"""tests/nri_apply.py's model of what a runtime does with an adjustment, checked against
what real runtimes did (tests/data/nri-wire/): for every container the plugin adjusted in a
recording, the container as NRI showed it to the plugin, with the plugin's recorded
adjustment applied by the model, must be the OCI spec the runtime really made of it
(recorded through CRI as a ``#spec`` mark). Where they differ, the recording is right and
the model is fixed (tests/nri_apply.py says what each recording taught it).

Compared: env, mounts in order, device nodes, the device cgroup rules, hooks. Devices the
plugin handed to the runtime's own CDI (``CDI_devices``) are applied with the CDI
library's edits, as the runtime's CDI would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format

from cdi.cache import SpecCache
from cdi.edits import apply
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.versions import RuntimeInfo
from tests.e2e.cri_recorder import substitute
from tests.e2e.nri_recorder import read_wire
from tests.nri_apply import apply_adjustment, before_nri
from tests.nri_wire import ROOT_NAME, build_world
from tests.test_nri_wire_replay import DATA, RUNTIMES, replay_ready  # noqa: F401


def _cases(lines: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any],
                                                       dict[str, Any]]]:
    """(label, CreateContainer request, the plugin's answer, the runtime's spec) for each
    case whose container the runtime created."""
    out = []
    label, request, answer = "", None, None
    for line in lines:
        if line["kind"] == "mark" and line["method"] == "#case":
            label, request, answer = line["message"]["label"], None, None
        elif line["method"] == "CreateContainer" and line["kind"] == "request":
            request = line
        elif line["method"] == "CreateContainer" and line["kind"] == "response":
            answer = line
        elif line["kind"] == "mark" and line["method"] == "#spec" and request and answer:
            out.append((label, request["message"], answer, line["message"]["spec"]))
    return out


def _runtime(lines: list[dict[str, Any]]) -> RuntimeInfo:
    configure = next(r["message"] for r in lines
                     if r["kind"] == "request" and r["method"] == "Configure")
    return RuntimeInfo.from_configure(configure["runtime_name"], configure["runtime_version"],
                                      configure.get("NRI_version", ""))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_world(tmp_path_factory.mktemp("model") / "node").root


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_model_makes_the_spec_the_runtime_made(runtime: str, replay_ready: None,  # noqa: F811
                                                   world: Path) -> None:
    lines = read_wire(DATA / f"{runtime}.jsonl")
    info = _runtime(lines)
    assert info.nri_version is not None
    names = {ROOT_NAME: str(world)}
    snapshot = SpecCache([str(world / "cdi"), str(world / "nvidia")]).refresh()
    moded = _paths_with_file_mode(world)
    cases = _cases(lines)
    assert len(cases) >= 8, [c[0] for c in cases]
    differ = []
    for label, request, answer, recorded in cases:
        container = json_format.ParseDict(substitute(request["container"], names),
                                          nri_pb2.Container())
        reply = json_format.ParseDict(substitute(answer["message"], names),
                                      nri_pb2.CreateContainerResponse())

        def cdi(spec: dict[str, Any], wanted: list[str]) -> dict[str, Any]:
            out = apply(spec, snapshot.resolve(wanted))
            if not info.native_fills_file_mode:  # CDI < 1.1 leaves an unset fileMode unset
                for node in out["linux"]["devices"]:
                    if node["path"] not in moded:
                        node.pop("fileMode", None)
            return out

        made = apply_adjustment(before_nri(container), reply.adjust, info.nri_version, cdi)
        got = substitute(_projection(made), {v: k for k, v in names.items()})
        want = {k: recorded[k] for k in got}
        if got != want:
            differ.append((label, {k: (got[k], want[k]) for k in got if got[k] != want[k]}))
    assert not differ, differ


def _projection(spec: dict[str, Any]) -> dict[str, Any]:
    linux = spec.get("linux", {})
    return {"env": spec.get("process", {}).get("env", []), "mounts": spec.get("mounts", []),
            "devices": linux.get("devices", []),
            "device_rules": linux.get("resources", {}).get("devices", []),
            "hooks": spec.get("hooks", {})}


def _paths_with_file_mode(world: Path) -> set[str]:
    """The container paths of the device nodes whose spec sets a fileMode."""
    found = set()
    for path in [*world.glob("cdi/*.json"), *world.glob("nvidia/*.yaml")]:
        doc = yaml.safe_load(path.read_text())
        edits = [doc.get("containerEdits", {}),
                 *(d.get("containerEdits", {}) for d in doc.get("devices", []))]
        found |= {n["path"] for e in edits for n in e.get("deviceNodes", []) if "fileMode" in n}
    return found
