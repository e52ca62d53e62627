"""The injector's own request sources, declared as the vendors declare theirs, and the order
they are read in (docs/usage/policy.md, "Request sources"). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from nri_plugin.plugins.cdi_injector.context import RequestSource
from nri_plugin.plugins.cdi_injector.policy import NEUTRAL_SOURCES
from nri_plugin.plugins.cdi_injector.requests import (
    container_requests,
    nri_plugins_requests,
    pod_requests,
)
from nri_plugin.plugins.cdi_injector.vendor import VendorRules

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
