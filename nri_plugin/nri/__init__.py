"""The NRI runtime library: a containerd/CRI-O NRI plugin runtime in Python.

Everything a plugin needs is importable from here: ``Plugin`` (subclass it), ``Stub``
(connects it to the runtime), the NRI message types it receives and returns, and the
``ContainerAdjustment`` builders of ``nri_plugin.nri.adjustment``. It knows nothing of CDI
or of any vendor: the product (``nri_plugin.plugins``, ``vendors``, ``ops``) builds on it.

Public names are imported on first use: importing a submodule (``nri_plugin.nri.versions``
from ``nri-cdi doctor``, say) runs this file, and that must not pay for protobuf, the
messages or asyncio. Importing the pure parts (``nri_plugin.nri.wire``,
``nri_plugin.nri.dispatch``) never pulls in asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nri_plugin.nri.adjustment import (
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
    from nri_plugin.nri.api import Event, EventMask
    from nri_plugin.nri.dispatch import RpcError
    from nri_plugin.nri.plugin import (
        Container,
        ContainerAdjustment,
        ContainerUpdate,
        CreateContainerResponse,
        LinuxResources,
        Plugin,
        PodSandbox,
    )
    from nri_plugin.nri.stub import Stub
    from nri_plugin.nri.wire import ProtocolError

_ADJUSTMENT = ("add_annotation", "add_cdi_device", "add_device", "add_env", "add_hook",
               "add_mount", "remove_annotation", "remove_device", "remove_env", "remove_mount")
_MESSAGES = ("Container", "ContainerAdjustment", "ContainerUpdate", "CreateContainerResponse",
             "LinuxResources", "PodSandbox")
_EXPORTS = {
    "Event": "nri_plugin.nri.api", "EventMask": "nri_plugin.nri.api",
    "RpcError": "nri_plugin.nri.dispatch", "Plugin": "nri_plugin.nri.plugin",
    "Stub": "nri_plugin.nri.stub", "ProtocolError": "nri_plugin.nri.wire",
    **dict.fromkeys(_MESSAGES, "nri_plugin.nri.plugin"),
    **dict.fromkeys(_ADJUSTMENT, "nri_plugin.nri.adjustment"),
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
        raise AttributeError(f"module 'nri_plugin.nri' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
