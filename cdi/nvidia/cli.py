"""``nri-cdi generate``: the NVIDIA CDI spec generator, flag- and env-compatible with
``nvidia-ctk cdi generate`` for everything it implements.

Every option can also come from the environment variable ``nvidia-ctk`` reads (a flag
wins; list variables are comma-separated); our additions read ``NRI_CDI_*``. A file output
is written atomically, after its sidecar (:mod:`cdi.nvidia.sidecar`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from hashlib import sha256
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple, TextIO

from cdi.errors import SpecError
from cdi.model import SpecData, to_dict
from cdi.nvidia.devnodes import char_majors, control_node_plan
from cdi.nvidia.discover import (
    DiscoveryError,
    Gpu,
    NodeInfo,
    Roots,
    discover_procfs,
    discover_with_nvml,
    driver_version_from_proc,
)
from cdi.nvidia.driver import (
    CONTROL_NODE_PATHS,
    DriverFiles,
    find_nvml_library,
    find_version_from_libraries,
    locate_driver,
)
from cdi.nvidia.generate import (
    DEFAULT_HOOKS,
    GENERATOR_VERSION,
    GenerateError,
    Inventory,
    Options,
    build_spec,
    collect,
    fingerprint,
    metadata,
    spec_annotations,
)
from cdi.nvidia.hook_programs import HOOK_PROGRAMS
from cdi.nvidia.mountspec import (
    DEFAULT_FOLDER,
    DEFAULT_NAMES,
    MountSpecError,
    default_files,
    ignored,
    read_mount_specs,
)
from cdi.nvidia.options import (
    FEATURE_FLAGS,
    OPTIONS,
    GenerateOptions,
    add_arguments,
    resolve,
)
from cdi.nvidia.sidecar import read_sidecar, sidecar_path
from cdi.nvidia.tegra import (
    ORIN_COMPAT_ROOT,
    NvmlFacts,
    integrated,
    is_tegra,
    locate_tegra,
    nvml_facts,
)
from cdi.process import finish
from cdi.runtimes import BUILDS, newest_spec_version
from cdi.spec import atomic_write, dump_spec, dump_yaml
from cdi.validate import validate_spec
from cdi.version import parse_version, version_key

# nvidia-ctk's hooks that nri-cdi does not emit, and why.
UNSUPPORTED_HOOKS = {
    "chmod": "it is a deprecated workaround for old crun versions (nvidia-ctk disables it by "
             "default too)",
    "update-application-profile": "nri-cdi has no such hook (EGL/Vulkan GPU visibility "
                                  "profiles)",
}
# Hooks that act in the container root by links and the ld cache: --link-mode mounts does
# that with bind mounts instead, and cannot run them.
_LINK_HOOKS = ("create-symlinks", "update-ldcache", "enable-cuda-compat")


class UsageError(Exception):
    """Bad options; reported without a traceback."""


def add_commands(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate", help="generate an NVIDIA CDI spec (nvidia-ctk cdi generate compatible)",
        description="Generate a CDI spec for the NVIDIA GPUs and driver of this node.")
    add_arguments(p)
    p.set_defaults(func=cmd_generate)


# --- option resolution ----------------------------------------------------------------------


def _check_choices(v: GenerateOptions) -> None:
    """Every value of an option with choices is one of them, the variables' too."""
    for name, spec in OPTIONS.items():
        value = getattr(v, name)
        for item in value if isinstance(value, tuple) else (value,):
            if spec.choices and item is not None and item not in spec.choices:
                raise UsageError(f"unknown {spec.flags[0]} {item!r} (want one of "
                                 f"{', '.join(spec.choices)})")


def _hooks(v: GenerateOptions, mode: str) -> frozenset[str]:
    """The hooks to emit.  Defaults: nvidia-ctk's (less the two we lack) in hooks mode,
    none in mounts mode; management mode leaves out disable-device-node-modification, as
    nvidia-ctk does.  An explicit --enable-hook that cannot take effect is refused."""
    if "all" in v.enabled_hooks:
        raise UsageError("--enable-hook all is not allowed; name the hooks")
    for name in v.enabled_hooks:
        if name in UNSUPPORTED_HOOKS:
            raise UsageError(f"--enable-hook {name}: not supported: {UNSUPPORTED_HOOKS[name]}")
        if v.link_mode == "mounts" and name in _LINK_HOOKS:
            raise UsageError(f"--enable-hook {name}: --link-mode mounts runs no {name} hook "
                             "(links are bind mounts and the loader path comes from the "
                             "environment); use --link-mode hooks")
    defaults = set(DEFAULT_HOOKS) if v.link_mode == "hooks" else set()
    if mode in ("management", "csv"):  # nvidia-ctk's: no driver here that makes nodes
        defaults.discard("disable-device-node-modification")
    hooks = set() if "all" in v.disabled_hooks else defaults - set(v.disabled_hooks)
    return frozenset(hooks | set(v.enabled_hooks))


def _hook_path(value: str | None) -> str:
    """The hook program named by the spec, or "" for the default entry (this interpreter,
    isolated, on the hooks' own script: one Python per hook, not two). The program's name
    decides the argument layout; one we cannot place is refused: it would get arguments it
    does not understand (NVIDIA's answers ``Unsupported CDI hook`` and exits 0)."""
    if not value:
        return ""
    if not os.path.isabs(value):
        raise UsageError(f"--hook-path must be absolute, got {value!r}")
    program = os.path.basename(value)
    if program not in HOOK_PROGRAMS:
        raise UsageError(f"--hook-path {value}: {program!r} is not a hook program nri-cdi "
                         f"knows the arguments of (want a path ending in "
                         f"{', '.join('/' + p for p in HOOK_PROGRAMS)})")
    return value


def _refuse_csv_options(v: GenerateOptions, mode: str) -> None:
    """The --csv.* options outside CSV mode would be silently ignored: refused instead."""
    for name in ("csv_files", "csv_ignore_patterns", "csv_compat_root"):
        spec = OPTIONS[name]
        if getattr(v, name) and mode != "csv":
            raise UsageError(f"{spec.flags[0]} / {spec.env}: only for --mode csv (this run is "
                             f"in {mode} mode)")


def _config_driver_root(path: str) -> str | None:
    """``nvidia-container-cli.root`` from nvidia-ctk's config.toml, the one key of that
    file ``nvidia-ctk cdi generate`` uses."""
    try:
        import tomllib  # here: only --config reads TOML
    except ImportError:  # Python 3.10
        raise UsageError(f"--config {path}: reading TOML needs Python >= 3.11") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise UsageError(f"--config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--config {path}: not TOML: {exc}") from None
    section = data.get("nvidia-container-cli")
    root = section.get("root") if isinstance(section, dict) else None
    if root is not None and (not isinstance(root, str) or not root.startswith("/")):
        raise UsageError(f"--config {path}: nvidia-container-cli.root: want an absolute path, "
                         f"got {root!r}")
    return root or None


def _vendor(v: GenerateOptions, mode: str) -> str:
    """The spec's vendor; a one-letter vendor or class is refused (valid by the spec, but
    the Go CDI library up to 1.1.0 panics on it)."""
    vendor = v.vendor or ("management.nvidia.com" if mode == "management" else "nvidia.com")
    for flag, name in (("--vendor", vendor), ("--class", v.class_)):
        if len(name) == 1:
            raise UsageError(f"{flag} {name!r}: one-letter names crash runtimes built on the "
                             "Go CDI library up to 1.1.0 (containerd 1.7, podman 4)")
    return vendor


def _max_version(value: str | None) -> str | None:
    """``--cdi-version``: a version, or a runtime build's newest (cdi.runtimes)."""
    if not value:
        return None
    if value in BUILDS:
        return ".".join(map(str, newest_spec_version(BUILDS[value])))
    if parse_version(value) is None:
        raise UsageError(f"unknown --cdi-version {value!r} (want a version such as "
                         f"0.5.0, or one of {', '.join(BUILDS)})")
    return value.lstrip("v")


def _options(v: GenerateOptions, mode: str, compat_root: str | None = None) -> Options:
    ids = v.device_ids
    if "none" in ids and len(ids) > 1:
        raise UsageError("--device-id none cannot be combined with other ids")
    for flag in v.feature_flags:
        if (reason := FEATURE_FLAGS[flag]) is not None:
            raise UsageError(f"--feature-flag {flag}: not supported: {reason}")
    return Options(
        vendor=_vendor(v, mode), class_=v.class_, strategies=tuple(dict.fromkeys(v.strategies)),
        device_ids=ids, all_device=not v.no_all_device and ids != ("none",),
        link_mode=v.link_mode, hook_path=_hook_path(v.hook_path), hooks=_hooks(v, mode),
        ldconfig_path=v.ldconfig_path, max_version=_max_version(v.cdi_version),
        feature_flags=frozenset(v.feature_flags), debug=v.debug,
        additional_gids="no-additional-gids-for-device-nodes" not in v.feature_flags,
        compat_container_root=compat_root,
    )


def _output(v: GenerateOptions, warn: Any) -> tuple[Path | None, bool]:
    """(output path or None for stdout, JSON?) with nvidia-ctk's extension rules."""
    out = v.output
    if not out:
        return None, v.format == "json"
    ext = os.path.splitext(out)[1]
    inferred = {".json": "json", ".yaml": "yaml", ".yml": "yaml"}.get(ext)
    fmt = v.format or inferred or "yaml"
    if ext in (".json", ".yaml") and inferred != fmt:
        raise UsageError(f"--format {fmt} does not match the extension of --output {out}")
    if ext not in (".json", ".yaml"):
        out = f"{out}.{fmt}"
        warn(f"CDI runtimes only read .json and .yaml files: writing {out}")
    return Path(out), fmt == "json"


# --- the command ----------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace, out: TextIO | None = None,
                 err: TextIO | None = None, environ: Any = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr
    v = resolve(args, os.environ if environ is None else environ)

    def say(message: str) -> None:
        print(f"nri-cdi generate: {message}", file=err)

    def warn(message: str) -> None:
        if not v.quiet:
            say(message)

    def debug(message: str) -> None:
        if v.debug and not v.quiet:
            say(f"debug: {message}")

    try:
        return _generate(v, out, _Report(warn, debug))
    except (UsageError, DiscoveryError, GenerateError, MountSpecError) as exc:
        say(f"error: {exc}")
    except SpecError as exc:
        say("error: the generated spec is invalid:\n  " + "\n  ".join(exc.lines()))
    except OSError as exc:  # reading the node: a folder we may not enter, a vanished file
        say(f"error: cannot read {exc.filename or 'the node'}: {exc.strerror or exc}")
    return 1


def _generate(v: GenerateOptions, out: TextIO, report: _Report) -> int:
    warn, debug = report
    _check_choices(v)
    mode = v.mode
    _vendor(v, mode)  # a bad name is said before any look at the node
    if v.config and not v.driver_root:
        v = replace(v, driver_root=_config_driver_root(v.config))
        debug(f"driver root from {v.config}: {v.driver_root or '(not set)'}")
    roots = _roots(v)
    search = v.library_search_paths or None
    nvml: NvmlFacts | None = None
    if mode == "csv" or (mode == "auto" and is_tegra(roots)):
        mode, nvml = _tegra(mode, roots, search, report)
    _refuse_csv_options(v, mode)
    opts = _options(v, mode, _compat_root(v, nvml, warn) if mode == "csv" else None)
    path, json_format = _output(v, warn)
    debug(f"driver root {roots.driver}, dev root {roots.dev}, mode {mode}")
    if mode == "csv":
        inv = _csv_inventory(v, roots, nvml, opts, report)
    else:
        inv = _inventory(v, roots, mode, opts, report)
    fp = fingerprint(inv, opts)
    if v.if_changed and path is not None and _unchanged(path, fp):
        warn(f"{path} is up to date ({fp}); not rewritten")
        return 0
    spec = build_spec(inv, opts, warn=warn, spec_annotations=spec_annotations(inv, fp))
    if opts.max_version is None:
        _warn_runtime_maxima(spec.cdi_version, warn)
    text = _render(spec, json_format, mode=inv.node.mode, fp=fp, path=path)
    if path is None:
        out.write(text)
        return 0
    data = text.encode("utf-8")
    try:
        _write(path, data, metadata(inv, opts, spec, fp=fp,
                                    written=(path.name, sha256(data).hexdigest())))
    except OSError as exc:
        other = exc.filename  # a temporary file, or the sidecar
        where = f" ({other})" if other and str(other) != str(path) else ""
        raise GenerateError(f"cannot write {path}: {exc.strerror or exc}{where}") from None
    return 0


class _Report(NamedTuple):
    """How a run reports: ``warn`` unless quiet, ``debug`` with --debug as well."""

    warn: Any
    debug: Any


def _inventory(v: GenerateOptions, roots: Roots, mode: str, opts: Options,
               report: _Report) -> Inventory:
    """The node's GPUs and driver files by NVML or procfs (all modes but csv)."""
    warn, debug = report
    search = v.library_search_paths or None
    node = _discover(mode, roots, search, warn)
    driver = locate_driver(roots, node.driver_version, library_search_paths=search,
                           config_search_paths=v.config_search_paths or None,
                           xdg_data_dirs=v.xdg_data_dirs)
    if not driver.lib_dirs:
        warn(f"no *.so.{node.driver_version} driver libraries found under {roots.driver}")
    for skipped in driver.skipped:
        warn(f"skipped {skipped}")
    if "disable-ipc-discoverer" in opts.feature_flags:
        driver = driver._replace(ipc=())
    _warn_missing_control_nodes(roots, driver, warn)
    debug(f"{node.mode} mode: driver {node.driver_version}, {len(node.gpus)} GPU(s), "
          f"library folders {', '.join(driver.lib_dirs) or 'none'}, "
          f"hooks {', '.join(sorted(opts.hooks)) or 'none'} via "
          f"{opts.hook_path or 'this Python'}")
    return collect(roots, node, driver)


def _discover(mode: str, roots: Roots, search: Sequence[str] | None, warn: Any) -> NodeInfo:
    """The node's GPUs by NVML or procfs; ``auto`` tries NVML first and says which it took."""
    if mode in ("nvml", "auto"):
        try:
            node = discover_with_nvml(find_nvml_library(roots, search))
        except DiscoveryError as exc:
            if mode == "nvml":
                raise
            warn(f"mode auto: using procfs ({exc})")
        else:
            if mode == "auto":
                warn("mode auto: using nvml")
            return node
    node = discover_procfs(roots,
                           fallback_version=lambda: find_version_from_libraries(roots, search))
    return node._replace(mode="management") if mode == "management" else node


# --- CSV mode (Jetson / Tegra) --------------------------------------------------------------


def _tegra(mode: str, roots: Roots, search: Sequence[str] | None, report: _Report
           ) -> tuple[str, NvmlFacts | None]:
    """The mode, and what the board's NVML says where it has one (JetPack 6 and later).
    ``--mode auto`` on a node with Tegra's files is csv where there is no NVML or NVML
    names an integrated GPU (nvidia-ctk's rule), else the usual NVML/procfs choice."""
    library = find_nvml_library(roots, search)
    try:
        nvml, why = (nvml_facts(library) if library else None), "no NVML"
    except DiscoveryError as exc:
        nvml, why = None, str(exc)
    if mode == "csv":
        if library is None:
            report.debug("csv mode: no libnvidia-ml.so.1, so no CUDA version for "
                         "enable-cuda-compat")
        elif nvml is None:
            report.warn(f"csv mode: {why}; the spec gets no enable-cuda-compat hook")
        return mode, nvml
    if nvml is None:
        report.warn(f"mode auto: using csv (Tegra files{', ' if library is None else '; '}{why})")
        return "csv", None
    if any(integrated(name) for name in nvml.gpus):
        report.warn("mode auto: using csv (an integrated GPU)")
        return "csv", nvml
    return mode, None


def _compat_root(v: GenerateOptions, nvml: NvmlFacts | None, warn: Any) -> str | None:
    """enable-cuda-compat's container folder: an Orin's images keep theirs elsewhere."""
    orin = nvml is not None and any("Orin (nvgpu)" in name for name in nvml.gpus)
    given = v.csv_compat_root
    if given and not orin:
        warn(f"--csv.compat-container-root {given}: ignored, "
             + ("NVML names no Orin" if nvml else "no NVML to tell the CUDA version"))
    if given and not given.startswith("/"):
        raise UsageError(f"--csv.compat-container-root must be absolute, got {given!r}")
    return (given or ORIN_COMPAT_ROOT) if orin else None


def _csv_inventory(v: GenerateOptions, roots: Roots, nvml: NvmlFacts | None, opts: Options,
                   report: _Report) -> Inventory:
    """The one GPU device of a Jetson and the driver files its CSV files list."""
    warn, debug = report
    folder = os.fspath(roots.driver / DEFAULT_FOLDER.lstrip("/"))
    files = list(v.csv_files) or default_files(folder)
    if not files:
        raise UsageError(f"csv mode: none of {', '.join(DEFAULT_NAMES)} in {folder} (is this "
                         "a Jetson? name the files with --csv.file)")
    if nvml is not None and len(nvml.gpus) > 1 \
            and "disable-multiple-csv-devices" not in opts.feature_flags:
        raise GenerateError(
            f"csv mode: NVML sees {len(nvml.gpus)} GPUs ({', '.join(nvml.gpus)}); nri-cdi "
            "writes the single-device CSV spec only: pass --feature-flag "
            "disable-multiple-csv-devices for it, or use --mode nvml for a discrete GPU")
    entries = [e for e in read_mount_specs(files) if not ignored(e, v.csv_ignore_patterns)]
    found = locate_tegra(roots, entries, v.library_search_paths)
    for line in found.missing:
        debug(f"not on this node: {line}")
    if found.missing:
        count = f"{len(found.missing)} CSV entries" if len(found.missing) > 1 else "a CSV entry"
        warn(f"{count} found nothing on this node, left out (first: {found.missing[0]}; "
             "--debug lists them)")
    if not found.nodes.nodes:
        raise GenerateError(f"csv mode: no dev line of {', '.join(files)} names a device "
                            f"node under {roots.dev}, so there is no GPU device to write")
    version = nvml.driver_version if nvml else (driver_version_from_proc(roots) or "")
    name = next((n for n in nvml.gpus if integrated(n)), nvml.gpus[0]) \
        if nvml and nvml.gpus else "Tegra integrated GPU"
    node = NodeInfo(mode="csv", driver_version=version,
                    cuda_version=nvml.cuda_version if nvml else None,
                    gpus=(Gpu(index=0, uuid="", minor=0, bus_id="", name=name),))
    debug(f"csv mode: {len(entries)} entries of {', '.join(files)}: "
          f"{len(found.nodes.nodes)} device nodes, {len(found.driver.libraries)} mounts, "
          f"{len(found.driver.links)} links, library folders "
          f"{', '.join(found.driver.lib_dirs) or 'none'}")
    return Inventory(node=node, driver=found.driver._replace(version=version),
                     gpu_nodes=MappingProxyType({0: found.nodes}))


def _warn_runtime_maxima(version: str, warn: Any) -> None:
    tops = {name: ".".join(map(str, newest_spec_version(lib))) for name, lib in BUILDS.items()}
    older = [f"{name} (up to {top})" for name, top in tops.items()
             if version_key(version) > version_key(top)]
    if older:
        warn(f"the spec needs cdiVersion {version}, which {', '.join(older)} cannot read; "
             "pass --cdi-version with your runtimes' highest to be told what to change")


def _warn_missing_control_nodes(roots: Roots, driver: DriverFiles, warn: Any) -> None:
    """nvidia-ctk warns too; a container without /dev/nvidia-uvm cannot run CUDA, and
    nothing but nvidia-smi or ``nri-cdi system create-device-nodes`` creates it."""
    found = {n.path for n in driver.control_nodes}
    missing = [p for p in CONTROL_NODE_PATHS if p not in found]
    if missing:
        warn(f"control device nodes missing under {roots.dev}: {', '.join(missing)}; the spec "
             "leaves them out (create them with `nri-cdi system create-device-nodes "
             "--control-devices`, then generate again)")
    # Nodes whose numbers differ from what the loaded modules registered (the nvidia-uvm
    # major changes when the module is reloaded): a spec would carry the stale numbers.
    try:
        text = roots.proc_path("devices").read_text(errors="replace")
    except OSError:
        return
    plan = {f"/dev/{name}": (major, minor)
            for name, major, minor in control_node_plan(char_majors(text))[0]}
    for n in driver.control_nodes:
        if n.path in plan and (n.major, n.minor) != plan[n.path]:
            warn(f"{n.host} is {n.major}:{n.minor} but the loaded module says "
                 f"{plan[n.path][0]}:{plan[n.path][1]} (stale after a module reload?); "
                 "`nri-cdi system create-device-nodes --control-devices` replaces it")


def _roots(v: GenerateOptions) -> Roots:
    driver = Path(v.driver_root or "/")
    dev = Path(v.dev_root or driver)
    for what, folder in (("driver root", driver), ("dev root", dev)):
        if not folder.is_dir():
            raise UsageError(f"{what} {folder} is not a folder")
    return Roots(driver=driver.absolute(), dev=dev.absolute())


def _render(spec: SpecData, json_format: bool, *, mode: str, fp: str, path: Path | None) -> str:
    validate_spec(spec)
    if json_format:  # JSON has no comments: the fingerprint is in the sidecar only
        return dump_spec(spec, json_format=True)
    body = dump_yaml(to_dict(spec))
    lines = [f"# Generated by nri-cdi generate {GENERATOR_VERSION} ({mode} mode); "
             "regenerate rather than edit.", f"# fingerprint: {fp}"]
    if path is not None:
        lines.append(f"# metadata: {sidecar_path(path).name}")
    return "\n".join(lines) + "\n" + body


def _write(path: Path, data: bytes, meta: dict[str, Any]) -> None:
    # The sidecar first (cdi.nvidia.sidecar says why).
    atomic_write(sidecar_path(path), (json.dumps(meta, indent=2) + "\n").encode(), mode=0o644)
    atomic_write(path, data, mode=0o644)


def _unchanged(path: Path, fp: str) -> bool:
    """True when ``path`` is the spec a previous run wrote for the same fingerprint."""
    meta = read_sidecar(path)
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return bool(meta.get("fingerprint") == fp
                and meta.get("spec", {}).get("sha256") == sha256(data).hexdigest())


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry (``python -m cdi.nvidia.cli``): only ``generate``."""
    parser = argparse.ArgumentParser(prog="nri-cdi generate")
    add_arguments(parser)
    return cmd_generate(parser.parse_args(argv))


if __name__ == "__main__":
    finish(main())
