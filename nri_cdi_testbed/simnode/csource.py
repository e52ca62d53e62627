"""The C source of each simulated library: the package's ``c/*.c`` files behind the node's
values, given as ``#define`` lines (the files name them; none is formatted into the C)."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files

from nri_cdi_testbed.simnode.driverfiles import Lib
from nri_cdi_testbed.simnode.layout import NodeLayout
from nri_cdi_testbed.simnode.nvml import memory_mb

_EXPORT = '__attribute__((visibility("default")))'
# Which files make each kind of library, in order (generic.c: every library's two names).
_PARTS = {
    "generic": ("generic.c",),
    "cuda": ("generic.c", "cuda.c", "node_id.c"),
    # The same NVML for every node: it reads the node's description when NVML starts.
    "nvml": ("nvml.c", "generic.c", "node_id.c"),
}


@cache
def _read(name: str) -> str:
    """A file of ``c/``, read when a node is first built (package data in the wheel)."""
    return files("nri_cdi_testbed.simnode").joinpath("c", name).read_text()


def _define(name: str, value: object) -> str:
    return f"#define {name} {value}\n"


def _defines(lib_name: str, layout: NodeLayout, kind: str) -> str:
    """Only what ``kind``'s files name: a library's source, and so its cache entry, does
    not change with node values it does not use."""
    text = (_define("SIMNODE_EXPORT", _EXPORT)
            + _define("SIMNODE_LIBRARY", json.dumps(lib_name))
            + _define("SIMNODE_DRIVER_VERSION", json.dumps(layout.driver_version)))
    if kind == "generic":
        return text
    text += _define("SIMNODE_NODE_ID", json.dumps(layout.node_id))
    if kind == "nvml":
        return text
    gpus = ", \\\n".join(
        f"    {{{layout.minor_of(i)}, {json.dumps(g.name)}, {memory_mb(g.name)}ULL}}"
        for i, g in enumerate(layout.gpus))
    return (text + _define("SIMNODE_CUDA_VERSION", layout.cuda_driver_version)
            + _define("SIMNODE_GPUS", "\\\n" + gpus))


def c_source(lib: Lib, name: str, layout: NodeLayout, *, bits: int) -> str:
    """The source of library ``name`` (its file name) of ``layout``. 32-bit objects are
    generic.c alone: there is no 32-bit libc here, so they stay header- and libc-free."""
    kind = "generic" if bits == 32 else lib.kind
    parts = ", ".join(f"c/{part}" for part in _PARTS[kind])
    header = f"/* Built by nri_cdi_testbed/simnode/csource.py from {parts} */\n"
    return (header + _defines(name, layout, kind)
            + "".join(_read(part) for part in _PARTS[kind]))
