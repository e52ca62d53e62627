"""The error root of ``nri_plugin``.

Every error the NRI runtime library raises on purpose (a failed registration, a request
that fails as an RPC) derives from ``NRIPluginError``, and so does every error of the
product built on it (the injector, the vendor rules, the operations). The sans-IO core
keeps its own root (``nri_plugin.nri.wire.ProtocolError``): it imports nothing of ours, so
that it stays usable on its own; a transport failure is a different kind of thing anyway.
"""

from __future__ import annotations


class NRIPluginError(Exception):
    """Root of every error ``nri_plugin`` raises on purpose."""
