"""deploy/helm/nri-cdi: the chart renders (tests/helm_render.py, as ``helm template`` does) to
manifests the Kubernetes API accepts, for each set-up its values offer; deploy/kubernetes's
plain manifests are its rendering (so the DaemonSet end-to-end test, which runs
daemonset.yaml, runs the chart's output); values it cannot serve fail with a message naming
the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import helm_render
from tests.ops.test_deploy_schema import VERSIONS, schema_errors

ROOT = Path(__file__).resolve().parents[2]
IMAGE = {"image": {"repository": "registry.example.com/nri-cdi"}}


def _daemonset(values: dict[str, Any]) -> dict[str, Any]:
    (ds,) = [d for d in helm_render.documents({**IMAGE, **values})
             if d["kind"] == "DaemonSet"]
    return ds


@pytest.mark.parametrize("name", sorted(helm_render.PLAIN_MANIFESTS))
def test_the_plain_manifests_are_the_charts_rendering(name: str) -> None:
    committed = (ROOT / "deploy" / "kubernetes" / name).read_text()
    assert committed == helm_render.plain_manifest(name), (
        f"deploy/kubernetes/{name} differs from the chart: python -m tests.helm_render")


SETUPS = {
    "defaults": {},
    "host driver": {"driver": {"location": "host"}},
    # Helm merges maps: the default label is removed by setting it to null.
    "GPU Feature Discovery label": {"nodeSelector": {"nri-cdi/gpu": None,
                                                     "nvidia.com/gpu.present": "true"}},
    "no selector": {"nodeSelector": None, "tolerations": None},
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("setup", sorted(SETUPS))
def test_every_setup_renders_valid_manifests(setup: str, version: str) -> None:
    docs = helm_render.documents({**IMAGE, **SETUPS[setup]})
    assert {d["kind"] for d in docs} == {"DaemonSet", "ConfigMap"}
    assert [e for d in docs for e in schema_errors(d, version)] == []


def test_the_node_selector_is_the_values() -> None:
    pod = _daemonset({})["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nri-cdi/gpu": "true"}
    gfd = _daemonset(SETUPS["GPU Feature Discovery label"])["spec"]["template"]["spec"]
    assert gfd["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "nodeSelector" not in _daemonset(SETUPS["no selector"])["spec"]["template"]["spec"]


def test_a_host_driver_runs_the_plugin_alone_with_the_same_mounts() -> None:
    full = _daemonset({})["spec"]["template"]["spec"]
    host = _daemonset(SETUPS["host driver"])["spec"]["template"]["spec"]
    assert [c["name"] for c in host["containers"]] == ["plugin"]
    assert "initContainers" not in host
    assert host["containers"][0] == full["containers"][0]
    volumes = {v["name"] for v in host["volumes"]}
    assert {m["name"] for m in host["containers"][0]["volumeMounts"]} <= volumes
    assert "driver-root" not in volumes


def test_the_config_map_holds_the_values_config() -> None:
    values = yaml.safe_load((helm_render.CHART / "values.yaml").read_text())
    (cm,) = [d for d in helm_render.documents(IMAGE) if d["kind"] == "ConfigMap"]
    assert yaml.safe_load(cm["data"]["config.yaml"]) == values["config"]
    root = "/opt/driver"
    ds = _daemonset({"config": {"generate": {"driver_root": root}}})
    paths = {v["name"]: v.get("hostPath", {}).get("path") for v in
             ds["spec"]["template"]["spec"]["volumes"]}
    assert paths["driver-root"] == root


def test_without_an_image_it_says_which_value_to_set() -> None:
    with pytest.raises(helm_render.RenderError, match=r"image\.repository: build"):
        helm_render.render()


def test_an_unknown_driver_location_is_refused_by_the_schema() -> None:
    with pytest.raises(helm_render.RenderError, match=r"driver\.location"):
        helm_render.render({**IMAGE, "driver": {"location": "hots"}})


def test_the_chart_is_versioned_as_the_package() -> None:
    chart = yaml.safe_load((helm_render.CHART / "Chart.yaml").read_text())
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == chart["version"] == project["version"]


@pytest.mark.parametrize(("template", "why"), [
    ("{{ range .Values.x }}{{ end }}", "'range' is not implemented"),
    ("{{ .Values.a | b64enc }}", "function 'b64enc' is not implemented"),
    ("{{ if .Values.a }}", "without end"),
    ("{{ (.Values.a) }}", "unsupported pipeline"),
])
def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path, template: str,
                                                          why: str) -> None:
    # A construct Helm has and this renderer lacks must fail, not render differently.
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: x\nversion: 0.0.1\n")
    (chart / "values.yaml").write_text("a: 1\n")
    (chart / "templates" / "t.yaml").write_text(template)
    with pytest.raises(helm_render.RenderError, match=why):
        helm_render.render(chart=chart)


def test_trimming_and_truth_follow_go_templates(tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("name: x\nversion: 0.0.1\nappVersion: '9'\n")
    (chart / "values.yaml").write_text("empty: {}\nzero: 0\nname: n\nlist: [a]\n")
    (chart / "templates" / "t.yaml").write_text(
        "a:\n  {{- if .Values.empty }} no{{ else if .Values.zero }} no{{ else }} yes"
        "{{- end }}\nb: {{ .Values.missing | default .Chart.AppVersion | quote }}\n"
        "c:{{- with .Values.list }}{{ toYaml . | nindent 2 }}{{ end }}\n"
        "d: {{ not .Values.zero }} {{ eq .Values.name \"n\" }}\n")
    assert helm_render.render(chart=chart)["t.yaml"] == (
        "a: yes\nb: \"9\"\nc:\n  - a\nd: true true\n")
