"""containerd/CRI-O NRI plugin runtime in Python.

Public names are imported on first use: the ``nri-cdi`` command imports this package for
every subcommand, and ``generate`` or a hook must not pay for protobuf or asyncio. Importing
the pure parts (``nri_plugin.wire``, ``nri_plugin.dispatch``) never pulls in asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nri_plugin.api import Event, EventMask
    from nri_plugin.dispatch import RpcError
    from nri_plugin.plugin import Plugin
    from nri_plugin.stub import Stub
    from nri_plugin.wire import ProtocolError

_EXPORTS = {
    "Event": "nri_plugin.api", "EventMask": "nri_plugin.api", "RpcError": "nri_plugin.dispatch",
    "Plugin": "nri_plugin.plugin", "Stub": "nri_plugin.stub", "ProtocolError": "nri_plugin.wire",
}
__all__ = ["Event", "EventMask", "Plugin", "ProtocolError", "RpcError", "Stub"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nri_plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
