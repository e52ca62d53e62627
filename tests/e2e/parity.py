"""What the comparison with native CDI may differ in, as facts of the runtime versions."""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterable

from nri_cdi_testbed.node_check.cri import CriClient
from nri_plugin.nri.versions import RuntimeInfo


def nri_mount_order(destinations: Iterable[str]) -> list[str]:
    """The order NRI (0.3-0.12) leaves a container's mounts in after a plugin added some:
    sorted by path depth, then by path (its generate.sortMounts)."""
    return sorted(destinations, key=lambda d: (posixpath.normpath(d).count("/"), d))


def runtime_of(cri: CriClient) -> RuntimeInfo:
    """The runtime as the CRI Version call names it: the binary that really runs (a test
    slot may hold another build of containerd than its name says)."""
    version = cri.version()
    return RuntimeInfo.from_configure(version.runtime_name, version.runtime_version)


def node_mode_seen(runtime: RuntimeInfo, host_node: str) -> str:
    """What ``ls -l`` shows in a container for a CDI device node with no fileMode: runc's
    0666 where the runtime's CDI leaves it unset, the host node's mode where it fills it
    (CDI 1.1.0, containerd 2.2.1+)."""
    if runtime.native_fills_file_mode:
        return stat.filemode(os.stat(host_node).st_mode)
    return "crw-rw-rw-"
