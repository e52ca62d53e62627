"""What the runtime's own CDI already did to a container, and the facts about it worth one
log line per connection (docs/reference/runtime-cdi.md). Pure (logging aside). With its CDI
on, the runtime injects the devices of ``cdi.k8s.io/`` container annotations before NRI
(again would run their hooks twice) but names them only from containerd 2.3: the plugin
relies on ``runtime_cdi``, checking that the devices' nodes are there.
"""

from __future__ import annotations

import logging

from cdi.cache import Snapshot
from cdi.errors import AnnotationError
from nri_plugin.nri.api import nri_pb2
from nri_plugin.nri.crio import own_annotations
from nri_plugin.nri.versions import RuntimeInfo
from nri_plugin.plugins.cdi_injector.requests import container_requests

log = logging.getLogger("nri_cdi.injector")
_warned: set[str] = set()


def injected_by_runtime(container: nri_pb2.Container, snapshot: Snapshot,
                        privileged: bool) -> frozenset[str]:
    """The devices the runtime's own CDI (known to be on) injected from the container's
    ``cdi.k8s.io/`` annotations; empty when the container shows it did not run."""
    try:
        # CRI-O shows the pod's annotations among each container's and resolves only the
        # container's own
        names = [r.name for r in container_requests(own_annotations(container))]
    except AnnotationError:
        return frozenset()  # the runtime would have failed it; read_context reports it
    if not names:
        return frozenset()
    present = None if privileged else {d.path for d in container.linux.devices}
    for name in names:
        device = snapshot.devices.get(name)
        nodes = device.edits.device_nodes if device is not None else ()
        if present is not None and nodes and not all(n.path in present for n in nodes):
            if not _warned:
                _warned.add("off")
                log.warning("container %s: the runtime's own CDI is set as on, but %s's device "
                            "nodes are not in the container, so it did not inject its "
                            "cdi.k8s.io annotations: the plugin injects them (check "
                            "runtime_cdi.enabled against the runtime's configuration: "
                            "containerd's enable_cdi; CRI-O's CDI is always on)",
                            container.name, name)
            return frozenset()
    return frozenset(names)


def log_runtime_facts(runtime: RuntimeInfo) -> None:
    """Say once per connection where the plugin's result must differ from native CDI."""
    if runtime.cdi_version is not None and not runtime.native_mount_order_by_name:
        log.info("%s keeps spec order within one mount depth; NRI re-sorts a container's "
                 "mounts by (depth, path) whenever a plugin adds mounts, so same-depth mounts "
                 "(which never nest) may be listed in another order than with native CDI",
                 runtime.describe_cdi())

