"""The parts of ``doctor --e2e`` that need no containerd: how two specs are compared,
what the container checks expect from a spec, and how a waiting process is described."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

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


def _installed(tmp_path: Path) -> Path:
    """nri-cdi installed as pip installs the wheel (from a copy of the tracked sources, so
    the checkout gets no build folder): a site folder without the repository's scripts."""
    import shutil
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True,
                             check=True).stdout.decode().split("\0")
    source = tmp_path / "source"
    for name in filter(None, tracked):
        if (repo / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, source / name)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-compile", "--target", str(site),
                    str(source)], check=True, capture_output=True, timeout=300)
    return site


def test_doctor_e2e_from_a_wheel_says_what_is_missing_and_how(tmp_path: Path) -> None:
    import subprocess
    import sys

    site = _installed(tmp_path)
    assert not (site / "scripts").exists()
    env = {k: v for k, v in os.environ.items() if k != "NRI_CDI_CACHE"}
    done = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "doctor", "--e2e",
                           "--cache", str(tmp_path / "no-cache")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**env, "PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "nri-cdi doctor --e2e: missing prerequisites:"
    items = [line for line in lines[1:] if line.startswith("  - ")]
    assert items == lines[1:]  # one line each
    assert all(": " in item for item in items)  # what, then how
    text = "\n".join(items)
    assert "containerd 1.7 (containerd, ctr, containerd-shim-runc-v2 in " in text
    assert ("scripts/install-containerd.sh of the nri-cdi source repository, which an "
            "installed nri-cdi does not ship") in text
    assert "the CRI v1 messages (" in text and "then pass --cache DIR" in text
    assert "--containerd-address SOCK" in text


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
