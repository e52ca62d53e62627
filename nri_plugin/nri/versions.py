"""What the connected runtime can do, from the name and version it sends in Configure: its
NRI and CDI library versions looked up by release (docs/developer/nri-protocol.md §5,
docs/reference/runtime-cdi.md). Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

Version = tuple[int, int, int]

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

# (first runtime release, container-device-interface version in its go.mod), newest first.
# Distribution builds may link another version, on the same side of 1.0.0 and 1.1.0, where
# the behaviours change (docs/reference/runtime-cdi.md).
_CONTAINERD_CDI: tuple[tuple[Version, Version], ...] = (
    ((2, 2, 1), (1, 1, 0)), ((2, 1, 0), (1, 0, 1)), ((2, 0, 5), (1, 0, 0)),
    ((2, 0, 3), (0, 8, 1)), ((2, 0, 0), (0, 8, 0)), ((1, 7, 27), (0, 8, 1)),
    ((1, 7, 16), (0, 7, 2)), ((1, 7, 13), (0, 6, 2)), ((1, 7, 12), (0, 6, 1)),
    ((1, 7, 0), (0, 5, 4)),
)
_CRIO_CDI: tuple[tuple[Version, Version], ...] = (
    ((1, 35, 0), (1, 1, 0)), ((1, 33, 0), (1, 0, 1)), ((1, 32, 2), (0, 8, 1)),
    ((1, 31, 0), (0, 8, 0)), ((1, 30, 0), (0, 7, 2)), ((1, 29, 0), (0, 6, 2)),
    ((1, 28, 0), (0, 6, 0)), ((1, 27, 0), (0, 5, 4)), ((1, 26, 0), (0, 5, 3)),
)
_NRI = {"containerd": _CONTAINERD_NRI, "cri-o": _CRIO_NRI, "crio": _CRIO_NRI}
_CDI = {"containerd": _CONTAINERD_CDI, "cri-o": _CRIO_CDI, "crio": _CRIO_CDI}


def parse_runtime_version(text: str) -> Version | None:
    """``v1.7.24``, ``1.7.24~ds1`` or ``2.1.0-rc.1`` → (1, 7, 24); None if there is none."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


class NativeCdi(Enum):
    """Whether the runtime's own CDI injects container ``cdi.k8s.io/`` annotations (and CRI
    CDIDevices) before NRI (containerd enable_cdi)."""

    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"  # not read: annotations are not assumed injected by the runtime


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeInfo:
    name: str = ""
    version: Version | None = None
    nri_version: Version | None = None
    cdi_version: Version | None = None  # the CDI library of the runtime's own CDI support
    # The folders the runtime's own CDI reads (the plugin's runtime_cdi.spec_dirs setting);
    # None: not known, delegated devices are assumed visible.
    cdi_spec_dirs: tuple[str, ...] | None = None
    # Whether the runtime's own CDI injects container cdi.k8s.io annotations before NRI.
    native_cdi: NativeCdi = NativeCdi.UNKNOWN

    @classmethod
    def from_configure(cls, name: str, version: str, nri_version: str = "") -> RuntimeInfo:
        parsed = parse_runtime_version(version)
        nri = (parse_runtime_version(nri_version) if nri_version
               else _lookup(_NRI.get(name, ()), parsed))
        return cls(name=name, version=parsed, nri_version=nri,
                   cdi_version=_lookup(_CDI.get(name, ()), parsed))

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
        return (self.cdi_version[0], self.cdi_version[1], 0) if self.cdi_version else None

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


def _lookup(table: tuple[tuple[Version, Version], ...],
            version: Version | None) -> Version | None:
    if version is None:
        return None
    for first_release, value in table:
        if version >= first_release:
            return value
    return None
