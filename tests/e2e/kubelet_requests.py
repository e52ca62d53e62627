"""What a real kubelet puts into the CRI requests the e2e tests make as it would.

Read off the recordings of Kubernetes v1.35.6 in tests/data/kubelet-1.35.6 (README there);
``tests/test_kubelet_recordings.py`` checks these against them, so the recording wins when a
kubelet changes. Used by the DaemonSet runner (``daemonset.py``) and the device plugin and
DRA cases of ``test_k8s_allocation_e2e.py``.
"""

from __future__ import annotations

import uuid
import zlib
from pathlib import Path
from typing import Any

# Every container: the kubelet's bookkeeping as annotations.
TERMINATION_LOG = "/dev/termination-log"
# NVIDIA's device plugin (v0.20): the CDI kind of its own spec, the annotation prefix of
# its cdi-annotations strategy (then a response id), and the environment its volume-mounts
# strategy sets beside the mounts.
DEVICE_PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"
DEVICE_PLUGIN_ANNOTATION = "cdi.k8s.io/nvidia-device-plugin_"
DEVICE_PLUGIN_MOUNTS = "/var/run/nvidia-container-devices"


def container_annotations(name: str, restart_count: int = 0, grace_period: int = 30,
                          termination_path: str = TERMINATION_LOG) -> dict[str, str]:
    """The annotations the kubelet gives every container it creates."""
    return {
        "io.kubernetes.container.hash": f"{zlib.crc32(name.encode()):08x}",
        "io.kubernetes.container.restartCount": str(restart_count),
        "io.kubernetes.container.terminationMessagePath": termination_path,
        "io.kubernetes.container.terminationMessagePolicy": "File",
        "io.kubernetes.pod.terminationGracePeriod": str(grace_period),
    }


def pod_labels(name: str, namespace: str, uid: str) -> dict[str, str]:
    return {"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
            "io.kubernetes.pod.uid": uid}


def container_files(pod_dir: Path, container: str,
                    termination_path: str = TERMINATION_LOG) -> dict[str, str]:
    """The host files the kubelet bind-mounts into each container of a host-network pod
    (container path -> host path), made as it makes them: the pod's /etc/hosts, and a
    fresh termination-message file per container under pods/<uid>/containers/<name>/,
    at the container's terminationMessagePath (runc must be able to make that mount
    point: under a read-only volume it fails the container)."""
    folder = pod_dir / "containers" / container
    folder.mkdir(parents=True, exist_ok=True)
    hosts = pod_dir / "etc-hosts"
    if not hosts.exists():
        hosts.write_text("127.0.0.1\tlocalhost\n")
    log = folder / uuid.uuid4().hex[:8]
    log.touch()
    return {"/etc/hosts": str(hosts), termination_path: str(log)}


def device_plugin_request(strategy: str, gpu_uuid: str) -> dict[str, Any]:
    """What the kubelet passes for one GPU the device plugin allocated with ``strategy``
    (keyword arguments of CriClient.create_container)."""
    device = f"{DEVICE_PLUGIN_KIND}={gpu_uuid}"
    if strategy == "cdi-annotations":
        return {"annotations": {f"{DEVICE_PLUGIN_ANNOTATION}{uuid.uuid4()}": device}}
    if strategy == "cdi-cri":
        return {"cdi_devices": [device]}
    if strategy == "volume-mounts":
        return {"mounts": {f"{DEVICE_PLUGIN_MOUNTS}/{gpu_uuid}": "/dev/null"},
                "env": {"NVIDIA_VISIBLE_DEVICES": DEVICE_PLUGIN_MOUNTS}}
    raise ValueError(f"device plugin strategy {strategy!r}")
