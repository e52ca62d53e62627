"""Whether ``nri-cdi doctor`` runs inside a Kubernetes pod (the DaemonSet's ``plugin``
container, reached with ``kubectl exec``) rather than on the node itself
(docs/operations/doctor.md, "In the pod").

In a pod, what the node has is visible only where the pod mounts it: doctor then says of a
check that needs the host that it cannot be made from the pod, instead of failing it.

The signs, both required: ``KUBERNETES_SERVICE_HOST`` in the environment (the kubelet sets
it in every container it starts, whatever ``enableServiceLinks`` says) and, in this
process's own mount table, a mount the kubelet made from a pod's folder
(``…/pods/<pod uid>/…``: the termination-message file, ``/etc/hosts``). ``/proc/1`` is no
sign: the DaemonSet runs with ``hostPID``, so its PID 1 is the node's. ``NRI_CDI_IN_POD``
(``1`` or ``0``) overrides both, for a pod spec that wants to say so or a host shell that
carries a pod's environment.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

IN_POD_ENV = "NRI_CDI_IN_POD"
# The annotation key the pod carries ("true") to be created while a plugin containerd
# requires is absent; the chart sets both from requiredPlugins.tolerateAnnotation, as a
# pod's own annotations are not visible inside it.
TOLERATE_ENV = "NRI_CDI_TOLERATE_ANNOTATION"
SERVICE_ENV = "KUBERNETES_SERVICE_HOST"
MOUNTINFO = "/proc/self/mountinfo"
# A mount's root (mountinfo's 4th field) inside a pod's kubelet folder.
# A pod's uid: a UUID, or a static pod's 32 hex digits.
_POD_FOLDER = re.compile(r"/pods/(?:[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}|[0-9a-f]{32})/")


@dataclass(frozen=True, slots=True)
class Place:
    """Where doctor runs; ``why``: the sign that told, for messages."""

    in_pod: bool
    why: str = ""


ON_NODE = Place(False, "")


def detect(environ: Mapping[str, str] | None = None, mountinfo: str = MOUNTINFO) -> Place:
    env = os.environ if environ is None else environ
    said = env.get(IN_POD_ENV, "").strip().lower()
    if said in ("1", "true", "yes"):
        return Place(True, f"{IN_POD_ENV}={env[IN_POD_ENV]}")
    if said in ("0", "false", "no") or SERVICE_ENV not in env:
        return ON_NODE
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            mounts = [line.split() for line in handle]
    except OSError:
        return ON_NODE
    for fields in mounts:  # a mount made from a pod's kubelet folder (root, mount point)
        if len(fields) > 4 and _POD_FOLDER.search(fields[3]):
            return Place(True, f"{SERVICE_ENV} is set and the kubelet mounted {fields[4]}")
    return ON_NODE


NOT_VISIBLE = "not visible from the pod"
ON_THE_NODE = "run nri-cdi doctor on the node for this check"
