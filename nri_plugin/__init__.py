"""containerd/CRI-O NRI plugin runtime in Python.

``Stub`` is imported lazily: it is the asyncio shell, and importing the pure
parts (``nri_plugin.wire``, ``nri_plugin.dispatch``) must not pull in asyncio.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nri_plugin.api import Event, EventMask
from nri_plugin.dispatch import RpcError
from nri_plugin.plugin import Plugin
from nri_plugin.wire import ProtocolError

if TYPE_CHECKING:
    from nri_plugin.stub import Stub

__all__ = ["Event", "EventMask", "Plugin", "ProtocolError", "RpcError", "Stub"]


def __getattr__(name: str) -> Any:
    if name == "Stub":
        from nri_plugin.stub import Stub

        return Stub
    raise AttributeError(f"module 'nri_plugin' has no attribute {name!r}")
