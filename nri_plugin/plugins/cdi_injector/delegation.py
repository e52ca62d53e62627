"""Handing devices to the runtime's own CDI (``ContainerAdjustment.CDI_devices``). Pure. Its
failure there names no cause, so the plugin checks ahead that the runtime's CDI reads the
spec's folder and ``cdiVersion``, and refuses with the cause.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from cdi.cache import Device
from cdi.dirs import DEFAULT_SPEC_DIRS
from cdi.version import parse_version
from nri_plugin.nri.versions import CDI_OFF, UNKNOWN_DIRS, NativeCdi, Reach, RuntimeInfo, SpecDirs

LIBRARY_DEFAULT_DIRS = DEFAULT_SPEC_DIRS  # containerd's defaults too


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeCdiConfig:
    """What the runtime's configuration says about its own CDI support: ``enabled``
    (containerd enable_cdi; UNKNOWN: the version's default), ``spec_dirs`` (cdi_spec_dirs),
    where they were read (``origin``) or why not (``unread``: the values are assumed)."""

    enabled: NativeCdi = NativeCdi.UNKNOWN
    spec_dirs: SpecDirs = UNKNOWN_DIRS
    origin: str = "not configured"
    unread: str = ""

    def applied_to(self, runtime: RuntimeInfo) -> RuntimeInfo:
        """``runtime`` with the folders its CDI resolves CDI_devices from and whether it
        injects annotations itself. containerd >= 2.1 resolves CDI_devices with the CDI
        library's default cache when enable_cdi is off; 1.7.30+ refuses them then."""
        on = (runtime.native_cdi_on_by_default if self.enabled is NativeCdi.UNKNOWN
              else self.enabled is NativeCdi.ON)
        dirs = self.spec_dirs
        if not on and runtime.is_containerd and runtime.version is not None:
            dirs = SpecDirs.of(LIBRARY_DEFAULT_DIRS) if runtime.version >= (2, 0, 0) else CDI_OFF
        return dataclasses.replace(runtime, native_cdi=NativeCdi.ON if on else NativeCdi.OFF,
                                   cdi_spec_dirs=dirs)

    def describe(self, runtime: RuntimeInfo) -> str:
        applied = self.applied_to(runtime)
        folders = applied.cdi_spec_dirs.describe()
        what = (f"runtime's own CDI {applied.native_cdi.value}, resolves "
                f"CDI_devices from {folders} ({self.origin})")
        if self.unread:  # an assumption, said as one
            return f"the runtime's settings were not read ({self.unread}); assuming {what}"
        return what


def visible_to_runtime(spec_path: str, runtime: RuntimeInfo) -> bool:
    """Whether the runtime's CDI reads the folder ``spec_path`` is in (unknown: assume so)."""
    dirs = runtime.cdi_spec_dirs
    if dirs.reach is Reach.UNKNOWN:
        return True
    folder = _norm(os.path.dirname(spec_path))
    return any(folder == _norm(d) for d in dirs.folders)


def _norm(path: str) -> str:
    # /var/run is a link to /run on current distributions.
    return re.sub(r"^/var/run(?=/|$)", "/run", os.path.normpath(path))


def delegation_problems(devices: Iterable[Device], runtime: RuntimeInfo) -> list[str]:
    """Why the runtime's own CDI would fail to resolve these devices (empty: it would not)."""
    problems = []
    newest = runtime.max_spec_version
    for device in devices:
        spec = device.spec
        version = parse_version(spec.data.cdi_version)
        if newest is not None and version is not None and version > newest:
            problems.append(
                f"{device.qualified_name}: its spec {spec.path} is cdiVersion "
                f"{spec.data.cdi_version}, and {runtime.describe_cdi()} of "
                f"{runtime.describe()} reads up to {'.'.join(map(str, newest))}")
        if runtime.cdi_spec_dirs.reach is Reach.OFF:
            problems.append(
                f"{device.qualified_name}: the runtime's own CDI is off ({runtime.describe()} "
                "resolves CDI_devices only with enable_cdi = true)")
        elif not visible_to_runtime(spec.path, runtime):
            problems.append(
                f"{device.qualified_name}: its spec {spec.path} is not in a folder the "
                f"runtime's own CDI reads ({runtime.cdi_spec_dirs.describe()}); "
                "share the folder (containerd: cdi_spec_dirs, or the defaults /etc/cdi and "
                "/var/run/cdi) and set runtime_cdi.spec_dirs to match")
    return problems
