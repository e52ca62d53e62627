"""What of a CreateContainer request the injector's answer depends on, as one key. Pure.

The pods of one Deployment ask the same way again and again. Their containers differ in
ids, pod names, the pod UID in their mounts' sources and the service variables of their
namespace, none of which the injector's answer reads. ``RequestShape.key`` picks exactly
what it reads: the namespace, the container's name, privilege and user, its device nodes
and the CDI devices the runtime names, the annotations under the request prefixes, the env
entries under the names the injector and the vendors declare they read, and the mounts a
mounts source could take as a request. Under one registry, policy and runtime, two
requests with equal keys get the same answer, so the injector keeps answers by it
(``CdiInjector.adjustment_for``) and a repeat goes from the request to its answer without
reading sources, policy, vendors or plans again: with the caches cold between containers,
as they are, that reading was most of the plugin's time inside the runtime's
CreateContainer.

What each part of the request is read for is declared where it is read: the annotation
prefixes by the injector's own sources and each vendor (``annotation_prefixes``), the env
names by ``vendor.env_read``, the mounts by each mounts source (``RequestSource.
mount_marks``: a source that declares none makes every mount part of the key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.context import is_privileged
from nri_plugin.plugins.cdi_injector.vendor import RequestSource, VendorRules

# A key holding more characters of picked annotations, env entries and mounts than this
# is not kept: the answers' keys stay under 2 MiB (CdiInjector.PLAN_CACHE_SIZE of them)
# whatever the requests carry (eight GPU UUIDs in an env list are about 330).
KEY_CHARS_MAX = 4096

Key = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class RequestShape:
    """The prefixes and marks ``key`` picks a request's parts by."""

    annotation_prefixes: tuple[str, ...]
    env_prefixes: tuple[str, ...]
    # None: no source reads mounts; (): one reads any mount; else the substrings one of
    # which the source path of every mount a source reads contains.
    mount_marks: tuple[str, ...] | None

    @classmethod
    def of(cls, annotation_prefixes: Sequence[str], env_prefixes: Sequence[str],
           sources: Sequence[RequestSource], vendors: Sequence[VendorRules]) -> RequestShape:
        """The shape for the injector's own ``annotation_prefixes`` and ``env_prefixes``
        (with the vendors' env names: ``vendor.env_read``), every request source and the
        vendors' annotation prefixes."""
        marks: tuple[str, ...] | None = None
        for source in sources:
            if source.read_from == "mounts" and source.read is not None:
                if not source.mount_marks:
                    marks = ()
                    break
                marks = (*(marks or ()), *source.mount_marks)
        prefixes = [*annotation_prefixes, *(p for v in vendors for p in v.annotation_prefixes)]
        return cls(tuple(dict.fromkeys(prefixes)), tuple(env_prefixes), marks)

    def key(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container) -> Key | None:
        """Equal for two requests the injector answers the same; None where the key would
        be over ``KEY_CHARS_MAX`` characters (such a request is not kept). Written for
        the usual request, which has nothing to pick in most parts: each comprehension
        runs only where there is something to pick (cold, each one costs)."""
        prefixes = self.annotation_prefixes
        env = [entry for entry in container.env if entry.startswith(self.env_prefixes)]
        pod_asks = _picked(pod.annotations, prefixes)
        container_asks = _picked(container.annotations, prefixes)
        mounts = self._mounts(container.mounts)
        if env or pod_asks or container_asks or mounts:
            size = (sum(map(len, env)) + sum(len(k) + len(v) for k, v in pod_asks)
                    + sum(len(k) + len(v) for k, v in container_asks)
                    + sum(len(d) + len(s) for d, s in mounts))
            if size > KEY_CHARS_MAX:
                return None
        linux = container.linux
        user = container.user  # unset: uid and gid 0, as the context reads them
        return (pod.namespace, container.name, is_privileged(container), user.uid, user.gid,
                pod_asks, container_asks, tuple(env), mounts,
                tuple(d.path for d in linux.devices) if linux.devices else (),
                tuple(d.name for d in container.CDI_devices) if container.CDI_devices else ())

    def _mounts(self, mounts: Sequence[nri_pb2.Mount]) -> tuple[tuple[str, str], ...]:
        marks = self.mount_marks
        if marks is None:
            return ()
        if len(marks) == 1:  # the usual case, one test per mount
            mark = marks[0]
            return tuple((m.destination, m.source) for m in mounts if mark in m.source)
        return tuple((m.destination, m.source) for m in mounts
                     if not marks or any(mark in m.source for mark in marks))


def _picked(annotations: Mapping[str, str],
            prefixes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    keys = [key for key in annotations if key.startswith(prefixes)]
    if not keys:
        return ()
    # Sorted: two equal maps may iterate in different orders.
    return tuple(sorted((key, annotations[key]) for key in keys))
