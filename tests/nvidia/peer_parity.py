"""Side-by-side runs of ``nri-cdi generate`` and NVIDIA's ``nvidia-ctk cdi generate`` on one
simulated node, reduced to what both must agree on (shared by the parity tests and bench/).

``summary`` keeps, per device and for the spec-level edits: device nodes (container and host
path), mounts, the links of ``create-symlinks`` hooks, the ``update-ldcache`` folders, the hook
subcommands and ``additionalGids``, with the node's own folder written ``{node}`` so that a
summary of one node compares with one of another built from the same layout. Known,
intended differences are normalised here and listed in ``INTENDED``, their one home (the
docs and the README point here); everything else must be equal.

nvidia-ctk's summaries are recorded in tests/data/peers/nvidia-ctk/ with its version
(``Recording``): a run without the program compares with those
(docs/developer/nvidia-ctk-parity.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nri_cdi_testbed.simnode import BuiltNode, in_node_namespace
from tests.peers import RECORDINGS, absent, peer

REPO = Path(__file__).resolve().parents[2]
NVIDIA_CTK = peer("nvidia-ctk")
HOOK_SUBCOMMANDS = ("create-symlinks", "update-ldcache", "enable-cuda-compat",
                    "disable-device-node-modification", "update-application-profile", "chmod")
# Hooks nvidia-ctk emits by default that this branch may not emit yet (issue 15, defect 3).
PENDING_HOOKS = frozenset({"enable-cuda-compat", "disable-device-node-modification",
                           "update-application-profile"})
# Links we make that nvidia-ctk does not: the SONAME links of the graphics libraries that do
# not carry the driver version (libnvidia-egl-gbm.so.1 -> libnvidia-egl-gbm.so.1.1.2).
EXTRA_LINK_PREFIXES = ("libnvidia-egl-",)
# INTENDED["egl-xcb-xlib"]: the X11 EGL platform libraries and the configs that name them.
EGL_X11_LIBRARIES = ("libnvidia-egl-xcb.so.", "libnvidia-egl-xlib.so.")
EGL_X11_CONFIGS = ("/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json",
                   "/usr/share/egl/egl_external_platform.d/20_nvidia_xlib.json")
I386_FOLDER = "/usr/lib/i386-linux-gnu"  # INTENDED["compat32"]; Debian's nvidia/current below
NODE = "{node}"  # the node's own folder in a summary

INTENDED = {
    "dri-link-paths": "nvidia-ctk writes the /dev/dri/by-path links of a GPU at the host path "
                      "under --dev-root (/<dev-root>/dev/dri/by-path/...), so a container on a "
                      "non-/ dev root gets them in the wrong place; we write /dev/dri/by-path/...",
    "hooks": f"hooks nvidia-ctk emits that we may lack: {', '.join(sorted(PENDING_HOOKS))}",
    "egl-soname-links": "we also recreate the host's SONAME links of the EGL platform "
                        "libraries (their names carry no driver version; the EGL platform "
                        "files name them by SONAME, and hook-free specs have no ldconfig run "
                        "to make them)",
    "mps-pipe-dir": "we mount the MPS pipe folder /tmp/nvidia-mps when the driver root has "
                    "one; nvidia-ctk looks it up as a file and never finds the folder",
    "cdi-version": "nvidia-ctk always writes 0.7.0 and more; we write the lowest version "
                   "the content needs (0.7.0 once additionalGids are in it)",
    "nvapi": "we mount libnvidia-api.so.1 (NvAPI, which DXVK-NVAPI loads by that name); "
             "nvidia-ctk 1.20 only with its enable-explicit-driver-libraries feature flag",
    "egl-xcb-xlib": "we mount the X11 EGL platform libraries (libnvidia-egl-xcb, "
                    "libnvidia-egl-xlib) and their configs 20_nvidia_xcb.json and "
                    "20_nvidia_xlib.json beside the GBM and Wayland ones; nvidia-ctk 1.20 "
                    "mounts only GBM's and Wayland's",
    "compat32": "we put the i386 libraries (/usr/lib/i386-linux-gnu[/nvidia/current]) in "
                "the spec, with their links and ld-cache folder, for images that ask for "
                "compat32 (the plugin gives them only to those); nvidia-ctk leaves them out",
    "share-configs": "a config found under /usr/local/share (an $XDG_DATA_DIRS folder) is "
                     "mounted at /usr/share/..., where every image's loader looks; "
                     "nvidia-ctk mounts it at its host path /usr/local/share/...",
}


def why_not_runnable() -> str | None:
    """None when nvidia-ctk can run on a simulated node here, else the reason."""
    if not NVIDIA_CTK.is_file():
        return absent("nvidia-ctk")
    if os.geteuid() != 0:
        return "running nvidia-ctk on a simulated node needs root (mknod, mount namespace)"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is needed for a private mount namespace"
    return None


def ctk_argv(node: BuiltNode, extra: Sequence[str] = ()) -> list[str]:
    return in_node_namespace(node, [
        str(NVIDIA_CTK), "--quiet", "cdi", "generate", "--driver-root", str(node.driver_root),
        "--dev-root", str(node.dev_root), "--feature-flag", "disable-nvsandboxutils",
        "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", *extra])


def ours_argv(node: BuiltNode, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "cdi.nvidia.cli", "--driver-root",
            str(node.driver_root), "--dev-root", str(node.dev_root), *extra]


def run(argv: Sequence[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


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


def _edits(edits: dict[str, Any], dev_root: str) -> dict[str, Any]:
    links: set[str] = set()
    device_links: set[tuple[str, str]] = set()  # (device node, link): ours, in one entry
    folders: set[str] = set()
    hooks: set[str] = set()
    for hook in edits.get("hooks") or ():
        for name, args in hook_operations(hook.get("args") or ()):
            hooks.add(name)
            if name == "create-symlinks":
                for link in flag_values(args, "--link"):
                    links.add(_link(link, dev_root))
                for spec in flag_values(args, "--device-link"):
                    device, _, link = spec.partition("::")
                    device_links.add((device, _link(link, dev_root)))
            elif name == "update-ldcache":
                folders.update(flag_values(args, "--folder"))
    return {
        "nodes": sorted((n["path"], n.get("hostPath") or n["path"])
                        for n in edits.get("deviceNodes") or ()),
        "mounts": sorted((_container_path(m["containerPath"]), m["hostPath"])
                         for m in edits.get("mounts") or ()),
        "links": sorted(links),
        "ldcache": sorted(folders),
        "hooks": sorted(hooks),
        "gids": sorted(edits.get("additionalGids") or ()),
        "device_links": device_links,
    }


def _container_path(path: str) -> str:
    if path.startswith("/usr/local/share/"):
        return "/usr" + path[len("/usr/local"):]  # INTENDED["share-configs"]
    return path


def _link(link: str, dev_root: str) -> str:
    target, _, path = link.partition("::")
    if dev_root != "/" and path.startswith(dev_root + "/dev/"):
        path = path[len(dev_root):]  # INTENDED["dri-link-paths"]
    return f"{target}::{path}"


def summary(text: str, node: BuiltNode) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    dev_root = os.fspath(node.dev_root).rstrip("/") or "/"
    devices = {d["name"]: _edits(d.get("containerEdits") or {}, dev_root)
               for d in doc.get("devices") or ()}
    common = _edits(doc.get("containerEdits") or {}, dev_root)
    # Our one hook entry carries each device's links as --device-link DEVICE::LINK, made
    # only in containers that have DEVICE: count them as that device's links.
    for edits in (common, *devices.values()):
        for device, link in edits.pop("device_links"):
            for dev in devices.values():
                if device in (path for path, _ in dev["nodes"]):
                    dev["links"] = sorted({*dev["links"], link})
                    dev["hooks"] = sorted({*dev["hooks"], "create-symlinks"})
    found = {"cdiVersion": doc["cdiVersion"], "devices": devices, "common": common}
    # Lists for tuples (as read back from a recording), the node's folder by name.
    text = json.dumps(found, sort_keys=True).replace(os.fspath(node.root), NODE)
    return dict(json.loads(text))


def differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """What differs beyond INTENDED, as readable lines (empty: the specs agree)."""
    out = []
    if sorted(ours["devices"]) != sorted(theirs["devices"]):
        out.append(f"device names: ours {sorted(ours['devices'])} "
                   f"nvidia-ctk {sorted(theirs['devices'])}")
    pairs = [("common", ours["common"], theirs["common"])]
    pairs += [(f"device {n}", ours["devices"][n], theirs["devices"][n])
              for n in sorted(set(ours["devices"]) & set(theirs["devices"]))]
    for where, a, b in pairs:
        for key in a:
            if key == "hooks":
                extra = set(a[key]) - set(b[key])
                missing = set(b[key]) - set(a[key]) - PENDING_HOOKS
                if extra or missing:
                    out.append(f"{where} hooks: only ours {sorted(extra)}, "
                               f"only nvidia-ctk {sorted(missing)}")
            elif a[key] != b[key]:
                only_a = [x for x in a[key] if x not in b[key] and not _ours_only(key, x)]
                only_b = [x for x in b[key] if x not in a[key]]
                if only_a or only_b:
                    out.append(f"{where} {key}: only ours {only_a}, only nvidia-ctk {only_b}")
    return out


def _ours_only(key: str, item: Any) -> bool:
    """An entry only we emit, by design (see INTENDED)."""
    if key == "links":
        return _extra_link(item) or item.partition("::")[2].startswith(I386_FOLDER + "/")
    if key == "ldcache":
        return bool(item.startswith(I386_FOLDER))  # INTENDED["compat32"]
    if key != "mounts":
        return False
    path = item[0]
    name = path.rpartition("/")[2]
    return (path == "/tmp/nvidia-mps"  # INTENDED["mps-pipe-dir"]
            or name == "libnvidia-api.so.1"  # INTENDED["nvapi"]
            or name.startswith(EGL_X11_LIBRARIES) or path in EGL_X11_CONFIGS
            or path.startswith(I386_FOLDER + "/"))


def _extra_link(link: str) -> bool:
    return link.rpartition("/")[2].startswith(EXTRA_LINK_PREFIXES)  # INTENDED["egl-soname-links"]


# --- nvidia-ctk's answers, recorded ---------------------------------------------------------


def peer_version() -> str:
    """``nvidia-ctk --version``, on one line."""
    proc = subprocess.run([str(NVIDIA_CTK), "--version"], capture_output=True, text=True,
                          check=True, timeout=120)
    return " ".join(proc.stdout.split())


@dataclass(frozen=True)
class Recording:
    """nvidia-ctk's summary for one case, as a run with the program recorded it."""

    case: str
    version: str
    arguments: tuple[str, ...]
    summary: dict[str, Any]

    @staticmethod
    def path(case: str) -> Path:
        return RECORDINGS / "nvidia-ctk" / f"{case}.yaml"

    @classmethod
    def load(cls, case: str) -> Recording:
        path = cls.path(case)
        if not path.is_file():
            raise AssertionError(
                f"no recording of nvidia-ctk for {case!r} ({path}): record it with "
                "NRI_CDI_PEERS=<folder with nvidia-ctk> NRI_CDI_RECORD_PEERS=1")
        doc = yaml.safe_load(path.read_text())
        return cls(case, doc["version"], tuple(doc["arguments"]), doc["summary"])

    def save(self) -> None:
        path = self.path(self.case)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = (f"# nvidia-ctk cdi generate on the simulated node of case {self.case!r}, "
                  "as tests/nvidia/peer_parity.py\n# summarises it. Written by "
                  "NRI_CDI_RECORD_PEERS=1 (docs/developer/nvidia-ctk-parity.md); do not edit.\n")
        body = {"version": self.version, "arguments": list(self.arguments),
                "summary": self.summary}
        path.write_text(header + yaml.safe_dump(body, sort_keys=True, width=100))
