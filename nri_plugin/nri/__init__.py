"""The NRI runtime library: a containerd/CRI-O NRI plugin runtime in Python.

Everything a plugin needs is importable from here (docs/developer/writing-a-plugin.md); it
knows nothing of CDI or of any vendor. Public names are imported on first use: importing a
submodule (``nri_plugin.nri.versions`` from the settings, say) runs this file, and that must
not pay for protobuf or asyncio.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_ADJUSTMENT = ("OciDevice", "OciHook", "add_annotation", "add_cdi_device", "add_device",
               "add_env", "add_hook", "add_mount", "remove_annotation", "remove_device",
               "remove_env", "remove_mount")
_MESSAGES = ("Container", "ContainerAdjustment", "ContainerUpdate", "CreateContainerResponse",
             "LinuxResources", "PodSandbox")
_EXPORTS = {
    "Event": "nri_plugin.nri.api", "EventMask": "nri_plugin.nri.api",
    "RpcError": "nri_plugin.nri.dispatch", "Plugin": "nri_plugin.nri.plugin",
    "Stub": "nri_plugin.nri.stub", "StubOptions": "nri_plugin.nri.stub",
    "ProtocolError": "nri_plugin.nri.wire",
    **dict.fromkeys(_MESSAGES, "nri_plugin.nri.plugin"),
    **dict.fromkeys(_ADJUSTMENT, "nri_plugin.nri.adjustment"),
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # the same names, for type checkers (re-exported with "as")
    from nri_plugin.nri.adjustment import OciDevice as OciDevice
    from nri_plugin.nri.adjustment import OciHook as OciHook
    from nri_plugin.nri.adjustment import add_annotation as add_annotation
    from nri_plugin.nri.adjustment import add_cdi_device as add_cdi_device
    from nri_plugin.nri.adjustment import add_device as add_device
    from nri_plugin.nri.adjustment import add_env as add_env
    from nri_plugin.nri.adjustment import add_hook as add_hook
    from nri_plugin.nri.adjustment import add_mount as add_mount
    from nri_plugin.nri.adjustment import remove_annotation as remove_annotation
    from nri_plugin.nri.adjustment import remove_device as remove_device
    from nri_plugin.nri.adjustment import remove_env as remove_env
    from nri_plugin.nri.adjustment import remove_mount as remove_mount
    from nri_plugin.nri.api import Event as Event
    from nri_plugin.nri.api import EventMask as EventMask
    from nri_plugin.nri.dispatch import RpcError as RpcError
    from nri_plugin.nri.plugin import Container as Container
    from nri_plugin.nri.plugin import ContainerAdjustment as ContainerAdjustment
    from nri_plugin.nri.plugin import ContainerUpdate as ContainerUpdate
    from nri_plugin.nri.plugin import CreateContainerResponse as CreateContainerResponse
    from nri_plugin.nri.plugin import LinuxResources as LinuxResources
    from nri_plugin.nri.plugin import Plugin as Plugin
    from nri_plugin.nri.plugin import PodSandbox as PodSandbox
    from nri_plugin.nri.stub import Stub as Stub
    from nri_plugin.nri.stub import StubOptions as StubOptions
    from nri_plugin.nri.wire import ProtocolError as ProtocolError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nri_plugin.nri' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
