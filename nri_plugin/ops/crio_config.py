"""CRI-O's configuration as CRI-O reads it, for what nri-cdi needs of it: NRI on or off, its
socket and plugin timeouts, and the folders CRI-O's own CDI reads (``cdi_spec_dirs``).

Which files (:func:`locate_crio`): those of the running ``crio`` serving the plugin's NRI
socket (its ``--config``/``-c`` and ``--config-dir``/``-d``, else ``$CONTAINER_CONFIG`` and
``$CONTAINER_CONFIG_DIR`` of its environment, else ``/etc/crio/crio.conf`` and
``/etc/crio/crio.conf.d``); else, where no CRI-O runs in view, those defaults when they
exist.

How (:func:`read_crio_config`), as CRI-O 1.35.6 does (``mergeConfigFiles``): the main file,
then every file under the drop-in folder, recursively, in lexical order of path, each
setting only the keys it names over what came before; then the flags on CRI-O's command
line (``--enable-nri``, ``--nri-listen``, ``--cdi-spec-dirs``, the timeouts) over all files.
CRI-O's own CDI cannot be turned off: it resolves every container ``cdi.k8s.io/``
annotation itself, from ``cdi_spec_dirs``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

from cdi.dirs import DEFAULT_SPEC_DIRS
from nri_plugin.nri.versions import DEFAULT_SOCKET_PATH, PLUGIN_SOCKET_ENV
from nri_plugin.ops.containerd_config import (
    MAX_FILES,
    UnreadConfig,
    load_toml,
    merge_keys,
    pids,
    proc_strings,
    program_argv,
    same_path,
)

DEFAULT_PATH = "/etc/crio/crio.conf"
DEFAULT_DROP_IN_DIR = "/etc/crio/crio.conf.d"

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A Go duration (``2s``, ``500ms``, ``1m30s``) in seconds; ValueError if it is none."""
    text = text.strip()
    if text in ("0", ""):
        return 0.0
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * _UNITS[u] for n, u in parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class CrioConfig:
    """What CRI-O's files (and flags) say, with CRI-O's defaults for what they leave out.
    ``files``: those read, in order; ``error``: why they could not be read (the values are
    then CRI-O's defaults); ``source``: how the files were chosen; ``pid``: the running
    CRI-O's whose files and flags these are (None: the default files)."""

    path: str
    drop_in_dir: str
    source: str
    pid: int | None = None
    files: tuple[str, ...] = ()
    error: str | None = None
    # NRI's defaults in CRI-O 1.35 (internal/config/nri): on, the library's socket and
    # timeouts; CDI's the library's folders.
    nri_enabled: bool = True
    nri_socket: str = DEFAULT_SOCKET_PATH
    nri_disable_connections: bool = False
    registration_timeout: float = 5.0
    request_timeout: float = 2.0
    cdi_spec_dirs: tuple[str, ...] = DEFAULT_SPEC_DIRS

    def describe_files(self) -> str:
        return ", ".join(self.files) if self.files else f"no file ({self.path} absent)"


def _drop_ins(folder: str) -> Iterator[str]:
    """Every file under ``folder``, recursively, in the order Go's filepath.Walk visits
    them (each folder's entries by name, a sub-folder's files where its name falls)."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnreadConfig(f"{folder}: {exc}") from None
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            yield from _drop_ins(path)
        else:
            yield path


def read_crio_config(path: str = DEFAULT_PATH, drop_in_dir: str = DEFAULT_DROP_IN_DIR, *,
                     source: str = "CRI-O's default paths", flags: Sequence[str] = (),
                     pid: int | None = None) -> CrioConfig:
    """CRI-O's settings from ``path``, the files under ``drop_in_dir`` and ``flags`` (its
    command line after the binary)."""
    base = CrioConfig(path=path, drop_in_dir=drop_in_dir, source=source, pid=pid)
    merged: dict[str, Any] = {}
    files: list[str] = []
    try:
        for file in chain([path] if os.path.exists(path) else [], _drop_ins(drop_in_dir)):
            if len(files) >= MAX_FILES:
                raise UnreadConfig(f"more than {MAX_FILES} files in {drop_in_dir}")
            merge_keys(merged, load_toml(file))
            files.append(file)
        values = {**_file_values(merged), **_flag_values(flags)}
    except (UnreadConfig, ValueError) as exc:
        return replace(base, files=tuple(files), error=str(exc))
    return replace(base, files=tuple(files), **values)


# What nri-cdi reads: (the table under [crio], the key (its flag: --key, with dashes),
# CrioConfig's field, the kind of value).
_SETTINGS = (("nri", "enable_nri", "nri_enabled", bool),
             ("nri", "nri_listen", "nri_socket", str),
             ("nri", "nri_disable_connections", "nri_disable_connections", bool),
             ("nri", "nri_plugin_registration_timeout", "registration_timeout", float),
             ("nri", "nri_plugin_request_timeout", "request_timeout", float),
             ("runtime", "cdi_spec_dirs", "cdi_spec_dirs", tuple))


def _table(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = doc.get(name)
    return value if isinstance(value, Mapping) else {}


def _file_values(doc: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for table, key, field, kind in _SETTINGS:
        section = _table(_table(doc, "crio"), table)
        if key not in section:
            continue
        value = section[key]
        if kind is float:
            value = parse_duration(str(value))
        elif kind is tuple:
            if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
                raise ValueError(f"[crio.{table}] {key}: not a list of paths")
            value = tuple(value)
        elif not isinstance(value, kind):
            raise ValueError(f"[crio.{table}] {key}: not a {kind.__name__}")
        out[field] = value
    return out


def _flag_values(argv: Sequence[str]) -> dict[str, Any]:
    flags = {f"--{key.replace('_', '-')}": (field, kind) for _, key, field, kind in _SETTINGS}
    out: dict[str, Any] = {}
    args = iter(argv)
    for arg in args:
        name, eq, value = arg.partition("=")
        if name not in flags:
            continue
        field, kind = flags[name]
        if kind is bool:
            out[field] = value.lower() != "false" if eq else True
            continue
        if not eq:  # (a crio whose last flag lacks its value does not run)
            value = next(args, "")
        if kind is not tuple:
            out[field] = parse_duration(value) if kind is float else value
        elif dirs := tuple(d for d in value.split(",") if d):  # each flag adds its folders
            out[field] = (*out.get(field, ()), *dirs)
    return out


# --- which files ---------------------------------------------------------------------------


def locate_crio(nri_socket: str, *, environ: Mapping[str, str] | None = None,
                proc: str = "/proc") -> CrioConfig | None:
    """The settings of the running CRI-O serving ``nri_socket`` (or that launched this
    plugin); else, when no CRI-O runs in view, of its default files if they exist; None
    when neither."""
    env = os.environ if environ is None else environ
    if PLUGIN_SOCKET_ENV in env:
        found = _crio(proc, os.getppid())
        if found is not None:
            return found
    serving = [c for c in (_crio(proc, pid) for pid in pids(proc)) if c is not None]
    mine = [c for c in serving if same_path(c.nri_socket, nri_socket)]
    if mine:
        return mine[0]
    if serving:
        return None  # CRI-O runs, serving another socket: not ours
    if os.path.exists(DEFAULT_PATH) or os.path.isdir(DEFAULT_DROP_IN_DIR):
        return read_crio_config(
            source="CRI-O's default paths (no running crio could be seen)")
    return None


def _crio(proc: str, pid: int) -> CrioConfig | None:
    argv = program_argv(proc, pid, "crio")
    if argv is None:
        return None
    env = dict(e.split("=", 1) for e in proc_strings(proc, pid, "environ") if "=" in e)
    path = env.get("CONTAINER_CONFIG", DEFAULT_PATH)
    folder = env.get("CONTAINER_CONFIG_DIR", DEFAULT_DROP_IN_DIR)
    args = iter(argv[1:])
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in ("--config", "-c"):
            path = value if eq else next(args, "")
        elif name in ("--config-dir", "-d"):
            folder = value if eq else next(args, "")
    return read_crio_config(path, folder, source=f"the running crio (pid {pid})",
                            flags=argv[1:], pid=pid)
