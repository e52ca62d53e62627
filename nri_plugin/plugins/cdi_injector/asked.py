"""What a container asks for, the first step of the injector's decision and of
fail-closed's: the injector's own request sources, the order all are read in
(docs/usage/policy.md, "Request sources"), the cap on the names asked for, and the registry
made current for the names (docs/developer/kubernetes-allocation.md): a DRA claim's spec is
written a moment before its container is created and removed a moment after. Pure but for
what ``OnMiss`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cdi.annotations import ANNOTATION_PREFIX
from cdi.cache import Snapshot
from cdi.libpath import LD_LIBRARY_PATH_ENV
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.context import (
    ContainerContext,
    DeviceRequest,
    RequestError,
    RequestSource,
    bare_context,
    check_sources,
    container_requests,
    nri_plugins_requests,
    pod_requests,
    read_context,
)
from nri_plugin.plugins.cdi_injector.plan import InjectionError, lookup_devices
from nri_plugin.plugins.cdi_injector.policy import NEUTRAL_SOURCES, Policy
from nri_plugin.plugins.cdi_injector.refusal import Refusal
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules

NEUTRAL = (
    RequestSource(name="podAnnotations", default=NEUTRAL_SOURCES["podAnnotations"],
                  read_from="annotations",
                  read=lambda context, snapshot, facts: pod_requests(
                      context.pod_annotations, context.container_name)),
    RequestSource(name="containerAnnotations", default=NEUTRAL_SOURCES["containerAnnotations"],
                  read_from="annotations", allocated=True,
                  read=lambda context, snapshot, facts: container_requests(context.annotations)),
    RequestSource(name="nriPluginsAnnotations",
                  default=NEUTRAL_SOURCES["nriPluginsAnnotations"], read_from="annotations",
                  read=lambda context, snapshot, facts: nri_plugins_requests(
                      context.pod_annotations, context.container_name)))


def all_sources(vendors: Sequence[tuple[VendorRules, object]]
                ) -> tuple[tuple[RequestSource, object], ...]:
    """Every source that reads requests, with its vendor's facts (``Registry.paired``), in
    source order, but those ignored where denied (the env sources) last."""
    paired: list[tuple[RequestSource, object]] = [(s, None) for s in NEUTRAL]
    for vendor, facts in vendors:
        paired += [(s, facts) for s in vendor.sources if s.read is not None]
    return tuple(sorted(paired, key=lambda p: p[0].when_denied == "ignore"))  # stable


def read_asked(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
               registry: Registry, policy: Policy,
               vendors: tuple[VendorRules, ...]) -> ContainerContext:
    """What every source asked for (``read_context``), once the names asked for are counted
    (before anything parses them). Whether the policy allows the sources that asked is
    ``context.check_sources``' business."""
    env_prefixes, env_names = _env_of(vendors)
    check_name_count(pod.annotations if pod is not None else {}, container, env_prefixes)
    return read_context(bare_context(pod, container, env_names),
                        all_sources(registry.paired(vendors)), policy, registry.snapshot)


@functools.lru_cache(maxsize=16)
def _env_of(vendors: tuple[VendorRules, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The vendors' env requests ("NAME="), and the prefixes of the env names a context
    keeps: the container's library path and what the vendors declare they read.
    Kubernetes puts several variables per service of the namespace in every container:
    only these are parsed and kept."""
    requests = tuple(p for v in vendors for p in v.env_request_prefixes)
    names = [LD_LIBRARY_PATH_ENV, *(p.rstrip("=") for p in requests)]
    for vendor in vendors:
        names += [*vendor.verdict_env, *vendor.extras_env, *vendor.filter_env]
    return requests, tuple(dict.fromkeys(names))


# Device names one container may ask for, all sources together. Parsing is linear, but a
# request of hundreds of thousands of names would outlast the runtime's request timeout
# (the container is then created without us). Real requests name a few devices (8 GPUs x
# 7 MIG instances is 56).
MAX_NAMES = 1024


class TooManyNamesError(RequestError):
    """The request names more devices than any container may ask for (MAX_NAMES)."""

    default_rule = "nameLimit"


def check_name_count(pod_annotations: Mapping[str, str], container: nri_pb2.Container,
                     env_prefixes: tuple[str, ...] = ()) -> None:
    """Raise TooManyNamesError when the request names more than MAX_NAMES devices (it
    counts commas). ``env_prefixes``: the vendors' env requests ("NAME=")."""
    count = 0
    for where, found in (("pod", pod_annotations), ("container", container.annotations)):
        for key, value in found.items():
            if key.startswith(ANNOTATION_PREFIX):
                count += value.count(",") + 1
                if count > MAX_NAMES:
                    raise TooManyNamesError(
                        f"{where} annotation {key[:80]!r} brings the devices asked for over "
                        f"{MAX_NAMES} (a container may name at most {MAX_NAMES})",
                        annotation=key[:80])
    for entry in container.env:
        if entry.startswith(env_prefixes) and entry.count(",") >= MAX_NAMES:
            raise TooManyNamesError(
                f"{entry.partition('=')[0]} names more than {MAX_NAMES} devices")


# Called with the names the registry does not know; returns the registry after a bounded
# re-read of the spec folders (None: the re-read did not finish in time).
OnMiss = Callable[[Sequence[str]], Registry | None]
# Called when every name is known; returns a newer registry once spec removals already
# made are applied (a bounded wait, no file I/O), None when none is pending.
OnHit = Callable[[], Registry | None]


@dataclass(frozen=True, slots=True)
class Asker:
    """Reads what a container asks for under a registry made current for the names by
    ``on_miss`` / ``on_hit`` (None: the registry as it is)."""

    vendors: tuple[VendorRules, ...]
    on_miss: OnMiss | None = None
    on_hit: OnHit | None = None

    def read(self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container,
             registry: Registry, policy: Policy) -> tuple[ContainerContext, Registry, bool]:
        """What every source asked for (a source the policy denies raises), the registry
        to decide with, and whether the spec folders were read again."""
        context = read_asked(pod, container, registry, policy, self.vendors)
        check_sources(context, policy)
        names = [*(r.name for r in context.requests), *(d.name for d in container.CDI_devices)]
        unknown = ([n for n in names if n not in registry.snapshot.devices]
                   if self.on_miss is not None else [])
        newer = None
        if unknown and self.on_miss is not None:
            newer = self.on_miss(unknown)
        elif names and self.on_hit is not None:
            newer = self.on_hit()
        if newer is not None and newer is not registry:
            registry = newer
            context = read_asked(pod, container, registry, policy, self.vendors)
            check_sources(context, policy)
        return context, registry, bool(unknown)


def rechecked_refusal(snapshot: Snapshot, requests: Sequence[DeviceRequest]) -> Refusal | None:
    """After the re-read: the refusal for the names still unknown (None: all resolve)."""
    try:
        lookup_devices(snapshot, requests)
    except InjectionError as exc:
        folders = ", ".join(snapshot.spec_dirs) or "(none)"
        return Refusal(f"{exc} (the node's spec folders were read again just now)",
                       rule="unresolvable", device=exc.reason.device,
                       node_detail=f"folders {folders}")
    return None
