"""The generator's sidecar: ``<spec>.meta`` next to every spec file it writes.

A JSON document (one entry per line two levels deep) with the node's fingerprint and the
facts a policy needs (driver and CUDA versions, each GPU's arch and brand, which file
serves which driver capability), and the ``spec.sha256`` of the spec it belongs to.

* The name ends in ``.meta``, not ``.json``: CDI runtimes read every ``*.json`` and
  ``*.yaml`` in a spec folder as a spec, and would report a ``.meta.json`` as a broken one.
* It is written **before** the spec (each atomically): the spec's own change then wakes a
  reader with the matching sidecar already in place, and a run stopped in between leaves
  a sidecar whose ``spec.sha256`` matches no spec on disk, which readers ignore and
  ``--if-changed`` regenerates.

The one definition of the name: the generator (:mod:`cdi.nvidia.cli`), the refresher and
the doctor (``nri_plugin.ops``) and the plugin's NVIDIA rules import it from here.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SUFFIX", "sidecar_path"]

SUFFIX = ".meta"


def sidecar_path(spec: Path) -> Path:
    """The sidecar of the spec file ``spec``."""
    return spec.with_name(spec.name + SUFFIX)
