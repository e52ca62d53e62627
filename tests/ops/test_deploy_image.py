"""The image CI builds (tests/e2e/daemonset.py, from scripts/install-image-root.sh's root) is
the one deploy/kubernetes/Dockerfile describes: same base, same packages, same pip command,
same entrypoint; and the manifests name that image."""

from __future__ import annotations

import re
from pathlib import Path

from tests.e2e import daemonset

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-image-root.sh"


def _script_value(name: str) -> str:
    match = re.search(rf"^{name}=(\S+)$", SCRIPT.read_text(), re.MULTILINE)
    assert match, f"{SCRIPT.name}: no {name}="
    return match.group(1)


def test_the_dockerfile_base_is_the_root_ci_builds() -> None:
    facts = daemonset.read_dockerfile()
    suite = _script_value("SUITE")
    assert facts.bases == (f"debian:{suite}-slim",) * 2
    assert set(facts.apt_packages) == set(_script_value("INCLUDE").split(","))


def test_the_dockerfile_builds_for_every_architecture_ci_builds() -> None:
    """No instruction pins an architecture (buildx runs it once per platform), and CI's
    image root has each architecture's wheels, by the platform tag pip gives them."""
    text = daemonset.DOCKERFILE.read_text()
    instructions = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    assert not re.search(r"x86_64|amd64|aarch64|arm64|--platform", instructions)
    assert "--platform linux/amd64,linux/arm64" in text
    table = re.search(r"^declare -A WHEEL_PLATFORM=\((.*)\)$", SCRIPT.read_text(), re.M)
    assert table, f"{SCRIPT.name}: no WHEEL_PLATFORM table"
    platforms = dict(re.findall(r"\[(\w+)\]=(\S+)", table.group(1)))
    assert platforms == {"amd64": "manylinux2014_x86_64", "arm64": "manylinux2014_aarch64"}
    assert tuple(platforms) == daemonset.ARCHITECTURES


def test_the_dockerfile_installs_the_wheels_with_the_extras_offline() -> None:
    pip = daemonset.read_dockerfile().pip_install
    assert "--no-index" in pip and "nri-cdi[nvml,metrics,kubelet]" in pip
    assert pip[pip.index("--find-links") + 1] == "/wheels"


def test_the_entrypoint_is_nri_cdi_and_every_container_runs_it() -> None:
    facts = daemonset.read_dockerfile()
    assert facts.entrypoint == ("nri-cdi",)
    spec = daemonset.pod_template()["spec"]
    containers = spec.get("initContainers", []) + spec["containers"]
    assert {c["image"] for c in containers} == {containers[0]["image"]}
    assert all(c["command"][0] == "nri-cdi" for c in containers)


def test_reading_the_dockerfile(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile"
    path.write_text('FROM a AS b\nRUN x\nFROM c\n# c\nRUN apt-get install -y p \\\n  q && pip '
                    'install --no-index w\nENTRYPOINT ["e"]\nCMD ["f", "g"]\n')
    facts = daemonset.read_dockerfile(path)
    assert facts == daemonset.Dockerfile(("a", "c"), ("p", "q"), ("--no-index", "w"), ("e",),
                                         ("f", "g"))


def test_the_image_is_built_from_what_the_dockerfile_copies() -> None:
    assert set(daemonset.read_dockerfile().copied) == {"pyproject.toml", "README.md", "cdi",
                                                       "nri_plugin"}


def test_the_image_has_every_package_of_ours_a_module_imports_on_load() -> None:
    """`nri-cdi doctor` in the DaemonSet's pod once failed with ModuleNotFoundError (seen
    on a real control plane): doctor imported the test bed, which the image does not
    hold, when it loaded. Only `doctor --e2e` may import it, inside the function that
    runs it (tests/ops/test_product_wheel.py runs the installed command)."""
    ours = {"cdi", "nri_plugin", "nri_cdi_testbed"}
    imported = set()
    for source in (daemonset.REPO / "nri_plugin").rglob("*.py"):
        imported |= set(re.findall(r"^(?:from|import) (\w+)", source.read_text(), re.M))
    assert imported & ours <= set(daemonset.read_dockerfile().copied)


def test_the_daemonset_test_applies_every_field_of_the_pod() -> None:
    """tests/e2e/test_daemonset_e2e.py runs the manifest, not a restatement of it: every pod
    and container field is applied there (or is the scheduler's or the kubelet's own)."""
    template = daemonset.pod_template()
    assert daemonset.untranslated(template) == []
    template["spec"]["containers"][0]["securityContext"]["seccompProfile"] = {"type": "x"}
    template["spec"]["shareProcessNamespace"] = True
    assert daemonset.untranslated(template) == ["spec.shareProcessNamespace",
                                                "plugin.securityContext.seccompProfile"]
