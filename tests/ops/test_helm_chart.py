"""deploy/helm/nri-cdi, rendered by the real Helm (tests/helm.py; scripts/install-helm.sh):
``helm lint --strict`` passes; ``helm template`` over the set-ups its values offer gives
objects the Kubernetes API accepts, with Helm's names, labels and selectors; one value per
setting (the metrics address, the spec folders, the driver root, the sockets' folders) moves
every place that uses it; the configuration it makes is one nri-cdi accepts; values it
cannot serve fail with a message naming the value; deploy/kubernetes's plain manifests are
its rendering (so the DaemonSet end-to-end test, which runs daemonset.yaml, runs the chart's
output)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from nri_plugin.ops.settings import Settings, parse_address, parse_settings
from tests import helm
from tests.helpers import nvidia_policy
from tests.ops.test_deploy_schema import VERSIONS, schema_errors

ROOT = Path(__file__).resolve().parents[2]
IMAGE = {"image": {"repository": "registry.example.com/nri-cdi"}}
STANDARD_LABELS = {"app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
                   "helm.sh/chart"}


@pytest.fixture(autouse=True)
def _helm() -> None:
    helm.require()


def _merge(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = _merge(out[key], value)
            else:
                out[key] = value
    return out


def _render(values: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, dict[str, Any]]:
    """kind -> the one object of that kind."""
    docs = helm.documents(_merge(IMAGE, values or {}), **kwargs)
    kinds = [d["kind"] for d in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {d["kind"]: d for d in docs}


def _pod(values: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    return dict(_render(values, **kwargs)["DaemonSet"]["spec"]["template"]["spec"])


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in [*pod.get("initContainers", []), *pod["containers"]]
                if c["name"] == name)


def _mounts(pod: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """mountPath -> the mount, with the host path of its volume as ``host``."""
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    return {m["mountPath"]: {**m, "host": host[m["name"]]}
            for m in _container(pod, name)["volumeMounts"]}


def _config(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(objects["ConfigMap"]["data"]["config.yaml"]))


def _settings(objects: dict[str, dict[str, Any]]) -> Settings:
    """The ConfigMap's file as nri-cdi reads it: its settings loader, and the policy parsed
    as the daemon parses it."""
    settings = parse_settings(_config(objects), "the chart's ConfigMap")
    nvidia_policy(dict(settings.policy), "the chart's ConfigMap")
    return settings


def _refused(values: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(helm.HelmError) as caught:
        helm.template(values, **kwargs)
    return str(caught.value)


# --- Helm itself -------------------------------------------------------------------------


def test_helm_lint_strict_passes() -> None:
    out = helm.lint(IMAGE)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_helm_lint_strict_fails_on_a_broken_chart(tmp_path: Path) -> None:
    # The lint can fail: the same chart with a template that is not YAML.
    chart = tmp_path / "nri-cdi"
    shutil.copytree(helm.CHART, chart)
    (chart / "templates" / "broken.yaml").write_text("kind: [\n")
    with pytest.raises(helm.HelmError, match=r"broken\.yaml"):
        helm.run("lint", "--strict", str(chart), "--set", "image.repository=r/x")


@pytest.mark.parametrize("name", sorted(helm.PLAIN_MANIFESTS))
def test_the_plain_manifests_are_the_charts_rendering(name: str) -> None:
    committed = (ROOT / "deploy" / "kubernetes" / name).read_text()
    assert committed == helm.plain_manifest(name), (
        f"deploy/kubernetes/{name} differs from the chart: python -m tests.helm")


# --- the set-ups, each valid for Kubernetes -----------------------------------------------

SETUPS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "defaults": ({}, {}),
    "host driver": ({"driver": {"location": "host"}}, {}),
    # Helm merges maps: the default label is removed by setting it to null.
    "GPU Feature Discovery label": ({"nodeSelector": {"nri-cdi/gpu": None,
                                                      "nvidia.com/gpu.present": "true"}}, {}),
    "no selector": ({"nodeSelector": None, "tolerations": None,
                     "priorityClassName": ""}, {}),
    "metrics on another port": ({"metrics": {"port": 9500}}, {}),
    "metrics scraped": ({"metrics": {"port": 9500, "bindAddress": "0.0.0.0",
                                     "scrape": True}}, {}),
    "pull secrets": ({"imagePullSecrets": [{"name": "registry-a"}, {"name": "registry-b"}]},
                     {}),
    "no service account of its own": ({"serviceAccount": {"create": False}}, {}),
    "named service account": ({"serviceAccount": {"name": "gpu-node",
                                                  "annotations": {"a": "b"}}}, {}),
    "name override": ({"nameOverride": "cdi"}, {"release": "gpu"}),
    "full name override": ({"fullnameOverride": "node-cdi"}, {"release": "gpu"}),
    "another namespace": ({}, {"namespace": "gpu-operator", "release": "cdi"}),
    "scheduling and pod metadata": ({
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "podAnnotations": {"example.com/owner": "gpu-team"},
        "podLabels": {"team": "gpu"},
        "updateStrategy": {"type": "RollingUpdate",
                           "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 2}},
    }, {}),
    "updated on delete": ({"updateStrategy": {"type": "OnDelete"}}, {}),
    "other folders": ({"config": {
        "plugin": {"socket": "/run/containerd/nri/nri.sock",
                   "spec_dirs": ["/etc/cdi", "/run/cdi/"], "status_dir": "/run/cdi-status"},
        "generate": {"output": "/run/cdi/gpus.yaml", "driver_root": "/opt/nvidia/driver"},
    }}, {}),
    "no status file": ({"config": {"plugin": {"status_dir": ""}}}, {}),
    "required plugin tolerated": ({"requiredPlugins": {
        "tolerateAnnotation": "tolerate-missing-plugins.example.com"}}, {}),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_setup_renders_objects_kubernetes_accepts(setup: str, version: str) -> None:
    values, where = SETUPS[setup]
    objects = _render(values, **where)
    assert {"DaemonSet", "ConfigMap"} <= set(objects)
    assert [e for d in objects.values() for e in schema_errors(d, version)] == []


@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_setup_makes_a_configuration_nri_cdi_accepts(setup: str) -> None:
    values, where = SETUPS[setup]
    objects = _render(values, **where)
    settings = _settings(objects)
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    plugin = _container(pod, "plugin")
    # The liveness probe needs the server: it is never off.
    _, port = parse_address(settings.metrics.address)
    assert plugin["livenessProbe"]["httpGet"]["port"] == port
    # Readiness is the plugin's own file, in a folder of the pod's own (not the node's:
    # during an upgrade's overlap the older pod's plugin would answer for the newer).
    ready = settings.plugin.ready_file
    assert plugin["readinessProbe"]["exec"] == {"command": ["test", "-e", ready]}
    mount = next(m for m in plugin["volumeMounts"]
                 if ready.startswith(m["mountPath"].rstrip("/") + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert "emptyDir" in volume, volume


# --- one value per setting ---------------------------------------------------------------


@pytest.mark.parametrize("setup", ["defaults", "metrics on another port", "metrics scraped"])
def test_the_metrics_port_moves_the_server_and_the_liveness_probe(
        setup: str) -> None:
    values, _ = SETUPS[setup]
    objects = _render(values)
    port = values.get("metrics", {}).get("port", 9464)
    bind = values.get("metrics", {}).get("bindAddress", "127.0.0.1")
    scraped = values.get("metrics", {}).get("scrape", False)
    assert parse_address(_settings(objects).metrics.address) == (bind, port)
    template = objects["DaemonSet"]["spec"]["template"]
    plugin = _container(template["spec"], "plugin")
    # The kubelet probes from the node's network namespace, the pod's (hostNetwork).
    assert plugin["livenessProbe"]["httpGet"] == {"host": "127.0.0.1", "path": "/livez",
                                                  "port": port}
    # Never a declared port: on the host's network it is a host port, and the scheduler
    # would keep an upgrade's surge pod off the node while the old pod holds it.
    assert "ports" not in plugin
    annotations = template["metadata"].get("annotations", {})
    if scraped:
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(port)
    else:
        assert not any(k.startswith("prometheus.io/") for k in annotations)


def test_metrics_stay_on_the_nodes_loopback_by_default() -> None:
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    assert values["metrics"]["bindAddress"] == "127.0.0.1"
    host, _ = parse_address(_settings(_render()).metrics.address)
    assert host == "127.0.0.1"


def test_scraping_a_loopback_server_is_refused_naming_the_values() -> None:
    message = _refused(_merge(IMAGE, {"metrics": {"scrape": True}}))
    assert "metrics.scrape" in message and "metrics.bindAddress" in message


def test_the_metrics_address_cannot_be_set_a_second_time_in_config() -> None:
    message = _refused(_merge(IMAGE, {"config": {"metrics": {"address": "0.0.0.0:9464"}}}))
    assert "config.metrics" in message and "metrics.port" in message


def test_an_ipv6_bind_address_is_refused() -> None:
    # The plugin's server listens on IPv4 only: "::" would make a configuration it fails on.
    message = _refused(_merge(IMAGE, {"metrics": {"bindAddress": "::"}}))
    assert "bindAddress" in message


@pytest.mark.parametrize("setup", ["defaults", "other folders"])
def test_the_spec_folders_are_the_configurations(setup: str) -> None:
    values, _ = SETUPS[setup]
    objects = _render(values)
    settings = _settings(objects)
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    plugin = _mounts(pod, "plugin")
    folders = [str(Path(d)) for d in settings.plugin.spec_dirs]
    for folder in folders:  # the same path on both sides: specs name host paths
        assert plugin[folder]["host"] == folder and plugin[folder]["readOnly"] is True
    cdi_volumes = {v["hostPath"]["path"] for v in pod["volumes"]
                   if v["name"].startswith("cdi-")}
    assert cdi_volumes == set(folders)
    output = str(Path(settings.generate.output).parent)
    for name in ("generate", "watch"):
        mounts = _mounts(pod, name)
        assert mounts[output]["host"] == output and not mounts[output].get("readOnly")
        assert not set(mounts) & (set(folders) - {output})  # writes only its own folder
    # The NRI socket's folder and the status folder, from plugin.socket and status_dir.
    socket_dir = str(Path(settings.plugin.socket).parent)
    assert plugin[socket_dir]["host"] == socket_dir
    assert plugin[settings.plugin.status_dir]["host"] == settings.plugin.status_dir


def test_a_spec_written_where_the_plugin_does_not_read_is_refused() -> None:
    message = _refused(_merge(IMAGE, {"config": {"generate": {"output": "/tmp/nvidia.yaml"}}}))
    assert "config.generate.output" in message and "config.plugin.spec_dirs" in message
    # A driver on the host: the pod generates nothing, so the folder does not matter.
    helm.template(_merge(IMAGE, {"driver": {"location": "host"},
                                 "config": {"generate": {"output": "/tmp/nvidia.yaml"}}}))


def test_without_a_status_folder_none_is_mounted() -> None:
    pod = _pod(SETUPS["no status file"][0])
    assert "status" not in {v["name"] for v in pod["volumes"]}
    assert "status" not in {m["name"] for m in _container(pod, "plugin")["volumeMounts"]}


@pytest.mark.parametrize("kubelet", ["/var/lib/kubelet", "/data/kubelet"])
def test_the_kubelets_folders_are_the_configurations(kubelet: str) -> None:
    # Who holds which device (pod-resources) and which DRA drivers are registered (the
    # plugin registry), read-only, at the paths the configuration names.
    values = _merge(IMAGE, {"config": {
        "plugin": {"pod_resources_socket": f"{kubelet}/pod-resources/kubelet.sock"},
        "doctor": {"plugin_registry": f"{kubelet}/plugins_registry"}}})
    objects = _render(values)
    settings = _settings(objects)
    assert settings.plugin.pod_resources_socket == f"{kubelet}/pod-resources/kubelet.sock"
    assert settings.doctor.plugin_registry == f"{kubelet}/plugins_registry"
    plugin = _mounts(objects["DaemonSet"]["spec"]["template"]["spec"], "plugin")
    for folder in (f"{kubelet}/pod-resources", f"{kubelet}/plugins_registry"):
        assert plugin[folder]["host"] == folder and plugin[folder]["readOnly"] is True
    off = _pod(_merge(IMAGE, {"config": {"plugin": {"pod_resources_socket": ""},
                                         "doctor": {"plugin_registry": ""}}}))
    assert {"pod-resources", "plugin-registry"}.isdisjoint(v["name"] for v in off["volumes"])


def test_the_default_checks_the_kubelets_allocations() -> None:
    settings = _settings(_render(IMAGE))
    assert settings.plugin.pod_resources_socket == Settings().plugin.pod_resources_socket


@pytest.mark.parametrize("root", ["/run/nvidia/driver", "/opt/nvidia/driver"])
def test_the_driver_root_is_mounted_at_its_host_path_following_remounts(root: str) -> None:
    objects = _render({"config": {"generate": {"driver_root": root}}})
    assert _settings(objects).generate.driver_root == root
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    for name in ("generate", "watch"):
        mount = _mounts(pod, name)[root]
        assert mount["host"] == root and mount["readOnly"] is True
        # A restarted driver container mounts its root again: the pod must see the new one.
        assert mount["mountPropagation"] == "HostToContainer"


@pytest.mark.parametrize(("values", "bound"), [({}, "600"),
                                               ({"driver": {"waitSeconds": 0}}, "0")])
def test_the_init_container_waits_for_a_driver_container_with_a_bound(
        values: dict[str, Any], bound: str) -> None:
    """A driver container may start after the pod: refresh waits for it, bounded, rather
    than failing and being restarted with back-off."""
    command = _container(_pod(values), "generate")["command"]
    assert command[:2] == ["nri-cdi", "refresh"]
    assert command[command.index("--wait-for-driver") + 1] == bound
    from nri_plugin.ops.cli import build_parser
    from nri_plugin.ops.settings import Settings, apply_flags

    args = build_parser("refresh").parse_args(command[1:])
    # the flag's value as the settings take it (the --config file is the pod's own)
    assert apply_flags(Settings(), args).watch.wait_for_driver == float(bound)


def test_a_negative_driver_wait_is_refused() -> None:
    with pytest.raises(helm.HelmError, match="waitSeconds"):
        helm.template(_merge(IMAGE, {"driver": {"waitSeconds": -1}}))


def test_nothing_of_proc_is_mounted() -> None:
    # /proc/driver/nvidia is the kernel's in every container: no volume for it.
    pod = _pod()
    host = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert not [p for p in host if p.startswith("/proc")]
    for container in [*pod["initContainers"], *pod["containers"]]:
        assert not [m for m in container["volumeMounts"] if "/proc" in m["mountPath"]]


def test_the_config_map_holds_the_values_config_the_metrics_address_and_ready_file() -> None:
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    config = _config(_render())
    assert config.pop("metrics") == {"address": "127.0.0.1:9464"}
    assert config["plugin"].pop("ready_file") == "/run/nri-cdi-pod/ready"
    assert config == values["config"]


def test_the_ready_file_cannot_be_set_in_config() -> None:
    message = _refused(_merge(IMAGE, {"config": {"plugin": {"ready_file": "/x"}}}))
    assert "config.plugin.ready_file" in message


def test_the_chart_leaves_the_policy_to_the_plugin() -> None:
    # The built-in policy decides which pods may ask; the chart turns no source on (the
    # volumeMounts source is safe only where pods cannot mount hostPath).
    assert "policy" not in _config(_render())
    assert _settings(_render()).policy == {}


# --- Helm's conventions: names, labels, selector -----------------------------------------


@pytest.mark.parametrize(("release", "values", "name"), [
    ("nri-cdi", {}, "nri-cdi"),  # the docs' ds/nri-cdi
    ("my-nri-cdi", {}, "my-nri-cdi"),
    ("gpu", {}, "gpu-nri-cdi"),
    ("gpu", {"nameOverride": "cdi"}, "gpu-cdi"),
    ("gpu", {"fullnameOverride": "node-cdi"}, "node-cdi"),
])
def test_names_follow_helms_rules(release: str, values: dict[str, Any], name: str) -> None:
    objects = _render(values, release=release)
    assert objects["DaemonSet"]["metadata"]["name"] == name
    assert objects["ServiceAccount"]["metadata"]["name"] == name
    assert objects["ConfigMap"]["metadata"]["name"] == f"{name}-config"
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (config,) = [v for v in pod["volumes"] if "configMap" in v]
    assert config["configMap"]["name"] == f"{name}-config"
    assert pod["serviceAccountName"] == name
    labels = objects["DaemonSet"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == values.get("nameOverride", "nri-cdi")
    assert labels["app.kubernetes.io/instance"] == release


def test_every_object_has_the_standard_labels_and_the_selector_only_name_and_instance() -> None:
    objects = _render(release="gpu")
    chart = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())
    for obj in objects.values():
        labels = obj["metadata"]["labels"]
        assert set(labels) >= STANDARD_LABELS, obj["kind"]
        assert labels["helm.sh/chart"] == f"nri-cdi-{chart['version']}"
        assert labels["app.kubernetes.io/version"] == chart["appVersion"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
    ds = objects["DaemonSet"]
    # Immutable once made: nothing that changes on an upgrade.
    assert ds["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": "nri-cdi",
                                                      "app.kubernetes.io/instance": "gpu"}}
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_two_releases_side_by_side_do_not_collide() -> None:
    a = _render(release="gpu-a", namespace="kube-system")
    b = _render(release="gpu-b", namespace="kube-system")
    for kind in a:
        assert a[kind]["metadata"]["name"] != b[kind]["metadata"]["name"], kind
    select_a = a["DaemonSet"]["spec"]["selector"]["matchLabels"]
    select_b = b["DaemonSet"]["spec"]["selector"]["matchLabels"]
    pods_a = a["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    pods_b = b["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert select_a.items() <= pods_a.items() and not select_a.items() <= pods_b.items()
    assert select_b.items() <= pods_b.items() and not select_b.items() <= pods_a.items()


def test_every_object_is_in_the_releases_namespace() -> None:
    objects = _render(namespace="gpu-operator")
    assert {o["metadata"]["namespace"] for o in objects.values()} == {"gpu-operator"}


# --- the pod's values ---------------------------------------------------------------------


def test_the_pod_has_its_own_account_and_no_api_token() -> None:
    objects = _render()
    account = objects["ServiceAccount"]
    assert account["automountServiceAccountToken"] is False
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("values", "account"), [
    ({"serviceAccount": {"create": False}}, "default"),
    ({"serviceAccount": {"create": False, "name": "gpu-node"}}, "gpu-node"),
])
def test_without_creating_an_account_the_pod_uses_the_named_one(
        values: dict[str, Any], account: str) -> None:
    objects = _render(values)
    assert "ServiceAccount" not in objects
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account
    assert pod["automountServiceAccountToken"] is False


def test_a_created_account_takes_its_name_and_annotations() -> None:
    objects = _render(SETUPS["named service account"][0])
    assert objects["ServiceAccount"]["metadata"]["name"] == "gpu-node"
    assert objects["ServiceAccount"]["metadata"]["annotations"] == {"a": "b"}
    assert objects["DaemonSet"]["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-node"


def test_pull_secrets_reach_the_pod() -> None:
    assert _pod(SETUPS["pull secrets"][0])["imagePullSecrets"] == [
        {"name": "registry-a"}, {"name": "registry-b"}]
    assert "imagePullSecrets" not in _pod()


def test_scheduling_and_pod_metadata_values_reach_the_pod() -> None:
    values = SETUPS["scheduling and pod metadata"][0]
    ds = _render(values)["DaemonSet"]
    template = ds["spec"]["template"]
    assert template["spec"]["affinity"] == values["affinity"]
    assert template["metadata"]["annotations"].items() >= values["podAnnotations"].items()
    assert template["metadata"]["labels"]["team"] == "gpu"
    assert ds["spec"]["updateStrategy"] == values["updateStrategy"]
    assert _render(SETUPS["updated on delete"][0])["DaemonSet"]["spec"]["updateStrategy"] == {
        "type": "OnDelete"}
    default = _render()["DaemonSet"]
    # An upgrade starts the new pod beside the old one on each node, and ends the old one
    # once the new one is ready: no node is ever without a plugin.
    assert default["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert "affinity" not in default["spec"]["template"]["spec"]


def test_the_node_selector_is_the_values() -> None:
    assert _pod()["nodeSelector"] == {"nri-cdi/gpu": "true"}
    gfd = _pod(SETUPS["GPU Feature Discovery label"][0])
    assert gfd["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    bare = _pod(SETUPS["no selector"][0])
    assert not {"nodeSelector", "tolerations", "priorityClassName"} & set(bare)


def test_every_container_has_its_resources() -> None:
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text())
    pod = _pod()
    for name in ("generate", "plugin", "watch"):
        assert _container(pod, name)["resources"] == values["resources"][name]


def test_a_host_driver_runs_the_plugin_alone_with_the_same_mounts() -> None:
    full = _pod()
    host = _pod(SETUPS["host driver"][0])
    assert [c["name"] for c in host["containers"]] == ["plugin"]
    assert "initContainers" not in host
    assert host["containers"][0] == full["containers"][0]
    volumes = {v["name"] for v in host["volumes"]}
    assert {m["name"] for m in host["containers"][0]["volumeMounts"]} <= volumes
    assert "driver-root" not in volumes


def test_the_pod_tolerates_a_required_plugin_by_the_key_containerd_names() -> None:
    """containerd >= 2.2 with required_plugins refuses every container while the plugin is
    absent, its own pod's too, unless the pod carries the annotation whose key
    tolerate_missing_plugins_annotation names, with a value NRI reads as a boolean."""
    values = SETUPS["required plugin tolerated"][0]
    template = _render(values)["DaemonSet"]["spec"]["template"]
    key = "tolerate-missing-plugins.example.com"
    assert template["metadata"]["annotations"][key] == "true"
    # doctor, in the plugin's container, learns the key (a pod does not see its annotations)
    assert {"name": "NRI_CDI_TOLERATE_ANNOTATION", "value": key} in _container(
        template["spec"], "plugin")["env"]
    default = _render()["DaemonSet"]["spec"]["template"]
    assert key not in default["metadata"].get("annotations", {})
    assert all("env" not in c for c in default["spec"]["containers"])


def test_a_tolerate_key_that_is_no_annotation_key_is_refused() -> None:
    with pytest.raises(helm.HelmError, match="tolerateAnnotation"):
        helm.template(_merge(IMAGE, {"requiredPlugins": {"tolerateAnnotation": "a b=c"}}))


# --- upgrades: what changes the pod template rolls the pods ------------------------------


def _template(values: dict[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    return dict(_render(values, **kwargs)["DaemonSet"]["spec"]["template"])


def test_a_policy_change_is_reloaded_without_rolling_the_pods() -> None:
    before = _template()["metadata"]["annotations"]["checksum/config"]
    assert len(before) == 64 and int(before, 16) >= 0  # a sha256, in hex
    policy = {"config": {"policy": {"sources": {"podAnnotations": {"namespaces": ["ml"]}}}}}
    objects = _render(_merge(IMAGE, policy))
    assert _config(objects)["policy"] == policy["config"]["policy"]  # in the ConfigMap
    after = objects["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
    assert after["checksum/config"] == before


@pytest.mark.parametrize("values", [
    {"config": {"log": {"level": "debug"}}},
    {"config": {"watch": {"poll_interval": 5}}},
    {"metrics": {"port": 9500}},  # the configuration's metrics.address
])
def test_a_config_change_changes_the_pod_template(values: dict[str, Any]) -> None:
    """A ConfigMap change alone (helm upgrade with new config values) rolls the pods, as
    nri-cdi reads most of its file only when it starts."""
    before = _template()["metadata"]["annotations"]["checksum/config"]
    assert _template(values)["metadata"]["annotations"]["checksum/config"] != before


def test_the_config_checksum_is_stable_when_the_config_is() -> None:
    before = _template()["metadata"]["annotations"]["checksum/config"]
    assert _template()["metadata"]["annotations"]["checksum/config"] == before
    others = {"podLabels": {"team": "gpu"}, "resources": {"plugin": {"limits": {
        "memory": "512Mi"}}}, "updateStrategy": {"type": "OnDelete"}}
    assert _template(others)["metadata"]["annotations"]["checksum/config"] == before


def test_a_new_chart_version_changes_the_pod_template(tmp_path: Path) -> None:
    """Every release moves the chart's version and appVersion (docs/developer/releasing.md):
    the pod template's labels and the default image tag change with them, so a
    helm upgrade to a new chart rolls the pods even with the same values."""
    chart = tmp_path / "nri-cdi"
    shutil.copytree(helm.CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = meta["appVersion"] = "99.0.0"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(IMAGE))
    new = next(d for d in yaml.safe_load_all(helm.run(
        "template", "nri-cdi", str(chart), "--namespace", "kube-system", "-f", str(values)))
        if d and d["kind"] == "DaemonSet")["spec"]["template"]
    old = _template()
    assert new["metadata"]["labels"]["helm.sh/chart"] == "nri-cdi-99.0.0"
    assert new["metadata"]["labels"]["app.kubernetes.io/version"] == "99.0.0"
    assert old["metadata"]["labels"]["app.kubernetes.io/version"] != "99.0.0"
    assert {c["image"] for c in new["spec"]["containers"]} == {
        "registry.example.com/nri-cdi:99.0.0"}


def test_an_image_tag_of_its_own_changes_every_container() -> None:
    pod = _pod({"image": {"tag": "0.2.0-rc1"}})
    assert {c["image"] for c in [*pod["initContainers"], *pod["containers"]]} == {
        "registry.example.com/nri-cdi:0.2.0-rc1"}


# --- what Helm refuses ---------------------------------------------------------------------


@pytest.mark.parametrize(("values", "key"), [
    ({"imagePullSecret": [{"name": "x"}]}, "imagePullSecret"),
    ({"serviceAccount": {"craete": False}}, "craete"),
    ({"metrics": {"prot": 9500}}, "prot"),
    ({"image": {"tga": "1"}}, "tga"),
    ({"resources": {"init": {}}}, "init"),
    ({"config": {"metric": {}}}, "metric"),
])
def test_an_unknown_value_is_refused_by_the_schema(values: dict[str, Any], key: str) -> None:
    message = _refused(_merge(IMAGE, values))
    assert "schema" in message and f"'{key}' not allowed" in message


def test_a_typo_on_the_command_line_is_refused_too() -> None:
    with pytest.raises(helm.HelmError, match="'imagePullSecret' not allowed"):
        helm.template(IMAGE, sets=["imagePullSecret[0].name=registry"])


def test_the_schema_refuses_unknown_keys_at_every_level_the_chart_owns() -> None:
    """Every object of values.schema.json with properties closes them, except in the
    sections of nri-cdi's own file, whose keys nri-cdi checks."""
    schema = json.loads((helm.CHART / "values.schema.json").read_text())
    open_ = []

    def walk(node: dict[str, Any], where: str) -> None:
        if "properties" in node and node.get("additionalProperties") is not False:
            open_.append(where)
        for key, child in node.get("properties", {}).items():
            if where != "config":
                walk(child, f"{where}.{key}" if where else key)
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{where}[]")

    walk(schema, "")
    assert open_ == []


def test_without_an_image_it_says_which_value_to_set() -> None:
    with pytest.raises(helm.HelmError, match=r"image\.repository: build"):
        helm.template()


def test_an_unknown_driver_location_is_refused_by_the_schema() -> None:
    with pytest.raises(helm.HelmError, match=r"driver/location|driver\.location"):
        helm.template(_merge(IMAGE, {"driver": {"location": "hots"}}))


# --- NOTES.txt -----------------------------------------------------------------------------


@pytest.mark.parametrize(("release", "namespace", "values", "name"), [
    ("nri-cdi", "kube-system", {}, "nri-cdi"),
    ("gpu", "gpu-operator", SETUPS["GPU Feature Discovery label"][0], "gpu-nri-cdi"),
])
def test_the_notes_say_how_to_check_the_install(release: str, namespace: str,
                                                values: dict[str, Any], name: str) -> None:
    notes = helm.notes(_merge(IMAGE, values), release=release, namespace=namespace)
    labels = ",".join(f"{k}={v}" for k, v in _pod(values, release=release)[
        "nodeSelector"].items())
    assert f"kubectl get nodes -l {labels}" in notes
    assert f"kubectl -n {namespace} get ds {name}" in notes
    assert f"kubectl exec -n {namespace} ds/{name} -c plugin -- nri-cdi doctor" in notes


def test_the_chart_is_versioned_as_the_package() -> None:
    chart = yaml.safe_load((helm.CHART / "Chart.yaml").read_text())
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == chart["version"] == project["version"]


def test_the_notes_say_who_may_ask_by_annotation() -> None:
    built_in = helm.notes(IMAGE)
    assert "by pod annotation (cdi.k8s.io/...) in no namespace" in built_in
    listed = helm.notes(_merge(IMAGE, {"config": {"policy": {"sources": {
        "podAnnotations": {"namespaces": ["gpu-lab", "ml"]}}}}}))
    assert "by pod annotation (cdi.k8s.io/...) in the namespaces gpu-lab, ml." in listed
