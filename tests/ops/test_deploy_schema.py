"""Every manifest in deploy/kubernetes is valid for the Kubernetes API, as the API server would
check it: each YAML document with an apiVersion and kind is validated (strict: unknown fields
are errors) against the schemas kubernetes-validate ships (offline, from PyPI; nothing is
fetched at test time). Helm values files (``*-values.yaml``) are not manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The oldest Kubernetes the deploy folder targets, and the newest whose schemas are shipped.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Set-ups that need a newer Kubernetes than the oldest target are checked from the release
# they need: DRA (resource.k8s.io/v1, a pod's resourceClaims by template name) is GA in 1.34.
SINCE = {"dra-example.yaml": "1.34.0"}


def _oldest(path: Path, version: str) -> str:
    """``version``, raised to the release the manifest's set-up needs."""
    since = SINCE.get(path.name, version)
    return max(version, since, key=lambda v: tuple(int(n) for n in v.split(".")))


def _manifests() -> list[Path]:
    return sorted(p for p in DEPLOY.glob("*.yaml") if not p.name.endswith("-values.yaml"))


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def schema_errors(doc: dict[str, Any], version: str) -> list[str]:
    """One line per problem (empty when the document is valid)."""
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.absolute_path) or "(top)"
        return [f"{where}: {path}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [f"{where}: no schema in Kubernetes {version}: {exc}"]
    return []


def test_the_deploy_folder_has_manifests() -> None:
    names = {p.name for p in _manifests()}
    assert {"daemonset.yaml", "configmap.yaml", "serviceaccount.yaml"} <= names


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", _manifests(), ids=lambda p: p.name)
def test_manifest_is_valid_for_the_kubernetes_api(path: Path, version: str) -> None:
    docs = _documents(path)
    assert docs, f"{path.name}: no YAML document"
    for doc in docs:
        assert "apiVersion" in doc and "kind" in doc, f"{path.name}: a document without kind"
        assert schema_errors(doc, _oldest(path, version)) == []


def test_a_dra_claim_is_not_known_before_its_release() -> None:
    # The raised floor is needed: 1.30 has no resource.k8s.io/v1, 1.34 has.
    docs = _documents(DEPLOY / "dra-example.yaml")
    assert any(schema_errors(d, "1.30.0") for d in docs)
    assert [e for d in docs for e in schema_errors(d, "1.34.0")] == []


def test_the_validator_catches_a_misspelt_field() -> None:
    """The check can fail: a field the API does not know (strict) and a wrong type."""
    (ds,) = _documents(DEPLOY / "daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    pod["hostPid"] = True
    assert schema_errors(ds, VERSIONS[-1]) != []
    del pod["hostPid"]
    pod["containers"][0]["securityContext"]["runAsUser"] = "root"
    (error,) = schema_errors(ds, VERSIONS[-1])
    assert "runAsUser" in error and "\n" not in error
