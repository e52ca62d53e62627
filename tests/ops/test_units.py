"""systemd units: the shipped copies, systemd-analyze verify, install-units, the launcher."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nri_plugin.ops.cli import main
from nri_plugin.ops.units import ENABLE, install_units, render_launcher, render_units

REPO = Path(__file__).resolve().parents[2]


def test_shipped_units_are_the_rendered_defaults() -> None:
    rendered = render_units()
    shipped = {p.name: p.read_text() for p in (REPO / "systemd").iterdir()
               if p.suffix in (".service", ".path")}
    assert shipped == rendered


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found:
        return found
    reason = "systemd-analyze not installed (apt-get install systemd)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set: {reason}")
    pytest.skip(reason)


@pytest.mark.parametrize("unit", sorted(render_units()))
def test_systemd_analyze_verify(unit: str, tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    binary = tmp_path / "nri-cdi"  # verify checks that ExecStart's program exists
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    for name, text in render_units(str(binary), str(tmp_path / "config.yaml")).items():
        (tmp_path / name).write_text(text)
    done = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / unit)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    # Unknown keys and bad values are only warnings (exit 0): any output is a failure.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stderr


def test_verify_catches_a_bad_unit(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    binary = tmp_path / "nri-cdi"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    bad = render_units(str(binary))["nri-cdi-plugin.service"].replace(
        "Restart=always", "Restart=sometimes")
    (tmp_path / "bad.service").write_text(bad)
    done = subprocess.run([analyze, "verify", "--man=no", str(tmp_path / "bad.service")],
                          capture_output=True, text=True, timeout=60)
    assert "restart specifier" in done.stderr


def _section(text: str, name: str) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("["):
            current = line.strip("[]")
        elif "=" in line and not line.startswith("#") and current == name:
            key, value = line.split("=", 1)
            keys.setdefault(key, []).append(value)
    return keys


def test_plugin_unit_ordering_restart_and_sandbox() -> None:
    units = render_units("/usr/bin/nri-cdi", "/etc/x.yaml")
    plugin = units["nri-cdi-plugin.service"]
    unit, service = _section(plugin, "Unit"), _section(plugin, "Service")
    assert "containerd.service" in unit["After"][0]
    assert service["Restart"] == ["always"]
    assert service["ExecStart"] == ["/usr/bin/nri-cdi plugin --config /etc/x.yaml"]
    for key, value in [("ProtectSystem", "strict"), ("NoNewPrivileges", "yes"),
                       ("ProtectHome", "yes"), ("CapabilityBoundingSet", "CAP_KILL")]:
        assert service[key] == [value]
    assert "AF_UNIX" in service["RestrictAddressFamilies"][0]  # the NRI socket
    assert "PrivateDevices" not in service  # it stats /dev/nvidia* for device numbers
    generate = units["nri-cdi-generate.service"]
    assert _section(generate, "Service")["Type"] == ["oneshot"]
    assert "nri-cdi-plugin.service" in _section(generate, "Unit")["Before"][0]
    assert _section(units["nri-cdi-generate.path"], "Path")["Unit"] == [
        "nri-cdi-generate.service"]


def test_render_refuses_relative_paths() -> None:
    with pytest.raises(ValueError, match="binary must be an absolute path"):
        render_units("nri-cdi")


def test_install_units_writes_and_enables(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    written = install_units(tmp_path / "units", binary="/usr/bin/nri-cdi",
                            config="/etc/nri-cdi/config.yaml", enable=True,
                            systemctl=lambda args: calls.append(args) or 0)
    assert sorted(p.name for p in written) == sorted(render_units())
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in written)
    assert calls == [["daemon-reload"], ["enable", "--now", *ENABLE]]


def test_install_units_command_no_enable(tmp_path: Path) -> None:
    rc = main(["install-units", "--unit-dir", str(tmp_path), "--no-enable",
               "--binary", "/opt/nri-cdi/bin/nri-cdi"])
    assert rc == 0
    assert "ExecStart=/opt/nri-cdi/bin/nri-cdi plugin" in (
        tmp_path / "nri-cdi-plugin.service").read_text()


def test_launcher_names_everything_absolutely(tmp_path: Path) -> None:
    text = render_launcher(python="/usr/bin/python3", log_file="/var/log/nri-cdi.log")
    assert text.startswith("#!/bin/sh\n")
    assert "exec /usr/bin/python3 -m nri_plugin.ops.cli plugin --config /etc/nri-cdi/config.yaml" \
        in text
    assert ">>/var/log/nri-cdi.log 2>&1" in text
    rc = main(["install-launcher", "--plugin-dir", str(tmp_path), "--index", "07"])
    assert rc == 0 and os.access(tmp_path / "07-nri-cdi", os.X_OK)
    assert main(["install-launcher", "--plugin-dir", str(tmp_path), "--index", "7"]) == 1
