"""Simulated GPU node: a folder a CDI generator can read exactly like a real node.

``build_node(root, NodeLayout(...))`` creates, under ``root``:

* a driver root with real ELF shared objects (built by gcc, with the SONAMEs, version
  suffixes and symlinks of a 5xx driver), an ``etc/ld.so.cache`` written by glibc's own
  ``ldconfig -r``, binaries, GSP firmware, ICD/vendor configs and IPC sockets;
* a dev root with character devices made by ``mknod`` (majors and modes as on a real
  node: 195 for nvidia, a dynamic major for nvidia-uvm and nvidia-caps, 226 for DRM);
* ``proc/`` (driver version, per-GPU information, MIG capabilities, mig-minors,
  devices) and ``sys/`` (PCI DRM entries);
* ``simnode.json``, a manifest of everything above, at the top of ``root`` and outside
  the driver tree, so tests can compute expectations and the pynvml test double can
  answer from it.

The fake ``libcuda`` exports ``cuDriverGetVersion``/``cuInit``/``cuDeviceGetCount`` (the
count is the number of ``/dev/nvidia<N>`` character devices visible to the caller, so it
tells what a container was given) and ``fake_gpu_node_id``.  The simulated ``libnvidia-ml``
answers the NVML calls of nvidia-ml-py and of ``nvidia-ctk cdi generate`` (go-nvml) from
the node's description ``simnode-nvml.txt`` (written next to the manifest, found by walking
up from the library's own path, or named by ``$SIMNODE_NVML_NODE``; read afresh by each
``nvmlInit``): GPUs by index, UUID and PCI bus id, MIG devices, GPU and compute instances and
their profiles, versions.  ``in_node_namespace`` runs a tool such as nvidia-ctk in a private
mount namespace that shows it the node's ``/proc/driver`` and ``/sys/bus/pci/devices``.
Every library exports ``fake_nvidia_library()`` returning its own file name.

Compiled objects are cached by content (``cache_dir``, default
``$SIMNODE_CACHE`` or ``~/.cache/nri-cdi/simnode``) and copied, so a second build of an
8-GPU x 7-MIG node takes a fraction of a second.  gcc and ldconfig are only needed when
building; importing this package needs neither.
"""

from nri_cdi_testbed.simnode.builder import build_node
from nri_cdi_testbed.simnode.cli import main
from nri_cdi_testbed.simnode.layout import (
    DEFAULT_DRIVER_VERSION,
    EXTRAS,
    GpuSpec,
    MigDevice,
    NodeLayout,
    SimNodeError,
    parse_mig_arg,
    parse_mig_devices,
)
from nri_cdi_testbed.simnode.node import MANIFEST_NAME, BuiltNode, in_node_namespace
from nri_cdi_testbed.simnode.nvml import NVML_DESCRIPTION, nvml_description

__all__ = [
    "DEFAULT_DRIVER_VERSION",
    "EXTRAS",
    "MANIFEST_NAME",
    "NVML_DESCRIPTION",
    "BuiltNode",
    "GpuSpec",
    "MigDevice",
    "NodeLayout",
    "SimNodeError",
    "build_node",
    "in_node_namespace",
    "main",
    "nvml_description",
    "parse_mig_arg",
    "parse_mig_devices",
]
