"""Our NRI plugin against a real containerd: injection, failures, reconnects, launch mode,
and the same result as containerd's own CDI support."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nri_cdi_testbed.waiting import wait_until
from tests.e2e.conftest import ContainerdFactory
from tests.e2e.containerd import Containerd
from tests.e2e.cri import CriClient
from tests.e2e.images import BUSYBOX_IMAGE
from tests.e2e.parity import nri_mount_order, runtime_of
from tests.e2e.plugin import PluginProcess, launcher_script
from tests.helpers import make_char_device

KIND = "test.example/gpu"
SLEEP = ["sleep", "600"]
# Majors from the range Linux leaves for local use, so that no default device-cgroup rule
# of the container (for /dev/null, /dev/zero, ...) can be mistaken for ours.
GPU_MAJOR = 241


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, e2e_ready: None) -> Path:
    """A fake driver: two GPU nodes, a library folder, a hook that records its calls."""
    root = tmp_path_factory.mktemp("node")
    host = root / "host"
    (host / "lib").mkdir(parents=True)
    (host / "lib" / "libtest.so.1").write_text("fake driver library\n")
    (root / "markers").mkdir()
    for minor in (0, 1):
        make_char_device(host / f"gpu{minor}", major=GPU_MAJOR, minor=minor, mode=0o666)
    hook = host / "hook.sh"
    hook.write_text(
        "#!/bin/sh\n"
        "state=$(cat)\n"
        "id=$(printf '%s' \"$state\" | sed -n 's/.*\"id\": *\"\\([^\"]*\\)\".*/\\1/p')\n"
        f"printf '%s' \"$state\" > {root}/markers/$id\n")
    hook.chmod(0o755)
    specs = root / "cdi"
    specs.mkdir()
    (specs / "test.yaml").write_text(f"""\
cdiVersion: 0.5.0
kind: {KIND}
containerEdits:
  env: [TEST_DRIVER=1]
  mounts:
  - {{hostPath: {host}/lib, containerPath: /usr/lib/testdrv,
     options: [ro, nosuid, nodev, rbind, rprivate]}}
  hooks:
  - {{hookName: createContainer, path: {hook}, args: [hook.sh]}}
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{{path: /dev/testgpu0, hostPath: {host}/gpu0}}]
    env: [TEST_GPU=0]
- name: "1"
  containerEdits:
    deviceNodes: [{{path: /dev/testgpu1, hostPath: {host}/gpu1}}]
    env: [TEST_GPU=1]
""")
    return root


@pytest.fixture(scope="module")
def ctrd(containerd: ContainerdFactory) -> Containerd:
    return containerd()


@pytest.fixture
def plugin(ctrd: Containerd, node: Path) -> Iterator[PluginProcess]:
    process = PluginProcess(ctrd.nri_socket, [node / "cdi"], node / "plugin.log").start()
    yield process
    process.kill()


def run(cri: CriClient, pod: str, name: str, **kwargs: Any) -> str:
    return cri.run_container(pod, name, BUSYBOX_IMAGE, command=SLEEP, **kwargs)


def sh(cri: CriClient, container: str, script: str) -> str:
    return cri.exec_sync(container, ["sh", "-c", script]).stdout


def test_pod_annotation_injects_device_mount_env_and_hook(
    cri: CriClient, plugin: PluginProcess, node: Path
) -> None:
    pod = cri.run_pod("gpu-pod", annotations={"cdi.k8s.io/gpu": f"{KIND}=0"})
    ctr = run(cri, pod, "app")
    assert sh(cri, ctr, "ls -l /dev/testgpu0").startswith("crw-rw-rw-")
    assert f"{GPU_MAJOR},   0" in sh(cri, ctr, "ls -l /dev/testgpu0")
    assert sh(cri, ctr, "test -e /dev/testgpu1 && echo leaked || echo absent") == "absent\n"
    assert sh(cri, ctr, "cat /usr/lib/testdrv/libtest.so.1") == "fake driver library\n"
    assert "Read-only file system" in cri.exec_sync(
        ctr, ["touch", "/usr/lib/testdrv/x"]).stderr
    env = sh(cri, ctr, "env")
    assert "TEST_DRIVER=1" in env and "TEST_GPU=0" in env
    state = json.loads((node / "markers" / ctr).read_text())  # the hook ran, for this container
    assert state["id"] == ctr
    spec = cri.runtime_spec(ctr)
    # No fileMode: the CDI libraries of containerd 1.7 and 2.1 leave an unset one unset
    # (runc then creates the node 0666), and so does the plugin on them; from 2.2.1 (CDI
    # 1.1) it is the host node's.
    wanted = {"path": "/dev/testgpu0", "type": "c", "major": GPU_MAJOR, "minor": 0}
    if runtime_of(cri).native_fills_file_mode:
        wanted["fileMode"] = stat.S_IMODE(os.stat(node / "host" / "gpu0").st_mode)
    assert wanted in spec["linux"]["devices"]
    plugin.wait_for_log("injected container=app")  # logged once the reply is out


def test_per_container_key_reaches_only_the_named_container(
    cri: CriClient, plugin: PluginProcess
) -> None:
    pod = cri.run_pod("two", annotations={"cdi.k8s.io/ctr.worker": f"{KIND}=1"})
    worker, sidecar = run(cri, pod, "worker"), run(cri, pod, "sidecar")
    assert "TEST_GPU=1" in sh(cri, worker, "env")
    assert sh(cri, worker, "test -c /dev/testgpu1 && echo yes") == "yes\n"
    assert sh(cri, sidecar, "test -e /dev/testgpu1 && echo leaked || echo absent") == "absent\n"
    assert "TEST_GPU" not in sh(cri, sidecar, "env")


def test_container_that_asks_for_nothing_is_untouched(
    cri: CriClient, plugin: PluginProcess
) -> None:
    pod = cri.run_pod("plain")
    spec = cri.runtime_spec(run(cri, pod, "plain"))
    assert not [d for d in spec["linux"].get("devices", []) if d["path"].startswith("/dev/test")]
    assert not [e for e in spec["process"]["env"] if e.startswith("TEST_")]


@pytest.mark.parametrize("annotations, container_annotations, message", [
    ({"cdi.k8s.io/gpu": f"{KIND}=7"}, {},
     f"unresolvable CDI devices: {KIND}=7 (from pod annotation 'cdi.k8s.io/gpu')"),
    ({}, {"cdi.k8s.io/dp_0": "gpu0"},
     "container annotation 'cdi.k8s.io/dp_0': invalid CDI device name 'gpu0'"),
    ({"cdi.k8s.io/gpu": f"{KIND}=0,"}, {},
     "pod annotation 'cdi.k8s.io/gpu': invalid CDI device name ''"),
])
def test_bad_requests_fail_only_that_container_with_our_message(
    cri: CriClient, plugin: PluginProcess, annotations: dict[str, str],
    container_annotations: dict[str, str], message: str
) -> None:
    pod = cri.run_pod("bad", annotations=annotations)
    with pytest.raises(cri.grpc.RpcError) as info:
        cri.create_container(pod, "app", BUSYBOX_IMAGE, command=SLEEP,
                             annotations=container_annotations)
    assert message in info.value.details()
    good = cri.run_pod("good", annotations={"cdi.k8s.io/gpu": f"{KIND}=1"})
    assert "TEST_GPU=1" in sh(cri, run(cri, good, "app"), "env")  # the plugin is still fine


def test_plugin_killed_and_restarted_injects_again(
    cri: CriClient, ctrd: Containerd, node: Path
) -> None:
    first = PluginProcess(ctrd.nri_socket, [node / "cdi"], node / "restart.log").start()
    first.kill()
    second = PluginProcess(ctrd.nri_socket, [node / "cdi"], node / "restart.log").start()
    try:
        pod = cri.run_pod("again", annotations={"cdi.k8s.io/gpu": f"{KIND}=0"})
        assert "TEST_GPU=0" in sh(cri, run(cri, pod, "app"), "env")
    finally:
        second.kill()


def test_plugin_reconnects_when_containerd_restarts(
    ctrd: Containerd, plugin: PluginProcess
) -> None:
    mark = plugin.log_size()
    ctrd.restart()
    plugin.wait_for_log("connected to containerd", after=mark)
    with ctrd.cri() as cri, cri.cleanup():
        pod = cri.run_pod("after", annotations={"cdi.k8s.io/gpu": f"{KIND}=1"})
        assert "TEST_GPU=1" in sh(cri, run(cri, pod, "app"), "env")


def test_sigterm_stops_the_plugin_cleanly(ctrd: Containerd, node: Path) -> None:
    process = PluginProcess(ctrd.nri_socket, [node / "cdi"], node / "term.log").start()
    assert process.terminate() == 0
    assert "plugin stopped" in process.log()


def test_runtime_launched_plugin_injects(containerd: ContainerdFactory, node: Path) -> None:
    log = node / "launched.log"
    launcher = launcher_script(node / "launcher", [node / "cdi"], log)
    launched = containerd(nri_plugins={"10-nri-cdi": launcher})
    def logged() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    wait_until(lambda: "connected to containerd" in logged(),
               "the launched plugin to connect", seen=lambda: logged()[-3000:] or "no log")
    with launched.cri() as cri, cri.cleanup():
        pod = cri.run_pod("launched", annotations={"cdi.k8s.io/gpu": f"{KIND}=0"})
        assert "TEST_GPU=0" in sh(cri, run(cri, pod, "app"), "env")
    assert "plugin 10-nri-cdi starting" in logged()  # logged before it connected


# --- the same as containerd's own CDI --------------------------------------------------------

def _our_part(spec: dict[str, Any]) -> dict[str, Any]:
    linux = spec["linux"]
    return {
        "devices": [d for d in linux.get("devices", []) if d["path"].startswith("/dev/testgpu")],
        "cgroup": [r for r in linux["resources"]["devices"] if r.get("major") == GPU_MAJOR],
        "mounts": [m for m in spec["mounts"] if m["destination"].startswith("/usr/lib/testdrv")],
        "env": [e for e in spec["process"]["env"] if e.startswith("TEST_")],
        "hooks": spec.get("hooks", {}).get("createContainer", []),
        "mount_order": [m["destination"] for m in spec["mounts"]],
    }


def test_same_result_as_containerd_native_cdi(containerd: ContainerdFactory, node: Path) -> None:
    both = containerd(enable_cdi=True, cdi_spec_dirs=[node / "cdi"])
    plugin = PluginProcess(both.nri_socket, [node / "cdi"], node / "native.log").start()
    devices = [f"{KIND}=1", f"{KIND}=0"]
    try:
        with both.cri() as cri, cri.cleanup():
            native_pod = cri.run_pod("native")
            native = cri.runtime_spec(cri.create_container(
                native_pod, "app", BUSYBOX_IMAGE, command=SLEEP, cdi_devices=devices))
            ours_pod = cri.run_pod("ours", annotations={"cdi.k8s.io/gpu": ",".join(devices)})
            ours = cri.runtime_spec(cri.create_container(ours_pod, "app", BUSYBOX_IMAGE,
                                                         command=SLEEP))
            if both.major >= 2:  # logged once the reply is out: before the plugin is killed
                plugin.wait_for_log("handed to the runtime's own CDI")
    finally:
        plugin.kill()
    expected, got = _our_part(native), _our_part(ours)
    # fileMode included: both runtimes' CDI libraries leave an unset one unset.
    assert got["devices"] == expected["devices"]
    assert got["mounts"] == expected["mounts"]
    assert got["env"] == expected["env"]
    assert got["hooks"] == expected["hooks"]
    if both.major >= 2:
        # The device nodes ask for rwm (CDI's default), NRI grants rw: containerd 2.1 reads
        # the plugin's spec folder, so the plugin hands the request to its own CDI and the
        # container is native's, mount order and cgroup rules included.
        assert got == expected
        assert "handed to the runtime's own CDI" in plugin.log()
        return
    # NRI re-sorts all mounts by (depth, path) when a plugin adds any; CDI < 1.0 (containerd
    # 1.7) sorts the same way.
    assert got["mount_order"] == nri_mount_order(expected["mount_order"]) \
        == expected["mount_order"]
    # The one difference NRI before 0.10 with no CDI_devices (containerd 1.7 < 1.7.30)
    # imposes: its own device-cgroup rule per device with access "rw" (the plugin sends no
    # rule: NRI 0.6 would drop it); CDI's default access is "rwm".
    assert [dict(r, access="rwm") for r in got["cgroup"]] == expected["cgroup"]
    assert {r["access"] for r in got["cgroup"]} == {"rw"}


def test_config_file_json_logs_and_metrics_count_real_injections(
    ctrd: Containerd, node: Path, tmp_path: Path
) -> None:
    import re
    import urllib.error
    import urllib.request

    config = tmp_path / "config.yaml"
    config.write_text("plugin: {index: '12'}\nlog: {level: debug, format: json}\n"
                      "metrics: {address: '127.0.0.1:0'}\n"
                      "policy: {sources: {podAnnotations: {namespaces: [allowed]}}}\n")
    process = PluginProcess(ctrd.nri_socket, [node / "cdi"], tmp_path / "plugin.log",
                            extra_args=["--config", str(config)]).start()
    try:
        port = re.search(r"127\.0\.0\.1:(\d+)/metrics",  # logged before it connects
                         process.log()).group(1)  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        assert json.loads(urllib.request.urlopen(f"{base}/healthz").read())["connected"]
        with ctrd.cri() as cri, cri.cleanup():
            good = cri.run_pod("m-ok", namespace="allowed",
                               annotations={"cdi.k8s.io/gpu": f"{KIND}=0"})
            run(cri, good, "app")
            denied = cri.run_pod("m-no", namespace="other",
                                 annotations={"cdi.k8s.io/gpu": f"{KIND}=0"})
            with pytest.raises(cri.grpc.RpcError, match=r"sources\.podAnnotations\.namespaces"):
                cri.create_container(denied, "app", BUSYBOX_IMAGE, command=SLEEP)
        text = urllib.request.urlopen(f"{base}/metrics").read().decode()
        assert 'nri_cdi_injections_total{outcome="injected"} 1.0' in text
        assert 'nri_cdi_injections_total{outcome="refused"} 1.0' in text
        assert 'nri_cdi_denials_total{rule="sources.podAnnotations.namespaces"} 1.0' in text
        assert "nri_cdi_registry_devices 2.0" in text
        process.wait_for_log("injected container=app")  # logged once the reply is out
        lines = [json.loads(line) for line in process.log().splitlines() if line.startswith("{")]
        assert any("injected container=app" in line["message"] for line in lines)
        assert "plugin 12-nri-cdi starting" in process.log()  # the config's index
    finally:
        process.kill()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{base}/livez", timeout=2)
