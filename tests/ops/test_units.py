"""systemd units: the shipped copies, systemd-analyze verify, install-units, the launcher."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nri_plugin.ops.cli import main
from nri_plugin.ops.units import (
    UNITS,
    install_units,
    render_launcher,
    render_units,
    running_command,
    uninstall_units,
)
from tests.prerequisites import missing

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_units_are_rendered_for_other_paths() -> None:
    folder = REPO / "nri_plugin" / "ops" / "systemd"
    shipped = {p.name: p.read_text() for p in folder.iterdir()}
    assert render_units() == shipped and sorted(shipped) == sorted(UNITS)
    # A binary whose path holds the default config's, and the other way round: one pass.
    other = render_units("/opt/etc/nri-cdi/config.yaml/nri-cdi", "/usr/local/bin/nri-cdi.yaml")
    assert ("ExecStart=/opt/etc/nri-cdi/config.yaml/nri-cdi refresh --config "
            "/usr/local/bin/nri-cdi.yaml\n") in other["nri-cdi-generate.service"]
    assert "PathChanged=/opt/etc/nri-cdi/config.yaml/nri-cdi\n" in other["nri-cdi-generate.path"]
    assert [n for n, text in other.items() if "/usr/local/bin/nri-cdi " in text
            or "/etc/nri-cdi/config.yaml\n" in text] == []
    # Every service is sandboxed alike (the lines after the plugin's address families).
    sandbox = shipped["nri-cdi-plugin.service"].split("AF_INET6\n")[1]
    assert all(text.endswith(sandbox) for n, text in shipped.items() if n.endswith(".service"))


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found:
        return found
    missing("the unit tests", "systemd-analyze not installed (apt-get install systemd)")


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
    written = install_units(tmp_path / "units",
                            render_units("/usr/bin/nri-cdi", "/etc/nri-cdi/config.yaml"),
                            enable=True,
                            systemctl=lambda args: calls.append(args) or 0)
    assert sorted(p.name for p in written) == sorted(render_units())
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in written)
    assert calls == [["daemon-reload"], ["enable", "--now", *UNITS]]


def test_install_units_command_no_enable(tmp_path: Path) -> None:
    rc = main(["install-units", "--unit-dir", str(tmp_path), "--no-enable",
               "--binary", "/opt/nri-cdi/bin/nri-cdi"])
    assert rc == 0
    assert "ExecStart=/opt/nri-cdi/bin/nri-cdi plugin" in (
        tmp_path / "nri-cdi-plugin.service").read_text()


def test_the_units_run_the_nri_cdi_that_is_running(tmp_path: Path) -> None:
    # A console script in a virtual environment's bin, and a pyenv-like shim first on PATH:
    # the units name the one that runs, never the shim.
    venv_bin = tmp_path / "venv" / "bin"
    shims = tmp_path / "shims"
    for folder in (venv_bin, shims):
        folder.mkdir(parents=True)
        (folder / "nri-cdi").write_text("#!/bin/sh\n")
        (folder / "nri-cdi").chmod(0o755)
    (venv_bin / "python3").symlink_to(sys.executable)
    script = str(venv_bin / "nri-cdi")
    assert running_command(script, str(venv_bin / "python3")) == script
    assert running_command("/usr/lib/python3/nri_plugin/ops/cli.py",
                           str(venv_bin / "python3")) == script  # python -m, venv python
    assert running_command("/x/cli.py", str(tmp_path / "python3")) is None
    # Through the real console-script entry: a process started as venv/bin/nri-cdi.
    done = subprocess.run(
        [sys.executable, "-c", "import sys; sys.argv[0] = sys.argv[1]; "
         "from nri_plugin.ops.cli import main; sys.exit(main(sys.argv[2:]))", script,
         "install-units", "--print"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{shims}:{os.environ.get('PATH', '')}",
             "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert f"ExecStart={script} plugin --config" in done.stdout
    assert str(shims) not in done.stdout


def test_install_units_says_so_when_it_cannot_tell(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(tmp_path / "python3"), "-m", "nri_plugin.ops.cli", "install-units", "--print"],
        capture_output=True, text=True, timeout=60, executable=sys.executable,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    # sys.executable is tmp/python3 (no nri-cdi beside it), argv[0] is the module's path.
    assert done.returncode == 1
    assert "cannot tell which nri-cdi is running" in done.stderr
    assert "pass --binary PATH" in done.stderr


def _systemctl() -> str:
    found = shutil.which("systemctl")
    if found:
        return found
    missing("the unit tests", "systemctl not installed (apt-get install systemd)")


def test_install_then_uninstall_in_a_root_folder(tmp_path: Path) -> None:
    # A real system image folder and the real systemctl --root: install enables the units
    # there (links in *.wants), uninstall disables them and removes the files, and
    # leaves files of other names alone. (test_systemd_analyze_verify checks the units.)
    _systemctl()
    root = tmp_path / "image"
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    (units / "other.service").write_text("[Service]\nExecStart=/bin/true\n")
    binary = tmp_path / "nri-cdi"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    assert main(["install-units", "--root", str(root), "--binary", str(binary)]) == 0
    wanted = sorted(p.name for p in (units / "multi-user.target.wants").iterdir())
    assert wanted == sorted(UNITS)
    assert main(["uninstall-units", "--root", str(root)]) == 0
    # systemctl removed the links, and the wants folder with them once empty.
    assert [p.relative_to(units).as_posix() for p in units.rglob("*")] == ["other.service"]
    assert main(["uninstall-units", "--root", str(root)]) == 0  # nothing left: still fine


def test_uninstall_units_stops_before_removing(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    install_units(tmp_path, render_units("/usr/bin/nri-cdi", "/etc/nri-cdi/config.yaml"),
                  enable=False)
    (tmp_path / "keep.service").write_text("")
    removed = uninstall_units(tmp_path, disable=True,
                              systemctl=lambda args: calls.append(args) or 0)
    assert sorted(p.name for p in removed) == sorted(render_units())
    assert calls == [["disable", "--now", *UNITS], ["daemon-reload"]]
    assert [p.name for p in tmp_path.iterdir()] == ["keep.service"]
    with pytest.raises(RuntimeError, match="systemctl disable --now"):
        install_units(tmp_path, render_units("/usr/bin/nri-cdi", "/c"), enable=False)
        uninstall_units(tmp_path, disable=True, systemctl=lambda args: 1)
    assert (tmp_path / "nri-cdi-plugin.service").exists()  # a failed stop removes nothing


def test_launcher_names_everything_absolutely(tmp_path: Path) -> None:
    text = render_launcher(python="/usr/bin/python3", log_file="/var/log/nri-cdi.log")
    assert text.startswith("#!/bin/sh\n")
    assert "exec /usr/bin/python3 -m nri_plugin.ops.cli plugin --config /etc/nri-cdi/config.yaml" \
        in text
    assert ">>/var/log/nri-cdi.log 2>&1" in text
    rc = main(["install-plugin-launcher", "--plugin-dir", str(tmp_path), "--index", "07"])
    assert rc == 0 and os.access(tmp_path / "07-nri-cdi", os.X_OK)
    with pytest.raises(SystemExit):
        main(["install-plugin-launcher", "--plugin-dir", str(tmp_path), "--index", "7"])


def test_uninstall_plugin_launcher_removes_only_its_own(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    assert main(["install-plugin-launcher", "--plugin-dir", str(tmp_path)]) == 0
    assert main(["uninstall-plugin-launcher", "--plugin-dir", str(tmp_path)]) == 0
    assert list(tmp_path.iterdir()) == []
    assert "runs until the runtime restarts" in capsys.readouterr().out
    foreign = tmp_path / "10-nri-cdi"
    foreign.write_text("#!/bin/sh\nexec /opt/other/plugin\n")
    assert main(["uninstall-plugin-launcher", "--plugin-dir", str(tmp_path)]) == 1
    assert "was not written by nri-cdi install-plugin-launcher" in capsys.readouterr().err
    assert foreign.exists()
    foreign.unlink()
    assert main(["uninstall-plugin-launcher", "--plugin-dir", str(tmp_path)]) == 0
    assert "no launcher at" in capsys.readouterr().out


def test_every_launcher_flag_has_help() -> None:
    from nri_plugin.ops.cli import build_parser

    parser = build_parser("install-plugin-launcher")
    sub = next(a for a in parser._actions if a.choices and "install-plugin-launcher"
               in a.choices).choices["install-plugin-launcher"]
    assert all(a.help for a in sub._actions), [a.option_strings for a in sub._actions
                                               if not a.help]
