"""``nri-cdi generate``: the NVIDIA CDI spec generator, flag- and env-compatible with
``nvidia-ctk cdi generate`` for everything it implements.

Every option can also come from the environment variable ``nvidia-ctk`` reads (a flag
wins over its variable; list variables are comma-separated).  Our additions
(``--link-mode``, ``--cdi-version``, ``--if-changed``, ``--hook-path``) read ``NRI_CDI_*``.

The output is written atomically (temporary file in the same folder, fsync, rename, mode
0644): a failure at any step leaves the previous spec as it was.  Next to a file output
goes ``<output>.meta``, the requirement metadata described in ``generate.py``.  It does
not end in ``.json`` on purpose: CDI runtimes read every ``*.json``/``*.yaml`` in a spec
folder as a spec, and would report a ``.meta.json`` sidecar there as a broken one.
"""

from __future__ import annotations

import argparse
import functools
import gc
import hashlib
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from cdi.yaml11 import STR, implicit_tag

__all__ = ["add_commands", "cmd_generate", "main"]

METADATA_SUFFIX = ".meta"

# flag destination -> (environment variable, kind); kind: str, list, bool
ENV: dict[str, tuple[str, str]] = {
    "output": ("NVIDIA_CTK_CDI_OUTPUT_FILE_PATH", "str"),
    "format": ("NVIDIA_CTK_CDI_GENERATE_OUTPUT_FORMAT", "str"),
    "mode": ("NVIDIA_CTK_CDI_GENERATE_MODE", "str"),
    "strategies": ("NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES", "list"),
    "driver_root": ("NVIDIA_CTK_DRIVER_ROOT", "str"),
    "dev_root": ("NVIDIA_CTK_DEV_ROOT", "str"),
    "library_search_paths": ("NVIDIA_CTK_CDI_GENERATE_LIBRARY_SEARCH_PATHS", "list"),
    "config_search_paths": ("NVIDIA_CTK_CDI_GENERATE_CONFIG_SEARCH_PATHS", "list"),
    "hook_path": ("NVIDIA_CTK_CDI_HOOK_PATH", "str"),
    "ldconfig_path": ("NVIDIA_CTK_CDI_GENERATE_LDCONFIG_PATH", "str"),
    "vendor": ("NVIDIA_CTK_CDI_GENERATE_VENDOR", "str"),
    "class_": ("NVIDIA_CTK_CDI_GENERATE_CLASS", "str"),
    "no_all_device": ("NVIDIA_CTK_CDI_GENERATE_NO_ALL_DEVICE", "bool"),
    "device_ids": ("NVIDIA_CTK_CDI_GENERATE_DEVICE_IDS", "list"),
    "disabled_hooks": ("NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS", "list"),
    "enabled_hooks": ("NVIDIA_CTK_CDI_GENERATE_ENABLED_HOOKS", "list"),
    "link_mode": ("NRI_CDI_GENERATE_LINK_MODE", "str"),
    "cdi_version": ("NRI_CDI_GENERATE_CDI_VERSION", "str"),
    "if_changed": ("NRI_CDI_GENERATE_IF_CHANGED", "bool"),
}
_TRUE = ("1", "t", "true", "yes", "y", "on")


class UsageError(Exception):
    """Bad options; reported without a traceback."""


class OutputError(Exception):
    """The spec or its sidecar could not be written (the cause is chained)."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.path = path


def add_commands(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "generate", help="generate an NVIDIA CDI spec (nvidia-ctk cdi generate compatible)",
        description="Generate a CDI spec for the NVIDIA GPUs and driver of this node.")
    _add_output_options(parser)
    _add_discovery_options(parser)
    _add_naming_options(parser)
    _add_hook_options(parser)
    parser.set_defaults(func=cmd_generate)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    # Defaults are None so that an unset flag falls back to its environment variable.
    p.add_argument("--output", help="spec file to write (default: standard output)")
    p.add_argument("--format", choices=("yaml", "json"),
                   help="output format (default: from the --output extension, else yaml)")
    p.add_argument("--cdi-version", dest="cdi_version", metavar="VERSION",
                   help="highest cdiVersion the target runtimes accept; fail if the spec "
                        "needs more (>= 0.6.0 also records metadata as annotations)")
    p.add_argument("--if-changed", dest="if_changed", action="store_true", default=None,
                   help="do nothing when the existing spec has the same fingerprint")


def _add_discovery_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", "--discovery-mode", dest="mode",
                   help="auto (default), nvml, procfs or management")
    p.add_argument("--driver-root", dest="driver_root", help="where the driver files are "
                   "(default /)")
    p.add_argument("--dev-root", dest="dev_root",
                   help="where /dev, /proc and /sys are (default: the driver root)")
    p.add_argument("--library-search-path", dest="library_search_paths", action="append",
                   metavar="DIR", help="search only these folders for driver libraries")
    p.add_argument("--config-search-path", dest="config_search_paths", action="append",
                   metavar="DIR", help="search these folders for driver config files")


def _add_naming_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device-name-strategy", dest="strategies", action="append",
                   metavar="STRATEGY", help="index, uuid or type-index; repeatable "
                   "(default: index and uuid)")
    p.add_argument("--vendor", "--cdi-vendor", dest="vendor", help="default nvidia.com "
                   "(management mode: management.nvidia.com)")
    p.add_argument("--class", "--cdi-class", dest="class_", help="default gpu")
    p.add_argument("--no-all-device", dest="no_all_device", action="store_true", default=None,
                   help="do not add the 'all' device")
    p.add_argument("--device-id", "--device-ids", "--device", "--devices", dest="device_ids",
                   action="append", metavar="ID",
                   help="all (default), none, an index, i:j, or a GPU-/MIG- UUID; repeatable")


def _add_hook_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--link-mode", dest="link_mode", choices=("hooks", "mounts"),
                   help="hooks (default): createContainer hooks make the driver's symlinks and "
                        "ld cache; mounts: bind mounts at the link paths, no hook runs")
    p.add_argument("--hook-path", "--nvidia-cdi-hook-path", "--nvidia-ctk-path",
                   dest="hook_path", help="an nri-cdi executable for the hooks to run "
                   "(default: this Python, isolated with -I -S, on the hooks' own script)")
    p.add_argument("--ldconfig-path", dest="ldconfig_path",
                   help="ldconfig for the update-ldcache hook")
    p.add_argument("--disable-hook", "--disable-hooks", dest="disabled_hooks", action="append",
                   metavar="HOOK", help="a hook name, or all; repeatable")
    p.add_argument("--enable-hook", "--enable-hooks", dest="enabled_hooks", action="append",
                   metavar="HOOK", help="a hook name; overrides --disable-hook")


# --- option resolution ----------------------------------------------------------------------


def _from_env(args: argparse.Namespace, environ: Any) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for dest, (var, kind) in ENV.items():
        value = getattr(args, dest, None)
        raw = environ.get(var)
        if value is None and raw not in (None, ""):
            if kind == "list":
                value = [v.strip() for v in raw.split(",") if v.strip()]
            elif kind == "bool":
                value = raw.strip().lower() in _TRUE
            else:
                value = raw
        if kind == "list" and value is not None:
            value = [v.strip() for item in value for v in item.split(",") if v.strip()]
        values[dest] = value
    values["format_explicit"] = values["format"] is not None
    return values


def _hooks(enabled: Sequence[str] | None, disabled: Sequence[str] | None) -> frozenset[str]:
    from cdi.nvidia.generate import DEFAULT_HOOKS, HOOK_NAMES

    for name in (*(enabled or ()), *(disabled or ())):
        if name != "all" and name not in HOOK_NAMES:
            raise UsageError(f"unknown hook {name!r} (want one of {', '.join(HOOK_NAMES)})")
    if "all" in (enabled or ()):
        raise UsageError("--enable-hook all is not allowed; name the hooks")
    hooks = set() if "all" in (disabled or ()) else set(DEFAULT_HOOKS) - set(disabled or ())
    return frozenset(hooks | (set(enabled or ()) & DEFAULT_HOOKS))


def _hook_path(value: str | None) -> str:
    """An explicit ``nri-cdi`` executable for the hooks, or "" for the default entry: this
    interpreter started isolated (``-I -S``) on the hooks' own script, which starts one
    Python per hook instead of two (the console script re-executes itself isolated)."""
    if value:
        if not os.path.isabs(value):
            raise UsageError(f"--hook-path must be absolute, got {value!r}")
        return value
    return ""


def _options(v: dict[str, Any], mode: str) -> Any:
    from cdi.nvidia.generate import STRATEGIES, Options
    from cdi.version import parse_version

    strategies = tuple(dict.fromkeys(v["strategies"] or ("index", "uuid")))
    for s in strategies:
        if s not in STRATEGIES:
            raise UsageError(f"unknown --device-name-strategy {s!r} "
                             f"(want one of {', '.join(STRATEGIES)})")
    if v["cdi_version"] and parse_version(v["cdi_version"]) is None:
        raise UsageError(f"unknown --cdi-version {v['cdi_version']!r}")
    ids = tuple(v["device_ids"] or ("all",))
    if "none" in ids and len(ids) > 1:
        raise UsageError("--device-id none cannot be combined with other ids")
    vendor = v["vendor"] or ("management.nvidia.com" if mode == "management" else "nvidia.com")
    for flag, name in (("--vendor", vendor), ("--class", v["class_"] or "gpu")):
        if len(name) == 1:  # valid by the spec, but the Go CDI library <= 1.1.0 panics on it
            raise UsageError(f"{flag} {name!r}: one-letter names crash runtimes built on the "
                             "Go CDI library up to 1.1.0 (containerd 1.7, podman 4)")
    return Options(
        vendor=vendor, class_=v["class_"] or "gpu", strategies=strategies, device_ids=ids,
        all_device=not v["no_all_device"] and ids != ("none",),
        link_mode=v["link_mode"] or "hooks", hook_path=_hook_path(v["hook_path"]),
        hooks=_hooks(v["enabled_hooks"], v["disabled_hooks"]),
        ldconfig_path=v["ldconfig_path"],
        max_version=v["cdi_version"].lstrip("v") if v["cdi_version"] else None,
    )


def _output(v: dict[str, Any], warn: Any) -> tuple[Path | None, bool]:
    """(output path or None for stdout, JSON?) with nvidia-ctk's extension rules."""
    out = v["output"]
    fmt = v["format"]
    if fmt not in (None, "yaml", "json"):
        raise UsageError(f"unknown --format {fmt!r} (want yaml or json)")
    if not out:
        return None, fmt == "json"
    ext = os.path.splitext(out)[1]
    inferred = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(ext)
    fmt = fmt or inferred or "yaml"
    if ext in (".json", ".yaml") and inferred != fmt:
        raise UsageError(f"--format {fmt} does not match the extension of --output {out}")
    if ext not in (".json", ".yaml"):
        out = f"{out}.{fmt}"
        warn(f"CDI runtimes only read .json and .yaml files: writing {out}")
    return Path(out), fmt == "json"


# --- the command ----------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace, out: TextIO | None = None,
                 err: TextIO | None = None, environ: Any = None) -> int:
    # A run allocates thousands of objects that all live until it ends: the cyclic
    # collector would walk them a dozen times for nothing (~2 ms of a ~50 ms run).  Paused,
    # not disabled, so that a long-lived caller (the refresh daemon) gets it back.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _cmd_generate(args, out, err, environ)
    finally:
        if collecting:
            gc.enable()


def _cmd_generate(args: argparse.Namespace, out: TextIO | None, err: TextIO | None,
                  environ: Any) -> int:
    out, err = out or sys.stdout, err or sys.stderr

    def warn(message: str) -> None:
        print(f"nri-cdi generate: {message}", file=err)

    from cdi.errors import SpecError
    from cdi.nvidia.discover import DiscoveryError
    from cdi.nvidia.generate import GenerateError

    try:
        return _generate(_from_env(args, os.environ if environ is None else environ), out, warn)
    except (UsageError, DiscoveryError, GenerateError) as exc:
        warn(f"error: {exc}")
    except SpecError as exc:
        warn("error: the generated spec is invalid:\n  " + "\n  ".join(exc.lines()))
    except OutputError as exc:
        cause = exc.__cause__
        detail = getattr(cause, "strerror", None) or str(cause)
        other = getattr(cause, "filename", None)  # a temporary file, or the sidecar
        where = f" ({other})" if other and str(other) != str(exc.path) else ""
        warn(f"error: cannot write {exc.path}: {detail}{where}")
    except OSError as exc:  # reading the node: a folder we may not enter, a vanished file
        warn(f"error: cannot read {exc.filename or 'the node'}: {exc.strerror or exc}")
    return 1


def _generate(v: dict[str, Any], out: TextIO, warn: Any) -> int:
    from cdi.nvidia.discover import MODES, discover
    from cdi.nvidia.driver import find_nvml_library, find_version_from_libraries, locate_driver
    from cdi.nvidia.generate import build_spec, collect, fingerprint, spec_annotations

    mode = v["mode"] or "auto"
    if mode not in MODES:
        raise UsageError(f"mode {mode!r} is not supported (want one of {', '.join(MODES)})")
    opts = _options(v, mode)
    path, json_format = _output(v, warn)
    roots = _roots(v)
    search = v["library_search_paths"]
    node = discover(mode, roots, warn=warn,
                    nvml_library=lambda: find_nvml_library(roots, search),
                    fallback_version=lambda: find_version_from_libraries(roots, search))
    driver = locate_driver(roots, node.driver_version, library_search_paths=search,
                           config_search_paths=v["config_search_paths"])
    if not driver.lib_dirs:
        warn(f"no *.so.{node.driver_version} driver libraries found under {roots.driver}")
    for skipped in driver.skipped:
        warn(f"skipped {skipped}")
    inv = collect(roots, node, driver)
    fp = fingerprint(inv, opts)
    if v["if_changed"] and path is not None and _unchanged(path, fp):
        warn(f"{path} is up to date ({fp}); not rewritten")
        return 0
    spec = build_spec(inv, opts, warn=warn, spec_annotations=spec_annotations(inv, fp))
    text = _render(spec, json_format, mode=node.mode, fp=fp, sidecar=path)
    if path is None:
        out.write(text)
        return 0
    try:
        _write(path, text, inv, opts, spec, fp)
    except OSError as exc:
        raise OutputError(path) from exc
    return 0


def _roots(v: dict[str, Any]) -> Any:
    from cdi.nvidia.discover import Roots

    driver = Path(v["driver_root"] or "/")
    dev = Path(v["dev_root"] or driver)
    for what, folder in (("driver root", driver), ("dev root", dev)):
        if not folder.is_dir():
            raise UsageError(f"{what} {folder} is not a folder")
    return Roots(driver=driver.absolute(), dev=dev.absolute())


def _render(spec: Any, json_format: bool, *, mode: str, fp: str, sidecar: Path | None) -> str:
    from cdi.model import to_dict
    from cdi.nvidia.generate import GENERATOR_VERSION
    from cdi.spec import dump_spec
    from cdi.validate import validate_spec

    validate_spec(spec)
    if json_format:  # JSON has no comments: the fingerprint is in the sidecar only
        return dump_spec(spec, json_format=True)
    body = render_yaml(to_dict(spec))
    lines = [f"# Generated by nri-cdi generate {GENERATOR_VERSION} ({mode} mode); "
             "regenerate rather than edit.", f"# fingerprint: {fp}"]
    if sidecar is not None:
        lines.append(f"# metadata: {sidecar.name}{METADATA_SUFFIX}")
    return "\n".join(lines) + "\n" + body


# --- YAML ---------------------------------------------------------------------------------
# PyYAML's representer spends about 100 ms on the ~5,000 nodes of an 8 x 7-MIG spec, two
# thirds of the start-up budget.  A spec is only mappings, lists, strings and integers, so
# this emitter writes the same block style as ``cdi.spec.dump_spec`` directly; strings are
# left plain exactly when PyYAML's resolver would read them back as strings, single-quoted
# when they would read as another type (like PyYAML), and double-quoted (JSON escapes are
# valid YAML) when they hold characters that plain scalars cannot.  That resolver's answer
# comes from ``cdi.yaml11.implicit_tag``, a stdlib re-implementation checked against
# PyYAML in tests/cdi/test_yaml11.py: importing PyYAML alone would cost about 26 ms.

_PLAIN = re.compile(r"[A-Za-z0-9_./+-][A-Za-z0-9_./:+=,@~-]*")
# Left raw by json.dumps(ensure_ascii=False) but not printable in YAML, or read as a line
# break inside a quoted scalar (NEL, LS, PS).  ensure_ascii=True is no answer: it writes
# astral characters as surrogate pairs, which YAML readers take as two lone surrogates.
# Compiled on first use (about 1 ms: its ranges span the astral planes); a generated spec
# rarely has a string to double-quote.
_YAML_UNPRINTABLE = "[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]"


def render_yaml(document: Any) -> str:
    lines = ["---"]
    _emit_mapping(document, "", "", lines)
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    if value is True or value is False:
        return "true" if value else "false"
    if type(value) is int:
        return str(value)
    return _string(str(value))


@functools.lru_cache(maxsize=4096)  # a spec repeats the same paths and names many times
def _string(text: str) -> str:
    if not _PLAIN.fullmatch(text) or text.endswith(":") or text == "-":
        return _double_quoted(text)
    if implicit_tag(text) != STR:
        return f"'{text}'"
    return text


def _double_quoted(text: str) -> str:
    # JSON's escapes (\" \\ \n \t \uXXXX for controls) are all valid YAML escapes.
    quoted = json.dumps(text, ensure_ascii=False)
    return re.sub(_YAML_UNPRINTABLE, _escape, quoted)  # re caches the compiled pattern


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# Two mutually recursive walkers rather than one generic one: a spec renders ~3,000 lines
# and this runs on every generate, so each line costs one type() test, not several.


def _emit_mapping(mapping: dict[str, Any], pad: str, lead: str, lines: list[str]) -> None:
    """Append ``mapping``'s entries indented by ``pad``; the first line starts with
    ``lead`` instead (``pad`` with ``- `` in it when the mapping is a list item)."""
    for key, item in mapping.items():
        prefix = f"{lead}{_string(key)}:"  # annotation keys are free text too
        lead = pad
        kind = type(item)
        if kind is dict and item:
            lines.append(prefix)
            _emit_mapping(item, pad + "  ", pad + "  ", lines)
        elif kind is list and item:
            lines.append(prefix)  # block lists sit at their key's indent, as PyYAML's do
            _emit_list(item, pad, lines)
        else:
            lines.append(f"{prefix} {_leaf(item)}")


def _emit_list(items: list[Any], pad: str, lines: list[str]) -> None:
    for item in items:
        kind = type(item)
        if kind is dict and item:
            _emit_mapping(item, pad + "  ", pad + "- ", lines)
        elif kind is list and item:
            lines.append(f"{pad}-")
            _emit_list(item, pad + "  ", lines)
        else:
            lines.append(f"{pad}- {_leaf(item)}")


def _leaf(item: Any) -> str:
    if type(item) is str:
        return _string(item)
    if type(item) is dict:
        return "{}"
    if type(item) is list:
        return "[]"
    return _scalar(item)


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + METADATA_SUFFIX)


def _write(path: Path, text: str, inv: Any, opts: Any, spec: Any, fp: str) -> None:
    from cdi.nvidia.generate import metadata
    from cdi.spec import atomic_write

    data = text.encode("utf-8")
    atomic_write(path, data, mode=0o644)
    # After the spec: a sidecar from a previous run then still names the old spec's hash,
    # so --if-changed regenerates instead of trusting it.
    meta = metadata(inv, opts, spec, fp=fp, spec_file=path.name,
                    spec_sha256=hashlib.sha256(data).hexdigest())
    atomic_write(_sidecar(path), _json_lines(meta).encode(), mode=0o644)


def _json_lines(document: dict[str, Any]) -> str:
    """``document`` as JSON with an entry per line two levels deep (a device per line):
    as readable as ``indent=2`` for a sidecar, and made by json's C encoder, where
    ``indent=`` runs the pure-Python one (~2 ms for 100 devices)."""
    entries = []
    for key, value in document.items():
        if isinstance(value, dict) and value:
            inner = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in value.items())
            entries.append(f"  {json.dumps(key)}: {{\n{inner}\n  }}")
        else:
            entries.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(entries) + "\n}\n"


def _unchanged(path: Path, fp: str) -> bool:
    """True when ``path`` is the spec a previous run wrote for the same fingerprint."""
    try:
        meta = json.loads(_sidecar(path).read_text())
        data = path.read_bytes()
    except (OSError, ValueError):
        return False
    return bool(isinstance(meta, dict) and meta.get("fingerprint") == fp
                and meta.get("spec", {}).get("sha256") == hashlib.sha256(data).hexdigest())


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m cdi.nvidia.cli``): only ``generate``, lean start-up."""
    parser = argparse.ArgumentParser(prog="nri-cdi")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["generate", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    from cdi.process import finish

    finish(main())
