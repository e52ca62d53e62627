"""``nri-cdi doctor``: is this node set up so that containers get their devices?

Each check gives a verdict (ok, warn, fail, skip), one line of detail, and the fix when
it is not ok. The checks read files and sockets only; the fingerprint check runs the
generator to standard output (nothing is written). Exit status: 1 when any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ParamSpec

import yaml

from cdi.cache import SpecCache
from cdi.dirs import DEFAULT_SPEC_DIRS, scan
from cdi.linux.elf import ElfError, foreign_to_this_machine, is_elf, read_header, this_machine
from cdi.nvidia.discover import Roots, driver_version_from_proc
from cdi.nvidia.sidecar import read_sidecar, sidecar_path
from nri_plugin.nri.versions import DEFAULT_SOCKET_PATH, NativeCdi
from nri_plugin.ops.containerd_config import (
    NRI_SECTION,
    ContainerdConfig,
    locate,
    same_path,
)
from nri_plugin.ops.crio_config import CrioConfig
from nri_plugin.ops.inpod import NOT_VISIBLE, ON_NODE, ON_THE_NODE, TOLERATE_ENV, Place, detect
from nri_plugin.ops.kubelet_plugins import Registry, read_registry
from nri_plugin.ops.podresources import PodResourcesWatch
from nri_plugin.ops.refresh import generator_args, run_generator_process
from nri_plugin.ops.runtime_cdi import cri_cdi_settings, crio_serving, why_unread
from nri_plugin.ops.settings import (
    PluginSettings,
    Settings,
    add_config_argument,
    add_setting_flags,
    command_settings,
    parse_address,
)
from nri_plugin.ops.status import CONNECTED, LAUNCHED_SOCKET, STARTING, read_status

_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
P = ParamSpec("P")


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""


# A check returns one of these verdicts; ``named`` gives it the check's name.
def ok(detail: str) -> Check:
    return Check(name="", status="ok", detail=detail)


def warn(detail: str, fix: str = "") -> Check:
    return Check(name="", status="warn", detail=detail, fix=fix)


def fail(detail: str, fix: str = "") -> Check:
    return Check(name="", status="fail", detail=detail, fix=fix)


def skip(detail: str, fix: str = "") -> Check:
    return Check(name="", status="skip", detail=detail, fix=fix)


def named(name: str) -> Callable[[Callable[P, Check]], Callable[P, Check]]:
    def wrap(check: Callable[P, Check]) -> Callable[P, Check]:
        @functools.wraps(check)
        def named_check(*args: P.args, **kwargs: P.kwargs) -> Check:
            return replace(check(*args, **kwargs), name=name)
        return named_check
    return wrap


# --- containerd's configuration ------------------------------------------------------------


@named("containerd's settings")
def check_containerd_config(cfg: ContainerdConfig, place: Place = ON_NODE) -> Check:
    """Whether containerd's settings were read, from which files, and what the checks
    below assume where they were not. In a pod, from the node's folder as the pod mounts
    it (the plugin reads the same copy)."""
    assumed = {None: "containerd's defaults for its version (1.7: NRI off, its own CDI off; "
                     "2.x: both on, CDI from /etc/cdi and /var/run/cdi)",
               1: "containerd 1.7's defaults: NRI off, its own CDI off",
               2: "containerd 2.x's defaults: NRI on, its own CDI on with /etc/cdi and "
                  "/var/run/cdi"}[min(cfg.major, 2) if cfg.major is not None else None]
    unread = why_unread(cfg)
    if unread:
        return warn(f"not read ({unread}); the checks below and the plugin assume {assumed}",
                    fix="name containerd's configuration file: "
                        "runtime_cdi.containerd_config (or --containerd-config)")
    if cfg.data is None:
        return ok(f"{cfg.source} runs without {cfg.path}: {assumed}")
    copy = "; in the pod: the node's file as the pod mounts it" if place.in_pod else ""
    return ok(f"read {cfg.read} ({cfg.source}){copy}")


@named("NRI enabled in containerd")
def check_nri_enabled(cfg: ContainerdConfig, our_socket: str, place: Place = ON_NODE) -> Check:
    section = f'[plugins."{NRI_SECTION}"]'
    fix = (f'in {cfg.path}: {section} disable = false (and disable_connections = false), '
           "then restart containerd")
    if cfg.error and place.in_pod and not os.path.exists(cfg.path):
        return skip(f"containerd's configuration {cfg.path} is {NOT_VISIBLE}; the NRI socket "
                    "check below tells whether NRI listens", fix=ON_THE_NODE)
    if cfg.error:
        return fail(f"cannot read {cfg.path}: {cfg.error}",
                    fix=("name the file containerd reads: runtime_cdi.containerd_config in "
                         "nri-cdi's configuration (--containerd-config)") if not cfg.located
                    else "fix the file's syntax (containerd would not start with it either)")
    nri = cfg.plugin(NRI_SECTION)
    default_off = not cfg.v2_defaults
    if cfg.data is None:
        how = "off" if default_off else "on"
        detail = f"no {cfg.path}: containerd's default applies (NRI {how})"
        return fail(detail, fix=fix) if default_off else ok(detail)
    if nri.get("disable", default_off):
        why = ("disable = true" if "disable" in nri
               else "disable not set: NRI is off by default in containerd 1.7")
        return fail(f"{section}: {why}", fix=fix)
    if nri.get("disable_connections", False):
        return fail("disable_connections = true: external plugins cannot connect",
                    fix=f"set disable_connections = false in {section}, or run the plugin "
                        "from the runtime's plugin_path (nri-cdi install-plugin-launcher)")
    socket_path = nri.get("socket_path", DEFAULT_SOCKET_PATH)
    if same_path(socket_path, our_socket):
        return ok(f"NRI on, socket {socket_path}")
    return warn(f"containerd's NRI socket is {socket_path}, the plugin uses {our_socket}",
                fix="set plugin.socket in the nri-cdi configuration to containerd's "
                    "socket_path")


@named("NRI socket reachable")
def check_socket(path: str, place: Place = ON_NODE) -> Check:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        try:
            sock.connect(path)
        except OSError as exc:
            return fail(f"{path}: {exc.strerror or exc}", fix=(
                "the pod mounts the node's folder of plugin.socket: on the node, start "
                "containerd with NRI enabled and its socket_path there" if place.in_pod else
                "start containerd with NRI enabled; run doctor as root (the socket's folder "
                "is 0700)"))
    return ok(f"{path} accepts connections")


@named("plugin connected")
def check_plugin(plugin: PluginSettings, *, health: str | None = None,
                 place: Place = ON_NODE) -> Check:
    """From the status file the plugin keeps (``plugin.status_dir``): whether it runs,
    whether it is connected, to which runtime, over which socket. Needs no metrics."""
    start = ("read the plugin container's log (kubectl logs POD -c plugin) and the pod's "
             "events (kubectl describe pod POD)" if place.in_pod else
             "start it: systemctl start nri-cdi-plugin (or check the DaemonSet pod, whose "
             "/run/nri-cdi must be the host's)")
    if not plugin.status_dir:
        return skip("plugin.status_dir is empty: the plugin keeps no status file"
                    + ("; see the health endpoint below" if health else ""),
                    fix="set plugin.status_dir (default /run/nri-cdi) for the plugin and for "
                        "doctor")
    reading = read_status(plugin.status_dir, plugin.name, plugin.index)
    status = reading.status
    if status is None:
        folder = reading.path.parent
        others = sorted(p.name for p in folder.glob("*.json")) if folder.is_dir() else []
        return fail(f"{reading.path}: {reading.problem}"
                    + (f" (there: {', '.join(others)}: another plugin.name or "
                       "plugin.index?)" if others else ""), fix=start)
    pid = f"pid {status.pid}"
    if reading.alive is None:
        return warn(f"{reading.path} says {status.state} since {_when(status.since)} ({pid}), "
                    "but whether that process still runs cannot be told",
                    fix="run doctor as root")
    if not reading.alive:
        return fail(f"the plugin is not running: {pid} was last {status.state} at "
                    f"{_when(status.since)}" + _because(status.error), fix=start)
    if status.state == CONNECTED:
        detail = (f"connected to {status.runtime or 'the runtime'} since "
                  f"{_when(status.since)} ({pid}, socket {status.socket})")
        if status.socket != LAUNCHED_SOCKET and not same_path(status.socket, plugin.socket):
            return warn(detail + f"; this doctor checks {plugin.socket}",
                        fix="use the same plugin.socket (and config file) for the plugin and "
                            "doctor")
        return ok(detail)
    what = ("running but never connected" if status.state == STARTING
            else "running but not connected")
    return fail(f"{what} since {_when(status.since)} ({pid}, socket {status.socket})"
                + _because(status.error),
                fix="check NRI and the socket (above) and the plugin's log; it reconnects by "
                    "itself when the runtime listens")


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(seconds))


def _because(error: str) -> str:
    return f" ({error})" if error else ""


@named("plugin health endpoint")
def check_health(health_url: str) -> Check:
    """The plugin's /healthz, when metrics (or doctor.health_url) are configured."""
    try:
        with urllib.request.urlopen(health_url, timeout=3) as resp:
            body = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(ValueError):
            body = json.loads(exc.read() or b"{}")
            return fail(f"{health_url}: {body.get('status', exc.code)}",
                        fix="the plugin runs but is not connected: check NRI (above) and the "
                            "plugin's log")
        return fail(f"{health_url}: HTTP {exc.code}")
    except (OSError, ValueError) as exc:
        return fail(f"{health_url}: {exc}", fix="start the plugin: systemctl start "
                    "nri-cdi-plugin (or check the DaemonSet pod)")
    return ok(f"connected to {body.get('runtime')}; registry {body.get('registry')}")


def health_url(settings: Settings) -> str | None:
    if settings.doctor.health_url:
        return str(settings.doctor.health_url)
    if not settings.metrics.address:
        return None
    host, port = parse_address(settings.metrics.address)
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{host if ':' not in host else f'[{host}]'}:{port}/healthz"


# --- specs ---------------------------------------------------------------------------------


@named("spec directories")
def check_spec_dirs(dirs: Iterable[str], place: Place = ON_NODE) -> Check:
    dirs = list(dirs)
    unreadable = [d for d in dirs if os.path.isdir(d) and not os.access(d, os.R_OK | os.X_OK)]
    if unreadable:
        return fail(f"cannot read {', '.join(unreadable)}",
                    fix="run doctor (and the plugin) as root")
    snapshot = SpecCache(dirs).refresh()
    if snapshot.errors:
        lines = [f"{path}: {msgs[0]}" for path, msgs in sorted(snapshot.errors.items())]
        return fail("; ".join(lines),
                    fix="fix or remove the files named (a bad spec is skipped, so its devices "
                        "are unresolvable); regenerate generated ones with nri-cdi refresh")
    if not snapshot.devices:
        return warn(f"no CDI devices in {', '.join(dirs)}", fix=(
            "the DaemonSet's generate and watch containers write it (read their logs); with "
            "the driver on the host, the node's nri-cdi-generate unit does" if place.in_pod
            else "generate a spec: nri-cdi refresh (or systemctl start nri-cdi-generate)"))
    return ok(f"{len(snapshot.devices)} devices from {len(snapshot.specs)} specs")


def _spec_documents(dirs: Iterable[str]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for spec_file in scan(list(dirs)):
        if spec_file.error:
            continue
        try:
            with open(spec_file.path, encoding="utf-8") as handle:
                doc = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError):
            continue  # reported by check_spec_dirs
        if isinstance(doc, Mapping):
            yield spec_file.path, doc


def _edit_entries(doc: Mapping[str, Any], kind: str) -> Iterable[Mapping[str, Any]]:
    """The ``deviceNodes`` or ``mounts`` of a spec's and its devices' containerEdits."""
    edits = [doc.get("containerEdits") or {}]
    edits += [(d or {}).get("containerEdits") or {} for d in doc.get("devices") or []]
    for e in edits:
        yield from (n for n in e.get(kind) or [] if isinstance(n, Mapping))


@named("device nodes present")
def check_device_nodes(dirs: Iterable[str]) -> Check:
    missing: list[str] = []
    wrong: list[str] = []
    seen = 0
    for path, doc in _spec_documents(dirs):
        for node in _edit_entries(doc, "deviceNodes"):
            host = str(node.get("hostPath") or node.get("path") or "")
            seen += 1
            try:
                st = os.stat(host)
            except OSError:
                missing.append(f"{host} ({os.path.basename(path)})")
                continue
            major = node.get("major")
            if stat.S_ISCHR(st.st_mode) and major is not None and os.major(st.st_rdev) != major:
                wrong.append(f"{host} is {os.major(st.st_rdev)}:x, spec says {major}")
    if missing or wrong:
        shown = sorted(set(missing))[:5] + wrong[:5]
        more = len(set(missing)) + len(wrong) - len(shown)
        return fail("; ".join(shown) + (f" and {more} more" if more > 0 else ""),
                    fix="load the driver and create the nodes (nvidia-smi, or nvidia-modprobe "
                        "-c0 -u), then regenerate: nri-cdi refresh")
    return ok(f"{seen} device node entries, all present")


@named("driver architecture")
def check_driver_architecture(dirs: Iterable[str], place: Place = ON_NODE) -> Check:
    """The ELF files the specs mount are built for this machine (another architecture's
    driver, a copied spec or a driver container of the wrong image, fails in containers
    only as "cannot open shared object file")."""
    foreign: list[str] = []
    seen = 0
    hidden: list[str] = []
    for _, doc in _spec_documents(dirs):
        for host in sorted({str(m.get("hostPath")) for m in _edit_entries(doc, "mounts")}):
            if not os.path.lexists(host):
                hidden.append(host)
                continue
            if not os.path.isfile(host) or not is_elf(host):
                continue
            seen += 1
            try:
                reason = foreign_to_this_machine(host, read_header(host))
            except (OSError, ElfError) as exc:
                reason = f"{host}: {exc}"
            if reason is not None:
                foreign.append(reason)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        return fail(foreign[0] + more,
                    fix="generate the spec on this node from this node's driver (nri-cdi "
                        "refresh); check the driver root it names")
    if place.in_pod and hidden and not seen:
        return skip(f"the driver files the specs mount ({hidden[0]}, ...) are {NOT_VISIBLE}: "
                    "this container does not mount the driver", fix=ON_THE_NODE)
    return ok(f"{seen} ELF files mounted, all for {this_machine()}")


def driver_unseen(settings: Settings, place: Place) -> str:
    """Why the generator cannot see the node's driver from here ("" when it can): in a pod,
    the driver root must be mounted (a driver installed on the host at / is the image's own
    root there)."""
    if not place.in_pod:
        return ""
    root = settings.generate.driver_root
    if os.path.normpath(root) == "/":
        return (f"the driver root / is the image's own root in the pod, not the node's: the "
                f"node's driver is {NOT_VISIBLE}")
    if not os.path.ismount(root):
        return (f"the driver root {root} is {NOT_VISIBLE} (this container does not mount it; "
                "the DaemonSet's watch container does, and keeps the spec current)")
    return ""


@named("spec matches the node")
def check_fingerprint(settings: Settings, place: Place = ON_NODE) -> Check:
    output = Path(settings.generate.output)
    meta = read_sidecar(output)
    if not meta:
        if not output.exists():
            return skip(f"no generated spec at {output}",
                        fix="if this node has NVIDIA GPUs: nri-cdi refresh")
        return warn(f"{output} has no {sidecar_path(output).name}",
                    fix="regenerate it with nri-cdi refresh (records the fingerprint)")
    unseen = driver_unseen(settings, place)
    if unseen:
        return skip(f"{unseen}; the spec was generated for driver "
                    f"{meta.get('driver', {}).get('version')}",
                    fix=f"{ON_THE_NODE}; in the DaemonSet the watch container regenerates the "
                        "spec when the driver changes (its log says so)")
    fingerprint, error = current_fingerprint(settings)
    if fingerprint is None:
        return fail(f"cannot inspect the node: {error}",
                    fix="check the driver (nvidia-smi) and the generate section")
    if fingerprint == meta.get("fingerprint"):
        return ok(f"fingerprint {fingerprint[:19]}…, driver "
                  f"{meta.get('driver', {}).get('version')}")
    return fail(_stale_detail(settings, meta),
                fix="regenerate: nri-cdi refresh; keep it current with nri-cdi-watch.service "
                    "(driver upgrades and MIG changes)")


def _stale_detail(settings: Settings, meta: Mapping[str, Any]) -> str:
    spec_version = meta.get("driver", {}).get("version")
    generate = settings.generate
    node_version = driver_version_from_proc(
        Roots(dev=Path(generate.dev_root or generate.driver_root)))
    if node_version and spec_version and node_version != spec_version:
        return f"stale: spec is for driver {spec_version}, the node runs {node_version}"
    return ("stale: the node's GPUs, MIG layout, device majors or driver files differ from "
            "when the spec was generated")


def current_fingerprint(settings: Settings) -> tuple[str | None, str]:
    """(fingerprint, error) of what the generator would write now (stdout, nothing saved)."""
    # less the leading --if-changed --output FILE: the spec goes to standard output
    done = run_generator_process([*generator_args(settings)[3:], "--format", "yaml"])
    match = re.search(r"^# fingerprint: (\S+)$", done.stdout, re.M)
    if done.returncode != 0 or not match:
        return None, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
    return match.group(1), ""


# --- containerd's own CDI ------------------------------------------------------------------
# It must read the plugin's spec folders, or the devices handed over to it fail
# (docs/install/containerd.md, "containerd's own CDI beside the plugin").


def _runtime_cdi(cfg: ContainerdConfig) -> tuple[bool, tuple[str, ...]]:
    """(enable_cdi in effect, the folders it resolves from)."""
    enabled, dirs = cri_cdi_settings(cfg)
    return cfg.v2_defaults if enabled is NativeCdi.UNKNOWN else enabled is NativeCdi.ON, dirs


def _unread(our_dirs: Iterable[str], theirs: Iterable[str]) -> list[str]:
    theirs = list(theirs)
    return sorted(d for d in our_dirs if not any(same_path(d, t) for t in theirs))


@named("containerd's own CDI")
def check_native_cdi(cfg: ContainerdConfig, our_dirs: Iterable[str]) -> Check:
    enabled, dirs = _runtime_cdi(cfg)
    if not enabled:
        if not cfg.v2_defaults:
            return ok("enable_cdi is off: the plugin injects every device; devices NRI cannot "
                      "carry (additionalGids, permissions narrower than rw) are refused, "
                      "containerd 1.7 resolves CDI_devices only with enable_cdi = true")
        # containerd 2.x resolves CDI_devices with the CDI library's default folders then.
        dirs = DEFAULT_SPEC_DIRS
    unread = _unread(our_dirs, dirs)
    state = "on" if enabled else "off (CDI_devices resolved from the library defaults)"
    if unread:
        return warn(f"enable_cdi is {state} and reads {', '.join(dirs)}, not "
                    f"{', '.join(unread)}: devices from there that the plugin hands to "
                    "containerd (additionalGids, permissions narrower than rw) fail with "
                    "'unresolvable CDI devices'",
                    fix=f'[plugins."{cfg.cri_section}"] enable_cdi = true and cdi_spec_dirs = '
                        f"{json.dumps([*dirs, *unread])}, or keep the plugin's specs in "
                        f"{', '.join(DEFAULT_SPEC_DIRS)}")
    how = ("injects devices named in container cdi.k8s.io annotations itself (the plugin "
           "leaves those to it) and " if enabled else "")
    return ok(f"enable_cdi is {state}; it {how}resolves handed-over devices from the "
              f"plugin's folders ({', '.join(dirs)})")


@named("spec kinds the runtime's CDI can load")
def check_kinds_runtimes_can_load(dirs: Iterable[str]) -> Check:
    """Every released CDI library (0.3.0 to 1.1.0) panics on a one-character vendor or
    class name (parser.validateVendorOrClassName slices name[1:len-1]; fixed upstream in
    e1a6596, unreleased): containerd with enable_cdi on then crashes at start, or on the
    next refresh of its spec folders."""
    bad = []
    for path, doc in _spec_documents(dirs):
        kind = str(doc.get("kind") or "")
        vendor, _, class_ = kind.partition("/")
        if len(vendor) == 1 or len(class_) == 1:
            bad.append(f"{path} (kind {kind!r})")
    if bad:
        return fail(f"one-character vendor or class in {'; '.join(sorted(bad)[:5])}: "
                    "containerd's and CRI-O's CDI library (<= 1.1.0) panics loading it",
                    fix="rename the kind (vendor and class at least two characters) and "
                        "regenerate; until then keep the file out of the runtime's folders")
    return ok("no kind with a one-character vendor or class")


DRA_CHECK = "DRA claims reach a CDI injector"
CLAIM_MARK = "-claim_"  # in the transient spec names NVIDIA's DRA driver writes


def claim_specs(dirs: Iterable[str]) -> list[str]:
    """Transient per-claim spec files of NVIDIA's DRA driver present now (extra detail: the
    registry of kubelet plugins is the sign that a DRA driver runs, whoever wrote it)."""
    return [path for folder in dirs
            for path in sorted(glob.glob(os.path.join(glob.escape(folder), f"*{CLAIM_MARK}*")))]


def _registry_detail(registry: Registry | None, place: Place) -> str:
    """What the kubelet's plugin registry says, for the detail."""
    if registry is None:
        return ""
    if registry.problem:
        if place.in_pod and not os.path.exists(registry.folder):
            return (f"the kubelet's plugin registry {registry.folder} is {NOT_VISIBLE} (the "
                    "pod does not mount it), so whether a DRA driver is registered is not "
                    "known here")
        return (f"the kubelet's plugin registry was not read ({registry.problem}), so whether "
                "a DRA driver is registered is not known")
    if registry.dra:
        names = sorted({p.name or os.path.basename(p.socket) for p in registry.dra})
        return f"DRA driver(s) registered with the kubelet: {', '.join(names)}"
    unknown = registry.unknown
    others = sorted({p.type for p in registry.plugins if p.type})
    parts = ["no DRA driver is registered with the kubelet"
             + (f" ({registry.folder} holds no registration socket)" if not registry.plugins
                else "")]
    if others:
        parts.append(f"other kubelet plugins: {', '.join(others)}")
    if unknown:
        shown = "; ".join(p.describe() for p in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        parts[0] = "no kubelet plugin said it is a DRA driver"
        parts.append(f"{len(unknown)} kubelet plugin(s) of unknown type, any of which may be "
                     f"one: {shown}{more}")
    return "; ".join(parts)


@named(DRA_CHECK)
def check_dra(cfg: ContainerdConfig, our_dirs: Iterable[str],
              registry: Registry | None = None, *,
              version: tuple[int, int, int] | None = None, place: Place = ON_NODE) -> Check:
    """ok with containerd's CDI on. With it off, CRI CDIDevices (all a kubelet >= 1.31 sends
    for a DRA claim) reach no CDI injector, nri-cdi included: a failure where a DRA driver is
    registered with the kubelet (its plugin registry, any vendor's) or NVIDIA's claim specs
    are present, a warning otherwise."""
    enabled, dirs = _runtime_cdi(cfg)
    our_dirs = list(our_dirs)
    seen = _registry_detail(registry, place)
    if enabled:
        return ok(f"enable_cdi is on: containerd injects CRI CDIDevices (DRA claims, the "
                  f"device plugin's cdi-cri) from {', '.join(dirs)}; the plugin checks "
                  "requirements, capabilities and policy on them"
                  + (f" ({seen})" if registry is not None and registry.dra else ""))
    claims = claim_specs(our_dirs)
    in_use = bool(registry is not None and registry.dra) or bool(claims)
    what = ("fail to be created (containerd 2.3 refuses CDIDevices with its CDI off)"
            if version is not None and version >= (2, 3, 0) else
            "start without those devices and without an error (containerd 2.3 and later "
            "refuse them instead)")
    signs = [seen] if seen else []
    if claims:
        signs.append(f"{len(claims)} DRA claim spec(s) present, e.g. {claims[0]}")
    return (fail if in_use else warn)(
        "broken for DRA: enable_cdi is off, so containerd does not inject CRI CDIDevices, "
        "which is all a kubelet >= 1.31 sends for a DRA claim (and the device plugin's "
        "cdi-cri), and no NRI plugin, nri-cdi included, can inject them instead: such "
        f"containers {what}" + (f"; {'; '.join(signs)}" if signs else ""),
        fix=f'in {cfg.path}: [plugins."{cfg.cri_section}"] enable_cdi = true and cdi_spec_dirs = '
            f'["/etc/cdi", "/var/run/cdi"] (the plugin\'s folders: {", ".join(our_dirs)}), '
            "then restart containerd; nri-cdi then checks the claims' devices (there is no "
            "nri-cdi setting that injects them instead)")


@named("plugin knows containerd's CDI")
def check_runtime_cdi_setting(cfg: ContainerdConfig, settings: Settings) -> Check:
    """The plugin's runtime_cdi settings agree with containerd's configuration."""
    enabled, dirs = _runtime_cdi(cfg)
    wanted = settings.runtime_cdi
    problems = []
    if wanted.enabled != "auto" and (wanted.enabled == "on") != enabled:
        effect = ("devices named in container cdi.k8s.io annotations are injected twice "
                  "(hooks run twice)" if enabled else "devices named in container "
                  "cdi.k8s.io annotations are left to containerd, which does not inject them")
        problems.append(f"runtime_cdi.enabled is {wanted.enabled} but containerd's "
                        f"enable_cdi is {'on' if enabled else 'off'}: {effect}")
    if wanted.spec_dirs is not None and enabled and _unread(wanted.spec_dirs, dirs):
        problems.append(f"runtime_cdi.spec_dirs is {', '.join(wanted.spec_dirs)} but "
                        f"containerd's cdi_spec_dirs is {', '.join(dirs)}")
    if problems:
        return fail("; ".join(problems),
                    fix="set runtime_cdi.enabled: auto and leave runtime_cdi.spec_dirs unset "
                        f"(the plugin then reads {cfg.path} when it starts)")
    origin = ("its own settings" if wanted.enabled != "auto" else
              cfg.read if cfg.data is not None else
              "containerd's defaults: its settings were not read" if why_unread(cfg) else
              f"containerd's defaults: it runs without {cfg.path}")
    known = wanted.enabled != "auto" or not why_unread(cfg)
    return ok(f"the plugin assumes enable_cdi {'on' if enabled else 'off'} (from {origin})"
              + (", as containerd has it" if known else ""))


# --- containerd >= 2.2: a required plugin (fail-closed by the runtime itself) ------------

REQUIRED_FROM = (2, 2, 0)  # NRI 0.10's default validator, built into containerd 2.2
# The docs' example key for tolerate_missing_plugins_annotation: the operator names it.
TOLERATE_EXAMPLE = "tolerate-missing-plugins.example.com"
# A release in ``containerd --version`` or the status file's runtime ("containerd 2.2.1").
_RELEASE = re.compile(r"\sv?(\d+)\.(\d+)\.(\d+)")


@named("plugin required by containerd")
def check_required_plugin(cfg: ContainerdConfig, plugin: PluginSettings,
                          version: tuple[int, int, int] | None, *,
                          place: Place = ON_NODE,
                          environ: Mapping[str, str] | None = None) -> Check:
    """Whether containerd (>= 2.2) requires the plugin, and then whether the plugin's own pod
    can be created while the plugin is absent (containerd/containerd internal/nri/config.go,
    containerd/nri plugins/default-validator). In the pod, ``TOLERATE_ENV`` (the chart sets
    it with the annotation) says which tolerate annotation the pod carries."""
    name, index = plugin.name, plugin.index
    section = f'[plugins."{NRI_SECTION}".default_validator]'
    fix = (f'in {cfg.path}: {section} enable = true, required_plugins = ["{name}"], '
           f'tolerate_missing_plugins_annotation = "{TOLERATE_EXAMPLE}" (containerd >= 2.2), '
           "and the chart value requiredPlugins.tolerateAnnotation set to that key")
    if cfg.error:
        return skip(f"cannot read {cfg.path}")
    validator = cfg.default_validator
    listed = bool({name, f"{index}-{name}"} & set(validator.required))
    if version is not None and version < REQUIRED_FROM:
        return ok(f"containerd {version[0]}.{version[1]} cannot require plugins (2.2+); the "
                  "plugin's own fail-closed checks apply")  # nothing to change on this release
    if validator.enabled and listed:
        return _required_tolerated(cfg, name, validator.tolerate_annotation, place,
                                   os.environ if environ is None else environ)
    if listed:
        return warn(f"required_plugins names {name} but the default validator is not "
                    "enabled: nothing is required", fix=fix)
    detail = f"{name} is not required: containers created while it is away run without it"
    if version is None:
        unknown = ("containerd's binary is not visible from the pod and the plugin's status "
                   "file names no runtime yet" if place.in_pod else "containerd's version "
                   "unknown")
        return skip(detail + f" ({unknown}; 2.2+ can require it)", fix=fix)
    return warn(detail, fix=fix)


def _required_tolerated(cfg: ContainerdConfig, name: str, key: str, place: Place,
                        environ: Mapping[str, str]) -> Check:
    """The plugin is required: can its own pod be created while it is absent?"""
    required = (f"{name} is required: containerd fails containers created while it is not "
                "connected (a required plugin that times out is still dropped: the plugin's "
                "own checks stay on)")
    if not key:
        return warn(f"{required}; but {cfg.path} sets no tolerate_missing_plugins_annotation, "
                    "so the plugin's own pod is refused too while the plugin is absent: an "
                    "install, a rollout or an eviction of the DaemonSet never completes",
                    fix=f'in {cfg.path}: tolerate_missing_plugins_annotation = '
                        f'"{TOLERATE_EXAMPLE}" beside required_plugins, and the chart value '
                        "requiredPlugins.tolerateAnnotation set to that key")
    value_fix = (f"set the chart value requiredPlugins.tolerateAnnotation={key} (the pod "
                 f'then carries {key}: "true")')
    if not place.in_pod:
        return ok(f'{required}; the plugin\'s pod must carry {key}: "true", which {cfg.path} '
                  f"names to tolerate a missing plugin ({value_fix}; doctor in the pod checks "
                  "it)")
    carried = environ.get(TOLERATE_ENV, "")
    if carried != key:
        has = (f"carries {carried} instead" if carried else
               f"carries no tolerate annotation ({TOLERATE_ENV} unset)")
        return warn(f"{required}; containerd tolerates the annotation {key}, and this pod "
                    f"{has}: the next install, rollout or eviction of the plugin's pod is "
                    "refused while the plugin is absent", fix=value_fix)
    return ok(f'{required}; this pod carries {key}: "true", which {cfg.path} names to '
              "tolerate a missing plugin")


# --- CRI-O's configuration -----------------------------------------------------------------

CRIO_DROP_IN = "a file in CRI-O's drop-in folder ({folder}, e.g. 99-nri-cdi.conf)"


@named("CRI-O's settings")
def check_crio_config(cfg: CrioConfig) -> Check:
    """Whether CRI-O's settings were read, from which files."""
    if cfg.error:
        return warn(f"not read ({cfg.error}); the checks below and the plugin assume CRI-O's "
                    "defaults: NRI on at /var/run/nri/nri.sock, its own CDI reading /etc/cdi "
                    "and /var/run/cdi",
                    fix="fix the file (CRI-O would not start with it either)")
    return ok(f"read {cfg.describe_files()} ({cfg.source})")


@named("NRI enabled in CRI-O")
def check_crio_nri(cfg: CrioConfig, our_socket: str) -> Check:
    """NRI on, connections allowed, on the plugin's socket; the plugin timeouts said."""
    fix = CRIO_DROP_IN.format(folder=cfg.drop_in_dir) + ": [crio.nri] {what}, then restart crio"
    if not cfg.nri_enabled:
        return fail("[crio.nri] enable_nri = false", fix=fix.format(what="enable_nri = true"))
    if cfg.nri_disable_connections:
        return fail("[crio.nri] nri_disable_connections = true: an external plugin cannot "
                    "connect", fix=fix.format(what="nri_disable_connections = false"))
    if not same_path(cfg.nri_socket, our_socket):
        return fail(f"CRI-O serves NRI at {cfg.nri_socket}, the plugin connects to "
                    f"{our_socket}", fix=f"plugin.socket: {cfg.nri_socket} (or --socket)")
    return ok(f"on, at {cfg.nri_socket}; CRI-O waits {cfg.registration_timeout:g} s for a "
              f"plugin to register and {cfg.request_timeout:g} s for each answer "
              "(nri_plugin_request_timeout), then goes on without the plugin")


@named("CRI-O's own CDI")
def check_crio_cdi(cfg: CrioConfig, our_dirs: Iterable[str]) -> Check:
    """CRI-O resolves every container cdi.k8s.io annotation itself (no setting turns that
    off), before NRI: a folder of the plugin's that CRI-O does not read fails those
    containers (the device plugin's cdi-annotations, cdi-cri and DRA claims all arrive so)."""
    unread = _unread(our_dirs, cfg.cdi_spec_dirs)
    if unread:
        return fail(f"cdi_spec_dirs is {', '.join(cfg.cdi_spec_dirs)}, not {', '.join(unread)}"
                    ": CRI-O resolves every container cdi.k8s.io annotation, CRI CDIDevices "
                    "and DRA claim itself and fails the container with 'unresolvable CDI "
                    "devices' for a device only the plugin's folders hold",
                    fix=CRIO_DROP_IN.format(folder=cfg.drop_in_dir) + ": [crio.runtime] "
                        f"cdi_spec_dirs = {json.dumps([*cfg.cdi_spec_dirs, *unread])}")
    return ok(f"always on; reads the plugin's folders ({', '.join(cfg.cdi_spec_dirs)}): "
              "CRI-O injects container cdi.k8s.io annotations and CDIDevices itself, the "
              "plugin serves pod annotations and env requests and trims what it serves")


# --- the command ---------------------------------------------------------------------------


def running_containerd_version(binary: str | None,
                               plugin: PluginSettings) -> tuple[int, int, int] | None:
    """containerd's release: its binary's ``--version`` (``binary``, else PATH's), else what
    the plugin's status file says it connected to (a pod does not see the node's binary)."""
    exe = binary or shutil.which("containerd")
    said = ""
    if exe:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            said = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                  timeout=10, check=False).stdout
    if not _RELEASE.search(said) and plugin.status_dir:
        status = read_status(plugin.status_dir, plugin.name, plugin.index).status
        said = status.runtime if status and status.runtime.startswith("containerd ") else ""
    match = _RELEASE.search(said)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


@named("where doctor runs")
def check_place(place: Place) -> Check:
    return ok(f"in a pod ({place.why}): it sees the node only through the pod's mounts; a "
              f"check that needs more says '{NOT_VISIBLE}'")


def run_checks(settings: Settings, *, check_generated: bool = True,
               place: Place | None = None) -> list[Check]:
    """Every check, for containerd or for CRI-O (the runtime's own checks of its
    configuration first, of its CDI after the device nodes)."""
    plugin = settings.plugin
    place = detect() if place is None else place
    registry = read_registry(settings.doctor.plugin_registry)
    crio = crio_serving(settings)
    if crio is not None:
        config = [check_crio_config(crio), check_crio_nri(crio, plugin.socket)]
        cdi = [check_crio_cdi(crio, plugin.spec_dirs),
               check_kinds_runtimes_can_load(plugin.spec_dirs)]
    else:
        found = locate(settings.runtime_cdi.containerd_config, plugin.socket)
        version = running_containerd_version(found.exe, plugin)  # the running one's
        cfg = found.read(version[0] if version else None)
        config = [check_containerd_config(cfg, place), check_nri_enabled(cfg, plugin.socket, place)]
        cdi = [check_native_cdi(cfg, plugin.spec_dirs), check_runtime_cdi_setting(cfg, settings),
               check_kinds_runtimes_can_load(plugin.spec_dirs),
               check_required_plugin(cfg, plugin, version, place=place),
               check_dra(cfg, plugin.spec_dirs, registry, version=version, place=place)]
    health = health_url(settings)
    checks = [check_place(place)] if place.in_pod else []
    checks += [*config, check_socket(plugin.socket, place),
               check_plugin(plugin, health=health, place=place)]
    if health:
        checks.append(check_health(health))
    checks.append(check_spec_dirs(plugin.spec_dirs, place))
    if check_generated:
        checks.append(check_fingerprint(settings, place))
    return [*checks, check_device_nodes(plugin.spec_dirs), *cdi,
            check_kubelet_allocations(plugin, registry),
            check_driver_architecture(plugin.spec_dirs, place)]


@named("kubelet allocations")
def check_kubelet_allocations(plugin: PluginSettings, registry: Registry) -> Check:
    """Whether the plugin can read who holds which device (the kubelet's pod-resources
    API), as it needs to refuse a device asked for by annotation that another pod holds."""
    path = plugin.pod_resources_socket
    if not path:
        return skip("plugin.pod_resources_socket is \"\": devices asked for by annotation are "
                    "not checked against other pods'")
    watch = PodResourcesWatch(path, plugin.pod_resources_interval)
    try:
        watch.read_once()
        allocations = watch.current()
    finally:
        watch.stop()
    if allocations is None:
        if not registry.problem:  # a kubelet runs here, with its folders elsewhere
            return warn(f"no {path}, but the kubelet's plugin registry is at "
                        f"{registry.folder}: devices asked for by annotation are not checked "
                        "against other pods'",
                        fix="set plugin.pod_resources_socket to the socket under the "
                            "kubelet's --root-dir (pod-resources/kubelet.sock)")
        return ok(f"no {path}: no kubelet on this node, nothing to check")
    if allocations.unknown:
        return fail(allocations.unknown,
                    fix="the plugin refuses devices asked for by annotation until the kubelet "
                        "answers: check the kubelet, and that the plugin has the kubelet "
                        "extra (grpcio)")
    pods = {h.pod for h in allocations.holdings}
    return ok(f"{path} answers: {len(allocations.holdings)} allocation(s) held by "
              f"{len(pods)} pod(s)")


def render(checks: Iterable[Check]) -> str:
    lines = []
    for c in checks:
        lines.append(f"[{_MARK[c.status]}] {c.name}: {c.detail}")
        if c.fix and c.status != "ok":
            lines.append(f"       fix: {c.fix}")
    return "\n".join(lines) + "\n"


def add_commands(subparsers: Any) -> None:
    parser = subparsers.add_parser("doctor", help="check the node set-up; say what to fix")
    add_config_argument(parser)
    add_setting_flags(parser, "runtime_cdi.containerd_config", "doctor.health_url",
                      "doctor.plugin_registry",
                      "plugin.socket", "plugin.spec_dirs", "plugin.status_dir",
                      "plugin.pod_resources_socket")
    parser.add_argument("--no-generate", dest="check_generated", action="store_false",
                        help="skip the fingerprint check (it runs the generator)")
    parser.add_argument("--json", action="store_true", help="JSON output")
    parser.add_argument("--e2e", nargs=argparse.REMAINDER, metavar="FLAG",
                        help="run a throwaway GPU container on this node (from a checkout); "
                             "the flags after --e2e are its own: doctor --e2e --help")
    parser.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.e2e is not None:  # the node check: the test bed's, which the wheel does not carry
        try:
            from nri_cdi_testbed.node_check import check  # here: only --e2e needs it
        except ModuleNotFoundError as exc:
            if exc.name not in ("nri_cdi_testbed", "nri_cdi_testbed.node_check"):
                raise  # the test bed is there but something it needs is not
            print("nri-cdi doctor --e2e: needs the test bed (nri_cdi_testbed), which the "
                  "installed package does not carry: run `python3 -m nri_plugin.ops.cli doctor "
                  "--e2e` in a checkout of the nri-cdi repository", file=sys.stderr)
            return 2
        return check.main(args.e2e, json_output=args.json, socket=getattr(args, "plugin.socket"))
    settings = command_settings(args, "doctor")
    if settings is None:
        return 2
    checks = run_checks(settings, check_generated=args.check_generated)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print(render(checks), end="")
    return 1 if any(c.status == "fail" for c in checks) else 0
