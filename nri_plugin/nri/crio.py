"""What CRI-O's NRI shows of a container differently from containerd's, made uniform before
a plugin sees it. Pure.

CRI-O (server/nri-api.go, 1.26 to 1.35) names a container by the OCI annotation
``io.kubernetes.container.name``, which exists only where the CRI client labelled the
container so (the kubelet does; crictl or a test client need not): the name is then empty,
while CRI's own name is in CRI-O's ``io.kubernetes.cri-o.Metadata`` annotation. And CRI-O
copies every pod annotation into each container's OCI annotations, which NRI shows as the
container's: the container's own CRI annotations are kept, as JSON, in
``io.kubernetes.cri-o.Annotations`` (what CRI-O's own CDI resolves ``cdi.k8s.io/`` keys of).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from nri_plugin.nri.api import nri_pb2

# CRI-O's OCI annotations (CRI-O's pkg/annotations).
METADATA = "io.kubernetes.cri-o.Metadata"
OWN_ANNOTATIONS = "io.kubernetes.cri-o.Annotations"


def _json_object(text: str | None) -> dict[str, object] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else {}  # "null": none


def fill_name(container: nri_pb2.Container) -> None:
    """Give a container CRI-O sent without a name its CRI name (in place)."""
    if container.name:
        return
    metadata = _json_object(container.annotations.get(METADATA))
    name = metadata.get("name") if metadata else None
    if isinstance(name, str):
        container.name = name


def own_annotations(container: nri_pb2.Container) -> Mapping[str, str]:
    """The container's own CRI annotations: on CRI-O without the pod's copies, elsewhere
    all the annotations NRI shows."""
    own = _json_object(container.annotations.get(OWN_ANNOTATIONS))
    if own is None:
        return container.annotations
    return {k: v for k, v in own.items() if isinstance(v, str)}
