"""nri-cdi doctor on a healthy set-up and on broken ones (NRI off, stale spec, bad spec)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from nri_cdi_testbed.simnode import BuiltNode, NodeLayout, build_node
from nri_plugin.nri.api import EventMask
from nri_plugin.nri.dispatch import Configuration
from nri_plugin.ops import doctor
from nri_plugin.ops.doctor import Check, check_kubelet_allocations, check_plugin, run_checks
from nri_plugin.ops.kubelet_plugins import Registry
from nri_plugin.ops.metrics import Metrics
from nri_plugin.ops.refresh import Watcher
from nri_plugin.ops.settings import Settings
from nri_plugin.ops.status import StatusFile
from nri_plugin.plugins.cdi_injector.injector import Counters
from tests import arm64
from tests.kubelet_peer import PodResourcesServer, recorded
from tests.ops.simchange import upgrade_driver

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the simulated node"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the simulated node's device nodes need root"),
]

NRI_ON = """\
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  enable_cdi = false
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{socket}"
"""


@dataclass
class Node:
    root: Path
    node: BuiltNode
    settings: Settings
    metrics: Metrics
    status: StatusFile


C1730 = Configuration(config="", runtime_name="containerd", runtime_version="1.7.30",
                      nri_version="", request_timeout_ms=2000, events=EventMask(0))


def _cache(tmp: pytest.TempPathFactory) -> Path:
    env = os.environ.get("SIMNODE_CACHE")
    return Path(env) if env else tmp.mktemp("simnode-cache")


@pytest.fixture(autouse=True)
def _on_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are of doctor on a node, wherever they run (a CI job in a pod too)."""
    monkeypatch.setenv("NRI_CDI_IN_POD", "0")


@pytest.fixture
def healthy(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    node = build_node(tmp_path / "node", NodeLayout.uniform(1, seed="doctor"),
                      cache_dir=_cache(tmp_path_factory))
    nri = tmp_path / "nri.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(nri))
    listener.listen()
    (tmp_path / "config.toml").write_text(NRI_ON.format(socket=nri))
    metrics = Metrics(Counters())
    server = metrics.serve("127.0.0.1:0")
    settings = Settings().with_values({
        "plugin.socket": str(nri), "plugin.spec_dirs": [str(tmp_path / "cdi")],
        "generate.output": str(tmp_path / "cdi" / "nvidia.yaml"),
        "generate.driver_root": str(node.root), "generate.mode": "procfs",
        "runtime_cdi.containerd_config": str(tmp_path / "config.toml"),
        "doctor.health_url": f"http://127.0.0.1:{server.port}/healthz",
        "plugin.status_dir": str(tmp_path / "status"),
        # no kubelet plugin registered (whatever this machine's kubelet has)
        "doctor.plugin_registry": str(tmp_path / "plugins_registry"),
        # a kubelet that answered while a device plugin held a GPU
        "plugin.pod_resources_socket": str(tmp_path / "pod-resources.sock"),
    })
    kubelet = PodResourcesServer(tmp_path / "pod-resources.sock",
                                 lambda: recorded("List")).start()
    (tmp_path / "plugins_registry").mkdir()
    assert Watcher(settings).refresh("test").written
    metrics.connected("containerd 1.7.30")
    # The plugin's status file, as the daemon keeps it (this process holds its lock).
    status = StatusFile(str(tmp_path / "status"), name="nri-cdi", index="10",
                        socket=str(nri)).start()
    status.connected(C1730)
    try:
        yield Node(tmp_path, node, settings, metrics, status)
    finally:
        status.stopped()
        server.close()
        listener.close()
        kubelet.stop()


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def containerd_runs(monkeypatch: pytest.MonkeyPatch, version: tuple[int, int, int]) -> None:
    """doctor sees ``version`` run, whatever containerd this machine has."""
    monkeypatch.setattr(doctor, "running_containerd_version", lambda *_: version)


def test_healthy_node_passes_every_check(healthy: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    containerd_runs(monkeypatch, (1, 7, 0))
    checks = run_checks(healthy.settings)
    # enable_cdi off and no claim spec: healthy but for DRA, which warns (test_dra_check)
    assert [(c.name, c.status) for c in checks if c.status != "ok"] == [
        ("DRA claims reach a CDI injector", "warn")]
    assert "connected to containerd 1.7.30" in by_name(checks)["plugin connected"].detail


def test_nri_disabled(healthy: Node) -> None:
    config = Path(healthy.settings.runtime_cdi.containerd_config)
    config.write_text(config.read_text().replace("disable = false", "disable = true"))
    check = by_name(run_checks(healthy.settings, check_generated=False))[
        "NRI enabled in containerd"]
    assert check.status == "fail" and "disable = true" in check.detail
    assert "disable = false" in check.fix


@pytest.mark.parametrize("version, status", [((1, 7, 0), "fail"), ((2, 1, 0), "ok")])
def test_nri_section_missing_depends_on_containerd_version(
    healthy: Node, version: tuple[int, int, int], status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    containerd_runs(monkeypatch, version)
    config = Path(healthy.settings.runtime_cdi.containerd_config)
    # no "disable" key: containerd's default decides
    config.write_text(f'version = 2\n[plugins."io.containerd.nri.v1.nri"]\n'
                      f'  socket_path = "{healthy.settings.plugin.socket}"\n')
    check = by_name(run_checks(healthy.settings, check_generated=False))[
        "NRI enabled in containerd"]
    assert check.status == status


def test_stale_spec_after_driver_upgrade(healthy: Node, tmp_path_factory: pytest.TempPathFactory,
                                         tmp_path: Path) -> None:
    new = build_node(tmp_path / "new", NodeLayout.uniform(1, seed="doctor",
                                                          driver_version="590.48.01"),
                     cache_dir=_cache(tmp_path_factory))
    upgrade_driver(healthy.node, new)
    check = by_name(run_checks(healthy.settings))["spec matches the node"]
    assert check.status == "fail"
    assert "spec is for driver 580.82.07, the node runs 590.48.01" in check.detail
    assert "nri-cdi refresh" in check.fix


def test_bad_spec_file_is_named(healthy: Node) -> None:
    (healthy.root / "cdi" / "broken.yaml").write_text("cdiVersion: 0.5.0\nkind: x\n")
    check = by_name(run_checks(healthy.settings, check_generated=False))["spec directories"]
    assert check.status == "fail" and "broken.yaml" in check.detail


def test_missing_device_node(healthy: Node) -> None:
    (healthy.node.dev_root / "dev" / "nvidia0").unlink()
    check = by_name(run_checks(healthy.settings, check_generated=False))["device nodes present"]
    assert check.status == "fail" and "dev/nvidia0" in check.detail


def test_driver_of_another_architecture(healthy: Node) -> None:
    """A spec mounting an aarch64 driver on this machine (the simulated node's libraries
    are this machine's): named, with both architectures."""
    ok = by_name(run_checks(healthy.settings, check_generated=False))["driver architecture"]
    assert ok.status == "ok" and f"all for {os.uname().machine}" in ok.detail
    lib = arm64.aarch64_library(healthy.root / "arm64" / "libcuda.so.550.1", "libcuda.so.1")
    (healthy.root / "cdi" / "arm64.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: example.com/arm\ndevices:\n- name: a\n  containerEdits:\n"
        f"    mounts:\n    - hostPath: {lib}\n      containerPath: /usr/lib/libcuda.so.1\n")
    check = by_name(run_checks(healthy.settings, check_generated=False))["driver architecture"]
    if os.uname().machine == "aarch64":
        assert check.status == "ok"
        return
    assert check.status == "fail", check
    assert check.detail == f"{lib} is built for aarch64, and this machine is {os.uname().machine}"


def test_plugin_disconnected_and_socket_gone(healthy: Node) -> None:
    healthy.metrics.disconnected()
    healthy.status.disconnected(ConnectionError("NRI connection closed"))
    os.unlink(healthy.settings.plugin.socket)
    checks = by_name(run_checks(healthy.settings, check_generated=False))
    plugin = checks["plugin connected"]
    assert plugin.status == "fail" and "running but not connected since" in plugin.detail
    assert "(NRI connection closed)" in plugin.detail
    assert checks["plugin health endpoint"].status == "fail"
    assert "disconnected" in checks["plugin health endpoint"].detail
    assert checks["NRI socket reachable"].status == "fail"


def test_plugin_confirmed_without_metrics(healthy: Node) -> None:
    # The README's configuration: metrics off, no health URL. The status file answers.
    settings = healthy.settings.with_values({"doctor.health_url": None})
    assert not settings.metrics.address
    checks = by_name(run_checks(settings, check_generated=False))
    assert "plugin health endpoint" not in checks
    plugin = checks["plugin connected"]
    assert plugin.status == "ok", plugin
    assert "connected to containerd 1.7.30 since " in plugin.detail
    assert f"pid {os.getpid()}, socket {settings.plugin.socket}" in plugin.detail


def test_plugin_never_ran_or_other_name(healthy: Node) -> None:
    plugin = check_plugin(healthy.settings.with_values(
        {"plugin.status_dir": str(healthy.root / "empty")}).plugin)
    assert plugin.status == "fail" and "empty/10-nri-cdi.json: no such file" in plugin.detail
    assert "systemctl start nri-cdi-plugin" in plugin.fix
    other = check_plugin(healthy.settings.with_values({"plugin.index": "20"}).plugin)
    assert other.status == "fail" and "(there: 10-nri-cdi.json" in other.detail


def test_a_plugin_that_died_is_not_running(healthy: Node) -> None:
    # A real process writes the file and ends without a word (SIGKILL): its lock is gone.
    folder = healthy.root / "dead"
    code = ("import os, signal, sys; from nri_plugin.ops.status import StatusFile; "
            "from nri_plugin.nri.dispatch import Configuration; "
            "from nri_plugin.nri.api import EventMask; "
            f"s = StatusFile({str(folder)!r}, name='nri-cdi', index='10', socket='/x.sock')"
            ".start(); s.connected(Configuration(config='', runtime_name='containerd', "
            "runtime_version='2.1.9', nri_version='', request_timeout_ms=2000, "
            "events=EventMask(0))); print(os.getpid(), flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == -9, done.stderr
    check = check_plugin(healthy.settings.with_values({"plugin.status_dir": str(folder)}).plugin)
    assert check.status == "fail", check
    pid = int(done.stdout)
    assert f"the plugin is not running: pid {pid} was last connected at " in check.detail


def test_a_plugin_on_another_socket_warns(healthy: Node) -> None:
    check = check_plugin(healthy.settings.with_values({"plugin.socket": "/run/other.sock"}).plugin)
    assert check.status == "warn" and "this doctor checks /run/other.sock" in check.detail


def test_no_status_file_configured_is_a_skip(healthy: Node) -> None:
    check = check_plugin(healthy.settings.with_values({"plugin.status_dir": ""}).plugin)
    assert check.status == "skip" and "keeps no status file" in check.detail


def test_native_cdi_on_the_same_folders_is_the_working_set_up(healthy: Node) -> None:
    config = Path(healthy.settings.runtime_cdi.containerd_config)
    config.write_text(config.read_text().replace(
        "enable_cdi = false", f'enable_cdi = true\n  cdi_spec_dirs = ["{healthy.root}/cdi"]'))
    checks = by_name(run_checks(healthy.settings, check_generated=False))
    check = checks["containerd's own CDI"]
    assert check.status == "ok" and "the plugin leaves those to it" in check.detail
    assert checks["plugin knows containerd's CDI"].status == "ok"


def test_native_cdi_on_other_folders_warns_that_handed_over_devices_fail(
        healthy: Node) -> None:
    config = Path(healthy.settings.runtime_cdi.containerd_config)
    config.write_text(config.read_text().replace(
        "enable_cdi = false", 'enable_cdi = true\n  cdi_spec_dirs = ["/etc/cdi"]'))
    check = by_name(run_checks(healthy.settings, check_generated=False))["containerd's own CDI"]
    assert check.status == "warn" and "unresolvable CDI devices" in check.detail
    assert f'cdi_spec_dirs = ["/etc/cdi", "{healthy.root}/cdi"]' in check.fix


def test_plugin_setting_that_contradicts_containerd_fails(healthy: Node) -> None:
    settings = healthy.settings.with_values({"runtime_cdi.enabled": "on"})  # containerd: off
    check = by_name(run_checks(settings, check_generated=False))["plugin knows containerd's CDI"]
    assert check.status == "fail"
    assert "left to containerd, which does not inject them" in check.detail


def test_one_character_vendor_or_class_fails(tmp_path: Path) -> None:
    from nri_plugin.ops.doctor import check_kinds_runtimes_can_load

    (tmp_path / "ok.yaml").write_text("cdiVersion: 0.5.0\nkind: ex.com/gpu\ndevices: []\n")
    assert check_kinds_runtimes_can_load([str(tmp_path)]).status == "ok"
    (tmp_path / "bad.yaml").write_text("cdiVersion: 0.5.0\nkind: example.com/a\ndevices: []\n")
    check = check_kinds_runtimes_can_load([str(tmp_path)])
    assert check.status == "fail" and "bad.yaml (kind 'example.com/a')" in check.detail


def test_containerd_2_defaults_resolve_from_the_default_folders(healthy: Node) -> None:
    from nri_plugin.ops.doctor import ContainerdConfig, check_native_cdi

    v3 = ContainerdConfig(path="/x", data={"version": 3}, major=2)
    assert check_native_cdi(v3, ["/etc/cdi", "/var/run/cdi"]).status == "ok"
    off = ContainerdConfig(path="/x", data={"version": 3, "plugins": {
        "io.containerd.cri.v1.runtime": {"enable_cdi": False}}}, major=2)
    assert check_native_cdi(off, ["/run/cdi"]).status == "ok"  # /var/run is /run
    assert check_native_cdi(off, ["/opt/cdi"]).status == "warn"


def test_doctor_command_exit_status(healthy: Node, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from nri_plugin.ops.cli import main

    config = healthy.root / "nri-cdi.yaml"
    config.write_text(yaml.safe_dump(healthy.settings.as_dict()))
    assert main(["doctor", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "[ok  ] spec matches the node" in out
    Path(healthy.settings.runtime_cdi.containerd_config).write_text(
        NRI_ON.format(socket="/x").replace("disable = false", "disable = true"))
    assert main(["doctor", "--config", str(config), "--no-generate"]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] NRI enabled in containerd" in out and "fix: in " in out


@pytest.mark.parametrize("section, version, status, words", [
    ('[plugins."io.containerd.nri.v1.nri".default_validator]\nenable = true\n'
     'required_plugins = ["nri-cdi"]\ntolerate_missing_plugins_annotation = "t.example.com"\n',
     (2, 2, 1), "ok", "nri-cdi is required"),
    ('[plugins."io.containerd.nri.v1.nri".default_validator]\nenable = true\n'
     'required_plugins = ["10-nri-cdi"]\ntolerate_missing_plugins_annotation = "t.example.com"\n',
     (2, 3, 4), "ok", "nri-cdi is required"),
    ('[plugins."io.containerd.nri.v1.nri".default_validator]\n'
     'required_plugins = ["nri-cdi"]\n', (2, 3, 4), "warn", "not enabled"),
    ("", (2, 3, 4), "warn", "is not required"),
    ("", None, "skip", "version unknown"),
    ("", (2, 1, 9), "ok", "cannot require plugins"),
])
def test_required_plugin_check(tmp_path: Path, section: str,
                               version: tuple[int, int, int] | None, status: str,
                               words: str) -> None:
    from nri_plugin.ops.containerd_config import read_containerd_config
    from nri_plugin.ops.doctor import check_required_plugin

    path = tmp_path / "config.toml"
    path.write_text("version = 3\n" + section)
    check = check_required_plugin(read_containerd_config(str(path), 2), Settings().plugin,
                                  version)
    assert (check.status, words in check.detail) == (status, True), check
    if status == "warn":
        assert 'required_plugins = ["nri-cdi"]' in check.fix


REQUIRED = ('[plugins."io.containerd.nri.v1.nri".default_validator]\nenable = true\n'
            'required_plugins = ["nri-cdi"]\n')


@pytest.mark.parametrize("tolerate, status, words", [
    # no key: the plugin's own pod is refused while the plugin is absent
    ("", "warn", "sets no tolerate_missing_plugins_annotation"),
    ('tolerate_missing_plugins_annotation = "t.example.com"\n', "ok",
     'the plugin\'s pod must carry t.example.com: "true"'),
])
def test_a_required_plugin_without_a_tolerate_key_locks_the_plugins_own_pod(
        tmp_path: Path, tolerate: str, status: str, words: str) -> None:
    from nri_plugin.ops.containerd_config import read_containerd_config
    from nri_plugin.ops.doctor import check_required_plugin

    path = tmp_path / "config.toml"
    path.write_text("version = 3\n" + REQUIRED + tolerate)
    check = check_required_plugin(read_containerd_config(str(path), 2), Settings().plugin,
                                  (2, 2, 1), environ={})
    assert check.status == status and words in check.detail, check
    assert "nri-cdi is required" in check.detail
    if status == "warn":
        assert "tolerate_missing_plugins_annotation = " in check.fix
        assert "requiredPlugins.tolerateAnnotation" in check.fix


def test_containerd_settings_not_read_are_said_with_what_is_assumed(
        healthy: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    config = Path(healthy.settings.runtime_cdi.containerd_config or "")
    containerd_runs(monkeypatch, (2, 1, 0))
    checks = by_name(run_checks(healthy.settings, check_generated=False))
    assert checks["containerd's settings"].status == "ok"
    assert checks["containerd's settings"].detail == (
        f"read {config} (runtime_cdi.containerd_config)")
    config.write_text('imports = ["/nonexistent/nri.toml"]\n' + NRI_ON.format(
        socket=healthy.settings.plugin.socket))
    check = by_name(run_checks(healthy.settings, check_generated=False))[
        "containerd's settings"]
    assert check.status == "warn"
    assert check.detail.startswith("not read (/nonexistent/nri.toml, which ")
    assert check.detail.endswith("the checks below and the plugin assume containerd 2.x's "
                                 "defaults: NRI on, its own CDI on with /etc/cdi and "
                                 "/var/run/cdi")
    assert "runtime_cdi.containerd_config" in check.fix
    config.unlink()
    containerd_runs(monkeypatch, (1, 7, 0))
    check = by_name(run_checks(healthy.settings, check_generated=False))[
        "containerd's settings"]
    assert check.status == "warn" and check.detail.startswith(f"not read (no {config}; ")
    assert "assume containerd 1.7's defaults: NRI off, its own CDI off" in check.detail


def test_the_kubelets_allocations_are_read_as_the_plugin_reads_them(
        tmp_path: Path) -> None:
    registry = Registry(folder=str(tmp_path / "plugins_registry"))
    plugin = Settings().plugin
    sock = tmp_path / "kubelet.sock"
    here = replace(plugin, pod_resources_socket=str(sock))
    kubelet = PodResourcesServer(sock, lambda: recorded("dra-List")).start()
    try:
        found = check_kubelet_allocations(here, registry)
        assert (found.status, found.detail) == (
            "ok", f"{sock} answers: 2 allocation(s) held by 2 pod(s)")
    finally:
        kubelet.stop()
    # Nobody answers on the socket: the plugin refuses what it cannot check.
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(sock))
    try:
        failed = check_kubelet_allocations(here, registry)
        assert failed.status == "fail" and failed.detail.startswith(f"{sock}: UNAVAILABLE")
    finally:
        dead.close()
        sock.unlink()
    # No socket: no kubelet, unless its plugin registry says one runs here.
    assert check_kubelet_allocations(
        here, Registry(folder="/x", problem="no /x")).status == "ok"
    moved = check_kubelet_allocations(here, registry)
    assert moved.status == "warn" and "pod_resources_socket" in moved.fix
    off = check_kubelet_allocations(replace(plugin, pod_resources_socket=""), registry)
    assert off.status == "skip"


def test_a_file_not_located_is_not_called_a_syntax_error() -> None:
    """Seen in a pod on a host running several containerds: "which one is not known" came
    with the advice to fix the file's syntax."""
    from nri_plugin.ops.containerd_config import ContainerdConfig, Located
    from nri_plugin.ops.doctor import check_nri_enabled

    unknown = Located(path="/etc/containerd/config.toml", source="containerd's default path",
                      error="3 running containerds may serve /var/run/nri/nri.sock (pids 1, "
                            "2, 3): which one is not known").read(2)
    check = check_nri_enabled(unknown, "/var/run/nri/nri.sock")
    assert check.status == "fail" and "which one is not known" in check.detail
    assert "runtime_cdi.containerd_config" in check.fix and "syntax" not in check.fix
    broken = ContainerdConfig(path="/etc/containerd/config.toml", data=None, major=2,
                              error="line 3: expected '='")
    assert "syntax" in check_nri_enabled(broken, "/var/run/nri/nri.sock").fix
