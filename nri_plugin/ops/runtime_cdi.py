"""Reading the runtime's own CDI set-up (containerd's or CRI-O's configuration) for the
plugin, and the warning it logs where that set-up leaves DRA claims without devices.

Done once when the plugin starts (never on the request path). ``runtime_cdi.enabled`` and
``runtime_cdi.spec_dirs`` in the plugin's settings win over the file. What containerd's
files say is a fact; where they were not read (no file, a file that cannot be read, one
that cannot be known without containerd's version), the plugin says so and what it assumes
instead: containerd's defaults for the version that connects.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import TYPE_CHECKING

from nri_plugin.nri.versions import UNKNOWN_DIRS, NativeCdi, RuntimeInfo, SpecDirs
from nri_plugin.ops.containerd_config import ContainerdConfig, locate
from nri_plugin.ops.crio_config import CrioConfig, locate_crio
from nri_plugin.plugins.cdi_injector.delegation import LIBRARY_DEFAULT_DIRS, RuntimeCdiConfig

if TYPE_CHECKING:
    from nri_plugin.ops.settings import RuntimeCdiSettings, Settings

log = logging.getLogger("nri_cdi")


def cri_cdi_settings(cfg: ContainerdConfig) -> tuple[NativeCdi, tuple[str, ...]]:
    """(enable_cdi, UNKNOWN when unset or unread; cdi_spec_dirs or the defaults)."""
    section = cfg.plugin(cfg.cri_section)
    enabled = section.get("enable_cdi")
    dirs = section.get("cdi_spec_dirs")
    return (NativeCdi.UNKNOWN if not isinstance(enabled, bool) else
            NativeCdi.ON if enabled else NativeCdi.OFF,
            tuple(str(d) for d in dirs) if isinstance(dirs, list) and dirs
            else LIBRARY_DEFAULT_DIRS)


def why_unread(cfg: ContainerdConfig) -> str:
    """Why containerd's settings were not read ("" when they were, or when the running
    containerd itself has no file: its defaults are then a fact)."""
    if cfg.error:
        return cfg.error if cfg.path in cfg.error else f"{cfg.path}: {cfg.error}"
    if cfg.data is None and not cfg.running:
        return f"no {cfg.path}; {cfg.source}"
    return ""


def crio_serving(settings: Settings) -> CrioConfig | None:
    """The CRI-O whose files the plugin and doctor read: one running and serving the
    plugin's socket, or, with no containerd configuration named, running or on the node
    either, CRI-O's files where a node keeps them."""
    if settings.runtime_cdi.containerd_config:
        return None
    found = locate_crio(settings.plugin.socket)
    if found is None or found.pid is not None:
        return found
    containerd = locate(None, settings.plugin.socket)
    return None if containerd.exe is not None or os.path.exists(containerd.path) else found


def crio_cdi_config(cfg: CrioConfig) -> RuntimeCdiConfig:
    """CRI-O's own CDI as its files say: always on (no setting turns it off), reading
    ``cdi_spec_dirs``; CRI-O's defaults where the files could not be read."""
    origin = f"CRI-O's own CDI is always on; read from {cfg.describe_files()} ({cfg.source})"
    if cfg.error:  # cdi_spec_dirs is then CRI-O's default
        log.warning("CRI-O's settings were not read (%s); assuming CRI-O's defaults: its "
                    "own CDI on, reading %s. Set runtime_cdi.spec_dirs to CRI-O's "
                    "cdi_spec_dirs", cfg.error, ", ".join(cfg.cdi_spec_dirs))
        origin = "CRI-O's defaults"
    return RuntimeCdiConfig(enabled=NativeCdi.ON, spec_dirs=SpecDirs.of(cfg.cdi_spec_dirs),
                            origin=origin, unread=cfg.error or "")


def runtime_cdi_config(settings: Settings) -> RuntimeCdiConfig:
    wanted = settings.runtime_cdi
    if wanted.enabled != "auto" and wanted.spec_dirs is not None:
        return RuntimeCdiConfig(enabled=NativeCdi(wanted.enabled),
                                spec_dirs=SpecDirs.of(wanted.spec_dirs),
                                origin="runtime_cdi.enabled and runtime_cdi.spec_dirs set")
    crio = crio_serving(settings)
    if crio is not None:
        return _overridden(crio_cdi_config(crio), wanted)
    # The file the settings name, else the one the running containerd serving
    # plugin.socket was started with, else the default path.
    cfg = locate(settings.runtime_cdi.containerd_config, settings.plugin.socket).read(None)
    unread = why_unread(cfg)
    enabled, folders = cri_cdi_settings(cfg)  # no data when unread: UNKNOWN
    dirs = UNKNOWN_DIRS if unread else SpecDirs.of(folders)
    if unread and settings.runtime_cdi.containerd_config:
        origin = "containerd's defaults for its version"
        log.warning("containerd's settings were not read (%s); assuming containerd's "
                    "defaults for the version that connects. Name the file with "
                    "runtime_cdi.containerd_config, or set runtime_cdi.enabled and "
                    "runtime_cdi.spec_dirs", unread)
    elif unread:
        origin = "the defaults of the runtime that connects"
        log.warning("the runtime's settings were not read (containerd's: %s; no CRI-O "
                    "configuration either); assuming the defaults of the runtime that "
                    "connects (containerd: by its version; CRI-O: its own CDI always on). "
                    "Name containerd's file with runtime_cdi.containerd_config, or set "
                    "runtime_cdi.enabled and runtime_cdi.spec_dirs", unread)
    elif cfg.data is None:
        origin = f"containerd's defaults: {cfg.source} runs without {cfg.path}"
    else:
        origin = f"read from {cfg.read}"
    return _overridden(RuntimeCdiConfig(enabled=enabled, spec_dirs=dirs, origin=origin,
                                        unread=unread), wanted)


def _overridden(found: RuntimeCdiConfig, wanted: RuntimeCdiSettings) -> RuntimeCdiConfig:
    """``found`` with what the plugin's settings set themselves."""
    if wanted.enabled != "auto":
        found = replace(found, enabled=NativeCdi(wanted.enabled),
                        origin=f"{found.origin}; runtime_cdi.enabled set")
    if wanted.spec_dirs is not None:
        found = replace(found, spec_dirs=SpecDirs.of(wanted.spec_dirs),
                        origin=f"{found.origin}; runtime_cdi.spec_dirs set")
    return found


def start_warning(runtime: RuntimeInfo) -> str | None:
    """What the plugin logs once it knows the runtime: with containerd's own CDI off, the
    CRI CDIDevices a kubelet >= 1.31 sends for a DRA claim reach no plugin
    (docs/developer/kubernetes-allocation.md); None when that is not the case."""
    if runtime.native_cdi is not NativeCdi.OFF or not runtime.is_containerd:
        return None  # (CRI-O's CDI cannot be switched off)
    refuses = runtime.version is not None and runtime.version >= (2, 3, 0)
    what = ("fail to be created (containerd refuses CDIDevices with its CDI off)" if refuses
            else "start without their devices")
    return (f"{runtime.describe()} with its own CDI off: CRI CDIDevices (DRA claims from "
            "kubelet >= 1.31, the device plugin's cdi-cri) reach neither the runtime nor this "
            f"plugin, so those containers {what}; set enable_cdi = true "
            "and cdi_spec_dirs to the plugin's folders in containerd's CRI config "
            "(nri-cdi doctor shows the lines)")
