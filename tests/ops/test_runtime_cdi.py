"""The plugin reads containerd's own CDI set-up from containerd's configuration when it
starts, and says so plainly where it could not (issue 41, defect 6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_plugin.nri.versions import UNKNOWN_DIRS, NativeCdi, RuntimeInfo, SpecDirs
from nri_plugin.ops.runtime_cdi import runtime_cdi_config
from nri_plugin.ops.settings import Settings, SettingsError, parse_settings

C21 = RuntimeInfo.from_configure("containerd", "2.1.9")
C17 = RuntimeInfo.from_configure("containerd", "1.7.24")


def _settings(config: Path, **overrides: object) -> Settings:
    # A socket no running containerd serves: only the named file counts.
    return Settings().with_values({"runtime_cdi.containerd_config": str(config),
                                   "plugin.socket": "/nonexistent/nri.sock", **overrides})


def test_version_3_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
                      '  enable_cdi = true\n  cdi_spec_dirs = ["/opt/cdi"]\n')
    got = runtime_cdi_config(_settings(config))
    assert (got.enabled, got.spec_dirs, got.unread) == (NativeCdi.ON,
                                                        SpecDirs.of(("/opt/cdi",)), "")
    assert got.origin == f"read from {config}"
    applied = got.applied_to(C21)
    assert applied.native_cdi is NativeCdi.ON
    assert applied.cdi_spec_dirs == SpecDirs.of(("/opt/cdi",))
    assert "not read" not in got.describe(C21)


def test_a_drop_in_counts(tmp_path: Path) -> None:
    # containerd 2.x: the imported file's key wins, the others stay.
    (tmp_path / "conf.d").mkdir()
    config = tmp_path / "config.toml"
    config.write_text('version = 3\nimports = ["conf.d/*.toml"]\n'
                      '[plugins."io.containerd.cri.v1.runtime"]\n'
                      '  enable_cdi = true\n  cdi_spec_dirs = ["/opt/cdi"]\n')
    (tmp_path / "conf.d" / "50-off.toml").write_text(
        'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n')
    got = runtime_cdi_config(_settings(config))
    assert (got.enabled, got.spec_dirs) == (NativeCdi.OFF, SpecDirs.of(("/opt/cdi",)))
    assert got.origin == f"read from {config} (+ {tmp_path / 'conf.d' / '50-off.toml'})"
    assert got.describe(C21).startswith("runtime's own CDI off, resolves CDI_devices from")


def test_no_file_is_said_to_be_an_assumption(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    # The defect: containerd 2.1 had enable_cdi = false in a file the plugin was not told
    # about, and the plugin said "own CDI on, /etc/cdi, /var/run/cdi" as a fact.
    got = runtime_cdi_config(_settings(tmp_path / "absent.toml"))
    assert got.enabled is NativeCdi.UNKNOWN and got.spec_dirs is UNKNOWN_DIRS
    assert got.unread.startswith(f"no {tmp_path / 'absent.toml'}")
    said = got.describe(C21)
    assert said.startswith("the runtime's settings were not read (no ")
    assert "; assuming runtime's own CDI on, resolves CDI_devices from unknown folders" in said
    assert got.applied_to(C21).native_cdi is NativeCdi.ON  # 2.x: on by default
    assert got.applied_to(C17).native_cdi is NativeCdi.OFF
    assert "containerd's settings were not read (no " in caplog.text
    assert "runtime_cdi.containerd_config" in caplog.text  # how to tell it


def test_an_unreadable_file_is_not_read(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 3\nimports = ["/nonexistent/extra.toml"]\n')
    got = runtime_cdi_config(_settings(config))
    assert got.enabled is NativeCdi.UNKNOWN and got.spec_dirs is UNKNOWN_DIRS
    assert "/nonexistent/extra.toml, which" in got.unread and "imports, is not there" in \
        got.unread
    config.write_text("version = 3\n[plugins\n")
    assert "not read" in runtime_cdi_config(_settings(config)).describe(C21)


def test_settings_override_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n')
    got = runtime_cdi_config(_settings(config, **{"runtime_cdi.enabled": "off"}))
    assert (got.enabled, got.spec_dirs) == (NativeCdi.OFF,
                                     SpecDirs.of(("/etc/cdi", "/var/run/cdi")))
    assert got.origin == f"read from {config}; runtime_cdi.enabled set"
    both = runtime_cdi_config(_settings(tmp_path / "absent.toml", **{
        "runtime_cdi.enabled": "off", "runtime_cdi.spec_dirs": ["/srv/cdi"]}))
    assert (both.enabled, both.spec_dirs, both.unread) == (NativeCdi.OFF,
                                                           SpecDirs.of(("/srv/cdi",)), "")
    assert both.origin == "runtime_cdi.enabled and runtime_cdi.spec_dirs set"


def test_bad_values_name_their_key() -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings({"runtime_cdi": {"enabled": "yes", "spec_dirs": "/etc/cdi"}})
    text = str(info.value)
    assert "runtime_cdi.enabled: expected one of auto, on, off, got 'yes'" in text
    assert "runtime_cdi.spec_dirs: expected a list of absolute paths" in text


def test_a_running_crio_serving_the_socket_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    # CRI-O's NRI socket is the plugin's: CRI-O's files tell, and CRI-O's CDI is always on.
    from nri_plugin.ops import crio_config, runtime_cdi

    config = tmp_path / "crio.conf"
    config.write_text('[crio.runtime]\ncdi_spec_dirs = ["/srv/cdi"]\n'
                      '[crio.nri]\nnri_listen = "/run/crio-nri.sock"\n')
    found = crio_config.read_crio_config(str(config), str(tmp_path / "none"),
                                         source="the running crio (pid 7)", pid=7)
    monkeypatch.setattr(runtime_cdi, "locate_crio", lambda socket: found)
    settings = Settings().with_values({"plugin.socket": "/run/crio-nri.sock"})
    got = runtime_cdi_config(settings)
    assert (got.enabled, got.spec_dirs, got.unread) == (NativeCdi.ON,
                                                        SpecDirs.of(("/srv/cdi",)), "")
    assert got.origin == (f"CRI-O's own CDI is always on; read from {config} "
                          "(the running crio (pid 7))")
    assert "containerd" not in caplog.text
    crio = RuntimeInfo.from_configure("cri-o", "1.35.6")
    assert got.applied_to(crio).native_cdi is NativeCdi.ON
