"""The configuration file: defaults, valid files, errors that name the key, flags win; and
each key declared once (the section classes' fields) drives the file, the flags and the
help."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cdi.declare import DECLARED
from nri_plugin.ops.cli import build_parser, main
from nri_plugin.ops.settings import (
    DEFAULT_CONFIG_PATH,
    SECTIONS,
    Key,
    PluginSettings,
    Settings,
    SettingsError,
    add_setting_flags,
    all_keys,
    apply_flags,
    keys_of,
    load_settings,
    parse_settings,
)


def test_every_default_passes_its_own_check() -> None:
    for section, name, key in all_keys():
        default = getattr(SECTIONS[section](), name)
        assert key.check(default) == default, f"{section}.{name}"


def test_settings_are_typed_immutable_values() -> None:
    s = parse_settings({"plugin": {"spec_dirs": ["/a"]}})
    assert isinstance(s.plugin, PluginSettings) and s.plugin.spec_dirs == ("/a",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.plugin.spec_dirs = ("/b",)  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.plugin = PluginSettings()  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.policy["x"] = 1  # type: ignore[index]
    assert s.with_values({"plugin.index": 7}).plugin.index == "07" and s.plugin.index == "10"


def test_each_key_is_declared_once_on_its_field() -> None:
    # Every field of every section is a key (its metadata holds the declaration), and the
    # sections are Settings' fields: nothing else lists them.
    assert list(SECTIONS) == [f.name for f in dataclasses.fields(Settings)
                              if f.name not in ("policy", "source")]
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            assert isinstance(f.metadata.get(DECLARED), Key), f"{section}.{f.name} has no key"
    flags = [flag for _, _, key in all_keys() for flag in key.flags]
    assert len(flags) == len(set(flags)), "two keys share a flag"


def _all_parsers() -> list[argparse.ArgumentParser]:
    """Every subcommand's parser (and nested ones: config show)."""
    found = []
    todo = [build_parser()]
    while todo:
        parser = todo.pop()
        found.append(parser)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += list(dict.fromkeys(action.choices.values()))
    return found


def test_every_key_flag_on_every_command_shows_its_declared_default() -> None:
    seen = 0
    for parser in _all_parsers():
        for action in parser._actions:
            if "." not in action.dest:
                continue
            section, name = action.dest.split(".")
            assert keys_of(section)[name].flags[0] in action.option_strings
            assert action.default is None  # given or not: the file decides when not
            assert f"({section}.{name}; default: " in (action.help or ""), action.help
            seen += 1
    assert seen > 20  # plugin, watch, refresh, doctor, config show


@pytest.mark.parametrize(("argv", "dotted", "value"), [
    (["--socket", "/x.sock"], "plugin.socket", "/x.sock"),
    (["--idx", "07"], "plugin.index", "07"),
    (["--index", "08"], "plugin.index", "08"),
    (["--spec-dir", "/a", "--spec-dir", "/b"], "plugin.spec_dirs", ("/a", "/b")),
    (["--rescan-interval", "2.5"], "plugin.rescan_interval", 2.5),
    (["--runtime-cdi", "off"], "runtime_cdi.enabled", "off"),
    (["--containerd-config", "/c.toml"], "runtime_cdi.containerd_config", "/c.toml"),
])
def test_a_flag_sets_its_key(argv: list[str], dotted: str, value: object) -> None:
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, "plugin.socket", "plugin.index", "plugin.spec_dirs",
                      "plugin.rescan_interval", "runtime_cdi.enabled",
                      "runtime_cdi.containerd_config")
    settings = apply_flags(Settings(), parser.parse_args(argv))
    section, name = dotted.split(".")
    assert getattr(getattr(settings, section), name) == value
    untouched = apply_flags(Settings(), parser.parse_args([]))
    assert untouched == Settings()


def test_a_bad_flag_value_names_the_flag_and_the_key() -> None:
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, "plugin.socket", "plugin.rescan_interval")
    with pytest.raises(SettingsError) as info:
        apply_flags(Settings(), parser.parse_args(["--socket", "rel.sock",
                                                   "--rescan-interval", "soon"]))
    assert info.value.problems == (
        "--socket (plugin.socket): expected an absolute path, got 'rel.sock'",
        "--rescan-interval (plugin.rescan_interval): expected a number > 0, got 'soon'")


def test_a_file_only_key_has_no_flag() -> None:
    with pytest.raises(ValueError, match=r"generate\.hook_path has no command-line flag"):
        add_setting_flags(argparse.ArgumentParser(), "generate.hook_path")


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
    ({"generate": {"hook_path": "/usr/bin/my-hook"}},
     "generate.hook_path: expected a path ending in /nri-cdi, /nri-cdi-hook"),
    ({"plugin": {"status_dir": "run/x"}}, "plugin.status_dir: expected an absolute path"),
    ({"doctor": {"containerd_config": "/etc/containerd/config.toml"}},
     "doctor.containerd_config: moved to runtime_cdi.containerd_config"),
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


def test_missing_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NRI_CDI_CONFIG", raising=False)
    assert load_settings(None) == Settings() or \
        Path(DEFAULT_CONFIG_PATH).exists()  # the default path may be absent
    with pytest.raises(SettingsError, match="file not found"):
        load_settings(str(tmp_path / "nope.yaml"))
    monkeypatch.setenv("NRI_CDI_CONFIG", str(tmp_path / "nope.yaml"))
    with pytest.raises(SettingsError, match="file not found"):
        load_settings(None)
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugin: [unclosed\n")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(str(bad))


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("plugin: {socket: /file.sock, name: from-file}\nlog: {level: debug}\n")
    parser = argparse.ArgumentParser()
    add_setting_flags(parser, "plugin.socket", "plugin.name", "plugin.spec_dirs", "log.level")
    s = apply_flags(load_settings(str(path)), parser.parse_args(["--socket", "/flag.sock"]))
    assert s.plugin.socket == "/flag.sock"  # flag wins
    assert s.plugin.name == "from-file"  # unset flag: the file
    assert s.log.level == "debug"


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


def test_config_show_is_a_commented_file_that_reads_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("plugin: {spec_dirs: [/a]}\npolicy: {rules: [{allow: '*'}]}\n")
    assert main(["config", "show", "--config", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "  # full rescan of the spec folders, besides inotify\n" in shown
    assert "# How the NRI plugin connects and where it reads specs.\nplugin:\n" in shown
    again = tmp_path / "again.yaml"
    again.write_text(shown)
    assert load_settings(str(again)).as_dict() == load_settings(str(path)).as_dict()


def test_config_reference_lists_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "reference"]) == 0
    text = capsys.readouterr().out
    for section, name, _ in all_keys():
        assert f"| `{section}.{name}` |" in text
    assert "| `plugin.index` | two digits | `10` | `--index`, `--idx` |" in text


def test_flag_help_from_the_declaration() -> None:
    done = subprocess.run([sys.executable, "-m", "nri_plugin.ops.cli", "plugin", "--help"],
                          capture_output=True, text=True, check=True,
                          env={"COLUMNS": "1000", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert "(plugin.rescan_interval; default: 60)" in done.stdout
    assert ("(runtime_cdi.containerd_config; default: the --config of the running containerd "
            "serving plugin.socket, else /etc/containerd/config.toml)") in done.stdout
    assert "docs/usage/policy.md" in done.stdout and "README" not in done.stdout
    yaml.safe_load("{}")  # PyYAML is importable here: config show needs it

