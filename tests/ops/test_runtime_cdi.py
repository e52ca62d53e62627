"""The plugin reads containerd's own CDI set-up from its config.toml when it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.ops.runtime_cdi import runtime_cdi_config
from nri_plugin.ops.settings import SettingsError, defaults, parse_settings

C21 = RuntimeInfo.from_configure("containerd", "2.1.9")


def _settings(config: Path, **overrides: object) -> object:
    return defaults().with_values({"runtime_cdi.containerd_config": str(config), **overrides})


def test_version_3_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
                      '  enable_cdi = true\n  cdi_spec_dirs = ["/opt/cdi"]\n')
    got = runtime_cdi_config(_settings(config))
    assert (got.enabled, got.spec_dirs, got.origin) == (True, ("/opt/cdi",), str(config))
    applied = got.applied_to(C21)
    assert applied.native_cdi is True and applied.cdi_spec_dirs == ("/opt/cdi",)


def test_no_file_means_containerds_defaults(tmp_path: Path) -> None:
    got = runtime_cdi_config(_settings(tmp_path / "absent.toml"))
    assert got.enabled is None and got.spec_dirs == ("/etc/cdi", "/var/run/cdi")
    assert "containerd's defaults" in got.origin and "absent" in got.origin
    assert got.applied_to(C21).native_cdi is True  # 2.x: on by default
    old = got.applied_to(RuntimeInfo.from_configure("containerd", "1.7.24"))
    assert old.native_cdi is False


def test_settings_override_the_file(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n')
    got = runtime_cdi_config(_settings(config, **{"runtime_cdi.enabled": "off",
                                                  "runtime_cdi.spec_dirs": ["/srv/cdi"]}))
    assert (got.enabled, got.spec_dirs) == (False, ("/srv/cdi",))
    assert "runtime_cdi.enabled set" in got.origin


def test_bad_values_name_their_key() -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings({"runtime_cdi": {"enabled": "yes", "spec_dirs": "/etc/cdi"}})
    text = str(info.value)
    assert "runtime_cdi.enabled: expected one of auto, on, off, got 'yes'" in text
    assert "runtime_cdi.spec_dirs: expected a list of absolute paths" in text
