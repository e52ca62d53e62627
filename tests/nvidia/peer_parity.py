"""Side-by-side runs of ``nri-cdi generate`` and NVIDIA's ``nvidia-ctk cdi generate`` on one
simulated node, compared field by field (shared by the parity tests; csv_parity borrows the
hook-argument helpers).

Everything a spec carries is compared: ``cdiVersion``, ``kind``, the device names in order,
and for the spec-wide edits and each device's: every env entry, every device node with every
field (path, hostPath, type, major, minor, fileMode, permissions, uid, gid), every mount with
its options, every hook operation with its name and arguments, every ``additionalGids``
entry; and the relative order of what both emit (env, nodes, mounts, hooks).

Before comparing, only what must differ between two programs is normalised; each such step
is in ``NORMALISED`` with its reason. A difference that remains is either a defect or one of
``INTENDED``: the one list of intended differences, each matched by the whole entry, each
required to still occur in some case (a waiver nothing needs fails the suite).

nvidia-ctk's whole output per case is recorded in tests/data/nvidia-ctk-<version>/ (the
node's folder written ``NODE``); a run without the program compares with those
(docs/developer/nvidia-ctk-parity.md).
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from cdi.hooks.entry import HOOK_ENV
from nri_cdi_testbed.simnode import BuiltNode, in_node_namespace
from tests.peers import absent, peer

REPO = Path(__file__).resolve().parents[2]
NVIDIA_CTK = peer("nvidia-ctk")
VERSION = "1.20.0"  # the nvidia-ctk the recordings come from (CASES_FILE says its commit)
RECORDINGS = REPO / "tests" / "data" / f"nvidia-ctk-{VERSION}"
CASES_FILE = RECORDINGS / "cases.yaml"
HOOKS_FILE = RECORDINGS / "hooks.yaml"  # NVIDIA's hook programs (hook_recording)
# The simulated node's folder in recordings and in compared entries: a path (so the YAML
# stays plain) that no real node folder is.
NODE = "/@NODE@"
NVIDIA_HOOK = "/usr/bin/nvidia-cdi-hook"  # the program path nvidia-ctk is told to write
NVIDIA_HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
HOOK_SUBCOMMANDS = ("create-symlinks", "update-ldcache", "enable-cuda-compat",
                    "disable-device-node-modification", "update-application-profile", "chmod")
LIBRARY_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")  # a driver file's mount

# What is rewritten before comparing, and why it must be (each step is in ``_entries``).
NORMALISED = {
    "node-folder": "both run on a node built in a temporary folder; its path is written NODE",
    "hook-program": "the hook program is ours in our spec and nvidia-cdi-hook in nvidia-ctk's: "
                    "each entry's path, the arguments before the first operation and its env "
                    "are checked to be that program's own (ours: HOOK_ENV; nvidia-cdi-hook: "
                    "NVIDIA_CTK_DEBUG=false), then left out",
    "one-entry": "our hook program runs every operation of an entry in one process, "
                 "nvidia-cdi-hook one per entry: each operation is compared with its hook "
                 "name and arguments, as if it were an entry of its own",
    "links": "create-symlinks operations are compared link by link, each operation once "
             "per place: nvidia-ctk spreads a place's links over several entries (the "
             "driver's library links, the others), ours makes them in one; each link is "
             "made on its own, so how they are grouped carries nothing",
    "device-links": "our spec-wide entry carries a device's links as create-symlinks "
                    "--device-link NODE::LINK (made only where that node is in the "
                    "container); they are compared as links of every device that has that "
                    "node, as nvidia-ctk writes them",
    "node-type": "nvidia-ctk leaves a device node's type to the runtime (which reads it from "
                 "the host's node); ours is checked to be the host node's type, then left out",
    "omitted-zero": "nvidia-ctk's encoder leaves out a minor number of 0 (Go's omitempty); "
                    "a node without one is read as minor 0",
}


@dataclass(frozen=True)
class Intended:
    """One intended difference: which entries only we emit (``ours``), which only nvidia-ctk
    emits (``theirs``), or, for an entry of nvidia-ctk's that we emit changed, the entry
    we emit instead (``instead``). Each is matched against the whole entry."""

    reason: str
    ours: Callable[[Entry], bool] | None = None
    theirs: Callable[[Entry], bool] | None = None
    instead: Callable[[Entry], Entry | None] | None = None


# An entry: (where, what, value), hashable; where is "spec", "common" or "device NAME".
Entry = tuple[str, str, Any]


# Where a layout's driver files are, under the node's folder: the root, a driver
# container's root, and (for configs, "share-configs") the /usr/local/share folder.
DRIVER_ROOTS = ("", "/run/nvidia/driver")


def _mount(entry: Entry, path: Callable[[str], bool]) -> bool:
    """``entry`` is a read-only bind mount of a driver file at a container path ``path``
    accepts, from the driver root's file of that path (nothing else: the whole entry)."""
    if entry[1] != "mount":
        return False
    m = dict(entry[2])
    target = m["containerPath"]
    hosts = {NODE + root + p for root in DRIVER_ROOTS
             for p in (target, target.replace("/usr/share/", "/usr/local/share/", 1))}
    return (set(m) == {"containerPath", "hostPath", "options"} and path(target)
            and m["options"] == LIBRARY_OPTIONS and m["hostPath"] in hosts)


def _link_path(entry: Entry) -> str | None:
    """The path a link entry makes (None: the entry is no link)."""
    return str(entry[2]).partition("::")[2] if entry[1] == "link" else None


I386 = "/usr/lib/i386-linux-gnu"
EGL_X11 = ("libnvidia-egl-xcb.so.", "libnvidia-egl-xlib.so.")
EGL_X11_CONFIGS = ("/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json",
                   "/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json")


def _name(path: str) -> str:
    return path.rpartition("/")[2]


def _dri_link_instead(entry: Entry) -> Entry | None:
    """nvidia-ctk's by-path link of a device, at the container path ours writes."""
    path = _link_path(entry)
    if path is None or not path.startswith(NODE + "/dev/dri/by-path/"):
        return None
    return (entry[0], "link", str(entry[2]).replace("::" + NODE + "/dev/", "::/dev/"))


def _i386_ldcache_instead(entry: Entry) -> Entry | None:
    """nvidia-ctk's update-ldcache, with the i386 folder ours adds."""
    if entry[1] != "hook" or entry[2][1] != "update-ldcache":
        return None
    hook_name, op, args = entry[2]
    return (entry[0], "hook", (hook_name, op, (*args, "--folder", I386)))


def _share_config_instead(entry: Entry) -> Entry | None:
    """A config nvidia-ctk mounts at /usr/local/share/..., as ours mounts it."""
    if entry[1] != "mount":
        return None
    m = dict(entry[2])
    if not m["containerPath"].startswith("/usr/local/share/"):
        return None
    m["containerPath"] = "/usr" + m["containerPath"][len("/usr/local"):]
    return (entry[0], entry[1], tuple(sorted(m.items())))


INTENDED: dict[str, Intended] = {
    "dri-link-paths": Intended(
        "nvidia-ctk writes the /dev/dri/by-path links of a GPU at the host path under "
        "--dev-root (/<dev-root>/dev/dri/by-path/...), so a container on a non-/ dev root "
        "gets them in the wrong place; we write /dev/dri/by-path/...",
        instead=_dri_link_instead),
    "egl-soname-links": Intended(
        "we also recreate the host's SONAME links of the EGL platform libraries (their names "
        "carry no driver version; the EGL platform files name them by SONAME, and hook-free "
        "specs have no ldconfig run to make them)",
        ours=lambda e: _name(_link_path(e) or "/").startswith("libnvidia-egl-")),
    "mps-pipe-dir": Intended(
        "we mount the MPS pipe folder /tmp/nvidia-mps when the driver root has one; "
        "nvidia-ctk looks it up as a file and never finds the folder",
        ours=lambda e: e[1] == "mount" and dict(e[2]) == {
            "containerPath": "/tmp/nvidia-mps", "hostPath": NODE + "/tmp/nvidia-mps",
            "options": ("nosuid", "nodev", "rbind", "rprivate", "noexec")}),
    "nvapi": Intended(
        "we mount libnvidia-api.so.1 (NvAPI, which DXVK-NVAPI loads by that name); "
        "nvidia-ctk 1.20 only with its enable-explicit-driver-libraries feature flag",
        ours=lambda e: _mount(e, lambda p: _name(p) == "libnvidia-api.so.1")),
    "egl-xcb-xlib": Intended(
        "we mount the X11 EGL platform libraries (libnvidia-egl-xcb, libnvidia-egl-xlib) and "
        "their configs 20_nvidia_xcb.json and 20_nvidia_xlib.json beside the GBM and "
        "Wayland ones; nvidia-ctk 1.20 mounts only GBM's and Wayland's",
        ours=lambda e: _mount(e, lambda p: _name(p).startswith(EGL_X11) or p in EGL_X11_CONFIGS)),
    "compat32": Intended(
        "we put the i386 libraries (/usr/lib/i386-linux-gnu[/nvidia/current]) in the spec, "
        "with their links and ld-cache folder, for images that ask for compat32 (the plugin "
        "gives them only to those); nvidia-ctk leaves them out",
        ours=lambda e: _mount(e, lambda p: p.startswith(I386 + "/")) or (
            _link_path(e) or "").startswith(I386 + "/"),
        instead=_i386_ldcache_instead),
    "share-configs": Intended(
        "a config found under /usr/local/share (an $XDG_DATA_DIRS folder) is mounted at "
        "/usr/share/..., where every image's loader looks; nvidia-ctk mounts it at its host "
        "path /usr/local/share/...",
        instead=_share_config_instead),
    "application-profile-hook": Intended(
        "nvidia-ctk 1.20 adds an update-application-profile hook (an EGLVisibleDGPUDevices "
        "profile that limits EGL and Vulkan to the container's GPUs); ours has no such "
        "operation yet and refuses --enable-hook update-application-profile",
        theirs=lambda e: e[1] == "hook" and e[2] == ("createContainer",
                                                     "update-application-profile", ())),
}


def why_not_runnable() -> str | None:
    """None when nvidia-ctk can run on a simulated node here, else the reason."""
    if not NVIDIA_CTK.is_file():
        return absent("nvidia-ctk")
    if os.geteuid() != 0:
        return "running nvidia-ctk on a simulated node needs root (mknod, mount namespace)"
    return None


def ctk_argv(node: BuiltNode, extra: Sequence[str] = ()) -> list[str]:
    return in_node_namespace(node, [
        str(NVIDIA_CTK), "--quiet", "cdi", "generate", "--driver-root", str(node.driver_root),
        "--dev-root", str(node.dev_root), "--feature-flag", "disable-nvsandboxutils",
        "--nvidia-cdi-hook-path", NVIDIA_HOOK, *extra])


def ours_argv(node: BuiltNode, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "cdi.nvidia.cli", "--driver-root",
            str(node.driver_root), "--dev-root", str(node.dev_root), *extra]


def run(argv: Sequence[str], node: BuiltNode) -> str:
    """The program's spec, the node's folder written NODE ("node-folder")."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout.replace(os.fspath(node.root), NODE)


def hook_operations(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """The hook operations one entry runs: NVIDIA's entries run one, ours every operation
    of the container in one process (``OP [--opt VAL]... OP ...``)."""
    ops: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg in HOOK_SUBCOMMANDS:
            ops.append((arg, []))
        elif ops:
            ops[-1][1].append(arg)
    return ops


def flag_values(args: Sequence[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


# --- the comparison -------------------------------------------------------------------------


class SpecError(AssertionError):
    """A spec that breaks one of the normalisations' premises (a hook program that is not
    the expected one, a node type the host node does not have)."""


@dataclass
class Entries:
    """A spec as entries, and the order in which each place lists each kind."""

    items: list[Entry] = field(default_factory=list)

    def add(self, where: str, what: str, value: Any) -> None:
        self.items.append((where, what, value))


def _hook_program(hook: Mapping[str, Any], ours: bool) -> list[str]:
    """The hook's arguments from its first operation on ("hook-program"), its program
    checked to be the one that spec's generator writes."""
    args = [str(a) for a in hook.get("args") or ()]
    first = next((i for i, a in enumerate(args) if a in HOOK_SUBCOMMANDS), len(args))
    env = tuple(hook.get("env") or ())
    if ours:
        # Our default program: this interpreter, isolated, running the hook entry.
        expected = [sys.executable, "-I", "-S", str(REPO / "cdi" / "hooks" / "__main__.py")]
        if hook.get("path") != sys.executable or args[:first] != expected or env != HOOK_ENV:
            raise SpecError(f"our hook entry is not our hook program: {dict(hook)}")
    elif (hook.get("path") != NVIDIA_HOOK or args[:first] != ["nvidia-cdi-hook"]
          or env != NVIDIA_HOOK_ENV):
        raise SpecError(f"nvidia-ctk's hook entry is not nvidia-cdi-hook's: {dict(hook)}")
    return args[first:]


def _node(node: Mapping[str, Any], ours: bool, root: str) -> tuple[tuple[str, Any], ...]:
    fields = dict(node)
    fields.setdefault("minor", 0)  # "omitted-zero"
    if ours and "type" in fields:  # "node-type"
        host = Path(str(fields["hostPath"]).replace(NODE, root, 1))
        mode = host.stat().st_mode
        kind = "c" if stat.S_ISCHR(mode) else "b" if stat.S_ISBLK(mode) else "?"
        if fields.pop("type") != kind:
            raise SpecError(f"our node {fields['path']} says type {node['type']}; the host's "
                            f"{host} is {kind!r}")
    return tuple(sorted(fields.items()))


def entries(doc: Mapping[str, Any], ours: bool, root: str) -> list[Entry]:
    """The spec ``doc`` (the node's folder ``root`` written NODE) as entries, normalised."""
    out = Entries()
    out.add("spec", "cdiVersion", doc.get("cdiVersion"))
    out.add("spec", "kind", doc.get("kind"))
    out.add("spec", "device names", tuple(str(d["name"]) for d in doc.get("devices") or ()))
    unknown = set(doc) - {"cdiVersion", "kind", "devices", "containerEdits"}
    out.items += [("spec", key, repr(doc[key])) for key in sorted(unknown)]
    places = [("common", doc.get("containerEdits") or {})]
    places += [(f"device {d['name']}", d.get("containerEdits") or {})
               for d in doc.get("devices") or ()]
    owners: dict[str, list[str]] = {}  # a device node's path -> the devices that have it
    for where, edits in places[1:]:
        for node in edits.get("deviceNodes") or ():
            owners.setdefault(node["path"], []).append(where)
    for where, edits in places:
        for key in sorted(set(edits) - {"env", "deviceNodes", "mounts", "hooks",
                                        "additionalGids"}):
            out.add(where, key, repr(edits[key]))
        for env in edits.get("env") or ():
            out.add(where, "env", env)
        for node in edits.get("deviceNodes") or ():
            out.add(where, "deviceNode", _node(node, ours, root))
        for mount in edits.get("mounts") or ():
            out.add(where, "mount", tuple(sorted(
                (k, tuple(v) if isinstance(v, list) else v) for k, v in mount.items())))
        for hook in edits.get("hooks") or ():
            extra = set(hook) - {"hookName", "path", "args", "env"}
            for op, args in hook_operations(_hook_program(hook, ours)):
                if op != "create-symlinks":
                    out.add(where, "hook", (hook["hookName"], op, tuple(args)))
                    continue
                for flag, value in zip(args[::2], args[1::2], strict=True):  # "links"
                    if flag == "--device-link":  # "device-links"
                        device, _, link = value.partition("::")
                        for owner in owners.get(device, [where]):
                            _link(out, owner, hook["hookName"], link)
                    else:
                        _link(out, where, hook["hookName"], value, flag)
                if len(args) % 2:
                    out.add(where, "hook", (hook["hookName"], op, tuple(args)))
            if extra:
                out.add(where, "hook fields", repr({k: hook[k] for k in sorted(extra)}))
        for gid in edits.get("additionalGids") or ():
            out.add(where, "additionalGid", gid)
    return out.items


def _link(out: Entries, where: str, hook_name: str, value: str, flag: str = "--link") -> None:
    """One link of a create-symlinks operation, and the operation once per place."""
    operation = (where, "hook", (hook_name, "create-symlinks", ()))
    if operation not in out.items:
        out.items.append(operation)
    out.add(where, "link" if flag == "--link" else f"create-symlinks {flag}", value)


def _show(entry: Entry) -> str:
    where, what, value = entry
    if isinstance(value, tuple) and value and all(
            isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) for v in value):
        value = dict(value)
    return f"{where} {what} {value!r}"


@dataclass(frozen=True)
class Comparison:
    differences: tuple[str, ...]  # empty: the specs agree
    used: frozenset[str]  # the INTENDED differences this pair needed


class Node(Protocol):
    """A simulated node (simnode's or tegra's): its folder."""

    @property
    def root(self) -> Path: ...


def compare(ours_text: str, theirs_text: str, node: Node,
            intended: Mapping[str, Intended] | None = None) -> Comparison:
    """Our spec against nvidia-ctk's (both with the node's folder written NODE)."""
    rules = INTENDED if intended is None else intended
    root = os.fspath(node.root)
    ours = entries(yaml.safe_load(ours_text), True, root)
    theirs = entries(yaml.safe_load(theirs_text), False, root)
    only_ours = [e for e in ours if e not in theirs]
    only_theirs = [e for e in theirs if e not in ours]
    used: set[str] = set()
    for name, rule in rules.items():
        if rule.instead is not None:
            for entry in list(only_theirs):
                changed = rule.instead(entry)
                if changed is not None and changed in ours:
                    # ours has it changed (once: an entry nvidia-ctk also has unchanged
                    # is one it wrote twice, in both forms)
                    only_theirs.remove(entry)
                    if changed in only_ours:
                        only_ours.remove(changed)
                    used.add(name)
        for keep, test in ((only_ours, rule.ours), (only_theirs, rule.theirs)):
            if test is None:
                continue
            for entry in [e for e in keep if test(e)]:
                keep.remove(entry)
                used.add(name)
    lines = [f"only ours: {_show(e)}" for e in only_ours]
    lines += [f"only nvidia-ctk: {_show(e)}" for e in only_theirs]
    lines += _order(ours, theirs)
    return Comparison(tuple(lines), frozenset(used))


def _order(ours: Sequence[Entry], theirs: Sequence[Entry]) -> list[str]:
    """Where both list the same entries of a kind in one place, in a different order."""
    out = []
    shared = set(ours) & set(theirs)
    for where, what in dict.fromkeys((e[0], e[1]) for e in theirs):
        if what not in ("env", "deviceNode", "mount", "hook"):
            continue
        a = [e for e in ours if e[:2] == (where, what) and e in shared]
        b = [e for e in theirs if e[:2] == (where, what) and e in shared]
        if a != b:
            first = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
            out.append(f"order of {where} {what}: ours has {_show(a[first])} where "
                       f"nvidia-ctk has {_show(b[first])}")
    return out


# --- nvidia-ctk's answers, recorded ---------------------------------------------------------


def peer_version() -> str:
    """``nvidia-ctk --version``, on one line."""
    proc = subprocess.run([str(NVIDIA_CTK), "--version"], capture_output=True, text=True,
                          check=True, timeout=120)
    return " ".join(proc.stdout.split())


@dataclass(frozen=True)
class Recording:
    """nvidia-ctk's whole output for one case, as a run with the program recorded it."""

    case: str
    arguments: tuple[str, ...]
    text: str

    @staticmethod
    def path(case: str) -> Path:
        return RECORDINGS / f"{case}.yaml"

    @staticmethod
    def index() -> dict[str, Any]:
        if not CASES_FILE.is_file():
            return {"version": "", "cases": {}}
        return dict(yaml.safe_load(CASES_FILE.read_text()))

    @classmethod
    def load(cls, case: str) -> Recording:
        path = cls.path(case)
        cases = cls.index()["cases"]
        if not path.is_file() or case not in cases:
            raise AssertionError(
                f"no recording of nvidia-ctk for {case!r} ({path}): record it with "
                "NRI_CDI_PEERS=<folder with nvidia-ctk> NRI_CDI_RECORD_PEERS=1")
        return cls(case, tuple(cases[case]), path.read_text())

    def save(self, version: str) -> None:
        RECORDINGS.mkdir(parents=True, exist_ok=True)
        self.path(self.case).write_text(self.text)
        index = self.index()
        index["version"] = version
        index["cases"][self.case] = list(self.arguments)
        header = ("# nvidia-ctk cdi generate's output per case (<case>.yaml, the node's folder "
                  f"written {NODE}) and\n# the options it ran with. Written by "
                  "NRI_CDI_RECORD_PEERS=1 (docs/developer/nvidia-ctk-parity.md); do not "
                  "edit.\n")
        CASES_FILE.write_text(header + yaml.safe_dump(index, sort_keys=True, width=100))


def cases_recorded() -> Iterable[str]:
    return (p.stem for p in RECORDINGS.glob("*.yaml") if p not in (CASES_FILE, HOOKS_FILE))
