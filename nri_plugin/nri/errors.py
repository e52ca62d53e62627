"""The error root of ``nri_plugin`` (the sans-IO core keeps its own, ``ProtocolError``: it
imports nothing of ours)."""

from __future__ import annotations


class NRIPluginError(Exception):
    """Root of every error ``nri_plugin`` raises on purpose."""
