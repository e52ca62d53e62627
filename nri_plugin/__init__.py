"""containerd/CRI-O NRI plugin runtime in Python.

Everything a plugin needs is importable from here: ``Plugin`` (subclass it), ``Stub``
(connects it to the runtime), the NRI message types it receives and returns, and the
``ContainerAdjustment`` builders of ``nri_plugin.adjustment``.

Public names are imported on first use: the ``nri-cdi`` command imports this package for
every subcommand, and ``generate`` or a hook must not pay for protobuf or asyncio. Importing
the pure parts (``nri_plugin.wire``, ``nri_plugin.dispatch``) never pulls in asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nri_plugin.adjustment import (
        add_annotation,
        add_cdi_device,
        add_device,
        add_env,
        add_hook,
        add_mount,
        remove_annotation,
        remove_device,
        remove_env,
        remove_mount,
    )
    from nri_plugin.api import Event, EventMask
    from nri_plugin.dispatch import RpcError
    from nri_plugin.plugin import (
        Container,
        ContainerAdjustment,
        ContainerUpdate,
        CreateContainerResponse,
        LinuxResources,
        Plugin,
        PodSandbox,
    )
    from nri_plugin.stub import Stub
    from nri_plugin.wire import ProtocolError

_ADJUSTMENT = ("add_annotation", "add_cdi_device", "add_device", "add_env", "add_hook",
               "add_mount", "remove_annotation", "remove_device", "remove_env", "remove_mount")
_MESSAGES = ("Container", "ContainerAdjustment", "ContainerUpdate", "CreateContainerResponse",
             "LinuxResources", "PodSandbox")
_EXPORTS = {
    "Event": "nri_plugin.api", "EventMask": "nri_plugin.api", "RpcError": "nri_plugin.dispatch",
    "Plugin": "nri_plugin.plugin", "Stub": "nri_plugin.stub", "ProtocolError": "nri_plugin.wire",
    **dict.fromkeys(_MESSAGES, "nri_plugin.plugin"),
    **dict.fromkeys(_ADJUSTMENT, "nri_plugin.adjustment"),
}
__all__ = [
    "Container",
    "ContainerAdjustment",
    "ContainerUpdate",
    "CreateContainerResponse",
    "Event",
    "EventMask",
    "LinuxResources",
    "Plugin",
    "PodSandbox",
    "ProtocolError",
    "RpcError",
    "Stub",
    "add_annotation",
    "add_cdi_device",
    "add_device",
    "add_env",
    "add_hook",
    "add_mount",
    "remove_annotation",
    "remove_device",
    "remove_env",
    "remove_mount",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nri_plugin' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
