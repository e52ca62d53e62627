"""One configuration file for the plugin, the generator, the refresher and the policy
(docs/reference/configuration.md, which ``nri-cdi config reference`` writes).

Each key is declared once: a field of its section's frozen dataclass below, with its
default and a :class:`Key` in its metadata (meaning, value check, flag). The file's parsing
and validation (every error names the file and the key), the commands' flags and their
help, and ``config show``/``reference`` are derived from those declarations. Precedence:
flag > file > default. The ``policy`` section is only checked to be a mapping here; the
policy code validates it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, TypeVar

from cdi.declare import DECLARED, Declared, declarations
from cdi.dirs import DEFAULT_SPEC_DIRS
from cdi.nvidia.hook_programs import HOOK_PROGRAMS
from cdi.nvidia.options import OPTIONS
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.versions import DEFAULT_SOCKET_PATH
from nri_plugin.ops.kubelet_plugins import DEFAULT_REGISTRY

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


# --- value types: how a value is checked, and read from a flag -----------------------------


@dataclass(frozen=True, slots=True)
class ValueType:
    """``check(value)`` returns the normalised value or raises ``ValueError(why)``;
    ``from_text`` reads a flag's text before the check; ``name`` is for the reference."""

    name: str
    check: Callable[[Any], Any]
    from_text: Callable[[str], Any] = str
    choices: tuple[str, ...] = ()


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _abs_path(value: Any) -> str:
    text = _str(value)
    if not os.path.isabs(text):
        raise ValueError(f"expected an absolute path, got {value!r}")
    return text


def _hook_program(value: Any) -> str:
    """An absolute path to a hook program generate knows the arguments of."""
    path = _abs_path(value)
    if os.path.basename(path) not in HOOK_PROGRAMS:
        raise ValueError(f"expected a path ending in /{', /'.join(HOOK_PROGRAMS)}, "
                         f"got {path!r}")
    return path


def _paths(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of absolute paths, got {value!r}")
    if not value:
        raise ValueError("expected at least one path")
    return tuple(_abs_path(v) for v in value)


def _strs(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list of strings, got {value!r}")
    return tuple(_str(v) for v in value)


def _seconds(zero: bool) -> Callable[[Any], float]:
    """A number > 0, or >= 0 with ``zero``."""
    def check(value: Any) -> float:
        # bool is an int subclass: "true" must not read as 1 second
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                value >= 0 if zero else value > 0):
            raise ValueError(f"expected a number {'>=' if zero else '>'} 0, got {value!r}")
        return float(value)

    return check


def _number_text(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text  # the check names the key and the bad value


def _index(value: Any) -> str:
    text = f"{value:02d}" if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(text, str) or len(text) != 2 or not text.isdigit():
        raise ValueError(f"expected two digits (00-99), got {value!r}")
    return text


def parse_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces); port 0: any free port."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected host:port (or \"\" for off), got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _off_or(check: Callable[[str], object]) -> Callable[[Any], str]:
    """"" (off), or a value ``check`` takes."""
    def checked(value: Any) -> str:
        if _str(value):
            check(value)
        return str(value)

    return checked


def one_of(*choices: str) -> ValueType:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return ValueType(f"one of {', '.join(choices)}", check, choices=choices)


STRING = ValueType("string", _str)
ABSOLUTE_PATH = ValueType("absolute path", _abs_path)
PATHS = ValueType("list of absolute paths", _paths)
STRINGS = ValueType("list of strings", _strs)
SECONDS = ValueType("number > 0 (seconds)", _seconds(False), from_text=_number_text)
WAIT_SECONDS = ValueType("number >= 0 (seconds; 0: no wait)", _seconds(True),
                         from_text=_number_text)
INDEX = ValueType("two digits", _index)
ADDRESS = ValueType('host:port, :port, or "" (off)', _off_or(parse_address))
HOOK_PROGRAM = ValueType(f"absolute path ending in /{', /'.join(HOOK_PROGRAMS)}",
                         _hook_program)
PATH_OR_OFF = ValueType('absolute path, or "" (off)', _off_or(_abs_path))


# --- a key's declaration -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Key(Declared):
    """A key: its value type (a flag's value is parsed into the attribute named
    ``section.key``); ``option``: the ``nri-cdi generate`` option a ``generate`` key sets
    (``refresh`` passes its flag)."""

    type: ValueType
    option: str | None = None

    def check(self, value: Any) -> Any:
        # None (null in the file) is a value where it is the default
        return None if value is None and self.default is None else self.type.check(value)


T = TypeVar("T")


def setting(default: T, value_type: ValueType, help: str, *flags: str, **details: Any) -> T:
    """A section field: its default and its :class:`Key` (``details``: its other fields; a
    wrong name fails at import)."""
    key = Key(default=default, help=help, type=value_type, flags=flags,
              choices=value_type.choices, **details)
    return field(default=default, metadata={DECLARED: key})


def generate_setting(option: str, value_type: ValueType, *, flag: bool = False,
                     default: Any = None) -> Any:
    """A ``generate`` section field: the generator's option ``option`` (its declaration in
    cdi.nvidia.options gives the meaning, the default unless ``default``, and with ``flag``
    its first flag), as a file key."""
    spec = OPTIONS[option]
    return setting(spec.default if default is None else default, value_type, spec.help,
                   *spec.flags[:1] if flag else (), metavar=spec.metavar, option=option,
                   default_text=spec.default_text if default is None else None)


# --- the sections: typed, immutable values -------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PluginSettings:
    """How the NRI plugin connects and where it reads specs."""

    socket: str = setting(
        DEFAULT_SOCKET_PATH, ABSOLUTE_PATH,
        "the runtime's NRI socket; unused when the runtime launched the plugin itself "
        "(NRI_PLUGIN_SOCKET)", "--socket", metavar="PATH")
    name: str = setting(
        "nri-cdi", STRING,
        "plugin name; NRI_PLUGIN_NAME wins over the file when the runtime launched the "
        "plugin", "--name")
    index: str = setting(
        "10", INDEX,
        "plugin index, two digits (the runtime calls plugins in index order); "
        "NRI_PLUGIN_IDX wins over the file when the runtime launched the plugin",
        "--index", "--idx", metavar="NN")
    spec_dirs: tuple[str, ...] = setting(
        DEFAULT_SPEC_DIRS, PATHS,
        "CDI spec folders; a device in a later folder wins over one of the same name in an "
        "earlier one", "--spec-dir", metavar="DIR")
    rescan_interval: float = setting(
        60.0, SECONDS, "full rescan of the spec folders, besides inotify",
        "--rescan-interval", metavar="SECONDS")
    spec_permissions: str = setting(
        "warn", one_of("warn", "refuse", "ignore"),
        "spec files and folders that are world-writable or not owned by root: warn, refuse "
        "them, or ignore it")
    status_dir: str = setting(
        "/run/nri-cdi", PATH_OR_OFF,
        "where the plugin keeps its status file (NN-name.json: connected to which runtime, "
        "since when), which nri-cdi doctor reads", "--status-dir", metavar="DIR")
    ready_file: str = setting(
        "", PATH_OR_OFF,
        "a file the plugin creates once it is registered with the runtime and synchronized, "
        "and removes when that connection closes: a readiness probe of this process alone "
        "(the metrics address is the node's, which a second plugin shares during an "
        "upgrade)", "--ready-file", metavar="PATH")
    pod_resources_socket: str = setting(
        "/var/lib/kubelet/pod-resources/kubelet.sock", PATH_OR_OFF,
        "the kubelet's pod-resources socket: a device asked for by annotation or env that "
        "the kubelet allocated to another pod is refused (no socket: no kubelet, nothing "
        "checked; the kubelet extra needed)", "--pod-resources-socket", metavar="PATH")
    pod_resources_interval: float = setting(
        1.0, SECONDS, "how often the kubelet's allocations are read again",
        "--pod-resources-interval", metavar="SECONDS")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateSettings:
    """The ``nri-cdi generate`` options that ``refresh`` and ``watch`` run it with."""

    # The spec nri-cdi's own commands read: a file, where generate alone writes stdout.
    output: str = generate_setting("output", ABSOLUTE_PATH, flag=True,
                                   default="/var/run/cdi/nvidia.yaml")
    mode: str = generate_setting("mode", one_of(*OPTIONS["mode"].choices), flag=True)
    # Always a folder: refresh and watch look at the node under it.
    driver_root: str = generate_setting("driver_root", ABSOLUTE_PATH, flag=True, default="/")
    dev_root: str | None = generate_setting("dev_root", ABSOLUTE_PATH, flag=True)
    device_name_strategies: tuple[str, ...] = generate_setting("strategies", STRINGS)
    link_mode: str = generate_setting("link_mode", one_of(*OPTIONS["link_mode"].choices))
    hook_path: str | None = generate_setting("hook_path", HOOK_PROGRAM)
    disabled_hooks: tuple[str, ...] = generate_setting("disabled_hooks", STRINGS)
    extra_args: tuple[str, ...] = setting((), STRINGS, "more nri-cdi generate arguments")


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchSettings:
    """How ``nri-cdi watch`` (and ``refresh``) look at the node."""

    poll_interval: float = setting(2.0, SECONDS, "seconds between looks at the node",
                                   "--poll-interval", metavar="SECONDS")
    settle: float = setting(1.0, SECONDS, "a change must hold this long before the spec is "
                            "regenerated", "--settle", metavar="SECONDS")
    resync_interval: float = setting(300.0, SECONDS, "run the generator (which writes only "
                                     "when something changed) at least this often",
                                     "--resync-interval", metavar="SECONDS")
    wait_for_driver: float = setting(
        0.0, WAIT_SECONDS,
        "refresh: when generation fails, wait up to this long for the driver (the kernel "
        "module's /proc/driver/nvidia/version under the dev root, and libnvidia-ml.so.1 "
        "under the driver root) and generate again, for a driver container that is not "
        "ready yet; when it never appears, exit 1 naming what is missing",
        "--wait-for-driver", metavar="SECONDS", default_text="0 (no wait)")


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSettings:
    """The plugin's Prometheus metrics and health endpoint."""

    address: str = setting("", ADDRESS,
                           "serve /metrics, /healthz and /livez at host:port (port 0: any "
                           "free port, logged)", "--metrics-address", metavar="HOST:PORT",
                           default_text='"" (off)')


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSettings:
    """What the commands log, and how."""

    level: str = setting("info", one_of("debug", "info", "warning", "error"), "log level",
                         "--log-level")
    format: str = setting("text", one_of("text", "json"), "log line format", "--log-format")


@dataclass(frozen=True, slots=True, kw_only=True)
class DoctorSettings:
    """What ``nri-cdi doctor`` asks besides the files."""

    health_url: str | None = setting(None, STRING, "the plugin's /healthz URL",
                                     "--health-url", metavar="URL",
                                     default_text="from metrics.address")
    plugin_registry: str = setting(
        DEFAULT_REGISTRY, ABSOLUTE_PATH,
        "the kubelet's plugin registry folder, whose registration sockets doctor asks which "
        "kubelet plugins (DRA drivers) are registered", "--plugin-registry", metavar="DIR")


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCdiSettings:
    """The runtime's own CDI (containerd's enable_cdi and cdi_spec_dirs): whether it injects
    devices named in container cdi.k8s.io annotations itself (the plugin then leaves them
    alone) and which folders it resolves the devices the plugin hands over (CDI_devices)
    from. Read from containerd's configuration when the plugin starts, unless set here."""

    containerd_config: str | None = setting(
        None, ABSOLUTE_PATH,
        "containerd's configuration file, read with its imports when the plugin and the "
        "doctor start", "--containerd-config", metavar="FILE",
        default_text="the --config of the running containerd serving plugin.socket, else "
                     "/etc/containerd/config.toml")
    enabled: str = setting("auto", one_of("auto", "on", "off"),
                           "whether the runtime's own CDI is on (auto: from containerd's "
                           "configuration)", "--runtime-cdi")
    spec_dirs: tuple[str, ...] | None = setting(None, PATHS,
                                                "the folders the runtime's CDI reads",
                                                default_text="from containerd's configuration")


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
        sections = {section: {name: getattr(getattr(self, section), name)
                              for name in keys_of(section)} for section in SECTIONS}
        return {name: _plain(value) for name, value in {**sections, "policy": self.policy}.items()}

    def with_values(self, values: Mapping[str, Any], source: str = "command line",
                    names: Mapping[str, str] | None = None) -> Settings:
        """A copy with ``{"section.key": value}`` values, each checked like file values;
        a SettingsError lists every problem, each under its key's entry in ``names`` (the
        flag that gave it) if any."""
        changed: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
        problems = []
        for dotted, value in values.items():
            section, name = dotted.split(".", 1)
            keys = keys_of(section)
            if name not in keys:
                problems.append(f"{dotted}: moved to {MOVED[dotted]}" if dotted in MOVED else
                                f"{dotted}: unknown key (known: {', '.join(keys)})")
                continue
            try:
                changed[section][name] = keys[name].check(value)
            except ValueError as exc:
                problems.append(f"{(names or {}).get(dotted, dotted)}: {exc}")
        if problems:
            raise SettingsError(source, problems)
        return replace(self, **{s: replace(getattr(self, s), **v)
                                for s, v in changed.items() if v})


# section name -> its class, in the file's order; "policy" is passed through as a mapping.
SECTIONS: dict[str, type[Any]] = {
    f.name: type(f.default) for f in fields(Settings) if f.name not in ("policy", "source")}
# Keys that moved, so that an old file gets told where (not just "unknown key").
MOVED = {"doctor.containerd_config": "runtime_cdi.containerd_config"}


def section_help(section: str) -> str:
    """The section class's docstring, as one line of plain text."""
    return " ".join((SECTIONS[section].__doc__ or "").replace("``", "").split())


def keys_of(section: str) -> dict[str, Key]:
    """A section's keys, in declaration order."""
    return declarations(SECTIONS[section])


def all_keys() -> list[tuple[str, str, Key]]:
    """(section, name, key) of every key."""
    return [(section, name, key) for section in SECTIONS for name, key in keys_of(section).items()]


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def parse_settings(document: Any, source: str = "config") -> Settings:
    """Validate a parsed YAML document (None = empty file). Collects every problem."""
    document = {} if document is None else document
    if not isinstance(document, Mapping):
        raise SettingsError(source, [f"(top level): expected a mapping, got {document!r}"])
    problems: list[str] = []
    values: dict[str, Any] = {}
    policy: Mapping[str, Any] = {}
    for section, body in document.items():
        if section not in (*SECTIONS, "policy"):
            problems.append(f"{section}: unknown section (known: "
                            f"{', '.join([*SECTIONS, 'policy'])})")
        elif body is not None and not isinstance(body, Mapping):
            problems.append(f"{section}: expected a mapping, got {body!r}")
        elif section == "policy":
            policy = body or {}
        else:
            values.update((f"{section}.{name}", value) for name, value in (body or {}).items())
    settings = Settings(policy=MappingProxyType(dict(policy)), source=source)
    try:
        settings = settings.with_values(values, source)
    except SettingsError as exc:
        problems += exc.problems
    if problems:
        raise SettingsError(source, problems)
    return settings


def load_settings(explicit: str | None = None) -> Settings:
    """The file given (by flag, else $NRI_CDI_CONFIG), which must exist, else the default
    path, which may be absent."""
    # PyYAML here, not at the top: a plugin started with no settings file, and every
    # subcommand that only builds its parser, never needs it.
    import yaml

    path = explicit or os.environ.get(CONFIG_ENV)
    required = bool(path)
    path = path or DEFAULT_CONFIG_PATH
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        if required:
            raise SettingsError(path, ["file not found"]) from None
        return Settings()
    except OSError as exc:
        raise SettingsError(path, [f"cannot read: {exc.strerror}"]) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(path, [f"not valid YAML: {exc}"]) from None
    return parse_settings(document, path)


# --- flags ---------------------------------------------------------------------------------


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help=f"configuration file (default: ${CONFIG_ENV} or "
                             f"{DEFAULT_CONFIG_PATH} if it exists)")


def add_setting_flags(parser: argparse.ArgumentParser, *dotted: str) -> None:
    """The flags of the keys named ``section.key``, help and default from their
    declaration, each parsed into the attribute of that name (no other option's has a dot).
    A flag overrides the file only when given (argparse default None)."""
    for name in dotted:
        section, key_name = name.split(".", 1)
        key = keys_of(section)[key_name]
        if not key.flags:
            raise ValueError(f"{name} has no command-line flag")
        options = key.argument("; repeat for several", f"{name}; ")
        if not key.choices:
            options |= {"type": key.type.from_text, "metavar": key.metavar or "VALUE"}
        parser.add_argument(*key.flags, dest=name, **options)


def apply_flags(settings: Settings, args: argparse.Namespace) -> Settings:
    """``settings`` with the value of each key flag given on the command line; a bad value
    is a SettingsError naming the flag and the key."""
    overrides: dict[str, Any] = {}
    names: dict[str, str] = {}
    for dotted, given in vars(args).items():
        if "." in dotted and given is not None:
            section, name = dotted.split(".", 1)
            overrides[dotted] = given
            names[dotted] = f"{keys_of(section)[name].flags[0]} ({dotted})"
    return settings.with_values(overrides, "command line", names)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """File (``args.config``) then flags: what every command calls first."""
    return apply_flags(load_settings(getattr(args, "config", None)), args)


def command_settings(args: argparse.Namespace, command: str) -> Settings | None:
    """``settings_from_args``, or None after printing each problem."""
    try:
        return settings_from_args(args)
    except SettingsError as exc:
        print("\n".join(f"nri-cdi {command}: error: {line}" for line in exc.lines()),
              file=sys.stderr)
        return None


# --- `nri-cdi config show|check|reference` -------------------------------------------------


def add_commands(subparsers: Any) -> None:
    parser = subparsers.add_parser("config", help="show, check or list the configuration keys")
    sub = parser.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="print the effective configuration (file + flags), "
                                       "each key with what it means")
    add_config_argument(show)
    show.add_argument("--format", dest="output_format", choices=("yaml", "json"),
                      default="yaml")
    add_setting_flags(show, *(f"{s}.{n}" for s, n, key in all_keys() if key.flags))
    show.set_defaults(func=cmd_show)
    check = sub.add_parser("check", help="validate the configuration file; exit 1 if invalid")
    add_config_argument(check)
    check.set_defaults(func=cmd_check)
    reference = sub.add_parser("reference", help="every key: type, default, flag, meaning "
                                                 "(Markdown)")
    reference.set_defaults(func=cmd_reference)


def cmd_show(args: argparse.Namespace) -> int:
    settings = command_settings(args, "config")
    if settings is None:
        return 1
    if args.output_format == "json":
        print(json.dumps(settings.as_dict(), indent=2))
    else:
        print(f"# effective configuration; file: {settings.source}")
        print(render_yaml(settings), end="")
    return 0


def render_yaml(settings: Settings) -> str:
    """The configuration as a file: each section and key with its meaning as a comment."""
    import yaml  # see load_settings

    def flow(value: Any) -> str:
        text = yaml.safe_dump(value, default_flow_style=True, width=1000)
        return text.removesuffix("\n...\n").strip()

    data = settings.as_dict()
    lines: list[str] = []
    for section in SECTIONS:
        lines += [f"# {section_help(section)}", f"{section}:"]
        for name, key in keys_of(section).items():
            lines += [f"  # {key.help}", f"  {name}: {flow(data[section][name])}"]
    lines.append("# the authorization policy (validated by the plugin)")
    text = yaml.safe_dump({"policy": data["policy"]}, sort_keys=False,
                          default_flow_style=False)
    lines += text.splitlines()
    return "\n".join(lines) + "\n"


def cmd_check(args: argparse.Namespace) -> int:
    settings = command_settings(args, "config")  # the file alone: check has no key flags
    if settings is None:
        return 1
    print(f"{settings.source}: valid")
    return 0


def render_reference() -> str:
    """Every key as Markdown, one table per section: the body of the documentation's
    configuration reference (scripts/docs_reference.py adds its title)."""
    lines = [f"Configuration file: `{DEFAULT_CONFIG_PATH}` (`--config`, `${CONFIG_ENV}`). "
             "Every key has a default; a flag given on the command line wins over the file. "
             "`nri-cdi config show` prints the effective configuration, `nri-cdi config "
             "check` validates a file."]
    for section in SECTIONS:
        lines += ["", f"## `{section}`", "", section_help(section), "",
                  "| key | type | default | flag | meaning |", "|---|---|---|---|---|"]
        for name, key in keys_of(section).items():
            flag = ", ".join(f"`{f}`" for f in key.flags) or "-"
            cells = [f"`{section}.{name}`", key.type.name, f"`{key.shown_default()}`", flag,
                     key.help]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## `policy`", "", "The authorization policy, as a mapping "
              "([Policy](../usage/policy.md)); the plugin validates it and reloads it when "
              "the file changes."]
    return "\n".join(lines) + "\n"


def cmd_reference(args: argparse.Namespace) -> int:
    print(render_reference(), end="")
    return 0
