"""Which CDI library each container runtime links, and so the newest ``cdiVersion`` its own
CDI reads (docs/reference/runtime-cdi.md): the one table of it, read by the generator's
``--cdi-version RUNTIME`` and by the plugin's view of the connected runtime
(``nri_plugin.nri.versions``). Pure data and lookups, standard library only.
"""

from __future__ import annotations

Version = tuple[int, int, int]

# (first runtime release, container-device-interface version in its go.mod), newest first.
# Distribution builds may link another version, on the same side of 1.0.0 and 1.1.0, where
# the behaviours change (docs/reference/runtime-cdi.md).
_CONTAINERD: tuple[tuple[Version, Version], ...] = (
    ((2, 2, 1), (1, 1, 0)), ((2, 1, 0), (1, 0, 1)), ((2, 0, 5), (1, 0, 0)),
    ((2, 0, 3), (0, 8, 1)), ((2, 0, 0), (0, 8, 0)), ((1, 7, 27), (0, 8, 1)),
    ((1, 7, 16), (0, 7, 2)), ((1, 7, 13), (0, 6, 2)), ((1, 7, 12), (0, 6, 1)),
    ((1, 7, 0), (0, 5, 4)),
)
_CRIO: tuple[tuple[Version, Version], ...] = (
    ((1, 35, 0), (1, 1, 0)), ((1, 33, 0), (1, 0, 1)), ((1, 32, 2), (0, 8, 1)),
    ((1, 31, 0), (0, 8, 0)), ((1, 30, 0), (0, 7, 2)), ((1, 29, 0), (0, 6, 2)),
    ((1, 28, 0), (0, 6, 0)), ((1, 27, 0), (0, 5, 4)), ((1, 26, 0), (0, 5, 3)),
)
RELEASES: dict[str, tuple[tuple[Version, Version], ...]] = {
    "containerd": _CONTAINERD, "cri-o": _CRIO, "crio": _CRIO}


def library_of(runtime: str, version: Version | None) -> Version | None:
    """The CDI library release ``version`` of ``runtime`` links; None when not known."""
    if version is None:
        return None
    for first_release, library in RELEASES.get(runtime, ()):
        if version >= first_release:
            return library
    return None


def newest_spec_version(library: Version) -> Version:
    """The newest cdiVersion a CDI library reads: its major.minor.0."""
    return library[0], library[1], 0


# The builds ``generate --cdi-version`` takes by name, each with the library it links, read
# from Debian's binaries (the newest version check each library has): Debian's containerd
# 1.7.24 links 0.8, not the 0.7 of that release's go.mod; podman has no table above.
BUILDS: dict[str, Version] = {
    "podman-4.3": (0, 5, 0),
    "containerd-1.7.24": (0, 8, 0),
    "containerd-2.1.9": library_of("containerd", (2, 1, 9)) or (1, 0, 1),
}
