"""What the connected runtime can do, from the name and version it sends in Configure.

Pure. The NRI version a runtime vendors is not on the wire before NRI 0.12, so it is
looked up from the runtime's release (facts: nri-protocol.md §5.1, §5.2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

Version = tuple[int, int, int]

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


def parse_version(text: str) -> Version | None:
    """``v1.7.24``, ``1.7.24~ds1`` or ``2.1.0-rc.1`` → (1, 7, 24); None if there is none."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeInfo:
    name: str = ""
    version: Version | None = None
    nri_version: Version | None = None

    @classmethod
    def from_configure(cls, name: str, version: str, nri_version: str = "") -> RuntimeInfo:
        parsed = parse_version(version)
        nri = parse_version(nri_version) if nri_version else _nri_of(name, parsed)
        return cls(name=name, version=parsed, nri_version=nri)

    @property
    def is_containerd(self) -> bool:
        return self.name == "containerd"

    @property
    def is_crio(self) -> bool:
        return self.name in ("cri-o", "crio")

    @property
    def supports_cdi_devices(self) -> bool:
        """Whether ``ContainerAdjustment.CDI_devices`` is acted on (§5.2): containerd 2.1+ and
        1.7.30+ (backport), CRI-O 1.34+. Older runtimes ignore it silently, so we must know."""
        v = self.version
        if v is None:
            return False
        if self.is_containerd:
            return v >= (2, 1, 0) or (1, 7, 30) <= v < (2, 0, 0)
        return self.is_crio and v >= (1, 34, 0)

    @property
    def supports_rdt_and_net_devices(self) -> bool:
        return self.nri_version is not None and self.nri_version >= (0, 11, 0)

    def describe(self) -> str:
        version = ".".join(map(str, self.version)) if self.version else "unknown version"
        nri = ".".join(map(str, self.nri_version)) if self.nri_version else "unknown"
        return f"{self.name or 'unknown runtime'} {version} (NRI {nri})"


def _nri_of(name: str, version: Version | None) -> Version | None:
    table = _CONTAINERD_NRI if name == "containerd" else _CRIO_NRI if name in (
        "cri-o", "crio") else ()
    if version is None:
        return None
    for first_release, nri in table:
        if version >= first_release:
            return nri
    return None
