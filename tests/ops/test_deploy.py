"""deploy/kubernetes: the manifests parse, the DaemonSet mounts what the plugin and the
watcher need, the ConfigMap's configuration is valid, the runtime snippets enable NRI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from nri_plugin.ops.doctor import ContainerdConfig, check_nri_enabled
from nri_plugin.ops.settings import parse_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _daemonset() -> dict[str, Any]:
    (ds,) = _docs("daemonset.yaml")
    assert ds["kind"] == "DaemonSet" and ds["apiVersion"] == "apps/v1"
    return ds


def _config() -> Any:
    (cm,) = _docs("configmap.yaml")
    return parse_settings(yaml.safe_load(cm["data"]["config.yaml"]), "configmap")


def _mounts(container: dict[str, Any], pod: dict[str, Any]) -> dict[str, str]:
    """mountPath -> host path."""
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    return {m["mountPath"]: host[m["name"]] for m in container["volumeMounts"]}


def _covered(path: str, mounts: dict[str, str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def test_plugin_container_mounts_everything_it_needs() -> None:
    pod = _daemonset()["spec"]["template"]["spec"]
    settings = _config()
    plugin = next(c for c in pod["containers"] if c["name"] == "plugin")
    mounts = _mounts(plugin, pod)
    assert _covered(settings.plugin.socket, mounts)
    for folder in settings.plugin.spec_dirs:
        assert mounts.get(folder) == folder  # same path on both sides: specs name host paths
    assert mounts.get("/dev") == "/dev"
    assert mounts.get("/etc/nri-cdi") is None  # the ConfigMap, not the host
    assert plugin["command"][-2:] == ["--config", "/etc/nri-cdi/config.yaml"]
    port = settings.metrics.address.rsplit(":", 1)[1]
    assert plugin["livenessProbe"]["httpGet"]["port"] == int(port)
    assert plugin["readinessProbe"]["exec"]["command"] == ["test", "-e",
                                                          settings.plugin.ready_file]


def test_watch_and_generate_see_the_driver_at_its_host_path() -> None:
    pod = _daemonset()["spec"]["template"]["spec"]
    settings = _config()
    for container in [*pod["initContainers"],
                      *(c for c in pod["containers"] if c["name"] == "watch")]:
        mounts = _mounts(container, pod)
        assert mounts[settings.generate.driver_root] == settings.generate.driver_root
        output_dir = os.path.dirname(settings.generate.output)
        assert mounts[output_dir] == output_dir
        assert mounts["/dev"] == "/dev"


def test_every_host_path_the_issue_names_is_mounted() -> None:
    pod = _daemonset()["spec"]["template"]["spec"]
    hosts = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert {"/var/run/nri", "/etc/cdi", "/var/run/cdi", "/dev"} <= hosts


@pytest.mark.parametrize("name, major", [("containerd-1.7.toml", 1),
                                         ("containerd-2.x.toml", 2)])
def test_containerd_snippets_enable_nri(name: str, major: int) -> None:
    tomllib = pytest.importorskip("tomllib")

    data = tomllib.loads((DEPLOY / name).read_text())
    cfg = ContainerdConfig(path=name, data=data, major=major)
    assert check_nri_enabled(cfg, "/var/run/nri/nri.sock").status == "ok"


@pytest.mark.parametrize("name, major", [("containerd-1.7.toml", 1),
                                         ("containerd-2.x.toml", 2)])
def test_containerd_snippets_share_the_spec_folders(name: str, major: int) -> None:
    tomllib = pytest.importorskip("tomllib")
    from nri_plugin.ops.doctor import check_native_cdi

    data = tomllib.loads((DEPLOY / name).read_text())
    cfg = ContainerdConfig(path=name, data=data, major=major)
    assert check_native_cdi(cfg, ["/etc/cdi", "/var/run/cdi"]).status == "ok"


def test_the_plugin_container_can_read_containerds_config() -> None:
    plugin = next(c for c in _daemonset()["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "plugin")
    assert {"name": "containerd-config", "mountPath": "/etc/containerd",
            "readOnly": True} in plugin["volumeMounts"]


def test_the_plugins_status_file_is_on_the_host() -> None:
    # nri-cdi doctor on the host reads the plugin's status file (plugin.status_dir): the
    # pod writes it into the host's folder of the same name.
    pod = _daemonset()["spec"]["template"]["spec"]
    plugin = next(c for c in pod["containers"] if c["name"] == "plugin")
    status_dir = _config().plugin.status_dir
    assert _mounts(plugin, pod)[status_dir] == status_dir


def test_crio_snippet_parses() -> None:
    tomllib = pytest.importorskip("tomllib")

    data = tomllib.loads((DEPLOY / "crio.conf").read_text())
    assert data["crio"]["nri"]["enable_nri"] is True
