"""The real Helm, for the chart's tests and for deploy/kubernetes's plain manifests.

Helm is scripts/install-helm.sh's (``.cache/helm/bin/helm``, which scripts/test.sh installs),
else ``$NRI_CDI_HELM``, else ``helm`` on PATH. Without it the chart's tests skip with the
command to run, except under CI, where they fail: CI must render the chart with Helm itself.

``python -m tests.helm`` writes deploy/kubernetes's plain manifests: the chart rendered by
``helm template`` with its defaults; tests/ops/test_helm_chart.py checks they are current.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "nri-cdi"
DEPLOY = REPO / "deploy" / "kubernetes"
INSTALL_SCRIPT = "scripts/install-helm.sh"
# The version scripts/install-helm.sh installs; another one could render differently.
VERSION = "v4.1.4"


class HelmError(Exception):
    """Helm refused: what it printed is the exception's text."""


def binary() -> Path | None:
    """Helm, where the install script puts it, or where the environment names it."""
    for candidate in (os.environ.get("NRI_CDI_HELM"),
                      str(REPO / ".cache" / "helm" / "bin" / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def missing() -> str | None:
    """Why the chart cannot be rendered here (None when Helm VERSION is at hand)."""
    helm = binary()
    if helm is None:
        return f"no helm binary: run bash {INSTALL_SCRIPT}"
    version = _version(helm)
    if version != VERSION:
        return f"{helm} is not Helm {VERSION} ({version}): run bash {INSTALL_SCRIPT}"
    return None


@functools.cache
def _version(helm: Path) -> str:
    done = subprocess.run([str(helm), "version", "--template", "{{ .Version }}"],
                          capture_output=True, text=True, check=False)
    return (done.stdout if done.returncode == 0 else done.stderr).strip()


def require() -> None:
    """pytest.skip when Helm is missing, pytest.fail under CI: the rule of tests/e2e's
    ``require_prerequisites``."""
    from tests import prerequisites  # pytest's: not for python -m tests.helm

    why = missing()
    if why is not None:
        prerequisites.missing("the chart's tests", why)


def run(*args: str) -> str:
    """``helm ARGS``: its stdout, or HelmError with what it printed."""
    helm = binary()
    if helm is None:
        raise HelmError(f"no helm binary: run bash {INSTALL_SCRIPT}")
    # No user's Helm configuration, repositories or cache: the same rendering everywhere.
    with tempfile.TemporaryDirectory(prefix="nri-cdi-helm-") as home:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home,
               "HELM_CACHE_HOME": f"{home}/cache", "HELM_CONFIG_HOME": f"{home}/config",
               "HELM_DATA_HOME": f"{home}/data", "KUBECONFIG": f"{home}/kubeconfig"}
        done = subprocess.run([str(helm), *args], capture_output=True, text=True, env=env,
                              check=False)
    if done.returncode != 0:  # lint says what failed on stdout, the others on stderr
        raise HelmError("\n".join(t.strip() for t in (done.stdout, done.stderr) if t.strip())
                        or f"helm {args[0]} exited {done.returncode}")
    return done.stdout


@contextmanager
def _values_file(values: Mapping[str, Any] | None) -> Iterator[list[str]]:
    """``-f FILE`` holding ``values`` (JSON is YAML; None deletes a default key, as in a
    values file), or nothing."""
    if not values:
        yield []
        return
    with tempfile.TemporaryDirectory(prefix="nri-cdi-values-") as folder:
        path = Path(folder) / "values.yaml"
        path.write_text(json.dumps(values))
        yield ["-f", str(path)]


def template(values: Mapping[str, Any] | None = None, *, release: str = "nri-cdi",
             namespace: str = "kube-system", show_only: str | None = None,
             sets: Sequence[str] = ()) -> str:
    """``helm template RELEASE CHART -n NAMESPACE`` with ``values`` (a values file) and
    ``sets`` (``--set`` arguments, given after it, as on a command line)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if show_only:
        args += ["--show-only", show_only]
    with _values_file(values) as files:
        return run(*args, *files, *(a for item in sets for a in ("--set", item)))


def documents(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The rendered objects, parsed."""
    return [d for d in yaml.safe_load_all(template(values, **kwargs)) if d]


def lint(values: Mapping[str, Any] | None = None) -> str:
    """``helm lint --strict``: warnings fail too."""
    with _values_file(values) as files:
        return run("lint", "--strict", str(CHART), *files)


def notes(values: Mapping[str, Any] | None = None, *, release: str = "nri-cdi",
          namespace: str = "kube-system") -> str:
    """NOTES.txt as ``helm install`` prints it (a client-side dry run: no cluster)."""
    with _values_file(values) as files:
        out = run("install", release, str(CHART), "--namespace", namespace,
                  "--dry-run=client", *files)
    _, found, text = out.partition("\nNOTES:\n")
    if not found:
        raise HelmError(f"no NOTES in helm install's output:\n{out}")
    return text


# deploy/kubernetes's plain manifests: file -> (--set arguments besides the image, template).
PLAIN_IMAGE = "registry.example.com/nri-cdi"
PLAIN_MANIFESTS: dict[str, tuple[tuple[str, ...], str]] = {
    "serviceaccount.yaml": ((), "templates/serviceaccount.yaml"),
    "configmap.yaml": ((), "templates/configmap.yaml"),
    "daemonset.yaml": ((), "templates/daemonset.yaml"),
    "daemonset-host-driver.yaml": (("driver.location=host",), "templates/daemonset.yaml"),
}


def plain_manifest(name: str) -> str:
    """What deploy/kubernetes/NAME must hold: a header saying how it was made, then Helm's
    output for that template."""
    sets, path = PLAIN_MANIFESTS[name]
    sets = (f"image.repository={PLAIN_IMAGE}", *sets)
    flags = " ".join(f"--set {s}" for s in sets)
    rendered = template(sets=sets, show_only=path).removeprefix("---\n")
    return (f"# Rendered from the Helm chart by Helm {VERSION} (do not edit here: python -m\n"
            "# tests.helm writes it, tests/ops/test_helm_chart.py compares):\n"
            "#   helm template nri-cdi deploy/helm/nri-cdi -n kube-system \\\n"
            f"#     {flags} --show-only {path}\n"
            f"# {PLAIN_IMAGE} is a placeholder: build and push the image, then\n"
            "# replace it (docs/install/kubernetes.md).\n" + rendered)


def main() -> int:
    why = missing()
    if why is not None:
        print(f"python -m tests.helm: {why}", file=sys.stderr)
        return 1
    for name in PLAIN_MANIFESTS:
        (DEPLOY / name).write_text(plain_manifest(name))
        print(f"wrote deploy/kubernetes/{name}")
    return 0


if __name__ == "__main__":  # python -m tests.helm: rewrite deploy/kubernetes's copies
    sys.exit(main())
