"""containerd's configuration as containerd itself reads it, once: by ``nri-cdi doctor`` and
by the plugin at start-up (``runtime_cdi``), never on the request path.

Which file (:func:`locate`): the one given (``runtime_cdi.containerd_config``); else the
``--config`` of the running containerd whose NRI socket is ours (the plugin's parent when
containerd launched it; else found in /proc); else containerd's own default path.

What containerd reads (:func:`read_containerd_config`): that file, then, breadth first, the
files its ``imports`` name (a glob, or a path relative to the importing file's folder), each
once, merged in that order. containerd 2.x merges them key by key (a list is replaced);
1.x replaces a plugin's whole section with the one a later file has. A file without
``version`` is version 1, whose plugins are named by their short id (``cri``). Measured on
containerd 1.7.24 and 2.1.9 (tests/e2e/test_containerd_config_e2e.py asks the running
daemon through CRI what it made of each case).

Where the result cannot be known, ``error`` says why and ``data`` is None: a file that
cannot be read or parsed, an import that is not there, a drop-in of another config version
than the first file (containerd 2.1 then ignores some of its CRI settings), or files that
1.x and 2.x would merge differently while the version is unknown.
"""

from __future__ import annotations

import copy
import glob
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

try:
    import tomllib
except ImportError:  # Python 3.10: no TOML parser in the standard library
    tomllib = None  # type: ignore[assignment]

from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.versions import DEFAULT_SOCKET_PATH, PLUGIN_SOCKET_ENV

DEFAULT_PATH = "/etc/containerd/config.toml"  # containerd's own default
# containerd 2.2's default configuration imports these (containerd PR 12323); whether they
# are read without a config.toml is not known here (no 2.2 to ask).
DEFAULT_DROP_INS = "/etc/containerd/conf.d/*.toml"
CRI_V2_SECTION = "io.containerd.grpc.v1.cri"  # containerd 1.7 (config version 2)
CRI_V3_SECTION = "io.containerd.cri.v1.runtime"  # containerd 2.x (config version 3)
NRI_SECTION = "io.containerd.nri.v1.nri"
# Version 1 names plugins by their short id; the ones read here.
_SHORT_IDS = {"cri": CRI_V2_SECTION, "nri": NRI_SECTION}
# containerd's subcommands: a process running one is not the daemon.
_SUBCOMMANDS = frozenset({"config", "publish", "oci-hook", "help", "h"})
# More files than a configuration has: imports that never end (a glob matching itself is
# read once anyway), a drop-in folder not meant for it.
MAX_FILES = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerdConfig:
    """``data``: the merged configuration, plugins under their full ids; None when there
    is no file (``error`` None: containerd's defaults apply, a fact when ``running``) or it
    could not be read (``error`` says why). ``files``: what was read, in merge order.
    ``source``: how ``path`` was chosen, for messages."""

    path: str
    data: Mapping[str, Any] | None
    major: int | None  # containerd major version, when known
    error: str | None = None
    files: tuple[str, ...] = ()
    source: str = ""
    running: bool = False  # ``path`` is what a running containerd was started with
    located: bool = True  # False: which file containerd reads is not known, or not seen

    def plugin(self, name: str) -> Mapping[str, Any]:
        return plugin_section(self.data, name)

    @property
    def default_validator(self) -> DefaultValidator:
        section = self.plugin(NRI_SECTION).get("default_validator", {})
        if not isinstance(section, Mapping):
            return DefaultValidator()
        wanted = section.get("required_plugins", [])
        tolerate = section.get("tolerate_missing_plugins_annotation", "")
        return DefaultValidator(
            enabled=section.get("enable") is True,
            required=tuple(map(str, wanted)) if isinstance(wanted, list) else (),
            tolerate_annotation=tolerate if isinstance(tolerate, str) else "")

    @property
    def v2_defaults(self) -> bool:
        """True when defaults are containerd 2.x's (NRI on, CDI on)."""
        if self.major is not None:
            return self.major >= 2
        return bool(self.data and self.data.get("version") == 3)

    @property
    def cri_section(self) -> str:
        """The CRI plugin's section: config version 3's, or with no file, 2.x's defaults."""
        version3 = self.data.get("version") == 3 if self.data else self.v2_defaults
        return CRI_V3_SECTION if version3 else CRI_V2_SECTION

    @property
    def read(self) -> str:
        """The files read, for messages: ``a.toml (+ b.toml, c.toml)``."""
        first, *more = self.files or (self.path,)
        return first + (f" (+ {', '.join(more)})" if more else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class DefaultValidator:
    """containerd >= 2.2's ``[plugins."io.containerd.nri.v1.nri".default_validator]``, as
    NRI's default validator reads it: ``enable``; ``required_plugins``, the plugins without
    which every container is refused; ``tolerate_missing_plugins_annotation``, the key of a
    pod annotation (its value a boolean, ``"true"``) that lets a pod's containers be created
    while a required plugin is absent ("": none can be)."""

    enabled: bool = False
    required: tuple[str, ...] = ()
    tolerate_annotation: str = ""


def plugin_section(data: Mapping[str, Any] | None, name: str) -> Mapping[str, Any]:
    """The ``[plugins."<name>"]`` table of a configuration ({} when there is none)."""
    plugins = (data or {}).get("plugins", {})
    section = plugins.get(name, {}) if isinstance(plugins, Mapping) else {}
    return section if isinstance(section, Mapping) else {}


class UnreadConfig(NRIPluginError):
    """Why a runtime's settings cannot be known from its files."""


def load_toml(path: str) -> dict[str, Any]:
    if tomllib is None:
        raise UnreadConfig("no TOML parser (Python 3.11+ has tomllib)")
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UnreadConfig(f"{path}: {exc}") from None


def read_containerd_config(path: str, major: int | None, *, source: str = "",
                           running: bool = False, default_drop_ins: str = DEFAULT_DROP_INS
                           ) -> ContainerdConfig:
    base = ContainerdConfig(path=path, data=None, major=major, source=source, running=running)
    if not os.path.exists(path):
        drop_ins = sorted(glob.glob(default_drop_ins))
        if drop_ins:
            return replace(base, error=f"no {path}, but {', '.join(drop_ins)}: containerd 2.2 "
                           f"and later read {default_drop_ins} by default, which is not "
                           "modelled here")
        return base
    try:
        docs = list(_load(path))
    except UnreadConfig as exc:
        return replace(base, error=str(exc))
    files = tuple(p for p, _ in docs)
    root_version = _version(docs[0][1])
    if root_version > 2 and major is None:
        major = 2
    for file, doc in docs[1:]:
        if _version(doc) != root_version and doc.get("plugins"):
            return replace(base, major=major, files=files, error=(
                f"{file} is config version {_version(doc)} under version {root_version} in "
                f"{path}: containerd ignores some of such a file's settings; give both the "
                "same version"))
    normalised = [_normalised(doc) for _, doc in docs]
    merged = _merged(normalised, major or 2)
    if major is None and _view(merged) != _view(_merged(normalised, 1)):
        return replace(base, files=files, error=(
            f"{' and '.join(files)} set the same plugin section, which containerd 1.x "
            "replaces and 2.x merges key by key, and containerd's version is not known here"))
    merged["version"] = max(root_version, 2)
    return replace(base, data=merged, major=major, files=files)


def _load(path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(file, parsed) for ``path`` and, breadth first, the files its imports name."""
    pending, loaded = [path], set[str]()
    while pending:
        current = pending.pop(0)
        if current in loaded:
            continue
        if len(loaded) >= MAX_FILES:
            raise UnreadConfig(f"more than {MAX_FILES} files through imports from {path}")
        if not os.path.exists(current):
            raise UnreadConfig(f"{current}, which {path} imports, is not there (containerd "
                               "would not start without it: it may be out of this process's "
                               "view)")
        doc = load_toml(current)
        loaded.add(current)
        yield current, doc
        imports = doc.get("imports", [])
        if not isinstance(imports, list):
            raise UnreadConfig(f"{current}: imports is not a list")
        for name in imports:  # joined to an absolute path, the folder is dropped
            name = os.path.normpath(os.path.join(os.path.dirname(current), str(name)))
            pending += sorted(glob.glob(name)) if "*" in name else [name]


def _version(doc: Mapping[str, Any]) -> int:
    version = doc.get("version", 1)
    return version if isinstance(version, int) else 1


def _normalised(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with version 1's short plugin ids as full ids."""
    out = dict(doc)
    plugins = doc.get("plugins")
    if isinstance(plugins, Mapping) and _version(doc) == 1:
        out["plugins"] = {_SHORT_IDS.get(k, k): v for k, v in plugins.items()}
    return out


def _merged(docs: list[dict[str, Any]], major: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for doc in docs:
        if major >= 2:
            merge_keys(out, doc)
            continue
        for key, value in doc.items():  # 1.x: a later file's plugin section wins whole
            if key == "plugins" and isinstance(value, Mapping):
                out.setdefault("plugins", {}).update(value)
            elif value not in ("", 0, [], {}, None):
                out[key] = value
    return out


def merge_keys(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            merge_keys(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _view(data: Mapping[str, Any]) -> tuple[Any, ...]:
    """What nri-cdi reads of a merged configuration."""
    return tuple(repr(plugin_section(data, name))
                 for name in (CRI_V2_SECTION, CRI_V3_SECTION, NRI_SECTION))


# --- which file ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Located:
    """The configuration file to read and how it was chosen; ``exe``: the running
    containerd's binary when one was found (its version tells the merge rules); ``error``:
    why the file that containerd reads cannot be read from here."""

    path: str
    source: str
    exe: str | None = None
    error: str | None = None

    def read(self, major: int | None) -> ContainerdConfig:
        if self.error:
            return ContainerdConfig(path=self.path, data=None, major=major, error=self.error,
                                    source=self.source, located=False)
        return read_containerd_config(self.path, major, source=self.source,
                                      running=self.exe is not None)


def locate(given: str | None, nri_socket: str, *, environ: Mapping[str, str] | None = None,
           proc: str = "/proc") -> Located:
    env = os.environ if environ is None else environ
    if given:
        return Located(path=given, source="runtime_cdi.containerd_config")
    if PLUGIN_SOCKET_ENV in env:  # launched by the runtime: our parent is containerd
        found = _containerd(proc, os.getppid())
        if found is not None:
            return _seen(proc, os.getppid(), *found,
                         f"the containerd that launched the plugin (pid {os.getppid()})")
    # Those whose file we see and whose NRI socket is ours; else those whose file we cannot
    # see (their socket unknown), such as a node's containerd seen from a pod.
    serving: dict[str, tuple[int, str]] = {}
    hidden: dict[str, tuple[int, str]] = {}
    for pid in pids(proc):
        found = _containerd(proc, pid)
        if found is None:
            continue
        path, exe = found
        if not _visible(proc, pid, path):
            hidden.setdefault(path, (pid, exe))
        elif same_path(_nri_socket(path), nri_socket):
            serving.setdefault(path, (pid, exe))
    candidates = serving or hidden
    if len(candidates) == 1:
        (path, (pid, exe)), = candidates.items()
        what = "serving" if serving else "that may serve"
        return _seen(proc, pid, path, exe, f"the running containerd {what} {nri_socket} "
                     f"(pid {pid})")
    if candidates:
        return Located(path=DEFAULT_PATH, source="containerd's default path", error=(
            f"{len(candidates)} running containerds may serve {nri_socket} (pids "
            f"{', '.join(str(p) for p, _ in candidates.values())}): which one is not known"))
    return Located(path=DEFAULT_PATH, source=f"containerd's default path (no running "
                   f"containerd serving {nri_socket} could be seen)")


def _seen(proc: str, pid: int, path: str, exe: str, source: str) -> Located:
    if not _visible(proc, pid, path):
        return Located(path=path, source=source, error=(
            f"{source} reads {path}, which cannot be seen from here (another mount "
            "namespace: a pod needs that folder mounted at the same path)"))
    return Located(path=path, source=source, exe=exe)


def _visible(proc: str, pid: int, path: str) -> bool:
    """Whether ``path`` as process ``pid`` sees it is ``path`` here: it exists here, or
    both run in the same mount namespace (then containerd too finds no file there)."""
    if os.path.exists(path):
        return True
    try:
        return os.readlink(f"{proc}/{pid}/ns/mnt") == os.readlink(f"{proc}/self/ns/mnt")
    except OSError:
        return False  # not ours to look at: cannot tell


def pids(proc: str) -> list[int]:
    try:
        return [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []


def proc_strings(proc: str, pid: int, name: str) -> list[str]:
    """``/proc/<pid>/<name>``'s NUL-separated strings (cmdline, environ); [] when gone."""
    try:
        with open(f"{proc}/{pid}/{name}", "rb") as handle:
            return [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def program_argv(proc: str, pid: int, program: str) -> list[str] | None:
    """The command line of process ``pid`` when it runs ``program`` (by base name); None
    when it does not, or is gone."""
    argv = proc_strings(proc, pid, "cmdline")
    return argv if argv and os.path.basename(argv[0]) == program else None


def _containerd(proc: str, pid: int) -> tuple[str, str] | None:
    """(config path, binary) of process ``pid`` when it is a containerd daemon."""
    argv = program_argv(proc, pid, "containerd")
    if argv is None:
        return None
    config = DEFAULT_PATH
    args = iter(argv[1:])
    for arg in args:
        name, eq, value = arg.partition("=")
        if name in ("--config", "-c"):
            config = value if eq else next(args, config)
        elif arg in _SUBCOMMANDS:
            return None  # containerd config dump, ...: not the daemon
    if not os.path.isabs(config):
        try:
            config = os.path.join(os.readlink(f"{proc}/{pid}/cwd"), config)
        except OSError:
            return None
    try:
        exe = os.readlink(f"{proc}/{pid}/exe")
    except OSError:
        exe = argv[0]
    return config, exe


def _nri_socket(path: str) -> str:
    """The NRI socket the configuration at ``path`` sets (containerd's default if none)."""
    socket_path = read_containerd_config(path, None).plugin(NRI_SECTION).get("socket_path")
    return str(socket_path) if socket_path else DEFAULT_SOCKET_PATH


def same_path(a: str, b: str) -> bool:
    # /var/run is a symlink to /run on current distributions
    return os.path.normpath(a.replace("/var/run/", "/run/")) == os.path.normpath(
        b.replace("/var/run/", "/run/"))
