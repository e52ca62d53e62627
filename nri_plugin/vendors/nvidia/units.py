"""Which GPUs and MIG devices a device covers, as units the injector compares
(``allocations``): a whole GPU is ``GPU-<uuid>``, a MIG device ``GPU-<uuid>/MIG-<uuid>``.
Known from the generator's facts, or for another spec's device (a DRA claim's) from the
device nodes it carries. Pure.
"""

from __future__ import annotations

from cdi.cache import Snapshot
from nri_plugin.vendors.nvidia.nodefacts import DeviceFacts, NodeFacts
from nri_plugin.vendors.nvidia.visible_devices import GPU_KIND, match_id

# The resource names NVIDIA's device plugin registers (nvidia.com/gpu, nvidia.com/mig-1g.10gb,
# a renamed or shared resource): all under its domain.
RESOURCE_DOMAIN = "nvidia.com/"
CAPS_FOLDER = "/dev/nvidia-caps/"


def unit(device: DeviceFacts) -> str:
    return f"{device.gpu_uuid}/{device.mig_uuid}" if device.type == "mig" else device.gpu_uuid


def device_units(name: str, snapshot: Snapshot, facts: NodeFacts) -> frozenset[str]:
    """The units of a CDI device: a device of a spec with facts by its facts (``all``:
    every device of its spec), another spec's by its GPU device nodes."""
    known = facts.devices.get(name)
    if known is not None:
        return frozenset({unit(known)})
    device = snapshot.devices.get(name)
    if device is None:
        return frozenset()
    spec = facts.specs.get(device.spec.path)
    if spec is not None:  # a name of our spec without facts of its own: its "all"
        return frozenset(unit(d) for d in spec.devices.values()) if (
            name == f"{spec.kind}=all") else frozenset()
    return _by_nodes({n.path for n in device.edits.device_nodes}, snapshot, facts)


def allocated_units(resource: str, device_id: str, facts: NodeFacts) -> frozenset[str]:
    """The units of one of NVIDIA's device plugin's ids (a GPU or MIG uuid, an index)."""
    if not resource.startswith(RESOURCE_DOMAIN):
        return frozenset()
    # A GPU shared by time-slicing or MPS is listed once per replica: "<id>::<replica>".
    device_id = device_id.partition("::")[0]
    known = [d for d in facts.devices.values() if d.name.startswith(GPU_KIND + "=")]
    name = match_id(device_id, known)
    return frozenset({unit(facts.devices[name])}) if name is not None else frozenset()


def _by_nodes(paths: set[str], snapshot: Snapshot, facts: NodeFacts) -> frozenset[str]:
    """Units whose device nodes ``paths`` hold: a MIG device by its capability nodes
    (``/dev/nvidia-caps/``, which tell one MIG device of a GPU from another; all of them
    present), else a GPU by its ``/dev/nvidia<minor>``."""
    mig = set()
    for facts_device in facts.devices.values():
        device = snapshot.devices.get(facts_device.name)
        if facts_device.type != "mig" or device is None:
            continue
        caps = {n.path for n in device.edits.device_nodes if n.path.startswith(CAPS_FOLDER)}
        if caps and caps <= paths:
            mig.add(unit(facts_device))
    if mig:
        return frozenset(mig)
    return frozenset(unit(d) for d in facts.devices.values() if d.type == "gpu"
                     and d.minor is not None and f"/dev/nvidia{d.minor}" in paths)
