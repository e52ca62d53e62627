"""``nri-cdi generate``'s options, each declared once: a field of :class:`GenerateOptions`
with its default, and an :class:`Option` in its metadata (flags, nvidia-ctk's environment
variable, meaning). The command's flags and help (:func:`add_arguments`), the environment
fallback (:func:`resolve`), and the configuration file's ``generate`` section
(``nri_plugin.ops.settings``, whose keys name the field they set) are derived from them.

A flag wins over its variable, a variable over the default; list variables are
comma-separated (list flags too), and an empty value counts as not given.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from cdi.declare import DECLARED, Declared, declarations
from cdi.nvidia.mountspec import DEFAULT_FOLDER, DEFAULT_NAMES
from cdi.nvidia.tegra import ORIN_COMPAT_ROOT
from cdi.runtimes import BUILDS

# nvidia-ctk's hook names; cdi.nvidia.cli refuses to enable those nri-cdi lacks.
HOOK_NAMES = ("create-symlinks", "update-ldcache", "enable-cuda-compat",
              "disable-device-node-modification", "update-application-profile", "chmod")
# Feature flags nvidia-ctk knows, and what each means here.  Accepted: those whose effect
# we have (or always have); the others are refused by name with the reason.
FEATURE_FLAGS: dict[str, str | None] = {
    "disable-nvsandboxutils": None,  # nri-cdi never loads libnvidia-sandboxutils
    "disable-ipc-discoverer": None,  # no persistenced/fabricmanager/MPS mounts
    "no-additional-gids-for-device-nodes": None,  # Options.additional_gids off
    "enable-explicit-driver-libraries": "nri-cdi mounts only the driver's versioned "
                                        "libraries; the explicit (GLVND) list is not supported",
    "enable-coherent-annotations": "coherence annotations and the gpu.coherent specs are not "
                                   "supported",
    "disable-multiple-csv-devices": None,  # CSV mode: one device even where NVML sees more
}
_TRUE = ("1", "t", "true", "yes", "y", "on")
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Option(Declared):
    """A generate option: the variable it falls back to (its ``choices`` are checked by the
    generator, the variable's too). A bool option is a flag without a value."""

    env: str


def option(default: T, help: str, env: str, *flags: str, **details: Any) -> T:
    """A field of :class:`GenerateOptions` (``details``: the Option's other fields; a wrong
    name fails at import)."""
    spec = Option(default=default, help=help, env=env, flags=flags, **details)
    return field(default=default, metadata={DECLARED: spec})


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateOptions:
    """What ``nri-cdi generate`` was asked, flags and variables resolved, unchecked."""

    output: str | None = option(
        None, "spec file to write", "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH", "--output",
        metavar="FILE", default_text="standard output")
    format: str | None = option(
        None, "output format", "NVIDIA_CTK_CDI_GENERATE_OUTPUT_FORMAT", "--format",
        choices=("yaml", "json"),
        default_text="from the --output extension, else yaml")
    cdi_version: str | None = option(
        None, "highest cdiVersion the target runtimes accept, or a runtime "
        f"({', '.join(BUILDS)}) for its highest; fail if the spec needs more (>= 0.6.0 also "
        "records metadata as annotations)", "NRI_CDI_GENERATE_CDI_VERSION", "--cdi-version",
        metavar="VERSION|RUNTIME", default_text="the lowest the spec needs")
    if_changed: bool = option(
        False, "do nothing when the existing spec has the same fingerprint",
        "NRI_CDI_GENERATE_IF_CHANGED", "--if-changed")
    # discovery
    mode: str = option(
        "auto", "how the GPUs are discovered: auto, nvml, procfs, management or csv "
        "(Jetson/Tegra)", "NVIDIA_CTK_CDI_GENERATE_MODE", "--mode", "--discovery-mode",
        choices=("auto", "nvml", "procfs", "management", "csv"), checked=False)
    driver_root: str | None = option(
        None, "the root the driver's files are under", "NVIDIA_CTK_DRIVER_ROOT",
        "--driver-root", metavar="DIR",
        default_text="/, or nvidia-container-cli.root of --config")
    dev_root: str | None = option(
        None, "the root /dev, /proc and /sys are under", "NVIDIA_CTK_DEV_ROOT", "--dev-root",
        metavar="DIR", default_text="the driver root")
    library_search_paths: tuple[str, ...] = option(
        (), "search only these folders for driver libraries",
        "NVIDIA_CTK_CDI_GENERATE_LIBRARY_SEARCH_PATHS", "--library-search-path",
        metavar="DIR", default_text="the driver's usual folders")
    config_search_paths: tuple[str, ...] = option(
        (), "search these folders for driver config files",
        "NVIDIA_CTK_CDI_GENERATE_CONFIG_SEARCH_PATHS", "--config-search-path",
        metavar="DIR", default_text="the driver's usual folders")
    xdg_data_dirs: str | None = option(  # no flag: where the config files are searched too
        None, "more folders to search for driver config files", "XDG_DATA_DIRS")
    # naming
    strategies: tuple[str, ...] = option(
        ("index", "uuid"), "how devices are named: index, uuid or type-index",
        "NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES", "--device-name-strategy",
        metavar="STRATEGY", choices=("index", "uuid", "type-index"), checked=False)
    vendor: str | None = option(
        None, "the spec's vendor", "NVIDIA_CTK_CDI_GENERATE_VENDOR", "--vendor", "--cdi-vendor",
        default_text="nvidia.com; management mode: management.nvidia.com")
    class_: str = option("gpu", "the spec's class", "NVIDIA_CTK_CDI_GENERATE_CLASS", "--class",
                         "--cdi-class", metavar="CLASS")
    no_all_device: bool = option(
        False, "do not add the 'all' device", "NVIDIA_CTK_CDI_GENERATE_NO_ALL_DEVICE",
        "--no-all-device")
    device_ids: tuple[str, ...] = option(
        ("all",), "the devices to write: all, none, an index, i:j, or a GPU-/MIG- UUID",
        "NVIDIA_CTK_CDI_GENERATE_DEVICE_IDS", "--device-id", "--device-ids", "--device",
        "--devices", metavar="ID")
    # hooks
    link_mode: str = option(
        "hooks", "hooks: createContainer hooks make the driver's symlinks and ld cache; "
        "mounts: bind mounts at the link paths, no hook runs", "NRI_CDI_GENERATE_LINK_MODE",
        "--link-mode", choices=("hooks", "mounts"))
    hook_path: str | None = option(
        None, "the hook program the spec names: an absolute path to nri-cdi, nri-cdi-hook (the "
        "static launcher), nvidia-cdi-hook or nvidia-ctk, each given arguments it "
        "understands", "NVIDIA_CTK_CDI_HOOK_PATH", "--hook-path", "--nvidia-cdi-hook-path",
        "--nvidia-ctk-path", metavar="PATH",
        default_text="this Python, isolated with -I -S, on the hooks' own script")
    ldconfig_path: str | None = option(
        None, "ldconfig for the update-ldcache hook", "NVIDIA_CTK_CDI_GENERATE_LDCONFIG_PATH",
        "--ldconfig-path", metavar="PATH", default_text="none")
    disabled_hooks: tuple[str, ...] = option(
        (), "hooks left out of the spec: a hook name, or all",
        "NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS", "--disable-hook", "--disable-hooks",
        metavar="HOOK", choices=("all", *HOOK_NAMES), checked=False, default_text="none")
    enabled_hooks: tuple[str, ...] = option(
        (), "a hook name; overrides --disable-hook", "NVIDIA_CTK_CDI_GENERATE_ENABLED_HOOKS",
        "--enable-hook", "--enable-hooks", metavar="HOOK", choices=("all", *HOOK_NAMES),
        checked=False, default_text="none; hooks mode writes nvidia-ctk's default hooks")
    # nvidia-ctk's global options and its CSV/feature-flag ones: taken where they map to
    # something nri-cdi does, refused by name otherwise (never silently ignored).
    feature_flags: tuple[str, ...] = option(
        (), f"one of {', '.join(FEATURE_FLAGS)} (the explicit driver library list and "
        "coherence annotations are not supported)", "NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS",
        "--feature-flag", "--feature-flags", metavar="FLAG",
        choices=tuple(FEATURE_FLAGS), checked=False, default_text="none")
    csv_files: tuple[str, ...] = option(
        (), "CSV mode: a CSV file listing the devices and files",
        "NVIDIA_CTK_CDI_GENERATE_CSV_FILES", "--csv.file", metavar="FILE",
        default_text=f"{', '.join(DEFAULT_NAMES)} in <driver root>{DEFAULT_FOLDER}")
    csv_ignore_patterns: tuple[str, ...] = option(
        (), "CSV mode: leave out the sym lines whose path matches (a glob; **/NAME matches "
        "the file name in any folder)", "NVIDIA_CTK_CDI_GENERATE_CSV_IGNORE_PATTERNS",
        "--csv.ignore-pattern", metavar="PATTERN", default_text="none")
    csv_compat_root: str | None = option(
        None, "CSV mode on an Orin: where images keep their CUDA forward-compatibility "
        "libraries", "NVIDIA_CTK_CDI_GENERATE_CSV_CONTAINER_COMPAT_ROOT",
        "--csv.compat-container-root", metavar="DIR", default_text=ORIN_COMPAT_ROOT)
    debug: bool = option(
        False, "say what was found and decided, on stderr (NVIDIA hook programs also get "
        "NVIDIA_CTK_DEBUG=true)", "NVIDIA_CTK_DEBUG", "--debug", "-d")
    quiet: bool = option(False, "print errors only; overrides --debug", "NVIDIA_CTK_QUIET",
                         "--quiet")
    config: str | None = option(
        None, "nvidia-ctk's config.toml: its nvidia-container-cli.root is the default driver "
        "root", "NVIDIA_CTK_CONFIG", "--config", metavar="FILE", default_text="none")


# Every option by field name, in declaration order.
OPTIONS: Mapping[str, Option] = MappingProxyType(declarations(GenerateOptions))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option's flags. Their defaults are None, so that an unset flag falls back to
    its variable (:func:`resolve`)."""
    for name, spec in OPTIONS.items():
        if isinstance(spec.default, bool):
            parser.add_argument(*spec.flags, dest=name, default=None, action="store_true",
                                help=spec.help)
        elif spec.flags:
            parser.add_argument(*spec.flags, dest=name, **spec.argument("; repeatable"))


def resolve(args: argparse.Namespace, environ: Mapping[str, str]) -> GenerateOptions:
    """The options from the parsed flags, each unset one from its variable, else its
    default."""
    values: dict[str, Any] = {}
    for name, spec in OPTIONS.items():
        given = getattr(args, name, None)
        raw = environ.get(spec.env)
        if given is None and raw:
            if isinstance(spec.default, bool):
                given = raw.strip().lower() in _TRUE
            else:
                given = [raw] if spec.repeatable else raw
        if spec.repeatable and given is not None:  # comma-separated, in flags too
            given = tuple(v.strip() for item in given for v in item.split(",") if v.strip())
        if given:
            values[name] = given
    return GenerateOptions(**values)
