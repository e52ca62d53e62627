"""Optional dependencies (pyproject extras): a feature whose package is missing fails with
one line that names the package and the extra to install. The package is hidden from a
child interpreter (``sys.modules[name] = None`` makes its import fail, as when absent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import simple_spec

ROOT = Path(__file__).resolve().parents[1]


def nri_cdi_without(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    code = (f"import sys; sys.modules[{module!r}] = None; "
            "from nri_plugin.ops.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_validate_schema_without_jsonschema(tmp_path: Path) -> None:
    spec = tmp_path / "a.yaml"
    spec.write_text(simple_spec("acme.com/xpu", "0"))
    proc = nri_cdi_without("jsonschema", "validate", "--schema", str(spec))
    assert proc.returncode == 2
    assert proc.stderr == ("nri-cdi validate: checking specs against the JSON schema needs "
                           "jsonschema, which is not installed: pip install 'nri-cdi[schema]'\n")
    # Without --schema, jsonschema is not needed at all.
    proc = nri_cdi_without("jsonschema", "validate", str(spec))
    assert (proc.returncode, proc.stdout) == (0, f"{spec}: valid\n"), proc.stderr


def test_plugin_metrics_without_prometheus_client(tmp_path: Path) -> None:
    proc = nri_cdi_without("prometheus_client", "plugin", "--metrics-address", "127.0.0.1:0",
                           "--socket", str(tmp_path / "none.sock"),
                           "--spec-dir", str(tmp_path))
    assert proc.returncode == 2
    last = proc.stderr.splitlines()[-1]
    assert last == ("nri-cdi plugin: metrics.address needs prometheus-client, which is not "
                    "installed: pip install 'nri-cdi[metrics]'"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_nvml_mode_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cdi.nvidia import discover

    monkeypatch.setitem(sys.modules, "pynvml", None)
    library = tmp_path / "libnvidia-ml.so.1"
    library.touch()
    with pytest.raises(discover.DiscoveryError) as caught:
        discover.discover_with_nvml(library)
    assert str(caught.value) == ("NVML unavailable: NVML mode needs nvidia-ml-py, which is not "
                                 "installed: pip install 'nri-cdi[nvml]'")


def test_core_commands_need_no_extra(tmp_path: Path) -> None:
    # `list` and the hooks import none of the extras: hide all three at once.
    code = ("import sys\nfor m in ('jsonschema', 'prometheus_client', 'pynvml'): "
            "sys.modules[m] = None\nfrom nri_plugin.ops.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    (tmp_path / "a.yaml").write_text(simple_spec("a.com/x", "0"))
    proc = subprocess.run([sys.executable, "-c", code, "list", "--spec-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "a.com/x=0\n"), proc.stderr
