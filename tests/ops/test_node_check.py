"""The parts of ``doctor --e2e`` that need no containerd: how two specs are compared,
what the container checks expect from a spec, and how a waiting process is described."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.node_check.check import spec_differences, spec_facts
from nri_cdi_testbed.node_check.containerd import thread_waits
from nri_cdi_testbed.waiting import wait_until


def _gpu(name: str, minor: int) -> dict[str, Any]:
    return {"name": name, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{minor}"}]}}


def _spec(*devices: dict[str, Any], mounts: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"devices": list(devices), "containerEdits": {
        "mounts": [{"hostPath": "/h" + m, "containerPath": m} for m in mounts]}}


def test_identical_specs_have_no_differences() -> None:
    spec = _spec(_gpu("0", 0), _gpu("GPU-a", 0), mounts=("/usr/bin/nvidia-smi",))
    assert spec_differences(spec, spec) == []


def test_every_difference_is_one_line() -> None:
    nvml = _spec(_gpu("0", 0), _gpu("GPU-a", 0), _gpu("0:0", 0), mounts=("/usr/bin/x",))
    procfs = _spec(_gpu("0", 1), _gpu("GPU-a", 0))
    assert spec_differences(nvml, procfs) == [
        "device 0:0: only in nvml",
        'spec: only in nvml: mounts: {"containerPath": "/usr/bin/x", "hostPath": "/h/usr/bin/x"}',
        'device 0: only in nvml: deviceNodes: {"path": "/dev/nvidia0"}',
        'device 0: only in procfs: deviceNodes: {"path": "/dev/nvidia1"}',
    ]


def test_facts_name_this_gpu_its_uuid_and_the_others_nodes() -> None:
    spec = _spec(_gpu("0", 0), _gpu("1", 1), _gpu("GPU-b", 1), _gpu("GPU-a", 0),
                 mounts=("/usr/bin/nvidia-smi", "/usr/lib64/libcuda.so.580.1"))
    facts = spec_facts(spec, 0)
    assert (facts.own_nodes, facts.other_nodes, facts.uuid) == (
        {"/dev/nvidia0"}, {"/dev/nvidia1"}, "GPU-a")
    # hooks mode mounts the versioned file; the SONAME link sits next to it
    assert (facts.smi, facts.libcuda) == ("/usr/bin/nvidia-smi", "/usr/lib64/libcuda.so.1")


def test_a_node_given_to_two_gpus_counts_as_another_gpus() -> None:
    broken = _gpu("0", 0)
    broken["containerEdits"]["deviceNodes"].append({"path": "/dev/nvidia1"})
    facts = spec_facts(_spec(broken, _gpu("1", 1)), 0)
    assert "/dev/nvidia1" in facts.own_nodes and "/dev/nvidia1" in facts.other_nodes


def test_the_plugin_keeps_the_callers_python_path(tmp_path: Path) -> None:
    # On a lent H200 node the plugin's dependencies sat on PYTHONPATH and the doctor's
    # plugin replaced it ("plugin exited (1)"): the child must import both ours and those.
    import subprocess
    import sys

    from nri_cdi_testbed.node_check.plugin import child_env

    (tmp_path / "only_on_the_callers_path.py").write_text("")
    env = child_env({**os.environ, "PYTHONPATH": str(tmp_path)})
    proc = subprocess.run([sys.executable, "-c",
                           "import only_on_the_callers_path, nri_plugin.ops.cli"],
                          env=env, cwd="/", capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# An installed nri-cdi carries no test bed: tests/ops/test_product_wheel.py.


def test_doctor_hands_the_test_bed_what_follows_e2e(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from nri_cdi_testbed.node_check import check
    from nri_plugin.ops.cli import main

    ran: list[check.Options] = []
    monkeypatch.setattr(check, "run", lambda opts: ran.append(opts) or check.Report())
    # doctor's own --json and --socket, given before --e2e, count for the check too
    assert main(["doctor", "--json", "--socket", "/s", "--e2e", "--runtime", "2.1",
                 "--gpu", "1"]) == 0
    assert [(o.nri_socket, o.runtime, o.gpu) for o in ran] == [("/s", "2.1", 1)]
    assert json.loads(capsys.readouterr().out)["checks"] == []
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--e2e", "--help"])
    shown = capsys.readouterr().out
    assert done.value.code == 0
    assert shown.startswith("usage: nri-cdi doctor --e2e") and "--sim-node DIR" in shown


def test_the_checkout_names_its_install_script(tmp_path: Path) -> None:
    from nri_cdi_testbed.node_check import paths

    previous = os.environ.get(paths.CACHE_ENV)
    os.environ[paths.CACHE_ENV] = str(tmp_path)
    try:
        missing = paths.missing_prerequisites(("2.1",))
    finally:
        if previous is None:
            del os.environ[paths.CACHE_ENV]
        else:
            os.environ[paths.CACHE_ENV] = previous
    script = Path(__file__).resolve().parents[2] / "scripts" / "install-containerd.sh"
    assert any(m.startswith("containerd 2.1 (") and f"run: bash {script}" in m for m in missing)


def test_a_thread_waiting_on_a_pipe_names_who_else_holds_it() -> None:
    # A process reading a pipe whose writer never closes waits forever: the listing of a
    # hung call names the pipe and the other holders (here this test, holding the writer).
    reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        lines = wait_until(lambda: [line for line in thread_waits(reader.pid)
                                    if "in read(fd 0: pipe:[" in line],
                           "cat waiting in its read of the pipe",
                           seen=lambda: thread_waits(reader.pid))
    finally:
        reader.kill()
        reader.wait()
    assert f"also held by {os.getpid()} " in lines[0], lines
