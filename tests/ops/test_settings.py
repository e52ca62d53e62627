"""The configuration file: defaults, valid files, errors that name the key, flags win."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from nri_plugin.ops.cli import main
from nri_plugin.ops.settings import (
    DEFAULT_CONFIG_PATH,
    SCHEMA,
    SECTIONS,
    PluginSettings,
    SettingsError,
    apply_flags,
    defaults,
    load_settings,
    parse_settings,
)


def test_every_default_passes_its_own_check() -> None:
    for section, keys in SCHEMA.items():
        for key, (check, default) in keys.items():
            if default is not None:
                assert check(default) == default, f"{section}.{key}"


def test_settings_are_typed_immutable_values() -> None:
    s = parse_settings({"plugin": {"spec_dirs": ["/a"]}})
    assert isinstance(s.plugin, PluginSettings) and s.plugin.spec_dirs == ("/a",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.plugin.spec_dirs = ("/b",)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.plugin = PluginSettings()  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.policy["x"] = 1  # type: ignore[index]
    # Every key of every section has a check, and the file's keys are the classes' fields.
    for section, (cls, checks) in SECTIONS.items():
        assert [f.name for f in dataclasses.fields(cls)] == list(checks), section
        assert type(getattr(s, section)) is cls
    assert s.with_values({"plugin.index": 7}).plugin.index == "07" and s.plugin.index == "10"


def test_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("""
plugin:
  socket: /run/nri/nri.sock
  index: 5
  spec_dirs: [/etc/cdi]
generate:
  mode: procfs
  output: /etc/cdi/nvidia.yaml
watch: {poll_interval: 0.5}
metrics: {address: "127.0.0.1:9464"}
log: {format: json}
policy:
  rules: [{allow: "nvidia.com/gpu=*"}]
""")
    s = load_settings(str(path))
    assert s.plugin.index == "05" and s.plugin.spec_dirs == ("/etc/cdi",)
    assert s.watch.poll_interval == 0.5 and s.watch.settle == 1.0
    assert s.policy["rules"] == [{"allow": "nvidia.com/gpu=*"}]
    assert s.source == str(path)


@pytest.mark.parametrize("document, key", [
    ({"plugin": {"socket": "relative.sock"}}, "plugin.socket: expected an absolute path"),
    ({"plugin": {"sockt": "/x"}}, "plugin.sockt: unknown key"),
    ({"plugin": {"index": "123"}}, "plugin.index: expected two digits"),
    ({"plugin": {"spec_dirs": "/etc/cdi"}}, "plugin.spec_dirs: expected a list"),
    ({"plugin": {"rescan_interval": "soon"}}, "plugin.rescan_interval: expected a number > 0"),
    ({"plugin": {"rescan_interval": True}}, "plugin.rescan_interval: expected a number > 0"),
    ({"plugin": {"spec_permissions": "strict"}},
     "plugin.spec_permissions: expected one of warn, refuse, ignore"),
    ({"generate": {"mode": "wsl"}}, "generate.mode: expected one of auto, nvml"),
    ({"watch": {"settle": -1}}, "watch.settle: expected a number > 0"),
    ({"metrics": {"address": "9464"}}, "metrics.address: expected host:port"),
    ({"log": {"format": "xml"}}, "log.format: expected one of text, json"),
    ({"plugins": {}}, "plugins: unknown section"),
    ({"plugin": []}, "plugin: expected a mapping"),
    ({"policy": "allow-all"}, "policy: expected a mapping"),
    (["plugin"], "(top level): expected a mapping"),
])
def test_each_error_names_its_key(document: object, key: str) -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings(document, "config.yaml")
    assert any(p.startswith(key) for p in info.value.problems), info.value.problems


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(SettingsError) as info:
        parse_settings({"plugin": {"socket": 1, "name": 2}, "log": {"level": "loud"}})
    assert len(info.value.problems) == 3


def test_missing_files(tmp_path: Path) -> None:
    assert load_settings(None, environ={}) == defaults() or \
        Path(DEFAULT_CONFIG_PATH).exists()  # the default path may be absent
    with pytest.raises(SettingsError, match="file not found"):
        load_settings(str(tmp_path / "nope.yaml"))
    with pytest.raises(SettingsError, match="file not found"):
        load_settings(None, environ={"NRI_CDI_CONFIG": str(tmp_path / "nope.yaml")})
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugin: [unclosed\n")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(str(bad))


def test_flags_override_the_file(tmp_path: Path) -> None:
    import argparse

    path = tmp_path / "c.yaml"
    path.write_text("plugin: {socket: /file.sock, name: from-file}\nlog: {level: debug}\n")
    args = argparse.Namespace(socket="/flag.sock", name=None, spec_dirs=[], log_level=None)
    s = apply_flags(load_settings(str(path)), args)
    assert s.plugin.socket == "/flag.sock"  # flag wins
    assert s.plugin.name == "from-file"  # unset flag: the file
    assert s.log.level == "debug"
    with pytest.raises(SettingsError, match=r"plugin\.socket: expected an absolute path"):
        apply_flags(s, argparse.Namespace(socket="rel"))


def test_config_show_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("watch: {poll_interval: 3}\nmetrics: {address: ':9464'}\n")
    assert main(["config", "show", "--config", str(path), "--format", "json",
                 "--poll-interval", "7", "--spec-dir", "/a", "--spec-dir", "/b"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["watch"]["poll_interval"] == 7.0
    assert shown["metrics"]["address"] == ":9464"
    assert shown["plugin"]["spec_dirs"] == ["/a", "/b"]
    assert main(["config", "check", "--config", str(path)]) == 0
    path.write_text("watch: {poll_intervall: 3}\n")
    assert main(["config", "check", "--config", str(path)]) == 1
    assert "watch.poll_intervall: unknown key" in capsys.readouterr().err
