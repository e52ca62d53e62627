"""NVIDIA driver discovery: ld.so.cache and ELF readers, and a simulated node for tests.

Submodules are imported on demand (``from cdi.nvidia import ldcache``) so that importing
the package costs nothing at generator start-up.
"""

from __future__ import annotations

__all__: list[str] = []
