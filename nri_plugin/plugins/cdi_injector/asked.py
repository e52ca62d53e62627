"""What a container asks for: the injector's own request sources, declared as the vendors
declare theirs, the order all are read in (docs/usage/policy.md, "Request sources"), and
the reading itself (``read_asked``: the first step of the injector's decision and of
fail-closed's). Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from cdi.libpath import LD_LIBRARY_PATH_ENV
from nri_plugin.nri.api import nri_pb2
from nri_plugin.plugins.cdi_injector.context import ContainerContext, RequestSource, read_context
from nri_plugin.plugins.cdi_injector.policy import NEUTRAL_SOURCES, Policy
from nri_plugin.plugins.cdi_injector.requests import (
    check_name_count,
    container_requests,
    nri_plugins_requests,
    pod_requests,
)
from nri_plugin.plugins.cdi_injector.vendor import Registry, VendorRules, env_read

# The injector's own sources: the readers only forward the context's fields.
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
    """Every source that reads requests, with its vendor's facts (the injector's own have
    none), in source order, but those ignored where denied (the env sources) last;
    ``vendors``: (vendor, its facts), as ``Registry.paired`` gives them."""
    paired: list[tuple[RequestSource, object]] = [(s, None) for s in NEUTRAL]
    for vendor, facts in vendors:
        paired += [(s, facts) for s in vendor.sources if s.read is not None]
    return (tuple(p for p in paired if p[0].when_denied != "ignore")
            + tuple(p for p in paired if p[0].when_denied == "ignore"))


def read_asked(pod: nri_pb2.PodSandbox | None, container: nri_pb2.Container,
               registry: Registry, policy: Policy,
               vendors: tuple[VendorRules, ...]) -> ContainerContext:
    """What every source asked for (``read_context``), once the names asked for are counted
    (``check_name_count``: before anything parses them). A malformed request or too many
    names raise their Refusal; whether the policy allows the sources that asked is
    ``context.check_sources``' business."""
    env_prefixes, env_names = _env_of(vendors)
    check_name_count(pod.annotations if pod is not None else {}, container, env_prefixes)
    return read_context(pod, container, all_sources(registry.paired(vendors)), policy,
                        registry.snapshot, env_names)


@functools.lru_cache(maxsize=16)
def _env_of(vendors: tuple[VendorRules, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The vendors' env requests ("NAME="), and the env names a context keeps: the vendors'
    and the container's own library path (``vendor.env_read``). Once per vendor set."""
    return (tuple(p for v in vendors for p in v.env_request_prefixes),
            env_read(vendors, LD_LIBRARY_PATH_ENV))
