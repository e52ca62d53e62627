"""What the comparison with native CDI may differ in, as facts of the runtime versions."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable


def nri_mount_order(destinations: Iterable[str]) -> list[str]:
    """The order NRI (0.3-0.12) leaves a container's mounts in after a plugin added some:
    sorted by path depth, then by path (its generate.sortMounts)."""
    return sorted(destinations, key=lambda d: (posixpath.normpath(d).count("/"), d))
