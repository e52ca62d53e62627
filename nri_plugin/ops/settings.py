"""One configuration file for the plugin, the generator, the refresher and the policy.

``/etc/nri-cdi/config.yaml`` by default (``--config`` or ``NRI_CDI_CONFIG`` to choose).
Every key has a default, so an absent default file means "all defaults"; an explicitly
named file that is absent is an error. The file is validated as a whole when a command
starts, and every error names its key (``plugin.rescan_interval: expected a number > 0,
got 'soon'``), so a typo never silently falls back to a default.

Precedence: command-line flag > file > built-in default. ``apply_flags`` does the first
step for any argparse namespace whose attributes are ``None`` when the flag was not given.

The result is a :class:`Settings`: frozen dataclasses, one per section
(``settings.plugin.spec_dirs``), each key typed; a file key is a field of its section's
class and has one check (:data:`SECTIONS`). The ``policy`` section is kept as a read-only
mapping here and validated by the policy code: this module only checks that it is a mapping.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from cdi.dirs import DEFAULT_SPEC_DIRS
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.versions import DEFAULT_SOCKET_PATH

DEFAULT_CONFIG_PATH = "/etc/nri-cdi/config.yaml"
CONFIG_ENV = "NRI_CDI_CONFIG"


class SettingsError(NRIPluginError):
    """The configuration is invalid; ``problems`` lists one ``key: why`` line each."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__(f"{source}: " + "; ".join(self.problems))

    def lines(self) -> list[str]:
        return [f"{self.source}: {p}" for p in self.problems]


# --- value checkers: (value) -> normalised value, or raise ValueError(why) -----------------


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _opt_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _abs_path(value: Any) -> str:
    text = _str(value)
    if not os.path.isabs(text):
        raise ValueError(f"expected an absolute path, got {value!r}")
    return text


def _opt_abs_path(value: Any) -> str | None:
    return None if value is None else _abs_path(value)


# = cdi.nvidia.generate.HOOK_PROGRAMS (a test checks), without importing the generator here.
HOOK_PROGRAMS = ("nri-cdi", "nri-cdi-hook", "nvidia-cdi-hook", "nvidia-ctk")


def _hook_program(value: Any) -> str | None:
    """An absolute path to a hook program generate knows the arguments of."""
    path = _opt_abs_path(value)
    if path is not None and os.path.basename(path) not in HOOK_PROGRAMS:
        raise ValueError(f"expected a path ending in /{', /'.join(HOOK_PROGRAMS)}, "
                         f"got {path!r}")
    return path


def _paths(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of absolute paths, got {value!r}")
    if not value:
        raise ValueError("expected at least one path")
    return tuple(_abs_path(v) for v in value)


def _opt_paths(value: Any) -> tuple[str, ...] | None:
    return None if value is None else _paths(value)


def _strs(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of strings, got {value!r}")
    return tuple(_str(v) for v in value)


def _positive(value: Any) -> float:
    # bool is an int subclass: "true" must not read as 1 second
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"expected a number > 0, got {value!r}")
    return float(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _index(value: Any) -> str:
    text = f"{value:02d}" if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or len(text) != 2 or not text.isdigit():
        raise ValueError(f"expected two digits (00-99), got {value!r}")
    return text


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return check


def _address(value: Any) -> str:
    """``host:port`` or ``:port``; empty string = off; port 0 = any free port (logged)."""
    text = _str(value)
    if text == "":
        return text
    _, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected host:port (or \"\" for off), got {value!r}")
    return text


def _mapping(value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a mapping, got {value!r}")
    return MappingProxyType(dict(value))


# --- the sections: typed, immutable values; each key's check, and the file's schema --------


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginSettings:
    """``plugin``: how the NRI plugin connects and where it reads specs."""

    socket: str = DEFAULT_SOCKET_PATH
    name: str = "nri-cdi"
    index: str = "10"  # two digits
    spec_dirs: tuple[str, ...] = DEFAULT_SPEC_DIRS
    rescan_interval: float = 60.0
    # world-writable or non-root-owned spec files and folders: warn, refuse or ignore
    spec_permissions: str = "warn"


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateSettings:
    """``generate``: the ``nri-cdi generate`` options ``refresh`` and ``watch`` run with."""

    output: str = "/var/run/cdi/nvidia.yaml"
    mode: str = "auto"
    driver_root: str = "/"
    dev_root: str | None = None
    device_name_strategies: tuple[str, ...] = ("index", "uuid")
    link_mode: str = "hooks"
    hook_path: str | None = None
    disabled_hooks: tuple[str, ...] = ()
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchSettings:
    """``watch``: how often the node is looked at (seconds)."""

    poll_interval: float = 2.0
    settle: float = 1.0
    resync_interval: float = 300.0


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSettings:
    address: str = ""  # host:port, :port, or "" for off


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    level: str = "info"
    format: str = "text"


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorSettings:
    containerd_config: str = "/etc/containerd/config.toml"
    health_url: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCdiSettings:
    """The runtime's own CDI support (containerd enable_cdi / cdi_spec_dirs): whether it
    injects container cdi.k8s.io annotations itself (the plugin then leaves them alone) and
    which folders it resolves delegated devices (CDI_devices) from. auto / None: read from
    doctor.containerd_config when the plugin starts, else containerd's defaults."""

    enabled: str = "auto"
    spec_dirs: tuple[str, ...] | None = None


Checker = Callable[[Any], Any]
# section -> (its class, key -> checker). Every key of a section's class has a checker
# (tested); the defaults are the classes' and go through the checkers too (tested), so no
# default can be one the file itself would be refused for.
SECTIONS: dict[str, tuple[type[Any], dict[str, Checker]]] = {
    "plugin": (PluginSettings, {
        "socket": _abs_path,
        "name": _str,
        "index": _index,
        "spec_dirs": _paths,
        "rescan_interval": _positive,
        "spec_permissions": _choice("warn", "refuse", "ignore"),
    }),
    "generate": (GenerateSettings, {
        "output": _abs_path,
        "mode": _choice("auto", "nvml", "procfs", "management", "csv"),
        "driver_root": _abs_path,
        "dev_root": _opt_abs_path,
        "device_name_strategies": _strs,
        "link_mode": _choice("hooks", "mounts"),
        "hook_path": _hook_program,
        "disabled_hooks": _strs,
        "extra_args": _strs,
    }),
    "watch": (WatchSettings, {
        "poll_interval": _positive,
        "settle": _positive,
        "resync_interval": _positive,
    }),
    "metrics": (MetricsSettings, {"address": _address}),
    "log": (LogSettings, {
        "level": _choice("debug", "info", "warning", "error"),
        "format": _choice("text", "json"),
    }),
    "doctor": (DoctorSettings, {"containerd_config": _abs_path, "health_url": _opt_str}),
    "runtime_cdi": (RuntimeCdiSettings, {
        "enabled": _choice("auto", "on", "off"),
        "spec_dirs": _opt_paths,
    }),
}
# section -> key -> (checker, default): the file's schema, as the sections define it.
SCHEMA: dict[str, dict[str, tuple[Checker, Any]]] = {
    section: {key: (check, getattr(cls(), key)) for key, check in checks.items()}
    for section, (cls, checks) in SECTIONS.items()
}
# Sections passed through to other code as plain mappings.
OPAQUE_SECTIONS: dict[str, Mapping[str, Any]] = {"policy": MappingProxyType({})}


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The effective configuration, one typed section each; ``policy`` as given."""

    plugin: PluginSettings = PluginSettings()
    generate: GenerateSettings = GenerateSettings()
    watch: WatchSettings = WatchSettings()
    metrics: MetricsSettings = MetricsSettings()
    log: LogSettings = LogSettings()
    doctor: DoctorSettings = DoctorSettings()
    runtime_cdi: RuntimeCdiSettings = RuntimeCdiSettings()
    policy: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    source: str = "(defaults)"

    def as_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts) for printing, in the file's layout."""
        out: dict[str, Any] = {
            section: {key: _plain(getattr(getattr(self, section), key)) for key in checks}
            for section, (_, checks) in SECTIONS.items()
        }
        out["policy"] = _plain(self.policy)
        return out

    def with_values(self, overrides: Mapping[str, Any]) -> Settings:
        """A copy with ``{"section.key": value}`` overrides, each checked like file values."""
        values = {section: _fields(getattr(self, section)) for section in SECTIONS}
        problems = []
        for dotted, value in overrides.items():
            section, key = dotted.split(".", 1)
            try:
                values[section][key] = SECTIONS[section][1][key](value)
            except ValueError as exc:
                problems.append(f"{dotted}: {exc}")
        if problems:
            raise SettingsError("command line", problems)
        return _build(values, self.policy, self.source)


def _fields(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in fields(section)}


def _build(values: Mapping[str, Mapping[str, Any]], policy: Mapping[str, Any],
           source: str) -> Settings:
    sections = {name: SECTIONS[name][0](**keys) for name, keys in values.items()}
    return Settings(**sections, policy=policy, source=source)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def defaults() -> Settings:
    return Settings()


def parse_settings(document: Any, source: str = "config") -> Settings:
    """Validate a parsed YAML document (None = empty file). Collects every problem."""
    if document is None:
        document = {}
    if not isinstance(document, Mapping):
        raise SettingsError(source, [f"(top level): expected a mapping, got {document!r}"])
    problems: list[str] = []
    values: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    policy: Mapping[str, Any] = OPAQUE_SECTIONS["policy"]
    for section, body in document.items():
        if section == "policy":
            try:
                policy = _mapping({} if body is None else body)
            except ValueError as exc:
                problems.append(f"policy: {exc}")
            continue
        if section not in SECTIONS:
            problems.append(f"{section}: unknown section (known: "
                            f"{', '.join([*SECTIONS, *OPAQUE_SECTIONS])})")
            continue
        if body is None:
            continue
        if not isinstance(body, Mapping):
            problems.append(f"{section}: expected a mapping, got {body!r}")
            continue
        problems += _section(section, body, values[section])
    if problems:
        raise SettingsError(source, problems)
    return _build(values, policy, source)


def _section(section: str, body: Mapping[str, Any], into: dict[str, Any]) -> list[str]:
    problems = []
    checks = SECTIONS[section][1]
    for key, value in body.items():
        check = checks.get(key)
        if check is None:
            problems.append(f"{section}.{key}: unknown key (known: {', '.join(checks)})")
            continue
        try:
            into[key] = check(value)
        except ValueError as exc:
            problems.append(f"{section}.{key}: {exc}")
    return problems


def config_path(explicit: str | None, environ: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """(path, required): a path given by flag or NRI_CDI_CONFIG must exist; the default
    path may be absent."""
    env = os.environ if environ is None else environ
    if explicit:
        return explicit, True
    if env.get(CONFIG_ENV):
        return env[CONFIG_ENV], True
    return DEFAULT_CONFIG_PATH, False


def load_settings(explicit: str | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    # PyYAML here: 8.5-10.5 ms (python -X importtime) that a plugin started with no
    # settings file, and every subcommand that only builds its parser, never needs.
    import yaml

    path, required = config_path(explicit, environ)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        if required:
            raise SettingsError(path, ["file not found"]) from None
        return defaults()
    except OSError as exc:
        raise SettingsError(path, [f"cannot read: {exc.strerror}"]) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(path, [f"not valid YAML: {exc}"]) from None
    return parse_settings(document, path)


# --- flags ---------------------------------------------------------------------------------
# argparse destination -> settings key, for the flags that exist on the commands. A flag
# overrides the file only when given: its default must be None (or an empty list).
FLAG_KEYS: dict[str, str] = {
    "socket": "plugin.socket",
    "name": "plugin.name",
    "idx": "plugin.index",
    "spec_dirs": "plugin.spec_dirs",
    "rescan_interval": "plugin.rescan_interval",
    "log_level": "log.level",
    "log_format": "log.format",
    "metrics_address": "metrics.address",
    "output": "generate.output",
    "mode": "generate.mode",
    "driver_root": "generate.driver_root",
    "dev_root": "generate.dev_root",
    "poll_interval": "watch.poll_interval",
    "settle": "watch.settle",
    "resync_interval": "watch.resync_interval",
    "containerd_config": "doctor.containerd_config",
    "health_url": "doctor.health_url",
    "runtime_cdi": "runtime_cdi.enabled",
}


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help=f"configuration file (default: ${CONFIG_ENV} or "
                             f"{DEFAULT_CONFIG_PATH} if it exists)")


def apply_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    overrides = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items()
                 if getattr(args, dest, None) not in (None, [])}
    return settings.with_values(overrides) if overrides else settings


def settings_from_args(args: argparse.Namespace) -> Settings:
    """File (``args.config``) then flags: what every command calls first."""
    return apply_flags(load_settings(getattr(args, "config", None)), args)


# --- `nri-cdi config show|check` -------------------------------------------------------------


def add_commands(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="show or check the configuration file")
    sub = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="print the effective configuration (file + flags)")
    add_config_argument(show)
    show.add_argument("--format", dest="output_format", choices=("yaml", "json"),
                      default="yaml")
    for dest, key in FLAG_KEYS.items():
        if dest != "spec_dirs":
            show.add_argument("--" + dest.replace("_", "-"), dest=dest, metavar="VALUE",
                              type=_flag_type(key), help=f"override {key}")
    show.add_argument("--spec-dir", dest="spec_dirs", action="append", metavar="DIR",
                      help="override plugin.spec_dirs (repeatable)")
    show.set_defaults(func=cmd_show)
    check = sub.add_parser("check", help="validate the configuration file; exit 1 if invalid")
    add_config_argument(check)
    check.set_defaults(func=cmd_check)


def _flag_type(key: str) -> Callable[[str], Any]:
    section, name = key.split(".")
    default = SCHEMA[section][name][1]
    return float if isinstance(default, float) else str


def cmd_show(args: argparse.Namespace) -> int:

    try:
        settings = settings_from_args(args)
    except SettingsError as exc:
        print("\n".join(f"nri-cdi config: error: {line}" for line in exc.lines()),
              file=sys.stderr)
        return 1
    data = settings.as_dict()
    if args.output_format == "json":
        print(json.dumps(data, indent=2))
    else:
        import yaml  # see load_settings

        print(f"# effective configuration; file: {settings.source}")
        print(yaml.safe_dump(data, sort_keys=False, default_flow_style=False), end="")
    return 0


def cmd_check(args: argparse.Namespace) -> int:

    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print("\n".join(f"nri-cdi config: error: {line}" for line in exc.lines()),
              file=sys.stderr)
        return 1
    print(f"{settings.source}: valid")
    return 0
