"""What the connected runtime can do, from the name and version it sends in Configure: its
NRI and CDI library versions looked up by release (docs/developer/nri-protocol.md §5,
docs/reference/runtime-cdi.md). Pure.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass

# The one table of which CDI library each runtime links (the generator reads it too); pure
# data, the one module of cdi the runtime imports.
from cdi.runtimes import Version as Version
from cdi.runtimes import library_of, newest_spec_version

# Where a runtime serves NRI unless configured otherwise (docs/developer/nri-protocol.md).
DEFAULT_SOCKET_PATH = "/var/run/nri/nri.sock"
# What a runtime that launches a plugin from its plugin_path puts in the plugin's (otherwise
# empty) environment: its name, its two-digit index, and the connected socket's fd.
PLUGIN_NAME_ENV = "NRI_PLUGIN_NAME"
PLUGIN_IDX_ENV = "NRI_PLUGIN_IDX"
PLUGIN_SOCKET_ENV = "NRI_PLUGIN_SOCKET"

# (first runtime release, NRI version it vendors), newest first per runtime.
_CONTAINERD_NRI: tuple[tuple[Version, Version], ...] = (
    ((2, 3, 0), (0, 12, 0)), ((2, 2, 1), (0, 11, 0)), ((2, 2, 0), (0, 10, 0)),
    ((2, 0, 0), (0, 8, 0)), ((1, 7, 26), (0, 8, 0)), ((1, 7, 16), (0, 6, 1)),
    ((1, 7, 14), (0, 6, 0)), ((1, 7, 7), (0, 4, 0)), ((1, 7, 0), (0, 3, 0)),
)
_CRIO_NRI: tuple[tuple[Version, Version], ...] = (
    ((1, 37, 0), (0, 12, 0)), ((1, 35, 0), (0, 11, 0)), ((1, 34, 0), (0, 10, 0)),
    ((1, 32, 0), (0, 9, 0)), ((1, 31, 0), (0, 6, 1)), ((1, 30, 0), (0, 6, 0)),
    ((1, 29, 0), (0, 5, 0)), ((1, 27, 0), (0, 3, 0)), ((1, 26, 0), (0, 2, 0)),
)

_NRI = {"containerd": _CONTAINERD_NRI, "cri-o": _CRIO_NRI, "crio": _CRIO_NRI}


def parse_runtime_version(text: str) -> Version | None:
    """``v1.7.24``, ``1.7.24~ds1`` or ``2.1.0-rc.1`` → (1, 7, 24); None if there is none."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


class NativeCdi(enum.Enum):
    """Whether the runtime's own CDI injects container ``cdi.k8s.io/`` annotations (and CRI
    CDIDevices) before NRI (containerd enable_cdi)."""

    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"  # not read: annotations are not assumed injected by the runtime


class Reach(enum.Enum):
    """What is known of the folders a runtime's own CDI resolves devices from."""

    UNKNOWN = "unknown"  # not read: assumed to see every spec folder
    OFF = "off"  # its CDI is off: it resolves no device handed to it
    FOLDERS = "folders"  # these folders


@dataclass(frozen=True, slots=True)
class SpecDirs:
    """The folders the runtime's own CDI reads: ``UNKNOWN_DIRS``, ``CDI_OFF`` or
    ``SpecDirs.of(folders)``, told apart by ``reach`` (never by None or emptiness)."""

    reach: Reach
    folders: tuple[str, ...] = ()

    @classmethod
    def of(cls, folders: Iterable[str]) -> SpecDirs:
        return cls(Reach.FOLDERS, tuple(folders))

    def describe(self) -> str:
        if self.reach is Reach.UNKNOWN:
            return "unknown folders"
        return ", ".join(self.folders) or "no folders"


UNKNOWN_DIRS = SpecDirs(Reach.UNKNOWN)
CDI_OFF = SpecDirs(Reach.OFF)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeInfo:
    name: str = ""
    version: Version | None = None
    nri_version: Version | None = None
    cdi_version: Version | None = None  # the CDI library of the runtime's own CDI support
    # The folders the runtime's own CDI reads (the plugin's runtime_cdi.spec_dirs setting);
    # unknown: delegated devices are assumed visible.
    cdi_spec_dirs: SpecDirs = UNKNOWN_DIRS
    # Whether the runtime's own CDI injects container cdi.k8s.io annotations before NRI.
    native_cdi: NativeCdi = NativeCdi.UNKNOWN

    @classmethod
    def from_configure(cls, name: str, version: str, nri_version: str = "") -> RuntimeInfo:
        parsed = parse_runtime_version(version)
        # Sent from NRI v0.12.0 on; before it, the newest row the release has reached.
        nri = parse_runtime_version(nri_version) if nri_version else next(
            (nri for first, nri in _NRI.get(name, ()) if parsed and parsed >= first), None)
        return cls(name=name, version=parsed, nri_version=nri,
                   cdi_version=library_of(name, parsed))

    @property
    def is_containerd(self) -> bool:
        return self.name == "containerd"

    @property
    def is_crio(self) -> bool:
        return self.name in ("cri-o", "crio")

    @property
    def supports_cdi_devices(self) -> bool:
        """Whether ``ContainerAdjustment.CDI_devices`` is acted on: containerd 2.1+ and
        1.7.30+ (backport), CRI-O 1.34+ (docs/developer/nri-protocol.md §5.2). Older runtimes ignore
        it silently, so we must know."""
        v = self.version
        if v is None:
            return False
        if self.is_containerd:
            return v >= (2, 1, 0) or (1, 7, 30) <= v < (2, 0, 0)
        return self.is_crio and v >= (1, 34, 0)

    @property
    def native_fills_file_mode(self) -> bool:
        """Whether the runtime's own CDI fills an unset device-node fileMode from the host
        node (CDI v1.1.0+). When it does not, runc creates the node 0666. Unknown runtimes:
        True, the current library's behaviour (and never wider than the host node)."""
        return self.cdi_version is None or self.cdi_version >= (1, 1, 0)

    @property
    def native_mount_order_by_name(self) -> bool:
        """Whether the runtime's own CDI sorts mounts by (depth, name), as NRI does with
        every adjustment that has mounts (CDI before v1.0.0; from v1.0.0 by depth only,
        stably)."""
        return self.cdi_version is not None and self.cdi_version < (1, 0, 0)

    @property
    def max_spec_version(self) -> Version | None:
        """The newest cdiVersion the runtime's own CDI library reads (its major.minor.0)."""
        return newest_spec_version(self.cdi_version) if self.cdi_version else None

    @property
    def native_cdi_on_by_default(self) -> bool:
        """containerd 2.x turns enable_cdi on by default (1.7: off); CRI-O always has it."""
        if self.is_crio:
            return True
        return self.is_containerd and self.version is not None and self.version >= (2, 0, 0)

    @property
    def supports_rdt_and_net_devices(self) -> bool:
        return self.nri_version is not None and self.nri_version >= (0, 11, 0)

    def describe(self) -> str:
        version = ".".join(map(str, self.version)) if self.version else "unknown version"
        nri = ".".join(map(str, self.nri_version)) if self.nri_version else "unknown"
        return f"{self.name or 'unknown runtime'} {version} (NRI {nri})"

    def describe_cdi(self) -> str:
        """The runtime's own CDI library, for messages."""
        if self.cdi_version is None:
            return f"{self.name or 'the runtime'}'s CDI library (version unknown)"
        return f"{self.name}'s CDI library {'.'.join(map(str, self.cdi_version))}"

