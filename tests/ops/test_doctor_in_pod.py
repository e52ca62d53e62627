"""doctor run in the DaemonSet's pod (kubectl exec ... -c plugin -- nri-cdi doctor, issue 52,
item 5): it knows it runs there, and says of each check that needs the node that it cannot
be made from the pod, instead of failing it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nri_plugin.ops import doctor
from nri_plugin.ops.containerd_config import ContainerdConfig
from nri_plugin.ops.doctor import (
    check_containerd_config,
    check_driver_architecture,
    check_fingerprint,
    check_nri_enabled,
    check_required_plugin,
    check_socket,
    check_spec_dirs,
    run_checks,
    running_containerd_version,
)
from nri_plugin.ops.inpod import (
    IN_POD_ENV,
    ON_NODE,
    SERVICE_ENV,
    TOLERATE_ENV,
    Place,
    detect,
)
from nri_plugin.ops.settings import Settings

POD = Place(True, "test")
UID = "0b9a4f1e-3c2d-4e5f-8a7b-6c5d4e3f2a1b"
# /proc/self/mountinfo lines of the plugin container: its root, and the kubelet's
# termination-message file and /etc/hosts from the pod's folder.
POD_MOUNTINFO = f"""\
1201 1100 0:310 / / rw,relatime - overlay overlay rw,lowerdir=/var/lib/containerd/x
1210 1201 259:2 /var/lib/kubelet/pods/{UID}/containers/plugin/1f /termination-log rw - ext4 sda2
1211 1201 259:2 /var/lib/kubelet/pods/{UID}/etc-hosts /etc/hosts rw - ext4 sda2
"""
HOST_MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
"""


def _mountinfo(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mountinfo"
    path.write_text(text)
    return str(path)


def test_the_plugin_pod_is_recognised(tmp_path: Path) -> None:
    pod = _mountinfo(tmp_path, POD_MOUNTINFO)
    place = detect({SERVICE_ENV: "10.96.0.1"}, pod)
    assert place.in_pod and "/termination-log" in place.why
    # the environment alone is no sign (a shell that exported it), nor the mounts alone
    assert not detect({SERVICE_ENV: "10.96.0.1"}, _mountinfo(tmp_path, HOST_MOUNTINFO)).in_pod
    assert not detect({}, pod).in_pod
    # a static pod's uid is 32 hex digits
    static = POD_MOUNTINFO.replace(UID, "5e0d7c4ab3f2e1d0c9b8a7f6e5d4c3b2")
    assert detect({SERVICE_ENV: "x"}, _mountinfo(tmp_path, static)).in_pod
    # the override, both ways
    assert detect({IN_POD_ENV: "1"}, _mountinfo(tmp_path, HOST_MOUNTINFO)).in_pod
    assert not detect({IN_POD_ENV: "0", SERVICE_ENV: "x"}, pod).in_pod


def test_in_the_pod_doctor_says_so_first(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings().with_values({
        "runtime_cdi.containerd_config": str(tmp_path / "config.toml"),
        "plugin.socket": str(tmp_path / "nri.sock"), "plugin.spec_dirs": [str(tmp_path)],
        "plugin.status_dir": "", "doctor.plugin_registry": str(tmp_path / "registry")})
    monkeypatch.setattr(doctor, "running_containerd_version", lambda *_: (2, 1, 0))
    checks = run_checks(settings, check_generated=False, place=POD)
    assert checks[0].name == "where doctor runs" and "in a pod" in checks[0].detail
    on_node = run_checks(settings, check_generated=False, place=ON_NODE)
    assert "where doctor runs" not in [c.name for c in on_node]
    dra = next(c for c in checks if c.name == doctor.DRA_CHECK)
    assert dra.status == "ok"  # containerd 2.x's defaults: its CDI on


def test_a_config_the_pod_does_not_mount_is_not_a_failure(tmp_path: Path) -> None:
    hidden = str(tmp_path / "k3s" / "config.toml")
    cfg = ContainerdConfig(path=hidden, data=None, major=None, error=(
        f"the running containerd reads {hidden}, which cannot be seen from here"))
    assert check_nri_enabled(cfg, "/var/run/nri/nri.sock").status == "fail"  # on the node
    check = check_nri_enabled(cfg, "/var/run/nri/nri.sock", POD)
    assert check.status == "skip" and "not visible from the pod" in check.detail
    assert "on the node" in check.fix


def test_the_mounted_copy_of_containerds_folder_is_named(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")
    cfg = ContainerdConfig(path=str(config), data={"version": 2}, major=1,
                           files=(str(config),), source="test")
    assert "in the pod: the node's file as the pod mounts it" in check_containerd_config(
        cfg, POD).detail
    assert "pod" not in check_containerd_config(cfg).detail


def _spec_with_sidecar(tmp_path: Path) -> Path:
    output = tmp_path / "cdi" / "nvidia.yaml"
    output.parent.mkdir()
    output.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    (output.parent / "nvidia.yaml.meta").write_text(json.dumps(
        {"fingerprint": "sha256:00", "driver": {"version": "580.82.07"}}))
    return output


def test_the_fingerprint_is_not_checked_against_the_images_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver on the host (driver root /) is the image's root in the pod: running the
    generator there would call a good spec stale."""
    output = _spec_with_sidecar(tmp_path)
    ran: list[object] = []
    monkeypatch.setattr(doctor, "current_fingerprint",
                        lambda settings: ran.append(settings) or ("sha256:ff", ""))
    for root in ("/", str(tmp_path / "driver")):  # the second: not mounted in this container
        (tmp_path / "driver").mkdir(exist_ok=True)
        settings = Settings().with_values({"generate.output": str(output),
                                           "generate.driver_root": root})
        check = check_fingerprint(settings, POD)
        assert check.status == "skip" and "not visible from the pod" in check.detail, root
        assert "580.82.07" in check.detail
    assert ran == []
    # on the node the same settings are checked (and this fingerprint differs: stale)
    assert check_fingerprint(settings).status == "fail" and ran


def test_driver_files_the_pod_does_not_mount_are_not_called_foreign(tmp_path: Path) -> None:
    spec = tmp_path / "nvidia.yaml"
    spec.write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: [{name: '0', "
                    "containerEdits: {deviceNodes: [{path: /dev/null}]}}]\n"
                    "containerEdits:\n  mounts:\n"
                    "  - {hostPath: /run/nvidia/driver/usr/lib/libcuda.so.1, "
                    "containerPath: /usr/lib/libcuda.so.1}\n")
    check = check_driver_architecture([str(tmp_path)], POD)
    assert check.status == "skip" and "not visible from the pod" in check.detail
    assert check_driver_architecture([str(tmp_path)]).status == "ok"  # as before, on a node


def test_containerds_version_comes_from_the_status_file_in_the_pod(tmp_path: Path) -> None:
    (tmp_path / "10-nri-cdi.json").write_text(json.dumps(
        {"format": 1, "state": "connected", "pid": 1, "name": "nri-cdi", "index": "10",
         "runtime": "containerd 2.2.1"}))
    plugin = Settings().with_values({"plugin.status_dir": str(tmp_path)}).plugin
    assert running_containerd_version(str(tmp_path / "no-containerd"), plugin) == (2, 2, 1)
    cfg = ContainerdConfig(path="/etc/containerd/config.toml", data={"version": 3}, major=2)
    check = check_required_plugin(cfg, Settings().plugin, None, place=POD)
    assert check.status == "skip" and "not visible from the pod" in check.detail


@pytest.mark.parametrize("carried, status, words", [
    (None, "warn", "carries no tolerate annotation"),
    ("other.example.com", "warn", "carries other.example.com instead"),
    ("t.example.com", "ok", 'this pod carries t.example.com: "true"'),
])
def test_in_the_pod_a_required_plugin_needs_the_pods_tolerate_annotation(
        carried: str | None, status: str, words: str) -> None:
    """The key containerd names must be the one the pod carries (the chart's value
    requiredPlugins.tolerateAnnotation, told to the container as TOLERATE_ENV): else the
    next rollout or eviction of the plugin's pod is refused while the plugin is away."""
    validator = {"enable": True, "required_plugins": ["10-nri-cdi"],
                 "tolerate_missing_plugins_annotation": "t.example.com"}
    cfg = ContainerdConfig(path="/etc/containerd/config.toml", major=2, data={
        "version": 3, "plugins": {"io.containerd.nri.v1.nri": {
            "default_validator": validator}}})
    environ = {} if carried is None else {TOLERATE_ENV: carried}
    check = check_required_plugin(cfg, Settings().plugin, (2, 2, 1), place=POD,
                                  environ=environ)
    assert check.status == status and words in check.detail, check
    if status == "warn":
        assert "requiredPlugins.tolerateAnnotation=t.example.com" in check.fix


def test_the_fixes_in_the_pod_name_what_the_pod_has(tmp_path: Path) -> None:
    check = check_socket(str(tmp_path / "nri.sock"), POD)
    assert check.status == "fail" and "the pod mounts the node's folder" in check.fix
    assert "systemctl" not in check_spec_dirs([str(tmp_path)], POD).fix
    assert "generate and watch containers" in check_spec_dirs([str(tmp_path)], POD).fix
