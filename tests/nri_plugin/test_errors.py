"""One error root for ``nri_plugin``: every exception class it defines derives from
``NRIPluginError``, except the sans-IO core's (``nri_plugin.nri.wire.ProtocolError``), which
imports nothing of ours on purpose."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import nri_plugin
from nri_plugin.nri.errors import NRIPluginError
from nri_plugin.nri.wire import ProtocolError


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(nri_plugin.__path__, "nri_plugin.")
            if not m.name.endswith("_pb2")]


def test_every_error_class_has_the_package_root() -> None:
    strays = []
    for name in _modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (inspect.isclass(value) and issubclass(value, BaseException)
                    and value.__module__ == name
                    and not issubclass(value, (NRIPluginError, ProtocolError))):
                strays.append(f"{name}.{value.__name__}")
    assert strays == []


def test_the_scan_sees_the_errors() -> None:
    from nri_plugin.plugins.cdi_injector.policy import PolicyDenied
    from nri_plugin.vendors.nvidia.requirements import RequirementError

    assert "nri_plugin.plugins.cdi_injector.policy" in _modules()
    assert issubclass(PolicyDenied, NRIPluginError)
    assert RequirementError("x", device="nvidia.com/gpu=0").reason.rule == "nvidia.requirements"
