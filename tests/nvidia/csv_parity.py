"""``nri-cdi generate --mode csv`` against NVIDIA's ``nvidia-ctk cdi generate --mode csv`` on a
simulated Jetson (nri_cdi_testbed.tegra), live or as recorded in tests/data/peers/csv-*.yaml.

``summary`` reduces a spec to what both must agree on: device names; per device and for the
spec-wide edits the device nodes (container and host path), additionalGids, mounts
(container and host path), env, the links of the ``create-symlinks`` operations, the
``update-ldcache`` folders, the ``enable-cuda-compat`` arguments and the hook operations by
name (our one hook entry runs every operation; NVIDIA's run one each, so entries are not
compared). Host paths under the node are written ``{root}/...``, so a recording made on
one machine compares with a node built on another.

The differences we keep on purpose are normalised here and listed in ``INTENDED`` (and in
docs/usage/jetson.md); everything else must be equal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from nri_cdi_testbed.tegra import BuiltTegraNode, in_tegra_namespace
from tests.nvidia.peer_parity import NODE, Entry, Intended, flag_values, hook_operations
from tests.peers import absent, peer

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "peers"
NVIDIA_CTK = peer("nvidia-ctk")
ROOT = "{root}"  # a host path under the node, in summaries and recordings
RELEASE_FILE = "/etc/nv_tegra_release"

INTENDED = {
    "link-paths": "nvidia-ctk writes the links of a CSV sym line at their host path (under "
                  "--driver-root: /<driver-root>/usr/lib/..., a path the container does not "
                  "have unless the driver root is /); we write the container path",
    "absolute-links": "a link whose text is an absolute path is followed inside the driver "
                      "root by us, on the host by nvidia-ctk, which finds nothing there "
                      "unless the driver root is / and leaves the link out",
    "release-file": "nvidia-ctk mounts the host's /etc/nv_tegra_release whatever --driver-"
                    "root says; we mount the driver root's (the same file when it is /)",
    "default-csv-folder": "nvidia-ctk reads the default CSV files from the host's /etc; we "
                          "read them under the driver root (the same files when it is /); "
                          "so nvidia-ctk runs with the node's /etc shown over the host's",
    "bad-lines": "a CSV line that is not KIND, PATH fails the run naming file and line; "
                 "nvidia-ctk skips it silently",
    "device-id-none": "--device-id none gives the board's files without a GPU device, as in "
                      "the other modes; nvidia-ctk's CSV mode refuses it",
    "hook-entries": "one hook entry runs every operation (NVIDIA's hook program one each); "
                    "operations, links, folders and arguments are compared",
    "cdi-version": "nvidia-ctk always writes 0.7.0; we write the lowest version the content "
                   "needs (0.7.0 once additionalGids are in it)",
}


def _unrooted_link(entry: Entry) -> Entry | None:
    """nvidia-ctk's link at its host path under the driver root, at the container path."""
    if entry[1] != "link" or "::" + NODE + "/" not in entry[2]:
        return None
    return (entry[0], "link", str(entry[2]).replace("::" + NODE + "/", "::/", 1))


def _release_file(entry: Entry) -> Entry | None:
    """nvidia-ctk's mount of the host's release file, from the driver root's instead."""
    if entry[1] != "mount" or dict(entry[2]).get("hostPath") != RELEASE_FILE:
        return None
    mount = {**dict(entry[2]), "hostPath": NODE + RELEASE_FILE}
    return (entry[0], "mount", tuple(sorted(mount.items())))


# INTENDED's differences in the form peer_parity.compare checks every field with (hooks
# mode; the names are INTENDED's, so the docs' list covers both).
FIELD_INTENDED = {
    "link-paths": Intended(INTENDED["link-paths"], instead=_unrooted_link),
    "absolute-links": Intended(
        INTENDED["absolute-links"],
        ours=lambda e: e[1] == "link" and str(e[2]).startswith("/")),
    "release-file": Intended(INTENDED["release-file"], instead=_release_file),
}


def why_not_runnable() -> str | None:
    """None when nvidia-ctk can run on a simulated Jetson here, else the reason."""
    if not NVIDIA_CTK.is_file():
        return absent("nvidia-ctk")
    if os.geteuid() != 0:
        return "running nvidia-ctk on a simulated Jetson needs root (mknod, mount namespace)"
    return None


def ctk_argv(node: BuiltTegraNode, extra: Sequence[str] = ()) -> list[str]:
    """nvidia-ctk on the node; its default CSV files and release file come from /etc, so
    the node's /etc is shown over the host's (INTENDED["default-csv-folder"])."""
    return in_tegra_namespace(node, [
        str(NVIDIA_CTK), "--quiet", "cdi", "generate", "--mode", "csv",
        "--driver-root", str(node.root), "--feature-flag", "disable-nvsandboxutils",
        "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook", *extra])


def ours_argv(node: BuiltTegraNode, extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "cdi.nvidia.cli", "--quiet", "--mode", "csv",
            "--driver-root", str(node.root), *extra]


def run(argv: Sequence[str], node: BuiltTegraNode) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if node.manifest["nvml"]:
        # nvidia-ctk asks the loader for libnvidia-ml.so.1 by name; the board's ld.so.conf.d
        # names the folder, the host's does not.
        env["LD_LIBRARY_PATH"] = str(node.nvml_library_folder)
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=120)
    if proc.returncode != 0:
        raise AssertionError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc.stdout


# --- recordings -----------------------------------------------------------------------------


def recording(scenario: str) -> Path:
    return DATA / f"csv-{scenario}.yaml"


def record(scenario: str, text: str, node: BuiltTegraNode, argv: Sequence[str]) -> str:
    """nvidia-ctk's output as committed: the node's folder written as ``{root}``, and a
    header naming the program, its version and the options."""
    version = subprocess.run([str(NVIDIA_CTK), "--version"], capture_output=True, text=True,
                             check=True).stdout.splitlines()
    options = " ".join(a for a in argv[argv.index("generate") + 1:]).replace(str(node.root),
                                                                             ROOT)
    header = [f"# nvidia-ctk cdi generate on the simulated Jetson, scenario {scenario}",
              *(f"# {line}" for line in version if line.strip()),
              f"# options: {options}",
              "# regenerate: NRI_CDI_PEERS=<folder of nvidia-ctk> NRI_CDI_RECORD_PEERS=1 "
              "pytest tests/nvidia/test_csv_peer.py"]
    return "\n".join(header) + "\n" + text.replace(str(node.root), ROOT)


def recorded(scenario: str, node: BuiltTegraNode) -> str:
    """The recording as nvidia-ctk would have printed it on ``node``."""
    return recording(scenario).read_text().replace(ROOT, str(node.root))


# --- summaries ------------------------------------------------------------------------------


def _host(path: str, root: str) -> str:
    return ROOT + path[len(root):] if path == root or path.startswith(root + "/") else path


def _edits(edits: dict[str, Any], root: str) -> dict[str, Any]:
    links: set[str] = set()
    folders: set[str] = set()
    compat: list[str] = []
    hooks: set[str] = set()
    for hook in edits.get("hooks") or ():
        for name, args in hook_operations(hook.get("args") or ()):
            hooks.add(name)
            if name == "create-symlinks":
                for link in flag_values(args, "--link"):
                    target, _, path = link.partition("::")
                    # INTENDED["link-paths"]: the host path of a link is its container path
                    links.add(f"{target}::{_host(path, root).removeprefix(ROOT)}")
            elif name == "update-ldcache":
                folders.update(flag_values(args, "--folder"))
            elif name == "enable-cuda-compat":
                compat += args
    return {
        "nodes": sorted((n["path"], _host(n.get("hostPath") or n["path"], root))
                        for n in edits.get("deviceNodes") or ()),
        "gids": sorted(edits.get("additionalGids") or ()),
        "mounts": sorted((m["containerPath"], _host(m["hostPath"], root))
                         for m in edits.get("mounts") or ()),
        "env": sorted(edits.get("env") or ()),
        "links": sorted(links),
        "ldcache": sorted(folders),
        "compat": sorted(compat),
        "hooks": sorted(hooks),
    }


def summary(text: str, node: BuiltTegraNode) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    root = os.fspath(node.root)
    return {"devices": {d["name"]: _edits(d.get("containerEdits") or {}, root)
                        for d in doc.get("devices") or ()},
            "common": _edits(doc.get("containerEdits") or {}, root)}


def nvidia_ctk_summary(text: str, node: BuiltTegraNode) -> dict[str, Any]:
    """nvidia-ctk's summary with INTENDED["release-file"] applied: its host release file is
    the node's (the namespace of ``ctk_argv`` shows the node's /etc)."""
    out = summary(text, node)
    out["common"]["mounts"] = sorted(
        (path, f"{ROOT}{RELEASE_FILE}" if host == RELEASE_FILE else host)
        for path, host in out["common"]["mounts"])
    return out


def as_link_mounts(theirs: dict[str, Any], node: BuiltTegraNode) -> dict[str, Any]:
    """What a ``--link-mode mounts`` spec must hold where nvidia-ctk's has hooks: every
    link a bind mount of the file it ends at, the ld cache's folders the loader path of
    the plugin's variable, no hook."""
    common = dict(theirs["common"])
    mounts = set(common["mounts"])
    for link in common["links"]:
        path = link.partition("::")[2]
        end = os.path.realpath(os.fspath(node.root) + path)
        mounts.add((path, _host(end, os.fspath(node.root))))
    env = set(common["env"])
    if common["ldcache"]:
        env.add(f"NRI_CDI_LD_LIBRARY_PATH={':'.join(sorted(common['ldcache']))}")
    common.update(mounts=sorted(mounts), env=sorted(env), links=[], ldcache=[], compat=[],
                  hooks=[])
    return {"devices": theirs["devices"], "common": common}


def _absolute_link(node: BuiltTegraNode, path: str) -> bool:
    try:
        return os.readlink(os.fspath(node.root) + path).startswith("/")
    except OSError:
        return False


def _ours_only(node: BuiltTegraNode, key: str, item: Any) -> bool:
    """What we have and nvidia-ctk lacks, by design (INTENDED["absolute-links"]): the
    links the node has with an absolute text, as links or (--link-mode mounts) mounts."""
    if key == "links":
        return item.partition("::")[0].startswith("/")
    return key == "mounts" and _absolute_link(node, item[0])


def differences(ours: dict[str, Any], theirs: dict[str, Any],
                node: BuiltTegraNode) -> list[str]:
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
            only_a = [x for x in a[key] if x not in b[key] and not _ours_only(node, key, x)]
            only_b = [x for x in b[key] if x not in a[key]]
            if only_a or only_b:
                out.append(f"{where} {key}: only ours {only_a}, only nvidia-ctk {only_b}")
    return out
