"""Simulated Jetson (Tegra) node: a folder ``nri-cdi generate --mode csv`` and
``nvidia-ctk cdi generate --mode csv`` read as they would read a board.

``build_tegra_node(root, TegraLayout(...))`` creates, under ``root`` (the driver root and
the dev root both):

* the CSV files of the board support package in
  ``etc/nvidia-container-runtime/host-files-for-container.d`` (``devices.csv``,
  ``drivers.csv``, ``l4t.csv``): ``dev``, ``lib``, ``sym`` and ``dir`` lines, a glob, a
  firmware file reached through the ``/lib -> usr/lib`` link, and entries this module lacks
  (the DLA's nodes and runtime), as a board lists them;
* real ELF libraries built by gcc (libcuda, libnvrm_*, the versioned driver libraries) in
  ``usr/lib/aarch64-linux-gnu/nvidia``, their SONAME and ``.so`` links, links in the folder
  above (one relative, one absolute), an ``ld.so.cache`` written by glibc's ``ldconfig -r``;
* the device nodes of an Orin made by ``mknod`` (``nvhost-*-gpu``, ``nvgpu/igpu0/*``,
  ``nvmap``, ``host1x-fence``, DRM, and JetPack 6's ``nvidia0``/``nvidiactl``);
* ``etc/nv_tegra_release``; with ``TegraLayout(nvml=(names...))`` the simulated NVML of
  :mod:`nri_cdi_testbed.simnode` reporting those GPUs (an Orin: ``Orin (nvgpu)``);
* ``tegra.json``, a manifest of all of it, for tests.

The simulated ``libcuda.so.1`` exports ``cuInit`` (it loads ``libnvrm_gpu.so`` through the
loader, as the real one needs it), ``cuDeviceGetCount`` (1 when the process has
``/dev/nvgpu/igpu0/ctrl`` and ``/dev/nvmap``), ``cuDriverGetVersion`` and
``fake_gpu_node_id``: a container run with the node's spec shows what it was given.
``in_tegra_namespace`` runs a tool such as nvidia-ctk where ``/etc`` shows the node's.
"""

from nri_cdi_testbed.tegra.builder import TegraLayout, build_tegra_node
from nri_cdi_testbed.tegra.node import (
    CSV_FOLDER,
    MANIFEST_NAME,
    BuiltTegraNode,
    in_tegra_namespace,
)

__all__ = [
    "CSV_FOLDER",
    "MANIFEST_NAME",
    "BuiltTegraNode",
    "TegraLayout",
    "build_tegra_node",
    "in_tegra_namespace",
]
