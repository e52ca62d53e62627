"""The ``doctor --e2e --json`` reports recorded on the real GPU nodes
(tests/data/real-node-*/doctor-containerd-*.json), read against the node's other records.

They hold no containerd configuration: ``doctor --e2e`` runs a private containerd with a
configuration of its own making, so there is nothing for ``containerd_config`` to read
back. What they do hold is what the real runtime and the real GPU did with our spec, and
that is checked against what the same node's other records say, which were made by other
programs (``nvidia-smi``, ``ls -l /dev``, ``/proc``): the GPU the container listed is the
node's GPU 0, the device nodes it saw are GPU 0's in the recorded spec, the driver files
it found are where the recorded spec puts them, the requirement refusal names the node's
driver version, the runtime is the one the file is named for, every check of a run the
README calls passing passed, and the README's figures are the reports' own.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

DATA = Path(__file__).resolve().parent / "data"
REPORTS = sorted(DATA.glob("real-node-*/doctor-containerd-*.json"))
# A report the README calls a failing first run, kept for what it shows.
BEFORE_FIXES = "-before-fixes"


def _report(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _checks(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["name"]: c for c in report["checks"]}


def _node_txt(path: Path) -> str:
    return (path.parent / "node.txt").read_text()


def _gpu0(path: Path) -> tuple[str, str]:
    """GPU 0's ``nvidia-smi -L`` line and the driver version, from node.txt."""
    text = _node_txt(path)
    line = re.search(r"^GPU 0: .*$", text, re.MULTILINE)
    version = re.search(r"^NVRM version: .*?  (\d+\.\d+\.\d+)  ", text, re.MULTILINE)
    assert line is not None and version is not None, path
    return line.group(0), version.group(1)


def _spec(path: Path, link: str) -> dict[str, Any]:
    return dict(yaml.safe_load((path.parent / f"spec-nvml-{link}.yaml").read_text()))


def test_every_record_has_its_reports() -> None:
    records = sorted(DATA.glob("real-node-*-580.159.04*"))
    assert records and all((r / "doctor-containerd-1.7.json").is_file()
                           and (r / "doctor-containerd-2.1.json").is_file() for r in records)


@pytest.mark.parametrize("path", REPORTS, ids=[f"{p.parent.name}/{p.stem}" for p in REPORTS])
def test_report_agrees_with_the_nodes_other_records(path: Path) -> None:
    report = _report(path)
    version = re.search(r"doctor-containerd-(\d+\.\d+)", path.name)
    assert version is not None
    assert report["runtime"] == f"private containerd {version.group(1)}"
    assert report["node"] == "real (NVML answers)" and report["driver_root"] == "/"
    checks = _checks(report)
    if BEFORE_FIXES not in path.stem:
        assert [n for n, c in checks.items() if c["status"] != "PASS"] == []
        assert report["differences"] == []
    listed, driver = _gpu0(path)
    uuid = re.search(r"UUID: (GPU-[0-9a-f-]+)", listed)
    assert uuid is not None
    for link in ("hooks", "mounts"):
        spec = _spec(path, link)
        (gpu,) = [d for d in spec["devices"] if d["name"] == "0"]
        nodes = sorted(n["path"] for n in gpu["containerEdits"]["deviceNodes"])
        assert checks[f"device nodes [{link}]"]["detail"] == (
            f"present {nodes}; missing []; other GPUs' nodes visible []")
        smi = checks[f"nvidia-smi -L [{link}]"]
        if smi["status"] == "PASS":
            assert smi["detail"] == f"exit 0, listed [{listed!r}]"
        assert uuid.group(1) in {d["name"] for d in spec["devices"]}
    # Where the container found the driver files is where the recorded spec puts them.
    found = dict(re.findall(r"(\S+) at ([^\s,]+)", checks["driver files in the spec"]["detail"]))
    mounted = {m["containerPath"] for m in _spec(path, "mounts")["containerEdits"]["mounts"]}
    assert found and set(found.values()) <= mounted, (found, path)
    assert all(p.rpartition("/")[2] == name for name, p in found.items())
    refused = checks["NVIDIA_REQUIRE_CUDA refused"]["detail"]
    assert f"node driver {driver} supports CUDA" in refused


@pytest.mark.parametrize("record", sorted({p.parent for p in REPORTS}), ids=lambda p: p.name)
def test_readme_figures_are_the_reports(record: Path) -> None:
    """A Create+Start median the README quotes is one of that node's reports' figures."""
    readme = (record / "README.md").read_text() if (record / "README.md").is_file() else ""
    quoted = re.search(r"without a GPU ([\d.]+) / ([\d.]+) ms, with one in hooks mode "
                       r"([\d.]+) / ([\d.]+) ms, in\s+mounts mode ([\d.]+) / ([\d.]+) ms", readme)
    if quoted is None:
        pytest.skip(f"{record.name}'s README quotes no Create+Start medians")
    figures = [float(x) for x in quoted.groups()]
    timings = [_report(record / f"doctor-containerd-{v}.json")["timings_ms"]
               for v in ("1.7", "2.1")]
    keys = ("create+start without GPU", "create+start with GPU [hooks]",
            "create+start with GPU [mounts]")
    assert figures == [t[k] for k in keys for t in timings]
